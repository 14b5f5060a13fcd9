//! Which application pages are write-protected because a zero-copy send may still read them,
//! and how many sends hold each one. Pure bookkeeping, no syscalls: the syscalls are made by
//! the engine (`crate::cow`) under the same lock, driven by what this table says.
//!
//! A page can be in flight in several sends at once (the application sends the same buffer
//! twice, or to two sockets), so each page carries a count; its protection is lifted only
//! when the last send holding it completes. A write fault gives the writer a private copy
//! (the Solaris copy-on-write); the page stays counted, since the kernel still reads the
//! *original*, but no longer protected, so later writes cost nothing.
//!
//! Allocation discipline: the fault handler and every holder of the lock must not allocate.
//! An application thread can take a write fault while it holds the allocator's lock (glibc's
//! `free` writes list pointers into the freed chunk, which may be a page still in flight) and
//! then sleeps until the handler resolves it; anyone who then waits for the allocator while
//! holding our lock deadlocks the handler. So the table never grows under the lock: callers
//! check [`Registry::spare`] and rebuild it bigger outside (see `sys::cow`), and removals
//! never free (a `HashMap` keeps its storage).

use std::collections::HashMap;

/// State of one protected (or formerly protected) page, keyed by page number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PageState {
    /// Sends whose completion is still outstanding and that named this page.
    pub holders: u32,
    /// The page is write-protected right now (set by a protect, cleared by a
    /// copy-on-write or when the page is found gone).
    pub protected: bool,
    /// Write faults on this page resolved by a private copy since it was first protected.
    pub faults: u32,
    /// Pages copied for it (faults, plus copies made because `mremap` moved it).
    pub copies: u32,
    /// Nanoseconds spent resolving those faults (from reading the message to waking the
    /// writer).
    pub fault_ns: u64,
    /// The program gave the page back (`free`, `munmap`, `madvise`, `mremap`) while a send
    /// still held it, and its protection and registration were dropped then
    /// ([`Registry::let_go`]): the last release has nothing left to lift. A new hold (the
    /// address reused and sent again) makes it ours to lift again.
    pub gone: bool,
}

/// What a release finished: the counters of pages whose last holder completed, to be
/// added to the stats of the sender that released them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Released {
    /// Pages whose last holder completed (their protection is lifted).
    pub pages: u64,
    /// Write faults those pages took while in flight.
    pub faults: u64,
    /// Pages copied for them.
    pub copies: u64,
    /// Time spent resolving those faults.
    pub fault_ns: u64,
}

impl Released {
    /// Adds `other` into `self`.
    pub fn add(&mut self, other: Released) {
        self.pages += other.pages;
        self.faults += other.faults;
        self.copies += other.copies;
        self.fault_ns += other.fault_ns;
    }
}

/// Page number → state, for every page some send still holds.
#[derive(Debug, Default)]
pub struct Registry {
    pages: HashMap<usize, PageState>,
    protected: usize,
}

impl Registry {
    /// An empty table with room for `pages` entries.
    pub fn with_capacity(pages: usize) -> Self {
        Registry {
            pages: HashMap::with_capacity(pages),
            protected: 0,
        }
    }

    /// Entries that can be added without the table allocating.
    pub fn spare(&self) -> usize {
        self.pages.capacity() - self.pages.len()
    }

    /// Pages held by some send.
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    /// True when no page is held.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Pages write-protected right now.
    pub fn protected_pages(&self) -> usize {
        self.protected
    }

    /// Moves every entry into a new table with room for `room` more (the allocation is the
    /// caller's, made before taking the lock); returns the old, empty table so the caller
    /// can free it after unlocking.
    pub fn rehome(&mut self, mut fresh: HashMap<usize, PageState>) -> HashMap<usize, PageState> {
        fresh.extend(self.pages.drain());
        std::mem::replace(&mut self.pages, fresh)
    }

