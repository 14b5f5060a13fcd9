//! What the io_uring transmit path pays for honouring the socket as given: it reads the
//! socket's file status flags (`fcntl(F_GETFL)`, one syscall) on every send, so that a
//! caller who makes the socket non-blocking — before or after handing it over — gets
//! `WouldBlock` instead of a wait. A micro-benchmark, not a test.
//!
//! ```text
//! cargo run --release -p zcnet-bench --example nonblock_check              # 5 rounds of 1 GiB
//! cargo run --release -p zcnet-bench --example nonblock_check -- --rounds 1 --gib 1
//! ```
//!
//! Each round sends `--gib` GiB in 64 KiB sends through [`zcnet::Sender`] on the `uring`
//! path (`Policy::always()`, fixed buffers) over loopback TCP to a thread that reads with
//! `recv`, and reports the sending thread's CPU (`getrusage(RUSAGE_THREAD)`) per GiB and per
//! send; then times a million `F_GETFL` calls on a connected socket (the check alone). The
//! check's share of a send is the second over the first. To see the cost side by side, build
//! it once more with the check taken out of `tx/uring.rs` and run the two binaries in turn
//! (docs/measurements/uring.md gives the figures and how they were taken).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use zcnet::stream::Listener;
use zcnet::{Policy, Pool, ReceiverConfig, RxPath, Sender, SenderConfig, TxPath};
use zcnet_bench::cpu::{thread_rusage, CpuSeconds};

const SIZE: usize = 64 << 10;
const CHECKS: u32 = 1_000_000;

/// Sender CPU-s per GiB and µs per send of `gib` GiB of 64 KiB sends on the uring path.
fn sends(gib: u64) -> (f64, f64, u64) {
    let mut rcfg = ReceiverConfig::new(RxPath::Copy);
    rcfg.buf_bytes = 1 << 20;
    let listener = Listener::bind(SocketAddr::from(([127, 0, 0, 1], 0)), &rcfg).unwrap();
    let addr = listener.local_addr().unwrap();
    let reader = std::thread::spawn(move || {
        let mut rx = listener.accept().unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0u64;
        loop {
            let got = rx.recv_into(&mut buf).unwrap();
            if got == 0 {
                break n;
            }
            n += got as u64;
        }
    });
    let mut cfg = SenderConfig::new(TxPath::Uring);
    cfg.policy = Policy::always();
    cfg.pool = Some(Pool::new(1024, SIZE).expect("transmit pool"));
    let ops = (gib << 30) as usize / SIZE;
    let mut tx = Sender::connect(addr, &cfg).unwrap();
    let t0 = thread_rusage().unwrap();
    for i in 0..ops {
        let mut b = tx.buffer().unwrap();
        b.storage_mut()[0] = i as u8; // the application writes its buffer
        b.set_len(SIZE);
        tx.send(b).unwrap();
    }
    let s = tx.finish().unwrap();
    let cpu = CpuSeconds::between(t0, thread_rusage().unwrap()).total();
    let got = reader.join().unwrap();
    assert_eq!(got, (ops * SIZE) as u64, "every byte arrived");
    (
        cpu / gib as f64,
        cpu * 1e6 / ops as f64,
        s.tx_bytes_zerocopy,
    )
}

/// Nanoseconds (thread CPU) per `fcntl(F_GETFL)` on a connected TCP socket.
fn check_ns() -> f64 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let fd = c.as_fd();
    let t0 = thread_rusage().unwrap();
    let mut nonblocking = 0u32;
    for _ in 0..CHECKS {
        let f = zcnet_sys::raw::splice::status_flags(fd).unwrap();
        nonblocking += u32::from(f.contains(zcnet_sys::raw::splice::OFlags::NONBLOCK));
    }
    let cpu = CpuSeconds::between(t0, thread_rusage().unwrap()).total();
    assert_eq!(nonblocking, 0);
    cpu * 1e9 / f64::from(CHECKS)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: u64| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map_or(default, |v| v.parse().expect("a number"))
    };
    let rounds = arg("--rounds", 5).max(1);
    let gib = arg("--gib", 1).max(1);
    let (mut per_gib, mut per_send, mut per_check) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let (g, us, zc) = sends(gib);
        let ns = check_ns();
        println!(
            "round {r}: uring 64 KiB sends: {g:.3} CPU-s/GiB, {us:.2} µs/send \
             ({zc} bytes zero-copy); F_GETFL: {ns:.0} ns/call = {:.2} % of a send",
            ns / (us * 10.0)
        );
        per_gib.push(g);
        per_send.push(us);
        per_check.push(ns);
    }
    let (g, us, ns) = (median(per_gib), median(per_send), median(per_check));
    println!(
        "median of {rounds}: {g:.3} CPU-s/GiB, {us:.2} µs/send; F_GETFL {ns:.0} ns/call = {:.2} % of a send",
        ns / (us * 10.0)
    );
}
