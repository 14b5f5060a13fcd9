//! Online demotion and re-promotion of the mapping receive path, from what the kernel reports.
//!
//! The profile says what a path costs on this host in general; a particular connection can
//! still make it pay nothing: a `TCP_ZEROCOPY_RECEIVE` that maps nothing (data not
//! page-sized or not page-aligned in the skb) falls back to `recv` after a wasted call.
//! (Transmit's `COPIED` completions are the sub-paths' own demotion,
//! [`crate::policy::CopiedDemotion`].) After `threshold` consecutive bad reports the path is demoted for this
//! connection and the fallback is used; after a back-off (counted in caller-supplied ticks —
//! operations or seconds — so the logic is testable without a clock) one operation retries
//! it: a good report re-promotes it, a bad one demotes it again with the back-off doubled (up
//! to a cap), so a path that never pays costs ever fewer retries.
//!
//! Reports arriving for a path while it is demoted (late completions of operations sent
//! before the demotion) are ignored.

use super::{AutoPath, AutoStats};

/// Consecutive receive steps that mapped nothing before the path is demoted.
pub(crate) const DEMOTE_AFTER: u32 = 64;
/// Operations a demoted path waits before it is retried; doubles after each failed retry.
pub(crate) const RETRY_AFTER_OPS: u64 = 1024;
/// Cap on the retry back-off, in operations.
pub(crate) const MAX_RETRY_AFTER_OPS: u64 = 64 * 1024;

/// What one operation on a path showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Report {
    /// The path did what it is for (a completion without `COPIED`, a receive that mapped).
    Good,
    /// It did not (a receive step found data and mapped none of it).
    Bad,
}

/// The path an operation may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Admit<P> {
    /// The path to use.
    pub path: P,
    /// Whether this operation retries a demoted path (its report decides promotion).
    pub retry: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Health {
    Good { bad_streak: u32 },
    Demoted { until: u64, backoff: u64 },
    Retrying { backoff: u64 },
}

/// One connection's demotion state for every path it has used.
#[derive(Debug, Clone)]
pub(crate) struct Demotion<P> {
    threshold: u32,
    backoff: u64,
    max_backoff: u64,
    health: Vec<(P, Health)>,
}

impl<P: AutoPath> Demotion<P> {
    /// Demote after `threshold` (at least 1) consecutive bad reports; retry `backoff`
    /// ticks (at least 1) after a demotion, doubling after each failed retry up to
    /// `max_backoff`.
    pub(crate) fn new(threshold: u32, backoff: u64, max_backoff: u64) -> Self {
        let backoff = backoff.max(1);
        Demotion {
            threshold: threshold.max(1),
            backoff,
            max_backoff: max_backoff.max(backoff),
            health: Vec::new(),
        }
    }

    fn health(&mut self, path: P) -> &mut Health {
        let i = match self.health.iter().position(|(p, _)| *p == path) {
            Some(i) => i,
            None => {
                self.health.push((path, Health::Good { bad_streak: 0 }));
                self.health.len() - 1
            }
        };
        &mut self.health[i].1
    }

    /// Whether `path` is demoted (or being retried) on this connection (tests read it).
    #[cfg(test)]
    pub(crate) fn is_demoted(&self, path: P) -> bool {
        self.health
            .iter()
            .any(|(p, h)| *p == path && !matches!(h, Health::Good { .. }))
    }

    /// The path an operation that wants `wanted` takes at tick `now`: `wanted` unless it is
    /// demoted and not yet due for a retry, then `fallback` (counted).
    pub(crate) fn admit(
        &mut self,
        wanted: P,
        fallback: P,
        now: u64,
        stats: &mut AutoStats,
    ) -> Admit<P> {
        if wanted == fallback {
            return Admit {
                path: wanted,
                retry: false,
            };
        }
        let h = self.health(wanted);
        match *h {
            Health::Good { .. } => Admit {
                path: wanted,
                retry: false,
            },
            Health::Retrying { .. } => Admit {
                path: wanted,
                retry: true,
            },
            Health::Demoted { until, backoff } if now >= until => {
                *h = Health::Retrying { backoff };
                stats.retries += 1;
                Admit {
                    path: wanted,
                    retry: true,
                }
            }
            Health::Demoted { .. } => {
                stats.fallback_demoted += 1;
                Admit {
                    path: fallback,
                    retry: false,
                }
            }
        }
    }

