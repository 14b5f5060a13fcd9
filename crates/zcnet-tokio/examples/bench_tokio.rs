//! Side by side in one run, on loopback and (as root) across a veth pair between two
//! network namespaces (zcnet-testbed's `VethPair`, MTU 9000): plain `tokio::net::TcpStream` against `ZcStream`
//! (copy through `AsyncWrite`, `send_zc`, `send_bytes`, and `auto` = `send_bytes` under
//! zcnet's default policy), at 64 KiB and 1 MiB per operation: CPU seconds per GiB of the
//! sending and of the receiving end, their sum, and the sum as a ratio to plain tokio's.
//! `auto` is `ZcStream`'s default: zcnet's default policy (16 KiB threshold, COPIED
//! demotion counted in bytes) and the run-time cost check.
//!
//! ```text
//! cargo run --release -p zcnet-tokio --example bench_tokio -- [--gib 1] [--runs 3] [--no-netns]
//! ```
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
    Copy,
    SendZc,
    SendBytes,
    Auto,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Plain => "tokio TcpStream",
            Mode::Copy => "ZcStream write_all",
            Mode::SendZc => "ZcStream send_zc",
            Mode::SendBytes => "ZcStream send_bytes",
            Mode::Auto => "ZcStream auto",
        }
    }
}

struct Run {
    tx_cpu: Duration,
    rx_cpu: Duration,
    wall: Duration,
    zc_share: f64,
    copied_anyway: f64,
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

async fn send(mode: Mode, addr: SocketAddr, total: u64, size: usize) -> (f64, f64) {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let data = Bytes::from(vec![0x5au8; size]);
    let ops = total / size as u64;
    if mode == Mode::Plain {
        let mut tcp = tcp;
        for _ in 0..ops {
            tcp.write_all(&data).await.expect("write");
        }
        tcp.shutdown().await.expect("shutdown");
        return (0.0, 0.0);
    }
    let config = match mode {
        // The default: zcnet's policy and the cost check.
        Mode::Auto => ZcConfig::new(),
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
            Mode::SendBytes | Mode::Auto => {
                s.send_bytes(data.clone()).await.expect("send_bytes");
            }
            Mode::Plain => unreachable!(),
        }
    }
    s.flush_loans().await.expect("completions");
    s.shutdown().await.expect("shutdown");
    let st = s.stats().snapshot();
    let sent = st.tx_bytes().max(1) as f64;
    (
        st.tx_bytes_zerocopy as f64 / sent,
        st.tx_bytes_zc_copied as f64 / st.tx_bytes_zerocopy.max(1) as f64,
    )
}

fn one(mode: Mode, total: u64, size: usize, veth: Option<&VethPair>) -> Run {
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        let start = Instant::now();
        let rx = scope.spawn(move || {
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
            if let Some(v) = veth {
                v.enter_a().expect("entering namespace a");
            }
            let addr = addr_rx.recv().expect("the receiver's address");
            let rt = current_thread();
            let c0 = cpu_now();
            let shares = rt.block_on(send(mode, addr, total, size));
            (cpu_now() - c0, shares)
        });
        let (tx_cpu, (zc_share, copied_anyway)) = tx.join().expect("sender");
        let (rx_cpu, got) = rx.join().expect("receiver");
        assert_eq!(got, total / size as u64 * size as u64, "every byte counted");
        Run {
            tx_cpu,
            rx_cpu,
            wall: start.elapsed(),
            zc_share,
            copied_anyway,
        }
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn table(where_: &str, gib: f64, runs: usize, veth: Option<&VethPair>) {
    let total = (gib * (1u64 << 30) as f64) as u64;
    println!(
        "\n{where_}, {gib} GiB per run, median of {runs} runs (shared, noisy machine: compare rows of this table only)"
    );
    println!(
        "| sender | op | tx CPU-s/GiB | rx CPU-s/GiB | both CPU-s/GiB | both × plain | Gbit/s | zc share | copied anyway |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    const MODES: [Mode; 5] = [
        Mode::Plain,
        Mode::Copy,
        Mode::SendZc,
        Mode::SendBytes,
        Mode::Auto,
    ];
    for size in [64usize << 10, 1 << 20] {
        let mut results: Vec<Vec<Run>> = MODES.iter().map(|_| Vec::new()).collect();
        for _ in 0..runs {
            for (i, &mode) in MODES.iter().enumerate() {
                results[i].push(one(mode, total, size, veth));
            }
        }
        let both = |r: &Run| (r.tx_cpu + r.rx_cpu).as_secs_f64() / gib;
        let base = median(results[0].iter().map(both).collect());
        for (i, &mode) in MODES.iter().enumerate() {
            let rs = &results[i];
            let sum = median(rs.iter().map(both).collect());
            println!(
                "| {} | {} | {:.3} | {:.3} | {:.3} | {:.2} | {:.1} | {:.1} % | {:.0} % |",
                mode.name(),
                if size == 1 << 20 { "1 MiB" } else { "64 KiB" },
                median(rs.iter().map(|r| r.tx_cpu.as_secs_f64() / gib).collect()),
                median(rs.iter().map(|r| r.rx_cpu.as_secs_f64() / gib).collect()),
                sum,
                sum / base,
                median(
                    rs.iter()
                        .map(|r| total as f64 * 8.0 / r.wall.as_secs_f64() / 1e9)
                        .collect()
                ),
                100.0 * median(rs.iter().map(|r| r.zc_share).collect()),
                100.0 * median(rs.iter().map(|r| r.copied_anyway).collect()),
            );
        }
    }
}

fn main() {
    let mut gib = 1.0f64;
    let mut runs = 3usize;
    let mut netns = true;
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        match k.as_str() {
            "--gib" => {
                gib = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--gib NUMBER")
            }
            "--runs" => {
                runs = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--runs NUMBER")
            }
            "--no-netns" => netns = false,
            _ => panic!("usage: bench_tokio [--gib N] [--runs N] [--no-netns]"),
        }
    }
    table("loopback", gib, runs, None);
    if netns {
        match zcnet_testbed::netns::available() {
            Ok(()) => {
                let veth = VethPair::create(9000).expect("a veth pair");
                table("netns (veth, MTU 9000)", gib, runs, Some(&veth));
            }
            Err(why) => println!("\nnetns: skipped ({why})"),
        }
    }
}
