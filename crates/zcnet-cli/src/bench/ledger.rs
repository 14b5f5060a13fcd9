//! What became of every message id of a run's sender: delivered, or reported lost — kept as
//! range sets so a run of millions of messages stays a handful of ranges. Used by both
//! message transports (`udp.rs`, `lm.rs`) to fail a run on a duplicate, a delivery after a
//! loss report, or an id the sender never sent.

use std::collections::BTreeMap;
use std::ops::Range;

/// Disjoint ranges of message ids, merged as they grow (ids mostly come in order, so a run
/// of millions of messages stays a handful of ranges).
#[derive(Debug, Default, Clone)]
pub(crate) struct RangeSet {
    ranges: BTreeMap<u64, u64>,
    count: u64,
}

impl RangeSet {
    /// Whether any id of `r` is in the set.
    pub(crate) fn overlaps(&self, r: &Range<u64>) -> bool {
        self.ranges
            .range(..r.end)
            .next_back()
            .is_some_and(|(_, &end)| end > r.start)
    }

    /// Adds `r`, which must not overlap.
    pub(crate) fn insert(&mut self, r: Range<u64>) {
        debug_assert!(!self.overlaps(&r));
        if r.is_empty() {
            return;
        }
        self.count += r.end - r.start;
        let (mut start, mut end) = (r.start, r.end);
        if let Some((&s, &e)) = self.ranges.range(..start).next_back() {
            if e == start {
                self.ranges.remove(&s);
                start = s;
            }
        }
        if let Some(e) = self.ranges.remove(&end) {
            end = e;
        }
        self.ranges.insert(start, end);
    }

    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// One past the highest id.
    pub(crate) fn end(&self) -> u64 {
        self.ranges.values().next_back().copied().unwrap_or(0)
    }
}

/// What became of each message id of one sender: delivered, or reported lost.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    delivered: RangeSet,
    lost: RangeSet,
}

/// A ledger's final account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Account {
    /// Messages delivered.
    pub received: u64,
    /// Messages never delivered, reported or not.
    pub lost: u64,
    /// Of those, the ones no loss report covered: vanished at the end of the run.
    pub tail: u64,
}

impl Ledger {
    pub(crate) fn deliver(&mut self, id: u64) -> Result<(), String> {
        let r = id..id.saturating_add(1);
        if self.delivered.overlaps(&r) {
            return Err(format!("message {id} was delivered twice"));
        }
        if self.lost.overlaps(&r) {
            return Err(format!(
                "message {id} was delivered after it was reported lost"
            ));
        }
        self.delivered.insert(r);
        Ok(())
    }

    pub(crate) fn lose(&mut self, r: Range<u64>) -> Result<(), String> {
        if self.delivered.overlaps(&r) {
            return Err(format!(
                "messages {}..{} were reported lost, but some were delivered",
                r.start, r.end
            ));
        }
        if self.lost.overlaps(&r) {
            return Err(format!(
                "messages {}..{} were reported lost twice",
                r.start, r.end
            ));
        }
        self.lost.insert(r);
        Ok(())
    }

    /// Messages delivered or reported lost.
    pub(crate) fn resolved(&self) -> u64 {
        self.delivered.count() + self.lost.count()
    }

    /// The account once the sender says it sent `sent` messages (ids `0..sent`).
    pub(crate) fn finish(&self, sent: u64) -> Result<Account, String> {
        if self.delivered.end() > sent {
            return Err(format!(
                "message {} was delivered, but the sender says it sent only {sent}",
                self.delivered.end() - 1
            ));
        }
        if self.lost.end() > sent {
            return Err(format!(
                "message {} was reported lost, but the sender says it sent only {sent}",
                self.lost.end() - 1
            ));
        }
        let received = self.delivered.count();
        let lost = sent - received;
        Ok(Account {
            received,
            lost,
            tail: lost - self.lost.count(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_sets_merge_and_find_overlaps() {
        let mut s = RangeSet::default();
        s.insert(0..1);
        s.insert(1..2);
        s.insert(5..7);
        s.insert(3..5);
        assert_eq!(s.ranges.len(), 2, "{:?}", s.ranges);
        assert_eq!(s.count(), 6);
        assert_eq!(s.end(), 7);
        assert!(s.overlaps(&(1..2)));
        assert!(!s.overlaps(&(2..3)));
        assert!(s.overlaps(&(2..4)));
        assert!(s.overlaps(&(6..100)));
        assert!(!s.overlaps(&(7..100)));
        s.insert(2..3);
        assert_eq!(s.ranges.len(), 1);
        assert_eq!(s.count(), 7);
    }

    #[test]
    fn the_ledger_accounts_for_every_id() {
        let mut l = Ledger::default();
        for id in [0, 1, 2, 4, 7] {
            l.deliver(id).unwrap();
        }
        l.lose(5..7).unwrap();
        assert_eq!(l.resolved(), 7);
        assert!(l.deliver(4).unwrap_err().contains("twice"));
        assert!(l.deliver(5).unwrap_err().contains("reported lost"));
        assert!(l.lose(3..5).unwrap_err().contains("delivered"));
        assert!(l.lose(6..7).unwrap_err().contains("twice"));
        // Ids 3 (never seen) and 8, 9 (after the last one seen) are lost unreported.
        assert_eq!(
            l.finish(10).unwrap(),
            Account {
                received: 5,
                lost: 5,
                tail: 3
            }
        );
        assert!(l.finish(7).unwrap_err().contains("sent only 7"));
        let mut m = Ledger::default();
        m.lose(0..3).unwrap();
        assert!(m.finish(2).unwrap_err().contains("reported lost"));
    }
}