    /// Records what an operation on `path` showed at tick `now`; returns `true` if this
    /// report demoted the path (the caller should leave it).
    pub(crate) fn report(
        &mut self,
        path: P,
        report: Report,
        now: u64,
        stats: &mut AutoStats,
    ) -> bool {
        let (threshold, base, max) = (self.threshold, self.backoff, self.max_backoff);
        let h = self.health(path);
        match (*h, report) {
            (Health::Demoted { .. }, _) => false,
            (Health::Good { .. }, Report::Good) => {
                *h = Health::Good { bad_streak: 0 };
                false
            }
            (Health::Retrying { .. }, Report::Good) => {
                *h = Health::Good { bad_streak: 0 };
                stats.promotions += 1;
                false
            }
            (Health::Good { bad_streak }, Report::Bad) => {
                if bad_streak + 1 < threshold {
                    *h = Health::Good {
                        bad_streak: bad_streak + 1,
                    };
                    return false;
                }
                *h = Health::Demoted {
                    until: now.saturating_add(base),
                    backoff: base,
                };
                stats.demotions_rx_unmapped += 1;
                true
            }
            (Health::Retrying { backoff }, Report::Bad) => {
                let backoff = backoff.saturating_mul(2).min(max);
                *h = Health::Demoted {
                    until: now.saturating_add(backoff),
                    backoff,
                };
                stats.redemotions += 1;
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::path::RxPath;
    use proptest::prelude::*;

    const UNMAPPED: Report = Report::Bad;

    #[test]
    fn demoted_after_k_bad_reports_then_retried_and_promoted() {
        let mut s = AutoStats::default();
        let mut d = Demotion::new(3, 10, 80);
        let mmap = RxPath::Mmap;
        // Two bad, one good: the streak restarts.
        assert!(!d.report(mmap, UNMAPPED, 0, &mut s));
        assert!(!d.report(mmap, UNMAPPED, 1, &mut s));
        assert!(!d.report(mmap, Report::Good, 2, &mut s));
        assert!(!d.report(mmap, UNMAPPED, 3, &mut s));
        assert!(!d.report(mmap, UNMAPPED, 4, &mut s));
        assert!(d.report(mmap, UNMAPPED, 5, &mut s));
        assert!(d.is_demoted(mmap));
        assert_eq!(s.demotions_rx_unmapped, 1);
        // Late reports while demoted change nothing.
        assert!(!d.report(mmap, Report::Good, 6, &mut s));
        assert!(d.is_demoted(mmap));
        // Until tick 15 the fallback is used.
        for now in 6..15 {
            let a = d.admit(mmap, RxPath::Copy, now, &mut s);
            assert_eq!(
                a,
                Admit {
                    path: RxPath::Copy,
                    retry: false
                }
            );
        }
        assert_eq!(s.fallback_demoted, 9);
        let a = d.admit(mmap, RxPath::Copy, 15, &mut s);
        assert_eq!(
            a,
            Admit {
                path: mmap,
                retry: true
            }
        );
        assert_eq!(s.retries, 1);
        assert!(!d.report(mmap, Report::Good, 16, &mut s));
        assert!(!d.is_demoted(mmap));
        assert_eq!(s.promotions, 1);
        assert_eq!(d.admit(mmap, RxPath::Copy, 17, &mut s).path, mmap);
    }

    #[test]
    fn failed_retries_double_the_backoff_up_to_the_cap() {
        let mut s = AutoStats::default();
        let mut d = Demotion::new(1, 10, 40);
        let mmap = RxPath::Mmap;
        let unmapped = UNMAPPED;
        assert!(d.report(mmap, unmapped, 0, &mut s));
        assert_eq!(s.demotions_rx_unmapped, 1);
        let mut now = 0;
        let mut gaps = Vec::new();
        for _ in 0..5 {
            let start = now;
            while !d.admit(mmap, RxPath::Copy, now, &mut s).retry {
                now += 1;
            }
            gaps.push(now - start);
            assert!(d.report(mmap, unmapped, now, &mut s));
        }
        assert_eq!(gaps, vec![10, 20, 40, 40, 40]);
        assert_eq!((s.retries, s.redemotions, s.promotions), (5, 5, 0));
    }

    #[test]
    fn the_fallback_itself_is_never_demoted_away() {
        let mut s = AutoStats::default();
        let mut d = Demotion::new(1, 5, 5);
        d.report(RxPath::Copy, UNMAPPED, 0, &mut s);
        let a = d.admit(RxPath::Copy, RxPath::Copy, 1, &mut s);
        assert_eq!(
            a,
            Admit {
                path: RxPath::Copy,
                retry: false
            }
        );
    }

    proptest! {
        #[test]
        fn every_demotion_is_counted_and_admit_only_returns_wanted_or_fallback(
            events in prop::collection::vec((any::<bool>(), any::<bool>()), 0..400),
        ) {
            let mut s = AutoStats::default();
            let mut d = Demotion::new(3, 7, 50);
            let mut demoted = 0u64;
            for (now, (good, _)) in events.iter().enumerate() {
                let now = now as u64;
                let a = d.admit(RxPath::Uring, RxPath::Copy, now, &mut s);
                prop_assert!(a.path == RxPath::Uring || a.path == RxPath::Copy);
                if a.path == RxPath::Uring {
                    let r = if *good { Report::Good } else { UNMAPPED };
                    if d.report(RxPath::Uring, r, now, &mut s) {
                        demoted += 1;
                    }
                }
            }
            prop_assert_eq!(demoted, s.demotions_rx_unmapped + s.redemotions);
            prop_assert!(s.promotions <= s.retries);
            prop_assert!(s.retries <= s.demotions_rx_unmapped + s.redemotions);
        }
    }
}
