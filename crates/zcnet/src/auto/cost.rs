//! The run-time check behind `auto`: what the chosen path costs *this* connection, in the
//! sending thread's own CPU per byte, against the copy path measured on the same
//! connection a moment later.
//!
//! A profile is measured elsewhere and earlier — each end against a copy peer, on a quieter
//! or a different machine — and can be wrong for the connection at hand (a zero-copy
//! sender whose pages loopback copies anyway, a peer whose receive path makes mapping
//! dear). So, every so often, the check measures one window of bytes on the path `auto`
//! wanted, lets one window go by copy unmeasured (the wanted path's deferred work — zero-copy
//! completions reaped by later sends — lands there, not in copy's account), then measures
//! one window on copy, and compares the two costs: if the wanted path costs
//! more than copy by more than a margin (in [`CONFIRM`] comparisons in a row, so a fluke of
//! the clock measures again rather than costing a back-off), the connection goes back to
//! copy and stays there
//! for a back-off (doubling while the verdict stands, up to a cap), then measures again —
//! in short windows ([`REMEASURE_BYTES`]), so that re-measuring a path that keeps costing
//! more stays a fraction of a percent of the bytes.
//! A stale or foreign profile thus costs a copy sample, never a whole transfer; a good one costs
//! one copy window per check, and checks grow rarer while the verdict keeps being good.
//!
//! The cost is the thread's CPU clock over the window (`CLOCK_THREAD_CPUTIME_ID`), so it
//! includes everything the sending thread did: completions reaped, waits for buffers,
//! softirq work run in its context — and the application's own work, which is the same
//! for both windows. Time is counted in bytes and read from a caller-supplied clock, so the
//! logic is pure and testable. The profile's choice comes first; this check only ever sends
//! an operation to the copy path, never away from it.

use super::AutoPath;

/// Bytes per measuring window (each of the two): a few milliseconds at loopback speeds,
/// many thousand thread-clock nanoseconds, so one scheduling hiccup is a small error.
pub const WINDOW_BYTES: u64 = 16 << 20;
/// How much more than copy the wanted path may cost before the connection leaves it.
pub(crate) const MARGIN: f64 = 0.05;
/// Windows between a good verdict and the next check; doubles after each good verdict up
/// to [`MAX_RECHECK_WINDOWS`]. A good verdict can be noise, and trusting a costlier path
/// longer costs more than checking a cheaper one again, so this cap is low.
pub(crate) const RECHECK_WINDOWS: u64 = 8;
/// Cap on the gap after good verdicts (1 GiB with the default window).
pub(crate) const MAX_RECHECK_WINDOWS: u64 = 64;
/// Costlier verdicts in a row before [`CostCheck::new`] leaves a path.
pub(crate) const CONFIRM: u32 = 2;
/// Windows a costlier path stays demoted at first; doubles while the verdict stands.
pub(crate) const BACKOFF_WINDOWS: u64 = 16;
/// Cap on the back-off, in windows (16 GiB with the default window).
pub(crate) const MAX_GAP_WINDOWS: u64 = 1024;
/// Bytes per window when a path found costlier is measured again after its back-off: the
/// verdict stood once already and a path that cost more keeps costing more, so a short
/// window suffices to see that it still does — 2 MiB of it on the wanted path against a
/// back-off of at least 256 MiB is under 0.8 % of the bytes, and half that after each
/// doubling (a full window, 16 MiB, was 6 %). A short window that finds the path no
/// dearer is not trusted on its own: full windows measure again before the path is.
pub(crate) const REMEASURE_BYTES: u64 = 2 << 20;

/// Where the cost check sends an operation, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick<P> {
    /// The wanted path (measured or not).
    Wanted(P),
    /// Copy, measured against the wanted path's window just taken.
    CopySample(P),
    /// Copy, because the wanted path was found costlier and is still in its back-off.
    Costlier(P),
}

