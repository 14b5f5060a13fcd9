//! What the `file` paths cost: CPU seconds per GiB on each end of a loopback transfer of a
//! file on tmpfs, for every way zcnet can send a file and every way it can receive one.
//! The Solaris paper's FTP test, on today's mechanisms (docs/measurements/kernel-findings.md
//! §4 measured the raw calls; this measures zcnet's paths).
//!
//! ```text
//! cargo run --release -p zcnet-bench --example file_cost [-- SIZE_MIB [RUNS [DIR]]]
//! ```
//!
//! Defaults: 512 MiB, 3 runs (the median is reported), a temp dir in /dev/shm (tmpfs). CPU is
//! `getrusage(RUSAGE_THREAD)` of the thread doing the file call (user + system), so softirq
//! work that lands on the other core is not in it; the `sys` column is the whole machine's
//! busy time from /proc/stat over the run (softirq included). Not a test: numbers vary
//! ±20–30% on this shared 2-core VM; compare rows within one run.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};
use zcnet::stream::Listener;
use zcnet::{
    FileRxMode, FileTxMode, Policy, ReceiverConfig, RxPath, Sender, SenderConfig, StatsSnapshot,
    TxPath,
};
use zcnet_bench::cpu::{thread_rusage, CpuSeconds, SystemCpu};

const GIB: f64 = (1u64 << 30) as f64;

/// One measured run.
#[derive(Debug, Clone, Copy)]
struct Run {
    snd_cpu: f64,
    rcv_cpu: f64,
    sys_busy: f64,
    secs: f64,
}

/// How the sending side produces the bytes.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// `send_file` with this mode.
    File(FileTxMode),
    /// MSG_ZEROCOPY loaned buffers (so an mmap receiver can map pages).
    Zerocopy,
}

/// How the receiving side consumes them.
#[derive(Debug, Clone, Copy)]
enum Sink {
    /// `recv()` and drop (the sender tests' receiver).
    Drain,
    /// `recv_to_file` into the target with this receiver path, mode and preallocation.
    File {
        path: RxPath,
        mode: FileRxMode,
        prealloc: bool,
    },
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn fill_file(path: &Path, size: u64) -> File {
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .expect("create file");
    let block: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    let mut left = size;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n]).expect("write file");
        left -= n as u64;
    }
    f
}

/// One transfer of `size` bytes from `src` (for `Source::File`) into `target` (a path, for
/// `Sink::File`; created new unless it exists and `overwrite`).
fn one_run(
    src: &File,
    size: u64,
    source: Source,
    sink: Sink,
    target: &Path,
    overwrite: bool,
) -> Run {
    let mut rcfg = ReceiverConfig::new(match sink {
        Sink::Drain => RxPath::Copy,
        Sink::File { path, .. } => path,
    });
    rcfg.timeout = Some(Duration::from_secs(60));
    if let Sink::File { prealloc, .. } = sink {
        rcfg.file_preallocate = prealloc;
    }
    let listener = Listener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), &rcfg).unwrap();
    let addr = listener.local_addr().unwrap();
    let dst = match sink {
        Sink::Drain => None,
        Sink::File { .. } => Some(
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(!overwrite)
                .open(target)
                .unwrap(),
        ),
    };
    let sys0 = SystemCpu::now().unwrap_or_default();
    let t0 = Instant::now();
    let (snd_cpu, (rcv_cpu, _rx_stats)) = std::thread::scope(|s| {
        let dst = dst.as_ref();
        let r = s.spawn(move || {
            let mut rx = listener.accept().unwrap();
            let a = thread_rusage().unwrap();
            match sink {
                Sink::Drain => {
                    let mut n = 0u64;
                    while let Some(c) = rx.recv().unwrap() {
                        n += c.len() as u64;
                    }
                    assert_eq!(n, size);
                }
                Sink::File { mode, .. } => {
                    let f = dst.unwrap();
                    assert_eq!(rx.recv_to_file_with(f, 0, size, mode).unwrap(), size);
                }
            }
            let b = thread_rusage().unwrap();
            (CpuSeconds::between(a, b).total(), rx.stats().snapshot())
        });
        let mut cfg = SenderConfig::new(match source {
            Source::Zerocopy => TxPath::Zerocopy,
            Source::File(_) => TxPath::Copy,
        });
        cfg.timeout = Some(Duration::from_secs(60));
        cfg.policy = Policy::always();
        cfg.buf_bytes = 1 << 20;
        let mut tx = Sender::connect(addr, &cfg).unwrap();
        let a = thread_rusage().unwrap();
        match source {
            Source::File(mode) => {
                tx.send_file_with(src, 0, size, mode).unwrap();
            }
            Source::Zerocopy => {
                let mut pos = 0u64;
                while pos < size {
                    let mut buf = tx.buffer().unwrap();
                    let n = (buf.capacity() as u64).min(size - pos) as usize;
                    // The pool's buffers keep what was written last time: fill once, send.
                    buf.set_len(n);
                    tx.send(buf).unwrap();
                    pos += n as u64;
                }
            }
        }
        let stats: StatsSnapshot = tx.finish().unwrap();
        let b = thread_rusage().unwrap();
        assert_eq!(stats.tx_bytes(), size);
        (CpuSeconds::between(a, b).total(), r.join().unwrap())
    });
    let secs = t0.elapsed().as_secs_f64();
    let sys_busy = SystemCpu::now().unwrap_or_default().since(&sys0).busy();
    drop(dst);
    if !overwrite {
        if let Sink::File { .. } = sink {
            // A new file each run: its pages go back now, so the next run allocates again.
            std::fs::remove_file(target).unwrap();
        }
    }
    Run {
        snd_cpu,
        rcv_cpu,
        sys_busy,
        secs,
    }
}

