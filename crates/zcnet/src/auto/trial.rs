//! Which receive path a connection without a profile keeps: copy and each candidate measured
//! in turn, window after window, interleaved, on the connection itself; a candidate replaces
//! copy only if the median of its paired comparisons is cheaper by a margin.
//!
//! Why: without a profile nothing measured says which receive path pays on this route, and
//! the answer differs by route and by sitting (over veth at 16 KiB the mapping receiver,
//! mapping nothing from a copying sender, has read 20 % under copy in one sitting and level
//! with it in another; on loopback `uring` was the one within noise of the best). So the
//! connection measures, in CPU time per byte: the receiving thread's, plus the sending
//! thread's where the sender is zcnet's on this host and said which thread it is
//! (`crate::peer_card`) — a receive path's saving can lie on the sender. The clock is the
//! caller's; this module only compares what it reads.
//!
//! How, and why this way: one window's thread clock on a shared machine is noisy (single
//! 1-second bench runs of the same pair spread ±11–43 %), and load comes and goes over a
//! few hundred milliseconds. A trial that measured candidate A's windows, then B's, then
//! decided on a mean, judged whatever the load did between them: in one sitting its picks
//! over veth changed run to run. Here every arm (copy, then the candidates) gets one window
//! per *round*, the arms' order rotating from round to round so no arm always follows the
//! same one or sits at the same end of a round; each round gives each candidate a *paired*
//! ratio — its cost over copy's in the same round, measured within a few tens of
//! milliseconds of each other — and a candidate's verdict is the *median* of its rounds'
//! ratios, so one disturbed window moves nothing. Copy is the incumbent: a candidate is
//! kept only if its median is cheaper than copy by [`Trial::new`]'s margin — a tie keeps
//! copy, which works everywhere. The cost is all that is judged: a mapping receiver that
//! maps nothing (every byte read as `unmappable`, as from a copying sender over veth) but
//! costs less is kept.
//!
//! One exception to "a tie keeps copy" ([`Trial::favouring`]): a candidate that a pairs
//! table — both ends measured together on this host — put in the cheapest pair by median,
//! though within its spread. The trial sees only the receiving thread's clock, and a
//! receive path's saving can lie on the *sender*: over veth at 16 KiB, a copy sender into
//! the mapping receiver cost 1.19 s/GiB against 1.44–1.54 into copy, the receivers level
//! (0.79–0.83), in four sittings running (`git show 758b630:docs/measurements/auto.md`). A trial that keeps
//! copy on a tie there throws away what the pairs measured. So the favoured candidate is
//! kept unless its median is dearer than copy by more than a tolerance, at least the
//! margin: the excess on the receiver's clock at which its pair would lose all it saved,
//! the table's pair saving restated in the receiver's own cost (`pair::rx_tolerance`,
//! from the ends' shares of each pair's cost: over veth at 16 KiB 37 % where the pair
//! saved 10 %, since the saving is the sender's). A profile without the shares gives the
//! share `f` of `copy → copy`'s cost the pair saved, which is that bound only where the
//! saving lies on the sender. A candidate cheaper than the favoured one by the margin
//! still wins, and the run-time check still leaves it if it turns dearer.
//!
//! Each window is preceded by a settling stretch of a quarter window on its arm, unmeasured:
//! the switch itself (a parked `uring` handing out what it had received, the mapping
//! receiver's held bytes) lands there, not in the window.
//!
//! A candidate dearer than copy by more than a quarter in each of the first two rounds
//! leaves the trial (`DROP_AFTER_ROUNDS`): two paired comparisons that far apart are a
//! verdict, and its later windows would each cost the connection that excess; with every
//! candidate gone, copy is kept at once. A favoured candidate is measured to the end.
//!
//! Pure: bytes and a caller-supplied clock in, the wanted path out. Bounded: `rounds` ×
//! arms × (window + settle) bytes, once per connection (`Trial::bytes_bound`); what it
//! did is counted by the caller.

use super::{median, AutoPath};

