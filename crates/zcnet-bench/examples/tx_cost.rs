//! Sender CPU per operation of the copy, `MSG_ZEROCOPY` and io_uring `SEND_ZC` transmit paths,
//! 4 KiB … 4 MiB per operation — a micro-benchmark, not a test.
//!
//! ```text
//! cargo run --release -p zcnet-bench --example tx_cost            # both tables (the UDP one needs root)
//! cargo run --release -p zcnet-bench --example tx_cost -- --quick # a quarter of the bytes
//! cargo run --release -p zcnet-bench --example tx_cost -- --tcp-only | --udp-only
//! ```
//!
//! Two places to send to:
//!
//! * **loopback TCP** — through [`zcnet::Sender`] with `Policy::always()` to a receiver thread
//!   that reads with `recv`. Local delivery copies every zero-copy skb
//!   (`skb_orphan_frags_rx`), so the zero-copy paths pay pinning and notifications *and* the
//!   copy (docs/measurements/kernel-findings.md §1, §3).
//! * **UDP sink** — a connected UDP socket with `UDP_SEGMENT` 1400 in namespace `a` of a
//!   [`zcnet_testbed::netns::VethPair`] whose end `b` is down (and a permanent neighbour entry, so no
//!   ARP): every packet is dropped by the device after transmit, like a NIC that sent it, so
//!   nothing copies and the zero-copy saving shows (docs/measurements/kernel-findings.md §1: 0% COPIED). An operation of
//!   more than 61 600 bytes is sent as several GSO sends of at most 61 600 (44 × 1400).
//!
//! CPU is `getrusage(RUSAGE_THREAD)` of the sending thread over the whole run, including
//! reaping completions and (TCP) `finish`. UDP operations cycle through every buffer of a
//! 64 MiB pool (larger than the L3), so the bytes are cold; TCP takes buffers as
//! `Sender::buffer` hands them out (the most recently returned first), as an application does. Each cell is the median of 3 runs; compare
//! rows within one table only (2 shared vCPUs, ±20–30% between runs).

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::process::Command;
use std::time::{Duration, Instant};
use zcnet::stream::Listener;
use zcnet::zc::Completions;
use zcnet::{Policy, Pool, ReceiverConfig, RxPath, Sender, SenderConfig, TxBuf, TxPath};
use zcnet_bench::cpu::{thread_rusage, CpuSeconds};
use zcnet_sys::raw::socket;
use zcnet_sys::raw::udp;
use zcnet_sys::raw::zerocopy as zc;
use zcnet_sys::uring::{SendEvent, SendZcRing};
use zcnet_testbed::netns::{Side, VethPair};

const SIZES: [usize; 6] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];
const PATHS: [&str; 3] = ["copy", "zerocopy", "uring"];
const RUNS: usize = 3;
/// Working set of transmit buffers (larger than the 32 MiB L3, so buffers are cold).
const POOL_BYTES: usize = 64 << 20;
/// GSO segment and the largest GSO send (44 segments of 1400 B).
const SEG: usize = 1400;
const GSO_MAX: usize = 44 * SEG;

#[derive(Debug, Clone, Copy, Default)]
struct Cell {
    us_per_op: f64,
    s_per_gib: f64,
    copied: f64,
}

fn median(mut v: Vec<Cell>) -> Cell {
    v.sort_by(|a, b| a.us_per_op.total_cmp(&b.us_per_op));
    v[v.len() / 2]
}

fn pool_for(size: usize) -> Pool {
    let n = (POOL_BYTES / size).clamp(8, 16384);
    Pool::new(n, size).expect("transmit pool")
}

fn cell(cpu: CpuSeconds, ops: usize, bytes: u64, copied: u64, zc: u64) -> Cell {
    Cell {
        us_per_op: cpu.total() * 1e6 / ops as f64,
        s_per_gib: cpu.total() / (bytes as f64 / (1u64 << 30) as f64),
        copied: if zc > 0 {
            copied as f64 / zc as f64
        } else {
            0.0
        },
    }
}

// -------------------------------------------------------------------------------------------
// Loopback TCP through Sender.

fn tcp_run(path: TxPath, size: usize, total: u64) -> Cell {
    let mut rcfg = ReceiverConfig::new(RxPath::Copy);
    rcfg.buf_bytes = 1 << 20;
    let listener = Listener::bind(SocketAddr::from(([127, 0, 0, 1], 0)), &rcfg).unwrap();
    let addr = listener.local_addr().unwrap();
    let reader = std::thread::spawn(move || {
        let mut rx = listener.accept().unwrap();
        let mut buf = vec![0u8; 1 << 20];
        while rx.recv_into(&mut buf).unwrap() > 0 {}
    });
    let mut cfg = SenderConfig::new(path);
    cfg.policy = Policy::always();
    cfg.pool = Some(pool_for(size));
    let ops = (total as usize / size).max(16);
    let mut tx = Sender::connect(addr, &cfg).unwrap();
    let t0 = thread_rusage().unwrap();
    for i in 0..ops {
        let mut b = tx.buffer().unwrap();
        b.storage_mut()[0] = i as u8; // the application writes its buffer
        b.set_len(size);
        tx.send(b).unwrap();
    }
    let s = tx.finish().unwrap();
    let t1 = thread_rusage().unwrap();
    reader.join().unwrap();
    cell(
        CpuSeconds::between(t0, t1),
        ops,
        (ops * size) as u64,
        s.tx_bytes_zc_copied,
        s.tx_bytes_zerocopy,
    )
}

