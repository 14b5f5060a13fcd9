//! What BLAKE3 verification costs per GiB on this machine, by the way the bytes reach the
//! hash: from a buffer already in cache (the hash alone), and `pread` into a buffer of two
//! sizes (what `digest` and `landing` do). Mapping the file instead was measured too and
//! costs more than the copy it saves (`digest`'s module docs).
//!
//!     cargo run --release -p zcnet-transfer --example hash_cost -- FILE [ROUNDS=5]
//!
//! FILE should be in the page cache (on tmpfs, or read once before). Prints thread CPU
//! seconds per GiB, median of ROUNDS, the ways interleaved round by round.
use std::fs::File;
use std::os::unix::fs::FileExt;

fn cpu() -> f64 {
    zcnet_sys::raw::cpu::thread_cpu_ns() as f64 * 1e-9
}

fn in_cache(len: u64, update: usize) -> [u8; 32] {
    let buf: Vec<u8> = (0..128 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    let mut h = blake3::Hasher::new();
    let mut done = 0u64;
    while done < len {
        for c in buf.chunks(update) {
            h.update(c);
        }
        done += buf.len() as u64;
    }
    *h.finalize().as_bytes()
}

fn by_pread(f: &File, len: u64, chunk: usize) -> [u8; 32] {
    let mut buf = vec![0u8; chunk];
    let mut h = blake3::Hasher::new();
    let mut off = 0u64;
    while off < len {
        let want = (len - off).min(chunk as u64) as usize;
        let n = f.read_at(&mut buf[..want], off).unwrap();
        h.update(&buf[..n]);
        off += n as u64;
    }
    *h.finalize().as_bytes()
}

/// A named way to hash the whole file.
type Way<'a> = (&'static str, Box<dyn Fn() -> [u8; 32] + 'a>);

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: hash_cost FILE [ROUNDS]");
    let rounds: usize = args.next().map(|s| s.parse().unwrap()).unwrap_or(5);
    let f = File::open(&path).unwrap();
    let len = f.metadata().unwrap().len();
    let gib = len as f64 / (1u64 << 30) as f64;
    let ways: Vec<Way> = vec![
        (
            "hash alone, 16 KiB updates",
            Box::new(|| in_cache(len, 16 << 10)),
        ),
        (
            "hash alone, 128 KiB updates",
            Box::new(|| in_cache(len, 128 << 10)),
        ),
        (
            "pread 128 KiB + hash",
            Box::new(|| by_pread(&f, len, 128 << 10)),
        ),
        (
            "pread 2 MiB + hash",
            Box::new(|| by_pread(&f, len, 2 << 20)),
        ),
    ];
    let reference = by_pread(&f, len, 128 << 10);
    let mut times = vec![Vec::new(); ways.len()];
    for _ in 0..rounds {
        for (i, (_, way)) in ways.iter().enumerate() {
            let t0 = cpu();
            let h = way();
            times[i].push((cpu() - t0) / gib);
            if i >= 2 {
                assert_eq!(h, reference, "every way over the file gives its hash");
            }
        }
    }
    println!(
        "{:<30} {:>12} {:>8} {:>8}",
        "way", "CPU-s/GiB", "min", "max"
    );
    for ((name, _), mut t) in ways.iter().zip(times) {
        t.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "{name:<30} {:>12.3} {:>8.3} {:>8.3}",
            t[t.len() / 2],
            t[0],
            t[t.len() - 1]
        );
    }
    println!(
        "({:.2} GiB file {path}; thread CPU seconds per GiB, median of {rounds}, interleaved)",
        gib
    );
}