/// Share of a window each arm runs unmeasured after a switch, before its window (1/N).
const SETTLE_DIVISOR: u64 = 4;

/// Rounds after which a candidate dearer than copy in every one of them by more than
/// [`DROP_ABOVE`] leaves the trial: its later windows could only confirm what two paired
/// comparisons already say, and each costs the connection that excess. On loopback at
/// 16 KiB the mapping receiver ran 2.4× copy (it maps nothing from a copying sender), so
/// its four windows alone put a 1-second transfer about 5 % over `copy → copy`.
const DROP_AFTER_ROUNDS: usize = 2;
/// How much dearer than copy, in every round so far, drops a candidate (well past the
/// margin and past the spread of single windows, so noise does not drop a good one).
const DROP_ABOVE: f64 = 0.25;

/// What recorded bytes changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step<P> {
    /// Keep going on the current arm.
    Stay,
    /// A window was measured: this arm runs next.
    Next(P),
    /// Every round is measured: this path is kept (copy when no candidate beat it).
    Pick(P),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// The arm runs unmeasured after a switch; `bytes` so far.
    Settling { bytes: u64 },
    /// The arm's window: from thread clock `t0` (read at the first operation routed),
    /// `bytes` so far.
    Measuring { t0: Option<u64>, bytes: u64 },
}

/// One connection's trial of its candidate receive paths against copy (see the module
/// docs).
#[derive(Debug, Clone)]
pub(crate) struct Trial<P> {
    /// The incumbent ([`AutoPath::DEFAULT`], copy) first, then the candidates.
    arms: Vec<P>,
    rounds: usize,
    window: u64,
    settle: u64,
    margin: f64,
    /// Per arm, per round: ns per byte (`None` where the clock did not move).
    costs: Vec<Vec<Option<f64>>>,
    round: usize,
    /// Position within the round (the arm is `live[(round + slot + 1) % live.len()]`).
    slot: usize,
    /// Indexes of the arms still measured: copy and the candidates not dropped
    /// ([`DROP_AFTER_ROUNDS`]).
    live: Vec<usize>,
    phase: Phase,
    pick: Option<P>,
    /// A candidate kept on a tie with copy, and the ratio to copy up to which it is kept
    /// ([`Trial::favouring`]).
    favoured: Option<(P, f64)>,
}

impl<P: AutoPath> Trial<P> {
    /// Measures copy and `candidates` in `rounds` rounds (at least 1) of one `window` of
    /// bytes each; a candidate is kept if the median of its per-round cost over copy's is
    /// below `1 / (1 + margin)` — the run-time check's margin ([`super::cost::MARGIN`]) the
    /// other way round. Without candidates copy is kept at once.
    pub(crate) fn new(candidates: &[P], rounds: usize, window: u64, margin: f64) -> Self {
        let mut arms = vec![P::DEFAULT];
        for &c in candidates {
            if !arms.contains(&c) {
                arms.push(c);
            }
        }
        let window = window.max(1);
        let settle = window / SETTLE_DIVISOR;
        let rounds = rounds.max(1);
        Trial {
            pick: (arms.len() == 1).then_some(P::DEFAULT),
            costs: vec![vec![None; rounds]; arms.len()],
            live: (0..arms.len()).collect(),
            arms,
            rounds,
            window,
            settle,
            margin,
            round: 0,
            slot: 0,
            phase: Self::start_phase(settle),
            favoured: None,
        }
    }

    /// Keeps `path` (one of the candidates; ignored otherwise) unless the trial finds it
    /// dearer than copy by more than `saving` or the margin, whichever is larger, or another
    /// candidate cheaper than it by the margin: for the receive half of the cheapest pair a
    /// pairs table measured, `saving` being the share of `copy → copy`'s cost that pair
    /// saved there — an advantage the receiving thread's clock may not see (module docs).
    pub(crate) fn favouring(mut self, path: P, saving: f64) -> Self {
        if path != P::DEFAULT && self.arms.contains(&path) {
            let saving = if saving.is_finite() { saving } else { 0.0 };
            self.favoured = Some((path, 1.0 + saving.clamp(self.margin, 1.0)));
        }
        self
    }

