//! Costs of transmit × receive *pairs*, and what each end of an `auto → auto` connection takes
//! from them.
//!
//! Why pairs: the costs of the two ends do not add up. Measured each against a `copy` peer,
//! mapping on receive looked cheaper than copying at 256 KiB, yet from the `uring` sender
//! that `auto` itself picks there it cost far more (loopback's local delivery hands the
//! receiver other pages); and `uring → uring` at 64 KiB was the cheapest pair while neither
//! end, measured against `copy`, looked cheaper than `copy`. Where both ends run on this host
//! (loopback, network namespaces) `zcnet tune` therefore measures every pair, and both ends
//! of a connection read the same table: the sender takes the transmit half of the cheapest
//! pair at its operation size, the receiver the receive half — the pair is the decision,
//! each end carries out its half. Peers elsewhere have only the single-end tables.
//!
//! The choice reuses [`Chooser`] over [`PathPair`]s (same interpolation in `log2(size)`,
//! same rule: a pair beats `copy → copy` only if its whole spread lies below copy's). Each
//! end then gets an ordinary single-path table, *projected* at each measured size onto the
//! other end's half of the chosen pair ([`tx_rows`], [`rx_rows`]): the rows the transmit
//! chooser sees at 64 KiB are "each sender into the `uring` receiver" when `uring → uring`
//! won there. So everything downstream — demotion after `COPIED`, the run-time cost
//! check — works unchanged, and each row keeps the zero-copy share of its own end.
//! Where no pair clears `copy → copy`'s spread, both ends are projected onto the pair with
//! the cheapest median ([`aimed`]), so that an end that then tries its cheaper-median path
//! works toward the same pair as its peer.

use super::choose::Chooser;
use super::{AutoPath, ChoiceReason};
use crate::path::{RxPath, TxPath};
use crate::profile::{Measurement, PairMeasurement, PathPair};

/// A [`Chooser`] over the pairs of one touch variant: the cheapest pair that clears
/// `copy → copy`'s spread, else `copy → copy`. Without a `copy → copy` row it answers the
/// default with [`super::ChoiceReason::NoProfile`], as every chooser does.
pub fn chooser(pairs: &[PairMeasurement], touch: bool) -> Chooser<PathPair> {
    let rows: Vec<Measurement<PathPair>> = pairs
        .iter()
        .map(|p| Measurement {
            path: p.pair(),
            size: p.size,
            touch: p.touch,
            cpu_s_per_gib: p.cpu_s_per_gib,
            zc_fraction: None,
        })
        .collect();
    Chooser::from_measurements(&rows, touch)
}

/// Whether `pairs` has anything for this touch variant (a usable `copy → copy` baseline).
pub(crate) fn has_pairs(pairs: &[PairMeasurement], touch: bool) -> bool {
    pairs
        .iter()
        .any(|p| p.touch == touch && p.pair() == PathPair::DEFAULT)
}

/// The sizes measured for this touch variant, ascending.
fn sizes(pairs: &[PairMeasurement], touch: bool) -> Vec<u64> {
    let mut s: Vec<u64> = pairs
        .iter()
        .filter(|p| p.touch == touch)
        .map(|p| p.size)
        .collect();
    s.sort_unstable();
    s.dedup();
    s
}

/// The pair both ends of an `auto → auto` connection aim at, at `size`: the chosen pair, or,
/// where the pairs cannot tell it from `copy → copy` ([`ChoiceReason::SpreadOverlap`]), the
/// pair with the cheapest median. Each end's table is projected onto this one pair, so that
/// where an end then starts on its cheaper-median path and lets its cost check decide, both
/// ends work toward the same pair. Projected onto `copy → copy` instead, each end found its
/// own cheaper median against a copy peer, and the two halves could meet in a pair no one
/// had measured as cheap: over veth at 256 KiB the sender went to `uring` (cheaper into a
/// copy receiver), the receiver's trial to `mmap` or `uring`, and `uring → mmap` cost 1.4×
/// `copy → mmap`, the pair whose median was lowest.
pub fn aimed(c: &Chooser<PathPair>, size: u64) -> PathPair {
    let choice = c.choose(size, true);
    if choice.reason == ChoiceReason::SpreadOverlap {
        c.cheapest_median(size).unwrap_or(choice.path)
    } else {
        choice.path
    }
}