    /// Takes one hold on each of `count` pages from `first`. Never allocates if
    /// [`Registry::spare`] `>= count`; panics in debug builds otherwise.
    pub fn hold(&mut self, first: usize, count: usize) {
        debug_assert!(self.spare() >= count, "registry grown under its lock");
        for p in first..first + count {
            let s = self.pages.entry(p).or_default();
            s.holders += 1;
            s.gone = false;
        }
    }

    /// True if any of `count` pages from `first` is held by a send and still ours to lift
    /// (not [`PageState::gone`]).
    pub fn any_held(&self, first: usize, count: usize) -> bool {
        !self.pages.is_empty()
            && (first..first + count).any(|p| self.pages.get(&p).is_some_and(|s| !s.gone))
    }

    /// The program gives back `count` pages from `first` while sends may still hold some:
    /// every held page that is not [`PageState::gone`] yet becomes gone and unprotected
    /// (its holds stay: the sends' completions still come, and a new send of the same
    /// address must not be lifted by an old one's). `act(first, count, protected)` is
    /// called for each maximal run of such pages that are all protected, or all not —
    /// what the engine must do to them first. Returns the pages let go.
    pub fn let_go(
        &mut self,
        first: usize,
        count: usize,
        mut act: impl FnMut(usize, usize, bool),
    ) -> u64 {
        if self.pages.is_empty() {
            return 0;
        }
        let mut n = 0;
        let mut run: Option<(usize, usize, bool)> = None;
        for p in first..first + count {
            let Some(s) = self.pages.get_mut(&p) else {
                continue;
            };
            if s.gone {
                continue;
            }
            let prot = s.protected;
            s.gone = true;
            if s.protected {
                s.protected = false;
                self.protected -= 1;
            }
            n += 1;
            run = match run {
                Some((f, c, pr)) if f + c == p && pr == prot => Some((f, c + 1, pr)),
                Some((f, c, pr)) => {
                    act(f, c, pr);
                    Some((p, 1, prot))
                }
                None => Some((p, 1, prot)),
            };
        }
        if let Some((f, c, pr)) = run {
            act(f, c, pr);
        }
        n
    }

    /// Every maximal run of pages some send holds and that are still ours to lift (not
    /// [`PageState::gone`]), as (first page, count), in address order.
    pub fn held_runs(&self) -> Vec<(usize, usize)> {
        let mut pages: Vec<usize> = self
            .pages
            .iter()
            .filter(|(_, s)| !s.gone)
            .map(|(p, _)| *p)
            .collect();
        pages.sort_unstable();
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for p in pages {
            match runs.last_mut() {
                Some((f, c)) if *f + *c == p => *c += 1,
                _ => runs.push((p, 1)),
            }
        }
        runs
    }

    /// Marks `count` pages from `first` as write-protected (after the protect call).
    pub fn mark_protected(&mut self, first: usize, count: usize) {
        for p in first..first + count {
            if let Some(s) = self.pages.get_mut(&p) {
                if !s.protected {
                    s.protected = true;
                    self.protected += 1;
                }
            }
        }
    }

    /// The state of page `page`, if some send holds it.
    pub fn get(&self, page: usize) -> Option<PageState> {
        self.pages.get(&page).copied()
    }

    /// True if any of `count` pages from `first` is write-protected now.
    pub fn any_protected(&self, first: usize, count: usize) -> bool {
        self.protected > 0
            && (first..first + count).any(|p| self.pages.get(&p).is_some_and(|s| s.protected))
    }

    /// Records a private copy of `page` made for a write fault that took `ns`; the page is
    /// no longer protected. `fault` is false for copies not caused by a fault (`mremap`).
    pub fn note_copy(&mut self, page: usize, fault: bool, ns: u64) {
        if let Some(s) = self.pages.get_mut(&page) {
            if s.protected {
                s.protected = false;
                self.protected -= 1;
            }
            s.copies += 1;
            if fault {
                s.faults += 1;
                s.fault_ns += ns;
            }
        }
    }