/// What a completed comparison found (ns per byte of the sending thread's CPU).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict<P> {
    /// The path compared with copy.
    pub path: P,
    /// Its cost.
    pub path_ns_per_byte: f64,
    /// Copy's cost on the same connection, just after.
    pub copy_ns_per_byte: f64,
    /// Whether this comparison found the path dearer than copy beyond the margin.
    pub dearer: bool,
    /// Whether the path is left for copy (dearer in as many comparisons in a row as
    /// [`CostCheck::confirm`] asks).
    pub costlier: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase<P> {
    /// The wanted path runs; a check is due once `total` reaches `due`.
    Trusting { due: u64 },
    /// Measuring `path`: from thread clock `t0`, `bytes` so far.
    Measuring { path: P, t0: u64, bytes: u64 },
    /// Copy, not yet measured: the wanted path's deferred work (zero-copy completions
    /// reaped by later sends, buffers coming back) lands here, not in copy's window.
    Settling { path: P, cost: f64, bytes: u64 },
    /// Measuring copy after `path` cost `cost`.
    Sampling {
        path: P,
        cost: f64,
        t0: u64,
        bytes: u64,
    },
    /// `path` is costlier than copy: copy until `until`.
    Demoted { path: P, until: u64 },
}

/// One connection's run-time cost check.
#[derive(Debug, Clone)]
pub struct CostCheck<P> {
    fallback: P,
    window: u64,
    margin: f64,
    recheck: u64,
    base_recheck: u64,
    max_recheck: u64,
    backoff: u64,
    base_backoff: u64,
    max_gap: u64,
    total: u64,
    phase: Phase<P>,
    /// Costlier verdicts in a row needed to leave the path, and so far.
    confirm: u32,
    strikes: u32,
    /// Window bytes of a re-measurement after a costlier verdict.
    remeasure: u64,
    /// The last verdict left the path: the next comparison uses `remeasure` windows.
    suspect: bool,
}

impl<P: AutoPath> CostCheck<P> {
    /// With the defaults above, leaving a path after `CONFIRM` costlier verdicts in a
    /// row; `fallback` is the copy path.
    pub fn new(fallback: P) -> Self {
        Self::with(
            fallback,
            WINDOW_BYTES,
            MARGIN,
            (RECHECK_WINDOWS, MAX_RECHECK_WINDOWS),
            (BACKOFF_WINDOWS, MAX_GAP_WINDOWS),
        )
        .confirm(CONFIRM)
        .remeasure(REMEASURE_BYTES)
    }

    /// With a `window` of bytes, a `margin`, and gaps in windows, each (first, cap) and
    /// doubling: `recheck` after a good verdict, `backoff` after a costlier one.
    pub fn with(
        fallback: P,
        window: u64,
        margin: f64,
        recheck: (u64, u64),
        backoff: (u64, u64),
    ) -> Self {
        let window = window.max(1);
        let (recheck, max_recheck) = (recheck.0.max(1), recheck.1.max(recheck.0.max(1)));
        let (backoff, max_gap) = (backoff.0.max(1), backoff.1.max(backoff.0.max(1)));
        CostCheck {
            fallback,
            window,
            margin,
            recheck: recheck * window,
            base_recheck: recheck * window,
            max_recheck: max_recheck * window,
            backoff: backoff * window,
            base_backoff: backoff.max(1) * window,
            max_gap: max_gap.max(1) * window,
            total: 0,
            // The first check starts with the first bytes of the connection.
            phase: Phase::Trusting { due: 0 },
            confirm: 1,
            strikes: 0,
            remeasure: window,
            suspect: false,
        }
    }

    /// Measures a path found costlier again, after its back-off, in windows of `bytes`
    /// (at most the full window; see `REMEASURE_BYTES`): dearer again, it backs off
    /// twice as long at once; not dearer, full windows measure it again before it is
    /// trusted.
    pub fn remeasure(mut self, bytes: u64) -> Self {
        self.remeasure = bytes.clamp(1, self.window);
        self
    }

    /// Continues as after `good` good comparisons in a row: the first check comes after the
    /// gap those would have grown it to (doubling from the first recheck gap, up to its cap),
    /// and the gaps grow on from there. For a path already measured against copy on this
    /// connection — a receive trial's pick (`super::trial`), cheaper than copy in the
    /// median of its rounds — checking it again soon would repeat that measurement, and each
    /// check runs two windows on copy: where copy costs twice the pick (veth at 256 KiB),
    /// checks after 8, 16 and 32 windows put 6 % of a 2 GiB connection on it.
    pub fn as_if_good(mut self, good: u32) -> Self {
        let mut gap = 0;
        for _ in 0..good {
            gap = self.recheck;
            self.recheck = (self.recheck * 2).min(self.max_recheck);
        }
        self.phase = Phase::Trusting { due: gap };
        self
    }

