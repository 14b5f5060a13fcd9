//! `auto`'s question, answered on this host: does write-protecting a page and lifting the
//! protection again cost less than copying it? Measured the first time a send could go
//! zero-copy, on 64 heap pages: about 40 `ioctl`s, two fresh 256 KiB buffers and 9 rounds
//! of both, 1–2 ms of the process's CPU on this VM — which a program started per transfer
//! (a server per test, `http.server` per run of the bench) would pay every time. So the
//! answer is kept for the rest of this boot in `page-cost.json` (`crate::cache`), and a
//! later process reads it instead ([`load_or_measure`]).
//!
//! And, the first time a program sends from a buffer in transparent huge pages, the same on
//! one 2 MiB huge page, where the protection is one PMD entry instead of 512 PTEs: on this
//! kernel that costs less than the copy.
//!
//! Zero-copy under protection only pays where it saves the copy and costs less than it;
//! Solaris's page-remapping transmit had the same trade (Chu, "Zero-Copy TCP in Solaris",
//! §4.4.1, table 6).

use crate::cache;
use serde::{Deserialize, Serialize};
use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

/// Nanoseconds per 4 KiB-page for each way of keeping copy semantics.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
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

/// Where a process's [`PageCost`] came from (in its stats line).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Measured by this process.
    Measured,
    /// Read from the cache an earlier process of this boot wrote.
    Cache,
}

/// The cache file's name, in `crate::cache::dir`.
pub const CACHE_FILE: &str = "page-cost.json";

/// The costs in a cache file's `text` if it was written in boot `boot` and holds sane
/// values.
pub fn parse_cache(text: &str, boot: &str) -> Option<PageCost> {
    sane(cache::parse(text, boot)?)
}

fn sane(c: PageCost) -> Option<PageCost> {
    let ok = |v: f64| v.is_finite() && v > 0.0;
    (ok(c.protect_ns) && ok(c.copy_ns)).then_some(c)
}

/// This boot's costs from the cache in `dir`, else measured (and cached for the next
/// process); `None` when no protection engine runs here (nothing is cached then: the
/// engine may be allowed to a later process).
pub fn load_or_measure(dir: Option<&Path>) -> Option<(PageCost, Source)> {
    let path = dir.map(|d| d.join(CACHE_FILE));
    if let Some(c) = path.as_deref().and_then(cache::read).and_then(sane) {
        return Some((c, Source::Cache));
    }
    let c = measure()?;
    if let Some(p) = &path {
        let _ = cache::write(p, &c);
    }
    Some((c, Source::Measured))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_of_another_boot_or_with_bad_values_is_not_used() {
        let c = PageCost {
            protect_ns: 810.0,
            copy_ns: 2411.5,
        };
        let dir = tempfile::tempdir().unwrap();
        cache::write(&dir.path().join(CACHE_FILE), &c).unwrap();
        assert_eq!(load_or_measure(Some(dir.path())), Some((c, Source::Cache)));
        let text = std::fs::read_to_string(dir.path().join(CACHE_FILE)).unwrap();
        assert_eq!(parse_cache(&text, "another boot"), None);
        let bad = r#"{"boot_id":"b","protect_ns":-1.0,"copy_ns":2.0}"#;
        assert_eq!(parse_cache(bad, "b"), None);
    }
}
