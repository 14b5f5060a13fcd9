//! Per-operation choice of the cheapest measured path, and the crossovers between paths.
//!
//! Costs between measured sizes are interpolated linearly in `log2(size)` (the sweep is
//! geometric, 4 KiB … 4 MiB, and per-GiB costs change smoothly with the per-call overhead they
//! amortise), and clamped to the nearest measured size outside a path's measured range (no
//! extrapolation: beyond 4 MiB the per-GiB cost is flat). Median, `lo` and `hi` are each
//! interpolated.
//!
//! A path is chosen over the default (`copy`) only if its median is lower AND its spread lies
//! wholly below the default's (`hi < copy.lo`); otherwise the difference is within the noise
//! of the measurement and the conservative default wins. Among the paths that clear that bar,
//! the lowest median wins.
//!
//! Operations on buffers that are not page-aligned take the default: the profile measured
//! page-aligned pool buffers, and zero-copy of a partial page pins the whole page (the Solaris
//! rule, seed "zero-copy TCP in Solaris", chose zero-copy only for aligned page multiples).

use super::AutoPath;
use crate::profile::{Measurement, Spread};

/// Why the [`Chooser`] chose what it chose (counted in [`super::AutoStats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ChoiceReason {
    /// The profile showed this path clearly cheaper than the default.
    Profile,
    /// The profile measured the default cheapest.
    DefaultCheapest,
    /// No profile, or no baseline measurements in it: built-in default.
    NoProfile,
    /// The buffer is not page-aligned: default.
    Unaligned,
    /// Another path's median was lower but the spreads overlapped: default.
    SpreadOverlap,
}

/// One decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice<P> {
    /// The path to take.
    pub path: P,
    /// Why.
    pub reason: ChoiceReason,
}

/// A size at which the chosen path changes, walking up in size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Crossover<P> {
    /// The path chosen just below `size`.
    pub from: P,
    /// The path chosen from `size` up.
    pub to: P,
    /// The smallest operation size (bytes) at which `to` is chosen. Spreads are already
    /// accounted for: this is where `to`'s advantage clears the measured noise, not where the
    /// medians cross.
    pub size: u64,
}

#[derive(Debug, Clone)]
struct Curve<P> {
    path: P,
    /// Sorted by size, sizes unique.
    points: Vec<(u64, Spread)>,
    /// Recorded zero-copy shares by size ([`Measurement::zc_fraction`]).
    zc: Vec<(u64, f64)>,
}

impl<P: AutoPath> Curve<P> {
    fn at(&self, size: u64) -> Spread {
        let first = self.points[0];
        let last = self.points[self.points.len() - 1];
        if size <= first.0 {
            return first.1;
        }
        if size >= last.0 {
            return last.1;
        }
        let i = self.points.partition_point(|&(s, _)| s <= size);
        let (s0, a) = self.points[i - 1];
        let (s1, b) = self.points[i];
        let t =
            ((size as f64).log2() - (s0 as f64).log2()) / ((s1 as f64).log2() - (s0 as f64).log2());
        let lerp = |x: f64, y: f64| x + (y - x) * t;
        Spread {
            median: lerp(a.median, b.median),
            lo: lerp(a.lo, b.lo),
            hi: lerp(a.hi, b.hi),
        }
    }
}

/// Answers, per operation, the cheapest path a profile measured (see the module docs).
#[derive(Debug, Clone)]
pub struct Chooser<P> {
    curves: Vec<Curve<P>>,
}

impl<P: AutoPath> Chooser<P> {
    /// The built-in conservative chooser without a profile: always the default (`copy`).
    pub fn defaults() -> Self {
        Chooser { curves: Vec::new() }
    }

