//! From `zcnet bench` runs to a profile's tables, and the check that `auto` keeps up with the
//! best single path. Pure: `zcnet tune` and `zcnet bench` feed it runs they measured.
//!
//! A direction's table comes from runs that vary only that direction against the `copy`
//! baseline of the other (transmit paths into a `copy` receiver, `copy` senders into each
//! receive path), so each row's cost — worker CPU-seconds per GiB of both ends, the bench
//! verdict's metric — moves with the path measured. Runs where the path could not run as
//! itself ([`Run::unsupported`]) are left out: a refused path must not look cheap.

use crate::report::Run;
use crate::summary::median;
use std::collections::BTreeMap;
use zcnet::tuning::AutoPath;
use zcnet::tuning::{FilePair, Measurement, Spread};
use zcnet::tuning::{PairMeasurement, PathPair};
use zcnet::RxPath;
use zcnet::TxPath;

/// [`Run::label`] of the second measurement of one pair in the same sitting (`zcnet bench`
/// adds it where it compares `auto → auto` with the best pair): kept out of every table, it
/// only says how far two identical configurations read apart — the noise a gap must beat.
pub const TWIN: &str = "twin";

/// Whether a run measured its configuration: it ran as itself ([`Run::unsupported`]) and
/// moved bytes. A run that moved none reads 0 CPU-s/GiB ([`Run::cpu_s_per_gib`] of no
/// bytes) — free, the cheapest row there is — and `zcnet tune`'s rule, a pair beats
/// `copy → copy` only if its whole range lies below copy's, let that one run decide: a
/// 0.25 s `copy → copy` run on a loaded machine that moved nothing put copy's `lo` at 0, so
/// no pair could clear it at that size.
pub fn measured(r: &Run) -> bool {
    !r.unsupported() && r.bytes_received > 0
}

/// Whether a run belongs in a profile's tables: [`measured`], and not a [`TWIN`] (which
/// only says how far identical configurations read apart).
pub fn tabled(r: &Run) -> bool {
    measured(r) && r.label != TWIN
}

/// The cost `auto` minimises: worker CPU-seconds per GiB of both ends.
pub fn run_cost(r: &Run) -> f64 {
    r.sender_cpu_s_per_gib + r.receiver_cpu_s_per_gib
}

/// `(path name, size, touch)` → (costs, zero-copy shares) over the repeats.
type Groups = BTreeMap<(String, u64, bool), (Vec<f64>, Vec<f64>)>;

fn groups(runs: &[Run], tx: bool) -> Groups {
    let mut g = Groups::new();
    for r in runs.iter().filter(|r| tabled(r)) {
        let (this, other, zc) = if tx {
            (&r.tx, &r.rx, r.zc_fraction_tx)
        } else {
            (&r.rx, &r.tx, r.zc_fraction_rx)
        };
        if other != "copy" {
            continue;
        }
        let e = g.entry((this.clone(), r.size, r.touch)).or_default();
        e.0.push(run_cost(r));
        e.1.push(zc);
    }
    g
}

fn rows<P: AutoPath>(runs: &[Run], tx: bool) -> Vec<Measurement<P>> {
    groups(runs, tx)
        .into_iter()
        .filter_map(|((name, size, touch), (costs, zc))| {
            let path = P::from_name(&name)?;
            let m = median(&costs)?;
            let lo = costs.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = costs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            Some(Measurement {
                path,
                size,
                touch,
                cpu_s_per_gib: Spread { median: m, lo, hi },
                zc_fraction: median(&zc).map(|f| f.clamp(0.0, 1.0)),
            })
        })
        .collect()
}

/// The transmit and receive tables of a profile from `runs` (`auto` runs are ignored).
pub fn profile_rows(runs: &[Run]) -> (Vec<Measurement<TxPath>>, Vec<Measurement<RxPath>>) {
    (rows(runs, true), rows(runs, false))
}

