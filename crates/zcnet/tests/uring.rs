//! The io_uring paths where they differ from the others: a receive buffer ring that runs dry,
//! a sender dropped while the kernel still holds its buffers, sends the socket takes only in
//! part, a pool the kernel will not register, and zero-copy receive being refused. Every
//! transfer checks every byte.

mod common;

use common::{
    connect, listen, pattern, receiver_config, recv_pattern, send_pattern, sender_config,
    veth_pair, Topo, Verifier,
};
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use zcnet::stream::Listener;
use zcnet::{Error, FallbackReason, Pool, RxPath, StatsSnapshot, TxPath};
use zcnet_sys::uring::zcrx;
use zcnet_testbed::memlock;

/// Sends `size` pattern bytes with `tx_path` to a receiver built from `rcfg` that waits
/// `delay` before its first read and reads with `recv()` (offset 0) or `recv_into` of
/// `into` bytes; returns (received, sender stats, receiver stats).
fn transfer_with(
    rcfg: zcnet::ReceiverConfig,
    scfg: zcnet::SenderConfig,
    size: u64,
    delay: Duration,
    into: Option<usize>,
) -> (u64, StatsSnapshot, StatsSnapshot) {
    let listener = listen(Topo::Loopback, &rcfg);
    let port = listener.local_addr().unwrap().port();
    std::thread::scope(|s| {
        let r = s.spawn(|| {
            let mut rx = listener.accept().unwrap();
            std::thread::sleep(delay);
            let n = match into {
                None => recv_pattern(&mut rx, 0),
                Some(len) => {
                    let mut v = Verifier::default();
                    let mut buf = vec![0u8; len];
                    loop {
                        let n = rx.recv_into(&mut buf).unwrap();
                        if n == 0 {
                            break v.pos;
                        }
                        v.check(&buf[..n]);
                    }
                }
            };
            (n, rx.stats().snapshot(), rx.path())
        });
        let mut tx = connect(Topo::Loopback, port, &scfg);
        send_pattern(&mut tx, size, 0);
        let txs = tx.finish().unwrap();
        let (n, rxs, path) = r.join().unwrap();
        assert_eq!(path, rcfg.path, "receive path in effect");
        (n, txs, rxs)
    })
}

#[test]
fn a_tiny_receive_buffer_ring_runs_dry_is_rearmed_and_loses_nothing() {
    // Two provided buffers of one page: the multishot recv fills both and ends with
    // -ENOBUFS whenever more than two pages wait in the socket, which the receiver's late
    // start guarantees at once (and a 16 MiB transfer many times over).
    let mut rcfg = receiver_config(RxPath::Uring);
    rcfg.buf_bytes = 4096;
    rcfg.map_bytes = 2 * 4096;
    let size = 16 << 20;
    for into in [None, Some(1000)] {
        let (n, _, rx) = transfer_with(
            rcfg.clone(),
            sender_config(TxPath::Copy),
            size,
            Duration::from_millis(100),
            into,
        );
        assert_eq!(n, size, "{into:?}: every byte, in order");
        assert_eq!(rx.rx_bytes_copied, size);
        assert!(
            rx.rx_uring_enobufs >= 1,
            "{into:?}: the ring ran dry: {rx:?}"
        );
        assert!(
            rx.rx_uring_rearms >= rx.rx_uring_enobufs,
            "{into:?}: re-armed after each: {rx:?}"
        );
        eprintln!(
            "{into:?}: {} CQEs, ring ran dry {} times, {} re-arms",
            rx.rx_uring_cqes, rx.rx_uring_enobufs, rx.rx_uring_rearms
        );
        // Re-arming only once every buffer is back means each dry ring follows data: no
        // busy loop of arm → -ENOBUFS.
        assert!(
            rx.rx_uring_enobufs <= rx.rx_uring_cqes,
            "{into:?}: re-armed into an empty ring: {rx:?}"
        );
        // Each CQE carries at most one 4 KiB buffer.
        assert!(rx.rx_uring_cqes >= size / 4096, "{rx:?}");
    }
}