    /// A chooser from one direction's table, using the rows of the given touch variant.
    /// Without rows for that variant (or without baseline rows) it behaves as
    /// [`Chooser::defaults`].
    pub fn from_measurements(rows: &[Measurement<P>], touch: bool) -> Self {
        let mut curves: Vec<Curve<P>> = Vec::new();
        for row in rows.iter().filter(|r| r.touch == touch) {
            let i = match curves.iter().position(|c| c.path == row.path) {
                Some(i) => i,
                None => {
                    curves.push(Curve {
                        path: row.path,
                        points: Vec::new(),
                        zc: Vec::new(),
                    });
                    curves.len() - 1
                }
            };
            curves[i].points.push((row.size, row.cpu_s_per_gib));
            if let Some(f) = row.zc_fraction {
                curves[i].zc.push((row.size, f));
            }
        }
        for c in &mut curves {
            c.points.sort_by_key(|&(s, _)| s);
            c.points.dedup_by_key(|&mut (s, _)| s);
        }
        if !curves.iter().any(|c| c.path == P::DEFAULT) {
            curves.clear();
        }
        Chooser { curves }
    }

    /// The paths this chooser can answer: the measured ones, or only the default.
    pub fn paths(&self) -> Vec<P> {
        if self.curves.is_empty() {
            return vec![P::DEFAULT];
        }
        self.curves.iter().map(|c| c.path).collect()
    }

    /// `path`'s interpolated cost at `size`, if it was measured.
    pub fn estimate(&self, path: P, size: u64) -> Option<Spread> {
        self.curves
            .iter()
            .find(|c| c.path == path)
            .map(|c| c.at(size.max(1)))
    }

    /// Whether some page-aligned operation size would be given `path` (the default always
    /// can). Lets a connection set up only the paths it may use.
    pub fn can_choose(&self, path: P) -> bool {
        path == P::DEFAULT
            || self
                .curves
                .iter()
                .flat_map(|c| c.points.iter().map(|p| p.0))
                .any(|s| self.choose(s, true).path == path)
            || self.crossovers().iter().any(|c| c.to == path)
    }

    /// Whether `path` went zero-copy at about `size` bytes when it was measured: the recorded
    /// share at the measured size nearest in `log2(size)` is at least one half. Unknown (no
    /// share recorded, or the path not measured) counts as yes. (A listener advertises the
    /// page-multiple MSS by it; online demotion does not ask.)
    pub fn expects_zero_copy(&self, path: P, size: u64) -> bool {
        let Some(c) = self.curves.iter().find(|c| c.path == path) else {
            return true;
        };
        let l = (size.max(1) as f64).log2();
        c.zc.iter()
            .min_by(|a, b| {
                let da = ((a.0 as f64).log2() - l).abs();
                let db = ((b.0 as f64).log2() - l).abs();
                da.total_cmp(&db)
            })
            .is_none_or(|&(_, f)| f >= 0.5)
    }

