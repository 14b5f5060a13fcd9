//! `auto`'s question, answered on this host: does write-protecting a page and lifting the
//! protection again cost less than copying it? Measured once per process, the first time a
//! send could go zero-copy, on 64 heap pages (a few hundred microseconds in all).
//!
//! And, the first time a program sends from a buffer in transparent huge pages, the same on
//! one 2 MiB huge page, where the protection is one PMD entry instead of 512 PTEs: on this
//! kernel that costs less than the copy.
//!
//! Zero-copy under protection only pays where it saves the copy and costs less than it;
//! Solaris's page-remapping transmit had the same trade (Chu, "Zero-Copy TCP in Solaris",
//! §4.4.1, table 6).

use serde::Serialize;
use std::hint::black_box;
use std::time::Instant;

/// Nanoseconds per 4 KiB-page for each way of keeping copy semantics.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PageCost {
    /// Protect + unprotect, median of rounds.
    pub protect_ns: f64,
    /// Copy, median of rounds.
    pub copy_ns: f64,
}

impl PageCost {
    /// Whether protecting is the cheaper way.
    pub fn protection_pays(&self) -> bool {
        self.protect_ns < self.copy_ns
    }

    /// Whether protecting whole huge pages, at `huge_ns` per 4 KiB of them
    /// ([`measure_huge`]), is the cheaper way.
    pub fn huge_protection_pays(&self, huge_ns: Option<f64>) -> bool {
        huge_ns.is_some_and(|h| h < self.copy_ns)
    }
}

const PAGES: usize = 64;
const ROUNDS: usize = 9;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Measures both; `None` when no protection engine runs here.
pub fn measure() -> Option<PageCost> {
    let page = zcnet_sys::mem::page_size();
    let mut src = vec![1u8; (PAGES + 1) * page];
    let off = (src.as_ptr() as usize).next_multiple_of(page) - src.as_ptr() as usize;
    let span = &mut src[off..off + PAGES * page];
    span.iter_mut().step_by(page).for_each(|b| *b = 7);
    let mut dst = vec![0u8; PAGES * page];
    let mut protect = Vec::with_capacity(ROUNDS);
    let mut copy = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let p = zcnet::cow::protect(span).ok()?;
        drop(black_box(p));
        protect.push(t.elapsed().as_nanos() as f64 / PAGES as f64);
        let t = Instant::now();
        dst.copy_from_slice(black_box(&*span));
        black_box(&dst);
        copy.push(t.elapsed().as_nanos() as f64 / PAGES as f64);
    }
    Some(PageCost {
        protect_ns: median(protect),
        copy_ns: median(copy),
    })
}

/// Protect + unprotect per 4 KiB page of one 2 MiB huge page; `None` if the kernel gave
/// the buffer no huge page (transparent huge pages `never`, or none free). Measured only
/// when a program first sends from a buffer in huge pages: getting one costs a few
/// milliseconds (zeroing, perhaps compaction), which no other process should pay.
pub fn measure_huge() -> Option<f64> {
    let mut buf = zcnet_sys::mem::PageBuf::new_huge(crate::huge::HUGE).ok()?;
    let span = &mut buf.as_mut_slice()[..crate::huge::HUGE];
    if !crate::huge::backed(span.as_ptr() as usize, span.len()) {
        return None;
    }
    let pages = span.len() / zcnet_sys::mem::page_size();
    let mut v = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let p = zcnet::cow::protect(span).ok()?;
        drop(black_box(p));
        v.push(t.elapsed().as_nanos() as f64 / pages as f64);
    }
    Some(median(v))
}
