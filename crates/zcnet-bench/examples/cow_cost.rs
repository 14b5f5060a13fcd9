//! What copy semantics cost on the `cow` path: sender CPU per GiB of `cow` (write-protect
//! while in flight, copy on write) against loaned zero-copy (`zerocopy`, `Sender::send`) and
//! plain copying (`copy`), with buffer rings deep enough that no buffer is rewritten while
//! in flight (no faults) and with a single buffer rewritten after every send (a fault per
//! touched page). It is the analogue of Solaris's table 6 (Chu, "Zero-Copy TCP in Solaris", §7: "0-COW", "w/o COW",
//! single copy).
//!
//! Two topologies:
//!
//! * `lo`: TCP over loopback to a receiver thread in this process. Local delivery copies
//!   every zero-copy skb (docs/measurements/kernel-findings.md §1, COPIED), so this shows the mechanism's cost, not a
//!   saving.
//! * `sink`: transmit-only. TCP cannot be used — with the peer down no ACK ever comes, so
//!   the original skbs stay in the retransmit queue and their pages are never released.
//!   Instead UDP with GSO (`UDP_SEGMENT` 8192, 56 KiB per send) is sent into a veth pair
//!   (MTU 9000) whose peer end is down: the driver frees each skb at once, as a NIC does
//!   after transmit, and completions come back *not* COPIED (docs/measurements/kernel-findings.md §1). The `cow` rows
//!   protect with [`zcnet::cow::protect`], the same engine the TCP path uses.
//!
//! Every mode writes 8 bytes into each page of a buffer before sending it (an application
//! updating its data), so a buffer still in flight faults on every page.
//!
//! ```text
//! cargo run --release -p zcnet-bench --example cow_cost -- [--gib 1] [--runs 3] [--lo-only|--sink-only]
//!     [--only copy|loan|cow|cow-auto] [--ring deep|one|both]
//! ```
//! Needs root for the sink (network namespaces); it is skipped, with a message, otherwise.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};
use zcnet::cow::{self, CowPolicy};
use zcnet::stream::Listener;
use zcnet::zc::Completions;
use zcnet::{Policy, ReceiverConfig, RxPath, Sender, SenderConfig, StatsSnapshot, TxPath};
use zcnet_bench::cpu::{process_rusage, thread_rusage};
use zcnet_sys::raw::socket;
use zcnet_sys::raw::udp;
use zcnet_sys::raw::zerocopy as zc;
use zcnet_testbed::netns::VethPair;

const PAGE: usize = 4096;
/// Bytes per TCP send on loopback.
const LO_SEND: usize = 256 << 10;
/// Bytes per UDP GSO send on the sink: 7 segments of 8192 (a UDP datagram is < 64 KiB).
const SINK_SEND: usize = 7 * 8192;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// `send` (copy).
    Copy,
    /// `MSG_ZEROCOPY` from loaned buffers, reused only after their completion.
    Loan,
    /// `MSG_ZEROCOPY` from write-protected application buffers.
    Cow,
    /// `cow` with the default policy (Solaris's working-set threshold).
    CowAuto,
}

impl Mode {
    fn key(self) -> &'static str {
        match self {
            Mode::Copy => "copy",
            Mode::Loan => "loan",
            Mode::Cow => "cow",
            Mode::CowAuto => "cow-auto",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Copy => "copy",
            Mode::Loan => "zerocopy (loan)",
            Mode::Cow => "cow",
            Mode::CowAuto => "cow, threshold auto",
        }
    }
}

#[derive(Debug, Default, Clone)]
struct Row {
    bytes: u64,
    sends: u64,
    wall: f64,
    /// Sender-side CPU: the process minus the receiver thread (includes the fault handler).
    user: f64,
    sys: f64,
    faults: u64,
    protected: u64,
    zc_copied: u64,
    zc_bytes: u64,
    fallback_bytes: u64,
}

impl Row {
    fn per_gib(&self, s: f64) -> f64 {
        s / (self.bytes as f64 / (1u64 << 30) as f64)
    }
}

/// Writes 8 bytes into every page of `b`: the application touching its data.
fn touch(b: &mut [u8], seq: u64) {
    for p in (0..b.len()).step_by(PAGE) {
        let end = (p + 8).min(b.len());
        b[p..end].copy_from_slice(&seq.to_ne_bytes()[..end - p]);
    }
}