    /// The window of the comparison under way.
    fn window(&self) -> u64 {
        if self.suspect {
            self.remeasure
        } else {
            self.window
        }
    }

    /// Requires `n` costlier verdicts in a row before the path is left (at least 1): a
    /// costlier verdict short of that measures again at once. One window's thread clock on
    /// a shared machine is noisy; a path that really costs more is found so again, at the
    /// price of one more window on it, while a fluke no longer costs a whole back-off.
    pub fn confirm(mut self, n: u32) -> Self {
        self.confirm = n.max(1);
        self
    }

    /// Whether a window is being measured: the clock is read at its end, so a caller whose
    /// clock costs something to keep (an async stream summing its own polls' CPU, where a
    /// task moves between threads) need only keep it while this says so.
    pub fn measuring(&self) -> bool {
        matches!(self.phase, Phase::Measuring { .. } | Phase::Sampling { .. })
    }

    /// Where an operation that wants `wanted` goes; `clock` (the thread's CPU time, ns) is
    /// read only when a window starts.
    pub fn pick(&mut self, wanted: P, clock: impl Fn() -> u64) -> Pick<P> {
        match self.phase {
            Phase::Demoted { path, until } => {
                if self.total < until {
                    return Pick::Costlier(path);
                }
                // Back-off over: measure the path again (if it is still wanted).
                self.phase = Phase::Trusting { due: self.total };
                self.pick(wanted, clock)
            }
            Phase::Settling { path, .. } | Phase::Sampling { path, .. } => Pick::CopySample(path),
            Phase::Measuring { path, .. } if path == wanted => Pick::Wanted(wanted),
            Phase::Measuring { .. } => {
                // The wanted path changed mid-window (another size's choice): start over.
                self.phase = Phase::Trusting { due: self.total };
                self.pick(wanted, clock)
            }
            Phase::Trusting { due } => {
                if wanted != self.fallback && self.total >= due {
                    self.phase = Phase::Measuring {
                        path: wanted,
                        t0: clock(),
                        bytes: 0,
                    };
                }
                Pick::Wanted(wanted)
            }
        }
    }