    /// Records that `page` is no longer protected at its address (zapped, unmapped, or
    /// moved away by `mremap`) without a copy.
    pub fn note_unprotected(&mut self, page: usize) {
        if let Some(s) = self.pages.get_mut(&page) {
            if s.protected {
                s.protected = false;
                self.protected -= 1;
            }
        }
    }

    /// Drops one hold on every page of each span `(first, count)`. `spans` should be
    /// sorted by `first` so that neighbouring spans coalesce: pages whose last hold went
    /// are passed to `lift(first, count)` in maximal runs of consecutive pages, one call per
    /// run (one ioctl for the caller). Releasing a page nobody holds is ignored.
    pub fn release(
        &mut self,
        spans: impl IntoIterator<Item = (usize, usize)>,
        mut lift: impl FnMut(usize, usize),
    ) -> Released {
        let mut out = Released::default();
        let mut run: Option<(usize, usize)> = None;
        for (first, count) in spans {
            for p in first..first + count {
                let Some(s) = self.pages.get_mut(&p) else {
                    continue;
                };
                s.holders = s.holders.saturating_sub(1);
                if s.holders > 0 {
                    continue;
                }
                let s = *s;
                self.pages.remove(&p);
                if s.protected {
                    self.protected -= 1;
                }
                out.pages += 1;
                out.faults += u64::from(s.faults);
                out.copies += u64::from(s.copies);
                out.fault_ns += s.fault_ns;
                if s.gone {
                    // Given back by the program: nothing of ours is left there to lift.
                    continue;
                }
                run = match run {
                    Some((f, n)) if f + n == p => Some((f, n + 1)),
                    Some((f, n)) => {
                        lift(f, n);
                        Some((p, 1))
                    }
                    None => Some((p, 1)),
                };
            }
        }
        if let Some((f, n)) = run {
            lift(f, n);
        }
        out
    }

