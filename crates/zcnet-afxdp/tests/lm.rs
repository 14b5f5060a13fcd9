//! Lightweight Messages over AF_XDP between two network namespaces (Jin, Zhang, Tan, "Lightweight Messages",
//! `docs/lm-afxdp.md`). Every test builds its own veth pair; every message is checked byte
//! for byte against the prime-period pattern at an offset that depends on its number, so a
//! fragment from another message, or placed one slot off, cannot pass.
//!
//! What is shown: messages of the sizes the issue names land contiguous in the receiver's
//! UMEM (`in_place`), sent from a loaned transmit region; fragments dropped in the XDP
//! program (fault injection: netem is not in this kernel) or sent out of order by a raw XSK
//! are lost messages, never wrong bytes, and the next message still arrives (PAD frames take
//! the chunks the lost one left); a second sender is rejected while a message is being
//! assembled and its raw frames are dropped, then admitted afterwards; the kernel-socket
//! fallback works on either end alone, and every fallback is counted.

use std::net::{SocketAddrV4, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcnet::FallbackReason;
use zcnet_afxdp::wire::lm::{Header, Kind, Layout, LM_HLEN};
use zcnet_afxdp::{LmConfig, LmError, LmEvent, LmSocket, LossReason};
use zcnet_testbed::netns::VethPair;
use zcnet_testbed::pattern::pattern;
use zcnet_testbed::topo::veth_pair;

const PORT: u16 = 7710;
const WAIT: Duration = Duration::from_secs(5);

/// Where the bytes of message `id` from `from` start in the pattern: ids restart at 1 for
/// every sender, so the sender's port is part of it.
fn offset_of(from: SocketAddrV4, id: u32) -> u64 {
    (u64::from(from.port()) << 20 | u64::from(id)).wrapping_mul(7919) % 1_000_003
}

fn open_a(pair: &VethPair, port: u16, tweak: impl FnOnce(&mut LmConfig) + Send) -> LmSocket {
    let mut cfg = LmConfig::new(SocketAddrV4::new(pair.addr_a(), port));
    tweak(&mut cfg);
    pair.run_in_a(|| LmSocket::open(cfg))
        .expect("enter a")
        .expect("open in a")
}

fn open_b(pair: &VethPair, tweak: impl FnOnce(&mut LmConfig) + Send) -> LmSocket {
    let mut cfg = LmConfig::new(SocketAddrV4::new(pair.addr_b(), PORT));
    tweak(&mut cfg);
    pair.run_in_b(|| LmSocket::open(cfg))
        .expect("enter b")
        .expect("open in b")
}

/// What arrived: a message checked byte for byte, or a loss report.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Got {
    Message {
        from: SocketAddrV4,
        id: u32,
        len: usize,
        in_place: bool,
    },
    Lost {
        from: SocketAddrV4,
        id: u32,
        reason: LossReason,
    },
}

type Sizes = dyn Fn(SocketAddrV4, u32) -> usize + Send + Sync;

/// The next event within `wait`, a message checked against the pattern.
fn recv_one(rx: &mut LmSocket, sizes: &Sizes, wait: Duration) -> Option<Got> {
    match rx.recv(wait).expect("recv")? {
        LmEvent::Message(m) => {
            let want = pattern(offset_of(m.from, m.id), sizes(m.from, m.id));
            assert_eq!(m.data.len(), want.len(), "message {} length", m.id);
            if m.data != want {
                let i = m.data.iter().zip(want).position(|(a, b)| a != b).unwrap();
                panic!(
                    "message {} from {} ({} bytes) wrong from byte {i} (fragment {})",
                    m.id,
                    m.from,
                    want.len(),
                    i / 1448
                );
            }
            Some(Got::Message {
                from: m.from,
                id: m.id,
                len: m.data.len(),
                in_place: m.in_place,
            })
        }
        LmEvent::Lost(l) => Some(Got::Lost {
            from: l.from,
            id: l.id,
            reason: l.reason,
        }),
    }
}

/// Receives `n` events in a thread, then hands the socket back with them.
fn receive_n(
    mut rx: LmSocket,
    n: usize,
    sizes: Arc<Sizes>,
) -> std::thread::JoinHandle<(LmSocket, Vec<Got>)> {
    std::thread::spawn(move || {
        let mut got = Vec::new();
        while got.len() < n {
            match recv_one(&mut rx, &*sizes, WAIT) {
                Some(g) => got.push(g),
                None => panic!("only {} of {n} events within {WAIT:?}: {got:?}", got.len()),
            }
        }
        (rx, got)
    })
}