    /// How much dearer than copy `path` may be and still be kept: its tolerance if it is
    /// the favoured candidate ([`Trial::favouring`]), else the margin — for the run-time
    /// check that follows the trial, so that it judges the pick as the trial did.
    pub(crate) fn margin_for(&self, path: P) -> f64 {
        match self.favoured {
            Some((f, within)) if f == path => within - 1.0,
            _ => self.margin,
        }
    }

    fn start_phase(settle: u64) -> Phase {
        if settle == 0 {
            Phase::Measuring { t0: None, bytes: 0 }
        } else {
            Phase::Settling { bytes: 0 }
        }
    }

    /// The most bytes the trial runs before its pick (the bound the module doc states; its
    /// tests check it).
    #[cfg(test)]
    pub(crate) fn bytes_bound(&self) -> u64 {
        (self.rounds * self.arms.len()) as u64 * (self.window + self.settle)
    }

    fn arm(&self) -> usize {
        // Round 0 starts on the first candidate, copy last: the connection begins on the
        // path the trial is about, as with a profile's choice.
        self.live[(self.round + self.slot + 1) % self.live.len()]
    }

    /// After a whole round: drops the candidates dearer than copy by more than
    /// [`DROP_ABOVE`] in each of at least [`DROP_AFTER_ROUNDS`] rounds and in no round less
    /// so (a favoured candidate is kept to the end: its tolerance is the point).
    fn drop_dear(&mut self) {
        if self.round < DROP_AFTER_ROUNDS {
            return;
        }
        let keep: Vec<usize> = self
            .live
            .iter()
            .copied()
            .filter(|&a| {
                if a == 0 || self.favoured.is_some_and(|(f, _)| f == self.arms[a]) {
                    return true;
                }
                let ratios = self.paired(a);
                ratios.len() < DROP_AFTER_ROUNDS || ratios.iter().any(|&r| r <= 1.0 + DROP_ABOVE)
            })
            .collect();
        self.live = keep;
    }

    /// Arm `a`'s cost over copy's in each round where both clocks moved (rounds not yet
    /// measured have no costs).
    fn paired(&self, a: usize) -> Vec<f64> {
        (0..self.rounds)
            .filter_map(|i| match (self.costs[a][i], self.costs[0][i]) {
                (Some(c), Some(copy)) if copy > 0.0 => Some(c / copy),
                _ => None,
            })
            .collect()
    }

    /// The path the connection should want now: the arm under measurement, or the pick.
    pub(crate) fn wanted(&self) -> P {
        self.pick.unwrap_or(self.arms[self.arm()])
    }

    /// The candidates this trial started with (copy, the incumbent, is not one).
    pub(crate) fn candidates(&self) -> &[P] {
        &self.arms[1..]
    }

    /// The candidates dropped as clear losers so far (`DROP_AFTER_ROUNDS`,
    /// `DROP_ABOVE`), in trial order.
    pub(crate) fn dropped(&self) -> Vec<P> {
        (1..self.arms.len())
            .filter(|a| !self.live.contains(a))
            .map(|a| self.arms[a])
            .collect()
    }

    /// The kept path, once the trial is over.
    pub(crate) fn picked(&self) -> Option<P> {
        self.pick
    }

    /// The path the next operation takes; `clock` (the thread's CPU time, ns) is read when
    /// a window starts.
    pub(crate) fn route(&mut self, clock: impl Fn() -> u64) -> P {
        if let Phase::Measuring { t0: t0 @ None, .. } = &mut self.phase {
            if self.pick.is_none() {
                *t0 = Some(clock());
            }
        }
        self.wanted()
    }