/// One configuration's repeats, as the pair and file tables read them.
#[derive(Default)]
struct PairRuns {
    /// Worker CPU-s/GiB of both ends.
    costs: Vec<f64>,
    /// The sender's zero-copy shares.
    zc_tx: Vec<f64>,
    /// The receiver's zero-copy shares.
    zc_rx: Vec<f64>,
    /// The receiver's shares of the cost (runs that cost something).
    rx_shares: Vec<f64>,
}

/// `(tx, rx, size, touch)` → its repeats.
type PairGroups = BTreeMap<(String, String, u64, bool), PairRuns>;

fn pair_groups(runs: &[Run]) -> PairGroups {
    let mut g = PairGroups::new();
    for r in runs.iter().filter(|r| tabled(r)) {
        let e = g
            .entry((r.tx.clone(), r.rx.clone(), r.size, r.touch))
            .or_default();
        let cost = run_cost(r);
        e.costs.push(cost);
        e.zc_tx.push(r.zc_fraction_tx);
        e.zc_rx.push(r.zc_fraction_rx);
        if cost > 0.0 {
            e.rx_shares.push(r.receiver_cpu_s_per_gib / cost);
        }
    }
    g
}

fn spread(costs: &[f64]) -> Option<Spread> {
    let m = median(costs)?;
    let lo = costs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = costs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some(Spread { median: m, lo, hi })
}

/// The pair table of a profile: every transmit × receive pair in `runs` whose two names are
/// paths `auto` can take (`auto` itself and the bench's `file` are not), median and range.
pub fn pair_rows(runs: &[Run]) -> Vec<PairMeasurement> {
    pair_groups(runs)
        .into_iter()
        .filter_map(|((tx, rx, size, touch), g)| {
            let pair = PathPair::from_name(&format!("{tx}/{rx}"))?;
            Some(PairMeasurement {
                tx: pair.tx,
                rx: pair.rx,
                size,
                touch,
                cpu_s_per_gib: spread(&g.costs)?,
                zc_fraction_tx: median(&g.zc_tx).map(|f| f.clamp(0.0, 1.0)),
                zc_fraction_rx: median(&g.zc_rx).map(|f| f.clamp(0.0, 1.0)),
                rx_share: median(&g.rx_shares).map(|f| f.clamp(0.0, 1.0)),
            })
        })
        .collect()
}

/// The `file` table of a profile: the bench's file senders (`file` = sendfile,
/// `read_send` = pread + send) into each receive path `auto` can take, median and range,
/// rows named as [`FilePair`] names them (`sendfile/copy`).
pub fn file_rows(runs: &[Run]) -> Vec<Measurement<FilePair>> {
    pair_groups(runs)
        .into_iter()
        .filter_map(|((tx, rx, size, touch), g)| {
            let mode = match tx.as_str() {
                "file" => "sendfile",
                "read_send" => "read_send",
                _ => return None,
            };
            Some(Measurement {
                path: FilePair::from_name(&format!("{mode}/{rx}"))?,
                size,
                touch,
                cpu_s_per_gib: spread(&g.costs)?,
                zc_fraction: median(&g.zc_tx).map(|f| f.clamp(0.0, 1.0)),
            })
        })
        .collect()
}

pub use crate::report::{PairGap, Twin};

/// Fewest runs in each row for a [`ratio_interval`]: with fewer, a resampled median is
/// little more than one run.
pub const INTERVAL_MIN_RUNS: usize = 5;

/// Bootstrap resamples per [`ratio_interval`].
const RESAMPLES: usize = 2000;

/// The 90 % bootstrap interval of `median(a) / median(b) − 1`: each resample draws every
/// row's runs again with replacement. Why: a bench sitting on a shared machine has runs
/// that spread by tens of per cent, and the same pair measured twice in one sitting of 15
/// runs each has read up to 18 % apart by medians (`git show 758b630:docs/measurements/auto.md`), so a
/// ratio of medians alone cannot say whether a 5 % gap is there. The generator is seeded
/// the same every time, so one set of runs always gives one interval. `None` with fewer
/// than [`INTERVAL_MIN_RUNS`] runs in either row, or a zero-cost resample.
pub fn ratio_interval(a: &[f64], b: &[f64]) -> Option<(f64, f64)> {
    if a.len() < INTERVAL_MIN_RUNS || b.len() < INTERVAL_MIN_RUNS {
        return None;
    }
    let mut draw = Resampler::new();
    let (mut ra, mut rb) = (Vec::new(), Vec::new());
    let mut ratios = Vec::with_capacity(RESAMPLES);
    for _ in 0..RESAMPLES {
        let (ma, mb) = (draw.median(a, &mut ra)?, draw.median(b, &mut rb)?);
        if mb <= 0.0 {
            return None;
        }
        ratios.push(ma / mb - 1.0);
    }
    Some(middle_ninety(ratios))
}

