//! Side by side in one run, on loopback and (as root) across a veth pair between two
//! network namespaces (zcnet-testbed's `VethPair`, MTU 9000): plain `tokio::net::TcpStream` against `ZcStream`
//! (copy through `AsyncWrite`, `send_zc`, `send_bytes`, and `auto` = `send_bytes` under
//! zcnet's default policy), at 64 KiB and 1 MiB per operation: CPU seconds per GiB of the
//! sending and of the receiving end, their sum, and the sum as a ratio to plain tokio's.
//! `auto` is `ZcStream`'s default: zcnet's default policy (16 KiB threshold, COPIED
//! demotion counted in bytes) and the run-time cost check.
//!
//! ```text
//! cargo run --release -p zcnet-tokio --example bench_tokio -- [--gib 1] [--runs 3] [--no-netns] [--pin]
//! ```
//!
//! `--modes` and `--sizes` run a subset (the first mode is the baseline of the ratios);
//! `--modes first-copied` adds a row whose policy stops asking at the first COPIED
//! notification, on loopback too: its "zc MiB/run" is how many bytes went zero-copy before
//! the first COPIED notification was read — the least a COPIED demotion can cost, and what
//! the default's first probe across the veth pair is sized by.
//! `--pin` puts the sender on CPU 0 and the receiver on CPU 1 (`sched_setaffinity`). A
//! second plain tokio row shows the spread of two identical configurations in the same
//! sitting; "both × plain" is the median of per-run ratios to the first plain row.
//!
//! Each end is a current-thread tokio runtime on its own OS thread, so `getrusage
//! (RUSAGE_THREAD)` of that thread is that end's CPU, completion driver included. Softirq
//! work the kernel does on the other core, or in ksoftirqd, is charged to neither, and
//! which end pays for loopback's receive processing varies from run to run: compare the
//! sum. The rows are interleaved (every row of a size once, then again, `--runs` times)
//! so a change in the machine's load reaches every row alike; medians are printed. On loopback and veth the kernel copies `MSG_ZEROCOPY` data at
//! delivery anyway (the "copied anyway" column): zero-copy cannot win here, the bar is not
//! to lose. The receiver counts bytes only (no pattern check), to measure the transport.

use bytes::Bytes;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zcnet_sys::raw::cpu;
use zcnet_testbed::netns::VethPair;
use zcnet_tokio::{Policy, ZcConfig, ZcStream};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Plain,
    /// Plain again: the spread of two identical configurations in the same sitting.
    PlainAgain,
    Copy,
    SendZc,
    SendBytes,
    Auto,
    /// `send_bytes` under a policy that stops asking at the first COPIED notification, on
    /// loopback too: its zero-copy bytes are those sent before the first COPIED
    /// notification was read — the least any COPIED demotion can cost (`--modes` only).
    FirstCopied,
}

impl Mode {
    fn flag(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::PlainAgain => "plain-again",
            Mode::Copy => "copy",
            Mode::SendZc => "send-zc",
            Mode::SendBytes => "send-bytes",
            Mode::Auto => "auto",
            Mode::FirstCopied => "first-copied",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Plain => "tokio TcpStream",
            Mode::PlainAgain => "tokio TcpStream again",
            Mode::Copy => "ZcStream write_all",
            Mode::SendZc => "ZcStream send_zc",
            Mode::SendBytes => "ZcStream send_bytes",
            Mode::Auto => "ZcStream auto",
            Mode::FirstCopied => "ZcStream, demoted at the 1st COPIED",
        }
    }
}

struct Run {
    tx_cpu: Duration,
    rx_cpu: Duration,
    wall: Duration,
    zc_share: f64,
    copied_anyway: f64,
    /// Bytes sent zero-copy.
    zc_bytes: f64,
}

