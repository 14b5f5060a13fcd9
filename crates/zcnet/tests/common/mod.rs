//! Shared harness for the integration tests: a patterned byte stream whose every byte is
//! checked on arrival, and one-connection transfers over loopback or a veth pair between
//! two network namespaces.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::OnceLock;
use std::time::Duration;
use zcnet::conn::Listener;
use zcnet::netns::VethPair;
use zcnet::{Receiver, ReceiverConfig, RxPath, Sender, SenderConfig, StatsSnapshot, TxPath};

/// Period of the pattern: a prime, so a page or a segment landing at the wrong offset never
/// lines up with the right bytes.
pub const PERIOD: usize = 1_048_573;

fn table() -> &'static [u8] {
    static T: OnceLock<Vec<u8>> = OnceLock::new();
    T.get_or_init(|| {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let period: Vec<u8> = (0..PERIOD)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        // The tail repeats the start, so any window of up to 8 MiB is one slice.
        period
            .iter()
            .cycle()
            .take(PERIOD + (8 << 20))
            .copied()
            .collect()
    })
}

/// The pattern's bytes at stream offsets `pos..pos+len` (len ≤ 8 MiB).
pub fn pattern(pos: u64, len: usize) -> &'static [u8] {
    let start = (pos % PERIOD as u64) as usize;
    &table()[start..start + len]
}

/// Checks a received stream incrementally.
#[derive(Debug, Default)]
pub struct Verifier {
    pub pos: u64,
}

impl Verifier {
    pub fn check(&mut self, data: &[u8]) {
        let mut off = 0;
        while off < data.len() {
            let n = (data.len() - off).min(4 << 20);
            let want = pattern(self.pos, n);
            if want != &data[off..off + n] {
                let i = want
                    .iter()
                    .zip(&data[off..off + n])
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                let at = self.pos + i as u64;
                let got = &data[off + i..(off + i + 64).min(data.len())];
                // Where in the pattern do the received bytes come from?
                let found = (0..PERIOD as u64)
                    .find(|&p| pattern(p, got.len()) == got)
                    .map_or("nowhere".to_string(), |p| format!("pattern offset {p}"));
                panic!(
                    "byte {at} of the stream is wrong (chunk of {} at stream {}; received bytes match {found}): got {:?} want {:?}",
                    data.len(),
                    self.pos - off as u64,
                    &got[..got.len().min(16)],
                    &pattern(at, 16)
                );
            }
            self.pos += n as u64;
            off += n;
        }
    }
}

/// Where a transfer runs.
#[derive(Debug, Clone, Copy)]
pub enum Topo<'a> {
    Loopback,
    Netns(&'a VethPair),
}

/// One transfer's shape.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub tx: TxPath,
    pub rx: RxPath,
    pub size: u64,
    /// 0: page-aligned buffers, `recv()` chunks; 1: data at +1 in the buffers, `recv_into`
    /// at +1.
    pub offset: usize,
}

pub struct Outcome {
    pub tx: StatsSnapshot,
    pub rx: StatsSnapshot,
    pub received: u64,
}

pub fn timeout() -> Duration {
    Duration::from_secs(30)
}

/// `auto` runs on its built-in defaults in the shared helpers, so a profile `zcnet tune`
/// left on the machine cannot change what a test expects; tests/auto.rs gives profiles.
pub fn sender_config(tx: TxPath) -> SenderConfig {
    let mut c = SenderConfig::new(tx);
    c.policy = zcnet::Policy::always();
    c.timeout = timeout();
    c.profile = zcnet::auto::ProfileSource::BuiltIn;
    c
}

pub fn receiver_config(rx: RxPath) -> ReceiverConfig {
    let mut c = ReceiverConfig::new(rx);
    c.timeout = timeout();
    c.profile = zcnet::auto::ProfileSource::BuiltIn;
    c
}

/// Binds a listener on the receiving side of `topo`.
pub fn listen(topo: Topo<'_>, cfg: &ReceiverConfig) -> Listener {
    match topo {
        Topo::Loopback => {
            Listener::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0), cfg).unwrap()
        }
        Topo::Netns(p) => {
            let addr = SocketAddr::new(IpAddr::V4(p.addr_b()), 0);
            p.run_in_b(|| Listener::bind(addr, cfg)).unwrap().unwrap()
        }
    }
}

/// Connects a sender from the sending side of `topo`.
pub fn connect(topo: Topo<'_>, port: u16, cfg: &SenderConfig) -> Sender {
    match topo {
        Topo::Loopback => {
            Sender::connect(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port), cfg).unwrap()
        }
        Topo::Netns(p) => {
            let addr = SocketAddr::new(IpAddr::V4(p.addr_b()), port);
            p.run_in_a(|| Sender::connect(addr, cfg)).unwrap().unwrap()
        }
    }
}

/// Sends `size` pattern bytes in pool-buffer pieces, data placed at `offset` in each buffer.
pub fn send_pattern(tx: &mut Sender, size: u64, offset: usize) {
    let mut pos = 0u64;
    while pos < size {
        let mut buf = tx.buffer().unwrap();
        let n = ((buf.capacity() - offset) as u64).min(size - pos) as usize;
        buf.fill_at(offset, pattern(pos, n));
        tx.send(buf).unwrap();
        pos += n as u64;
    }
}

/// Receives to end of stream, verifying every byte; returns the byte count.
pub fn recv_pattern(rx: &mut Receiver, offset: usize) -> u64 {
    let mut v = Verifier::default();
    if offset == 0 {
        while let Some(chunk) = rx.recv().unwrap() {
            v.check(&chunk);
        }
    } else {
        let mut buf = vec![0u8; 300_001 + offset];
        loop {
            let n = rx.recv_into(&mut buf[offset..]).unwrap();
            if n == 0 {
                break;
            }
            v.check(&buf[offset..offset + n]);
        }
    }
    v.pos
}

/// Runs one transfer and returns both sides' stats.
pub fn transfer(topo: Topo<'_>, case: Case) -> Outcome {
    let listener = listen(topo, &receiver_config(case.rx));
    let port = listener.local_addr().unwrap().port();
    std::thread::scope(|s| {
        let r = s.spawn(|| {
            let mut rx = listener.accept().unwrap();
            let n = recv_pattern(&mut rx, case.offset);
            (n, rx.stats().snapshot())
        });
        let mut tx = connect(topo, port, &sender_config(case.tx));
        send_pattern(&mut tx, case.size, case.offset);
        let txs = tx.finish().unwrap();
        let (received, rxs) = r.join().unwrap();
        Outcome {
            tx: txs,
            rx: rxs,
            received,
        }
    })
}

/// Skips (visibly) when namespaces cannot be built here; returns the pair otherwise.
pub fn veth_or_skip(mtu: u32) -> Option<VethPair> {
    if let Err(why) = zcnet::netns::available() {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: network namespaces unavailable: {why}"
        );
        return None;
    }
    Some(VethPair::create(mtu).unwrap())
}