    /// Records an operation of `bytes` that `pick` sent where it said; returns the verdict
    /// when this operation completed a comparison.
    pub fn after(&mut self, bytes: u64, clock: impl Fn() -> u64) -> Option<Verdict<P>> {
        self.total = self.total.saturating_add(bytes);
        let window = self.window();
        match &mut self.phase {
            Phase::Measuring { path, t0, bytes: b } => {
                *b += bytes;
                if *b >= window {
                    let cost = clock().saturating_sub(*t0) as f64 / *b as f64;
                    self.phase = Phase::Settling {
                        path: *path,
                        cost,
                        bytes: 0,
                    };
                }
                None
            }
            Phase::Settling {
                path,
                cost,
                bytes: b,
            } => {
                *b += bytes;
                if *b >= window {
                    self.phase = Phase::Sampling {
                        path: *path,
                        cost: *cost,
                        t0: clock(),
                        bytes: 0,
                    };
                }
                None
            }
            Phase::Sampling {
                path,
                cost,
                t0,
                bytes: b,
            } => {
                *b += bytes;
                if *b < window {
                    return None;
                }
                let copy = clock().saturating_sub(*t0) as f64 / *b as f64;
                let (path, cost) = (*path, *cost);
                let dearer = cost > copy * (1.0 + self.margin);
                self.strikes = if dearer { self.strikes + 1 } else { 0 };
                // A re-measurement needs no confirmation to leave the path again.
                let costlier = dearer && (self.suspect || self.strikes >= self.confirm);
                if self.suspect && !dearer {
                    // A short window found it no dearer: full windows before trusting it.
                    self.suspect = false;
                    self.phase = Phase::Trusting { due: self.total };
                } else if dearer && !costlier {
                    // Not confirmed yet: measure again now.
                    self.phase = Phase::Trusting { due: self.total };
                } else if costlier {
                    self.strikes = 0;
                    self.suspect = self.remeasure < self.window;
                    self.phase = Phase::Demoted {
                        path,
                        until: self.total.saturating_add(self.backoff),
                    };
                    self.backoff = (self.backoff * 2).min(self.max_gap);
                    self.recheck = self.base_recheck;
                } else {
                    self.phase = Phase::Trusting {
                        due: self.total.saturating_add(self.recheck),
                    };
                    self.recheck = (self.recheck * 2).min(self.max_recheck);
                    self.backoff = self.base_backoff;
                }
                Some(Verdict {
                    path,
                    path_ns_per_byte: cost,
                    copy_ns_per_byte: copy,
                    dearer,
                    costlier,
                })
            }
            Phase::Trusting { .. } | Phase::Demoted { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::path::TxPath;
    use std::cell::Cell;

    /// Drives a check over `ops` operations of `size` bytes where each path costs the given
    /// ns per byte (a fake thread clock advanced by every operation), always wanting
    /// `wanted`; returns the picks taken and the verdicts.
    fn drive(
        c: &mut CostCheck<TxPath>,
        wanted: TxPath,
        cost: impl Fn(TxPath) -> f64,
        size: u64,
        ops: usize,
    ) -> (Vec<Pick<TxPath>>, Vec<Verdict<TxPath>>) {
        let clock = Cell::new(1_000u64);
        let mut picks = Vec::new();
        let mut verdicts = Vec::new();
        for _ in 0..ops {
            let r = c.pick(wanted, || clock.get());
            let path = match r {
                Pick::Wanted(p) => p,
                Pick::CopySample(_) | Pick::Costlier(_) => TxPath::Copy,
            };
            clock.set(clock.get() + (cost(path) * size as f64) as u64);
            picks.push(r);
            if let Some(v) = c.after(size, || clock.get()) {
                verdicts.push(v);
            }
        }
        (picks, verdicts)
    }

    fn check() -> CostCheck<TxPath> {
        // Windows of 10 operations of 1 KiB, recheck after 2 windows (cap 64), back-off 4.
        CostCheck::with(TxPath::Copy, 10 << 10, 0.05, (2, 64), (4, 64))
    }

    #[test]
    fn a_costlier_path_goes_back_to_copy_and_stays_there_for_the_backoff() {
        let mut c = check();
        let cost = |p| if p == TxPath::Uring { 2.0 } else { 1.0 };
        let (picks, verdicts) = drive(&mut c, TxPath::Uring, cost, 1024, 70);
        // 10 ops measured on uring, 10 settling and 10 measured on copy, then 40 demoted.
        assert!(picks[..10]
            .iter()
            .all(|r| *r == Pick::Wanted(TxPath::Uring)));
        assert!(picks[10..30]
            .iter()
            .all(|r| *r == Pick::CopySample(TxPath::Uring)));
        assert!(picks[30..70]
            .iter()
            .all(|r| *r == Pick::Costlier(TxPath::Uring)));
        assert_eq!(verdicts.len(), 1);
        let v = verdicts[0];
        assert!(v.costlier);
        assert!((v.path_ns_per_byte - 2.0).abs() < 0.01, "{v:?}");
        assert!((v.copy_ns_per_byte - 1.0).abs() < 0.01, "{v:?}");
        // After the back-off it measures again, finds the same, and backs off twice as long.
        let (picks, verdicts) = drive(&mut c, TxPath::Uring, cost, 1024, 110);
        assert_eq!(picks[0], Pick::Wanted(TxPath::Uring));
        assert!(verdicts[0].costlier);
        assert!(picks[30..110]
            .iter()
            .all(|r| *r == Pick::Costlier(TxPath::Uring)));
    }

    #[test]
    fn a_cheaper_path_keeps_running_and_checks_grow_rarer() {
        let mut c = check();
        let cost = |p| if p == TxPath::Uring { 0.5 } else { 1.0 };
        let (picks, verdicts) = drive(&mut c, TxPath::Uring, cost, 1024, 260);
        assert!(verdicts.iter().all(|v| !v.costlier));
        // Checks at 0, then after gaps of 2, 4, 8 windows (+3 windows of checking each).
        assert_eq!(verdicts.len(), 4, "{verdicts:?}");
        let samples = picks
            .iter()
            .filter(|r| matches!(r, Pick::CopySample(_)))
            .count();
        assert_eq!(
            samples, 80,
            "two copy windows per check: settling, measured"
        );
        assert!(picks.iter().all(|r| !matches!(r, Pick::Costlier(_))));
    }

    #[test]
    fn with_confirmation_a_fluke_measures_again_and_a_real_cost_still_leaves() {
        // One dear window (a fluke), then the path is as cheap as copy: no back-off.
        let mut c = check().confirm(2);
        let clock = Cell::new(0u64);
        let mut verdicts = Vec::new();
        let mut wanted_ops = 0;
        for i in 0..60 {
            let r = c.pick(TxPath::Uring, || clock.get());
            let per_byte = match r {
                Pick::Wanted(_) if i < 10 => 2.0,
                Pick::Wanted(_) => {
                    wanted_ops += 1;
                    1.0
                }
                _ => 1.0,
            };
            clock.set(clock.get() + (per_byte * 1024.0) as u64);
            if let Some(v) = c.after(1024, || clock.get()) {
                verdicts.push(v);
            }
        }
        assert!(verdicts[0].dearer && !verdicts[0].costlier, "{verdicts:?}");
        assert!(!verdicts[1].dearer && !verdicts[1].costlier, "{verdicts:?}");
        assert!(wanted_ops >= 10, "measured again at once, then trusted");
        // A path that really costs more is left after the second verdict.
        let cost = |p| if p == TxPath::Uring { 2.0 } else { 1.0 };
        let (picks, v) = drive(&mut check().confirm(2), TxPath::Uring, cost, 1024, 100);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v[0].dearer && !v[0].costlier && v[1].costlier, "{v:?}");
        assert!(picks[60..100]
            .iter()
            .all(|r| *r == Pick::Costlier(TxPath::Uring)));
    }

    #[test]
    fn the_clock_is_needed_only_while_a_window_is_measured() {
        let mut c = check();
        let mut measured = Vec::new();
        let clock = Cell::new(0u64);
        for _ in 0..40 {
            let r = c.pick(TxPath::Zerocopy, || clock.get());
            measured.push(c.measuring());
            clock.set(
                clock.get()
                    + if matches!(r, Pick::Wanted(_)) {
                        2048
                    } else {
                        1024
                    },
            );
            c.after(1024, || clock.get());
        }
        // Measuring zero-copy (10 ops), settling (10, unmeasured), probing copy (10), then
        // costlier: demoted (unmeasured).
        assert!(measured[..10].iter().all(|m| *m));
        assert!(measured[10..20].iter().all(|m| !*m));
        assert!(measured[20..30].iter().all(|m| *m));
        assert!(measured[30..].iter().all(|m| !*m));
    }

    #[test]
    fn a_costlier_path_is_measured_again_in_short_windows_and_trusted_only_after_full_ones() {
        // Full windows of 10 ops of 1 KiB, re-measurements of 2 ops, back-off 4 windows.
        let mut c = check().remeasure(2 << 10);
        let dear = |p| if p == TxPath::Uring { 2.0 } else { 1.0 };
        let (picks, v) = drive(&mut c, TxPath::Uring, dear, 1024, 70);
        assert_eq!(v.len(), 1);
        assert!(v[0].costlier);
        assert!(picks[30..70]
            .iter()
            .all(|r| *r == Pick::Costlier(TxPath::Uring)));
        // After the back-off: 2 ops on the path, 2 settling, 2 on copy; dearer again, so
        // it backs off at once for twice as long (8 windows = 80 ops).
        let (picks, v) = drive(&mut c, TxPath::Uring, dear, 1024, 86);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].costlier);
        let wanted = picks
            .iter()
            .filter(|r| matches!(r, Pick::Wanted(_)))
            .count();
        assert_eq!(wanted, 2, "a short window on the dear path");
        assert!(picks[6..86]
            .iter()
            .all(|r| *r == Pick::Costlier(TxPath::Uring)));
        // Now the path got cheap: the short window says so, full windows confirm it before
        // the path is trusted (its gap back to the first recheck).
        let cheap = |p| if p == TxPath::Uring { 0.5 } else { 1.0 };
        let (picks, v) = drive(&mut c, TxPath::Uring, cheap, 1024, 60);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(!v[0].dearer && !v[1].dearer, "{v:?}");
        assert!(picks[..2].iter().all(|r| *r == Pick::Wanted(TxPath::Uring)));
        assert!(picks[6..16]
            .iter()
            .all(|r| *r == Pick::Wanted(TxPath::Uring)));
        assert!(picks[36..]
            .iter()
            .all(|r| *r == Pick::Wanted(TxPath::Uring)));
    }

