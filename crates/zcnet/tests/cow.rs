//! The `cow` transmit path keeps copy semantics: whatever the application does to a slice
//! after `send_slice` returns, the receiver gets the bytes as they were at the send. Every
//! test overwrites its buffers while their data is still in flight (a slow receiver with a
//! small window holds it in the send queue), verifies every received byte, and asserts the
//! fault counter, so a pass proves copy-on-write really happened rather than that the data
//! happened to leave in time.

#![deny(unsafe_code)]

mod common;
mod cow_support;

use common::{connect, listen, pattern, receiver_config, veth_pair, Topo};
use std::io::Write as _;
use std::sync::{Arc, Barrier, RwLock};
use zcnet::cow::{self, CowPolicy, WorkingSetRule};
use zcnet::{FallbackReason, Policy, RxPath, TxPath};
use zcnet_sys::testing::{fork_and_run, Mapping};

use cow_support::*;

/// The engine: the automatic choice falls back from userfaultfd to mprotect, which needs
/// only /proc/self/pagemap, so a host without one is a failure, with why.
fn require_engine() {
    if let Err(why) = cow::backend() {
        panic!("no copy-on-write engine: {why}");
    }
}

fn overwrite_in_flight(topo: Topo<'_>, label: &str) {
    for rx in RxPath::ALL {
        let (sent, s) = run(topo, rx, |tx| overwrite_after_each_send(tx, 24, 1 << 20));
        let what = format!("{label} cow->{rx}");
        assert_copy_on_write_happened(&what, sent, &s);
        // The whole buffer is page-aligned and above every threshold: all of it protected,
        // but for what the kernel would not pin within the locked-memory limit (copied,
        // counted; none with CAP_IPC_LOCK).
        let refused = common::memlock_copied(&s, &what);
        assert_eq!(s.tx_cow_bytes_protected + refused, sent, "{what}");
        assert_eq!(s.tx_bytes_zerocopy + refused, sent, "{what}");
        println!(
            "{what}: {} faults, {:.1} µs each, {} pages protected",
            s.tx_cow_faults,
            s.tx_cow_fault_ns as f64 / s.tx_cow_faults as f64 / 1000.0,
            s.tx_cow_pages_protected
        );
    }
}