/// `ring` page-aligned buffers of `size` bytes in one heap allocation, pre-faulted.
struct Ring {
    store: Vec<u8>,
    start: usize,
    size: usize,
    n: usize,
}

impl Ring {
    fn new(n: usize, size: usize) -> Ring {
        let store = vec![0x5Au8; n * size + PAGE];
        let base = store.as_ptr() as usize;
        let start = base.next_multiple_of(PAGE) - base;
        Ring {
            store,
            start,
            size,
            n,
        }
    }
    fn get(&mut self, i: usize) -> &mut [u8] {
        let s = self.start + (i % self.n) * self.size;
        &mut self.store[s..s + self.size]
    }
}

fn cpu_now() -> (f64, f64) {
    let r = process_rusage().expect("getrusage");
    (r.user.as_secs_f64(), r.sys.as_secs_f64())
}

fn lo_run(mode: Mode, ring: usize, bytes: u64) -> Row {
    let listener = Listener::bind(
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)),
        &ReceiverConfig::new(RxPath::Copy),
    )
    .expect("listen");
    let port = listener.local_addr().unwrap().port();
    std::thread::scope(|s| {
        let rx = s.spawn(|| {
            let mut r = listener.accept().expect("accept");
            let t0 = thread_rusage().unwrap();
            let mut n = 0u64;
            while let Some(c) = r.recv().expect("recv") {
                n += c.len() as u64;
            }
            let t1 = thread_rusage().unwrap();
            (
                n,
                (t1.user - t0.user).as_secs_f64(),
                (t1.sys - t0.sys).as_secs_f64(),
            )
        });
        let path = match mode {
            Mode::Copy => TxPath::Copy,
            Mode::Loan => TxPath::Zerocopy,
            Mode::Cow | Mode::CowAuto => TxPath::Cow,
        };
        let mut cfg = SenderConfig::new(path);
        cfg.policy = Policy::always();
        cfg.cow = if mode == Mode::CowAuto {
            CowPolicy::default()
        } else {
            CowPolicy::always()
        };
        cfg.pool_buffers = ring;
        cfg.buf_bytes = LO_SEND;
        let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
        let mut tx = Sender::connect(addr, &cfg).expect("connect");
        let mut bufs = (mode != Mode::Loan).then(|| Ring::new(ring, LO_SEND));
        let (u0, s0) = cpu_now();
        let t0 = Instant::now();
        let mut sent = 0u64;
        let mut seq = 0u64;
        while sent < bytes {
            match &mut bufs {
                None => {
                    let mut b = tx.buffer().expect("buffer");
                    touch(b.storage_mut(), seq);
                    b.set_len(LO_SEND);
                    tx.send(b).expect("send");
                }
                Some(r) => {
                    let b = r.get(seq as usize);
                    touch(b, seq);
                    tx.send_slice(b).expect("send_slice");
                }
            }
            sent += LO_SEND as u64;
            seq += 1;
        }
        let st: StatsSnapshot = tx.finish().expect("finish");
        let wall = t0.elapsed().as_secs_f64();
        let (u1, s1) = cpu_now();
        let (n, ru, rs) = rx.join().unwrap();
        assert_eq!(n, sent, "receiver byte count");
        Row {
            bytes: sent,
            sends: seq,
            wall,
            user: (u1 - u0 - ru).max(0.0),
            sys: (s1 - s0 - rs).max(0.0),
            faults: st.tx_cow_faults,
            protected: st.tx_cow_bytes_protected,
            zc_copied: st.tx_bytes_zc_copied,
            zc_bytes: st.tx_bytes_zerocopy,
            fallback_bytes: st.fallbacks.iter().map(|f| f.2).sum(),
        }
    })
}

/// What a sink send lends until its completion.
enum SinkLoan {
    Buf,
    Span(cow::Protection),
}