// -------------------------------------------------------------------------------------------
// UDP to a veth whose peer is down.

/// Sends `ops` operations of `size` bytes on the connected GSO socket `sock` by `path`,
/// cycling through every buffer of `pool` in turn (first in, first out), so the working set
/// is the whole pool. Returns (bytes whose completion said COPIED, bytes sent zero-copy).
fn udp_send(path: &str, sock: &UdpSocket, pool: &Pool, size: usize, ops: usize) -> (u64, u64) {
    let fd = sock.as_fd();
    let mut free: VecDeque<TxBuf> = std::iter::from_fn(|| pool.try_take()).collect();
    let (mut copied, mut zc_bytes) = (0u64, 0u64);
    match path {
        "copy" => {
            for i in 0..ops {
                let mut b = free.pop_front().expect("a buffer");
                b.storage_mut()[0] = i as u8;
                for c in b.storage_mut()[..size].chunks(GSO_MAX) {
                    socket::send(fd, c, zcnet_sys::raw::socket::SendFlags::empty()).unwrap();
                }
                free.push_back(b);
            }
        }
        "zerocopy" => {
            let mut done: Completions<TxBuf> = Completions::new();
            let mut entries = Vec::new();
            let mut reap = |done: &mut Completions<TxBuf>, free: &mut VecDeque<TxBuf>, block| {
                if block {
                    let _ = socket::poll(
                        fd,
                        zcnet_sys::raw::socket::PollFlags::empty(),
                        Some(Duration::from_millis(100)),
                    );
                }
                entries.clear();
                zc::read_errqueue(fd, &mut entries).unwrap();
                for e in &entries {
                    if let zc::ErrqueueEntry::Zerocopy { lo, hi, copied: c } = *e {
                        let d = done.complete(lo, hi).unwrap();
                        if c {
                            copied += d.bytes;
                        }
                        free.extend(d.released);
                    }
                }
            };
            for i in 0..ops {
                let mut b = loop {
                    if let Some(b) = free.pop_front() {
                        break b;
                    }
                    reap(&mut done, &mut free, true);
                };
                b.storage_mut()[0] = i as u8;
                b.set_len(size);
                let first = done.next_id();
                for c in b.chunks(GSO_MAX) {
                    let n = loop {
                        match zc::send_zerocopy(fd, c, zcnet_sys::raw::socket::SendFlags::empty()) {
                            Ok(n) => break n,
                            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                                reap(&mut done, &mut free, true)
                            }
                            Err(e) => panic!("send(MSG_ZEROCOPY): {e}"),
                        }
                    };
                    done.record_call(n);
                    zc_bytes += n as u64;
                }
                let last = done.next_id() - 1;
                free.extend(done.lend(b, first, last));
                reap(&mut done, &mut free, false);
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while !done.is_idle() && Instant::now() < deadline {
                reap(&mut done, &mut free, true);
            }
        }
        "uring" => {
            let mut ring: SendZcRing<TxBuf> = SendZcRing::new(256, pool.count()).unwrap();
            let fixed = ring.register_buffers(pool.regions()).is_ok();
            let mut events = Vec::new();
            let mut absorb = |ring: &mut SendZcRing<TxBuf>, free: &mut VecDeque<TxBuf>| {
                ring.complete(&mut events);
                for e in events.drain(..) {
                    match e {
                        SendEvent::Sent { res, .. } => {
                            assert!(res >= 0, "SEND_ZC: errno {}", -res);
                            zc_bytes += res as u64;
                        }
                        SendEvent::Notified {
                            bytes, copied: c, ..
                        } => {
                            if c {
                                copied += u64::from(bytes);
                            }
                        }
                        SendEvent::Released { buf, .. } => free.push_back(buf),
                    }
                }
            };
            for i in 0..ops {
                let mut b = loop {
                    if let Some(b) = free.pop_front() {
                        break b;
                    }
                    ring.wait(Duration::from_millis(100)).unwrap();
                    absorb(&mut ring, &mut free);
                };
                b.storage_mut()[0] = i as u8;
                b.set_len(size);
                let idx = fixed.then(|| b.index() as u16);
                // Datagrams need no ordering: every GSO send of the operation is queued at
                // once and submitted in one io_uring_enter.
                let t = ring
                    .push(fd, b, 0..size.min(GSO_MAX), idx, 0)
                    .unwrap_or_else(|_| panic!("push"));
                let mut off = GSO_MAX;
                while off < size {
                    let end = (off + GSO_MAX).min(size);
                    ring.push_more(fd, t, off..end, idx, 0).unwrap();
                    off = end;
                }
                ring.seal(t);
                ring.submit().unwrap();
                absorb(&mut ring, &mut free);
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while ring.held() > 0 && Instant::now() < deadline {
                ring.wait(Duration::from_millis(100)).unwrap();
                absorb(&mut ring, &mut free);
            }
        }
        _ => unreachable!(),
    }
    (copied, zc_bytes)
}

fn udp_run(pair: &VethPair, path: &'static str, size: usize, total: u64) -> Cell {
    let dst = SocketAddr::new(IpAddr::V4(pair.addr_b()), 9);
    pair.run_in(Side::A, move || {
        let sock = UdpSocket::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)).unwrap();
        sock.connect(dst).unwrap();
        udp::set_udp_segment(sock.as_fd(), SEG as u16).unwrap();
        zc::set_so_zerocopy(sock.as_fd()).unwrap();
        let pool = pool_for(size);
        let ops = (total as usize / size).max(16);
        let t0 = thread_rusage().unwrap();
        let (copied, zc_bytes) = udp_send(path, &sock, &pool, size, ops);
        let t1 = thread_rusage().unwrap();
        cell(
            CpuSeconds::between(t0, t1),
            ops,
            (ops * size) as u64,
            copied,
            zc_bytes,
        )
    })
    .unwrap()
}