/// Sends each size from `tx` in a thread, as loans written fragment by fragment.
fn send_all(
    mut tx: LmSocket,
    to: SocketAddrV4,
    sizes: Vec<usize>,
) -> std::thread::JoinHandle<(LmSocket, Vec<u32>)> {
    std::thread::spawn(move || {
        let me = tx.local_addr();
        let mut ids = Vec::new();
        for &len in &sizes {
            let id = tx.next_id();
            let mut buf = tx.loan(len).expect("loan");
            for (off, slot) in buf.fragments_mut().expect("fragments") {
                slot.copy_from_slice(pattern(offset_of(me, id) + off as u64, slot.len()));
            }
            let sent = buf.send(to).expect("send");
            assert_eq!(sent, id, "send used the id next_id announced");
            ids.push(sent);
        }
        (tx, ids)
    })
}

/// Sizes by message number, the same for every sender.
fn by_id(sizes: Vec<usize>) -> Arc<Sizes> {
    Arc::new(move |_, id| sizes[id as usize - 1])
}

/// A sender that speaks the LM protocol by hand over a plain UDP socket in namespace a — to
/// misbehave in ways `LmSocket` never does: fragments in the wrong order, half a message,
/// frames without admission.
struct Rogue {
    sock: UdpSocket,
    to: SocketAddrV4,
}

impl Rogue {
    fn new(pair: &VethPair, port: u16, to: SocketAddrV4) -> Rogue {
        let sock = pair
            .run_in_a(|| UdpSocket::bind((pair.addr_a(), port)))
            .expect("enter a")
            .expect("bind rogue");
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        Rogue { sock, to }
    }

    fn addr(&self) -> SocketAddrV4 {
        match self.sock.local_addr().unwrap() {
            std::net::SocketAddr::V4(a) => a,
            _ => unreachable!(),
        }
    }

    fn header(kind: Kind, token: u32, id: u32, index: u32, l: &Layout) -> Header {
        Header {
            kind,
            token,
            msg_id: id,
            index,
            count: l.count() as u32,
            total: l.total as u32,
        }
    }

    /// LM_REQ until an answer: `Ok((token, pad))` or `Err(reject reason word)`.
    fn request(&self, id: u32, l: &Layout) -> Result<(u32, u32), u32> {
        let req = Self::header(Kind::Req, 0, id, l.payload as u32, l).control(None);
        let deadline = Instant::now() + WAIT;
        let mut buf = [0u8; 64];
        loop {
            self.sock.send_to(&req, self.to).unwrap();
            if let Ok(n) = self.sock.recv(&mut buf) {
                let h = Header::parse(&buf[..n]).expect("an LM answer");
                assert_eq!(h.msg_id, id);
                return match h.kind {
                    Kind::AcqOk => Ok((h.token, h.index)),
                    Kind::AcqRej => Err(h.index),
                    k => panic!("unexpected answer {k:?}"),
                };
            }
            if Instant::now() >= deadline {
                panic!("no answer to LM_REQ {id} within {WAIT:?}");
            }
        }
    }

    fn pads(&self, token: u32, id: u32, l: &Layout, n: u32) {
        let d = Self::header(Kind::Pad, token, id, 0, l).control(None);
        for _ in 0..n {
            self.sock.send_to(&d, self.to).unwrap();
        }
    }

    /// Fragment `k` of message `id` with the pattern bytes of `from`'s message `id`.
    fn fragment(&self, token: u32, id: u32, k: usize, l: &Layout, from: SocketAddrV4) {
        let r = l.range(k);
        let mut d = vec![0u8; LM_HLEN + r.len()];
        Self::header(Kind::Data, token, id, k as u32, l).write(&mut d);
        d[LM_HLEN..].copy_from_slice(pattern(offset_of(from, id) + r.start as u64, r.len()));
        self.sock.send_to(&d, self.to).unwrap();
    }

