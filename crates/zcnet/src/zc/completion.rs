//! Bookkeeping of `MSG_ZEROCOPY` completions: which send calls the kernel still needs, and
//! which loaned buffers may go back to their pool. Pure code, no syscalls, so it can be
//! tested against every order the kernel may produce.
//!
//! The kernel numbers successful zero-copy send calls with a wrapping 32-bit counter and
//! reports finished calls as inclusive ranges. Ranges are usually coalesced and in order, but
//! retransmits and teardown can reorder them, so the bookkeeping marks calls done one by one
//! and releases a buffer as soon as *all* calls that referenced it are done, whatever order
//! they finished in. Counter values are unwrapped to `u64` relative to the oldest call still
//! outstanding, which is exact as long as fewer than 2^32 calls are in flight.

pub(crate) use crate::error::RangeError;
use std::collections::VecDeque;

/// What one notification finished.
#[derive(Debug, PartialEq, Eq)]
pub struct Completed<T> {
    /// Loans whose every call is now done, in the order they were sent.
    pub released: Vec<T>,
    /// Calls newly marked done (a duplicate id is not counted twice).
    pub calls: u64,
    /// Bytes of those calls.
    pub bytes: u64,
}

#[derive(Debug, Clone, Copy)]
struct Call {
    bytes: u32,
    done: bool,
}

#[derive(Debug)]
struct Loan<T> {
    first: u64,
    last: u64,
    item: T,
}

/// Calls in flight and the loans (buffers) waiting on them.
#[derive(Debug)]
pub struct Completions<T> {
    /// Id of `calls[0]`.
    base: u64,
    calls: VecDeque<Call>,
    loans: VecDeque<Loan<T>>,
}

impl<T> Default for Completions<T> {
    fn default() -> Self {
        Self::starting_at(0)
    }
}

impl<T> Completions<T> {
    /// Bookkeeping for a fresh socket (the kernel's counter starts at 0).
    pub fn new() -> Self {
        Self::default()
    }

    /// Bookkeeping whose next call id is `first` (tests start near `u32::MAX` to wrap).
    pub fn starting_at(first: u32) -> Self {
        Completions {
            base: first as u64,
            calls: VecDeque::new(),
            loans: VecDeque::new(),
        }
    }

    /// The id the next successful zero-copy call will get (low 32 bits are the kernel's).
    pub fn next_id(&self) -> u64 {
        self.base + self.calls.len() as u64
    }

    /// Records one successful zero-copy send call of `bytes` bytes and returns its id.
    pub fn record_call(&mut self, bytes: usize) -> u64 {
        let id = self.next_id();
        self.calls.push_back(Call {
            bytes: bytes.min(u32::MAX as usize) as u32,
            done: false,
        });
        id
    }

    /// Holds `item` until every call in `first..=last` is done. If they already are (or the
    /// span is empty, `first > last`), the item is handed straight back.
    pub fn lend(&mut self, item: T, first: u64, last: u64) -> Option<T> {
        if first > last || self.span_done(first, last) {
            return Some(item);
        }
        self.loans.push_back(Loan { first, last, item });
        None
    }

    /// Calls not yet completed.
    pub fn calls_in_flight(&self) -> usize {
        self.calls.iter().filter(|c| !c.done).count()
    }

    /// Bytes of the calls not yet completed.
    pub fn bytes_in_flight(&self) -> u64 {
        self.calls
            .iter()
            .filter(|c| !c.done)
            .map(|c| u64::from(c.bytes))
            .sum()
    }

    /// Loans still held.
    pub fn loans_in_flight(&self) -> usize {
        self.loans.len()
    }

    /// True when no call is outstanding.
    pub fn is_idle(&self) -> bool {
        self.calls.is_empty()
    }

    fn unwrap_id(&self, id: u32) -> u64 {
        self.base + id.wrapping_sub(self.base as u32) as u64
    }

    fn span_done(&self, first: u64, last: u64) -> bool {
        (first..=last).all(|id| {
            id < self.base
                || self
                    .calls
                    .get((id - self.base) as usize)
                    .is_none_or(|c| c.done)
        })
    }

    /// Applies the kernel's notification for calls `lo..=hi` (inclusive, wrapping).
    pub fn complete(&mut self, lo: u32, hi: u32) -> Result<Completed<T>, RangeError> {
        let first = self.unwrap_id(lo);
        let last = first + hi.wrapping_sub(lo) as u64;
        if last >= self.next_id() || hi.wrapping_sub(lo) > u32::MAX / 2 {
            return Err(RangeError {
                lo,
                hi,
                oldest: self.base as u32,
                next: self.next_id() as u32,
            });
        }
        let mut calls = 0u64;
        let mut bytes = 0u64;
        for id in first..=last {
            let c = &mut self.calls[(id - self.base) as usize];
            if !c.done {
                c.done = true;
                calls += 1;
                bytes += c.bytes as u64;
            }
        }
        // Release every loan whose calls are all done, in any order.
        let mut released = Vec::new();
        let mut i = 0;
        while i < self.loans.len() {
            let (f, l) = (self.loans[i].first, self.loans[i].last);
            if self.span_done(f, l) {
                if let Some(loan) = self.loans.remove(i) {
                    released.push(loan.item);
                }
            } else {
                i += 1;
            }
        }
        // Forget the done prefix so memory stays bounded by what is in flight.
        while self.calls.front().is_some_and(|c| c.done) {
            self.calls.pop_front();
            self.base += 1;
        }
        Ok(Completed {
            released,
            calls,
            bytes,
        })
    }