fn sink() -> Result<VethPair, String> {
    zcnet_testbed::netns::available().map_err(|e| e.to_string())?;
    let pair = VethPair::create(1500).map_err(|e| e.to_string())?;
    let ok = Command::new("ip")
        .args(["-n", pair.name(Side::A), "neigh", "replace"])
        .arg(pair.addr_b().to_string())
        .args(["lladdr", "02:00:00:00:00:02", "dev", pair.ifname(Side::A)])
        .args(["nud", "permanent"])
        .status()
        .map_err(|e| e.to_string())?;
    if !ok.success() {
        return Err("ip neigh replace failed".into());
    }
    pair.set_link_up(Side::B, false)
        .map_err(|e| e.to_string())?;
    Ok(pair)
}

// -------------------------------------------------------------------------------------------

fn fmt_size(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{} MiB", n >> 20)
    } else {
        format!("{} KiB", n >> 10)
    }
}

fn table(title: &str, rows: &[(usize, Vec<Cell>)]) {
    println!("\n{title}");
    println!(
        "{:>7} | {:>22} | {:>30} | {:>30}",
        "size", "copy", "zerocopy", "uring (SEND_ZC, fixed)"
    );
    println!(
        "{:>7} | {:>10} {:>11} | {:>10} {:>11} {:>7} | {:>10} {:>11} {:>7}",
        "", "µs/op", "CPU-s/GiB", "µs/op", "CPU-s/GiB", "copied", "µs/op", "CPU-s/GiB", "copied"
    );
    for (size, c) in rows {
        println!(
            "{:>7} | {:>10.2} {:>11.3} | {:>10.2} {:>11.3} {:>6.0}% | {:>10.2} {:>11.3} {:>6.0}%",
            fmt_size(*size),
            c[0].us_per_op,
            c[0].s_per_gib,
            c[1].us_per_op,
            c[1].s_per_gib,
            100.0 * c[1].copied,
            c[2].us_per_op,
            c[2].s_per_gib,
            100.0 * c[2].copied,
        );
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // RUSAGE_THREAD is sampled at the tick (4 ms at HZ=250) on kernels without
    // VIRT_CPU_ACCOUNTING_GEN: runs must take hundreds of milliseconds to be read well.
    let total: u64 = if quick { 256 << 20 } else { 1 << 30 };
    println!(
        "tx_cost: sender CPU (getrusage RUSAGE_THREAD, user+sys) per operation, median of {RUNS}; {} MiB per run",
        total >> 20
    );

    let tcp = !std::env::args().any(|a| a == "--udp-only");
    let udp = !std::env::args().any(|a| a == "--tcp-only");
    if tcp {
        tcp_table(total);
    }
    if udp {
        udp_table(total);
    }
}

fn tcp_table(total: u64) {
    let mut rows = Vec::new();
    for size in SIZES {
        let cells = [TxPath::Copy, TxPath::Zerocopy, TxPath::Uring]
            .iter()
            .map(|&p| median((0..RUNS).map(|_| tcp_run(p, size, total)).collect()))
            .collect();
        rows.push((size, cells));
    }
    table(
        "Loopback TCP (local delivery copies every zero-copy byte)",
        &rows,
    );
}

fn udp_table(total: u64) {
    match sink() {
        Err(why) => println!("\nUDP sink: SKIPPED ({why})"),
        Ok(pair) => {
            let mut rows = Vec::new();
            for size in SIZES {
                let cells = PATHS
                    .iter()
                    .map(|&p| median((0..RUNS).map(|_| udp_run(&pair, p, size, total)).collect()))
                    .collect();
                rows.push((size, cells));
            }
            table(
                "UDP sink: GSO 1400 B to a veth whose peer is down (dropped after transmit, nothing copies)",
                &rows,
            );
        }
    }
}