#[allow(clippy::too_many_arguments)]
fn measure(
    label: &str,
    runs: usize,
    src: &File,
    size: u64,
    source: Source,
    sink: Sink,
    target: &Path,
    overwrite: bool,
) {
    if overwrite {
        // The target exists with every page in the page cache before the first run.
        drop(fill_file(target, size));
    }
    let rs: Vec<Run> = (0..runs)
        .map(|_| one_run(src, size, source, sink, target, overwrite))
        .collect();
    if overwrite {
        std::fs::remove_file(target).unwrap();
    }
    let gib = size as f64 / GIB;
    let m = |f: fn(&Run) -> f64| median(rs.iter().map(f).collect());
    println!(
        "| {label:<44} | {:>6.1} | {:>6.3} | {:>6.3} | {:>6.3} |",
        size as f64 * 8.0 / m(|r| r.secs) / 1e9,
        m(|r| r.snd_cpu) / gib,
        m(|r| r.rcv_cpu) / gib,
        m(|r| r.sys_busy) / gib,
    );
}

fn header(title: &str) {
    println!();
    println!("{title}");
    println!();
    println!(
        "| {:<44} | {:>6} | {:>6} | {:>6} | {:>6} |",
        "path", "Gbit/s", "snd", "rcv", "sys"
    );
    println!("|{:-<46}|{:->8}|{:->8}|{:->8}|{:->8}|", "", "", "", "", "");
}

fn main() {
    let mut args = std::env::args().skip(1);
    let size_mib: u64 = args.next().map_or(512, |s| s.parse().expect("SIZE_MIB"));
    let runs: usize = args.next().map_or(3, |s| s.parse().expect("RUNS"));
    let base = args.next().unwrap_or_else(|| "/dev/shm".into());
    let size = size_mib << 20;
    let dir = tempfile::Builder::new()
        .prefix("zcnet-file-cost-")
        .tempdir_in(&base)
        .expect("temp dir");
    let fs_type = std::fs::read_to_string("/proc/self/mounts")
        .ok()
        .and_then(|m| {
            m.lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    (f.len() > 2 && dir.path().starts_with(f[1]))
                        .then(|| (f[1].len(), f[2].to_string()))
                })
                .max()
                .map(|(_, t)| t)
        })
        .unwrap_or_else(|| "unknown".into());
    println!(
        "file_cost: {size_mib} MiB file in {} ({fs_type}), loopback, median of {runs}; CPU in s/GiB \
         (snd/rcv: getrusage of the thread making the file call; sys: /proc/stat busy, all CPUs)",
        dir.path().display()
    );
    let src = fill_file(&dir.path().join("source"), size);
    let target = dir.path().join("target");

    header("Sender (receiver: copy path, recv() and drop)");
    for (label, mode) in [
        (
            "read+send (pread into a buffer, send)",
            FileTxMode::ReadSend,
        ),
        ("sendfile", FileTxMode::Sendfile),
        ("splice file → pipe → socket", FileTxMode::Splice),
    ] {
        measure(
            label,
            runs,
            &src,
            size,
            Source::File(mode),
            Sink::Drain,
            &target,
            false,
        );
    }

    let sinks = [
        (
            "recv+write (copy receiver, pwrite)",
            Source::File(FileTxMode::Sendfile),
            RxPath::Copy,
            FileRxMode::Write,
            true,
        ),
        (
            "splice socket → pipe → file",
            Source::File(FileTxMode::Sendfile),
            RxPath::Copy,
            FileRxMode::Splice,
            true,
        ),
        (
            "splice, no fallocate",
            Source::File(FileTxMode::Sendfile),
            RxPath::Copy,
            FileRxMode::Splice,
            false,
        ),
        (
            "mmap receiver + write (sendfile sender)",
            Source::File(FileTxMode::Sendfile),
            RxPath::Mmap,
            FileRxMode::Write,
            true,
        ),
        (
            "mmap receiver + write (MSG_ZEROCOPY sender)",
            Source::Zerocopy,
            RxPath::Mmap,
            FileRxMode::Write,
            true,
        ),
        (
            "splice (MSG_ZEROCOPY sender)",
            Source::Zerocopy,
            RxPath::Copy,
            FileRxMode::Splice,
            true,
        ),
    ];
    for overwrite in [false, true] {
        header(if overwrite {
            "Receiver, overwriting an existing file (pages already in the page cache)"
        } else {
            "Receiver, new file (page-cache pages allocated during the run)"
        });
        for (label, source, path, mode, prealloc) in sinks {
            if !prealloc && overwrite {
                continue;
            }
            measure(
                label,
                runs,
                &src,
                size,
                source,
                Sink::File {
                    path,
                    mode,
                    prealloc,
                },
                &target,
                overwrite,
            );
        }
    }
}
