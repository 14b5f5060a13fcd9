//! What write protection costs per 4 KiB page as the span grows, against copying the same
//! pages: the question `zcnet run --tx auto` asks before each process's first large send
//! (it measures one 64-page span). Solaris amortised page remapping over large sends
//! (Chu, "Zero-Copy TCP in Solaris", §4.4.1); this shows whether protect + unprotect does,
//! and what could make it cheaper:
//!
//! * `engine`: `zcnet::cow::protect` + release, as the preload library does per send
//!   (`UFFDIO_REGISTER` of the span + `UFFDIO_WRITEPROTECT`, then `UFFDIO_UNREGISTER`);
//! * `engine thp`: the same on memory backed by transparent huge pages (`MADV_HUGEPAGE`,
//!   2 MiB aligned): one PMD per 512 pages instead of 512 PTEs;
//! * `wp only`: the registration kept across sends (done once, outside the timing), each
//!   send only `UFFDIO_WRITEPROTECT` on + off — what protecting a reused buffer costs once
//!   the engine keeps its registration; on 4 KiB and on huge pages (`wp only thp`);
//! * `kept`: a buffer left protected between sends costs nothing per send until the program
//!   writes it; a program that refills its buffer (nginx, socat) then takes one write fault
//!   per page, resolved by the engine's copy: `refill fault` is that cost per page;
//! * `copy warm`/`copy cold`: `copy_from_slice` into a second buffer of the same size,
//!   reused, or fresh each round (first-touch faults included).
//!
//! Batching the protection of several sends into one call is the span-size axis: k
//! adjacent sends of s pages protected at once cost what one span of k·s pages costs.
//!
//! ```text
//! cargo run --release -p zcnet-bench --example protect_cost -- [--rounds 31]
//! ```

use std::hint::black_box;
use std::time::Instant;
use zcnet_sys::cow::uffd::{RegisterMode, Userfaultfd, UFFD_FEATURE_PAGEFAULT_FLAG_WP};
use zcnet_sys::mem::PageBuf;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `AnonHugePages` of the mapping holding `addr`, in KiB (from /proc/self/smaps).
fn huge_kib(addr: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    let mut inside = false;
    for l in smaps.lines() {
        let first = l.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                inside = (a..b).contains(&addr);
                continue;
            }
        }
        if inside {
            if let Some(v) = l.strip_prefix("AnonHugePages:") {
                return v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            }
        }
    }
    0
}

/// ns/page of `f` over `rounds`, median.
fn time(rounds: usize, pages: usize, mut f: impl FnMut()) -> f64 {
    let mut v = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        f();
        v.push(t.elapsed().as_nanos() as f64 / pages as f64);
    }
    median(v)
}

/// ns/page of the engine's protect + release of `span`.
fn engine(rounds: usize, span: &[u8]) -> Option<f64> {
    let pages = span.len() / zcnet_sys::mem::page_size();
    let mut ok = true;
    let t = time(rounds, pages, || match zcnet::cow::protect(span) {
        Ok(p) => drop(black_box(p)),
        Err(_) => ok = false,
    });
    ok.then_some(t)
}

/// ns/page of write-protect on + off of `span`, registered once beforehand.
fn wp_only(uffd: &Userfaultfd, rounds: usize, span: &[u8]) -> Option<f64> {
    let pages = span.len() / zcnet_sys::mem::page_size();
    uffd.register(span, RegisterMode::WP).ok()?;
    let mut ok = true;
    let t = time(rounds, pages, || {
        ok &= uffd.write_protect(span, true).is_ok();
        ok &= uffd.write_protect(span, false).is_ok();
    });
    uffd.unregister(span).ok()?;
    ok.then_some(t)
}

/// ns/page of a program refilling a protected span: protect, write one byte per page (each
/// a fault the engine resolves by copying the page), release.
fn refill_fault(rounds: usize, span: &mut [u8]) -> Option<f64> {
    let page = zcnet_sys::mem::page_size();
    let pages = span.len() / page;
    let mut v = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let p = zcnet::cow::protect(span).ok()?;
        let t0 = Instant::now();
        span.iter_mut()
            .step_by(page)
            .for_each(|b| *b = b.wrapping_add(1));
        let faulted = t0.elapsed();
        drop(p);
        v.push(faulted.as_nanos() as f64 / pages as f64);
    }
    Some(median(v))
}

fn show(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |x| format!("{x:.0}"))
}

fn main() {
    let rounds: usize = std::env::args()
        .skip_while(|a| a != "--rounds")
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(31);
    let page = zcnet_sys::mem::page_size();
    let uffd = Userfaultfd::user_mode_only()
        .and_then(|u| u.api(UFFD_FEATURE_PAGEFAULT_FLAG_WP).map(|_| u))
        .ok();
    if uffd.is_none() {
        eprintln!("no userfaultfd write protection here: `wp only` columns left empty");
    }
    println!("ns per 4 KiB page, median of {rounds} rounds; shared machine");
    println!(
        "{:>5} {:>8} {:>11} {:>8} {:>12} {:>13} {:>10} {:>10}  huge",
        "pages",
        "engine",
        "engine thp",
        "wp only",
        "wp only thp",
        "refill fault",
        "copy warm",
        "copy cold"
    );
    for pages in [1usize, 16, 64, 512, 2048] {
        let len = pages * page;
        let mut small = PageBuf::new(len).expect("mmap");
        let mut huge = PageBuf::new_huge(len).expect("mmap");
        let hk = huge_kib(huge.as_ptr() as usize);
        let e = engine(rounds, small.as_slice());
        let eh = engine(rounds, &huge.as_slice()[..len]);
        let w = uffd
            .as_ref()
            .and_then(|u| wp_only(u, rounds, small.as_slice()));
        let wh = uffd
            .as_ref()
            .and_then(|u| wp_only(u, rounds, &huge.as_slice()[..len]));
        let f = refill_fault(rounds.min(9), small.as_mut_slice());
        let mut warm = vec![0u8; len];
        let cw = time(rounds, pages, || {
            warm.copy_from_slice(black_box(small.as_slice()));
            black_box(&warm);
        });
        let cc = time(rounds, pages, || {
            let mut cold = vec![0u8; len];
            cold.copy_from_slice(black_box(small.as_slice()));
            black_box(&cold);
        });
        huge.as_mut_slice()[0] = 1;
        println!(
            "{pages:5} {:>8} {:>11} {:>8} {:>12} {:>13} {:>10.0} {:>10.0}  {hk} KiB",
            show(e),
            show(eh),
            show(w),
            show(wh),
            show(f),
            cw,
            cc
        );
    }
}