#[test]
fn overwrite_in_flight_loopback() {
    require_engine();
    overwrite_in_flight(Topo::Loopback, "lo");
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn overwrite_in_flight_veth() {
    require_engine();
    let pair = veth_pair(1500);
    overwrite_in_flight(Topo::Netns(&pair), "veth1500");
}

/// Sizes and offsets around every boundary; each slice is overwritten after its send.
/// The stats must split each slice exactly as the path promises: unaligned head and tail
/// copied, page-aligned middle protected, small slices copied.
fn mixed(topo: Topo<'_>, label: &str) {
    let cases: &[(usize, usize)] = &[
        (0, 1),
        (1, 100),
        (0, 4095),
        (1, 4097),
        (5, (64 << 10) + 3),
        (0, 1 << 20),
        (4095, (1 << 20) + 1),
        (100, 3 * PAGE),
        (0, 16 << 10),
        (7, 20 << 10),
        (0, 300_001),
        (2048, 16 << 10),
    ];
    let min = 16 << 10;
    let mut expect_small = 0u64;
    let mut expect_unaligned = 0u64;
    let mut expect_protected = 0u64;
    for &(off, len) in cases {
        let addr_off = off % PAGE;
        let head = ((PAGE - addr_off) % PAGE).min(len);
        let body = (len - head) / PAGE * PAGE;
        if len < min {
            expect_small += len as u64;
        } else if body < min {
            expect_unaligned += len as u64; // the whole slice is copied
        } else {
            expect_unaligned += (len - body) as u64;
            expect_protected += body as u64;
        }
    }
    let listener = listen(topo, &slow_receiver_config(RxPath::Copy));
    let port = listener.local_addr().unwrap().port();
    let s = std::thread::scope(|sc| {
        let r = sc.spawn(|| {
            let mut rx = listener.accept().unwrap();
            recv_slowly(&mut rx, 128 << 10)
        });
        let mut cfg = cow_config();
        cfg.policy = Policy::always().with_min_zerocopy_bytes(min);
        let mut tx = connect(topo, port, &cfg);
        let mut store = vec![0u8; (2 << 20) + 2 * PAGE];
        let mut pos = 0u64;
        for _ in 0..3 {
            for (i, &(off, len)) in cases.iter().enumerate() {
                let b = window(&mut store, off, len);
                b.copy_from_slice(pattern(pos, len));
                tx.send_slice(b).unwrap();
                b.fill(i as u8);
                pos += len as u64;
            }
        }
        let s = tx.finish().unwrap();
        assert_eq!(r.join().unwrap(), pos, "{label}: received");
        assert_eq!(s.tx_bytes(), pos, "{label}: sent");
        s
    });
    assert_eq!(
        s.fallback_bytes(FallbackReason::TooSmall),
        3 * expect_small,
        "{label}: {s:?}"
    );
    assert_eq!(
        s.fallback_bytes(FallbackReason::Unaligned),
        3 * expect_unaligned,
        "{label}: {s:?}"
    );
    // Less what the kernel would not pin within the locked-memory limit (copied, counted;
    // none with CAP_IPC_LOCK).
    let refused = common::memlock_copied(&s, label);
    assert_eq!(
        s.tx_cow_bytes_protected + refused,
        3 * expect_protected,
        "{label}: {s:?}"
    );
    assert_eq!(
        s.tx_bytes_zerocopy + refused,
        3 * expect_protected,
        "{label}: only protected bytes go zero-copy"
    );
    assert!(s.tx_cow_faults > 0, "{label}: no fault: {s:?}");
}

#[test]
fn mixed_unaligned_and_small_loopback() {
    require_engine();
    mixed(Topo::Loopback, "lo");
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn mixed_unaligned_and_small_veth() {
    require_engine();
    let pair = veth_pair(9000);
    mixed(Topo::Netns(&pair), "veth9000");
}

/// Four threads, four connections, four buffers, all faulting at once through the one
/// handler thread.
#[test]
fn concurrent_senders_on_threads() {
    require_engine();
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..4)
            .map(|i| {
                s.spawn(move || {
                    let (sent, st) = run(Topo::Loopback, RxPath::Copy, |tx| {
                        overwrite_after_each_send(tx, 12, (512 << 10) + i * PAGE)
                    });
                    assert_copy_on_write_happened(&format!("thread {i}"), sent, &st);
                })
            })
            .collect();
        for r in runs {
            r.join().unwrap();
        }
    });
}

/// Two senders on two threads send the *same* buffer (each page held by two sends at once),
/// then the buffer is overwritten while both are in flight: both receivers must see the
/// original bytes, and the pages' protection must survive the first completion.
#[test]
fn one_buffer_in_flight_on_two_sockets() {
    require_engine();
    const LEN: usize = 1 << 20;
    const ROUNDS: usize = 16;
    let store = Arc::new(RwLock::new(vec![0u8; LEN + PAGE]));
    let sent = Arc::new(Barrier::new(3));
    let written = Arc::new(Barrier::new(3));
    std::thread::scope(|s| {
        let senders: Vec<_> = (0..2)
            .map(|_| {
                let (store, sent, written) = (store.clone(), sent.clone(), written.clone());
                s.spawn(move || {
                    run(Topo::Loopback, RxPath::Copy, |tx| {
                        for _ in 0..ROUNDS {
                            written.wait(); // the writer filled the next slice
                            {
                                let mut g = store.write().unwrap();
                                let b = window(&mut g, 0, LEN);
                                tx.send_slice(b).unwrap();
                            }
                            sent.wait();
                        }
                        (ROUNDS * LEN) as u64
                    })
                })
            })
            .collect();
        let mut pos = 0u64;
        for round in 0..ROUNDS {
            window(&mut store.write().unwrap(), 0, LEN).copy_from_slice(pattern(pos, LEN));
            written.wait();
            sent.wait();
            // Both sends are in flight: overwrite.
            window(&mut store.write().unwrap(), 0, LEN).fill(round as u8);
            pos += LEN as u64;
        }
        let mut faults = 0;
        for r in senders {
            let (sent, st) = r.join().unwrap();
            assert_eq!(st.tx_bytes(), sent);
            assert!(st.tx_cow_protections > 0);
            faults += st.tx_cow_faults;
        }
        // A fault is credited to the sender whose release lifts the page, so only the sum
        // is certain.
        assert!(faults > 0, "no copy-on-write happened");
    });
}

