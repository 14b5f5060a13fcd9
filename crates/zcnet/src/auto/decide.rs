//! `auto`'s deciders: one small state machine per direction behind one trait ([`Decide`]),
//! in the quinn-proto manner — fed each operation's size and bytes and, while a cost window
//! is measured, the caller's clock; it answers the path of the next operation. No socket, no
//! file, no clock of its own: `tx::auto` and `rx::auto` only switch paths by its answers,
//! and every rule here is tested without them.
//!
//! Transmit ([`Decider`], one per kind of operation): the profile's choice by size and
//! alignment ([`Chooser`]), then the connection's own run-time check against copy
//! ([`CostCheck`]), which only ever sends an operation to copy. Receive ([`RxDecider`], one
//! per connection): the path chosen at `listen`, or without a profile the trial of
//! candidates against copy ([`Trial`]), then the same check. The kernel's evidence is not weighed here but obeyed below
//! it, whatever a profile says: a transmit sub-path whose completions come back `COPIED`
//! demotes itself ([`crate::policy::CopiedDemotion`], the one COPIED demotion), and the
//! mapping receiver that maps nothing demotes itself to `recv` (`rx::mmap`).

use super::choose::{Choice, ChoiceReason, Chooser};
use super::cost::{CostCheck, Pick};
use super::memory::{Key, Memory};
use super::trial::{Step, Trial};
use super::{AutoPath, AutoStats};
use crate::path::RxPath;
use std::time::Instant;

/// One direction's decider: the path for each operation, and what the operation cost.
pub(crate) trait Decide {
    /// The paths it chooses among ([`crate::TxPath`] or [`crate::RxPath`]).
    type Path: AutoPath;

    /// The path for the next operation of `len` bytes (`aligned`: its buffer starts on a
    /// page); `clock` (the thread's CPU time, ns) is read only when a cost window starts.
    /// Every decision and diversion is counted in `delta`.
    fn next(
        &mut self,
        len: u64,
        aligned: bool,
        clock: &dyn Fn() -> u64,
        delta: &mut AutoStats,
    ) -> Self::Path;

    /// The operation `next` picked moved `len` bytes; `clock` is read only when a window ends.
    fn done(&mut self, len: u64, clock: &dyn Fn() -> u64, delta: &mut AutoStats);
}

/// Counts one picked operation's diversion to copy by the cost check; returns its path.
pub(crate) fn follow<P: AutoPath>(pick: Pick<P>, delta: &mut AutoStats) -> P {
    match pick {
        Pick::Wanted(p) => p,
        Pick::CopySample(_) => {
            delta.cost_sample_ops += 1;
            P::DEFAULT
        }
        Pick::Costlier(_) => {
            delta.fallback_costlier += 1;
            P::DEFAULT
        }
    }
}

/// Counts a finished comparison of the cost check.
pub(crate) fn counted<P>(verdict: Option<super::cost::Verdict<P>>, delta: &mut AutoStats) {
    if let Some(v) = verdict {
        delta.cost_checks += 1;
        delta.cost_costlier += u64::from(v.costlier);
    }
}

/// The decider of one kind of transmit operation (loans, or `send_slice`'s copies).
#[derive(Debug, Clone)]
pub(crate) struct Decider<P> {
    chooser: Chooser<P>,
    /// Where the profile cannot tell copy from a cheaper-looking path (`SpreadOverlap`),
    /// take that path and let the cost check decide, rather than keep copy blind.
    lean: bool,
    /// The last decision, keyed by (size, aligned): a stream repeats its size, and
    /// interpolating the curves on every 4 KiB send would cost a share of the send itself.
    memo: Option<((u64, bool), Choice<P>)>,
    cost: CostCheck<P>,
}

impl<P: AutoPath> Decider<P> {
    /// Over `chooser`'s paths; `lean`: see the field.
    pub(crate) fn new(chooser: Chooser<P>, lean: bool) -> Self {
        Decider {
            chooser,
            lean,
            memo: None,
            cost: CostCheck::new(P::DEFAULT),
        }
    }

    /// Whether this decider may ever answer `path` (so the caller sets up only those).
    pub(crate) fn may_want(&self, path: P) -> bool {
        if self.lean {
            self.chooser.may_want(path)
        } else {
            self.chooser.can_choose(path)
        }
    }