#[test]
fn uring_receive_waits_are_bounded_and_a_reset_is_a_reset() {
    let mut rcfg = receiver_config(RxPath::Uring);
    rcfg.timeout = Some(Duration::from_millis(300));
    let listener = listen(Topo::Loopback, &rcfg);
    let addr = listener.local_addr().unwrap();
    let mut peer = std::net::TcpStream::connect(addr).unwrap();
    let mut rx = listener.accept().unwrap();
    assert_eq!(rx.path(), RxPath::Uring);
    match rx.recv() {
        Err(Error::Timeout { .. }) => {}
        other => panic!("silent peer: expected a timeout, got {other:?}"),
    }
    // Data, then RST (SO_LINGER 0): the bytes arrive, then ECONNRESET as Error::Reset.
    peer.write_all(pattern(0, 5000)).unwrap();
    socket2::SockRef::from(&peer)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(peer);
    let mut v = Verifier::default();
    let err = loop {
        match rx.recv() {
            Ok(Some(c)) => v.check(&c),
            Ok(None) => panic!("a reset must not look like end of stream"),
            Err(e) => break e,
        }
    };
    assert!(matches!(err, Error::Reset { .. }), "{err}");
    assert!(v.pos <= 5000);
}

#[test]
fn short_sends_are_continued_in_order() {
    // A 32 KiB send buffer and a receiver that starts late with a small window: a 256 KiB
    // SEND_ZC cannot be taken whole, so the kernel returns a short count and the path sends
    // the rest in a further request on the same buffer.
    let mut rcfg = receiver_config(RxPath::Copy);
    rcfg.rcvbuf = Some(16 * 1024);
    let mut scfg = sender_config(TxPath::Uring);
    scfg.sndbuf = Some(16 * 1024);
    scfg.buf_bytes = 256 * 1024;
    let size = 8 << 20;
    let (n, tx, _) = transfer_with(rcfg, scfg, size, Duration::from_millis(200), None);
    assert_eq!(n, size);
    assert_eq!(tx.tx_notifications, tx.tx_calls_zerocopy);
    if !memlock::has_cap_ipc_lock() && tx.fallback_bytes(FallbackReason::Memlock) > 0 {
        // An unregistered pool (no CAP_IPC_LOCK) past RLIMIT_MEMLOCK: the rest of a refused
        // request was copied, counted; the request counts below do not hold then.
        assert_eq!(
            tx.tx_bytes_zerocopy + tx.fallback_bytes(FallbackReason::Memlock),
            size,
            "{tx:?}"
        );
        return;
    }
    assert_eq!(tx.tx_bytes_zerocopy, size);
    eprintln!(
        "short sends: {} in {} requests",
        tx.tx_short_sends, tx.tx_calls_zerocopy
    );
    assert!(tx.tx_short_sends >= 1, "no short send happened: {tx:?}");
    assert_eq!(
        tx.tx_calls_zerocopy,
        size.div_ceil(256 * 1024) + tx.tx_short_sends,
        "one request per buffer plus one per continuation"
    );
    assert_eq!(tx.tx_notifications, tx.tx_calls_zerocopy);
}

