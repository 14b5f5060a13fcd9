//! What a receiver on the `auto` path takes for one listener or connection, from this host's
//! profile: the profile's path, its half of the cheapest measured pair, or — where there is
//! no profile, or it cannot tell — a trial of the candidates against copy (run by
//! [`crate::auto::decide::RxDecider`]), possibly favouring the pairs' pick.
//!
//! Made once per connection, before the first byte: the mapping path's page-multiple MSS
//! has to be advertised before the handshake (`expect_mapping`), and an io_uring multishot
//! `recv` cannot share the socket with a plain `recv` while it is armed.

use crate::auto::decide::TRIAL;
use crate::auto::{pair, AutoStats, Chooser, ProfileSource};
use crate::path::RxPath;
use crate::profile::load::Loaded;

/// The decision for one listener or connection.
#[derive(Debug, Clone)]
pub(crate) struct AutoRxChoice {
    /// The concrete path (a trial's first candidate).
    pub path: RxPath,
    /// Whether the profile measured `mmap` mapping at this size: the listener then advertises
    /// the page-multiple MSS (fixed before the handshake, where no kernel evidence exists
    /// yet; a copy sender pays for it in CPU no receive check can see).
    pub expect_mapping: bool,
    /// No profile, or one whose measurements could not tell (`SpreadOverlap`): the
    /// candidates tried ([`TRIAL`]); empty when a profile chose.
    pub trial: Vec<RxPath>,
    /// With a pairs table that could not tell: the receive half of its cheapest pair by
    /// median, and how much dearer than copy the receiver may find it
    /// ([`pair::rx_tolerance`]; from an older profile, the share of `copy → copy`'s cost the
    /// pair saved); the trial keeps it unless it measures it dearer than copy by more than
    /// that (or the margin) ([`Trial::favouring`]).
    pub favoured: Option<(RxPath, f64)>,
    /// How much dearer than copy the run-time check lets the chosen path be on the
    /// receiver's own clock before it leaves it: the margin, or — for the receive half of
    /// the pair a pairs table chose outright — that pair's tolerance
    /// ([`pair::rx_tolerance`]), as for a favoured trial pick.
    pub check_margin: f64,
    /// Why no profile is in force, if none is.
    pub note: Option<String>,
    /// The decision, for `Stats`.
    pub delta: AutoStats,
}

