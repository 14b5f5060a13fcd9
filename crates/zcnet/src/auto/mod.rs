//! The `auto` path's decision logic: which transmit or receive path an operation takes.
//!
//! Why: whether zero-copy pays depends on the host — its caches, its MMU, its NIC (the seed
//! papers' common conclusion). On loopback plain copying beats `MSG_ZEROCOPY` and
//! `TCP_ZEROCOPY_RECEIVE` because local delivery copies anyway, while a device that takes the
//! pages halves the sender's CPU. The CMU stack chose per write by size, Solaris by size and
//! alignment; zcnet chooses per operation from what `zcnet tune` measured on this host.
//!
//! This module is the decider alone, pure code in the quinn-proto manner: state machines fed
//! operation sizes, completions and CPU-clock readings its callers take, with no sockets,
//! no files and no environment reads, so each is tested without a host. What does the I/O
//! lives apart, and `auto` never calls it: the profile's file — its layout, checks, location
//! and loading for a connection (`crate::profile`, [`ProfileSource`]) — and the sender's
//! clock card in `/dev/shm` (`crate::peer_card`), which the receiver's clock reads
//! (`crate::rx::auto`). The parts:
//!
//! * `choose`: a `Chooser` that answers, per operation size and alignment, the cheapest
//!   measured path, preferring the conservative default (`copy`) unless another path is
//!   cheaper beyond the measured spread; and the crossovers where the answer changes.
//! * `pair`: transmit × receive pairs measured with both ends on this host, and each
//!   end's half of the cheapest pair (the two ends' costs do not add up).
//! * `file`: `send_file`'s mode (`sendfile`, `splice`, `read_send`) from the profile's
//!   `file` table.
//! * `decide`: the decider, one per direction and kind of operation — the profile's choice,
//!   then the connection's cost check — behind one small trait (`Decide`).
//! * `rx_choice`: what a receiver takes for a connection, from the profile its caller
//!   loaded: the profile's path, its half of a pair, or a trial.
//! * `demotion`: online demotion of the mapping receiver while it maps nothing, and its
//!   retries after a back-off (transmit's `COPIED` demotion is the sub-paths' own,
//!   [`crate::policy::CopiedDemotion`]). The kernel's evidence overrides any profile.
//! * `cost`: the run-time check, on both ends: a window of bytes on the wanted path, one on
//!   copy, compared in the thread's own CPU per byte; a path costlier than copy is left
//!   for a back-off, so a stale or foreign profile costs a check, not a transfer. The clock
//!   is the caller's.
//! * `trial`: without a profile, a receiver's candidate paths and copy measured in
//!   interleaved rounds on the connection itself; a candidate replaces copy only if the
//!   median of its paired comparisons beats copy by the margin. Where the sender left its
//!   card, the rounds are judged on both ends' CPU time.
//! * `memory`: a process's clear losers and pooled rounds per route and sender op size, so
//!   later connections skip or shorten their trials.
//!
//! Profile tables from bench runs, and `auto`'s gap to the best single path, are
//! `zcnet_bench::measure`'s.
//!
//! How it plugs in: a `Sender` on [`TxPath::Auto`](crate::TxPath::Auto) (`crate::tx::auto`)
//! holds a `Decider` for loaned buffers and one for `send_slice` (from the profile, or `Chooser::defaults`
//! without one) and sends each operation where its decider answers; its zero-copy sub-paths
//! demote themselves on `COPIED` completions. A `Receiver` on [`RxPath::Auto`] chooses once
//! per connection from its operation size (its half of the cheapest `pair` where the profile
//! has pairs; without a profile it measures `uring`, `mmap` and copy in interleaved rounds,
//! `trial`), then runs the same cost check on its own thread, reading with plain `recv`
//! while the check says copy (`crate::rx::auto`), and, on a profile's `mmap`, demotes to
//! plain `recv` while mapping keeps failing.
//! `zcnet tune` writes a [`Profile`] with [`Profile::to_json`].

