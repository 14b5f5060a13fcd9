//! A global allocator for tests that records, per thread, the largest single allocation
//! since the last [`PeakAlloc::reset`], so a property test can assert that a parser fed
//! hostile input never allocates beyond its frame limit. It forwards every call to
//! [`std::alloc::System`] and adds only a thread-local maximum (a `const`-initialised `Cell`,
//! which itself never allocates).
//!
//! Not part of the supported API (hence `#[doc(hidden)]` on the module). Use:
//! `#[global_allocator] static A: zcnet_sys::peak_alloc::PeakAlloc = zcnet_sys::peak_alloc::PeakAlloc;`

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

/// [`System`], recording the largest allocation per thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct PeakAlloc;

impl PeakAlloc {
    /// Forgets this thread's peak.
    pub fn reset() {
        let _ = PEAK.try_with(|p| p.set(0));
    }

    /// The largest single allocation (or reallocation) this thread made since the last reset.
    pub fn peak() -> usize {
        PEAK.try_with(|p| p.get()).unwrap_or(0)
    }

    fn note(size: usize) {
        let _ = PEAK.try_with(|p| {
            if size > p.get() {
                p.set(size)
            }
        });
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so this
// allocator upholds exactly `System`'s guarantees; recording a size touches no allocation.
unsafe impl GlobalAlloc for PeakAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::note(layout.size());
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::note(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through this allocator with this `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::note(new_size);
        // SAFETY: as for `dealloc`; `new_size` is the caller's, passed on unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