/// Chooses the receive path for a receiver that receives `op_size` bytes per call (and
/// reads them, if `touch`), by the profile `profile` names, as the caller loaded it for
/// the receiver's address (`crate::profile::load::load`): the loading is the caller's, so
/// this decides without touching a file.
pub(crate) fn choose(
    profile: &ProfileSource,
    loaded: Loaded,
    touch: bool,
    op_size: usize,
) -> AutoRxChoice {
    let paired = loaded
        .profile
        .as_deref()
        .is_some_and(|p| pair::has_pairs(&p.pairs, touch));
    let chooser = match loaded.profile.as_deref() {
        // Both ends measured together on this host: the receiver's half of the cheapest
        // pair (the sender, if `auto` on the same profile, takes the other half).
        Some(p) if paired => Chooser::from_measurements(&pair::rx_rows(&p.pairs, touch), touch),
        Some(p) => Chooser::from_measurements(&p.rx, touch),
        None => Chooser::defaults(),
    };
    let size = op_size.max(1) as u64;
    let choice = chooser.choose(size, true);
    let mut delta = AutoStats::default();
    // Nothing measured here, and not told to stay on the built-in default: try the
    // candidates. Likewise where the profile measured a path cheaper than copy but within
    // the spread of its repeats (`SpreadOverlap`): the profile cannot tell, so the
    // connection measures it itself, and a tie keeps copy — unless the table is a pairs
    // table, whose cheapest pair the trial then favours (below). Over veth at 16 KiB `tune`
    // kept copy so (2.382 [1.98–2.99] against mmap's 2.353 [1.95–2.93] CPU-s/GiB) while the
    // bench's medians put copy → mmap 10 % under copy → copy.
    use crate::auto::ChoiceReason;
    let trial = match choice.reason {
        ChoiceReason::NoProfile => !matches!(profile, ProfileSource::BuiltIn),
        ChoiceReason::SpreadOverlap => true,
        _ => false,
    };
    // The pairs' rows are the sums of both ends: where they put a candidate's pair cheapest
    // by median, the trial — which sees the receiver alone — keeps it on a tie.
    let favoured = (paired && choice.reason == ChoiceReason::SpreadOverlap)
        .then(|| chooser.cheapest_median(size))
        .flatten()
        .filter(|p| TRIAL.contains(p))
        .and_then(|p| {
            // How much dearer the receiver may find it: exact with the ends' shares of the
            // pairs' costs; from a profile without them, the pair's saving (exact only
            // where the saving lies on the sender).
            let allowance = loaded
                .profile
                .as_deref()
                .and_then(|pr| pair::rx_tolerance(&pr.pairs, touch, size, p));
            let copy = chooser.estimate(RxPath::Copy, size)?.median;
            let it = chooser.estimate(p, size)?.median;
            (copy > 0.0).then(|| (p, allowance.unwrap_or(1.0 - it / copy)))
        });
    // A pairs table that chose a receive path outright chose it for the pair: where its
    // saving lies on the sender (the mapping receiver over veth at 16 KiB), the receiver's
    // own clock finds it level with copy or dearer, and a check by the margin alone sent
    // it back to copy — after `tune` over veth, in 16 of 30 `copy → auto` runs, a third to
    // all of their bytes, those runs 11 % dearer than the ones left alone. So the check
    // lets it be as much dearer as the pair can afford, no less than the margin.
    let check_margin = match loaded.profile.as_deref() {
        Some(p) if paired && choice.reason == ChoiceReason::Profile => {
            pair::rx_tolerance(&p.pairs, touch, size, choice.path)
                .map_or(crate::auto::cost::MARGIN, |t| {
                    t.clamp(crate::auto::cost::MARGIN, 1.0)
                })
        }
        _ => crate::auto::cost::MARGIN,
    };
    let (path, trial) = if trial {
        if choice.reason == ChoiceReason::NoProfile {
            delta.decisions += 1;
        } else {
            delta.record_choice(&choice);
        }
        delta.chose_trial += 1;
        // A favoured candidate is tried alone against copy: the pairs measured the others'
        // pairs dearer, and each arm the trial adds spends a third of its bytes elsewhere
        // (over veth at 16 KiB a 240 MiB trial is 0.4 s of a 1-s transfer, and `copy →
        // uring` read 22 % over `copy → mmap` there).
        let order = match favoured {
            Some((f, _)) => vec![f],
            None => TRIAL.to_vec(),
        };
        (order[0], order)
    } else {
        delta.record_choice(&choice);
        (choice.path, Vec::new())
    };
    AutoRxChoice {
        path,
        favoured,
        check_margin,
        // A trial's `mmap` is judged by its cost against copy, not by whether it maps: from a
        // copying sender it maps nothing over loopback or veth (kernel-findings §2) and can
        // still cost less, so mapping nothing is no reason to demote it mid-trial.
        expect_mapping: trial.is_empty() && chooser.expects_zero_copy(RxPath::Mmap, size),
        trial,
        note: loaded.note,
        delta,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    /// [`super::choose`] with the profile loaded as a receiver at `local` would load it.
    fn choose(profile: &ProfileSource, touch: bool, op_size: usize, local: IpAddr) -> AutoRxChoice {
        let loaded = crate::profile::load::load(profile, local);
        super::choose(profile, loaded, touch, op_size)
    }

    /// A profile whose only rows are receive rows at 16 KiB and 1 MiB: copy at 1.0 and
    /// `mmap` at `mmap` CPU-s/GiB, each with a ±`spread` range.
    fn rx_profile(mmap: f64, spread: f64) -> ProfileSource {
        use crate::tuning::{Measurement, Profile, Spread};
        let row = |path, size, median: f64| Measurement {
            path,
            size,
            touch: false,
            cpu_s_per_gib: Spread::around(median, spread),
            zc_fraction: None,
        };
        let rx = [16u64 << 10, 1 << 20]
            .into_iter()
            .flat_map(|s| [row(RxPath::Copy, s, 1.0), row(RxPath::Mmap, s, mmap)])
            .collect();
        ProfileSource::Given(std::sync::Arc::new(Profile::scripted(Vec::new(), rx)))
    }

    #[test]
    fn a_profile_that_cannot_tell_leaves_the_choice_to_a_trial_on_the_connection() {
        let here = IpAddr::from([127, 0, 0, 1]);
        // mmap 3 % under copy, each ±5 %: the spreads overlap, the profile cannot tell.
        let c = choose(&rx_profile(0.97, 0.05), false, 16 << 10, here);
        assert_eq!(c.trial, TRIAL.to_vec());
        assert_eq!(c.path, TRIAL[0]);
        assert!(!c.expect_mapping, "a trial judges cost, not mapping");
        assert_eq!(
            (
                c.delta.decisions,
                c.delta.chose_default_overlap,
                c.delta.chose_trial
            ),
            (1, 1, 1),
            "counted as both: the profile's overlap and the trial it led to"
        );
        // mmap clearly cheaper: the profile decides, no trial.
        let c = choose(&rx_profile(0.3, 0.05), false, 16 << 10, here);
        assert!(c.trial.is_empty());
        assert_eq!(c.path, RxPath::Mmap);
        assert_eq!((c.delta.decisions, c.delta.chose_trial), (1, 0));
        // mmap dearer: copy is simply the cheapest, no trial.
        let c = choose(&rx_profile(1.5, 0.05), false, 16 << 10, here);
        assert!(c.trial.is_empty());
        assert_eq!(c.path, RxPath::Copy);
        assert_eq!(c.delta.chose_trial, 0);
    }

    /// A profile with a pairs table at 16 KiB and 1 MiB: `copy → copy` at 1.0 and
    /// `copy → mmap` at `mmap` CPU-s/GiB (both ends), `copy → uring` at 1.02, each ±`spread`.
    fn pairs_profile(mmap: f64, spread: f64) -> ProfileSource {
        pairs_profile_shared(mmap, spread, None)
    }

    /// [`pairs_profile`], with the receivers' shares of `copy → copy`'s and
    /// `copy → mmap`'s costs (`copy → uring`'s as copy's).
    fn pairs_profile_shared(mmap: f64, spread: f64, shares: Option<(f64, f64)>) -> ProfileSource {
        use crate::path::TxPath;
        use crate::tuning::{PairMeasurement, Profile, Spread};
        let row = |rx, size, median: f64| PairMeasurement {
            tx: TxPath::Copy,
            rx,
            size,
            touch: false,
            cpu_s_per_gib: Spread::around(median, spread),
            zc_fraction_tx: Some(0.0),
            zc_fraction_rx: Some(0.0),
            rx_share: shares.map(|(c, m)| if rx == RxPath::Mmap { m } else { c }),
        };
        let mut p = Profile::scripted(Vec::new(), Vec::new());
        p.pairs = [16u64 << 10, 1 << 20]
            .into_iter()
            .flat_map(|s| {
                [
                    row(RxPath::Copy, s, 1.0),
                    row(RxPath::Mmap, s, mmap),
                    row(RxPath::Uring, s, 1.02),
                ]
            })
            .collect();
        ProfileSource::Given(std::sync::Arc::new(p))
    }

    #[test]
    fn where_the_pairs_cannot_tell_the_trial_favours_their_cheapest_receive_half() {
        let here = IpAddr::from([127, 0, 0, 1]);
        // copy → mmap 8 % under copy → copy by median, inside its ±15 %: the pairs cannot
        // tell, so the connection tries mmap alone against copy, starting on it and keeping
        // it on a tie (copy → uring, 2 % over copy → copy, is not tried).
        let c = choose(&pairs_profile(0.92, 0.15), false, 16 << 10, here);
        let (f, saving) = c.favoured.expect("mmap favoured");
        assert_eq!(f, RxPath::Mmap);
        assert!((saving - 0.08).abs() < 1e-9, "the pair saved 8 %: {saving}");
        assert_eq!(c.trial, vec![RxPath::Mmap]);
        assert_eq!(c.path, RxPath::Mmap);
        assert_eq!(c.delta.chose_trial, 1);
        // With the ends' shares the receiver's allowance is the pair's, in its own terms.
        // Senders 0.65 and 0.534 (the saving on the sender): the receiver may run
        // (1 − 0.534) / 0.35 − 1 = 33 % over copy.
        let c = choose(
            &pairs_profile_shared(0.92, 0.15, Some((0.35, 0.42))),
            false,
            16 << 10,
            here,
        );
        let (f, tolerance) = c.favoured.expect("mmap favoured");
        assert_eq!(f, RxPath::Mmap);
        let want = (1.0 - 0.92 * 0.58) / 0.35 - 1.0;
        assert!(
            (tolerance - want).abs() < 1e-9,
            "{tolerance} against {want}"
        );
        // Senders alike (the saving all on the receiver): no allowance.
        let share = 1.0 - 0.65 / 0.92;
        let c = choose(
            &pairs_profile_shared(0.92, 0.15, Some((0.35, share))),
            false,
            16 << 10,
            here,
        );
        let (_, tolerance) = c.favoured.expect("mmap favoured");
        assert!(tolerance.abs() < 1e-9, "{tolerance}");
        // A single-end table that cannot tell (no pairs) favours nothing: its rows are each
        // path against a copy peer, blind to the sender the pairs see.
        let c = choose(&rx_profile(0.92, 0.15), false, 16 << 10, here);
        assert_eq!(c.favoured, None);
        assert_eq!(c.trial, TRIAL.to_vec());
        // Pairs clear about it: chosen outright, no trial, nothing favoured.
        let c = choose(&pairs_profile(0.5, 0.05), false, 16 << 10, here);
        assert_eq!(c.path, RxPath::Mmap);
        assert!(c.favoured.is_none());
        assert!(c.trial.is_empty());
        // ... and the check judges it by the pair's tolerance on the receiver's clock:
        // senders 0.65 and 0.8 × 0.5 = 0.4, so the receiver may run (1 − 0.4) / 0.35 − 1
        // = 71 % over copy before the pair loses what it saved.
        let c = choose(
            &pairs_profile_shared(0.5, 0.05, Some((0.35, 0.2))),
            false,
            16 << 10,
            here,
        );
        assert_eq!(c.path, RxPath::Mmap);
        let want = (1.0 - 0.5 * 0.8) / 0.35 - 1.0;
        assert!((c.check_margin - want).abs() < 1e-9, "{}", c.check_margin);
        // Without the shares, or from a single-end table, the margin.
        assert_eq!(
            c_margin(&pairs_profile(0.5, 0.05)),
            crate::auto::cost::MARGIN
        );
        assert_eq!(c_margin(&rx_profile(0.3, 0.05)), crate::auto::cost::MARGIN);
        // The saving mostly the receiver's (senders 0.65 and 0.9 × 0.72 = 0.648): the
        // pair could afford 0.6 %, and the check keeps the margin.
        let c = choose(
            &pairs_profile_shared(0.9, 0.01, Some((0.35, 0.28))),
            false,
            16 << 10,
            here,
        );
        assert_eq!((c.path, c.trial.len()), (RxPath::Mmap, 0));
        assert_eq!(c.check_margin, crate::auto::cost::MARGIN);
        // copy → copy cheapest: no trial.
        let c = choose(&pairs_profile(1.2, 0.15), false, 16 << 10, here);
        assert_eq!(c.path, RxPath::Copy);
        assert!(c.favoured.is_none());
        assert!(c.trial.is_empty());
    }

    /// The run-time check's margin for a 16 KiB receiver on loopback under `profile`.
    fn c_margin(profile: &ProfileSource) -> f64 {
        choose(profile, false, 16 << 10, IpAddr::from([127, 0, 0, 1])).check_margin
    }
}