/// The 90 % bootstrap interval of the median of `ratios` — one `x / y − 1` per repeat, as
/// [`PairGap::paired_excess`] takes them — resampling the repeats. Why beside
/// [`ratio_interval`]: a sitting's repeats are interleaved blocks, and over 60 repeats at
/// 16 KiB on loopback a pair's run in one repeat read as much as a fifth from its run in
/// the next while every row of the repeat moved alike; drawing each row's runs apart
/// counts that drift as noise in both rows, drawing whole repeats lets it cancel, as the
/// paired ratio itself does. Seeded as `ratio_interval` is; `None` with fewer than
/// [`INTERVAL_MIN_RUNS`] repeats.
pub fn paired_interval(ratios: &[f64]) -> Option<(f64, f64)> {
    if ratios.len() < INTERVAL_MIN_RUNS {
        return None;
    }
    let mut draw = Resampler::new();
    let mut buf = Vec::new();
    let medians: Option<Vec<f64>> = (0..RESAMPLES)
        .map(|_| draw.median(ratios, &mut buf))
        .collect();
    Some(middle_ninety(medians?))
}

/// Draws with replacement from a fixed seed: one set of runs, one interval.
struct Resampler(u64);

impl Resampler {
    fn new() -> Self {
        Resampler(0x5eed_0017_2026_1128)
    }

    fn index(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(crate::mix::GAMMA);
        (crate::mix::finalise(self.0) % n as u64) as usize
    }

    /// The median of `v.len()` draws from `v` (`buf` holds them).
    fn median(&mut self, v: &[f64], buf: &mut Vec<f64>) -> Option<f64> {
        buf.clear();
        for _ in 0..v.len() {
            let i = self.index(v.len());
            buf.push(v[i]);
        }
        median(buf)
    }
}

/// The 5th and 95th percentiles of `RESAMPLES` values.
fn middle_ninety(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 20], v[v.len() - 1 - v.len() / 20])
}

/// Runs of one pair under any of some labels, at one size and touch variant.
type Rows<'a> = (&'a str, &'a str, &'a [&'a str]);

/// `cost(a) / cost(b) − 1` within each repeat both ran in, in repeat order; a side with
/// several runs in a repeat (a pair measured again as the twin) counts their mean.
fn paired_ratios(runs: &[Run], a: Rows<'_>, b: Rows<'_>, at: (u64, bool)) -> Vec<f64> {
    let by_repeat = |(tx, rx, labels): Rows<'_>| -> BTreeMap<u32, (f64, u32)> {
        let mut m: BTreeMap<u32, (f64, u32)> = BTreeMap::new();
        for r in runs.iter().filter(|r| {
            measured(r)
                && (r.tx.as_str(), r.rx.as_str()) == (tx, rx)
                && labels.contains(&r.label.as_str())
                && (r.size, r.touch) == at
        }) {
            let e = m.entry(r.repeat).or_default();
            *e = (e.0 + run_cost(r), e.1 + 1);
        }
        m
    };
    let mean = |(sum, n): (f64, u32)| sum / f64::from(n.max(1));
    let (a, b) = (by_repeat(a), by_repeat(b));
    a.iter()
        .filter_map(|(k, x)| {
            let y = mean(*b.get(k)?);
            (y > 0.0).then(|| mean(*x) / y - 1.0)
        })
        .collect()
}