#[test]
fn a_sender_dropped_with_sends_in_flight_retires_its_buffers_and_the_bytes_arrive_intact() {
    // The receiver does not read and has a tiny window, so most of 1 MiB of SEND_ZC data
    // sits in the sender's write queue, its pages referenced by the kernel, when the sender
    // is dropped. Those buffers must be unmapped (retired), never handed out again; the
    // bytes then still reach the receiver unchanged even though everything the pool has
    // left is overwritten.
    let mut rcfg = receiver_config(RxPath::Copy);
    rcfg.rcvbuf = Some(4096);
    let listener = listen(Topo::Loopback, &rcfg);
    let port = listener.local_addr().unwrap().port();
    let mut scfg = sender_config(TxPath::Uring);
    scfg.pool_buffers = 16;
    scfg.buf_bytes = 64 * 1024;
    scfg.sndbuf = Some(4 << 20);
    scfg.timeout = Some(Duration::from_millis(500));
    let size = 16 * 64 * 1024;
    let mut tx = connect(Topo::Loopback, port, &scfg);
    let mut rx = listener.accept().unwrap();
    send_pattern(&mut tx, size, 0);
    let pool: Pool = tx.pool().clone();
    let stats = tx.stats().clone();
    let in_flight = pool.count() - pool.available();
    assert!(
        in_flight >= 1,
        "the stalled receiver must leave sends in flight"
    );
    drop(tx); // bounded wait, then abandon: cancel, drain, retire
    eprintln!(
        "in flight at drop: {in_flight} of {} buffers; retired: {}",
        pool.count(),
        pool.retired()
    );
    assert!(pool.retired() >= 1, "buffers still in flight were retired");
    assert_eq!(
        pool.retired() + pool.available(),
        pool.count(),
        "none leaked"
    );
    // Reuse everything the pool still has, as an application would.
    let mut reused = Vec::new();
    while let Some(mut b) = pool.try_take() {
        b.storage_mut().fill(0xEE);
        reused.push(b);
    }
    assert_eq!(recv_pattern(&mut rx, 0), size, "every byte, unchanged");
    let s = stats.snapshot();
    // Zero-copy, but for what an unregistered pool (no CAP_IPC_LOCK: RLIMIT_MEMLOCK) could
    // not pin and copied, counted.
    assert_eq!(
        s.tx_bytes_zerocopy + s.fallback_bytes(FallbackReason::Memlock),
        size,
        "{s:?}"
    );
    if memlock::has_cap_ipc_lock() {
        assert_eq!(s.tx_bytes_zerocopy, size);
    }
    assert!(s.tx_notifications < s.tx_calls_zerocopy, "{s:?}");
}

#[test]
fn a_pool_the_kernel_will_not_register_is_sent_unregistered_and_counted() {
    // io_uring takes at most 16384 fixed buffers (IORING_MAX_REG_BUFFERS): one more and
    // IORING_REGISTER_BUFFERS is EINVAL. The ring then sends with plain SEND_ZC.
    let pool = Pool::new(16385, 4096).expect("16385 buffers of 4 KiB");
    let mut scfg = sender_config(TxPath::Uring);
    scfg.pool = Some(pool);
    let size = 4 << 20;
    let (n, tx, _) = transfer_with(
        receiver_config(RxPath::Copy),
        scfg,
        size,
        Duration::ZERO,
        None,
    );
    assert_eq!(n, size);
    if !memlock::has_cap_ipc_lock() && tx.tx_uring_register_failures == 0 {
        // No CAP_IPC_LOCK, and the user's RLIMIT_MEMLOCK budget spent: io_uring_setup
        // itself was refused (ENOMEM), every send copied and counted so.
        assert_eq!(tx.fallback_bytes(FallbackReason::Memlock), size, "{tx:?}");
        return;
    }
    assert_eq!(tx.tx_uring_register_failures, 1, "{tx:?}");
    assert_eq!(tx.tx_uring_fixed_calls, 0, "{tx:?}");
    assert_eq!(
        tx.tx_bytes_zerocopy + tx.fallback_bytes(FallbackReason::Memlock),
        size,
        "still zero-copy requests, but for what RLIMIT_MEMLOCK refused (no CAP_IPC_LOCK)"
    );
    if memlock::has_cap_ipc_lock() {
        assert_eq!(tx.tx_bytes_zerocopy, size, "still zero-copy requests");
    }
    assert_eq!(tx.tx_notifications, tx.tx_calls_zerocopy);
}

const MEMLOCK_CHILD: &str = "ZCNET_URING_MEMLOCK_CHILD";

