//! What write protection costs per 4 KiB page as the span grows, against copying the same
//! pages: the question `zcnet run --tx auto` asks before each process's first large send
//! (it measures one 64-page span). Solaris amortised page remapping over large sends
//! (Chu, "Zero-Copy TCP in Solaris", §4.4.1); this shows whether protect + unprotect does.
//!
//! ```text
//! cargo run --release -p zcnet-bench --example protect_cost -- [--rounds 31]
//! ```
//! Heap memory, resident, protected and released with `zcnet::cow::protect` (the engine
//! the preload library uses); the copy is `copy_from_slice` into a second buffer of the
//! same size, cold (a fresh destination each round) and warm.

use std::hint::black_box;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .skip_while(|a| a != "--rounds")
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(31);
    let page = zcnet_sys::mem::page_size();
    println!("pages  protect+release ns/page  copy warm ns/page  copy cold ns/page   (median of {rounds})");
    for pages in [1usize, 4, 16, 64, 256, 512, 2048] {
        let mut src = vec![1u8; (pages + 1) * page];
        let off = (src.as_ptr() as usize).next_multiple_of(page) - src.as_ptr() as usize;
        let span = &mut src[off..off + pages * page];
        span.iter_mut().step_by(page).for_each(|b| *b = 7);
        let mut warm = vec![0u8; pages * page];
        let (mut p, mut w, mut c) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let t = Instant::now();
            match zcnet::cow::protect(span) {
                Ok(prot) => drop(black_box(prot)),
                Err(e) => {
                    eprintln!("cannot protect: {e}");
                    return;
                }
            }
            p.push(t.elapsed().as_nanos() as f64 / pages as f64);
            let t = Instant::now();
            warm.copy_from_slice(black_box(&*span));
            black_box(&warm);
            w.push(t.elapsed().as_nanos() as f64 / pages as f64);
            let mut cold = vec![0u8; pages * page];
            cold.iter_mut().step_by(page).for_each(|b| *b = 1);
            let t = Instant::now();
            cold.copy_from_slice(black_box(&*span));
            black_box(&cold);
            c.push(t.elapsed().as_nanos() as f64 / pages as f64);
        }
        println!(
            "{pages:5}  {:24.0}  {:17.0}  {:17.0}",
            median(p),
            median(w),
            median(c)
        );
    }
}