/// How much dearer than `copy`, on its own clock, an `auto` receiver may find receive path
/// `rx` at about `size` and still be in a pair no dearer than the aimed sender into `copy`:
/// `(C − S) / R − 1`, where `C` is that sender into `copy` (both ends), `R` the receiver's
/// part of it, and `S` the sender's part of the pair with `rx` — the pair stays under `C`
/// while the receiver's excess `e·R` stays under `C − S − R`. Where a receive path's saving
/// lies on the *sender*, that is more than the pair's saving: over veth at 16 KiB `copy →
/// mmap` cost 2.10 against `copy → copy`'s 2.35 (10 % less), the senders 1.25 and 1.60, the
/// receivers 0.89 and 0.85, so the mapping receiver may run 37 % over copy on its own clock
/// before the pair loses what it saved. Where the saving lies on the receiver, less: none
/// at all if the senders cost the same. Read at the table's measured size nearest `size`
/// (in `log2`); `None` without the receivers' shares ([`PairMeasurement::rx_share`]).
pub(crate) fn rx_tolerance(
    pairs: &[PairMeasurement],
    touch: bool,
    size: u64,
    rx: RxPath,
) -> Option<f64> {
    let l = (size.max(1) as f64).log2();
    let dist = |s: u64| ((s as f64).log2() - l).abs();
    let at = sizes(pairs, touch)
        .into_iter()
        .min_by(|a, b| dist(*a).total_cmp(&dist(*b)))?;
    let tx = aimed(&chooser(pairs, touch), at).tx;
    let row = |r: RxPath| {
        pairs
            .iter()
            .find(|p| p.touch == touch && p.size == at && p.tx == tx && p.rx == r)
    };
    let (copy, it) = (row(RxPath::Copy)?, row(rx)?);
    let c = copy.cpu_s_per_gib.median;
    let r = c * copy.rx_share?;
    let s = it.cpu_s_per_gib.median * (1.0 - it.rx_share?);
    Some((c - s) / r - 1.0).filter(|t| r > 0.0 && t.is_finite())
}

/// The transmit table an `auto` sender uses when its peer is `auto` on the same profile: at
/// each measured size, each transmit path into the receive path of the pair aimed at there
/// ([`aimed`]). Sizes where that receiver has no `copy` sender measured are left out (no
/// baseline).
pub(crate) fn tx_rows(pairs: &[PairMeasurement], touch: bool) -> Vec<Measurement<TxPath>> {
    let c = chooser(pairs, touch);
    let mut out = Vec::new();
    for size in sizes(pairs, touch) {
        let rx = aimed(&c, size).rx;
        let at: Vec<&PairMeasurement> = pairs
            .iter()
            .filter(|p| p.touch == touch && p.size == size && p.rx == rx)
            .collect();
        if !at.iter().any(|p| p.tx == TxPath::Copy) {
            continue;
        }
        out.extend(at.into_iter().map(|p| Measurement {
            path: p.tx,
            size,
            touch,
            cpu_s_per_gib: p.cpu_s_per_gib,
            zc_fraction: p.zc_fraction_tx,
        }));
    }
    out
}