    fn endme(&self, token: u32, id: u32, l: &Layout) {
        let d = Self::header(Kind::EndMe, token, id, l.count() as u32, l).control(None);
        self.sock.send_to(&d, self.to).unwrap();
    }
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn messages_of_every_edge_size_land_contiguous_in_the_umem() {
    let pair = veth_pair(1500);
    let rx = open_b(&pair, |_| {});
    let tx = open_a(&pair, PORT, |_| {});
    assert!(rx.receives_in_place(), "notes: {:?}", rx.notes());
    assert!(tx.transmits_via_xsk(), "notes: {:?}", tx.notes());
    // veth has no XSK zero-copy: both ends say so.
    let b = tx.binding().expect("bound");
    assert!(!b.zero_copy && b.zero_copy_refused.is_some(), "{b:?}");
    assert_eq!(tx.payload_per_fragment(), 1448);

    let sizes = vec![
        1,
        1448,
        1449,
        1472,
        1473,
        65535,
        65536,
        1 << 20,
        0,
        3 * 1448,
        100_000,
    ];
    let to = rx.local_addr();
    let from = tx.local_addr();
    let receiver = receive_n(rx, sizes.len(), by_id(sizes.clone()));
    let sender = send_all(tx, to, sizes.clone());
    let (rx, got) = receiver.join().expect("receiver");
    for (i, g) in got.iter().enumerate() {
        let id = i as u32 + 1;
        assert_eq!(
            *g,
            Got::Message {
                from,
                id,
                len: sizes[i],
                in_place: true
            },
            "message {id} not delivered whole, in order, assembled in the UMEM"
        );
    }
    let (tx, ids) = sender.join().expect("sender");
    assert_eq!(ids.len(), sizes.len());
    let (s, r) = (tx.stats(), rx.stats());
    let total: usize = sizes.iter().sum();
    assert_eq!(s.messages_sent, sizes.len() as u64);
    assert_eq!(s.bytes_sent, total as u64);
    assert_eq!(s.sent_xsk, sizes.len() as u64);
    assert_eq!(r.messages_received, sizes.len() as u64);
    assert_eq!(r.received_in_place, sizes.len() as u64);
    assert_eq!(r.messages_lost, 0);
    let frags: usize = sizes
        .iter()
        .map(|&n| Layout::new(n, 1448).unwrap().count())
        .sum();
    assert_eq!(r.fragments_placed, frags as u64);
    assert_eq!(s.fragments_sent, frags as u64);
    // Copy mode is a counted fallback on both ends, for every byte.
    for st in [tx.io_stats().snapshot(), rx.io_stats().snapshot()] {
        assert_eq!(st.fallback_bytes(FallbackReason::XskCopyMode), total as u64);
        assert_eq!(st.fallback_bytes(FallbackReason::XskUnavailable), 0);
    }
    let p = rx.xdp_progress().unwrap().expect("program attached");
    assert_eq!((p.foreign, p.order, p.injected), (0, 0, 0), "{p:?}");
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn a_recv_that_times_out_mid_message_leaves_the_assembly_alone() {
    let pair = veth_pair(1500);
    let mut rx = open_b(&pair, |_| {});
    let tx = open_a(&pair, PORT, |_| {});
    let sizes = vec![1 << 20; 8];
    let (to, from) = (rx.local_addr(), tx.local_addr());
    let sender = send_all(tx, to, sizes.clone());
    // Poll with timeouts far shorter than one 1 MiB message takes to arrive (725 frames):
    // most calls return in the middle of an assembly.
    let check: Arc<Sizes> = by_id(sizes.clone());
    let (mut got, mut empty) = (Vec::new(), 0u64);
    let deadline = Instant::now() + WAIT;
    while got.len() < sizes.len() {
        match recv_one(&mut rx, &*check, Duration::from_micros(200)) {
            Some(g) => got.push(g),
            None => empty += 1,
        }
        if Instant::now() >= deadline {
            panic!(
                "only {} of {} messages within {WAIT:?}: {got:?}",
                got.len(),
                sizes.len()
            );
        }
    }
    sender.join().expect("sender");
    for (i, g) in got.iter().enumerate() {
        assert_eq!(
            *g,
            Got::Message {
                from,
                id: i as u32 + 1,
                len: 1 << 20,
                in_place: true
            }
        );
    }
    assert!(
        empty > 0,
        "no recv returned mid-message: the test did not test anything"
    );
    assert_eq!(rx.stats().messages_lost, 0);
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn fragments_dropped_in_xdp_lose_exactly_their_messages_and_pads_recover_the_ring() {
    let pair = veth_pair(1500);
    let mut rx = open_b(&pair, |_| {});
    let tx = open_a(&pair, PORT, |_| {});
    // 100 000 B = 70 fragments. Every 250th DATA frame is dropped: frames 250 and 500 are
    // fragments of messages 4 and 8 (the rest of a broken message is dropped unseen).
    rx.inject_drop_every(250).unwrap();
    let sizes = vec![100_000; 10];
    let (to, from) = (rx.local_addr(), tx.local_addr());
    let receiver = receive_n(rx, sizes.len(), by_id(sizes.clone()));
    let sender = send_all(tx, to, sizes.clone());
    let (mut rx, got) = receiver.join().expect("receiver");
    let (tx, _) = sender.join().expect("sender");
    for (i, g) in got.iter().enumerate() {
        let id = i as u32 + 1;
        let want = if id == 4 || id == 8 {
            Got::Lost {
                from,
                id,
                reason: LossReason::Dropped,
            }
        } else {
            Got::Message {
                from,
                id,
                len: 100_000,
                in_place: true,
            }
        };
        assert_eq!(*g, want);
    }
    let (s, r) = (tx.stats(), rx.stats());
    // Message 4 broke at its 40th frame: 39 placed, 31 chunks left posted; the same for 8.
    // Messages 5 and 9 sent one PAD frame for each.
    assert_eq!((r.messages_lost, r.lost_dropped), (2, 2));
    assert_eq!(s.pads_sent, 62, "{s:?}");
    assert_eq!(r.pads_placed, 62, "{r:?}");
    let p = rx.xdp_progress().unwrap().unwrap();
    assert_eq!(p.injected, 2, "{p:?}");
    assert_eq!(
        p.order,
        2 * 30,
        "the rest of each broken message is dropped: {p:?}"
    );
    assert_eq!(p.pads, 62);

    // Injection off: the ring is clean again and a 1 MiB message arrives whole.
    rx.inject_drop_every(0).unwrap();
    let receiver = receive_n(rx, 1, Arc::new(|_, _| 1 << 20));
    let sender = send_all(tx, to, vec![1 << 20]);
    let (_rx, got) = receiver.join().expect("receiver");
    sender.join().expect("sender");
    assert!(
        matches!(got[0], Got::Message { in_place: true, .. }),
        "{got:?}"
    );
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn reordered_or_partial_messages_are_lost_never_wrong_and_the_next_one_arrives() {
    let pair = veth_pair(1500);
    let rx = open_b(&pair, |c| c.assembly_timeout = Duration::from_millis(300));
    let to = rx.local_addr();
    let rogue = Rogue::new(&pair, 7801, to);
    let r = rogue.addr();
    let l = Layout::new(20_000, 1448).unwrap(); // 14 fragments
    let n = l.count();
    let sizes: Arc<Sizes> = Arc::new(|_, _| 20_000);
    // 3 events: two losses from the rogue, then a good message from it.
    let receiver = receive_n(rx, 3, sizes);

    // 1: fragments in forward order (what a sender without ALF would do).
    let (token, pad) = rogue.request(1, &l).expect("admitted");
    assert_eq!(pad, 0);
    for k in 0..n {
        rogue.fragment(token, 1, k, &l, r);
    }
    rogue.endme(token, 1, &l);

    // 2: last-first, but fragments 5 and 6 swapped on the wire; then half of nothing more:
    // the sender stops without ENDME, so only the assembly timeout ends it.
    let (token, pad) = rogue.request(2, &l).expect("admitted after the loss");
    assert_eq!(pad as usize, n, "message 1 broke at its first frame");
    rogue.pads(token, 2, &l, pad);
    for k in [13, 12, 11, 10, 9, 8, 7, 5, 6, 4] {
        rogue.fragment(token, 2, k, &l, r);
    }

    // 3: a correct message. The same sender's next request is not rejected: it waits, and
    // is admitted as soon as message 2 times out.
    let (token, pad) = rogue.request(3, &l).expect("admitted after the timeout");
    // Message 2 placed 7 fragments (13..7) before the swap broke it.
    assert_eq!(pad as usize, n - 7);
    rogue.pads(token, 3, &l, pad);
    for k in (0..n).rev() {
        rogue.fragment(token, 3, k, &l, r);
    }
    rogue.endme(token, 3, &l);

    let (rx, got) = receiver.join().expect("receiver");
    assert_eq!(
        got,
        vec![
            Got::Lost {
                from: r,
                id: 1,
                reason: LossReason::Dropped
            },
            Got::Lost {
                from: r,
                id: 2,
                reason: LossReason::Timeout
            },
            Got::Message {
                from: r,
                id: 3,
                len: 20_000,
                in_place: true
            },
        ]
    );
    let st = rx.stats();
    assert_eq!((st.lost_dropped, st.lost_timeout), (1, 1));
    assert_eq!(st.refused_busy, 0, "{st:?}");
    let p = rx.xdp_progress().unwrap().unwrap();
    // Message 1: all 14 frames dropped; message 2: the swapped 5, then 6 and 4.
    assert_eq!(p.order, 14 + 3, "{p:?}");
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn a_second_sender_is_held_off_while_a_message_is_assembled_then_admitted() {
    let pair = veth_pair(1500);
    let rx = open_b(&pair, |_| {});
    let to = rx.local_addr();
    // The first sender, by hand, so the test decides when its message is half-way.
    let first = Rogue::new(&pair, 7802, to);
    let f = first.addr();
    let l = Layout::new(65536, 1448).unwrap(); // 46 fragments
    let n = l.count();
    // The second: a real LmSocket, sending through its XSK on vza.
    let second = open_a(&pair, 7803, |c| {
        c.admission_timeout = Duration::from_secs(4)
    });
    let s_addr = second.local_addr();
    let intruder = Rogue::new(&pair, 7804, to);

    let sizes: Arc<Sizes> = Arc::new(|_, _| 65536);
    let receiver = receive_n(rx, 2, sizes);
    let (token, _) = first.request(1, &l).expect("admitted");
    for k in (n / 2..n).rev() {
        first.fragment(token, 1, k, &l, f);
    }
    // Half-way: the second sender asks, and keeps being rejected.
    let second_done = send_all(second, to, vec![65536]);
    // An intruder does not ask at all: its frames, even with the admitted token and the
    // right next index, come from the wrong port and are dropped before they take a chunk.
    for k in (0..n / 2).rev() {
        intruder.fragment(token, 1, k, &l, intruder.addr());
    }
    std::thread::sleep(Duration::from_millis(150));
    for k in (0..n / 2).rev() {
        first.fragment(token, 1, k, &l, f);
    }
    first.endme(token, 1, &l);

    let (second, _) = second_done.join().expect("second sender");
    let (rx, got) = receiver.join().expect("receiver");
    assert_eq!(
        got,
        vec![
            Got::Message {
                from: f,
                id: 1,
                len: 65536,
                in_place: true
            },
            Got::Message {
                from: s_addr,
                id: 1,
                len: 65536,
                in_place: true
            },
        ],
        "the first message whole despite the intruder, then the second sender's"
    );
    let s = second.stats();
    assert!(
        s.rejected_busy >= 1,
        "the second sender was never held off: {s:?}"
    );
    let r = rx.stats();
    assert_eq!(r.refused_busy, s.rejected_busy);
    assert_eq!(r.admitted, 2);
    let p = rx.xdp_progress().unwrap().unwrap();
    assert_eq!(p.foreign, (n / 2) as u32, "{p:?}");
    assert_eq!(p.order, 0);
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn the_kernel_socket_fallback_works_on_either_end_alone_and_is_counted() {
    for (tx_xsk, rx_xsk) in [(false, true), (true, false), (false, false)] {
        let pair = veth_pair(1500);
        let rx = open_b(&pair, |c| c.xsk = rx_xsk);
        let tx = open_a(&pair, PORT, |c| c.xsk = tx_xsk);
        assert_eq!(tx.transmits_via_xsk(), tx_xsk);
        assert_eq!(rx.receives_in_place(), rx_xsk);
        if !tx_xsk {
            assert!(
                tx.notes().iter().any(|n| n.contains("turned off")),
                "{:?}",
                tx.notes()
            );
        }
        let sizes = vec![1, 1473, 65536, 1 << 20];
        let total: usize = sizes.iter().sum();
        let (to, from) = (rx.local_addr(), tx.local_addr());
        let receiver = receive_n(rx, sizes.len(), by_id(sizes.clone()));
        let sender = send_all(tx, to, sizes.clone());
        let (rx, got) = receiver.join().expect("receiver");
        let (tx, _) = sender.join().expect("sender");
        for (i, g) in got.iter().enumerate() {
            assert_eq!(
                *g,
                Got::Message {
                    from,
                    id: i as u32 + 1,
                    len: sizes[i],
                    in_place: rx_xsk
                },
                "tx via xsk {tx_xsk}, rx in place {rx_xsk}"
            );
        }
        let reason = |xsk| {
            if xsk {
                FallbackReason::XskCopyMode
            } else {
                FallbackReason::XskUnavailable
            }
        };
        let (ts, rs) = (tx.io_stats().snapshot(), rx.io_stats().snapshot());
        assert_eq!(ts.fallback_bytes(reason(tx_xsk)), total as u64);
        assert_eq!(rs.fallback_bytes(reason(rx_xsk)), total as u64);
        let (s, r) = (tx.stats(), rx.stats());
        assert_eq!(s.sent_kernel, if tx_xsk { 0 } else { 4 });
        assert_eq!(r.received_kernel, if rx_xsk { 0 } else { 4 });
    }
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn bad_requests_are_refused_with_a_reason_and_oversized_loans_are_errors() {
    let pair = veth_pair(1500);
    let rx = open_b(&pair, |c| c.max_message = 100_000);
    let to = rx.local_addr();
    let rogue = Rogue::new(&pair, 7805, to);
    let sizes: Arc<Sizes> = Arc::new(|_, _| 0);
    let server = std::thread::spawn(move || {
        let mut rx = rx;
        // Serve requests for a while; nothing is ever delivered.
        let got = recv_one(&mut rx, &*sizes, Duration::from_millis(1500));
        (rx, got)
    });
    // Too long for the receiver.
    assert_eq!(
        rogue.request(1, &Layout::new(100_001, 1448).unwrap()),
        Err(2)
    );
    // A fragment payload the receiver's MTU cannot carry.
    assert_eq!(
        rogue.request(2, &Layout::new(10_000, 1449).unwrap()),
        Err(3)
    );
    // A count that does not match the length (the header says 7 fragments of 1448 for 100).
    let lie = Header {
        kind: Kind::Req,
        token: 0,
        msg_id: 3,
        index: 1448,
        count: 7,
        total: 100,
    }
    .control(None);
    rogue.sock.send_to(&lie, to).unwrap();
    let mut buf = [0u8; 64];
    let n = rogue.sock.recv(&mut buf).expect("an answer");
    let h = Header::parse(&buf[..n]).unwrap();
    assert_eq!((h.kind, h.index), (Kind::AcqRej, 3));
    // Garbage to the control port is ignored, not fatal.
    rogue.sock.send_to(b"not LM at all", to).unwrap();
    let (rx, got) = server.join().expect("receiver");
    assert_eq!(got, None);
    let r = rx.stats();
    assert_eq!(r.refused_geometry, 3);
    assert_eq!(r.control_ignored, 1);
    assert_eq!(r.admitted, 0);

    let mut tx = open_a(&pair, PORT, |c| c.max_message = 1000);
    match tx.loan(1001) {
        Err(LmError::TooLong {
            len: 1001,
            max: 1000,
        }) => {}
        other => panic!("expected TooLong, got {other:?}"),
    }
}

#[test]
fn on_loopback_the_sockets_fall_back_where_they_must_and_deliver() {
    // On lo an XSK's frames never reach the host's own stack (and lo has no native XDP):
    // both ends take the kernel path, say why, and messages arrive whole.
    let lo = std::net::Ipv4Addr::LOCALHOST;
    let tx = LmSocket::open(LmConfig::new(SocketAddrV4::new(lo, 0))).expect("open tx");
    let rx = LmSocket::open(LmConfig::new(SocketAddrV4::new(lo, 0))).expect("open rx");
    let sizes = vec![1, 65536, 1 << 20];
    let (to, from) = (rx.local_addr(), tx.local_addr());
    let receiver = receive_n(rx, sizes.len(), by_id(sizes.clone()));
    let sender = send_all(tx, to, sizes.clone());
    let (rx, got) = receiver.join().expect("receiver");
    let (tx, _) = sender.join().expect("sender");
    assert!(!tx.transmits_via_xsk() && !rx.receives_in_place());
    for (i, g) in got.iter().enumerate() {
        assert!(
            matches!(g, Got::Message { from: f, id, len, .. } if *f == from && *id == i as u32 + 1 && *len == sizes[i]),
            "{g:?}"
        );
    }
    assert!(rx.notes()[0].contains("loopback"), "{:?}", rx.notes());
    assert_eq!(
        rx.io_stats()
            .snapshot()
            .fallback_bytes(FallbackReason::XskUnavailable),
        sizes.iter().sum::<usize>() as u64
    );
}
