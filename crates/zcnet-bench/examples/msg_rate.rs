//! Messages per second through `zcnet_msg` on loopback: copy (`send(&[u8])`) against
//! zero-copy loans (`buffer` + `send` with `MSG_ZEROCOPY`), 64 KiB and 1 MiB messages,
//! with lo's own 64 KiB datagrams and with 1472-byte datagrams (GSO 44 per call, GRO on
//! receive) — a measurement, not a test.
//!
//! ```text
//! cargo run --release -p zcnet-bench --example msg_rate            # 256 MiB per cell
//! cargo run --release -p zcnet-bench --example msg_rate -- --quick # 64 MiB per cell
//! ```
//!
//! The receiver thread checks each message's id and length (not its bytes: the tests do that)
//! and acknowledges it over a channel; the sender keeps at most 4 MiB unacknowledged, so no
//! burst outruns the socket buffer and nothing is lost (a loss aborts the run). CPU is
//! `getrusage(RUSAGE_THREAD)` of each thread. On loopback the kernel copies zero-copy pages
//! at delivery anyway (docs/measurements/kernel-findings.md §1), so zero-copy is expected to lose here; the transmit-only
//! sink (`zcnet bench --topology sink`) is where it can win. Compare within one run only.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use zcnet::Policy;
use zcnet_bench::cpu::{thread_rusage, CpuSeconds};
use zcnet_msg::{MsgConfig, MsgEvent, MsgReceiver, MsgSender, MsgTx};

fn run(size: usize, total: usize, tx_mode: MsgTx, segment: Option<usize>) -> String {
    let mut cfg = MsgConfig::new(tx_mode);
    cfg.policy = Policy::always();
    cfg.segment = segment;
    cfg.recv_buffer = 32 << 20;
    let mut rx =
        MsgReceiver::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0), &cfg).unwrap();
    let mut tx = MsgSender::connect(rx.local_addr().unwrap(), &cfg).unwrap();
    let count = (total / size).max(1);
    let (ack_tx, ack_rx) = mpsc::channel::<()>();
    let window = ((4 << 20) / size).max(1);
    let payload: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    let started = Instant::now();
    let (rx_cpu, tx_cpu) = std::thread::scope(|s| {
        let receiver = s.spawn(move || {
            let before = thread_rusage().unwrap();
            for id in 0..count as u64 {
                match rx.recv(Duration::from_secs(30)).unwrap() {
                    Some(MsgEvent::Message(m)) => {
                        assert_eq!((m.id, m.len()), (id, size));
                        rx.recycle(m);
                        let _ = ack_tx.send(());
                    }
                    other => panic!("message {id}: {other:?}"),
                }
            }
            CpuSeconds::between(before, thread_rusage().unwrap())
        });
        let before = thread_rusage().unwrap();
        let mut unacked = 0;
        for _ in 0..count {
            if unacked >= window {
                ack_rx.recv_timeout(Duration::from_secs(30)).unwrap();
                unacked -= 1;
            }
            match tx_mode {
                MsgTx::Copy => {
                    tx.send_slice(&payload).unwrap();
                }
                _ => {
                    let mut b = tx.buffer(size).unwrap();
                    for (off, block) in b.payload_mut() {
                        block.copy_from_slice(&payload[off..off + block.len()]);
                    }
                    tx.send(b).unwrap();
                }
            }
            unacked += 1;
        }
        let rx_cpu = receiver.join().unwrap();
        tx.flush(Duration::from_secs(10)).unwrap();
        (
            rx_cpu,
            CpuSeconds::between(before, thread_rusage().unwrap()),
        )
    });
    let secs = started.elapsed().as_secs_f64();
    let gib = (count * size) as f64 / (1u64 << 30) as f64;
    let io = tx.io_stats().snapshot();
    format!(
        "{:>8} {:>9} {:>6} {:>10.0} {:>8.2} {:>9.3} {:>9.3} {:>6.0}%",
        if size >= 1 << 20 {
            format!("{} MiB", size >> 20)
        } else {
            format!("{} KiB", size >> 10)
        },
        format!("{tx_mode:?}").to_lowercase(),
        tx.segment(),
        count as f64 / secs,
        gib * 8.0 * 1.073_741_824 / secs,
        tx_cpu.total() / gib,
        rx_cpu.total() / gib,
        100.0 * io.tx_bytes_zc_copied as f64 / io.tx_bytes().max(1) as f64,
    )
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let total = if quick { 64 << 20 } else { 256 << 20 };
    println!(
        "{:>8} {:>9} {:>6} {:>10} {:>8} {:>9} {:>9} {:>7}",
        "message", "tx", "dgram", "msgs/s", "Gbit/s", "tx s/GiB", "rx s/GiB", "COPIED"
    );
    for segment in [None, Some(1472)] {
        for size in [64 << 10, 1 << 20] {
            for tx in [MsgTx::Copy, MsgTx::Zerocopy] {
                println!("{}", run(size, total, tx, segment));
            }
        }
    }
}