/// The receive table an `auto` receiver uses when its peer is `auto` on the same profile: at
/// each measured size, each receive path from the transmit path of the pair aimed at there
/// ([`aimed`]).
pub(crate) fn rx_rows(pairs: &[PairMeasurement], touch: bool) -> Vec<Measurement<RxPath>> {
    let c = chooser(pairs, touch);
    let mut out = Vec::new();
    for size in sizes(pairs, touch) {
        let tx = aimed(&c, size).tx;
        let at: Vec<&PairMeasurement> = pairs
            .iter()
            .filter(|p| p.touch == touch && p.size == size && p.tx == tx)
            .collect();
        if !at.iter().any(|p| p.rx == RxPath::Copy) {
            continue;
        }
        out.extend(at.into_iter().map(|p| Measurement {
            path: p.rx,
            size,
            touch,
            cpu_s_per_gib: p.cpu_s_per_gib,
            zc_fraction: p.zc_fraction_rx,
        }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Spread;

    const KIB: u64 = 1024;
    const MIB: u64 = 1 << 20;

    fn pm(tx: TxPath, rx: RxPath, size: u64, median: f64) -> PairMeasurement {
        pm_within(tx, rx, size, median, 0.03)
    }

    /// A pair measured at `median` ± `w` (a fraction of it).
    fn pm_within(tx: TxPath, rx: RxPath, size: u64, median: f64, w: f64) -> PairMeasurement {
        PairMeasurement {
            tx,
            rx,
            size,
            touch: false,
            cpu_s_per_gib: Spread::around(median, w),
            zc_fraction_tx: Some(0.0),
            zc_fraction_rx: Some(if rx == RxPath::Mmap { 0.9 } else { 0.0 }),
            rx_share: None,
        }
    }

    /// The loopback shape the single-end tables got wrong: at 64 KiB `uring → uring` is the
    /// cheapest pair though neither half is cheaper than copy against a copy peer; at
    /// 256 KiB `copy → mmap` looks cheap, but `uring → mmap` is dear and `copy → copy` wins.
    fn table() -> Vec<PairMeasurement> {
        use RxPath as R;
        use TxPath as T;
        let mut v = Vec::new();
        for (size, costs) in [
            (
                64 * KIB,
                [
                    (T::Copy, R::Copy, 0.50),
                    (T::Copy, R::Uring, 0.52),
                    (T::Copy, R::Mmap, 0.60),
                    (T::Uring, R::Copy, 0.55),
                    (T::Uring, R::Uring, 0.40),
                    (T::Uring, R::Mmap, 0.80),
                ],
            ),
            (
                256 * KIB,
                [
                    (T::Copy, R::Copy, 0.45),
                    (T::Copy, R::Uring, 0.47),
                    (T::Copy, R::Mmap, 0.44),
                    (T::Uring, R::Copy, 0.50),
                    (T::Uring, R::Uring, 0.48),
                    (T::Uring, R::Mmap, 0.75),
                ],
            ),
        ] {
            v.extend(costs.iter().map(|&(t, r, m)| pm(t, r, size, m)));
        }
        v
    }

    /// The single-end transmit table: each sender into a copy receiver.
    fn into_copy_receiver(t: &[PairMeasurement]) -> Chooser<TxPath> {
        let rows: Vec<Measurement<TxPath>> = t
            .iter()
            .filter(|p| p.rx == RxPath::Copy)
            .map(|p| Measurement {
                path: p.tx,
                size: p.size,
                touch: false,
                cpu_s_per_gib: p.cpu_s_per_gib,
                zc_fraction: None,
            })
            .collect();
        Chooser::from_measurements(&rows, false)
    }

    #[test]
    fn names_round_trip_and_auto_is_not_a_half() {
        let p = PathPair {
            tx: TxPath::Uring,
            rx: RxPath::Mmap,
        };
        assert_eq!(p.to_string(), "uring/mmap");
        assert_eq!(PathPair::from_name("uring/mmap"), Some(p));
        for bad in ["uring", "auto/copy", "copy/auto", "uring/teleport", ""] {
            assert_eq!(PathPair::from_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_cheapest_pair_is_chosen_not_the_sum_of_halves() {
        let c = chooser(&table(), false);
        let at64 = c.choose(64 * KIB, true);
        assert_eq!(
            at64.path,
            PathPair {
                tx: TxPath::Uring,
                rx: RxPath::Uring
            }
        );
        // copy → mmap's median is lower at 256 KiB but its spread overlaps copy → copy's.
        assert_eq!(c.choose(256 * KIB, true).path, PathPair::DEFAULT);
        // Each end's projected table leads it to its half of the chosen pair.
        let tx = Chooser::from_measurements(&tx_rows(&table(), false), false);
        let rx = Chooser::from_measurements(&rx_rows(&table(), false), false);
        assert_eq!(tx.choose(64 * KIB, true).path, TxPath::Uring);
        assert_eq!(rx.choose(64 * KIB, true).path, RxPath::Uring);
        assert_eq!(tx.choose(256 * KIB, true).path, TxPath::Copy);
        assert_eq!(rx.choose(256 * KIB, true).path, RxPath::Copy);
        // The single-end table (each against copy) would never have found uring at 64 KiB.
        let single = into_copy_receiver(&table());
        assert_eq!(single.choose(64 * KIB, true).path, TxPath::Copy);
    }

    #[test]
    fn where_the_pairs_cannot_tell_both_ends_aim_at_the_cheapest_median_pair() {
        use RxPath as R;
        use TxPath as T;
        // The veth shape at 256 KiB: every pair inside copy → copy's spread; into a copy
        // receiver uring looks the cheaper sender, but uring → mmap is dear, and copy → mmap
        // has the lowest median.
        let t: Vec<PairMeasurement> = [
            (T::Copy, R::Copy, 0.73),
            (T::Copy, R::Mmap, 0.63),
            (T::Copy, R::Uring, 0.67),
            (T::Uring, R::Copy, 0.66),
            (T::Uring, R::Mmap, 0.89),
            (T::Uring, R::Uring, 0.83),
        ]
        .into_iter()
        .map(|(tx, rx, m)| pm_within(tx, rx, 256 * KIB, m, 0.25))
        .collect();
        let c = chooser(&t, false);
        let choice = c.choose(256 * KIB, true);
        assert_eq!(choice.reason, ChoiceReason::SpreadOverlap);
        assert_eq!(choice.path, PathPair::DEFAULT);
        assert_eq!(
            aimed(&c, 256 * KIB),
            PathPair {
                tx: T::Copy,
                rx: R::Mmap
            }
        );
        // The sender's rows are into mmap: copy is its cheapest there, nothing to try.
        let tx = Chooser::from_measurements(&tx_rows(&t, false), false);
        assert_eq!(tx.choose(256 * KIB, true).path, T::Copy);
        assert_eq!(tx.cheapest_median(256 * KIB), None);
        // Projected onto copy → copy, as before, the sender would have started on uring.
        let into_copy = into_copy_receiver(&t);
        assert_eq!(into_copy.cheapest_median(256 * KIB), Some(T::Uring));
        // The receiver's rows are from the copy sender, where mmap has the cheaper median.
        let rx = Chooser::from_measurements(&rx_rows(&t, false), false);
        assert_eq!(rx.cheapest_median(256 * KIB), Some(R::Mmap));
    }

    #[test]
    fn projected_rows_keep_each_ends_zero_copy_share() {
        let mut t = table();
        // Make copy → mmap clearly cheapest at 256 KiB: the receiver's rows are from copy.
        for p in t.iter_mut() {
            if p.size == 256 * KIB && p.tx == TxPath::Copy && p.rx == RxPath::Mmap {
                p.cpu_s_per_gib = Spread {
                    median: 0.30,
                    lo: 0.29,
                    hi: 0.31,
                };
            }
        }
        let rx = rx_rows(&t, false);
        let mmap = rx
            .iter()
            .find(|m| m.size == 256 * KIB && m.path == RxPath::Mmap)
            .unwrap();
        assert_eq!(mmap.zc_fraction, Some(0.9));
        assert_eq!(mmap.cpu_s_per_gib.median, 0.30);
        let rx = Chooser::from_measurements(&rx, false);
        assert_eq!(rx.choose(256 * KIB, true).path, RxPath::Mmap);
        assert!(rx.expects_zero_copy(RxPath::Mmap, 256 * KIB));
        let tx = tx_rows(&t, false);
        assert!(tx
            .iter()
            .filter(|m| m.size == 256 * KIB)
            .all(|m| m.zc_fraction == Some(0.0)));
    }

    #[test]
    fn without_a_baseline_pair_nothing_is_projected() {
        let t: Vec<PairMeasurement> = table()
            .into_iter()
            .filter(|p| p.pair() != PathPair::DEFAULT)
            .collect();
        assert!(!has_pairs(&t, false));
        assert!(has_pairs(&table(), false));
        assert!(!has_pairs(&table(), true));
        assert_eq!(
            chooser(&t, false).choose(64 * KIB, true).reason,
            super::super::ChoiceReason::NoProfile
        );
    }

    #[test]
    fn the_receivers_allowance_is_the_pairs_saving_in_its_own_terms() {
        use RxPath as R;
        use TxPath as T;
        let shared = |tx, rx, size, median, share| PairMeasurement {
            rx_share: Some(share),
            ..pm_within(tx, rx, size, median, 0.15)
        };
        // Over veth at 16 KiB: copy → mmap 2.10 (sender 1.218) against copy → copy 2.35
        // (receiver 0.8225), ranges overlapping, so both ends aim at copy → mmap.
        let t = vec![
            shared(T::Copy, R::Copy, 16 * KIB, 2.35, 0.35),
            shared(T::Copy, R::Mmap, 16 * KIB, 2.10, 0.42),
            shared(T::Copy, R::Copy, MIB, 0.60, 0.35),
            shared(T::Copy, R::Mmap, MIB, 0.90, 0.40),
        ];
        let want = (2.35 - 2.10 * 0.58) / (2.35 * 0.35) - 1.0;
        let got = rx_tolerance(&t, false, 16 * KIB, R::Mmap).expect("shares recorded");
        assert!((got - want).abs() < 1e-9, "{got} against {want}");
        assert!(got > 0.3, "well over the pair's own 10.6 % saving: {got}");
        // Read at the nearest measured size: 20 KiB is 16 KiB's.
        assert_eq!(rx_tolerance(&t, false, 20 * KIB, R::Mmap), Some(got));
        // Where mapping is dearer outright (1 MiB) the allowance is negative: copy's sender
        // costs what mmap's does, so any receiver excess loses.
        assert!(rx_tolerance(&t, false, MIB, R::Mmap).unwrap() < 0.0);
        // Without the shares (an older profile), or without the row: nothing to say.
        let old: Vec<PairMeasurement> = t
            .iter()
            .map(|p| PairMeasurement {
                rx_share: None,
                ..*p
            })
            .collect();
        assert_eq!(rx_tolerance(&old, false, 16 * KIB, R::Mmap), None);
        assert_eq!(rx_tolerance(&t, false, 16 * KIB, R::Uring), None);
        assert_eq!(rx_tolerance(&t, true, 16 * KIB, R::Mmap), None);
    }
}