// The decision's machinery is internal (issue 43: a curated public API). Applications
// read decisions through `AutoStats` and choose a profile with `ProfileSource`; tools that
// measure a host and write its profile (`zcnet tune`, `zcnet bench`, zcnet-bench) reach
// the rest through `crate::tuning`.
pub(crate) mod choose;
pub(crate) mod cost;
pub(crate) mod decide;
pub(crate) mod demotion;
pub(crate) mod file;
pub(crate) mod memory;
pub(crate) mod pair;
pub(crate) mod rx_choice;
pub(crate) mod trial;

pub(crate) use crate::profile::Measurement;
pub use crate::profile::{load::ProfileSource, AutoPath, Profile};
pub(crate) use choose::{Choice, ChoiceReason, Chooser};
pub(crate) use demotion::{Demotion, Report};

use crate::path::RxPath;

/// The median of `values` (the mean of the middle two for an even count), or `None` when
/// there is nothing (or something not finite) to take it of: the statistic both the
/// receive trial and the bench's reports rest on, robust to the one window or run that met
/// a noisy neighbour.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() || values.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

crate::counters::counter_set!(
/// Every decision, switch, demotion and promotion of one connection's `auto` path, with its
/// reason. Plain counters, so they can be merged into `Stats` snapshots and bench reports.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[non_exhaustive]
plain AutoStats {
    /// Operations decided (one per [`AutoStats::record_choice`]).
    decisions,
    /// Decisions where the profile showed a path clearly cheaper than the default.
    chose_by_profile,
    /// Decisions for the default because the profile measured it cheapest at that size.
    chose_default_cheapest,
    /// Decisions for the default because there was no profile (or no baseline in it).
    chose_default_no_profile,
    /// Decisions for the default because the buffer was not page-aligned.
    chose_default_unaligned,
    /// Decisions for the default although another path's median was lower: the spreads
    /// overlapped, so the difference was not established.
    chose_default_overlap,
    /// Operations sent to the fallback because the wanted path was demoted.
    fallback_demoted,
    /// Demotions because receive calls kept mapping nothing.
    demotions_rx_unmapped,
    /// Retries of a demoted path after its back-off.
    retries,
    /// Re-promotions: a retry reported good.
    promotions,
    /// Re-demotions: a retry reported bad (the back-off doubles).
    redemotions,
    /// Run-time cost checks completed: a window on the wanted path, then one on copy,
    /// compared in the sending thread's CPU per byte (`cost`).
    cost_checks,
    /// Checks that found the wanted path costlier than copy: it was left for a back-off.
    cost_costlier,
    /// Operations sent to copy to measure it for a check.
    cost_sample_ops,
    /// Operations sent to copy because the wanted path was found costlier.
    fallback_costlier,
    /// Decisions for paths tried without a profile: a receiver with no profile measures its
    /// candidate receive paths (`uring`, `mmap`) and copy, interleaved, on the connection
    /// and keeps the cheapest candidate if it beats copy by the margin, then only while the
    /// run-time check finds it no dearer than copy (`trial`).
    chose_trial,
    /// Windows a receive trial measured and moved on from to its next arm
    /// (`trial::Step::Next`; with `trial_picks`, the windows measured).
    trial_next,
    /// Receive trials finished: every round measured, and copy or a candidate kept.
    trial_picks,
    /// Trials that kept copy: no candidate's median was cheaper than copy's by the margin.
    trial_kept_copy,
    /// Trials that kept `uring`.
    trial_picked_uring,
    /// Trials that kept `mmap`.
    trial_picked_mmap,
    /// Receivers whose trial and check read their sender's CPU clock with their own: the
    /// sender is zcnet's, on this host, and left its card (`peer`).
    peer_clock,
    /// Trial candidates not measured because an earlier trial in this process dropped them
    /// on the same route and sender op size (`memory`).
    trial_skipped_remembered,
    /// Finished trials that measured `uring` against copy in at least one round.
    trial_rated_uring,
    /// The sum over those trials of `uring`'s verdict — the median of its per-round cost
    /// over copy's — in thousandths: divided by `trial_rated_uring`, what the trials saw
    /// (1000 = level with copy). Why a trial picked what it did, so a pick can be checked
    /// against what the whole transfer then cost.
    trial_ratio_uring_permille,
    /// Finished trials that measured `mmap` against copy in at least one round.
    trial_rated_mmap,
    /// As `trial_ratio_uring_permille`, for `mmap`.
    trial_ratio_mmap_permille,
    /// Receivers that ran no trial: two trials or more had measured the same route and
    /// sender op size in this process, and the path their pooled rounds found cheapest was
    /// taken at once (`memory::Memory::verdict`; at most three connections per trial).
    trial_skipped_verdict,
});