fn cpu_now() -> Duration {
    cpu::thread().map(|r| r.user + r.sys).unwrap_or_default()
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Sends `total` bytes; returns the zero-copy share, the share of it copied anyway and the
/// zero-copy bytes.
async fn send(mode: Mode, addr: SocketAddr, total: u64, size: usize) -> (f64, f64, f64) {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let data = Bytes::from(vec![0x5au8; size]);
    let ops = total / size as u64;
    if matches!(mode, Mode::Plain | Mode::PlainAgain) {
        let mut tcp = tcp;
        for _ in 0..ops {
            tcp.write_all(&data).await.expect("write");
        }
        tcp.shutdown().await.expect("shutdown");
        return (0.0, 0.0, 0.0);
    }
    let config = match mode {
        // The default: zcnet's policy and the cost check.
        Mode::Auto => ZcConfig::new(),
        Mode::FirstCopied => ZcConfig::new()
            .policy(
                Policy::default()
                    .with_demotion(Some(1))
                    .with_demotion_bytes(None),
            )
            .cost_check(false)
            .local_zerocopy(true),
        _ => ZcConfig::new().policy(Policy::always()),
    };
    let mut s = ZcStream::from_tokio(tcp, config).expect("ZcStream");
    let mut owned = vec![0x5au8; size];
    for _ in 0..ops {
        match mode {
            Mode::Copy => s.write_all(&data).await.expect("write"),
            Mode::SendZc => {
                let (r, back) = s.send_zc(owned).await;
                r.expect("send_zc");
                owned = back;
            }
            Mode::SendBytes | Mode::Auto | Mode::FirstCopied => {
                s.send_bytes(data.clone()).await.expect("send_bytes");
            }
            Mode::Plain | Mode::PlainAgain => unreachable!(),
        }
    }
    s.flush_loans().await.expect("completions");
    s.shutdown().await.expect("shutdown");
    let st = s.stats().snapshot();
    let sent = st.tx_bytes().max(1) as f64;
    (
        st.tx_bytes_zerocopy as f64 / sent,
        st.tx_bytes_zc_copied as f64 / st.tx_bytes_zerocopy.max(1) as f64,
        st.tx_bytes_zerocopy as f64,
    )
}

/// The CPUs of the sending and of the receiving thread (`--pin`).
#[derive(Debug, Clone, Copy)]
struct Pin {
    tx: usize,
    rx: usize,
}

fn one(mode: Mode, total: u64, size: usize, veth: Option<&VethPair>, pin: Option<Pin>) -> Run {
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        let start = Instant::now();
        let rx = scope.spawn(move || {
            if let Some(p) = pin {
                cpu::pin_thread(p.rx).expect("pinning the receiver");
            }
            let bind: SocketAddr = match veth {
                Some(v) => {
                    v.enter_b().expect("entering namespace b");
                    SocketAddr::new(v.addr_b().into(), 0)
                }
                None => "127.0.0.1:0".parse().expect("address"),
            };
            let listener = std::net::TcpListener::bind(bind).expect("bind");
            addr_tx
                .send(listener.local_addr().expect("addr"))
                .expect("channel");
            let rt = current_thread();
            let c0 = cpu_now();
            let got = rt.block_on(async move {
                listener.set_nonblocking(true).expect("nonblocking");
                let l = tokio::net::TcpListener::from_std(listener).expect("listener");
                let (mut r, _) = l.accept().await.expect("accept");
                let mut buf = vec![0u8; 256 << 10];
                let mut got = 0u64;
                loop {
                    let n = r.read(&mut buf).await.expect("read");
                    if n == 0 {
                        return got;
                    }
                    got += n as u64;
                }
            });
            (cpu_now() - c0, got)
        });
        let tx = scope.spawn(move || {
            if let Some(p) = pin {
                cpu::pin_thread(p.tx).expect("pinning the sender");
            }
            if let Some(v) = veth {
                v.enter_a().expect("entering namespace a");
            }
            let addr = addr_rx.recv().expect("the receiver's address");
            let rt = current_thread();
            let c0 = cpu_now();
            let shares = rt.block_on(send(mode, addr, total, size));
            (cpu_now() - c0, shares)
        });
        let (tx_cpu, (zc_share, copied_anyway, zc_bytes)) = tx.join().expect("sender");
        let (rx_cpu, got) = rx.join().expect("receiver");
        assert_eq!(got, total / size as u64 * size as u64, "every byte counted");
        Run {
            tx_cpu,
            rx_cpu,
            wall: start.elapsed(),
            zc_share,
            copied_anyway,
            zc_bytes,
        }
    })
}

