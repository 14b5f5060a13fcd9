//! Mappings found unprotectable, remembered so the next send from them copies at once.
//!
//! A program that sends from memory the protection cannot cover asks again on every call:
//! iperf3's buffer is a `MAP_PRIVATE` mapping of a temporary file, whose pages turn
//! anonymous when written, so `PAGEMAP_SCAN` passes them; only `UFFDIO_REGISTER` refuses
//! (`EINVAL`: userfaultfd covers anonymous, shmem and hugetlb mappings). Asking cost a
//! page-table walk of the span, a hold and a release of every page in the table and the
//! failing `ioctl`: about 5 % of iperf3's samples sending 1 MiB writes between namespaces,
//! and its `auto` row read that much above `copy` (docs/measurements/preload.md).
//!
//! A remembered mapping may be replaced (unmapped, and anonymous memory mapped at its
//! address). Then its spans copy that could have been protected — a counted fallback, never
//! a wrong byte — until the entry has answered [`USES`] times and is asked about afresh.

/// Answers an entry gives before the mapping is looked at again.
pub const USES: u32 = 256;

/// Mappings remembered at most; a new one replaces the oldest.
pub const CAPACITY: usize = 16;

/// Address ranges `[start, end)` known not to be protectable.
#[derive(Debug, Default)]
pub struct Refused {
    entries: Vec<Entry>,
    /// Insertion counter, to replace the oldest entry when full.
    clock: u64,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    start: usize,
    end: usize,
    uses_left: u32,
    born: u64,
}

impl Refused {
    /// An empty set.
    pub const fn new() -> Refused {
        Refused {
            entries: Vec::new(),
            clock: 0,
        }
    }

    /// Whether `start..end` overlaps a remembered mapping: one use of that entry, which is
    /// forgotten when it has none left.
    pub fn covers(&mut self, start: usize, end: usize) -> bool {
        let Some(i) = self
            .entries
            .iter()
            .position(|e| e.start < end && start < e.end)
        else {
            return false;
        };
        let e = &mut self.entries[i];
        e.uses_left -= 1;
        if e.uses_left == 0 {
            self.entries.swap_remove(i);
        }
        true
    }

    /// Remembers `start..end` as unprotectable, with [`USES`] answers. A range already
    /// known is renewed.
    pub fn add(&mut self, start: usize, end: usize) {
        if start >= end {
            return;
        }
        self.clock += 1;
        let born = self.clock;
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.start == start && e.end == end)
        {
            e.uses_left = USES;
            e.born = born;
            return;
        }
        let entry = Entry {
            start,
            end,
            uses_left: USES,
            born,
        };
        if self.entries.len() < CAPACITY {
            self.entries.push(entry);
        } else if let Some(oldest) = self.entries.iter_mut().min_by_key(|e| e.born) {
            *oldest = entry;
        }
    }

    /// Mappings remembered now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_overlapping_a_remembered_mapping_is_refused_and_others_are_not() {
        let mut r = Refused::new();
        r.add(0x1000, 0x5000);
        assert!(r.covers(0x1000, 0x5000));
        assert!(r.covers(0x4000, 0x6000), "overlapping its end");
        assert!(r.covers(0x0, 0x2000), "overlapping its start");
        assert!(!r.covers(0x5000, 0x6000), "adjacent after");
        assert!(!r.covers(0x0, 0x1000), "adjacent before");
        assert!(!r.covers(0x9000, 0xa000));
    }

    #[test]
    fn an_entry_is_asked_about_afresh_after_its_uses() {
        let mut r = Refused::new();
        r.add(0x1000, 0x2000);
        for i in 0..USES {
            assert!(r.covers(0x1000, 0x2000), "use {i}");
        }
        assert!(r.is_empty());
        assert!(!r.covers(0x1000, 0x2000));
        r.add(0x1000, 0x2000);
        r.covers(0x1000, 0x2000);
        r.add(0x1000, 0x2000);
        assert_eq!(r.len(), 1, "renewed, not added twice");
        for _ in 0..USES {
            assert!(r.covers(0x1000, 0x2000));
        }
        assert!(
            !r.covers(0x1000, 0x2000),
            "renewal restored exactly USES answers"
        );
    }

    #[test]
    fn the_oldest_entry_makes_room_when_full() {
        let mut r = Refused::new();
        let page = 0x1000;
        for i in 0..CAPACITY + 1 {
            r.add(i * 2 * page, i * 2 * page + page);
        }
        assert_eq!(r.len(), CAPACITY);
        assert!(!r.covers(0, page), "the first was replaced");
        for i in 1..CAPACITY + 1 {
            assert!(r.covers(i * 2 * page, i * 2 * page + page), "entry {i}");
        }
    }

    #[test]
    fn empty_ranges_are_not_remembered() {
        let mut r = Refused::new();
        r.add(0x2000, 0x2000);
        r.add(0x3000, 0x1000);
        assert!(r.is_empty());
    }
}