    /// The profile's choice for (`len`, `aligned`), memoised.
    pub(crate) fn choice(&mut self, len: u64, aligned: bool) -> Choice<P> {
        let key = (len, aligned);
        if let Some((k, c)) = self.memo {
            if k == key {
                return c;
            }
        }
        let mut c = self.chooser.choose(len, aligned);
        // Over veth at 16K `tune` kept copy so while `uring → copy` read 13 % cheaper: the
        // loan path goes first and the cost check decides, as the receive side's trial does.
        if c.reason == ChoiceReason::SpreadOverlap && self.lean {
            if let Some(p) = self.chooser.cheapest_median(len) {
                c.path = p;
            }
        }
        self.memo = Some((key, c));
        c
    }
}

impl<P: AutoPath> Decide for Decider<P> {
    type Path = P;

    fn next(&mut self, len: u64, aligned: bool, clock: &dyn Fn() -> u64, d: &mut AutoStats) -> P {
        let choice = self.choice(len, aligned);
        d.record_choice(&choice);
        follow(self.cost.pick(choice.path, clock), d)
    }

    fn done(&mut self, len: u64, clock: &dyn Fn() -> u64, d: &mut AutoStats) {
        counted(self.cost.after(len, clock), d);
    }
}

// ---- receive ----

/// What a receiver without a profile tries, in this order, each against copy on the
/// connection ([`crate::auto::trial`]): `uring` (multishot `recv` into provided buffers:
/// still a copy, one syscall for many reads) and `mmap` (`TCP_ZEROCOPY_RECEIVE`, whose
/// receive loop costs less than `recv`'s on some routes even where it maps nothing).
pub(crate) const TRIAL: [RxPath; 2] = [RxPath::Uring, RxPath::Mmap];
/// Rounds of a trial: each measures one window of copy and of each candidate. Four, so a
/// candidate's median survives one disturbed round either way; with two candidates and
/// the default window (16 MiB, a quarter more to settle each) 240 MiB.
pub(crate) const TRIAL_ROUNDS: usize = 4;
/// Dearer verdicts in a row before the check leaves a trial's pick: one more than for a
/// profile's choice ([`crate::auto::cost::CONFIRM`]), as the pick already beat copy by the
/// margin in the median of [`TRIAL_ROUNDS`] paired windows — one or two dear windows are
/// weaker evidence than that.
const TRIAL_PICK_CONFIRM: u32 = 3;

/// The receive decider: the trial of candidates (without a profile) while it lasts, then the
/// cost check of the wanted path against copy. `rx::auto` sets it up from the connection's
/// choice and switches receivers by its answers.
pub(crate) struct RxDecider {
    pub(crate) check: CostCheck<RxPath>,
    pub(crate) trial: Option<Trial<RxPath>>,
    /// A trial waiting for the receiver to look for its sender's card (after the first
    /// bytes; copy until then): its candidates. It then starts without those this process
    /// remembers as clear losers on that route and sender op size
    /// ([`crate::auto::memory`]).
    pub(crate) pending: Option<Vec<RxPath>>,
    /// Where the trial's clear losers are remembered (a zcnet sender's card was found).
    pub(crate) key: Option<Key>,
    /// The process's memory of clear losers, unless turned off.
    pub(crate) memory: Option<&'static Memory>,
    /// The path the choice wants (with a trial: its pick, once made).
    pub(crate) wanted: RxPath,
    pub(crate) window: u64,
    /// The wall clock the memory's entries age by: the caller's (`Instant::now`; tests
    /// script it).
    pub(crate) wall: fn() -> Instant,
    /// The operation `next` picked was kept on copy because the wanted path was found
    /// costlier (counted by `done` once it moved bytes).
    pub(crate) costlier: bool,
}

/// The run-time check of the wanted path against copy in windows of `window` bytes, which
/// finds it costlier only beyond `margin` (the cost module's margin, a trial's favoured
/// pick's tolerance — [`Trial::margin_for`] — or a pairs table's choice's,
/// `auto::rx_choice::AutoRxChoice::check_margin`).
pub(crate) fn cost_check_within(window: u64, margin: f64) -> CostCheck<RxPath> {
    use crate::auto::cost::{BACKOFF_WINDOWS, CONFIRM, MAX_GAP_WINDOWS};
    use crate::auto::cost::{MAX_RECHECK_WINDOWS, RECHECK_WINDOWS};
    CostCheck::with(
        RxPath::Copy,
        window,
        margin,
        (RECHECK_WINDOWS, MAX_RECHECK_WINDOWS),
        (BACKOFF_WINDOWS, MAX_GAP_WINDOWS),
    )
    .confirm(CONFIRM)
}

