//! The per-send choice of a stream between copy and `MSG_ZEROCOPY`: zcnet's [`Policy`]
//! (size, alignment, demotion after COPIED completions counted in bytes), then zcnet's
//! run-time cost check ([`zcnet::tuning::CostCheck`]) — the same machinery as the blocking `auto`
//! path, with a clock that suits a task.
//!
//! Why the cost check: on loopback and across a veth pair the kernel copies zero-copy data
//! at delivery anyway, so `MSG_ZEROCOPY` costs copy plus pinning plus notifications. The
//! COPIED flag says so, and the demotion acts on it; where the flag does not (a device
//! that takes the pages but makes pinning dear, a receiver that slows acknowledgements)
//! the connection measures its own cost per byte on each path and leaves zero-copy for copy
//! when zero-copy costs more than 5 % above it.
//!
//! The clock: the blocking path reads its thread's CPU clock, but a task on a multi-thread
//! runtime moves between threads, so a difference of two thread clocks taken on different
//! threads means nothing. The stream instead sums the thread CPU time of its own polls
//! (each poll runs on one thread) while a window is being measured ([`CostCheck::measuring`])
//! — the sends, the error-queue reads, the readiness bookkeeping — and the cost check reads
//! that sum. Outside a window nothing is measured, so a trusted path pays no clock reads.
//! This module is pure: the clock is the caller's.

use zcnet::auto::AutoStats;
use zcnet::tuning::{CostCheck, Pick};
use zcnet::{FallbackReason, Policy, TxPath};

/// Where one send goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Go {
    /// `MSG_ZEROCOPY`.
    ZeroCopy,
    /// Plain `send`; a fallback counted under this reason.
    Copy(FallbackReason),
    /// Plain `send` to measure copy for the cost check: counted as the check's copy sample
    /// ([`AutoStats::cost_sample_ops`]), not as a fallback.
    CopySample,
}

/// One stream's per-send choice.
#[derive(Debug, Clone)]
pub(crate) struct SendChoice {
    policy: Policy,
    cost: Option<CostCheck<TxPath>>,
}

impl SendChoice {
    /// `check`: whether the cost check runs (see [`crate::ZcConfig::cost_check`]).
    pub(crate) fn new(policy: Policy, check: bool) -> Self {
        SendChoice {
            policy,
            cost: check.then(|| CostCheck::new(TxPath::Copy)),
        }
    }

    /// The policy (for the demotion's limits).
    pub(crate) fn policy(&self) -> Policy {
        self.policy
    }

    /// Whether the run-time cost check runs.
    pub(crate) fn checks_cost(&self) -> bool {
        self.cost.is_some()
    }

    /// Whether the caller must keep the clock running (a window is being measured).
    pub(crate) fn measuring(&self) -> bool {
        self.cost.as_ref().is_some_and(CostCheck::measuring)
    }

    /// Decides a send of `len` bytes at `addr`; `demoted`: the socket's completions said
    /// COPIED for long enough. Nothing is counted until [`SendChoice::after`], so a writer
    /// driven by `poll` may decide again after a `Pending`.
    pub(crate) fn decide(
        &mut self,
        len: usize,
        addr: usize,
        page: usize,
        demoted: bool,
        clock: impl Fn() -> u64,
    ) -> Go {
        if let Some(reason) = self.policy.refuses(len, addr, page, demoted) {
            return Go::Copy(reason);
        }
        let Some(cost) = self.cost.as_mut() else {
            return Go::ZeroCopy;
        };
        match cost.pick(TxPath::Zerocopy, clock) {
            Pick::Wanted(_) => Go::ZeroCopy,
            Pick::CopySample(_) => Go::CopySample,
            Pick::Costlier(_) => Go::Copy(FallbackReason::Costlier),
        }
    }

