//! The UDP sink, side by side in one run: 64 KiB messages into a veth whose peer is down
//! (zcnet-testbed's `VethPair`, MTU 1500, side B set down). The device drops what it is
//! given after the driver, as a NIC releases what it has sent, so `MSG_ZEROCOPY` pages are
//! never copied for local delivery there — the transmit-side saving as hardware would see it
//! (the same sink as `zcnet bench --topology sink`). Needs root; says so and exits otherwise.
//!
//! ```text
//! cargo run --release -p zcnet-tokio --example bench_udp -- [--messages 4000] [--runs 5] [--ring 64]
//! ```
//!
//! Rows, each run on its own OS thread (a current-thread tokio runtime for the async ones,
//! completion driver included), its CPU taken with `getrusage(RUSAGE_SELF)` — the process's,
//! so that a request io_uring hands to a worker thread is counted too (the main thread only
//! waits meanwhile):
//!
//! * `tokio send (1472 B)` — plain `tokio::net::UdpSocket`, one `send` per datagram ≤ MTU
//!   (45 per message), no framing: what a tokio user writes today;
//! * `tokio send + UDP_SEGMENT` — plain tokio with GSO turned on by one `setsockopt`
//!   (`UDP_SEGMENT` = 1472 on the socket, not a control message: tokio has no `sendmsg`),
//!   so each `send` of up to 65 507 B leaves as one GSO batch: two sends per 64 KiB message;
//! * `ZcUdpSocket send_slice` — zcnet's framing, GSO batches, copied;
//! * `ZcUdpSocket send_lent` — GSO batches from loaned pool buffers with `MSG_ZEROCOPY`,
//!   and with io_uring `SEND_ZC` from the registered pool (several messages submitted per
//!   `io_uring_enter`: the socket's flusher submits what a task queued once it yields);
//! * `blocking MsgSender send` — the same from `zcnet_msg` on a plain thread, twice (the
//!   second row is the spread of two identical configurations in the same sitting).
//!
//! "× blocking" is the median of per-run ratios to the first blocking row, "× same engine"
//! to the blocking row of the same zero-copy engine (the io_uring rows to the blocking
//! io_uring row). `--pin CPU` runs
//! every sender on that CPU.
//!
//! The rows are interleaved `--runs` times, each round starting one row later than the last
//! (1..5, 2..5 1, 3..5 1 2, ...), and the median of each row is printed: the machine is
//! shared, so compare rows of one table only. No row writes its payload per message (each
//! sends the bytes already in its buffer): this measures the transport, not the application
//! filling buffers. The copying rows cycle through `--ring` distinct 64 KiB buffers (64 = 4
//! MiB by default), so their copies do not all read one cache-hot buffer; `--ring 1` shows
//! the hot case.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};
use zcnet_msg::{MsgConfig, MsgSender, MsgTx};
use zcnet_sys::raw::cpu;
use zcnet_testbed::netns::{Side, VethPair};
use zcnet_tokio::ZcUdpSocket;

const MSG: usize = 64 << 10;
/// The discard port: nothing listens (nothing could: the peer is down).
const DISCARD: u16 = 9;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    TokioDatagram,
    TokioGso,
    ZcSlice,
    ZcLent,
    Blocking,
    /// The blocking sender again: the spread of two identical configurations in one run.
    BlockingAgain,
    /// `ZcLent` with `MsgTx::Uring`: io_uring `SEND_ZC` from the registered pool.
    ZcLentUring,
    /// `Blocking` with `MsgTx::Uring`.
    BlockingUring,
}