/// The run-time check of a path a trial measured against copy in every round (its pick, or
/// the verdict of the trials before, [`RxDecider::start_trial`]), by `margin`: it goes on as
/// after that many good verdicts (its first look 64 windows on), and leaving the path takes
/// more dear verdicts in a row ([`TRIAL_PICK_CONFIRM`]) than leaving a profile's choice.
fn pick_check(window: u64, margin: f64) -> CostCheck<RxPath> {
    cost_check_within(window, margin)
        .confirm(TRIAL_PICK_CONFIRM)
        .as_if_good(TRIAL_ROUNDS as u32)
}

impl RxDecider {
    /// Starts the pending trial, without the candidates remembered as clear losers on `key`
    /// (counted); with none left, copy is kept at once. Where the trials before on `key`
    /// reached a verdict ([`crate::auto::memory::Memory::verdict`]), no trial: that path
    /// is taken at once (counted), under the run-time check.
    pub(crate) fn start_trial(&mut self, key: Option<Key>, delta: &mut AutoStats) {
        let Some(candidates) = self.pending.take() else {
            return;
        };
        self.key = key;
        if let Some(p) = key.zip(self.memory).and_then(|(k, m)| {
            m.verdict(
                k,
                &candidates,
                crate::auto::memory::POOL_MARGIN,
                (self.wall)(),
            )
        }) {
            // The trials before this connection on the route found `p` cheapest, pooled:
            // taken without one, and judged as a trial's pick would be — the check's first
            // look as far off (each look runs two windows on copy), leaving it as hard. A
            // verdict gone stale costs at most that gap: the next trial is never more than
            // `REUSES` connections away.
            delta.trial_skipped_verdict += 1;
            self.wanted = p;
            self.check = pick_check(self.window, crate::auto::cost::MARGIN);
            return;
        }
        let skip = match (key, self.memory) {
            (Some(k), Some(m)) => m.losers(k, (self.wall)()),
            _ => Vec::new(),
        };
        let here: Vec<RxPath> = candidates
            .iter()
            .copied()
            .filter(|p| !skip.contains(p))
            .collect();
        delta.trial_skipped_remembered += (candidates.len() - here.len()) as u64;
        let t = Trial::new(&here, TRIAL_ROUNDS, self.window, crate::auto::cost::MARGIN);
        if let Some(p) = t.picked() {
            // Nothing left to measure: the verdict is copy's, as after a trial.
            delta.trial_picks += 1;
            delta.trial_kept_copy += 1;
            self.wanted = p;
        }
        self.trial = Some(t);
    }

    /// Whether `path` can no longer be wanted: no trial to come or under way, and the
    /// choice (the cost check moves only between it and copy) is another path.
    pub(crate) fn settled_without(&self, path: RxPath) -> bool {
        self.pending.is_none()
            && self.trial.as_ref().is_none_or(|t| t.picked().is_some())
            && self.wanted != path
    }

    /// The trial, while it lasts.
    fn trying(&mut self) -> Option<&mut Trial<RxPath>> {
        self.trial.as_mut().filter(|t| t.picked().is_none())
    }

    /// Where the next operation goes: the trial's arm while it lasts, else the cost check's
    /// route for the wanted path. `clock` is read only when a window starts.
    fn pick(&mut self, clock: &dyn Fn() -> u64) -> Pick<RxPath> {
        if self.pending.is_some() {
            return Pick::Wanted(RxPath::Copy);
        }
        if let Some(t) = self.trying() {
            return Pick::Wanted(t.route(clock));
        }
        self.check.pick(self.wanted, clock)
    }
}

impl Decide for RxDecider {
    type Path = RxPath;

    /// The receive path is fixed per connection, so `len` and `aligned` do not matter.
    fn next(&mut self, _: u64, _: bool, clock: &dyn Fn() -> u64, d: &mut AutoStats) -> RxPath {
        match self.pick(clock) {
            Pick::Wanted(p) => p,
            Pick::CopySample(_) => {
                d.cost_sample_ops += 1;
                RxPath::Copy
            }
            Pick::Costlier(_) => {
                self.costlier = true;
                RxPath::Copy
            }
        }
    }