    /// Forgets every page (a forked child: the table describes the parent's memory).
    pub fn clear(&mut self) {
        self.pages.clear();
        self.protected = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn last_holder_lifts_and_runs_coalesce_across_spans() {
        let mut r = Registry::with_capacity(64);
        r.hold(10, 4);
        r.mark_protected(10, 4);
        r.hold(14, 2);
        r.mark_protected(14, 2);
        r.hold(12, 1); // a second send of page 12
        assert_eq!(r.protected_pages(), 6);
        let mut runs = Vec::new();
        let rel = r.release([(10, 4), (14, 2)], |f, n| runs.push((f, n)));
        // Page 12 is still held: 10..12 and 13..16 are lifted, 13..16 in one run.
        assert_eq!(runs, vec![(10, 2), (13, 3)]);
        assert_eq!(rel.pages, 5);
        assert!(r.any_protected(12, 1));
        assert!(!r.any_protected(13, 1));
        runs.clear();
        r.release([(12, 1)], |f, n| runs.push((f, n)));
        assert_eq!(runs, vec![(12, 1)]);
        assert!(r.is_empty());
        assert_eq!(r.protected_pages(), 0);
    }

    #[test]
    fn copies_unprotect_and_are_reported_by_the_last_release() {
        let mut r = Registry::with_capacity(8);
        r.hold(0, 2);
        r.mark_protected(0, 2);
        r.note_copy(1, true, 15_000);
        r.note_copy(1, true, 5_000); // a stale second fault on the same page
        r.note_copy(0, false, 0);
        assert_eq!(r.protected_pages(), 0);
        let rel = r.release([(0, 2)], |_, _| {});
        assert_eq!(
            rel,
            Released {
                pages: 2,
                faults: 2,
                copies: 3,
                fault_ns: 20_000
            }
        );
    }

    #[test]
    fn releasing_unknown_pages_is_ignored_and_rehome_keeps_entries() {
        let mut r = Registry::with_capacity(2);
        r.hold(5, 2);
        let old = r.rehome(HashMap::with_capacity(100));
        assert!(old.is_empty());
        assert!(r.spare() >= 98);
        assert_eq!(r.get(5).unwrap().holders, 1);
        let mut runs = Vec::new();
        r.release([(100, 3), (5, 2)], |f, n| runs.push((f, n)));
        assert_eq!(runs, vec![(5, 2)]);
    }

    #[test]
    fn pages_let_go_are_never_lifted_by_their_old_holds_but_by_a_new_ones_last() {
        let mut r = Registry::with_capacity(64);
        r.hold(10, 6);
        r.mark_protected(10, 6);
        r.note_copy(12, true, 1_000); // a private copy: held, no longer protected
        let mut runs = Vec::new();
        let n = r.let_go(9, 6, |f, c, p| runs.push((f, c, p)));
        // Pages 10..15 were held: 10..12 protected, 12 copied, 13..15 protected.
        assert_eq!(n, 5);
        assert_eq!(runs, vec![(10, 2, true), (12, 1, false), (13, 2, true)]);
        assert_eq!(r.protected_pages(), 1, "page 15 only");
        assert!(!r.any_protected(10, 5));
        assert!(!r.any_held(10, 5) && r.any_held(15, 1));
        assert_eq!(r.let_go(10, 5, |_, _, _| panic!("let go twice")), 0);
        // The address is reused and sent again: the new hold makes page 11 ours again.
        r.hold(11, 1);
        r.mark_protected(11, 1);
        runs.clear();
        let rel = r.release([(10, 6)], |f, c| runs.push((f, c, true)));
        assert_eq!(runs, vec![(15, 1, true)], "gone pages are not lifted");
        assert_eq!(rel.pages, 5, "page 11 is still held");
        assert_eq!(rel.faults, 1);
        runs.clear();
        r.release([(11, 1)], |f, c| runs.push((f, c, true)));
        assert_eq!(
            runs,
            vec![(11, 1, true)],
            "the new send's own release lifts it"
        );
        assert!(r.is_empty());
        assert_eq!(r.protected_pages(), 0);
    }

    proptest! {
        /// Any interleaving of holds and releases: a page is lifted exactly when its last
        /// hold goes, exactly once per hold cycle, and runs never overlap or touch held pages.
        #[test]
        fn lifted_exactly_when_last_hold_goes(
            spans in proptest::collection::vec((0usize..40, 1usize..6), 1..30),
            order in any::<u64>(),
        ) {
            let mut r = Registry::with_capacity(256);
            let mut holds = vec![0u32; 64];
            for &(f, n) in &spans {
                r.hold(f, n);
                r.mark_protected(f, n);
                holds[f..f + n].iter_mut().for_each(|h| *h += 1);
            }
            let mut idx: Vec<usize> = (0..spans.len()).collect();
            let mut s = order | 1;
            for i in (1..idx.len()).rev() {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                idx.swap(i, (s % (i as u64 + 1)) as usize);
            }
            let mut lifted = vec![0u32; 64];
            for i in idx {
                let (f, n) = spans[i];
                let mut runs = Vec::new();
                r.release([(f, n)], |a, b| runs.push((a, b)));
                holds[f..f + n].iter_mut().for_each(|h| *h -= 1);
                for (a, b) in runs {
                    for p in a..a + b {
                        prop_assert_eq!(holds[p], 0, "page {} lifted while held", p);
                        lifted[p] += 1;
                    }
                }
            }
            for (p, &l) in lifted.iter().enumerate() {
                let touched = spans.iter().any(|&(f, n)| (f..f + n).contains(&p));
                prop_assert_eq!(l, u32::from(touched));
            }
            prop_assert!(r.is_empty());
            prop_assert_eq!(r.protected_pages(), 0);
        }
    }
}