/// A buffer whose contents are still in flight is reused as a receive buffer.
/// * `Receiver::recv_into` works (it receives into scratch and copies, resolved by
///   copy-on-write) and the in-flight send still delivers the original bytes.
/// * A raw kernel write (`read(2)`) into it fails with `EFAULT` — the documented limit of
///   `UFFD_USER_MODE_ONLY` — and works again after `flush`.
fn recv_into_buffer_in_flight(topo: Topo<'_>, label: &str) {
    const LEN: usize = 1 << 20;
    let detours_before = cow::engine_stats().map_or(0, |e| e.kernel_write_detours);
    // Connection 1 carries the in-flight send; its receiver does not read until told.
    let l1 = listen(topo, &slow_receiver_config(RxPath::Copy));
    let p1 = l1.local_addr().unwrap().port();
    // Connection 2 brings data to receive into the same buffer.
    let l2 = listen(topo, &receiver_config(RxPath::Copy));
    let p2 = l2.local_addr().unwrap().port();
    let go = Barrier::new(2);
    std::thread::scope(|s| {
        let r1 = s.spawn(|| {
            let mut rx = l1.accept().unwrap();
            go.wait();
            recv_slowly(&mut rx, 1 << 30)
        });
        let r2 = s.spawn(|| {
            let mut tx = connect(topo, p2, &common::sender_config(TxPath::Copy));
            tx.send_slice(pattern(7_777, 300_000)).unwrap();
            tx.finish().unwrap();
        });
        let mut tx1 = connect(topo, p1, &cow_config());
        let mut rx2 = l2.accept().unwrap();
        let mut store = vec![0u8; LEN + PAGE];
        let b = window(&mut store, 0, LEN);
        b.copy_from_slice(pattern(0, LEN));
        tx1.send_slice(b).unwrap();
        assert!(
            cow::is_protected(b),
            "{label}: the send should still be in flight"
        );

        // std::io::Read on a socket pair: a kernel write into the protected buffer.
        let (mut pr, mut pw) = std::os::unix::net::UnixStream::pair().unwrap();
        pw.write_all(b"kernel write").unwrap();
        let err = std::io::Read::read(&mut pr, &mut b[..12]).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EFAULT), "{label}: {err}");

        // zcnet's recv_into does not fail.
        let mut got = 0;
        while got < 300_000 {
            let n = rx2.recv_into(&mut b[got..]).unwrap();
            assert!(n > 0, "{label}: early end of stream");
            got += n;
        }
        assert_eq!(
            &b[..300_000],
            pattern(7_777, 300_000),
            "{label}: recv_into bytes"
        );
        r2.join().unwrap();

        go.wait();
        tx1.flush().unwrap();
        assert!(
            !cow::is_protected(b),
            "{label}: protection lifted after the completion"
        );
        std::io::Read::read_exact(&mut pr, &mut b[..12]).unwrap();
        assert_eq!(&b[..12], b"kernel write");
        let s1 = tx1.finish().unwrap();
        assert_eq!(
            r1.join().unwrap(),
            LEN as u64,
            "{label}: connection 1 got the original"
        );
        assert!(s1.tx_cow_copies > 0, "{label}: {s1:?}");
    });
    let detours = cow::engine_stats().unwrap().kernel_write_detours - detours_before;
    assert!(
        detours >= 1,
        "{label}: recv_into did not take the scratch detour"
    );
}