impl AutoStats {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &AutoStats) {
        let mut a = self.to_array();
        for (x, y) in a.iter_mut().zip(other.to_array()) {
            *x += y;
        }
        *self = Self::from_array(a);
    }

    /// The counters this delta touched (indices of [`AutoStats::to_array`]), for
    /// [`Stats::count_auto_tx`](crate::stats::Stats) where each was touched once.
    pub(crate) fn touched(&self) -> Vec<usize> {
        self.to_array()
            .iter()
            .enumerate()
            .filter(|(_, v)| **v > 0)
            .map(|(i, _)| i)
            .collect()
    }

    /// Counts one decision of the [`Chooser`] with its reason.
    pub fn record_choice<P>(&mut self, choice: &Choice<P>) {
        self.decisions += 1;
        let counter = match choice.reason {
            ChoiceReason::Profile => &mut self.chose_by_profile,
            ChoiceReason::DefaultCheapest => &mut self.chose_default_cheapest,
            ChoiceReason::NoProfile => &mut self.chose_default_no_profile,
            ChoiceReason::Unaligned => &mut self.chose_default_unaligned,
            ChoiceReason::SpreadOverlap => &mut self.chose_default_overlap,
        };
        *counter += 1;
    }

    /// Counts a finished receive trial's verdicts (`trial::Trial::ratios`): each
    /// candidate's median cost over copy's, in thousandths, where it was measured.
    pub fn rate_trial(&mut self, ratios: &[(RxPath, Option<f64>)]) {
        for &(path, ratio) in ratios {
            let Some(r) = ratio.filter(|r| r.is_finite() && *r >= 0.0) else {
                continue;
            };
            let permille = (r * 1000.0).round() as u64;
            match path {
                RxPath::Uring => {
                    self.trial_rated_uring += 1;
                    self.trial_ratio_uring_permille += permille;
                }
                RxPath::Mmap => {
                    self.trial_rated_mmap += 1;
                    self.trial_ratio_mmap_permille += permille;
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::AutoStats;

    #[test]
    fn counters_round_trip_through_arrays_and_add_fieldwise() {
        let a: [u64; AutoStats::LEN] = std::array::from_fn(|i| i as u64 + 1);
        let s = AutoStats::from_array(a);
        assert_eq!(s.to_array(), a);
        assert_eq!(
            (s.decisions, s.trial_skipped_verdict),
            (1, AutoStats::LEN as u64)
        );
        let mut t = s;
        t.add(&s);
        assert_eq!(t.to_array(), a.map(|v| 2 * v));
    }

    #[test]
    fn a_trials_verdicts_are_counted_per_candidate_in_thousandths() {
        use crate::path::RxPath;
        let mut s = AutoStats::default();
        s.rate_trial(&[(RxPath::Uring, Some(1.2345)), (RxPath::Mmap, None)]);
        s.rate_trial(&[(RxPath::Uring, Some(0.9)), (RxPath::Mmap, Some(0.8766))]);
        assert_eq!(
            (s.trial_rated_uring, s.trial_ratio_uring_permille),
            (2, 1235 + 900)
        );
        assert_eq!((s.trial_rated_mmap, s.trial_ratio_mmap_permille), (1, 877));
    }
}