#[cfg_attr(
    not(all(zcnet_has_prlimit, any(zcnet_has_setpriv, not(zcnet_root)))),
    ignore = "needs prlimit, and setpriv as root (apt-get install util-linux)"
)]
#[test]
fn without_cap_ipc_lock_a_small_memlock_limit_refuses_registration_and_sends_go_on() {
    if std::env::var_os(MEMLOCK_CHILD).is_some() {
        // In the child: RLIMIT_MEMLOCK 512 KiB, no CAP_IPC_LOCK. Registering 16 × 64 KiB
        // is refused (ENOMEM); unregistered sends are charged per request and fit.
        let mut scfg = sender_config(TxPath::Uring);
        scfg.pool_buffers = 16;
        scfg.buf_bytes = 64 * 1024;
        let size = 8 << 20;
        let (n, tx, _) = transfer_with(
            receiver_config(RxPath::Copy),
            scfg,
            size,
            Duration::ZERO,
            None,
        );
        assert_eq!(n, size);
        if tx.tx_uring_register_failures == 0 && tx.fallback_bytes(FallbackReason::Memlock) == size
        {
            // The budget is the user's: where other processes of it (this test's parent,
            // when it too lacks CAP_IPC_LOCK) have spent it, io_uring_setup is refused
            // (ENOMEM) and every send is copied, counted so.
            return;
        }
        assert_eq!(tx.tx_uring_register_failures, 1, "{tx:?}");
        assert_eq!(tx.tx_uring_fixed_calls, 0, "{tx:?}");
        assert_eq!(
            tx.tx_bytes_zerocopy + tx.fallback_bytes(FallbackReason::Memlock),
            size,
            "{tx:?}"
        );
        assert!(tx.tx_bytes_zerocopy > 0, "{tx:?}");
        // A request refused with ENOMEM still gets its notification: it is no zero-copy
        // call, and not counted as one.
        assert_eq!(tx.tx_notifications, tx.tx_calls_zerocopy, "{tx:?}");
        assert_eq!(tx.tx_completed_calls, tx.tx_calls_zerocopy, "{tx:?}");
        return;
    }
    memlock::rerun_limited(
        512 * 1024,
        "without_cap_ipc_lock_a_small_memlock_limit_refuses_registration_and_sends_go_on",
        MEMLOCK_CHILD,
    );
}

const NO_MEMLOCK_CHILD: &str = "ZCNET_URING_NO_MEMLOCK_CHILD";

#[cfg_attr(
    not(all(zcnet_has_prlimit, any(zcnet_has_setpriv, not(zcnet_root)))),
    ignore = "needs prlimit, and setpriv as root (apt-get install util-linux)"
)]
#[test]
fn a_ring_refused_for_want_of_locked_memory_copies_every_send_counted_as_memlock() {
    if std::env::var_os(NO_MEMLOCK_CHILD).is_some() {
        // In the child: RLIMIT_MEMLOCK 0, no CAP_IPC_LOCK. io_uring_setup charges the rings
        // to it and says ENOMEM: every byte is copied, the reason memlock (not "unsupported",
        // which would send a user looking for a missing kernel feature).
        let size = 1 << 20;
        let (n, tx, _) = transfer_with(
            receiver_config(RxPath::Copy),
            sender_config(TxPath::Uring),
            size,
            Duration::ZERO,
            None,
        );
        assert_eq!(n, size);
        assert_eq!(tx.fallback_bytes(FallbackReason::Memlock), size, "{tx:?}");
        assert_eq!(tx.fallback_bytes(FallbackReason::Unsupported), 0, "{tx:?}");
        return;
    }
    let name = "a_ring_refused_for_want_of_locked_memory_copies_every_send_counted_as_memlock";
    memlock::rerun_limited(0, name, NO_MEMLOCK_CHILD);
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn zcrx_registration_errors_are_the_kernels() {
    let lo = zcrx::ifindex("lo").unwrap();
    // The uAPI needs DEFER_TASKRUN and 32-byte CQEs.
    let e = zcrx::try_register_on_plain_ring(lo, 0).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
    // No such interface in this namespace.
    let e = zcrx::ZcrxQueue::register(1 << 30, 0, 1 << 20, 256).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENODEV), "{e}");
    // Loopback has no queue-management ops / header split.
    let e = zcrx::ZcrxQueue::register(lo, 0, 1 << 20, 256).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}");
    // Nor has veth, on any queue.
    let pair = veth_pair(1500);
    for rxq in [0, 5] {
        let got = pair
            .run_in_b(|| {
                let vzb = zcrx::ifindex(pair.ifname_b()).unwrap();
                zcrx::ZcrxQueue::register(vzb, rxq, 1 << 20, 256).map(drop)
            })
            .unwrap();
        let e = got.unwrap_err();
        assert_eq!(
            e.raw_os_error(),
            Some(libc::EOPNOTSUPP),
            "veth rxq {rxq}: {e}"
        );
    }
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces; without CAP_NET_ADMIN zcrx registration is EPERM, not the interface's reason)"
)]
#[test]
fn a_zcrx_receiver_falls_back_to_uring_and_says_why() {
    // Loopback: the accepting thread sees lo, the kernel refuses with EOPNOTSUPP.
    let (n, _, rx) = {
        let listener = listen(Topo::Loopback, &receiver_config(RxPath::Zcrx));
        let port = listener.local_addr().unwrap().port();
        std::thread::scope(|s| {
            let r = s.spawn(|| {
                let mut rx = listener.accept().unwrap();
                assert_eq!(rx.path(), RxPath::Uring, "fell back to the uring path");
                (recv_pattern(&mut rx, 0), rx.stats().snapshot())
            });
            let mut tx = connect(Topo::Loopback, port, &sender_config(TxPath::Uring));
            send_pattern(&mut tx, 3 << 20, 1);
            let txs = tx.finish().unwrap();
            let (n, rxs) = r.join().unwrap();
            (n, txs, rxs)
        })
    };
    assert_eq!(n, 3 << 20);
    assert_eq!(rx.rx_zcrx_refusals, 1);
    assert_eq!(rx.rx_zcrx_errno, libc::EOPNOTSUPP as u64);
    assert_eq!(rx.fallback_ops(FallbackReason::Unsupported), 1);
    assert_eq!(rx.rx_bytes_copied, 3 << 20);
    assert_eq!(rx.rx_bytes_mapped, 0);

    // veth, accepting inside the receiver's namespace: the kernel sees vzb and refuses too.
    let pair = veth_pair(9000);
    let cfg = receiver_config(RxPath::Zcrx);
    let listener: Listener = pair
        .run_in_b(|| Listener::bind(SocketAddr::new(IpAddr::V4(pair.addr_b()), 0), &cfg))
        .unwrap()
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::scope(|s| {
        let r = s.spawn(|| {
            pair.run_in_b(|| {
                let mut rx = listener.accept().unwrap();
                (rx.path(), recv_pattern(&mut rx, 1), rx.stats().snapshot())
            })
            .unwrap()
        });
        let mut tx = connect(Topo::Netns(&pair), port, &sender_config(TxPath::Copy));
        send_pattern(&mut tx, 5 << 20, 0);
        tx.finish().unwrap();
        let (path, n, rx) = r.join().unwrap();
        assert_eq!(path, RxPath::Uring);
        assert_eq!(n, 5 << 20);
        assert_eq!(rx.rx_zcrx_refusals, 1);
        assert_eq!(rx.rx_zcrx_errno, libc::EOPNOTSUPP as u64, "{rx:?}");
        assert_eq!(rx.fallback_ops(FallbackReason::Unsupported), 1);
    });
}