const MIB: f64 = (1u64 << 20) as f64;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Every mode `--modes` knows, in the order the rows are run and printed (the first is the
/// baseline); all but the last ([`DEFAULT_MODES`]) run without `--modes`.
const ALL_MODES: [Mode; 7] = [
    Mode::Plain,
    Mode::PlainAgain,
    Mode::Copy,
    Mode::SendZc,
    Mode::SendBytes,
    Mode::Auto,
    Mode::FirstCopied,
];
/// How many of [`ALL_MODES`] run by default.
const DEFAULT_MODES: usize = 6;

struct Opts {
    gib: f64,
    runs: usize,
    pin: Option<Pin>,
    modes: Vec<Mode>,
    sizes: Vec<usize>,
}

fn table(where_: &str, o: &Opts, veth: Option<&VethPair>) {
    let (gib, runs, pin) = (o.gib, o.runs, o.pin);
    let total = (gib * (1u64 << 30) as f64) as u64;
    let pinned = match pin {
        Some(p) => format!(", sender on CPU {}, receiver on CPU {}", p.tx, p.rx),
        None => String::new(),
    };
    println!(
        "\n{where_}, {gib} GiB per run, median of {runs} runs{pinned} (shared, noisy machine: compare rows of this table only)"
    );
    println!(
        "\"both × plain\" is the median of per-run ratios to the first plain row; the second plain row is the spread of identical runs."
    );
    println!(
        "| sender | op | tx CPU-s/GiB | rx CPU-s/GiB | both CPU-s/GiB | both × plain | Gbit/s | zc share | zc MiB/run (min–max) | copied anyway |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &size in &o.sizes {
        let mut results: Vec<Vec<Run>> = o.modes.iter().map(|_| Vec::new()).collect();
        for _ in 0..runs {
            for (i, &mode) in o.modes.iter().enumerate() {
                results[i].push(one(mode, total, size, veth, pin));
            }
        }
        let both = |r: &Run| (r.tx_cpu + r.rx_cpu).as_secs_f64() / gib;
        for (i, &mode) in o.modes.iter().enumerate() {
            let rs = &results[i];
            let sum = median(rs.iter().map(both).collect());
            println!(
                "| {} | {} | {:.3} | {:.3} | {:.3} | {:.2} | {:.1} | {:.1} % | {:.2} ({:.2}–{:.2}) | {:.0} % |",
                mode.name(),
                if size % (1 << 20) == 0 {
                    format!("{} MiB", size >> 20)
                } else {
                    format!("{} KiB", size >> 10)
                },
                median(rs.iter().map(|r| r.tx_cpu.as_secs_f64() / gib).collect()),
                median(rs.iter().map(|r| r.rx_cpu.as_secs_f64() / gib).collect()),
                sum,
                median(
                    rs.iter()
                        .zip(&results[0])
                        .map(|(r, p)| both(r) / both(p))
                        .collect()
                ),
                median(
                    rs.iter()
                        .map(|r| total as f64 * 8.0 / r.wall.as_secs_f64() / 1e9)
                        .collect()
                ),
                100.0 * median(rs.iter().map(|r| r.zc_share).collect()),
                median(rs.iter().map(|r| r.zc_bytes / MIB).collect()),
                rs.iter().map(|r| r.zc_bytes / MIB).fold(f64::INFINITY, f64::min),
                rs.iter().map(|r| r.zc_bytes / MIB).fold(0.0, f64::max),
                100.0 * median(rs.iter().map(|r| r.copied_anyway).collect()),
            );
        }
    }
}

/// Small request/response round trips on loopback: a cost per readiness event, not per
/// byte (each reply wakes the client once). The echo end is plain tokio in every row; the
/// client is plain tokio or a `ZcStream` (`copy`: its `AsyncRead`/`AsyncWrite`).
fn ping_pong(mode: Mode, rounds: u64, pin: Option<Pin>) -> (Duration, Duration) {
    const REQ: usize = 64;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::scope(|scope| {
        let echo = scope.spawn(move || {
            if let Some(p) = pin {
                cpu::pin_thread(p.rx).expect("pinning the echo end");
            }
            let rt = current_thread();
            let c0 = cpu_now();
            rt.block_on(async move {
                listener.set_nonblocking(true).expect("nonblocking");
                let l = tokio::net::TcpListener::from_std(listener).expect("listener");
                let (mut r, _) = l.accept().await.expect("accept");
                r.set_nodelay(true).expect("nodelay");
                let mut buf = [0u8; REQ];
                for _ in 0..rounds {
                    r.read_exact(&mut buf).await.expect("request");
                    r.write_all(&buf).await.expect("reply");
                }
            });
            cpu_now() - c0
        });
        let client = scope.spawn(move || {
            if let Some(p) = pin {
                cpu::pin_thread(p.tx).expect("pinning the client");
            }
            let rt = current_thread();
            let c0 = cpu_now();
            rt.block_on(async move {
                let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
                tcp.set_nodelay(true).expect("nodelay");
                let req = [0x5au8; REQ];
                let mut back = [0u8; REQ];
                if matches!(mode, Mode::Plain | Mode::PlainAgain) {
                    let mut s = tcp;
                    for _ in 0..rounds {
                        s.write_all(&req).await.expect("request");
                        s.read_exact(&mut back).await.expect("reply");
                        assert_eq!(back, req, "every byte echoed");
                    }
                } else {
                    let mut s = ZcStream::from_tokio(tcp, ZcConfig::new()).expect("ZcStream");
                    for _ in 0..rounds {
                        s.write_all(&req).await.expect("request");
                        s.read_exact(&mut back).await.expect("reply");
                        assert_eq!(back, req, "every byte echoed");
                    }
                }
            });
            cpu_now() - c0
        });
        (
            client.join().expect("client"),
            echo.join().expect("echo end"),
        )
    })
}

fn ping_pong_table(o: &Opts, rounds: u64) {
    let modes: Vec<Mode> = o
        .modes
        .iter()
        .copied()
        .filter(|m| matches!(m, Mode::Plain | Mode::PlainAgain | Mode::Copy))
        .collect();
    let mut res: Vec<Vec<(Duration, Duration)>> = modes.iter().map(|_| Vec::new()).collect();
    for _ in 0..o.runs {
        for (i, &m) in modes.iter().enumerate() {
            res[i].push(ping_pong(m, rounds, o.pin));
        }
    }
    println!(
        "\nping-pong on loopback, {rounds} round trips of 64 B per run, median of {} runs (shared, noisy machine); × plain: median of per-run ratios",
        o.runs
    );
    println!("| client | client CPU µs/round trip | × plain | echo end CPU µs/round trip |");
    println!("|---|---:|---:|---:|");
    let us = |d: Duration| d.as_secs_f64() * 1e6 / rounds as f64;
    for (i, &m) in modes.iter().enumerate() {
        println!(
            "| {} | {:.2} | {:.3} | {:.2} |",
            m.name(),
            median(res[i].iter().map(|r| us(r.0)).collect()),
            median(
                res[i]
                    .iter()
                    .zip(&res[0])
                    .map(|(r, p)| us(r.0) / us(p.0))
                    .collect()
            ),
            median(res[i].iter().map(|r| us(r.1)).collect()),
        );
    }
}

const USAGE: &str = "usage: bench_tokio [--gib N] [--runs N] [--no-netns] [--pin] \
                     [--modes plain,plain-again,copy,send-zc,send-bytes,auto,first-copied] [--sizes 65536,1048576] [--ping-pong ROUNDS]";

fn main() {
    let mut o = Opts {
        gib: 1.0,
        runs: 3,
        pin: None,
        modes: ALL_MODES[..DEFAULT_MODES].to_vec(),
        sizes: vec![64 << 10, 1 << 20],
    };
    let mut netns = true;
    let mut rounds = None;
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || {
            it.next()
                .unwrap_or_else(|| panic!("{k} needs a value; {USAGE}"))
        };
        match k.as_str() {
            "--gib" => o.gib = val().parse().expect("--gib NUMBER"),
            "--runs" => o.runs = val().parse().expect("--runs NUMBER"),
            "--no-netns" => netns = false,
            "--pin" => o.pin = Some(Pin { tx: 0, rx: 1 }),
            "--ping-pong" => rounds = Some(val().parse().expect("--ping-pong ROUNDS")),
            "--modes" => {
                o.modes = val()
                    .split(',')
                    .map(|m| {
                        *ALL_MODES
                            .iter()
                            .find(|x| x.flag() == m)
                            .unwrap_or_else(|| panic!("unknown mode {m}; {USAGE}"))
                    })
                    .collect()
            }
            "--sizes" => {
                o.sizes = val()
                    .split(',')
                    .map(|v| v.parse().expect("--sizes BYTES,..."))
                    .collect()
            }
            _ => panic!("{USAGE}"),
        }
    }
    if let Some(rounds) = rounds {
        ping_pong_table(&o, rounds);
        return;
    }
    table("loopback", &o, None);
    if netns {
        match zcnet_testbed::netns::available() {
            Ok(()) => {
                let veth = VethPair::create(9000).expect("a veth pair");
                table("netns (veth, MTU 9000)", &o, Some(&veth));
            }
            Err(why) => println!("\nnetns: skipped ({why})"),
        }
    }
}