    /// Records an operation of `bytes` that `route` sent where it said.
    pub(crate) fn after(&mut self, bytes: u64, clock: impl Fn() -> u64) -> Step<P> {
        if self.pick.is_some() {
            return Step::Stay;
        }
        match &mut self.phase {
            Phase::Settling { bytes: b } => {
                *b += bytes;
                if *b >= self.settle {
                    self.phase = Phase::Measuring {
                        t0: Some(clock()),
                        bytes: 0,
                    };
                }
                Step::Stay
            }
            Phase::Measuring { t0, bytes: b } => {
                *b += bytes;
                if *b < self.window {
                    return Step::Stay;
                }
                let Some(t0) = *t0 else {
                    // Not routed through `route`: no start to measure from; measure anew.
                    self.phase = Phase::Measuring { t0: None, bytes: 0 };
                    return Step::Stay;
                };
                let ns = clock().saturating_sub(t0);
                let b = *b;
                let arm = self.arm();
                self.costs[arm][self.round] = (ns > 0).then(|| ns as f64 / b as f64);
                self.slot += 1;
                if self.slot == self.live.len() {
                    self.slot = 0;
                    self.round += 1;
                    self.drop_dear();
                }
                // Over after the last round, or once copy is the only arm left.
                if self.round == self.rounds || self.live.len() == 1 {
                    let p = self.decide();
                    self.pick = Some(p);
                    return Step::Pick(p);
                }
                self.phase = Self::start_phase(self.settle);
                Step::Next(self.wanted())
            }
        }
    }

    /// Per candidate (in trial order), the median over rounds of its cost over copy's in
    /// the same round; `None` for one with no round where both clocks moved.
    pub(crate) fn ratios(&self) -> Vec<(P, Option<f64>)> {
        (1..self.arms.len())
            .map(|a| (self.arms[a], median(&self.paired(a))))
            .collect()
    }

    /// Per candidate (in trial order), its cost over copy's in each round where both clocks
    /// moved: what [`Trial::ratios`] takes the median of, for a memory that pools the
    /// rounds of several trials (`auto::memory`).
    pub(crate) fn rounds(&self) -> Vec<(P, Vec<f64>)> {
        (1..self.arms.len())
            .map(|a| (self.arms[a], self.paired(a)))
            .collect()
    }

    /// The candidate with the lowest median ratio if it beats copy by the margin, else copy;
    /// ties go to the earlier candidate. With a favoured candidate
    /// ([`Trial::favouring`]) the bar is that one instead of copy, as long as it is not
    /// dearer than copy by more than its tolerance.
    fn decide(&self) -> P {
        let ratios = self.ratios();
        let best = cheapest(&ratios);
        let favoured = self.favoured.and_then(|(f, within)| {
            ratios
                .iter()
                .find(|(p, _)| *p == f)
                .and_then(|&(_, r)| r)
                .filter(|&r| r <= within)
                .map(|r| (f, r))
        });
        let bar = favoured.map_or(1.0, |(_, r)| r);
        match (best, favoured) {
            (Some((p, r)), _) if r * (1.0 + self.margin) < bar => p,
            (_, Some((f, _))) => f,
            _ => P::DEFAULT,
        }
    }
}

/// The candidate with the lowest ratio to copy among `ratios` (ties to the earlier one),
/// and that ratio; `None` where none was measured.
fn cheapest<P: Copy>(ratios: &[(P, Option<f64>)]) -> Option<(P, f64)> {
    ratios
        .iter()
        .filter_map(|&(p, r)| r.map(|r| (p, r)))
        .fold(None, |best, (p, r)| match best {
            Some((_, b)) if b <= r => best,
            _ => Some((p, r)),
        })
}