#[test]
fn a_uring_receiver_writes_to_a_file_in_stream_order() {
    // `recv_into` leaves the rest of a provided buffer held; `recv_to_file` must write that
    // first, then lend further buffers straight from the ring (never splice around an armed
    // multishot receive), and the next `recv` continues after the file's bytes.
    let listener = listen(Topo::Loopback, &receiver_config(RxPath::Uring));
    let port = listener.local_addr().unwrap().port();
    let (head, body, tail) = (1000usize, 3 << 20, 70_000u64);
    std::thread::scope(|s| {
        let r = s.spawn(|| {
            let mut rx = listener.accept().unwrap();
            let mut v = Verifier::default();
            let mut buf = vec![0u8; head];
            let mut got = 0;
            while got < head {
                let n = rx.recv_into(&mut buf[got..]).unwrap();
                assert!(n > 0, "stream ended early");
                got += n;
            }
            v.check(&buf);
            let file = tempfile::tempfile().unwrap();
            assert_eq!(rx.recv_to_file(&file, 7, body as u64).unwrap(), body as u64);
            let mut written = vec![0u8; body];
            std::os::unix::fs::FileExt::read_exact_at(&file, &mut written, 7).unwrap();
            v.check(&written);
            while let Some(c) = rx.recv().unwrap() {
                v.check(&c);
            }
            (v.pos, rx.stats().snapshot())
        });
        let mut tx = connect(Topo::Loopback, port, &sender_config(TxPath::Uring));
        send_pattern(&mut tx, head as u64 + body as u64 + tail, 0);
        tx.finish().unwrap();
        let (n, rx) = r.join().unwrap();
        assert_eq!(n, head as u64 + body as u64 + tail);
        assert!(rx.rx_uring_cqes >= 1, "{rx:?}");
    });
}