    /// Records a send of `len` bytes that went where [`SendChoice::decide`] said (`go`),
    /// counting the check's routing in `delta`.
    pub(crate) fn after(
        &mut self,
        go: Go,
        len: usize,
        clock: impl Fn() -> u64,
        delta: &mut AutoStats,
    ) {
        let Some(cost) = self.cost.as_mut() else {
            return;
        };
        match go {
            Go::CopySample => delta.cost_sample_ops += 1,
            Go::Copy(FallbackReason::Costlier) => delta.fallback_costlier += 1,
            Go::Copy(_) | Go::ZeroCopy => {}
        }
        if let Some(v) = cost.after(len as u64, clock) {
            delta.cost_checks += 1;
            if v.costlier {
                delta.cost_costlier += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    const MIB: usize = 1 << 20;

    /// Drives `ops` sends of 1 MiB, zero-copy costing `zc` and copy `copy` ns per byte on
    /// a fake clock; returns where each went and the counts.
    fn drive(c: &mut SendChoice, zc: f64, copy: f64, ops: usize) -> (Vec<Go>, AutoStats) {
        let clock = Cell::new(0u64);
        let mut delta = AutoStats::default();
        let mut gone = Vec::new();
        for _ in 0..ops {
            let go = c.decide(MIB, 0, 4096, false, || clock.get());
            let per_byte = if go == Go::ZeroCopy { zc } else { copy };
            clock.set(clock.get() + (per_byte * MIB as f64) as u64);
            c.after(go, MIB, || clock.get(), &mut delta);
            gone.push(go);
        }
        (gone, delta)
    }

    #[test]
    fn zero_copy_that_costs_more_than_copy_is_left_for_copy() {
        let mut c = SendChoice::new(Policy::default(), true);
        // Windows of 16 MiB: measured zero-copy, settling, measured copy — a first costlier
        // verdict measures again at once (`cost::CONFIRM`), the second demotes.
        let (gone, d) = drive(&mut c, 1.5, 1.0, 128);
        assert!(gone[..16].iter().all(|g| *g == Go::ZeroCopy));
        assert!(gone[16..48].iter().all(|g| *g == Go::CopySample));
        assert!(gone[48..64].iter().all(|g| *g == Go::ZeroCopy));
        assert!(gone[64..96].iter().all(|g| *g == Go::CopySample));
        assert!(gone[96..]
            .iter()
            .all(|g| *g == Go::Copy(FallbackReason::Costlier)));
        assert_eq!((d.cost_checks, d.cost_costlier), (2, 1));
        assert_eq!(d.cost_sample_ops, 64);
        assert_eq!(d.fallback_costlier, 32);
    }

    #[test]
    fn zero_copy_that_pays_keeps_running_between_rarer_checks() {
        let mut c = SendChoice::new(Policy::default(), true);
        let (gone, d) = drive(&mut c, 0.5, 1.0, 1024);
        assert_eq!(d.cost_costlier, 0);
        assert!(d.cost_checks >= 2, "{d:?}");
        let zc = gone.iter().filter(|g| **g == Go::ZeroCopy).count();
        assert!(zc > 1024 * 3 / 4, "most sends zero-copy: {zc}");
        assert!(gone
            .iter()
            .all(|g| *g != Go::Copy(FallbackReason::Costlier)));
    }

    #[test]
    fn the_policy_comes_first_and_without_the_check_nothing_is_sampled() {
        let mut c = SendChoice::new(Policy::default(), true);
        let clock = || 0;
        assert_eq!(
            c.decide(100, 0, 4096, false, clock),
            Go::Copy(FallbackReason::TooSmall)
        );
        assert_eq!(
            c.decide(MIB, 0, 4096, true, clock),
            Go::Copy(FallbackReason::DemotedCopied)
        );
        assert!(!c.measuring(), "policy copies start no window");
        assert_eq!(c.decide(MIB, 0, 4096, false, clock), Go::ZeroCopy);
        assert!(c.measuring());
        let mut off = SendChoice::new(Policy::always(), false);
        let (gone, d) = drive(&mut off, 9.0, 1.0, 64);
        assert!(gone.iter().all(|g| *g == Go::ZeroCopy));
        assert_eq!(d, AutoStats::default());
        assert!(!off.measuring());
    }
}