/// What a trial without a favoured candidate keeps, from each candidate's per-round ratios
/// to copy (pooled over several trials or not): the one with the lowest median if it beats
/// copy by `margin`, else copy — [`Trial`]'s own rule.
pub(crate) fn pick_from<P: AutoPath>(rounds: &[(P, Vec<f64>)], margin: f64) -> P {
    let ratios: Vec<(P, Option<f64>)> = rounds.iter().map(|(p, r)| (*p, median(r))).collect();
    match cheapest(&ratios) {
        Some((p, r)) if r * (1.0 + margin) < 1.0 => p,
        _ => P::DEFAULT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::path::RxPath;
    use std::cell::Cell;

    const W: u64 = 1000;
    /// Operations of `W / 20` bytes: 5 settle, 20 measure — 25 per arm, 75 per round.
    const OP: u64 = W / 20;
    const SLOT_OPS: usize = 25;
    const ROUND_OPS: usize = 75;

    /// Drives a trial of `uring` then `mmap` (4 rounds, windows of `W` bytes, margin 5 %) on
    /// a scripted clock: an operation on `path` in round `r` costs `cost(path, r)` ns per
    /// byte. Returns the pick, the arm each operation took, the steps and the trial.
    #[allow(clippy::type_complexity)]
    fn drive(
        cost: impl Fn(RxPath, usize) -> f64,
    ) -> (RxPath, Vec<RxPath>, Vec<Step<RxPath>>, Trial<RxPath>) {
        let mut t = Trial::new(&[RxPath::Uring, RxPath::Mmap], 4, W, 0.05);
        let clock = Cell::new(0u64);
        let (mut arms, mut steps) = (Vec::new(), Vec::new());
        for i in 0..10_000 {
            if let Some(p) = t.picked() {
                return (p, arms, steps, t);
            }
            let p = t.route(|| clock.get());
            arms.push(p);
            clock.set(clock.get() + (cost(p, i / ROUND_OPS) * OP as f64) as u64);
            match t.after(OP, || clock.get()) {
                Step::Stay => {}
                s => steps.push(s),
            }
        }
        panic!("no pick");
    }

    #[test]
    fn arms_interleave_with_a_rotating_order_and_the_trial_is_bounded() {
        let (_, arms, steps, t) = drive(|_, _| 1.0);
        // One window per arm per round, each after a quarter window of settling.
        assert_eq!(t.bytes_bound(), 4 * 3 * (W + W / 4));
        assert_eq!(arms.len() as u64 * OP, t.bytes_bound());
        let order: Vec<RxPath> = arms.chunks(SLOT_OPS).map(|c| c[0]).collect();
        use RxPath::{Copy as C, Mmap as M, Uring as U};
        assert_eq!(order, [U, M, C, M, C, U, C, U, M, U, M, C]);
        assert!(arms.chunks(SLOT_OPS).all(|c| c.iter().all(|p| *p == c[0])));
        // A step per window: 11 moves on, then the pick.
        assert_eq!(steps.len(), 12);
        assert!(steps[..11].iter().all(|s| matches!(s, Step::Next(_))));
    }

    #[test]
    fn a_candidate_cheaper_beyond_the_margin_is_kept_the_cheapest_wins() {
        let (p, ..) = drive(|p, _| match p {
            RxPath::Uring => 0.9,
            RxPath::Mmap => 0.8,
            _ => 1.0,
        });
        assert_eq!(p, RxPath::Mmap);
        let (p, ..) = drive(|p, _| if p == RxPath::Uring { 0.7 } else { 1.0 });
        assert_eq!(p, RxPath::Uring);
    }

    #[test]
    fn the_rule_over_a_trials_rounds_is_the_trials_own() {
        for cost in [
            [1.0, 0.9, 0.8],
            [1.0, 0.7, 1.0],
            [1.0, 0.98, 1.0],
            [1.0, 1.3, 1.3],
        ] {
            let (p, .., t) = drive(|p, r| match p {
                RxPath::Uring => cost[1] + 0.01 * r as f64,
                RxPath::Mmap => cost[2],
                _ => cost[0],
            });
            let rounds = t.rounds();
            assert_eq!(rounds.len(), 2);
            assert_eq!(pick_from(&rounds, 0.05), p, "{cost:?}: {rounds:?}");
        }
        // Pooled rounds: one trial's lucky rounds outvoted by the others'.
        let pooled = [
            (
                RxPath::Uring,
                vec![0.8, 0.8, 1.0, 1.02, 1.0, 0.99, 1.01, 1.0],
            ),
            (
                RxPath::Mmap,
                vec![0.9, 0.92, 0.88, 0.9, 0.91, 0.9, 0.87, 0.9],
            ),
        ];
        assert_eq!(pick_from(&pooled, 0.05), RxPath::Mmap);
        assert_eq!(pick_from::<RxPath>(&[], 0.05), RxPath::Copy);
    }

    #[test]
    fn within_the_margin_copy_the_incumbent_stays() {
        let (p, .., t) = drive(|p, _| if p == RxPath::Mmap { 0.98 } else { 1.0 });
        assert_eq!(p, RxPath::Copy);
        let r = t.ratios();
        assert!((r[1].1.unwrap() - 0.98).abs() < 1e-9, "{r:?}");
        // Dearer candidates: copy.
        let (p, ..) = drive(|p, _| if p == RxPath::Copy { 1.0 } else { 1.3 });
        assert_eq!(p, RxPath::Copy);
    }

    #[test]
    fn one_disturbed_window_does_not_move_the_verdict() {
        // mmap really is 20 % cheaper; in round 0 a load spike makes its window read 3x
        // (the mean of its four ratios would be 1.07: copy kept), in round 2 copy's window
        // reads 3x (flattering both candidates that round): the medians ignore both.
        let (p, .., t) = drive(|p, round| match (p, round) {
            (RxPath::Mmap, 0) => 2.4,
            (RxPath::Mmap, _) => 0.8,
            (RxPath::Copy, 2) => 3.0,
            _ => 1.0,
        });
        assert_eq!(p, RxPath::Mmap, "{:?}", t.ratios());
        assert!(t.dropped().is_empty(), "one dear window drops nothing");
        let r = t.ratios();
        assert!((r[1].1.unwrap() - 0.8).abs() < 1e-9, "{r:?}");
        assert!((r[0].1.unwrap() - 1.0).abs() < 1e-9, "uring: {r:?}");
    }

    #[test]
    fn a_load_that_grows_over_the_trial_is_paired_away() {
        // Every path's cost doubles from round to round (a load arriving): mmap is 10 %
        // under copy within each round. A trial that compared one arm's windows with
        // another's taken later would see the later arm dearer; paired, mmap wins.
        let (p, .., t) = drive(|p, round| {
            let load = 2f64.powi(round as i32);
            load * if p == RxPath::Mmap { 0.9 } else { 1.0 }
        });
        assert_eq!(p, RxPath::Mmap, "{:?}", t.ratios());
    }

    #[test]
    fn a_candidate_dear_in_the_first_two_rounds_leaves_the_trial() {
        // mmap at 2.4× copy (loopback at 16 KiB, mapping nothing): measured twice, then no
        // more; uring, cheaper, is still measured in every round and wins.
        let (p, arms, _, t) = drive(|p, _| match p {
            RxPath::Mmap => 2.4,
            RxPath::Uring => 0.7,
            _ => 1.0,
        });
        assert_eq!(p, RxPath::Uring, "{:?}", t.ratios());
        let windows: Vec<RxPath> = arms.chunks(SLOT_OPS).map(|c| c[0]).collect();
        let count = |x| windows.iter().filter(|&&w| w == x).count();
        assert_eq!(
            (
                count(RxPath::Mmap),
                count(RxPath::Uring),
                count(RxPath::Copy)
            ),
            (2, 4, 4),
            "{windows:?}"
        );
        assert!((arms.len() as u64 * OP) < t.bytes_bound());
        // What a later connection on the route need not measure again (`auto::memory`).
        assert_eq!(t.dropped(), vec![RxPath::Mmap]);
    }

    #[test]
    fn every_candidate_dear_ends_the_trial_on_copy_after_two_rounds() {
        let (p, arms, steps, _) = drive(|p, _| if p == RxPath::Copy { 1.0 } else { 1.6 });
        assert_eq!(p, RxPath::Copy);
        assert_eq!(arms.len(), 2 * ROUND_OPS, "two rounds of three arms");
        assert_eq!(steps.last(), Some(&Step::Pick(RxPath::Copy)));
    }

    #[test]
    fn a_candidate_dear_in_one_round_only_or_favoured_stays_to_the_end() {
        // mmap 2× in round 0 only (a disturbed window), 0.8 after: kept in, and picked.
        let mut t = Trial::new(&[RxPath::Uring, RxPath::Mmap], 4, W, 0.05);
        let clock = Cell::new(0u64);
        let mut mmap_windows = 0;
        while t.picked().is_none() {
            let p = t.route(|| clock.get());
            let c = match (p, t.round) {
                (RxPath::Mmap, 0) => 2.0,
                (RxPath::Mmap, _) => 0.8,
                _ => 1.0,
            };
            clock.set(clock.get() + (c * OP as f64) as u64);
            if let Step::Next(_) | Step::Pick(_) = t.after(OP, || clock.get()) {
                mmap_windows += usize::from(p == RxPath::Mmap);
            }
        }
        assert_eq!((t.picked(), mmap_windows), (Some(RxPath::Mmap), 4));
        // Favoured (its pair saved 30 %), at 1.5× copy in every round: measured to the
        // end, then left for copy (dearer than its tolerance).
        let (p, t) =
            drive_favouring_mmap_saving(0.3, |p, _| if p == RxPath::Mmap { 1.5 } else { 1.0 });
        assert_eq!(p, RxPath::Copy);
        assert_eq!(t.costs[2].iter().filter(|c| c.is_some()).count(), 4);
    }

    #[test]
    fn a_stopped_clock_says_nothing_and_without_candidates_copy_is_kept_at_once() {
        let (p, .., t) = drive(|_, _| 0.0);
        assert_eq!(p, RxPath::Copy);
        assert_eq!(
            t.ratios(),
            vec![(RxPath::Uring, None), (RxPath::Mmap, None)]
        );
        let t: Trial<RxPath> = Trial::new(&[], 4, W, 0.05);
        assert_eq!(t.picked(), Some(RxPath::Copy));
        let t = Trial::new(&[RxPath::Copy], 4, W, 0.05);
        assert_eq!(t.picked(), Some(RxPath::Copy));
        // One candidate is still measured against copy.
        let t = Trial::new(&[RxPath::Mmap], 4, W, 0.05);
        assert_eq!((t.picked(), t.wanted()), (None, RxPath::Mmap));
    }

    /// [`drive`] with `mmap` favoured, its pair having saved `saving` of copy's cost.
    fn drive_favouring_mmap_saving(
        saving: f64,
        cost: impl Fn(RxPath, usize) -> f64,
    ) -> (RxPath, Trial<RxPath>) {
        let mut t =
            Trial::new(&[RxPath::Uring, RxPath::Mmap], 4, W, 0.05).favouring(RxPath::Mmap, saving);
        let clock = Cell::new(0u64);
        for i in 0..10_000 {
            if let Some(p) = t.picked() {
                return (p, t);
            }
            let p = t.route(|| clock.get());
            clock.set(clock.get() + (cost(p, i / ROUND_OPS) * OP as f64) as u64);
            t.after(OP, || clock.get());
        }
        panic!("no pick");
    }

    /// [`drive_favouring_mmap_saving`] with a pair that saved less than the margin.
    fn drive_favouring_mmap(cost: impl Fn(RxPath, usize) -> f64) -> (RxPath, Trial<RxPath>) {
        drive_favouring_mmap_saving(0.01, cost)
    }

    #[test]
    fn a_favoured_candidate_wins_a_tie_with_copy_but_not_a_clear_loss() {
        // Level with copy, or dearer within the margin: the pairs' choice stands.
        for m in [1.0, 0.98, 1.04] {
            let (p, t) = drive_favouring_mmap(|p, _| if p == RxPath::Mmap { m } else { 1.0 });
            assert_eq!(p, RxPath::Mmap, "mmap at {m}: {:?}", t.ratios());
        }
        // Dearer than copy by more than the margin: copy.
        let (p, t) = drive_favouring_mmap(|p, _| if p == RxPath::Mmap { 1.08 } else { 1.0 });
        assert_eq!(p, RxPath::Copy, "{:?}", t.ratios());
        // Without the favour the same tie keeps copy.
        let (p, ..) = drive(|_, _| 1.0);
        assert_eq!(p, RxPath::Copy);
    }

    #[test]
    fn a_candidate_clearly_cheaper_than_the_favoured_one_still_wins() {
        // uring beats the favoured mmap by more than the margin: uring.
        let (p, t) = drive_favouring_mmap(|p, _| match p {
            RxPath::Uring => 0.8,
            RxPath::Mmap => 0.95,
            _ => 1.0,
        });
        assert_eq!(p, RxPath::Uring, "{:?}", t.ratios());
        // Within the margin of it: the favoured one.
        let (p, t) = drive_favouring_mmap(|p, _| match p {
            RxPath::Uring => 0.93,
            RxPath::Mmap => 0.95,
            _ => 1.0,
        });
        assert_eq!(p, RxPath::Mmap, "{:?}", t.ratios());
        // Favouring copy, or a path not among the candidates, changes nothing.
        let t = Trial::new(&[RxPath::Uring], 4, W, 0.05).favouring(RxPath::Mmap, 0.1);
        assert_eq!(t.favoured, None);
        let t = Trial::new(&[RxPath::Uring], 4, W, 0.05).favouring(RxPath::Copy, 0.1);
        assert_eq!(t.favoured, None);
    }

    #[test]
    fn the_tolerance_is_the_pairs_saving_when_it_exceeds_the_margin() {
        // The pair saved 12 %: mmap 10 % dearer on the receiver alone is kept, 20 % is not
        // (uring, dearer still, is no rival).
        let (p, t) = drive_favouring_mmap_saving(0.12, |p, _| match p {
            RxPath::Mmap => 1.10,
            RxPath::Uring => 1.3,
            _ => 1.0,
        });
        assert_eq!(p, RxPath::Mmap, "{:?}", t.ratios());
        let (p, t) = drive_favouring_mmap_saving(0.12, |p, _| match p {
            RxPath::Mmap => 1.2,
            RxPath::Uring => 1.3,
            _ => 1.0,
        });
        assert_eq!(p, RxPath::Copy, "{:?}", t.ratios());
        // A saving below the margin, negative or not a number: the margin.
        for saving in [0.01, -0.3, f64::NAN] {
            let t = Trial::new(&[RxPath::Mmap], 4, W, 0.05).favouring(RxPath::Mmap, saving);
            assert_eq!(t.favoured, Some((RxPath::Mmap, 1.05)), "{saving}");
        }
        // Never more than double.
        let t = Trial::new(&[RxPath::Mmap], 4, W, 0.05).favouring(RxPath::Mmap, 5.0);
        assert_eq!(t.favoured, Some((RxPath::Mmap, 2.0)));
        // The check after the trial judges the favoured pick by the same tolerance, any
        // other path by the margin.
        let t = Trial::new(&[RxPath::Mmap, RxPath::Uring], 4, W, 0.05).favouring(RxPath::Mmap, 0.3);
        assert!((t.margin_for(RxPath::Mmap) - 0.3).abs() < 1e-12);
        assert_eq!(t.margin_for(RxPath::Uring), 0.05);
        assert_eq!(t.margin_for(RxPath::Copy), 0.05);
    }

    #[test]
    fn after_the_pick_nothing_moves_it() {
        let (p, _, _, mut t) = drive(|p, _| if p == RxPath::Uring { 0.5 } else { 1.0 });
        assert_eq!(p, RxPath::Uring);
        assert_eq!(t.after(10 * W, || 0), Step::Stay);
        assert_eq!(
            (t.route(|| 0), t.picked()),
            (RxPath::Uring, Some(RxPath::Uring))
        );
    }
}