fn sink_run(pair: &VethPair, mode: Mode, ring: usize, bytes: u64) -> Row {
    let sock = pair
        .run_in_a(|| socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None))
        .expect("netns")
        .expect("socket");
    zc::set_so_zerocopy(sock.as_fd()).expect("SO_ZEROCOPY");
    sock.connect(&SocketAddr::V4(SocketAddrV4::new(pair.addr_b(), 9)).into())
        .expect("connect");
    udp::set_udp_segment(sock.as_fd(), 8192).expect("UDP_SEGMENT");
    sock.set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let fd = sock.as_fd();
    let mut bufs = Ring::new(ring, SINK_SEND);
    // Which buffers are lent (loan mode waits for them), and the completion bookkeeping.
    let mut lent = vec![false; ring];
    let mut done: Completions<(usize, SinkLoan)> = Completions::new();
    let mut entries = Vec::new();
    let mut row = Row::default();
    let mut reap = |done: &mut Completions<(usize, SinkLoan)>, lent: &mut [bool], row: &mut Row| {
        entries.clear();
        zc::read_errqueue(fd, &mut entries).expect("errqueue");
        for e in &entries {
            if let zc::ErrqueueEntry::Zerocopy { lo, hi, copied } = *e {
                let d = done.complete(lo, hi).expect("completion range");
                if copied {
                    row.zc_copied += d.bytes;
                }
                for (i, loan) in d.released {
                    lent[i] = false;
                    if let SinkLoan::Span(p) = loan {
                        row.faults += p.release().faults;
                    }
                }
            }
        }
    };
    let (u0, s0) = cpu_now();
    let t0 = Instant::now();
    let mut seq = 0u64;
    while row.bytes < bytes {
        let i = seq as usize % ring;
        // The sink frees each skb during the send, so its completion is already queued. A
        // loaned buffer is touched only once reaped (loan semantics); the application's own
        // buffer (copy, cow) is touched *before* reaping — the order a NIC's completion
        // latency produces — so with one buffer every cow send faults.
        if mode == Mode::Loan {
            reap(&mut done, &mut lent, &mut row);
            while lent[i] {
                reap(&mut done, &mut lent, &mut row);
            }
        }
        let b = bufs.get(i);
        touch(b, seq);
        if mode != Mode::Loan {
            reap(&mut done, &mut lent, &mut row);
        }
        let sent = match mode {
            Mode::Copy => {
                socket::send(fd, b, zcnet_sys::raw::socket::SendFlags::empty()).expect("send")
            }
            _ => {
                let loan = match mode {
                    Mode::Loan => SinkLoan::Buf,
                    _ => match cow::protect(b) {
                        Ok(p) => {
                            row.protected += b.len() as u64;
                            SinkLoan::Span(p)
                        }
                        Err(e) => panic!("protect: {e}"),
                    },
                };
                let id = done.next_id();
                let n = loop {
                    match zc::send_zerocopy(fd, b, zcnet_sys::raw::socket::SendFlags::empty()) {
                        Ok(n) => break n,
                        Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                            reap(&mut done, &mut lent, &mut row)
                        }
                        Err(e) => panic!("send(MSG_ZEROCOPY): {e}"),
                    }
                };
                done.record_call(n);
                row.zc_bytes += n as u64;
                lent[i] = true;
                if let Some((_, SinkLoan::Span(p))) = done.lend((i, loan), id, id) {
                    p.release();
                }
                n
            }
        };
        assert_eq!(sent, b.len(), "UDP sends are whole");
        row.bytes += sent as u64;
        seq += 1;
    }
    // Drain the last completions.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done.is_idle() && Instant::now() < deadline {
        let _ = socket::poll(
            fd,
            zcnet_sys::raw::socket::PollFlags::empty(),
            Some(Duration::from_millis(10)),
        );
        reap(&mut done, &mut lent, &mut row);
    }
    for (_, loan) in done.abandon() {
        drop(loan);
    }
    row.wall = t0.elapsed().as_secs_f64();
    let (u1, s1) = cpu_now();
    row.user = u1 - u0;
    row.sys = s1 - s0;
    row.sends = seq;
    row
}

fn median(mut rows: Vec<Row>) -> Row {
    rows.sort_by(|a, b| (a.user + a.sys).total_cmp(&(b.user + b.sys)));
    rows.swap_remove(rows.len() / 2)
}

fn print_header(topo: &str, send: usize) {
    println!();
    println!("{topo}: {} KiB per send; CPU = sender process (incl. the fault handler), receiver thread excluded; median of runs by CPU", send >> 10);
    println!(
        "{:<22} {:>6} {:>9} {:>9} {:>9} {:>10} {:>11} {:>9} {:>9} {:>9}",
        "mode",
        "ring",
        "Gbit/s",
        "user s/G",
        "sys s/G",
        "CPU s/GiB",
        "µs/send",
        "faults/G",
        "prot %",
        "zc cp %"
    );
}

