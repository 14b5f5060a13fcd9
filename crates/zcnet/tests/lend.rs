//! Lending your own memory (`Sender::send_lent`): any owned buffer goes out zero-copy without
//! first being copied into pool buffers, is kept until the kernel's completion and then
//! dropped (handed back); one immutable `Arc<[u8]>` can be lent to many senders at once;
//! a sender dropped with loans in flight leaks them rather than free memory the kernel may
//! still read. Every transfer verifies every byte.

mod common;

use common::{pattern, Verifier};
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use zcnet::{FallbackReason, Lend, Sender, SenderConfig, TxPath};

fn cfg(path: TxPath) -> SenderConfig {
    SenderConfig::new(path)
        .timeout(Duration::from_secs(30))
        .policy(zcnet::Policy::always())
        .profile(zcnet::auto::ProfileSource::BuiltIn)
}

/// Accepts one connection and returns everything it received.
fn sink() -> (SocketAddr, std::thread::JoinHandle<Vec<u8>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let h = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        got
    });
    (addr, h)
}

/// A buffer whose drop is counted, to see when zcnet lets go of it.
struct Watched {
    data: Vec<u8>,
    drops: Arc<AtomicUsize>,
}

impl Lend for Watched {
    fn bytes(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn one_arc_is_lent_to_three_senders_and_comes_back() {
    let len = 3 << 20;
    let mut shared: Arc<[u8]> = Arc::from(pattern(0, len));
    let mut ends = Vec::new();
    for _ in 0..3 {
        let (addr, h) = sink();
        let mut tx = Sender::connect(addr, &cfg(TxPath::Zerocopy)).unwrap();
        tx.send_lent(shared.clone()).unwrap();
        ends.push((tx, h));
    }
    for (tx, h) in ends {
        let stats = tx.finish().unwrap();
        // Zero-copy but for what the kernel would not pin within the locked-memory limit
        // (copied, counted; none with CAP_IPC_LOCK).
        let refused = common::memlock_copied(&stats, "lent");
        assert_eq!(stats.tx_bytes_zerocopy + refused, len as u64, "{stats}");
        let got = h.join().unwrap();
        assert_eq!(got.len(), len);
        Verifier::default().check(&got);
    }
    // Every sender let go after its completions: the caller owns the bytes alone again.
    assert_eq!(Arc::strong_count(&shared), 1);
    let back = Arc::get_mut(&mut shared).expect("a sender still holds the Arc");
    assert_eq!(&back[..], pattern(0, len));
}

#[test]
fn vec_box_and_static_slices_go_out_in_order() {
    let (addr, h) = sink();
    let mut tx = Sender::connect(addr, &cfg(TxPath::Zerocopy)).unwrap();
    let a = 1 << 20;
    tx.send_lent(pattern(0, a).to_vec()).unwrap();
    tx.send_lent(pattern(a as u64, a).to_vec().into_boxed_slice())
        .unwrap();
    let tail: &'static [u8] = pattern(2 * a as u64, 4096);
    tx.send_lent(tail).unwrap();
    tx.send_slice(pattern(2 * a as u64 + 4096, 100)).unwrap();
    let stats = tx.finish().unwrap();
    let got = h.join().unwrap();
    assert_eq!(got.len(), 2 * a + 4096 + 100);
    Verifier::default().check(&got);
    assert_eq!(stats.tx_bytes(), got.len() as u64);
}

#[test]
fn a_loan_is_dropped_after_its_completion_and_counted_zero_copy() {
    let (addr, h) = sink();
    let mut tx = Sender::connect(addr, &cfg(TxPath::Zerocopy)).unwrap();
    let drops = Arc::new(AtomicUsize::new(0));
    let len = 2 << 20;
    tx.send_lent(Watched {
        data: pattern(0, len).to_vec(),
        drops: drops.clone(),
    })
    .unwrap();
    tx.flush().unwrap();
    assert_eq!(
        drops.load(Ordering::SeqCst),
        1,
        "not handed back after the flush"
    );
    let stats = tx.finish().unwrap();
    assert_eq!(stats.tx_bytes_zerocopy, len as u64);
    let got = h.join().unwrap();
    Verifier::default().check(&got);
    assert_eq!(got.len(), len);
}

/// A sender dropped while the kernel still holds the caller's pages (the peer's window is
/// small and it is not reading) must not free them: the loan is leaked, never dropped, and
/// the peer still gets every byte intact.
#[test]
fn a_sender_dropped_with_a_loan_in_flight_leaks_it() {
    let listener =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    // Small enough that most of the 2 MiB waits in the sender's queue, large enough that
    // the window (not the persist timer's one-segment probes) carries the rest afterwards.
    listener.set_recv_buffer_size(64 * 1024).unwrap();
    listener
        .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    listener.listen(1).unwrap();
    let addr = listener.local_addr().unwrap().as_socket().unwrap();
    let mut tx = Sender::connect(addr, &cfg(TxPath::Zerocopy).sndbuf(16 << 20)).unwrap();
    let (peer, _) = listener.accept().unwrap();
    let mut peer: TcpStream = peer.into();
    let drops = Arc::new(AtomicUsize::new(0));
    let len = 2 << 20;
    tx.send_lent(Watched {
        data: pattern(0, len).to_vec(),
        drops: drops.clone(),
    })
    .unwrap();
    drop(tx);
    assert_eq!(
        drops.load(Ordering::SeqCst),
        0,
        "freed while the kernel held it"
    );
    let mut got = Vec::new();
    peer.read_to_end(&mut got).unwrap();
    assert_eq!(got.len(), len);
    Verifier::default().check(&got);
}

/// Paths that send from memory of their own copy a lent buffer, and count it.
#[test]
fn paths_that_cannot_lend_copy_and_count_it() {
    for path in [TxPath::Uring, TxPath::Cow, TxPath::Copy] {
        let (addr, h) = sink();
        let mut tx = Sender::connect(addr, &cfg(path)).unwrap();
        let len = 1 << 20;
        tx.send_lent(pattern(0, len).to_vec()).unwrap();
        let stats = tx.finish().unwrap();
        let got = h.join().unwrap();
        assert_eq!(got.len(), len, "{path}");
        Verifier::default().check(&got);
        let counted = stats.fallback_bytes(FallbackReason::Unsupported);
        if path == TxPath::Copy {
            assert_eq!(counted, 0, "copy is no fallback");
        } else {
            assert_eq!(counted, len as u64, "{path}: {stats}");
        }
    }
}

/// A mapped (sealed memfd) file and a `bytes::Bytes` go out zero-copy like any other loan, and come back:
/// the mapping is unmapped and the `Bytes` released only after their completions.
#[test]
fn a_mapped_file_and_bytes_are_lent_without_a_copy() {
    let len = 2 << 20;
    let fd = rustix::fs::memfd_create("shard", rustix::fs::MemfdFlags::ALLOW_SEALING).unwrap();
    let mut file = std::fs::File::from(fd);
    std::io::Write::write_all(&mut file, pattern(0, len)).unwrap();
    let map = Arc::new(zcnet::map_sealed(&file).unwrap());
    // Sealed: nobody can change the bytes under the loan, not even their owner.
    assert!(std::io::Write::write_all(&mut file, b"x").is_err());
    assert!(file.set_len(0).is_err());
    let body = bytes::Bytes::from_static(pattern(len as u64, len));
    let (addr, got) = sink();
    let mut tx = Sender::connect(addr, &cfg(TxPath::Zerocopy)).unwrap();
    tx.send_lent(Arc::clone(&map)).unwrap();
    tx.send_lent(body.clone()).unwrap();
    let stats = tx.finish().unwrap();
    assert_eq!(stats.tx_bytes_zerocopy, 2 * len as u64, "{stats}");
    assert_eq!(
        Arc::strong_count(&map),
        1,
        "the sender still holds the mapping"
    );
    let got = got.join().unwrap();
    assert_eq!(got.len(), 2 * len);
    Verifier::default().check(&got);
}
