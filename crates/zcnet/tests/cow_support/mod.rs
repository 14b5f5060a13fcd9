//! Helpers shared by the copy-on-write tests (`cow.rs`, `cow_mprotect.rs`): a `cow` sender
//! that protects everything, a receiver slow enough that data stays in flight, and a
//! sender loop that overwrites its buffer right after every send.
#![allow(dead_code)]

use crate::common::{connect, listen, pattern, receiver_config, Topo, Verifier};
use std::sync::Barrier;
use std::time::Duration;
use zcnet::cow::CowPolicy;
use zcnet::{Policy, Receiver, RxPath, Sender, SenderConfig, StatsSnapshot, TxPath};

pub const PAGE: usize = 4096;

/// A `cow` sender that protects every eligible span (no working-set threshold, no size
/// threshold, no COPIED demotion: loopback and veth copy in the kernel anyway).
pub fn cow_config() -> SenderConfig {
    let mut c = SenderConfig::new(TxPath::Cow);
    c.policy = Policy::always();
    c.cow = CowPolicy::always();
    c.timeout = Some(crate::common::timeout());
    // Room for several MiB in the send queue, so a stalled receiver cannot block send_slice.
    c.sndbuf = Some(8 << 20);
    c
}

/// A receiver that keeps data in flight: a small window, read slowly.
pub fn slow_receiver_config(rx: RxPath) -> zcnet::ReceiverConfig {
    let mut c = receiver_config(rx);
    c.rcvbuf = Some(64 << 10);
    c
}

/// Reads to end of stream, verifying every byte, pausing now and then so the window stays
/// closed and the sender's data stays in its send queue.
pub fn recv_slowly(rx: &mut Receiver, pause_every: u64) -> u64 {
    let mut v = Verifier::default();
    let mut next_pause = pause_every;
    while let Some(chunk) = rx.recv().unwrap() {
        v.check(&chunk);
        if v.pos >= next_pause {
            std::thread::sleep(Duration::from_micros(500));
            next_pause += pause_every;
        }
    }
    v.pos
}

/// A page-aligned `len`-byte window into `store` (a heap Vec), at `offset` past the page.
pub fn window(store: &mut [u8], offset: usize, len: usize) -> &mut [u8] {
    let base = store.as_ptr() as usize;
    let start = base.next_multiple_of(PAGE) - base + offset;
    &mut store[start..start + len]
}

/// One connection: `send` drives the sender, the receiver verifies the pattern stream.
pub fn run(
    topo: Topo<'_>,
    rx_path: RxPath,
    send: impl FnOnce(&mut Sender) -> u64 + Send,
) -> (u64, StatsSnapshot) {
    run_gated(topo, rx_path, None, send)
}

/// [`run`], the receiver reading nothing until it has passed `gate` (if any) — which `send`
/// must pass too, so that what it sent stays in flight until it lets the receiver go.
pub fn run_gated(
    topo: Topo<'_>,
    rx_path: RxPath,
    gate: Option<&Barrier>,
    send: impl FnOnce(&mut Sender) -> u64 + Send,
) -> (u64, StatsSnapshot) {
    let listener = listen(topo, &slow_receiver_config(rx_path));
    let port = listener.local_addr().unwrap().port();
    std::thread::scope(|s| {
        let r = s.spawn(|| {
            let mut rx = listener.accept().unwrap();
            if let Some(g) = gate {
                g.wait();
            }
            recv_slowly(&mut rx, 256 << 10)
        });
        let mut tx = connect(topo, port, &cow_config());
        let sent = send(&mut tx);
        let stats = tx.finish().unwrap();
        let got = r.join().unwrap();
        assert_eq!(got, sent, "received byte count");
        (sent, stats)
    })
}

/// Sends `rounds` slices of `len` bytes from one reused heap buffer, overwriting it right
/// after each `send_slice` returns (first with garbage, then with the next slice).
pub fn overwrite_after_each_send(tx: &mut Sender, rounds: usize, len: usize) -> u64 {
    let mut store = vec![0u8; len + PAGE];
    let mut pos = 0u64;
    for round in 0..rounds {
        let b = window(&mut store, 0, len);
        b.copy_from_slice(pattern(pos, len));
        tx.send_slice(b).unwrap();
        b.fill(0xA5 ^ round as u8);
        pos += len as u64;
    }
    pos
}

pub fn assert_copy_on_write_happened(what: &str, sent: u64, s: &StatsSnapshot) {
    assert_eq!(s.tx_bytes(), sent, "{what}: sender byte count");
    assert!(
        s.tx_cow_protections > 0,
        "{what}: nothing was protected: {s:?}"
    );
    assert!(
        s.tx_cow_faults > 0,
        "{what}: no write fault was resolved by copy-on-write, so the test proved nothing: {s:?}"
    );
    assert!(s.tx_cow_copies >= s.tx_cow_faults, "{what}");
    assert!(s.tx_cow_fault_ns > 0, "{what}");
    assert_eq!(
        s.tx_completed_calls, s.tx_calls_zerocopy,
        "{what}: every call completed"
    );
}