/// For each size and touch variant with `auto → auto` runs and at least one pair of single
/// paths: `auto → auto`'s median against the cheapest pair's median — the check that `auto`
/// lands within a few per cent of the best pair it could have been.
pub fn pair_gaps(runs: &[Run]) -> Vec<PairGap> {
    let g = pair_groups(runs);
    let mut twins: BTreeMap<(u64, bool), Twin> = BTreeMap::new();
    let mut tg: BTreeMap<(&str, &str, u64, bool), Vec<f64>> = BTreeMap::new();
    for r in runs.iter().filter(|r| measured(r) && r.label == TWIN) {
        tg.entry((&r.tx, &r.rx, r.size, r.touch))
            .or_default()
            .push(run_cost(r));
    }
    for ((tx, rx, size, touch), costs) in tg {
        let key = (tx.to_string(), rx.to_string(), size, touch);
        let (Some(first), Some(second)) =
            (g.get(&key).and_then(|e| spread(&e.costs)), spread(&costs))
        else {
            continue;
        };
        let ratios = paired_ratios(runs, (tx, rx, &[TWIN]), (tx, rx, &[""]), (size, touch));
        twins.insert(
            (size, touch),
            Twin {
                pair: format!("{tx}/{rx}"),
                first,
                second,
                gap: if first.median > 0.0 {
                    second.median / first.median - 1.0
                } else {
                    0.0
                },
                paired_gap: median(&ratios),
                gap_interval: g.get(&key).and_then(|e| ratio_interval(&costs, &e.costs)),
                paired_gap_interval: paired_interval(&ratios),
            },
        );
    }
    type Point = (Option<(Spread, usize)>, Option<(String, Spread)>);
    let mut by_point: BTreeMap<(u64, bool), Point> = BTreeMap::new();
    for ((tx, rx, size, touch), PairRuns { costs, .. }) in &g {
        let Some(s) = spread(costs) else { continue };
        let e = by_point.entry((*size, *touch)).or_default();
        if tx == "auto" && rx == "auto" {
            e.0 = Some((s, costs.len()));
        } else if PathPair::from_name(&format!("{tx}/{rx}")).is_some()
            && e.1.as_ref().is_none_or(|(_, b)| s.median < b.median)
        {
            e.1 = Some((format!("{tx}/{rx}"), s));
        }
    }
    by_point
        .into_iter()
        .filter_map(|((size, touch), (auto, best))| {
            let ((auto, auto_runs), (best_pair, best)) = (auto?, best?);
            let (btx, brx) = best_pair.split_once('/')?;
            // The best pair's every run in a repeat: where it is also the twin, both.
            let ratios = paired_ratios(
                runs,
                ("auto", "auto", &[""]),
                (btx, brx, &["", TWIN]),
                (size, touch),
            );
            let costs = |tx: &str, rx: &str| {
                g.get(&(tx.to_string(), rx.to_string(), size, touch))
                    .map(|e| e.costs.as_slice())
            };
            let excess_interval = ratio_interval(costs("auto", "auto")?, costs(btx, brx)?);
            Some(PairGap {
                size,
                touch,
                auto,
                auto_runs,
                best_pair,
                best,
                excess: if best.median > 0.0 {
                    auto.median / best.median - 1.0
                } else {
                    0.0
                },
                paired_excess: median(&ratios),
                excess_interval,
                paired_excess_interval: paired_interval(&ratios),
                twin: twins.remove(&(size, touch)),
            })
        })
        .collect()
}

/// How `auto` did against the best single path at one size.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AutoGap {
    /// "tx" or "rx".
    pub direction: &'static str,
    /// Operation size.
    pub size: u64,
    /// Touch variant.
    pub touch: bool,
    /// `auto`'s median cost.
    pub auto: f64,
    /// The cheapest single path at this size.
    pub best_path: String,
    /// Its median cost.
    pub best: f64,
    /// `auto / best − 1`: 0.05 means 5% more CPU per GiB than the best path.
    pub excess: f64,
}

