//! Per-stream hysteresis: a stream whose operation sizes hover around a crossover must not
//! flap between paths, since each switch has a cost of its own (a `zerocopy` socket's
//! outstanding completions, an io_uring's registered buffers, cold caches on the new path).
//!
//! Rule: the current path changes only after `threshold` consecutive operations preferred the
//! same other path. Any operation that prefers the current path resets the count. So two
//! switches are always at least `threshold` operations apart, and sizes alternating across a
//! crossover never switch at all. A demoted path is left at once with `Hysteresis::force`
//! (a path that no longer pays must not be kept for `threshold` more operations).

use super::{AutoPath, AutoStats};

/// One stream's current path and the run of operations that preferred another.
#[derive(Debug, Clone)]
pub(crate) struct Hysteresis<P> {
    current: P,
    pending: Option<(P, u32)>,
    threshold: u32,
}

impl<P: AutoPath> Hysteresis<P> {
    /// Starts on `initial`; a switch needs `threshold` consecutive votes (at least 1, which
    /// means no hysteresis).
    pub(crate) fn new(initial: P, threshold: u32) -> Self {
        Hysteresis {
            current: initial,
            pending: None,
            threshold: threshold.max(1),
        }
    }

    /// The path the stream is on (tests read it).
    #[cfg(test)]
    pub(crate) fn current(&self) -> P {
        self.current
    }

    /// One operation preferred `preferred`: returns the path it takes, counting holds and
    /// switches in `stats`.
    pub(crate) fn observe(&mut self, preferred: P, stats: &mut AutoStats) -> P {
        if preferred == self.current {
            self.pending = None;
            return self.current;
        }
        let votes = match self.pending {
            Some((p, n)) if p == preferred => n + 1,
            _ => 1,
        };
        if votes >= self.threshold {
            self.current = preferred;
            self.pending = None;
            stats.switches += 1;
        } else {
            self.pending = Some((preferred, votes));
            stats.held_by_hysteresis += 1;
        }
        self.current
    }

    /// Moves to `path` at once (the current path was demoted), counted as a switch (tests).
    #[cfg(test)]
    pub(crate) fn force(&mut self, path: P, stats: &mut AutoStats) {
        self.pending = None;
        if path != self.current {
            self.current = path;
            stats.switches += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auto::profile::{Measurement, Spread};
    use crate::auto::Chooser;
    use crate::path::TxPath;
    use proptest::prelude::*;

    #[test]
    fn switches_after_threshold_consecutive_votes() {
        let mut s = AutoStats::default();
        let mut h = Hysteresis::new(TxPath::Copy, 3);
        assert_eq!(h.observe(TxPath::Zerocopy, &mut s), TxPath::Copy);
        assert_eq!(h.observe(TxPath::Zerocopy, &mut s), TxPath::Copy);
        assert_eq!(h.observe(TxPath::Zerocopy, &mut s), TxPath::Zerocopy);
        assert_eq!((s.switches, s.held_by_hysteresis), (1, 2));
        // A vote for a third path restarts the run.
        assert_eq!(h.observe(TxPath::Copy, &mut s), TxPath::Zerocopy);
        assert_eq!(h.observe(TxPath::Uring, &mut s), TxPath::Zerocopy);
        assert_eq!(h.observe(TxPath::Copy, &mut s), TxPath::Zerocopy);
        assert_eq!(h.observe(TxPath::Copy, &mut s), TxPath::Zerocopy);
        assert_eq!(h.observe(TxPath::Copy, &mut s), TxPath::Copy);
        assert_eq!(s.switches, 2);
        h.force(TxPath::Uring, &mut s);
        assert_eq!((h.current(), s.switches), (TxPath::Uring, 3));
        h.force(TxPath::Uring, &mut s);
        assert_eq!(s.switches, 3);
    }

    #[test]
    fn alternating_sizes_around_a_crossover_do_not_flap() {
        let rows: Vec<_> = [(4096u64, 1.0, 2.0), (1 << 20, 1.0, 0.2)]
            .into_iter()
            .flat_map(|(size, copy, zc)| {
                [(TxPath::Copy, copy), (TxPath::Zerocopy, zc)].map(|(path, m)| Measurement {
                    path,
                    size,
                    touch: false,
                    cpu_s_per_gib: Spread {
                        median: m,
                        lo: m * 0.95,
                        hi: m * 1.05,
                    },
                    zc_fraction: None,
                })
            })
            .collect();
        let chooser = Chooser::from_measurements(&rows, false);
        let x = chooser.crossovers()[0].size;
        let (below, above) = (x - x / 4, x + x / 4);
        assert_ne!(
            chooser.choose(below, true).path,
            chooser.choose(above, true).path
        );
        let mut s = AutoStats::default();
        let mut h = Hysteresis::new(TxPath::Copy, 4);
        for i in 0..1000 {
            let size = if i % 2 == 0 { below } else { above };
            let choice = chooser.choose(size, true);
            s.record_choice(&choice);
            assert_eq!(h.observe(choice.path, &mut s), TxPath::Copy);
        }
        assert_eq!(s.switches, 0);
        assert_eq!((s.decisions, s.held_by_hysteresis), (1000, 500));
        // A run of large operations does switch.
        for _ in 0..4 {
            h.observe(chooser.choose(above, true).path, &mut s);
        }
        assert_eq!((h.current(), s.switches), (TxPath::Zerocopy, 1));
    }

    proptest! {
        #[test]
        fn switches_are_at_least_threshold_apart(
            threshold in 1u32..8,
            prefs in prop::collection::vec(prop::sample::select(TxPath::ALL.to_vec()), 0..300),
        ) {
            let mut s = AutoStats::default();
            let mut h = Hysteresis::new(TxPath::Copy, threshold);
            let mut last_switch: Option<usize> = None;
            for (i, &p) in prefs.iter().enumerate() {
                let before = h.current();
                let now = h.observe(p, &mut s);
                prop_assert!(now == before || now == p);
                if now != before {
                    let since = last_switch.map_or(i + 1, |j| i - j);
                    prop_assert!(since >= threshold as usize, "switch at {i} after {since}");
                    last_switch = Some(i);
                }
            }
            prop_assert!(s.switches <= prefs.len() as u64 / u64::from(threshold));
        }
    }
}
