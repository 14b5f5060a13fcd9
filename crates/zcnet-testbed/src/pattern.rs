//! A patterned byte stream whose every byte can be checked on arrival: what every transfer in
//! zcnet's tests and the bench's verification compare against.
//!
//! The pattern is xorshift output with a prime period, so a page or a segment that lands at
//! the wrong offset never lines up with the right bytes, and a wrong byte names where in the
//! pattern it came from.

use std::sync::OnceLock;

/// Period of the pattern: a prime, so a page or a segment landing at the wrong offset never
/// lines up with the right bytes.
pub const PERIOD: usize = 1_048_573;

fn table() -> &'static [u8] {
    static T: OnceLock<Vec<u8>> = OnceLock::new();
    T.get_or_init(|| {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let period: Vec<u8> = (0..PERIOD)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        // The tail repeats the start, so any window of up to 8 MiB is one slice.
        period
            .iter()
            .cycle()
            .take(PERIOD + (8 << 20))
            .copied()
            .collect()
    })
}

/// The pattern's bytes at stream offsets `pos..pos+len` (len ≤ 8 MiB).
pub fn pattern(pos: u64, len: usize) -> &'static [u8] {
    let start = (pos % PERIOD as u64) as usize;
    &table()[start..start + len]
}

/// Checks a received stream incrementally.
#[derive(Debug, Default)]
pub struct Verifier {
    /// Stream offset of the next byte to check.
    pub pos: u64,
}

impl Verifier {
    /// Checks `data` as the next bytes of the stream; panics naming the first wrong byte,
    /// where in the pattern the received bytes come from, and both values.
    pub fn check(&mut self, data: &[u8]) {
        let mut off = 0;
        while off < data.len() {
            let n = (data.len() - off).min(4 << 20);
            let want = pattern(self.pos, n);
            if want != &data[off..off + n] {
                let i = want
                    .iter()
                    .zip(&data[off..off + n])
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                let at = self.pos + i as u64;
                let got = &data[off + i..(off + i + 64).min(data.len())];
                // Where in the pattern do the received bytes come from?
                let found = (0..PERIOD as u64)
                    .find(|&p| pattern(p, got.len()) == got)
                    .map_or("nowhere".to_string(), |p| format!("pattern offset {p}"));
                panic!(
                    "byte {at} of the stream is wrong (chunk of {} at stream {}; received bytes match {found}): got {:?} want {:?}",
                    data.len(),
                    self.pos - off as u64,
                    &got[..got.len().min(16)],
                    &pattern(at, 16)
                );
            }
            self.pos += n as u64;
            off += n;
        }
    }
}