/// For each direction, size and touch variant with an `auto` row and at least one single
/// path: `auto`'s median cost against the cheapest single path's.
pub fn auto_gaps(runs: &[Run]) -> Vec<AutoGap> {
    let mut out = Vec::new();
    for (tx, direction) in [(true, "tx"), (false, "rx")] {
        let g = groups(runs, tx);
        // (size, touch) → (auto's median, the cheapest single path and its median).
        type Point = (Option<f64>, Option<(String, f64)>);
        let mut by_point: BTreeMap<(u64, bool), Point> = BTreeMap::new();
        for ((name, size, touch), (costs, _)) in &g {
            let Some(m) = median(costs) else { continue };
            let e = by_point.entry((*size, *touch)).or_default();
            if name == "auto" {
                e.0 = Some(m);
            } else if e.1.as_ref().is_none_or(|(_, b)| m < *b) {
                e.1 = Some((name.clone(), m));
            }
        }
        for ((size, touch), (auto, best)) in by_point {
            if let (Some(auto), Some((best_path, best))) = (auto, best) {
                let excess = if best > 0.0 { auto / best - 1.0 } else { 0.0 };
                out.push(AutoGap {
                    direction,
                    size,
                    touch,
                    auto,
                    best_path,
                    best,
                    excess,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::sample_run;

    fn run_with(tx: &str, rx: &str, size: u64, snd: f64, rcv: f64, ztx: f64, zrx: f64) -> Run {
        let mut r = sample_run(tx, rx, size, snd + rcv);
        r.sender_cpu_s_per_gib = snd;
        r.receiver_cpu_s_per_gib = rcv;
        r.zc_fraction_tx = ztx;
        r.zc_fraction_rx = zrx;
        r
    }

    #[test]
    fn tables_take_each_direction_against_the_copy_baseline() {
        let runs = vec![
            run_with("copy", "copy", 4096, 0.2, 0.3, 0.0, 0.0),
            run_with("copy", "copy", 4096, 0.3, 0.3, 0.0, 0.0),
            run_with("copy", "copy", 4096, 0.25, 0.3, 0.0, 0.0),
            run_with("uring", "copy", 4096, 0.1, 0.3, 0.9, 0.0),
            run_with("copy", "mmap", 4096, 0.2, 0.1, 0.0, 0.8),
            // Neither direction at the copy baseline: no row.
            run_with("zerocopy", "mmap", 4096, 0.01, 0.01, 1.0, 1.0),
            // `auto` is never a row.
            run_with("auto", "copy", 4096, 0.01, 0.01, 0.0, 0.0),
        ];
        let (tx, rx) = profile_rows(&runs);
        assert_eq!(tx.len(), 2, "{tx:?}");
        let copy = tx.iter().find(|m| m.path == TxPath::Copy).unwrap();
        assert!((copy.cpu_s_per_gib.median - 0.55).abs() < 1e-9);
        assert!((copy.cpu_s_per_gib.lo - 0.5).abs() < 1e-9);
        assert!((copy.cpu_s_per_gib.hi - 0.6).abs() < 1e-9);
        let uring = tx.iter().find(|m| m.path == TxPath::Uring).unwrap();
        assert_eq!(uring.zc_fraction, Some(0.9));
        assert_eq!(rx.len(), 2, "{rx:?}");
        let mmap = rx.iter().find(|m| m.path == RxPath::Mmap).unwrap();
        assert_eq!(mmap.zc_fraction, Some(0.8));
        assert!((mmap.cpu_s_per_gib.median - 0.3).abs() < 1e-9);
    }

    #[test]
    fn a_run_that_moved_nothing_is_no_measurement() {
        let mut stalled = run_with("copy", "copy", 4096, 0.0, 0.0, 0.0, 0.0);
        stalled.bytes_received = 0;
        let runs = vec![
            run_with("copy", "copy", 4096, 0.2, 0.3, 0.0, 0.0),
            run_with("copy", "copy", 4096, 0.3, 0.3, 0.0, 0.0),
            stalled,
        ];
        let (_, rx) = profile_rows(&runs);
        assert_eq!(rx.len(), 1);
        assert!((rx[0].cpu_s_per_gib.lo - 0.5).abs() < 1e-9, "{rx:?}");
        let pairs = pair_rows(&runs);
        assert!((pairs[0].cpu_s_per_gib.lo - 0.5).abs() < 1e-9, "{pairs:?}");
    }

    #[test]
    fn unsupported_runs_are_left_out() {
        let mut refused = run_with("copy", "zcrx", 4096, 0.01, 0.01, 0.0, 0.0);
        refused.rx_in_effect = Some("uring".into());
        let runs = vec![run_with("copy", "copy", 4096, 0.2, 0.3, 0.0, 0.0), refused];
        let (_, rx) = profile_rows(&runs);
        assert_eq!(rx.len(), 1);
        assert_eq!(rx[0].path, RxPath::Copy);
    }

    #[test]
    fn pairs_take_every_pair_and_auto_auto_is_compared_with_the_best() {
        let runs = vec![
            run_with("copy", "copy", 65536, 0.25, 0.25, 0.0, 0.0),
            run_with("copy", "copy", 65536, 0.3, 0.3, 0.0, 0.0),
            run_with("uring", "uring", 65536, 0.3, 0.1, 0.1, 0.0),
            run_with("uring", "mmap", 65536, 0.4, 0.4, 0.0, 0.9),
            run_with("auto", "auto", 65536, 0.21, 0.21, 0.0, 0.0),
            run_with("auto", "auto", 65536, 0.22, 0.22, 0.0, 0.0),
            run_with("auto", "auto", 65536, 0.9, 0.9, 0.0, 0.0),
            // auto on one end only: not a pair of single paths, and not auto → auto.
            run_with("auto", "copy", 65536, 0.01, 0.01, 0.0, 0.0),
            // The bench's file sender is not a path auto takes.
            run_with("file", "copy", 65536, 0.01, 0.01, 0.0, 0.0),
        ];
        let pairs = pair_rows(&runs);
        assert_eq!(pairs.len(), 3, "{pairs:?}");
        let cc = pairs
            .iter()
            .find(|p| p.pair() == PathPair::DEFAULT)
            .unwrap();
        assert!((cc.cpu_s_per_gib.median - 0.55).abs() < 1e-9);
        assert!((cc.cpu_s_per_gib.lo - 0.5).abs() < 1e-9);
        // The receiver's share of each run's cost, median over the runs.
        assert!((cc.rx_share.unwrap() - 0.5).abs() < 1e-9, "{cc:?}");
        let uu = pairs.iter().find(|p| p.rx == RxPath::Uring).unwrap();
        assert!((uu.rx_share.unwrap() - 0.25).abs() < 1e-9, "{uu:?}");
        let um = pairs.iter().find(|p| p.rx == RxPath::Mmap).unwrap();
        assert_eq!(
            (um.zc_fraction_tx, um.zc_fraction_rx),
            (Some(0.0), Some(0.9))
        );
        let gaps = pair_gaps(&runs);
        assert_eq!(gaps.len(), 1, "{gaps:?}");
        let g = &gaps[0];
        // The file row (0.02) is cheaper but is not a pair auto could be; best is uring/uring.
        assert_eq!((g.best_pair.as_str(), g.auto_runs), ("uring/uring", 3));
        assert!((g.auto.median - 0.44).abs() < 1e-9, "{g:?}");
        assert!((g.excess - 0.1).abs() < 1e-9, "{g:?}");
    }

    #[test]
    fn the_twin_of_a_pair_stays_out_of_the_tables_and_reads_beside_the_gap() {
        let mut runs = vec![
            run_with("copy", "copy", 16384, 0.2, 0.2, 0.0, 0.0),
            run_with("copy", "copy", 16384, 0.25, 0.25, 0.0, 0.0),
            run_with("auto", "auto", 16384, 0.22, 0.22, 0.0, 0.0),
        ];
        for c in [0.1, 0.11] {
            let mut t = run_with("copy", "copy", 16384, c, c, 0.0, 0.0);
            t.label = TWIN.into();
            runs.push(t);
        }
        // The twin (0.2, 0.22) is cheaper than copy/copy's own runs (0.4, 0.5), yet the
        // tables and the best pair see only the latter.
        let pairs = pair_rows(&runs);
        assert_eq!(pairs.len(), 1);
        assert!((pairs[0].cpu_s_per_gib.median - 0.45).abs() < 1e-9);
        let (tx, _) = profile_rows(&runs);
        assert!((tx[0].cpu_s_per_gib.median - 0.45).abs() < 1e-9, "{tx:?}");
        let g = &pair_gaps(&runs)[0];
        assert!((g.best.median - 0.45).abs() < 1e-9, "{g:?}");
        let t = g.twin.as_ref().expect("the twin beside the gap");
        assert_eq!(t.pair, "copy/copy");
        assert!((t.second.median - 0.21).abs() < 1e-9, "{t:?}");
        assert!((t.gap - (0.21 / 0.45 - 1.0)).abs() < 1e-9, "{t:?}");
        // Every sample run is repeat 0: one ratio, of the mean of each side's runs there.
        assert!(
            (t.paired_gap.unwrap() - (0.21 / 0.45 - 1.0)).abs() < 1e-9,
            "{t:?}"
        );
        // The best pair's reference in the repeat is every run of it, the twin's too.
        let reference = (0.4 + 0.5 + 0.2 + 0.22) / 4.0;
        assert!(
            (g.paired_excess.unwrap() - (0.44 / reference - 1.0)).abs() < 1e-9,
            "{g:?}"
        );
        // Without twin runs there is none.
        runs.retain(|r| r.label != TWIN);
        assert_eq!(pair_gaps(&runs)[0].twin, None);
    }

    #[test]
    fn the_paired_excess_takes_each_repeat_against_itself() {
        // A load that doubles every cost in repeat 1: the medians mix the two sittings, the
        // per-repeat ratios do not.
        let mut runs = Vec::new();
        for (rep, k) in [(0u32, 1.0), (1, 2.0), (2, 1.0)] {
            for (tx, rx, c) in [("copy", "copy", 0.5), ("auto", "auto", 0.55)] {
                let mut r = run_with(tx, rx, 16384, c * k / 2.0, c * k / 2.0, 0.0, 0.0);
                r.repeat = rep;
                runs.push(r);
            }
        }
        let g = &pair_gaps(&runs)[0];
        assert!((g.paired_excess.unwrap() - 0.1).abs() < 1e-9, "{g:?}");
    }

    #[test]
    fn the_interval_holds_the_true_gap_and_narrows_only_with_a_clear_one() {
        // Twelve runs spread ±10 % around 1.0, and the same runs 20 % dearer: the interval
        // of the second over the first lies around +20 % and well past +5 %.
        let base: Vec<f64> = (0..12).map(|i| 0.9 + 0.2 * i as f64 / 11.0).collect();
        let dear: Vec<f64> = base.iter().map(|c| c * 1.2).collect();
        let (lo, hi) = ratio_interval(&dear, &base).unwrap();
        assert!(0.05 < lo && lo < 0.2 && 0.2 < hi && hi < 0.4, "{lo} {hi}");
        // A row against itself: the interval straddles zero, and is the same every time.
        let (lo, hi) = ratio_interval(&base, &base).unwrap();
        assert!(lo < 0.0 && 0.0 < hi, "{lo} {hi}");
        assert_eq!(ratio_interval(&base, &base), Some((lo, hi)));
        // Too few runs to say anything.
        assert_eq!(ratio_interval(&base[..4], &base), None);
        assert_eq!(ratio_interval(&base, &[0.0; 6]), None);
    }

    /// A sitting of `repeats` rounds of `copy → copy`, `auto → auto` and the twin, costing
    /// `costs` times the round's load `load(repeat)`.
    fn twin_sitting(repeats: u32, load: impl Fn(u32) -> f64, costs: [f64; 3]) -> Vec<Run> {
        let mut runs = Vec::new();
        for rep in 0..repeats {
            let k = load(rep);
            for ((tx, rx, label), c) in [
                ("copy", "copy", ""),
                ("auto", "auto", ""),
                ("copy", "copy", TWIN),
            ]
            .into_iter()
            .zip(costs)
            {
                let mut r = run_with(tx, rx, 16384, c * k / 2.0, c * k / 2.0, 0.0, 0.0);
                r.repeat = rep;
                r.label = label.into();
                runs.push(r);
            }
        }
        runs
    }

    #[test]
    fn the_pair_gap_carries_its_interval_and_the_twin_its_resolution() {
        let mut runs = twin_sitting(7, |rep| 1.0 + 0.05 * f64::from(rep % 3), [0.5, 0.51, 0.5]);
        let g = &pair_gaps(&runs)[0];
        let (lo, hi) = g.excess_interval.expect("seven runs a row");
        assert!(lo <= 0.02 && (0.02..0.15).contains(&hi), "{g:?}");
        let t = g.twin.as_ref().unwrap();
        let (lo, hi) = t.gap_interval.expect("seven runs a row");
        assert!(lo <= 0.0 && 0.0 <= hi, "{t:?}");
        // Three runs a row: no interval.
        runs.retain(|r| r.repeat < 3);
        assert_eq!(pair_gaps(&runs)[0].excess_interval, None);
    }

    #[test]
    fn the_paired_interval_lets_a_drift_over_the_sitting_cancel() {
        // Twelve repeats whose load swings every row of a repeat alike between 1× and 2×;
        // within a repeat the best pair reads 2 % under and over its mean in its two runs
        // (first and twin), and `auto` 3 % over that mean.
        let runs = twin_sitting(
            12,
            |rep| 1.0 + f64::from((rep * 5) % 12) / 11.0,
            [0.98, 1.03, 1.02],
        );
        let g = &pair_gaps(&runs)[0];
        // Each row's runs drawn apart: the drift fills the interval, past 5 % both ways.
        let (lo, hi) = g.excess_interval.unwrap();
        assert!(lo < -0.05 && hi > 0.05, "{g:?}");
        // Whole repeats drawn: every ratio is 1.03 / 1.0, and so is the interval.
        assert!((g.paired_excess.unwrap() - 0.03).abs() < 1e-9, "{g:?}");
        let (lo, hi) = g.paired_excess_interval.unwrap();
        assert!(
            (lo - 0.03).abs() < 1e-9 && (hi - 0.03).abs() < 1e-9,
            "{g:?}"
        );
        // The twin against its first: 1.02 / 0.98 in every repeat.
        let t = g.twin.as_ref().unwrap();
        let (lo, hi) = t.paired_gap_interval.unwrap();
        assert!((lo - (1.02 / 0.98 - 1.0)).abs() < 1e-9 && (hi - lo).abs() < 1e-9);
        // Repeats that disagree widen it; too few give none.
        assert_eq!(paired_interval(&[0.01, 0.02, 0.03, 0.04]), None);
        let spread: Vec<f64> = (0..15).map(|i| -0.1 + 0.02 * f64::from(i)).collect();
        let (lo, hi) = paired_interval(&spread).unwrap();
        assert!(lo < 0.0 && 0.0 < hi && hi - lo < 0.2, "{lo} {hi}");
        assert_eq!(paired_interval(&spread), Some((lo, hi)), "seeded");
    }

    #[test]
    fn auto_is_compared_with_the_cheapest_single_path() {
        let runs = vec![
            run_with("copy", "copy", 65536, 0.5, 0.5, 0.0, 0.0),
            run_with("uring", "copy", 65536, 0.4, 0.5, 0.0, 0.0),
            run_with("auto", "copy", 65536, 0.42, 0.5, 0.0, 0.0),
            run_with("copy", "auto", 65536, 0.5, 0.6, 0.0, 0.0),
            // No auto row at this size: nothing to compare.
            run_with("copy", "copy", 4096, 0.5, 0.5, 0.0, 0.0),
        ];
        let gaps = auto_gaps(&runs);
        assert_eq!(gaps.len(), 2, "{gaps:?}");
        let tx = &gaps[0];
        assert_eq!(
            (tx.direction, tx.size, tx.best_path.as_str()),
            ("tx", 65536, "uring")
        );
        assert!((tx.excess - (0.92 / 0.9 - 1.0)).abs() < 1e-9);
        let rx = &gaps[1];
        assert_eq!((rx.direction, rx.best_path.as_str()), ("rx", "copy"));
        assert!((rx.excess - 0.1).abs() < 1e-9);
    }
}