const MODES: [Mode; 8] = [
    Mode::TokioDatagram,
    Mode::TokioGso,
    Mode::ZcSlice,
    Mode::ZcLent,
    Mode::Blocking,
    Mode::BlockingAgain,
    Mode::ZcLentUring,
    Mode::BlockingUring,
];
/// The row the "× blocking" column divides by.
const BLOCKING: usize = 4;
/// The blocking row on io_uring: what "× same engine" divides the io_uring rows by.
const BLOCKING_URING: usize = 7;

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::TokioDatagram => "tokio UdpSocket send (1472 B)",
            Mode::TokioGso => "tokio UdpSocket send + UDP_SEGMENT",
            Mode::ZcSlice => "ZcUdpSocket send_slice (copy)",
            Mode::ZcLent => "ZcUdpSocket send_lent (zero-copy)",
            Mode::Blocking => "blocking MsgSender send (zero-copy)",
            Mode::BlockingAgain => "blocking MsgSender send again (spread)",
            Mode::ZcLentUring => "ZcUdpSocket send_lent (io_uring SEND_ZC)",
            Mode::BlockingUring => "blocking MsgSender send (io_uring SEND_ZC)",
        }
    }
}

struct Run {
    cpu: Duration,
    /// The user share of `cpu` (getrusage's split, sampled at the tick).
    user: Duration,
    /// An io_uring row (checked to have sent from registered buffers).
    uring: bool,
    wall: Duration,
    zc_share: f64,
    copied_anyway: f64,
    /// io_uring rows: `SEND_ZC` requests per `io_uring_enter` that submitted them.
    per_submit: f64,
}

/// The process's (user + system, user) CPU time: the sending thread's, and any io_uring
/// worker thread's (`iou-wrk`, a thread of this process) that a request was handed to —
/// work the thread's own clock would not show. The main thread only waits meanwhile.
fn cpu_now() -> (Duration, Duration) {
    cpu::process()
        .map(|r| (r.user + r.sys, r.user))
        .unwrap_or_default()
}