#[test]
fn recv_into_buffer_in_flight_loopback() {
    require_engine();
    recv_into_buffer_in_flight(Topo::Loopback, "lo");
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn recv_into_buffer_in_flight_veth() {
    require_engine();
    let pair = veth_pair(1500);
    recv_into_buffer_in_flight(Topo::Netns(&pair), "veth1500");
}

/// Anonymous mmap'd memory that is unmapped while in flight, and memory that is moved by
/// `mremap` while in flight and then overwritten at its new address.
#[test]
fn munmap_and_mremap_while_in_flight() {
    require_engine();
    const LEN: usize = 1 << 20;
    let remaps_before = cow::engine_stats().map_or(0, |e| e.remaps);
    let (sent, s) = run(Topo::Loopback, RxPath::Copy, |tx| {
        let mut pos = 0u64;
        for round in 0..8 {
            let mut m = Mapping::anon_private(LEN).unwrap();
            assert_eq!(m.len(), LEN);
            let buf = m.as_mut_slice();
            buf.copy_from_slice(pattern(pos, LEN));
            tx.send_slice(buf).unwrap();
            pos += LEN as u64;
            if round % 2 == 0 {
                m.unmap().unwrap();
            } else {
                // Grow it and move it (as realloc does), then overwrite everything at the
                // new place. The move is certain: the target is reserved first.
                let old = m.as_slice().as_ptr();
                let mut moved = m.move_and_resize(64 * LEN).unwrap();
                assert_ne!(moved.as_slice().as_ptr(), old, "mremap did not move");
                moved.as_mut_slice().fill(0xEE);
                moved.unmap().unwrap();
            }
        }
        pos
    });
    assert_eq!(s.tx_bytes(), sent);
    let e = cow::engine_stats().unwrap();
    if e.backend == cow::BackendKind::Userfaultfd {
        assert!(
            e.remaps > remaps_before,
            "no mremap event was handled: {e:?}"
        );
        assert!(s.tx_cow_copies > 0, "moved pages were not copied: {s:?}");
    }
}

/// Memory the engine must not protect is copied and counted, never protected: shared
/// anonymous memory, a private file mapping, and the calling thread's stack.
#[test]
fn unprotectable_memory_is_copied() {
    require_engine();
    const LEN: usize = 256 << 10;
    let (sent, s) = run(Topo::Loopback, RxPath::Copy, |tx| {
        let mut shared = Mapping::anon_shared(LEN).unwrap();
        let b = shared.as_mut_slice();
        b.copy_from_slice(pattern(0, LEN));
        tx.send_slice(b).unwrap();
        b.fill(1);
        shared.unmap().unwrap();

        // A private read-only mapping of a regular (unnamed temporary) file.
        let file = Mapping::file_copy(pattern(LEN as u64, LEN)).unwrap();
        assert_eq!(file.len(), LEN);
        tx.send_slice(file.as_slice()).unwrap();
        file.unmap().unwrap();

        // The stack of this thread.
        let mut on_stack = [0u8; 64 << 10];
        let w = window(&mut on_stack, 0, 32 << 10);
        w.copy_from_slice(pattern(2 * LEN as u64, 32 << 10));
        tx.send_slice(w).unwrap();
        w.fill(3);
        (2 * LEN + (32 << 10)) as u64
    });
    assert_eq!(s.tx_bytes(), sent);
    assert_eq!(s.fallback_ops(FallbackReason::Unprotectable), 3, "{s:?}");
    assert_eq!(s.tx_cow_protections, 0, "{s:?}");
    assert_eq!(s.tx_bytes_zerocopy, 0);
}

/// Solaris's threshold: a sender that reuses one buffer (working set below the send
/// buffer) is copied, one that cycles through a ring larger than the send buffer is
/// protected and, because it never writes a buffer still in flight, does not fault.
#[test]
fn working_set_threshold_decides() {
    require_engine();
    const LEN: usize = 256 << 10;
    let run_with = |ring: usize| {
        let listener = listen(Topo::Loopback, &receiver_config(RxPath::Copy));
        let port = listener.local_addr().unwrap().port();
        std::thread::scope(|s| {
            let r = s.spawn(|| {
                let mut rx = listener.accept().unwrap();
                common::recv_pattern(&mut rx, 0)
            });
            let mut cfg = cow_config();
            cfg.cow = CowPolicy::default().with_working_set(WorkingSetRule::Auto);
            cfg.sndbuf = Some(256 << 10); // the kernel doubles it: 512 KiB
            let mut tx = connect(Topo::Loopback, port, &cfg);
            let mut store = vec![0u8; ring * LEN + PAGE];
            let mut pos = 0u64;
            for i in 0..64 {
                let b = window(&mut store, (i % ring) * LEN, LEN);
                b.copy_from_slice(pattern(pos, LEN));
                tx.send_slice(b).unwrap();
                pos += LEN as u64;
            }
            let st = tx.finish().unwrap();
            assert_eq!(r.join().unwrap(), pos);
            st
        })
    };
    let one = run_with(1);
    assert!(
        one.fallback_ops(FallbackReason::SmallWorkingSet) >= 60,
        "{one:?}"
    );
    let ring = run_with(16); // 4 MiB ≫ 512 KiB
    assert_eq!(
        ring.fallback_ops(FallbackReason::SmallWorkingSet),
        0,
        "{ring:?}"
    );
    assert_eq!(ring.tx_cow_protections, 64, "{ring:?}");
    // The send queue holds at most 512 KiB, so a buffer's previous send completed (and was
    // reaped by a later send) long before the ring comes back to it: no fault.
    assert_eq!(ring.tx_cow_faults, 0, "{ring:?}");
}

/// A `cow` sender dropped while its receiver has stopped reading: after the bounded wait
/// the connection is aborted (reset) so the kernel lets go of the pages, and the protection
/// is lifted — the buffer is plain memory again. The receiver sees only correct bytes,
/// then the reset.
#[test]
fn dropping_a_stalled_sender_aborts_and_unprotects() {
    require_engine();
    const LEN: usize = 2 << 20;
    let listener = listen(Topo::Loopback, &slow_receiver_config(RxPath::Copy));
    let port = listener.local_addr().unwrap().port();
    let stalled = Barrier::new(2);
    std::thread::scope(|s| {
        let r = s.spawn(|| {
            let mut rx = listener.accept().unwrap();
            stalled.wait(); // do not read until the sender is gone
            let mut v = common::Verifier::default();
            loop {
                match rx.recv() {
                    Ok(Some(c)) => v.check(&c),
                    Ok(None) => return (v.pos, None),
                    Err(e) => return (v.pos, Some(e)),
                }
            }
        });
        let mut cfg = cow_config();
        cfg.timeout = Some(std::time::Duration::from_secs(1));
        let mut tx = connect(Topo::Loopback, port, &cfg);
        let mut store = vec![0u8; LEN + PAGE];
        let b = window(&mut store, 0, LEN);
        b.copy_from_slice(pattern(0, LEN));
        tx.send_slice(b).unwrap();
        assert!(cow::is_protected(b), "still in flight");
        drop(tx);
        assert!(
            !cow::is_protected(b),
            "protection outlived the abandoned sender"
        );
        b.fill(0x77); // plain memory now
        stalled.wait();
        let (got, err) = r.join().unwrap();
        assert!(
            got < LEN as u64,
            "the stalled receiver got everything ({got} B)"
        );
        let err = err.expect("the connection should end with a reset, not an end of stream");
        assert!(matches!(err, zcnet::Error::Reset { .. }), "{err}");
    });
}

/// `fork` while a protected buffer is in flight: the child inherits no registration (the
/// kernel drops it without `UFFD_FEATURE_EVENT_FORK`), so its writes neither block nor
/// fault to the parent's handler, and — being ordinary copy-on-write after fork — do not
/// reach the parent's memory or the wire. The parent's own writes are still copied.
///
/// The receiver reads nothing until the child has run, so the buffer is in flight for the
/// whole fork: reading from the start, a loaded machine (two test runs at once) once let
/// it drain and the completion lift the protection before the first check.
#[test]
fn fork_with_a_buffer_in_flight() {
    require_engine();
    const LEN: usize = 1 << 20;
    // The receiver does not read until the child has run.
    let forked = Barrier::new(2);
    let (sent, s) = run_gated(Topo::Loopback, RxPath::Copy, Some(&forked), |tx| {
        let mut store = vec![0u8; LEN + PAGE];
        let b = window(&mut store, 0, LEN);
        b.copy_from_slice(pattern(0, LEN));
        tx.send_slice(b).unwrap();
        let protected = cow::is_protected(b);
        // The child only writes memory (plain copy-on-write after fork), then exits.
        let code = fork_and_run(std::time::Duration::from_secs(20), || {
            b.fill(0xCC);
            if b[LEN - 1] == 0xCC {
                0
            } else {
                1
            }
        });
        forked.wait(); // before any assertion: a failing one must not leave the reader waiting
        assert!(protected, "in flight: the receiver had not read");
        let code = code.expect("the forked child hung or died writing the protected buffer");
        assert_eq!(code, 0, "the child could not write its copy of the buffer");
        assert_eq!(
            &b[..16],
            pattern(0, 16),
            "the child's writes reached the parent"
        );
        // The parent's writes are still copied on write.
        b.copy_from_slice(pattern(LEN as u64, LEN));
        tx.send_slice(b).unwrap();
        b.fill(0xDD);
        2 * LEN as u64
    });
    assert_copy_on_write_happened("fork", sent, &s);
}
