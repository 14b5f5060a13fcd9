//! Sizes as people type them: `4096`, `64K`, `1M`, a sweep `4K..4M` (powers of two, as the
//! CMU paper's figure 5 and NetPIPE step their read/write sizes), or a list `4K,64K,1M`.

use std::fmt;

/// Most sizes one sweep may name: a typo such as `1..1G` must not start a 31-hour run.
pub const MAX_SWEEP_SIZES: usize = 40;

/// A size or a sweep that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SizeError {
    /// Not a number with an optional K/M/G suffix.
    #[error("not a size: {0:?} (examples: 4096, 64K, 1M, 2G)")]
    NotASize(String),
    /// A suffix other than K, M or G.
    #[error("unknown size suffix in {0:?} (use K, M or G: binary units)")]
    UnknownSuffix(String),
    /// Zero, or more than `u64` holds.
    #[error("size out of range: {0:?} (must be at least 1 and fit in 64 bits)")]
    OutOfRange(String),
    /// `A..B` with `A > B`.
    #[error("empty sweep {0:?}: the first size is larger than the last")]
    EmptySweep(String),
    /// More sizes than [`MAX_SWEEP_SIZES`].
    #[error("sweep {0:?} has more than {MAX_SWEEP_SIZES} sizes")]
    TooMany(String),
}

/// Parses one size: decimal digits with an optional binary suffix K, M or G (any case).
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(SizeError::UnknownSuffix(s.to_string())),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SizeError::NotASize(s.to_string()));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| SizeError::OutOfRange(s.to_string()))?;
    n.checked_mul(mult)
        .filter(|&v| v > 0)
        .ok_or_else(|| SizeError::OutOfRange(s.to_string()))
}

/// Parses a size specification into the sizes to run, in the order given:
///
/// * `64K` — one size;
/// * `4K..4M` — the first size, then doubled until the last is passed (`4K, 8K, …, 4M`);
///   the last size is included only when the doubling lands on it;
/// * `4K,64K,1M` — a list; each item may itself be a sweep. Duplicates are dropped.
pub fn parse_sizes(s: &str) -> Result<Vec<u64>, SizeError> {
    let mut out: Vec<u64> = Vec::new();
    for item in s.split(',') {
        let sizes = match item.split_once("..") {
            Some((a, b)) => {
                let (lo, hi) = (parse_size(a)?, parse_size(b)?);
                if lo > hi {
                    return Err(SizeError::EmptySweep(item.trim().to_string()));
                }
                let mut v = Vec::new();
                let mut x = lo;
                while x <= hi {
                    v.push(x);
                    if v.len() > MAX_SWEEP_SIZES {
                        return Err(SizeError::TooMany(s.trim().to_string()));
                    }
                    match x.checked_mul(2) {
                        Some(n) => x = n,
                        None => break,
                    }
                }
                v
            }
            None => vec![parse_size(item)?],
        };
        for n in sizes {
            if !out.contains(&n) {
                out.push(n);
            }
        }
        if out.len() > MAX_SWEEP_SIZES {
            return Err(SizeError::TooMany(s.trim().to_string()));
        }
    }
    Ok(out)
}

/// A size the way [`parse_size`] reads it back: `4K`, `1M`, `3G`, or plain bytes.
pub fn format_size(n: u64) -> String {
    ByteSize(n).to_string()
}

/// Display wrapper for [`format_size`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        for (shift, suffix) in [(30, 'G'), (20, 'M'), (10, 'K')] {
            if n >= 1 << shift && n.is_multiple_of(1 << shift) {
                return write!(f, "{}{suffix}", n >> shift);
            }
        }
        write!(f, "{n}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn single_sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size(" 1m "), Ok(1 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
    }

    #[test]
    fn nonsense_is_rejected_with_the_reason() {
        assert_eq!(parse_size("0"), Err(SizeError::OutOfRange("0".into())));
        assert_eq!(
            parse_size("12Q"),
            Err(SizeError::UnknownSuffix("12Q".into()))
        );
        assert_eq!(parse_size("K"), Err(SizeError::NotASize("K".into())));
        assert_eq!(parse_size("-4K"), Err(SizeError::NotASize("-4K".into())));
        assert_eq!(parse_size("1.5M"), Err(SizeError::NotASize("1.5M".into())));
        assert!(matches!(
            parse_size("99999999999G"),
            Err(SizeError::OutOfRange(_))
        ));
        assert!(parse_size("").is_err());
    }

    #[test]
    fn sweeps_double_from_the_first_size() {
        assert_eq!(
            parse_sizes("4K..64K").unwrap(),
            vec![4096, 8192, 16384, 32768, 65536]
        );
        assert_eq!(parse_sizes("3K..12K").unwrap(), vec![3072, 6144, 12288]);
        // The last size is a bound, not a promise.
        assert_eq!(parse_sizes("4K..30K").unwrap(), vec![4096, 8192, 16384]);
        assert_eq!(parse_sizes("1M..1M").unwrap(), vec![1 << 20]);
        assert_eq!(
            parse_sizes("64,4K..8K,64").unwrap(),
            vec![64, 4096, 8192],
            "lists mix with sweeps, duplicates dropped"
        );
    }

    #[test]
    fn bad_sweeps_are_rejected() {
        assert_eq!(
            parse_sizes("4M..4K"),
            Err(SizeError::EmptySweep("4M..4K".into()))
        );
        assert!(matches!(parse_sizes("1..1G"), Ok(v) if v.len() == 31));
        assert!(matches!(parse_sizes("1..8G"), Ok(v) if v.len() == 34));
        assert!(matches!(parse_sizes("4K.."), Err(SizeError::NotASize(_))));
        assert!(matches!(
            parse_sizes("4K..x"),
            Err(SizeError::UnknownSuffix(_))
        ));
        assert!(matches!(
            parse_sizes("1..1K,3..3G"),
            Err(SizeError::TooMany(_))
        ));
    }

    #[test]
    fn format_round_trips() {
        for n in [1, 4095, 4096, 65536, 1 << 20, 3 << 30, 1536] {
            assert_eq!(parse_size(&format_size(n)), Ok(n));
        }
        assert_eq!(format_size(65536), "64K");
        assert_eq!(format_size(1536), "1536");
    }

    proptest! {
        #[test]
        fn every_sweep_is_increasing_powers_of_two_times_the_first(lo in 1u64..1 << 20, k in 0u32..12) {
            let hi = lo << k;
            let v = parse_sizes(&format!("{lo}..{hi}")).unwrap();
            prop_assert_eq!(v.len(), k as usize + 1);
            for (i, n) in v.iter().enumerate() {
                prop_assert_eq!(*n, lo << i);
            }
        }
    }
}