    #[test]
    fn as_if_good_starts_with_the_gap_those_verdicts_would_have_grown_to() {
        // Recheck 2 windows doubling to a cap of 64: after 3 good verdicts the gap was 8
        // windows and the next is 16; after 10, both are the cap.
        let cheap = |p| if p == TxPath::Uring { 0.5 } else { 1.0 };
        let mut c = check().as_if_good(3);
        let (picks, v) = drive(&mut c, TxPath::Uring, cheap, 1024, 80 + 30 + 160 + 1);
        let all = |r: &[Pick<TxPath>], want| r.iter().all(|r| *r == want);
        assert!(all(&picks[..80], Pick::Wanted(TxPath::Uring)));
        assert!(all(&picks[90..110], Pick::CopySample(TxPath::Uring)));
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(all(&picks[110..270], Pick::Wanted(TxPath::Uring)));
        let mut c = check().as_if_good(10);
        let (_, v) = drive(&mut c, TxPath::Uring, cheap, 1024, 640);
        assert!(v.is_empty(), "{v:?}");
        // None: the first check starts with the first bytes, as `new` does.
        let (picks, _) = drive(&mut check().as_if_good(0), TxPath::Uring, cheap, 1024, 11);
        assert_eq!(picks[10], Pick::CopySample(TxPath::Uring));
    }

