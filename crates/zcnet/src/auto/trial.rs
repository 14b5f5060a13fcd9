//! Which receive path a connection without a profile keeps: each candidate in turn, measured
//! against copy on the connection itself, and the cheapest kept.
//!
//! Why: without a profile nothing measured says which receive path pays on this route, and
//! the answer differs by route and by sitting (over veth at 16 KiB the mapping receiver,
//! mapping nothing from a copying sender, has read 20 % under copy in one sitting and level
//! with it in another; on loopback `uring` was the one within noise of the best). One
//! candidate tried blind can only be kept or dropped; trying each, one after another, with
//! the run-time check's own comparison ([`super::cost`]: a window on the candidate, one
//! settling, one on copy, in the receiving thread's CPU clock) lets the connection find the
//! one that pays here. Each candidate gets [`Trial::new`]'s `per` comparisons; the one with
//! the lowest mean cost relative to copy is kept, and from then on the ordinary cost check
//! keeps it only while it is no dearer than copy.
//!
//! Pure: verdicts in, the wanted path out. The trial is bounded — `per` comparisons of each
//! candidate, once per connection — and what it did is counted by the caller.

use super::AutoPath;

/// What a recorded comparison changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step<P> {
    /// Keep measuring the current candidate.
    Stay,
    /// The current candidate has its comparisons: measure this one next.
    Next(P),
    /// Every candidate is measured: this one is kept.
    Pick(P),
}

/// One connection's trial of its candidate receive paths (see the module docs).
#[derive(Debug, Clone)]
pub struct Trial<P> {
    candidates: Vec<P>,
    /// Per candidate, each comparison's cost over copy's (`path ns/B ÷ copy ns/B`).
    ratios: Vec<Vec<f64>>,
    per: usize,
    at: usize,
    pick: Option<P>,
}

impl<P: AutoPath> Trial<P> {
    /// Tries `candidates` in order, `per` comparisons each (at least 1). With a single
    /// candidate it is picked at once: there is nothing to choose between, and the cost
    /// check alone decides whether it stays.
    pub fn new(candidates: &[P], per: usize) -> Self {
        let candidates: Vec<P> = if candidates.is_empty() {
            vec![P::DEFAULT]
        } else {
            candidates.to_vec()
        };
        let pick = (candidates.len() == 1).then_some(candidates[0]);
        Trial {
            ratios: vec![Vec::new(); candidates.len()],
            candidates,
            per: per.max(1),
            at: 0,
            pick,
        }
    }

    /// The path the connection should want now: the candidate under trial, or the pick.
    pub fn wanted(&self) -> P {
        self.pick.unwrap_or(self.candidates[self.at])
    }

    /// The kept path, once the trial is over.
    pub fn picked(&self) -> Option<P> {
        self.pick
    }

    /// Records one comparison of `path` (ns per byte) against copy's just after; a
    /// comparison of a path that is not under trial (one begun before a switch, or after
    /// the pick) changes nothing.
    pub fn record(&mut self, path: P, path_ns_per_byte: f64, copy_ns_per_byte: f64) -> Step<P> {
        if self.pick.is_some() || path != self.candidates[self.at] {
            return Step::Stay;
        }
        if !(copy_ns_per_byte > 0.0 && path_ns_per_byte.is_finite()) {
            // A clock that did not move says nothing; measure again.
            return Step::Stay;
        }
        self.ratios[self.at].push(path_ns_per_byte / copy_ns_per_byte);
        if self.ratios[self.at].len() < self.per {
            return Step::Stay;
        }
        if self.at + 1 < self.candidates.len() {
            self.at += 1;
            return Step::Next(self.candidates[self.at]);
        }
        let best = (0..self.candidates.len())
            .min_by(|&a, &b| mean(&self.ratios[a]).total_cmp(&mean(&self.ratios[b])))
            .unwrap_or(0);
        let p = self.candidates[best];
        self.pick = Some(p);
        Step::Pick(p)
    }

