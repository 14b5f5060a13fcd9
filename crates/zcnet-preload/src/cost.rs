//! `auto`'s question, answered on this host: does write-protecting a page and lifting the
//! protection again cost less than copying it? Measured once per process, the first time a
//! send could go zero-copy, on 64 heap pages (a few hundred microseconds in all).
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
