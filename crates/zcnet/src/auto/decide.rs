//! `auto`'s decider: one small state machine per direction, in the quinn-proto manner — fed
//! each operation's size and, while a cost window is measured, the caller's clock; it answers
//! the path of the next operation. No socket, no file, no clock of its own: `tx::auto` and
//! `rx::auto` only switch paths by its answers, and every rule here is tested without them.
//!
//! What it weighs, in this order: the profile's choice by size and alignment ([`Chooser`]),
//! then the connection's own run-time check against copy ([`CostCheck`]), which only ever
//! sends an operation to copy. The kernel's evidence is not weighed here but obeyed below
//! it, whatever a profile says: a transmit sub-path whose completions come back `COPIED`
//! demotes itself ([`crate::policy::CopiedDemotion`], the one COPIED demotion), and the
//! mapping receiver that maps nothing demotes itself to `recv` (`rx::mmap`).

use super::choose::{Choice, ChoiceReason, Chooser};
use super::cost::{CostCheck, Route};
use super::{AutoPath, AutoStats};

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

    /// The operation `next` routed moved `len` bytes; `clock` is read only when a window ends.
    fn done(&mut self, len: u64, clock: &dyn Fn() -> u64, delta: &mut AutoStats);
}

/// Counts one routed operation's diversion to copy by the cost check; returns its path.
pub(crate) fn routed<P: AutoPath>(route: Route<P>, delta: &mut AutoStats) -> P {
    match route {
        Route::Wanted(p) => p,
        Route::ProbeCopy(_) => {
            delta.cost_probe_ops += 1;
            P::DEFAULT
        }
        Route::Costlier(_) => {
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
        routed(self.cost.route(choice.path, clock), d)
    }

    fn done(&mut self, len: u64, clock: &dyn Fn() -> u64, d: &mut AutoStats) {
        counted(self.cost.after(len, clock), d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auto::profile::{Measurement, Spread};
    use crate::path::TxPath;
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
        assert_eq!(on_copy, s.fallback_costlier + s.cost_probe_ops, "{s:?}");
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
}
