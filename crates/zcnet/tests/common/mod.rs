//! Shared harness for the integration tests: a patterned byte stream whose every byte is
//! checked on arrival, and one-connection transfers over loopback or a veth pair between
//! two network namespaces.
#![allow(dead_code)]

use std::time::Duration;
use zcnet::stream::Listener;
use zcnet::{Receiver, ReceiverConfig, RxPath, Sender, SenderConfig, StatsSnapshot, TxPath};

#[allow(unused_imports)] // each test binary uses its own subset
pub use zcnet_testbed::pattern::{pattern, Verifier, PERIOD};
#[allow(unused_imports)]
pub use zcnet_testbed::topo::{veth_pair, Topo};

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
    c.timeout = Some(timeout());
    c.profile = zcnet::auto::ProfileSource::BuiltIn;
    c
}

pub fn receiver_config(rx: RxPath) -> ReceiverConfig {
    let mut c = ReceiverConfig::new(rx);
    c.timeout = Some(timeout());
    c.profile = zcnet::auto::ProfileSource::BuiltIn;
    c
}

/// Binds a listener on the receiving side of `topo`.
pub fn listen(topo: Topo<'_>, cfg: &ReceiverConfig) -> Listener {
    topo.on_receiver(|| Listener::bind(topo.receiver_addr(0), cfg))
        .expect("binding the listener")
}

/// Connects a sender from the sending side of `topo`.
pub fn connect(topo: Topo<'_>, port: u16, cfg: &SenderConfig) -> Sender {
    topo.on_sender(|| Sender::connect(topo.receiver_addr(port), cfg))
        .expect("connecting the sender")
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

pub use zcnet_testbed::memlock::has_cap_ipc_lock;

/// The bytes a zero-copy sender copied because the kernel would not pin them within the
/// locked-memory limit, counted as such: `Enobufs` (`MSG_ZEROCOPY` charges its pages to the
/// user's locked memory, shared by every test of the binary running in parallel) and
/// `Memlock` (io_uring). Without `CAP_IPC_LOCK` (an ordinary user's 8 MiB) a transfer may
/// have some; with it (root) none, asserted.
pub fn memlock_copied(s: &StatsSnapshot, what: &str) -> u64 {
    let refused = s.fallback_bytes(zcnet::FallbackReason::Enobufs)
        + s.fallback_bytes(zcnet::FallbackReason::Memlock);
    if has_cap_ipc_lock() {
        assert_eq!(
            refused, 0,
            "{what}: with CAP_IPC_LOCK nothing is refused: {s:?}"
        );
    }
    refused
}