    /// Gives back every loan regardless of completions: only for a socket that is gone
    /// (its pages are then owned by nobody but us).
    pub fn abandon(&mut self) -> Vec<T> {
        self.base = self.next_id();
        self.calls.clear();
        self.loans.drain(..).map(|l| l.item).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn in_order_coalesced_range_releases_all() {
        let mut c = Completions::new();
        for i in 0..3u32 {
            let id = c.record_call(100);
            assert_eq!(c.lend(i, id, id), None);
        }
        let done = c.complete(0, 2).unwrap();
        assert_eq!(done.released, vec![0, 1, 2]);
        assert_eq!((done.calls, done.bytes), (3, 300));
        assert!(c.is_idle());
    }

    #[test]
    fn buffer_spanning_partial_sends_waits_for_all_its_calls() {
        let mut c = Completions::new();
        let a = c.record_call(10);
        let b = c.record_call(20);
        assert_eq!(c.lend("buf", a, b), None);
        assert!(c.complete(1, 1).unwrap().released.is_empty());
        assert_eq!(c.complete(0, 0).unwrap().released, vec!["buf"]);
    }

    #[test]
    fn out_of_order_completion_releases_the_later_buffer_first() {
        let mut c = Completions::new();
        let a = c.record_call(1);
        c.lend('a', a, a);
        let b = c.record_call(1);
        c.lend('b', b, b);
        assert_eq!(c.complete(1, 1).unwrap().released, vec!['b']);
        assert_eq!(c.calls_in_flight(), 1);
        assert_eq!(c.complete(0, 0).unwrap().released, vec!['a']);
        assert!(c.is_idle());
    }

    #[test]
    fn range_outside_window_is_an_error() {
        let mut c: Completions<()> = Completions::new();
        c.record_call(1);
        assert!(c.complete(0, 1).is_err());
        assert!(c.complete(5, 5).is_err());
        c.complete(0, 0).unwrap();
        // A stale duplicate of an id already forgotten.
        assert!(c.complete(0, 0).is_err());
    }

    #[test]
    fn wraps_at_u32_max() {
        let mut c = Completions::starting_at(u32::MAX - 1);
        for i in 0..4 {
            let id = c.record_call(1);
            c.lend(i, id, id);
        }
        let d = c.complete(u32::MAX - 1, 1).unwrap();
        assert_eq!(d.released, vec![0, 1, 2, 3]);
    }

    #[test]
    fn lend_of_completed_span_returns_item() {
        let mut c = Completions::new();
        let a = c.record_call(1);
        c.complete(0, 0).unwrap();
        assert_eq!(c.lend(9, a, a), Some(9));
        assert_eq!(c.lend(8, 1, 0), Some(8));
    }

    proptest! {
        /// Any sequence of sends (buffers spanning 1–3 calls), completed by ranges that are
        /// coalesced arbitrarily and delivered in any order, starting anywhere on the 32-bit
        /// counter: every buffer comes back exactly once, only after all its calls are done,
        /// and bytes add up.
        #[test]
        fn any_order_any_coalescing_releases_each_loan_once(
            start in prop_oneof![Just(0u32), Just(u32::MAX - 5), any::<u32>()],
            spans in proptest::collection::vec(1usize..4, 1..40),
            cuts in proptest::collection::vec(any::<bool>(), 0..120),
            order in any::<u64>(),
        ) {
            let mut c = Completions::starting_at(start);
            let mut total_bytes = 0u64;
            let mut loan_spans = Vec::new();
            for (i, &n) in spans.iter().enumerate() {
                let first = c.next_id();
                for k in 0..n {
                    let b = i * 7 + k + 1;
                    total_bytes += b as u64;
                    c.record_call(b);
                }
                let last = c.next_id() - 1;
                loan_spans.push((first, last));
                prop_assert_eq!(c.lend(i, first, last), None);
            }
            let ncalls = c.next_id() - start as u64;
            // Cut [0, ncalls) into ranges where `cuts` says so.
            let mut ranges = Vec::new();
            let mut lo = 0u64;
            for id in 0..ncalls {
                let cut = cuts.get(id as usize).copied().unwrap_or(true);
                if cut || id == ncalls - 1 {
                    ranges.push((lo, id));
                    lo = id + 1;
                }
            }
            // Deterministic shuffle from `order`.
            let mut state = order | 1;
            for i in (1..ranges.len()).rev() {
                state ^= state << 13; state ^= state >> 7; state ^= state << 17;
                ranges.swap(i, (state % (i as u64 + 1)) as usize);
            }
            let mut seen = vec![false; spans.len()];
            let mut done_ids = std::collections::HashSet::new();
            let mut bytes = 0u64;
            for (lo, hi) in ranges {
                let abs_lo = start as u64 + lo;
                let abs_hi = start as u64 + hi;
                let d = c.complete(abs_lo as u32, abs_hi as u32).unwrap();
                for id in abs_lo..=abs_hi { done_ids.insert(id); }
                bytes += d.bytes;
                for i in d.released {
                    prop_assert!(!seen[i], "loan {} released twice", i);
                    seen[i] = true;
                    let (f, l) = loan_spans[i];
                    prop_assert!((f..=l).all(|id| done_ids.contains(&id)), "loan {} released early", i);
                }
            }
            prop_assert!(seen.iter().all(|&s| s));
            prop_assert_eq!(bytes, total_bytes);
            prop_assert!(c.is_idle());
            prop_assert_eq!(c.loans_in_flight(), 0);
        }
    }
}