/// The run measured from `c0` (taken by [`cpu_now`]) and `t0` to now.
fn since(c0: (Duration, Duration), t0: Instant) -> Run {
    let c1 = cpu_now();
    Run {
        cpu: c1.0 - c0.0,
        user: c1.1 - c0.1,
        uring: false,
        wall: t0.elapsed(),
        zc_share: 0.0,
        copied_anyway: 0.0,
        per_submit: f64::NAN,
    }
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn msg_config(tx: MsgTx) -> MsgConfig {
    let mut c = MsgConfig::new(tx);
    c.pool_buffers = 8;
    c
}

/// A UDP socket in namespace A connected to the sink.
fn sink_socket(pair: &VethPair) -> UdpSocket {
    let to = SocketAddr::new(pair.addr(Side::B).into(), DISCARD);
    let from = SocketAddr::new(pair.addr(Side::A).into(), 0);
    pair.run_in_a(move || {
        let s = UdpSocket::bind(from).expect("bind in namespace a");
        s.connect(to).expect("connect to the sink");
        s
    })
    .expect("entering namespace a")
}

fn run(mode: Mode, pair: &VethPair, messages: u64, ring: usize, pin: Option<usize>) -> Run {
    let sock = sink_socket(pair);
    std::thread::scope(|s| {
        s.spawn(move || {
            if let Some(c) = pin {
                cpu::pin_thread(c).expect("pinning the sender");
            }
            run_on_this_thread(mode, sock, messages, ring)
        })
        .join()
        .expect("a bench thread panicked")
    })
}

fn run_on_this_thread(mode: Mode, sock: UdpSocket, messages: u64, ring: usize) -> Run {
    match mode {
        Mode::TokioDatagram | Mode::TokioGso => current_thread().block_on(async move {
            if mode == Mode::TokioGso {
                zcnet_sys::raw::udp::set_udp_segment(sock.as_fd(), 1472).expect("UDP_SEGMENT");
            }
            sock.set_nonblocking(true).unwrap();
            let sock = tokio::net::UdpSocket::from_std(sock).unwrap();
            let ring = buffers(ring);
            let chunk = if mode == Mode::TokioGso {
                44 * 1472
            } else {
                1472
            };
            let (c0, t0) = (cpu_now(), Instant::now());
            for k in 0..messages {
                for part in ring[k as usize % ring.len()].chunks(chunk) {
                    sock.send(part).await.expect("send");
                }
            }
            since(c0, t0)
        }),
        Mode::ZcSlice | Mode::ZcLent | Mode::ZcLentUring => current_thread().block_on(async move {
            let engine = if mode == Mode::ZcLentUring {
                MsgTx::Uring
            } else {
                MsgTx::Zerocopy
            };
            let tx = ZcUdpSocket::from_std(sock, &msg_config(engine)).unwrap();
            let ring = buffers(ring);
            // The pool is made (and its pages faulted in) before the clock starts.
            drop(tx.buffer(MSG).await.unwrap());
            let (c0, t0) = (cpu_now(), Instant::now());
            for k in 0..messages {
                if mode == Mode::ZcSlice {
                    let data = &ring[k as usize % ring.len()];
                    tx.send_slice(data).await.expect("send_slice");
                } else {
                    let b = tx.buffer(MSG).await.expect("buffer");
                    tx.send_lent(b).await.expect("send_lent");
                }
            }
            tx.flush_loans().await.expect("flush");
            let mut r = since(c0, t0);
            r.uring = engine == MsgTx::Uring;
            with_stats(r, &tx.stats().snapshot())
        }),
        Mode::Blocking | Mode::BlockingAgain | Mode::BlockingUring => {
            let engine = if mode == Mode::BlockingUring {
                MsgTx::Uring
            } else {
                MsgTx::Zerocopy
            };
            let mut tx = MsgSender::from_socket(sock, &msg_config(engine)).unwrap();
            drop(tx.buffer(MSG).unwrap());
            let (c0, t0) = (cpu_now(), Instant::now());
            for _ in 0..messages {
                let b = tx.buffer(MSG).expect("buffer");
                tx.send(b).expect("send");
            }
            tx.flush(Duration::from_secs(10)).expect("flush");
            let mut r = since(c0, t0);
            r.uring = engine == MsgTx::Uring;
            with_stats(r, &tx.io_stats().snapshot())
        }
    }
}

/// `n` message buffers of distinct bytes, for the rows that copy: cycling through them
/// (4 MiB by default) keeps the copy from reading one cache-hot buffer over and over.
fn buffers(n: usize) -> Vec<Vec<u8>> {
    (0..n.max(1)).map(|i| vec![i as u8; MSG]).collect()
}

fn with_stats(mut r: Run, s: &zcnet::StatsSnapshot) -> Run {
    if r.uring && s.tx_uring_fixed_calls == 0 {
        eprintln!("warning: an io_uring row sent nothing from registered buffers: {s:?}");
    }
    let total = (s.tx_bytes_zerocopy + s.tx_bytes_copy).max(1) as f64;
    r.zc_share = s.tx_bytes_zerocopy as f64 / total;
    r.copied_anyway = s.tx_bytes_zc_copied as f64 / s.tx_bytes_zerocopy.max(1) as f64;
    if r.uring {
        r.per_submit = s.tx_calls_zerocopy as f64 / s.tx_uring_submits.max(1) as f64;
    }
    r
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut messages = 4000u64;
    let mut runs = 5usize;
    let mut ring = 64usize;
    let mut only: Option<Vec<usize>> = None;
    let mut pin: Option<usize> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().and_then(|v| v.parse::<u64>().ok());
        match a.as_str() {
            "--messages" => messages = val().expect("--messages N"),
            "--runs" => runs = val().expect("--runs N") as usize,
            "--ring" => ring = val().expect("--ring N") as usize,
            // Some rows only (their indexes in the table, from 0, comma-separated): for a
            // profiler, or to compare two rows with more runs in the same time.
            "--only" => {
                let rows = args.next().unwrap_or_default();
                let rows: Result<Vec<usize>, _> = rows.split(',').map(str::parse).collect();
                match rows {
                    Ok(r) if !r.is_empty() && r.iter().all(|&i| i < MODES.len()) => only = Some(r),
                    _ => {
                        eprintln!(
                            "--only ROW[,ROW...]: row indexes from 0 to {}",
                            MODES.len() - 1
                        );
                        std::process::exit(2);
                    }
                }
            }
            // The sending thread on this CPU (`sched_setaffinity`).
            "--pin" => pin = Some(val().expect("--pin CPU") as usize),
            _ => {
                eprintln!(
                    "usage: bench_udp [--messages N] [--runs N] [--ring N] [--only ROW[,ROW...]] [--pin CPU]"
                );
                std::process::exit(2);
            }
        }
    }
    if let Err(why) = zcnet_testbed::netns::available() {
        eprintln!("SKIPPED: the sink needs network namespaces (root): {why}");
        return;
    }
    let pair = VethPair::create(1500).expect("a veth pair");
    // VethPair pins the neighbours, so A still transmits once B is down.
    pair.set_link_up(Side::B, false)
        .expect("setting the peer down");
    let mut results: Vec<Vec<Run>> = MODES.iter().map(|_| Vec::new()).collect();
    let rows: Vec<usize> = (0..MODES.len())
        .filter(|i| only.as_ref().is_none_or(|o| o.contains(i)))
        .collect();
    for round in 0..runs {
        // Each round starts one row later than the last, so no row always runs first (right
        // after the previous round's last run, whose socket is still being torn down) or
        // always follows the same row.
        for k in 0..rows.len() {
            let i = rows[(round + k) % rows.len()];
            results[i].push(run(MODES[i], &pair, messages, ring, pin));
        }
    }
    let pinned = pin.map_or(String::new(), |c| format!(", sender on CPU {c}"));
    println!(
        "UDP sink (veth, peer down, MTU 1500), {messages} messages of 64 KiB per run, copy rows cycling through {ring} buffers, median of {runs} interleaved runs{pinned}\n(shared, noisy machine: compare rows of this table only; \"× blocking\" is the median of per-run ratios, and the last row is the spread of identical runs)\n"
    );
    println!(
        "| sender | msgs per sender CPU-s | × plain tokio | × blocking | × same engine | sender CPU-s/GiB | user µs/msg | system µs/msg | wall msgs/s | zero-copy share | copied anyway | SEND_ZC per io_uring_enter |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let gib = (messages * MSG as u64) as f64 / (1u64 << 30) as f64;
    let rate = |r: &Run| messages as f64 / r.cpu.as_secs_f64().max(1e-9);
    let base = median(results[0].iter().map(rate).collect());
    for (i, &m) in MODES.iter().enumerate() {
        let rs = &results[i];
        if rs.is_empty() {
            continue;
        }
        let per_cpu = median(rs.iter().map(rate).collect());
        let cpu_gib = median(rs.iter().map(|r| r.cpu.as_secs_f64() / gib).collect());
        let wall = median(
            rs.iter()
                .map(|r| messages as f64 / r.wall.as_secs_f64().max(1e-9))
                .collect(),
        );
        // getrusage's split is sampled at the tick: a median over runs, not a per-run figure.
        let per_msg = |d: Duration| d.as_secs_f64() * 1e6 / messages as f64;
        let user = median(rs.iter().map(|r| per_msg(r.user)).collect());
        let system = median(rs.iter().map(|r| per_msg(r.cpu - r.user)).collect());
        let zc = median(rs.iter().map(|r| r.zc_share).collect());
        let copied = median(rs.iter().map(|r| r.copied_anyway).collect());
        let per_submit = median(rs.iter().map(|r| r.per_submit).collect());
        let per_submit = if per_submit.is_nan() {
            "–".to_string()
        } else {
            format!("{per_submit:.1}")
        };
        let ratio = if base.is_nan() {
            "–".to_string()
        } else {
            format!("{:.2}", per_cpu / base)
        };
        let paired = |base: usize| {
            median(
                rs.iter()
                    .zip(&results[base])
                    .map(|(r, b)| rate(r) / rate(b))
                    .collect(),
            )
        };
        let engine = if matches!(m, Mode::ZcLentUring | Mode::BlockingUring) {
            BLOCKING_URING
        } else {
            BLOCKING
        };
        println!(
            "| {} | {:.0} | {} | {:.3} | {:.3} | {:.3} | {:.2} | {:.2} | {:.0} | {:.0} % | {:.0} % | {} |",
            m.name(),
            per_cpu,
            ratio,
            paired(BLOCKING),
            paired(engine),
            cpu_gib,
            user,
            system,
            wall,
            zc * 100.0,
            copied * 100.0,
            per_submit
        );
    }
}