fn print_row(mode: Mode, ring: usize, r: &Row) {
    let gib = r.bytes as f64 / (1u64 << 30) as f64;
    println!(
        "{:<22} {:>6} {:>9.1} {:>9.3} {:>9.3} {:>10.3} {:>11.1} {:>9.0} {:>9.1} {:>9.1}",
        mode.name(),
        ring,
        r.bytes as f64 * 8.0 / r.wall / 1e9,
        r.per_gib(r.user),
        r.per_gib(r.sys),
        r.per_gib(r.user + r.sys),
        (r.user + r.sys) / r.sends as f64 * 1e6,
        r.faults as f64 / gib,
        100.0 * r.protected as f64 / r.bytes as f64,
        if r.zc_bytes > 0 {
            100.0 * r.zc_copied as f64 / r.zc_bytes as f64
        } else {
            0.0
        },
    );
    let _ = r.fallback_bytes;
}

fn main() {
    let mut gib = 1.0f64;
    let mut runs = 3usize;
    let (mut lo, mut sink) = (true, true);
    let mut only: Option<String> = None;
    let mut rings = "both".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--gib" => gib = args.next().and_then(|v| v.parse().ok()).expect("--gib N"),
            "--runs" => runs = args.next().and_then(|v| v.parse().ok()).expect("--runs N"),
            "--lo-only" => sink = false,
            "--sink-only" => lo = false,
            "--only" => only = args.next(),
            "--ring" => rings = args.next().expect("--ring deep|one|both"),
            other => panic!("unknown argument {other:?}"),
        }
    }
    let bytes = (gib * (1u64 << 30) as f64) as u64;
    let wanted = |mode: Mode, ring: usize| {
        only.as_deref().is_none_or(|o| o == mode.key())
            && match rings.as_str() {
                "deep" => ring > 1,
                "one" => ring == 1,
                _ => true,
            }
    };
    match cow::backend() {
        Ok(b) => println!("copy-on-write engine: {b:?}"),
        Err(why) => println!("no copy-on-write engine ({why}): cow rows copy"),
    }
    if lo {
        print_header("lo (TCP)", LO_SEND);
        // 64 × 256 KiB = 16 MiB, far above what the socket holds: no buffer is touched in
        // flight. One buffer: touched while its previous send is in flight.
        let cases = [
            (Mode::Copy, 64),
            (Mode::Loan, 64),
            (Mode::Cow, 64),
            (Mode::Copy, 1),
            (Mode::Loan, 1),
            (Mode::Cow, 1),
            (Mode::CowAuto, 1),
        ];
        for (mode, ring) in cases.into_iter().filter(|&(m, r)| wanted(m, r)) {
            let r = median((0..runs).map(|_| lo_run(mode, ring, bytes)).collect());
            print_row(mode, ring, &r);
        }
    }
    if sink {
        if let Err(why) = zcnet_testbed::netns::available() {
            println!("\nsink: SKIPPED (network namespaces unavailable: {why})");
            return;
        }
        let pair = VethPair::create(9000).expect("veth pair");
        // A permanent neighbour entry so nothing waits for ARP, then the peer goes down:
        // frames are dropped by the veth driver, which frees the skbs as a NIC would.
        let st = std::process::Command::new("ip")
            .args(["-n", pair.name_a(), "neigh", "replace"])
            .arg(pair.addr_b().to_string())
            .args([
                "lladdr",
                "02:00:00:00:00:02",
                "dev",
                pair.ifname_a(),
                "nud",
                "permanent",
            ])
            .status()
            .expect("ip neigh");
        assert!(st.success(), "ip neigh replace failed");
        pair.set_link_up(zcnet_testbed::netns::Side::B, false)
            .expect("peer down");
        print_header("sink (UDP GSO into a veth whose peer is down)", SINK_SEND);
        // 1024 × 56 KiB = 56 MiB: cold, beyond L3, as a real application's data would be.
        let cases = [
            (Mode::Copy, 1024),
            (Mode::Loan, 1024),
            (Mode::Cow, 1024),
            (Mode::Copy, 1),
            (Mode::Loan, 1),
            (Mode::Cow, 1),
        ];
        for (mode, ring) in cases.into_iter().filter(|&(m, r)| wanted(m, r)) {
            let r = median(
                (0..runs)
                    .map(|_| sink_run(&pair, mode, ring, bytes))
                    .collect(),
            );
            print_row(mode, ring, &r);
        }
    }
}