    /// The mean cost over copy's of each candidate measured so far, in trial order.
    pub fn ratios(&self) -> Vec<(P, Option<f64>)> {
        self.candidates
            .iter()
            .zip(&self.ratios)
            .map(|(&p, r)| (p, (!r.is_empty()).then(|| mean(r))))
            .collect()
    }
}

/// The mean of a candidate's ratios (infinite before its first: never picked unmeasured).
fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::INFINITY;
    }
    v.iter().sum::<f64>() / v.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::path::RxPath;

    #[test]
    fn each_candidate_gets_its_comparisons_then_the_cheapest_is_kept() {
        let mut t = Trial::new(&[RxPath::Uring, RxPath::Mmap], 2);
        assert_eq!(t.wanted(), RxPath::Uring);
        assert_eq!(t.record(RxPath::Uring, 1.02, 1.0), Step::Stay);
        assert_eq!(t.record(RxPath::Uring, 0.98, 1.0), Step::Next(RxPath::Mmap));
        assert_eq!(t.wanted(), RxPath::Mmap);
        assert_eq!(t.picked(), None);
        assert_eq!(t.record(RxPath::Mmap, 0.8, 1.0), Step::Stay);
        assert_eq!(t.record(RxPath::Mmap, 0.9, 1.0), Step::Pick(RxPath::Mmap));
        assert_eq!((t.wanted(), t.picked()), (RxPath::Mmap, Some(RxPath::Mmap)));
        // After the pick nothing moves it: the cost check alone keeps or leaves it.
        assert_eq!(t.record(RxPath::Mmap, 5.0, 1.0), Step::Stay);
        assert_eq!(t.wanted(), RxPath::Mmap);
    }

    #[test]
    fn the_first_candidate_is_kept_when_it_is_cheaper_and_ties_go_to_the_earlier() {
        let mut t = Trial::new(&[RxPath::Uring, RxPath::Mmap], 1);
        assert_eq!(t.record(RxPath::Uring, 0.7, 1.0), Step::Next(RxPath::Mmap));
        assert_eq!(t.record(RxPath::Mmap, 1.4, 1.0), Step::Pick(RxPath::Uring));
        let mut t = Trial::new(&[RxPath::Uring, RxPath::Mmap], 1);
        t.record(RxPath::Uring, 1.0, 2.0);
        assert_eq!(t.record(RxPath::Mmap, 2.0, 4.0), Step::Pick(RxPath::Uring));
    }

    #[test]
    fn every_comparison_of_a_candidate_counts_not_only_its_best() {
        let mut t = Trial::new(&[RxPath::Uring, RxPath::Mmap], 2);
        for r in [0.5, 1.5] {
            t.record(RxPath::Uring, r, 1.0);
        }
        for r in [0.75, 0.75] {
            t.record(RxPath::Mmap, r, 1.0);
        }
        assert_eq!(t.picked(), Some(RxPath::Mmap));
        assert_eq!(
            t.ratios(),
            vec![(RxPath::Uring, Some(1.0)), (RxPath::Mmap, Some(0.75))]
        );
    }

    #[test]
    fn comparisons_of_another_path_or_of_a_stopped_clock_are_not_counted() {
        let mut t = Trial::new(&[RxPath::Uring, RxPath::Mmap], 1);
        assert_eq!(t.record(RxPath::Mmap, 0.1, 1.0), Step::Stay);
        assert_eq!(t.record(RxPath::Uring, 1.0, 0.0), Step::Stay);
        assert_eq!(t.record(RxPath::Uring, f64::NAN, 1.0), Step::Stay);
        assert_eq!(t.wanted(), RxPath::Uring);
        assert_eq!(t.ratios()[0].1, None);
    }

    #[test]
    fn one_candidate_or_none_is_picked_at_once() {
        let t = Trial::new(&[RxPath::Uring], 2);
        assert_eq!(t.picked(), Some(RxPath::Uring));
        let t: Trial<RxPath> = Trial::new(&[], 2);
        assert_eq!(t.picked(), Some(RxPath::Copy));
    }
}