    /// Where [`Chooser::choose`] says [`ChoiceReason::SpreadOverlap`] at `size`: the path with
    /// the lowest median, cheaper than copy's median but inside the spreads. For a caller
    /// that lets the connection's own cost check decide instead of keeping copy blind.
    pub fn cheapest_median(&self, size: u64) -> Option<P> {
        let size = size.max(1);
        let base = self.estimate(P::DEFAULT, size)?;
        self.curves
            .iter()
            .filter(|c| c.path != P::DEFAULT)
            .map(|c| (c.path, c.at(size).median))
            .filter(|&(_, m)| m < base.median)
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(p, _)| p)
    }

    /// [`Chooser::can_choose`], or the cheapest median at a measured size where the profile
    /// cannot tell ([`Chooser::cheapest_median`]).
    pub fn may_want(&self, path: P) -> bool {
        self.can_choose(path)
            || self
                .curves
                .iter()
                .flat_map(|c| c.points.iter().map(|p| p.0))
                .any(|s| {
                    self.choose(s, true).reason == ChoiceReason::SpreadOverlap
                        && self.cheapest_median(s) == Some(path)
                })
    }

    /// The path for one operation of `size` bytes; `aligned` says whether the buffer starts on
    /// a page boundary.
    pub fn choose(&self, size: u64, aligned: bool) -> Choice<P> {
        let default = |reason| Choice {
            path: P::DEFAULT,
            reason,
        };
        let Some(base) = self.estimate(P::DEFAULT, size) else {
            return default(ChoiceReason::NoProfile);
        };
        if !aligned {
            return default(ChoiceReason::Unaligned);
        }
        let size = size.max(1);
        let mut cheaper = false;
        let mut best: Option<(P, f64)> = None;
        for c in self.curves.iter().filter(|c| c.path != P::DEFAULT) {
            let est = c.at(size);
            if est.median >= base.median {
                continue;
            }
            cheaper = true;
            if est.hi < base.lo && best.is_none_or(|(_, m)| est.median < m) {
                best = Some((c.path, est.median));
            }
        }
        match best {
            Some((path, _)) => Choice {
                path,
                reason: ChoiceReason::Profile,
            },
            None if cheaper => default(ChoiceReason::SpreadOverlap),
            None => default(ChoiceReason::DefaultCheapest),
        }
    }

    /// The sizes (page-aligned operations) at which the chosen path changes, ascending,
    /// within the measured range.
    ///
    /// Found by sampling 16 points per octave and bisecting each change to the exact byte;
    /// a region narrower than 1/16 octave between two samples could be missed, which is far
    /// below the resolution of a sweep that measures one size per octave.
    pub fn crossovers(&self) -> Vec<Crossover<P>> {
        let lo = self.curves.iter().map(|c| c.points[0].0).min();
        let hi = self
            .curves
            .iter()
            .map(|c| c.points[c.points.len() - 1].0)
            .max();
        let (Some(lo), Some(hi)) = (lo, hi) else {
            return Vec::new();
        };
        if lo >= hi {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut prev_size = lo;
        let mut prev = self.choose(lo, true).path;
        let mut k = 1u32;
        loop {
            let size = ((lo as f64) * 2f64.powf(f64::from(k) / 16.0)).round() as u64;
            let size = size.clamp(prev_size + 1, hi);
            let now = self.choose(size, true).path;
            if now != prev {
                // Bisect: choose(a) == prev, choose(b) != prev.
                let (mut a, mut b) = (prev_size, size);
                while b - a > 1 {
                    let mid = a + (b - a) / 2;
                    if self.choose(mid, true).path == prev {
                        a = mid;
                    } else {
                        b = mid;
                    }
                }
                let to = self.choose(b, true).path;
                out.push(Crossover {
                    from: prev,
                    to,
                    size: b,
                });
                // A second change inside (b, size] is reported from `to`.
                prev = to;
                prev_size = b;
                if to != now {
                    continue;
                }
            }
            prev = now;
            prev_size = size;
            if size >= hi {
                return out;
            }
            k += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::path::TxPath;
    use proptest::prelude::*;

    const KIB: u64 = 1024;

    fn row(path: TxPath, size: u64, median: f64, lo: f64, hi: f64) -> Measurement<TxPath> {
        Measurement {
            path,
            size,
            touch: false,
            cpu_s_per_gib: Spread { median, lo, hi },
            zc_fraction: None,
        }
    }

    /// copy is flat at 1.0 ± 0.05; zerocopy falls from 2.0 at 4 KiB to 0.5 at 1 MiB.
    fn falling() -> Vec<Measurement<TxPath>> {
        let mut v = Vec::new();
        for (i, size) in [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, 1024 * KIB]
            .into_iter()
            .enumerate()
        {
            v.push(row(TxPath::Copy, size, 1.0, 0.95, 1.05));
            let m = 2.0 - 0.375 * i as f64;
            v.push(row(TxPath::Zerocopy, size, m, m - 0.05, m + 0.05));
        }
        v
    }

    #[test]
    fn zero_copy_expectation_follows_the_nearest_recorded_share() {
        let mut rows = falling();
        for r in rows.iter_mut().filter(|r| r.path == TxPath::Zerocopy) {
            // Measured copied below 64 KiB, zero-copy from there up.
            r.zc_fraction = Some(if r.size < 64 * KIB { 0.0 } else { 0.97 });
        }
        let c = Chooser::from_measurements(&rows, false);
        assert!(!c.expects_zero_copy(TxPath::Zerocopy, 4 * KIB));
        assert!(!c.expects_zero_copy(TxPath::Zerocopy, 20 * KIB));
        assert!(c.expects_zero_copy(TxPath::Zerocopy, 60 * KIB));
        assert!(c.expects_zero_copy(TxPath::Zerocopy, 64 << 20));
        // Nothing recorded (copy's rows) or not measured at all: assume it should not copy.
        assert!(c.expects_zero_copy(TxPath::Copy, 4 * KIB));
        assert!(c.expects_zero_copy(TxPath::Uring, 4 * KIB));
        // `falling` makes zerocopy clearly cheaper from 256 KiB up; uring is never measured.
        assert!(c.can_choose(TxPath::Zerocopy));
        assert!(c.can_choose(TxPath::Copy));
        assert!(!c.can_choose(TxPath::Uring));
        assert!(!Chooser::<TxPath>::defaults().can_choose(TxPath::Zerocopy));
    }

    #[test]
    fn without_a_profile_copy_is_chosen() {
        let c = Chooser::<TxPath>::defaults();
        let choice = c.choose(1 << 20, true);
        assert_eq!(choice.path, TxPath::Copy);
        assert_eq!(choice.reason, ChoiceReason::NoProfile);
        assert!(c.crossovers().is_empty());
        assert_eq!(c.paths(), vec![TxPath::Copy]);
        // Rows of the other touch variant only: no profile for this variant.
        let c = Chooser::from_measurements(&falling(), true);
        assert_eq!(c.choose(1 << 20, true).reason, ChoiceReason::NoProfile);
    }

    #[test]
    fn the_cheaper_path_is_chosen_past_the_crossover() {
        let c = Chooser::from_measurements(&falling(), false);
        assert_eq!(c.choose(4 * KIB, true).path, TxPath::Copy);
        assert_eq!(
            c.choose(4 * KIB, true).reason,
            ChoiceReason::DefaultCheapest
        );
        let big = c.choose(1024 * KIB, true);
        assert_eq!(big.path, TxPath::Zerocopy);
        assert_eq!(big.reason, ChoiceReason::Profile);
        // Beyond the sweep the last measurement holds.
        assert_eq!(c.choose(64 << 20, true).path, TxPath::Zerocopy);
        // Unaligned buffers keep copy.
        assert_eq!(c.choose(1024 * KIB, false).reason, ChoiceReason::Unaligned);

        let x = c.crossovers();
        assert_eq!(x.len(), 1, "{x:?}");
        assert_eq!((x[0].from, x[0].to), (TxPath::Copy, TxPath::Zerocopy));
        // Not where the medians cross (m < 1.0) but where zerocopy's hi (m + 0.05) drops below
        // copy's lo (0.95): m < 0.9, i.e. 2.0 - 0.375·i < 0.9 with i counted in steps of 4×.
        let expect = (4.0 * KIB as f64 * 4f64.powf(1.1 / 0.375)) as u64;
        assert!(
            x[0].size.abs_diff(expect) <= expect / 1000,
            "{} vs {expect}",
            x[0].size
        );
        assert_eq!(c.choose(x[0].size, true).path, TxPath::Zerocopy);
        assert_eq!(c.choose(x[0].size - 1, true).path, TxPath::Copy);
    }

    #[test]
    fn overlapping_spreads_keep_the_default() {
        // zerocopy's median is lower everywhere, but its spread always overlaps copy's.
        let rows = vec![
            row(TxPath::Copy, 4 * KIB, 1.0, 0.8, 1.2),
            row(TxPath::Copy, 1024 * KIB, 1.0, 0.8, 1.2),
            row(TxPath::Zerocopy, 4 * KIB, 0.9, 0.5, 1.3),
            row(TxPath::Zerocopy, 1024 * KIB, 0.85, 0.7, 0.9),
        ];
        let c = Chooser::from_measurements(&rows, false);
        for size in [4 * KIB, 64 * KIB, 1024 * KIB] {
            let choice = c.choose(size, true);
            assert_eq!(choice.path, TxPath::Copy, "{size}");
            assert_eq!(choice.reason, ChoiceReason::SpreadOverlap, "{size}");
        }
        assert!(c.crossovers().is_empty());
        // What a caller that lets its cost check decide may want there, and set up for.
        for size in [4 * KIB, 64 * KIB, 1024 * KIB] {
            assert_eq!(c.cheapest_median(size), Some(TxPath::Zerocopy), "{size}");
        }
        assert!(!c.can_choose(TxPath::Zerocopy));
        assert!(c.may_want(TxPath::Zerocopy));
        assert!(!c.may_want(TxPath::Uring), "not measured");
        // Dearer at the median: nothing to want.
        let rows = vec![
            row(TxPath::Copy, 4 * KIB, 1.0, 0.8, 1.2),
            row(TxPath::Uring, 4 * KIB, 1.1, 0.9, 1.3),
        ];
        let c = Chooser::from_measurements(&rows, false);
        assert_eq!(c.cheapest_median(4 * KIB), None);
        assert!(!c.may_want(TxPath::Uring));
    }

    #[test]
    fn lowest_clear_median_wins_and_crossovers_chain() {
        // uring clearly best in the middle, zerocopy clearly best at the top.
        let rows = vec![
            row(TxPath::Copy, 4 * KIB, 1.0, 0.9, 1.1),
            row(TxPath::Copy, 4096 * KIB, 1.0, 0.9, 1.1),
            row(TxPath::Uring, 4 * KIB, 2.0, 1.9, 2.1),
            row(TxPath::Uring, 64 * KIB, 0.5, 0.45, 0.55),
            row(TxPath::Uring, 4096 * KIB, 0.5, 0.45, 0.55),
            row(TxPath::Zerocopy, 4 * KIB, 3.0, 2.9, 3.1),
            row(TxPath::Zerocopy, 256 * KIB, 0.6, 0.5, 0.7),
            row(TxPath::Zerocopy, 4096 * KIB, 0.2, 0.1, 0.3),
        ];
        let c = Chooser::from_measurements(&rows, false);
        assert_eq!(c.choose(64 * KIB, true).path, TxPath::Uring);
        assert_eq!(c.choose(4096 * KIB, true).path, TxPath::Zerocopy);
        let x = c.crossovers();
        let pairs: Vec<_> = x.iter().map(|x| (x.from, x.to)).collect();
        assert_eq!(
            pairs,
            vec![
                (TxPath::Copy, TxPath::Uring),
                (TxPath::Uring, TxPath::Zerocopy)
            ]
        );
        assert!(x[0].size < 64 * KIB && x[1].size > 256 * KIB, "{x:?}");
        for w in x.windows(2) {
            assert!(w[0].size < w[1].size);
            assert_eq!(w[0].to, w[1].from);
        }
    }

    fn arb_rows() -> impl Strategy<Value = Vec<Measurement<TxPath>>> {
        let path = prop::sample::select(vec![TxPath::Copy, TxPath::Zerocopy, TxPath::Uring]);
        let one = (
            path,
            12u32..23,
            0.01f64..5.0,
            0.0f64..1.0,
            0.0f64..1.0,
            any::<bool>(),
        )
            .prop_map(|(path, exp, median, dl, dh, touch)| Measurement {
                path,
                size: 1 << exp,
                touch,
                cpu_s_per_gib: Spread {
                    median,
                    lo: (median - dl).max(0.0),
                    hi: median + dh,
                },
                zc_fraction: None,
            });
        prop::collection::vec(one, 0..24)
    }

    proptest! {
        #[test]
        fn never_picks_an_unmeasured_path(rows in arb_rows(), size in 1u64..(64 << 20), aligned: bool) {
            let c = Chooser::from_measurements(&rows, false);
            let choice = c.choose(size, aligned);
            prop_assert!(c.paths().contains(&choice.path));
            prop_assert!(choice.path == TxPath::Copy
                || rows.iter().any(|r| !r.touch && r.path == choice.path));
            if choice.path != TxPath::Copy {
                let (e, b) = (c.estimate(choice.path, size).unwrap(), c.estimate(TxPath::Copy, size).unwrap());
                prop_assert!(e.median < b.median && e.hi < b.lo);
            }
        }

        #[test]
        fn crossovers_match_the_choices(rows in arb_rows()) {
            let c = Chooser::from_measurements(&rows, true);
            for x in c.crossovers() {
                prop_assert_ne!(x.from, x.to);
                prop_assert_eq!(c.choose(x.size, true).path, x.to);
                prop_assert_eq!(c.choose(x.size - 1, true).path, x.from);
            }
        }
    }
}
