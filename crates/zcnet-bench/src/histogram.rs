//! A latency histogram in the manner of HdrHistogram: logarithmic buckets, each power of two
//! split into 16 linear sub-buckets, so any recorded value is known to within 1/16 (6.25 %)
//! from 16 ns to centuries, in a fixed 8 KiB of counters and one branch-free index per
//! record. Recording a `send()`/`recv()` call's duration this way costs a few nanoseconds,
//! small beside the call itself, which is what lets `zcnet bench` time every call (the
//! Solaris paper's "code latency", table 3) without changing what it measures.

use serde::{Deserialize, Serialize};
use std::time::Duration;

const SUB_BITS: u32 = 4;
const SUB: usize = 1 << SUB_BITS;
/// Buckets: 16 exact ones for 0..16, then 16 per power of two from 2^4 to 2^63.
const BUCKETS: usize = SUB + (64 - SUB_BITS as usize) * SUB;

/// Counts of durations (nanoseconds) in logarithmic buckets.
#[derive(Clone)]
pub struct LatencyHistogram {
    counts: Box<[u64; BUCKETS]>,
    total: u64,
    sum: u128,
    max: u64,
}

impl std::fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyHistogram")
            .field("count", &self.total)
            .field("max_ns", &self.max)
            .finish()
    }
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

fn index(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let e = 63 - v.leading_zeros(); // >= SUB_BITS
    let sub = ((v >> (e - SUB_BITS)) as usize) & (SUB - 1);
    SUB + (e - SUB_BITS) as usize * SUB + sub
}

/// `(lowest value, width)` of bucket `i`.
fn bucket_range(i: usize) -> (u64, u64) {
    if i < SUB {
        return (i as u64, 1);
    }
    let e = ((i - SUB) / SUB) as u32 + SUB_BITS;
    let sub = ((i - SUB) % SUB) as u64;
    let width = 1u64 << (e - SUB_BITS);
    ((SUB as u64 + sub) * width, width)
}

impl LatencyHistogram {
    /// An empty histogram.
    pub fn new() -> Self {
        LatencyHistogram {
            counts: Box::new([0; BUCKETS]),
            total: 0,
            sum: 0,
            max: 0,
        }
    }

    /// Records one value in nanoseconds.
    #[inline]
    pub fn record_ns(&mut self, ns: u64) {
        self.counts[index(ns)] += 1;
        self.total += 1;
        self.sum += u128::from(ns);
        self.max = self.max.max(ns);
    }

    /// Records one duration.
    #[inline]
    pub fn record(&mut self, d: Duration) {
        self.record_ns(d.as_nanos().min(u128::from(u64::MAX)) as u64);
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// Largest value recorded (exact), 0 when empty.
    pub fn max_ns(&self) -> u64 {
        self.max
    }

    /// Mean of the recorded values (exact), 0 when empty.
    pub fn mean_ns(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum as f64 / self.total as f64
        }
    }

    /// The value below or at which a fraction `q` (0..=1) of the recorded values lie, to
    /// within the bucket's 1/16: the middle of the bucket holding that rank, never more
    /// than the largest value recorded. `None` when empty.
    pub fn quantile_ns(&self, q: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let q = if q.is_nan() { 0.5 } else { q.clamp(0.0, 1.0) };
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (lo, width) = bucket_range(i);
                return Some((lo + width / 2).min(self.max));
            }
        }
        Some(self.max)
    }

    /// Adds every count of `other` (the streams of one run merge into one histogram).
    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.total += other.total;
        self.sum += other.sum;
        self.max = self.max.max(other.max);
    }

    /// The numbers a report carries.
    pub fn summary(&self) -> LatencySummary {
        LatencySummary {
            count: self.total,
            p50_us: self.quantile_ns(0.5).unwrap_or(0) as f64 / 1e3,
            p99_us: self.quantile_ns(0.99).unwrap_or(0) as f64 / 1e3,
            max_us: self.max as f64 / 1e3,
            mean_us: self.mean_ns() / 1e3,
        }
    }
}

/// What a report says about one histogram, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Values recorded (calls timed).
    pub count: u64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Largest.
    pub max_us: f64,
    /// Mean.
    pub mean_us: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn buckets_tile_the_whole_range() {
        let mut next = 0u64;
        for i in 0..BUCKETS {
            let (lo, w) = bucket_range(i);
            assert_eq!(
                lo,
                next,
                "bucket {i} starts where {} ended",
                i.saturating_sub(1)
            );
            assert_eq!(index(lo), i);
            assert_eq!(index(lo + (w - 1)), i);
            next = lo.wrapping_add(w);
        }
        assert_eq!(next, 0, "the last bucket ends at 2^64");
        assert_eq!(index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_of_a_known_set() {
        let mut h = LatencyHistogram::new();
        assert_eq!(h.quantile_ns(0.5), None);
        for v in 1..=100u64 {
            h.record_ns(v * 1000);
        }
        let p50 = h.quantile_ns(0.5).unwrap() as f64;
        let p99 = h.quantile_ns(0.99).unwrap() as f64;
        assert!((p50 - 50_000.0).abs() / 50_000.0 < 0.07, "p50 {p50}");
        assert!((p99 - 99_000.0).abs() / 99_000.0 < 0.07, "p99 {p99}");
        assert_eq!(h.quantile_ns(1.0), Some(100_000));
        assert_eq!(h.count(), 100);
        assert_eq!(h.mean_ns(), 50_500.0);
        let s = h.summary();
        assert_eq!(s.count, 100);
        assert_eq!(s.max_us, 100.0);
    }

    #[test]
    fn merge_adds_counts() {
        let mut a = LatencyHistogram::new();
        let mut b = LatencyHistogram::new();
        a.record_ns(10);
        b.record_ns(1_000_000);
        b.record(Duration::from_millis(2));
        a.merge(&b);
        assert_eq!(a.count(), 3);
        assert_eq!(a.max_ns(), 2_000_000);
        assert_eq!(a.quantile_ns(0.0), Some(10));
    }

    proptest! {
        #[test]
        fn any_value_is_reported_within_one_sixteenth(v in 1u64..u64::MAX / 2) {
            let mut h = LatencyHistogram::new();
            h.record_ns(v);
            h.record_ns(v);
            h.record_ns(u64::MAX); // keeps the max from clamping the answer
            let got = h.quantile_ns(0.5).unwrap();
            prop_assert!((got as f64 - v as f64).abs() <= v as f64 / 16.0 + 1.0);
        }
    }
}