    fn done(&mut self, n: u64, clock: &dyn Fn() -> u64, delta: &mut AutoStats) {
        let (key, memory, wall) = (self.key, self.memory, self.wall);
        if self.pending.is_some() {
            // Copy, unmeasured, until the trial starts.
        } else if let Some(t) = self.trying() {
            match t.after(n, clock) {
                Step::Stay => {}
                Step::Next(_) => delta.trial_next += 1,
                Step::Pick(p) => {
                    let margin = t.margin_for(p);
                    if let (Some(k), Some(m)) = (key, memory) {
                        let now = wall();
                        m.remember(k, t.candidates(), &t.dropped(), now);
                        m.remember_rounds(k, &t.rounds(), now);
                    }
                    delta.trial_picks += 1;
                    delta.rate_trial(&t.ratios());
                    match p {
                        RxPath::Uring => delta.trial_picked_uring += 1,
                        RxPath::Mmap => delta.trial_picked_mmap += 1,
                        _ => delta.trial_kept_copy += 1,
                    }
                    self.wanted = p;
                    // A favoured pick is judged by the tolerance the trial kept it by:
                    // with the margin alone the check undid it — over veth at 256K, picked
                    // in 7 of 7 runs, it was left for copy in 2 (about 250 MiB each) on the
                    // receiver's clock alone.
                    self.check = pick_check(self.window, margin);
                }
            }
        } else {
            counted(self.check.after(n, clock), delta);
        }
        if std::mem::take(&mut self.costlier) && n > 0 {
            delta.fallback_costlier += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::path::TxPath;
    use crate::profile::{Measurement, Spread};
    use std::cell::Cell;

    fn row(path: TxPath, median: f64) -> Measurement<TxPath> {
        Measurement {
            path,
            size: 65536,
            touch: false,
            cpu_s_per_gib: Spread {
                median,
                lo: median * 0.95,
                hi: median * 1.05,
            },
            zc_fraction: Some(0.0),
        }
    }

    #[test]
    fn follows_the_profile_and_the_check_sends_a_dearer_path_back_to_copy() {
        // The profile says zerocopy costs a tenth of copy; on this "connection" it costs
        // twice copy: the decider starts on it and the check leaves it, every diversion
        // counted.
        let chooser = Chooser::from_measurements(
            &[row(TxPath::Copy, 1.0), row(TxPath::Zerocopy, 0.1)],
            false,
        );
        let mut d = Decider::new(chooser, true);
        assert!(d.may_want(TxPath::Zerocopy) && !d.may_want(TxPath::Uring));
        let t = Cell::new(0u64);
        let mut s = AutoStats::default();
        let mut paths = Vec::new();
        let op = 1 << 20;
        for _ in 0..400 {
            let p = d.next(op, true, &|| t.get(), &mut s);
            paths.push(p);
            t.set(t.get() + if p == TxPath::Zerocopy { 2 * op } else { op });
            d.done(op, &|| t.get(), &mut s);
        }
        assert_eq!(paths[0], TxPath::Zerocopy);
        assert_eq!((s.decisions, s.chose_by_profile), (400, 400), "{s:?}");
        assert!(s.cost_costlier >= 1 && s.fallback_costlier > 0, "{s:?}");
        assert_eq!(*paths.last().unwrap(), TxPath::Copy);
        let on_copy = paths.iter().filter(|p| **p == TxPath::Copy).count() as u64;
        assert_eq!(on_copy, s.fallback_costlier + s.cost_sample_ops, "{s:?}");
    }

    #[test]
    fn without_a_profile_every_answer_is_copy_and_the_clock_is_never_read() {
        let mut d = Decider::<TxPath>::new(Chooser::defaults(), true);
        let mut s = AutoStats::default();
        let clock = || -> u64 { panic!("copy is never measured") };
        for len in [1u64, 4096, 1 << 20] {
            assert_eq!(d.next(len, len > 1, &clock, &mut s), TxPath::Copy);
            d.done(len, &clock, &mut s);
        }
        assert_eq!((s.decisions, s.chose_default_no_profile), (3, 3), "{s:?}");
    }

    const WINDOW: u64 = 1 << 20;
    const OP: u64 = 64 * 1024;

    /// A judge of a trial of `uring` and `mmap`, as [`AutoRx::new`] makes it.
    fn judge() -> RxDecider {
        RxDecider {
            check: cost_check_within(WINDOW, crate::auto::cost::MARGIN),
            trial: Some(Trial::new(
                &TRIAL,
                TRIAL_ROUNDS,
                WINDOW,
                crate::auto::cost::MARGIN,
            )),
            pending: None,
            key: None,
            memory: None,
            wanted: RxPath::Copy,
            window: WINDOW,
            wall: Instant::now,
            costlier: false,
        }
    }

    /// Drives `judge` over `bytes` in 64 KiB operations on a scripted clock: an operation
    /// on `path` starting at byte `at` costs `cost(path, at)` ns per byte. Returns the
    /// path each operation read with, and the counters.
    fn drive(
        judge: &mut RxDecider,
        bytes: u64,
        cost: impl Fn(RxPath, u64) -> u64,
    ) -> (Vec<RxPath>, AutoStats) {
        let clock = Cell::new(0u64);
        let mut paths = Vec::new();
        let mut total = AutoStats::default();
        for i in 0..bytes / OP {
            let mut d = AutoStats::default();
            let path = judge.next(OP, true, &|| clock.get(), &mut d);
            paths.push(path);
            clock.set(clock.get() + cost(path, i * OP) * OP);
            judge.done(OP, &|| clock.get(), &mut d);
            total.add(&d);
        }
        (paths, total)
    }

    /// The trial's bytes with the default rounds: three arms, each a window and a quarter
    /// per round.
    const TRIAL_BYTES: u64 = TRIAL_ROUNDS as u64 * 3 * (WINDOW + WINDOW / 4);

    #[test]
    fn the_trial_interleaves_copy_and_both_candidates_and_picks_within_its_bound() {
        // mmap 20 % under copy, uring level with it: mmap kept, counted.
        let mut j = judge();
        let cost = |p: RxPath, _| match p {
            RxPath::Mmap => 4,
            _ => 5,
        };
        let (paths, a) = drive(&mut j, TRIAL_BYTES, cost);
        assert_eq!(
            (a.trial_next, a.trial_picks, a.trial_picked_mmap),
            (11, 1, 1),
            "{a:?}"
        );
        assert_eq!((a.trial_kept_copy, a.trial_picked_uring), (0, 0), "{a:?}");
        // What it saw, counted with the pick: mmap at 4/5 of copy, uring level.
        assert_eq!(
            (a.trial_rated_mmap, a.trial_ratio_mmap_permille),
            (1, 800),
            "{a:?}"
        );
        assert_eq!(
            (a.trial_rated_uring, a.trial_ratio_uring_permille),
            (1, 1000),
            "{a:?}"
        );
        assert_eq!(a.cost_checks, 0, "the trial is not the cost check: {a:?}");
        // 12 stretches of 20 operations (4 settling, 16 measured), every arm in every
        // round, beginning with the first candidate.
        let runs: Vec<RxPath> = paths.chunks(20).map(|c| c[0]).collect();
        assert!(paths.chunks(20).all(|c| c.iter().all(|p| *p == c[0])));
        assert_eq!(runs[0], RxPath::Uring);
        for round in runs.chunks(3) {
            for arm in [RxPath::Copy, RxPath::Uring, RxPath::Mmap] {
                assert!(round.contains(&arm), "{runs:?}");
            }
        }
        // Then mmap, trusted as after four good verdicts (the gap 8, 16, 32, 64 windows)
        // before it is measured.
        let (paths, a) = drive(&mut j, 64 * WINDOW, cost);
        assert!(paths.iter().all(|p| *p == RxPath::Mmap), "{paths:?}");
        assert_eq!(a.cost_checks, 0, "{a:?}");
    }

    #[test]
    fn candidates_level_with_copy_leave_copy_and_nothing_is_checked_after() {
        let mut j = judge();
        // Both candidates 3 % under copy: within the margin.
        let (_, a) = drive(&mut j, TRIAL_BYTES, |p, _| match p {
            RxPath::Copy => 100,
            _ => 97,
        });
        assert_eq!((a.trial_picks, a.trial_kept_copy), (1, 1), "{a:?}");
        let (paths, a) = drive(&mut j, 64 * WINDOW, |_, _| 1);
        assert!(paths.iter().all(|p| *p == RxPath::Copy));
        assert_eq!((a.cost_checks, a.cost_sample_ops), (0, 0), "{a:?}");
    }

    /// A judge whose trial tries `mmap` alone, favoured with a pair that saved `saving`.
    fn judge_favouring_mmap(saving: f64) -> RxDecider {
        RxDecider {
            check: cost_check_within(WINDOW, crate::auto::cost::MARGIN),
            trial: Some(
                Trial::new(
                    &[RxPath::Mmap],
                    TRIAL_ROUNDS,
                    WINDOW,
                    crate::auto::cost::MARGIN,
                )
                .favouring(RxPath::Mmap, saving),
            ),
            pending: None,
            key: None,
            memory: None,
            wanted: RxPath::Mmap,
            window: WINDOW,
            wall: Instant::now,
            costlier: false,
        }
    }

    #[test]
    fn a_favoured_pick_is_checked_by_the_tolerance_it_was_kept_by() {
        const TRIAL_OF_ONE: u64 = TRIAL_ROUNDS as u64 * 2 * (WINDOW + WINDOW / 4);
        // The pair saved 30 %; on the receiver's clock mmap is 10 % dearer than copy:
        // picked, and the checks after keep it (no costlier verdict, nothing on copy but
        // their copy samples).
        let dear = |p: RxPath, _| if p == RxPath::Mmap { 11 } else { 10 };
        let mut j = judge_favouring_mmap(0.3);
        let (_, a) = drive(&mut j, TRIAL_OF_ONE, dear);
        assert_eq!(a.trial_picked_mmap, 1, "{a:?}");
        let (paths, a) = drive(&mut j, 400 * WINDOW, dear);
        assert!(a.cost_checks >= 2, "{a:?}");
        assert_eq!((a.cost_costlier, a.fallback_costlier), (0, 0), "{a:?}");
        let on_mmap = paths.iter().filter(|p| **p == RxPath::Mmap).count();
        assert!(
            on_mmap * 10 > paths.len() * 9,
            "{on_mmap} of {}",
            paths.len()
        );
        // Dearer than the tolerance after the pick (a change on the connection): left.
        let mut j = judge_favouring_mmap(0.3);
        drive(&mut j, TRIAL_OF_ONE, dear);
        let (paths, a) = drive(&mut j, 400 * WINDOW, |p, _| {
            if p == RxPath::Mmap {
                15
            } else {
                10
            }
        });
        assert!(a.cost_costlier >= 1 && a.fallback_costlier > 0, "{a:?}");
        assert_eq!(*paths.last().unwrap(), RxPath::Copy);
    }

    /// A judge whose trial of `uring` and `mmap` waits for the sender's card (no profile,
    /// a zcnet sender expected), with `memory` for its clear losers.
    fn pending_judge(memory: &'static crate::auto::memory::Memory) -> RxDecider {
        RxDecider {
            check: cost_check_within(WINDOW, crate::auto::cost::MARGIN),
            trial: None,
            pending: Some(TRIAL.to_vec()),
            key: None,
            memory: Some(memory),
            wanted: RxPath::Copy,
            window: WINDOW,
            wall: Instant::now,
            costlier: false,
        }
    }

    #[test]
    fn a_trials_clear_loser_is_not_measured_again_on_its_route_and_size() {
        use crate::auto::memory::{Key, Memory};
        use std::time::Instant;
        let memory: &'static Memory = Box::leak(Box::default());
        let lo = |op: u64| Key::new([127, 0, 0, 1].into(), [127, 0, 0, 1].into(), op, 1);
        // Loopback at 16 KiB as measured: mmap 2.4× copy, uring level with it.
        let cost = |p: RxPath, _| if p == RxPath::Mmap { 24 } else { 10 };
        let windows = |paths: &[RxPath], arm| {
            paths
                .chunks(20)
                .filter(|c| c[0] == arm && c.iter().all(|p| *p == arm))
                .count()
        };
        // Copy, unmeasured, until the receiver has looked for the card.
        let mut j = pending_judge(memory);
        let (paths, a) = drive(&mut j, 3 * OP, cost);
        assert!(paths.iter().all(|p| *p == RxPath::Copy), "{paths:?}");
        assert_eq!(a.trial_next + a.trial_picks, 0, "{a:?}");
        let mut d = AutoStats::default();
        j.start_trial(Some(lo(16 << 10)), &mut d);
        assert_eq!(d.trial_skipped_remembered, 0);
        let (paths, a) = drive(&mut j, TRIAL_BYTES, cost);
        assert_eq!((a.trial_picks, a.trial_kept_copy), (1, 1), "{a:?}");
        assert_eq!(windows(&paths, RxPath::Mmap), 2, "dropped after two rounds");
        assert!(
            memory.losers(lo(16 << 10), Instant::now()).is_empty(),
            "one trial's drop is not enough"
        );

        // The next connection measures it again, drops it again: confirmed.
        let mut j = pending_judge(memory);
        let mut d = AutoStats::default();
        j.start_trial(Some(lo(16 << 10)), &mut d);
        assert_eq!(d.trial_skipped_remembered, 0);
        let (paths, _) = drive(&mut j, TRIAL_BYTES, cost);
        assert_eq!(windows(&paths, RxPath::Mmap), 2, "measured again");
        assert_eq!(
            memory.losers(lo(16 << 10), Instant::now()),
            vec![RxPath::Mmap]
        );

        // Both trials kept copy: the connections after take it without a trial.
        for _ in 0..crate::auto::memory::REUSES {
            let mut j = pending_judge(memory);
            let mut d = AutoStats::default();
            j.start_trial(Some(lo(16 << 10)), &mut d);
            assert_eq!(
                (d.trial_skipped_verdict, d.trial_skipped_remembered),
                (1, 0)
            );
        }

        // The next connection on the route that measures again, sender writing the same
        // size: mmap skipped.
        let mut j = pending_judge(memory);
        let mut d = AutoStats::default();
        j.start_trial(Some(lo(16 << 10)), &mut d);
        assert_eq!(d.trial_skipped_remembered, 1);
        let (paths, a) = drive(&mut j, TRIAL_BYTES, cost);
        assert!(!paths.contains(&RxPath::Mmap), "{paths:?}");
        assert_eq!(
            windows(&paths, RxPath::Uring),
            TRIAL_ROUNDS,
            "uring still measured"
        );
        assert_eq!((a.trial_picks, a.trial_kept_copy), (1, 1), "{a:?}");

        // Another op size, or no card (no key): every candidate measured.
        for key in [Some(lo(256 << 10)), None] {
            let mut j = pending_judge(memory);
            let mut d = AutoStats::default();
            j.start_trial(key, &mut d);
            assert_eq!(d.trial_skipped_remembered, 0, "{key:?}");
            let (paths, _) = drive(&mut j, TRIAL_BYTES, cost);
            assert_eq!(windows(&paths, RxPath::Mmap), 2, "{key:?}");
        }

        // Both candidates remembered (trials of uring alone, mmap skipped, dropping it):
        // copy is kept at once, counted as the trial's verdict. (A `uring` sender's key:
        // on the copy sender's, copy is now the verdict that the trials kept.)
        let lo_uring = Key::new([127, 0, 0, 1].into(), [127, 0, 0, 1].into(), 16 << 10, 3);
        for dropped in [&[RxPath::Mmap][..], &[RxPath::Uring]] {
            for _ in 0..crate::auto::memory::CONFIRM {
                memory.remember(lo_uring, dropped, dropped, Instant::now());
            }
        }
        let mut j = pending_judge(memory);
        let mut d = AutoStats::default();
        j.start_trial(Some(lo_uring), &mut d);
        assert_eq!(
            (d.trial_skipped_remembered, d.trial_picks, d.trial_kept_copy),
            (2, 1, 1)
        );
        let (paths, a) = drive(&mut j, 4 * WINDOW, cost);
        assert!(paths.iter().all(|p| *p == RxPath::Copy));
        assert_eq!(a.trial_next + a.trial_picks, 0, "{a:?}");
    }

    #[test]
    fn the_verdict_of_the_trials_before_is_taken_without_a_trial_and_still_checked() {
        use crate::auto::memory::{Key, Memory, CONFIRM, REUSES};
        let memory: &'static Memory = Box::leak(Box::default());
        let veth = Key::new([10, 0, 0, 1].into(), [10, 0, 0, 2].into(), 16 << 10, 1);
        // mmap 20 % under copy, uring level with it.
        let cost = |p: RxPath, _| if p == RxPath::Mmap { 8 } else { 10 };
        let connection = |cost: &dyn Fn(RxPath, u64) -> u64, bytes| {
            let mut j = pending_judge(memory);
            let mut d = AutoStats::default();
            j.start_trial(Some(veth), &mut d);
            let (paths, a) = drive(&mut j, bytes, cost);
            (d.trial_skipped_verdict, paths, a)
        };
        // Trials until the key has a verdict, each measuring every arm.
        for i in 0..CONFIRM {
            let (skipped, paths, a) = connection(&cost, TRIAL_BYTES);
            assert_eq!((skipped, a.trial_picked_mmap), (0, 1), "trial {i}: {a:?}");
            assert!(paths.contains(&RxPath::Uring), "trial {i}");
        }
        // Then REUSES connections take mmap from their first byte, with no trial.
        for i in 0..REUSES {
            let (skipped, paths, a) = connection(&cost, TRIAL_BYTES);
            assert_eq!(skipped, 1, "connection {i}");
            assert_eq!(a.trial_next + a.trial_picks, 0, "no trial: {a:?}");
            assert_eq!(paths[0], RxPath::Mmap);
            assert!(!paths.contains(&RxPath::Uring), "connection {i}");
            let mmap = paths.iter().filter(|p| **p == RxPath::Mmap).count();
            assert!(
                mmap * 10 >= paths.len() * 9,
                "mostly mmap: {mmap}/{}",
                paths.len()
            );
        }
        // The next connection measures again (and keeps mmap again).
        let (skipped, _, a) = connection(&cost, TRIAL_BYTES);
        assert_eq!((skipped, a.trial_picked_mmap), (0, 1), "{a:?}");
        // A connection that takes it where mmap has turned dear leaves it for copy: the
        // check holds for a remembered verdict as for a trial's pick.
        let dear = |p: RxPath, _| if p == RxPath::Mmap { 20 } else { 10 };
        let (skipped, paths, a) = connection(&dear, 128 * WINDOW);
        assert_eq!(skipped, 1);
        assert!(a.cost_costlier >= 1 && a.fallback_costlier > 0, "{a:?}");
        assert_eq!(*paths.last().unwrap(), RxPath::Copy);
    }

    #[test]
    fn a_receiver_is_let_go_only_once_it_can_no_longer_be_wanted() {
        let memory: &'static crate::auto::memory::Memory = Box::leak(Box::default());
        // Waiting for the card, or trying: every candidate may still be wanted.
        let j = pending_judge(memory);
        assert!(!j.settled_without(RxPath::Mmap) && !j.settled_without(RxPath::Uring));
        let mut j = judge();
        let (_, _) = drive(&mut j, 3 * WINDOW, |_, _| 10);
        assert!(!j.settled_without(RxPath::Mmap), "mid-trial");
        // Picked uring: mmap can go, uring (the pick, checked against copy) stays.
        let j = judge_that_kept_uring();
        assert!(j.settled_without(RxPath::Mmap));
        assert!(!j.settled_without(RxPath::Uring));
    }

    fn judge_that_kept_uring() -> RxDecider {
        let mut j = judge();
        let (_, a) = drive(&mut j, TRIAL_BYTES, |p, _| match p {
            RxPath::Uring => 7,
            _ => 10,
        });
        assert_eq!(a.trial_picked_uring, 1, "{a:?}");
        j
    }

    #[test]
    fn a_trial_pick_survives_two_dear_windows_and_is_left_after_three() {
        let mut j = judge_that_kept_uring();
        // Past the first gap, two checks find uring's window dear (a load spike on it):
        // the third finds it cheap again, and it is kept.
        let gap = 64 * WINDOW;
        let spike = |p: RxPath, at: u64| match p {
            RxPath::Uring if at >= gap && at < gap + 6 * WINDOW => 20,
            RxPath::Uring => 7,
            _ => 10,
        };
        let (_, a) = drive(&mut j, gap + 9 * WINDOW, spike);
        assert_eq!((a.cost_checks, a.cost_costlier), (3, 0), "{a:?}");
        assert_eq!(a.fallback_costlier, 0, "{a:?}");
        // Really dearer from now on: left after three dear verdicts in a row.
        let mut j2 = judge_that_kept_uring();
        let (paths, a) = drive(&mut j2, gap + 12 * WINDOW, |p, _| match p {
            RxPath::Uring => 20,
            _ => 10,
        });
        assert_eq!((a.cost_checks, a.cost_costlier), (3, 1), "{a:?}");
        assert!(a.fallback_costlier > 0, "{a:?}");
        assert_eq!(*paths.last().unwrap(), RxPath::Copy);
    }
}