    #[test]
    fn within_the_margin_is_not_costlier() {
        let mut c = check();
        let cost = |p| if p == TxPath::Zerocopy { 1.04 } else { 1.0 };
        let (_, verdicts) = drive(&mut c, TxPath::Zerocopy, cost, 1024, 30);
        assert_eq!(verdicts.len(), 1);
        assert!(!verdicts[0].costlier);
    }

    #[test]
    fn the_wanted_paths_deferred_work_does_not_count_against_copy() {
        // Zero-copy completions of the measured window get reaped during the next sends:
        // model them as 5 ns/B billed to the first window after it. Only the settling
        // window pays them; copy's own window measures copy.
        let mut c = check();
        let clock = Cell::new(0u64);
        let mut after_wanted = 0;
        let mut verdict = None;
        for _ in 0..30 {
            let r = c.pick(TxPath::Zerocopy, || clock.get());
            let per_byte = match r {
                Pick::Wanted(_) => {
                    after_wanted = 10;
                    1.5
                }
                _ if after_wanted > 0 => {
                    after_wanted -= 1;
                    1.0 + 5.0
                }
                _ => 1.0,
            };
            clock.set(clock.get() + (per_byte * 1024.0) as u64);
            if let Some(v) = c.after(1024, || clock.get()) {
                verdict = Some(v);
            }
        }
        let v = verdict.expect("one check");
        assert!((v.copy_ns_per_byte - 1.0).abs() < 0.01, "{v:?}");
        assert!(v.costlier, "1.5 against copy's 1.0: {v:?}");
    }

    #[test]
    fn copy_itself_is_never_checked() {
        let mut c = check();
        let (picks, verdicts) = drive(&mut c, TxPath::Copy, |_| 1.0, 1024, 100);
        assert!(verdicts.is_empty());
        assert!(picks.iter().all(|r| *r == Pick::Wanted(TxPath::Copy)));
    }

    #[test]
    fn a_change_of_mind_mid_window_starts_the_measurement_over() {
        let mut c = check();
        let clock = || 0u64;
        assert_eq!(c.pick(TxPath::Uring, clock), Pick::Wanted(TxPath::Uring));
        c.after(5 << 10, clock);
        assert_eq!(
            c.pick(TxPath::Zerocopy, clock),
            Pick::Wanted(TxPath::Zerocopy)
        );
        // The zerocopy window needs a full 10 KiB of its own before copy is sampled.
        c.after(9 << 10, clock);
        assert_eq!(
            c.pick(TxPath::Zerocopy, clock),
            Pick::Wanted(TxPath::Zerocopy)
        );
        c.after(1 << 10, clock);
        assert_eq!(
            c.pick(TxPath::Zerocopy, clock),
            Pick::CopySample(TxPath::Zerocopy)
        );
    }
}
