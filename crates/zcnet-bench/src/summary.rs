//! Median and spread of repeated runs. The machines this runs on are noisy (two shared
//! cores: the same configuration varies by ±20–30 % between runs, see the kernel-probe
//! findings), so one run proves nothing: `--repeat N` runs each configuration N times, and
//! the report gives the median — robust against the one run that met a noisy neighbour —
//! with the full range beside it, so a reader can tell a difference from the noise.

use serde::{Deserialize, Serialize};

/// The median of `values`, or `None` when there is nothing (or something not finite) to
/// take it of. An even count averages the middle two. The same statistic `auto`'s receive
/// trial judges by, so it lives beside that.
pub use zcnet::tuning::median;

/// Median and range of one measure over repeated runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// How many runs.
    pub n: usize,
    /// Their median.
    pub median: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
}

impl Summary {
    /// Summarises `values`; `None` if empty or any value is not finite.
    pub fn of(values: &[f64]) -> Option<Summary> {
        let median = median(values)?;
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some(Summary {
            n: values.len(),
            median,
            min,
            max,
        })
    }

    /// `(max - min) / median`: the run-to-run spread relative to the value; 0 for one run
    /// or a zero median.
    pub fn relative_spread(&self) -> f64 {
        if self.median == 0.0 {
            0.0
        } else {
            (self.max - self.min) / self.median.abs()
        }
    }

    /// Whether the ranges of `self` and `other` overlap: if they do, the difference of
    /// the medians is within what repeating the runs showed as noise.
    pub fn overlaps(&self, other: &Summary) -> bool {
        self.min <= other.max && other.min <= self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn median_of_odd_even_and_nothing() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[1.0, f64::NAN]), None);
        assert_eq!(median(&[1.0, f64::INFINITY]), None);
    }

    #[test]
    fn summary_range_and_spread() {
        let s = Summary::of(&[10.0, 12.0, 8.0]).unwrap();
        assert_eq!((s.n, s.median, s.min, s.max), (3, 10.0, 8.0, 12.0));
        assert!((s.relative_spread() - 0.4).abs() < 1e-12);
        assert_eq!(Summary::of(&[5.0]).unwrap().relative_spread(), 0.0);
        assert_eq!(Summary::of(&[0.0, 0.0]).unwrap().relative_spread(), 0.0);
        let t = Summary::of(&[12.5, 13.0]).unwrap();
        assert!(!s.overlaps(&t) && !t.overlaps(&s));
        let u = Summary::of(&[11.0, 14.0]).unwrap();
        assert!(s.overlaps(&u) && u.overlaps(&s));
    }

    proptest! {
        #[test]
        fn median_lies_within_the_range(v in proptest::collection::vec(-1e9f64..1e9, 1..50)) {
            let s = Summary::of(&v).unwrap();
            prop_assert!(s.min <= s.median && s.median <= s.max);
            // At least half the values are <= median and at least half >= median.
            let le = v.iter().filter(|&&x| x <= s.median).count();
            let ge = v.iter().filter(|&&x| x >= s.median).count();
            prop_assert!(2 * le >= v.len() && 2 * ge >= v.len());
        }
    }
}
