//! What a Rust user reaches for first: `Sender` is `io::Write`, `Receiver` is `io::Read`,
//! both are `AsFd`, the socket can be taken back, a client can receive (`Receiver::connect`)
//! and a server can send (`Sender::from_stream`), errors convert into `io::Error` with the
//! right kind, configs have builders, and stats print. Every transfer verifies every byte.

mod common;

use common::{pattern, Verifier};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;
use zcnet::{Error, Receiver, ReceiverConfig, RxPath, Sender, SenderConfig, TxPath};

const BYTES: usize = 3 << 20;

/// A loopback listener whose accepted sockets inherit a 4 KiB receive buffer: a peer that
/// does not read stalls the sender after a few kilobytes.
fn small_window_listener() -> (socket2::Socket, std::net::SocketAddr) {
    let listener =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    listener.set_recv_buffer_size(4096).unwrap(); // inherited by the accepted socket
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    listener.bind(&any.into()).unwrap();
    listener.listen(1).unwrap();
    let addr = listener.local_addr().unwrap().as_socket().unwrap();
    (listener, addr)
}

fn sender_cfg(path: TxPath) -> SenderConfig {
    SenderConfig::new(path)
        .timeout(Duration::from_secs(30))
        .profile(zcnet::auto::ProfileSource::BuiltIn)
}

fn receiver_cfg(path: RxPath) -> ReceiverConfig {
    ReceiverConfig::new(path)
        .timeout(Duration::from_secs(30))
        .profile(zcnet::auto::ProfileSource::BuiltIn)
}

/// A server that accepts one connection and writes the pattern through `io::copy` into a
/// `Sender` made from the accepted stream; a client that `Receiver::connect`s and reads it
/// back with `read_exact` through a `BufReader`.
#[test]
fn a_server_sends_with_io_copy_and_a_client_reads_with_read_exact() {
    for (tx, rx) in [
        (TxPath::Copy, RxPath::Copy),
        (TxPath::Zerocopy, RxPath::Mmap),
        (TxPath::Cow, RxPath::Copy),
    ] {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut tx = Sender::from_stream(stream, &sender_cfg(tx)).unwrap();
            let mut src = pattern(0, BYTES);
            let n = io::copy(&mut src, &mut tx).unwrap();
            assert_eq!(n, BYTES as u64);
            io::Write::flush(&mut tx).unwrap();
            tx.finish().unwrap()
        });
        let rx_end = Receiver::connect(addr, &receiver_cfg(rx)).unwrap();
        let mut reader = BufReader::with_capacity(100_003, rx_end);
        let mut got = vec![0u8; BYTES];
        reader.read_exact(&mut got).unwrap();
        Verifier::default().check(&got);
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).unwrap();
        assert!(
            rest.is_empty(),
            "{tx}→{rx}: {} bytes past the end",
            rest.len()
        );
        let sent = server.join().unwrap();
        assert_eq!(sent.tx_bytes(), BYTES as u64, "{tx}→{rx}");
        let text = sent.to_string();
        assert!(text.starts_with("sent 3 MiB: "), "{tx}: {text}");
        assert!(text.contains("received nothing"), "{tx}: {text}");
    }
}

/// `BufWriter` over a `Sender`: many small writes, coalesced, every byte in order.
#[test]
fn a_bufwriter_over_a_sender_keeps_the_stream_in_order() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let reader = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut rx = Receiver::from_stream(stream, &receiver_cfg(RxPath::Copy)).unwrap();
        let mut v = Verifier::default();
        let mut buf = vec![0u8; 65536];
        loop {
            let n = rx.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            v.check(&buf[..n]);
        }
        v.pos
    });
    let tx = Sender::connect(addr, &sender_cfg(TxPath::Copy)).unwrap();
    let mut w = BufWriter::with_capacity(8192, tx);
    let data = pattern(0, 1 << 20);
    for piece in data.chunks(977) {
        w.write_all(piece).unwrap();
    }
    let tx = w.into_inner().map_err(|e| e.into_error()).unwrap();
    tx.finish().unwrap();
    assert_eq!(reader.join().unwrap(), 1 << 20);
}

/// `into_inner` on a zero-copy sender waits for its completions and gives the socket back;
/// plain writes on it continue the same stream.
#[test]
fn a_sender_gives_its_socket_back_after_the_completions() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let reader = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut got = Vec::new();
        stream.read_to_end(&mut got).unwrap();
        got
    });
    let mut tx = Sender::connect(addr, &sender_cfg(TxPath::Zerocopy)).unwrap();
    let fd = tx.as_raw_fd();
    assert_eq!(fd, tx.socket().as_raw_fd());
    assert_eq!(tx.as_fd().as_raw_fd(), fd);
    let first = 1 << 20;
    for piece in pattern(0, first).chunks(256 * 1024) {
        let mut buf = tx.buffer().unwrap();
        buf.fill_at(0, piece);
        tx.send(buf).unwrap();
    }
    let stats = tx.stats().clone();
    let mut stream: TcpStream = tx.into_inner().unwrap();
    assert_eq!(stats.snapshot().tx_bytes(), first as u64);
    stream.write_all(pattern(first as u64, 4096)).unwrap();
    drop(stream);
    let got = reader.join().unwrap();
    assert_eq!(got.len(), first + 4096);
    Verifier::default().check(&got);
}

/// `into_inner` on a receiver hands back the bytes it already held, then the socket has the
/// rest: nothing is lost between them.
#[test]
fn a_receiver_gives_back_its_socket_and_the_bytes_it_held() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let total = 2 << 20;
    let writer = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(pattern(0, total)).unwrap();
    });
    let mut rx = Receiver::connect(addr, &receiver_cfg(RxPath::Mmap)).unwrap();
    let mut got = Vec::new();
    // A lent chunk read only in part: the receiver keeps the rest.
    let mut small = [0u8; 1000];
    let n = rx.recv_into(&mut small).unwrap();
    got.extend_from_slice(&small[..n]);
    let (mut stream, held) = rx.into_inner().unwrap();
    got.extend_from_slice(&held);
    stream.read_to_end(&mut got).unwrap();
    writer.join().unwrap();
    assert_eq!(got.len(), total);
    Verifier::default().check(&got);
}

/// Each zcnet error becomes the `io::Error` a std caller expects.
#[test]
fn errors_convert_to_io_errors_with_their_kind() {
    let kind = |e: Error| io::Error::from(e).kind();
    assert_eq!(
        kind(Error::Timeout {
            op: "send",
            after: Duration::from_secs(1),
            queued: 0,
        }),
        io::ErrorKind::TimedOut
    );
    assert_eq!(
        kind(Error::PeerClosed { op: "send" }),
        io::ErrorKind::BrokenPipe
    );
    assert_eq!(
        kind(Error::Reset { op: "recv" }),
        io::ErrorKind::ConnectionReset
    );
    assert_eq!(
        kind(Error::Truncated {
            op: "the stream",
            expected: 10,
            got: 3
        }),
        io::ErrorKind::UnexpectedEof
    );
    let os = io::Error::from(Error::io(
        "recv",
        io::Error::from_raw_os_error(libc::ECONNREFUSED),
    ));
    assert_eq!(os.raw_os_error(), Some(libc::ECONNREFUSED));
    // The zcnet error travels as the source of the io::Error.
    let wrapped = io::Error::from(Error::PoolExhausted(Duration::from_millis(5)));
    assert!(wrapped
        .get_ref()
        .is_some_and(|inner| inner.to_string().contains("no transmit buffer")));
}

/// Builders set what they name; a config built with them works end to end.
#[test]
fn config_builders_set_their_fields() {
    let s = SenderConfig::new(TxPath::Copy)
        .nodelay(true)
        .pool_buffers(3)
        .buf_bytes(8192)
        .sndbuf(1 << 20)
        .timeout(Duration::from_secs(7));
    assert!(s.nodelay);
    assert_eq!(
        (s.pool_buffers, s.buf_bytes, s.sndbuf),
        (3, 8192, Some(1 << 20))
    );
    assert_eq!(s.timeout, Some(Duration::from_secs(7)));
    let r = ReceiverConfig::new(RxPath::Mmap)
        .rcvlowat(4096)
        .map_bytes(1 << 20)
        .page_multiple_mss(false);
    assert_eq!(
        (r.rcvlowat, r.map_bytes, r.page_multiple_mss),
        (Some(4096), 1 << 20, false)
    );
}

/// A socket the caller made non-blocking gives `WouldBlock` (never a 30 s `Timeout` after no
/// time at all), `io::Write` reports the bytes that did go out, and the peer gets exactly
/// those bytes.
#[test]
fn a_nonblocking_socket_would_block_and_reports_what_was_queued() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let client = TcpStream::connect(addr).unwrap();
    let (peer, _) = listener.accept().unwrap();
    client.set_nonblocking(true).unwrap();
    let mut tx = Sender::from_stream(client, &sender_cfg(TxPath::Copy).sndbuf(64 * 1024)).unwrap();
    let mut written = 0u64;
    let chunk = 256 * 1024;
    let err = loop {
        // The peer is not reading yet: the socket buffers fill and the kernel says EAGAIN.
        match tx.write(pattern(written, chunk)) {
            Ok(n) => written += n as u64,
            Err(e) => break e,
        }
        assert!(written < 256 << 20, "never blocked after {written} bytes");
    };
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "{err}");
    match tx.send_slice(pattern(written, chunk)) {
        Err(Error::WouldBlock { queued, .. }) => written += queued,
        other => panic!("expected WouldBlock, got {other:?}"),
    }
    let stream = tx.into_inner().unwrap();
    stream.set_nonblocking(false).unwrap();
    drop(stream);
    let mut got = Vec::new();
    let mut peer = peer;
    peer.read_to_end(&mut got).unwrap();
    assert_eq!(got.len() as u64, written);
    Verifier::default().check(&got);
}

/// With no timeout configured (the default), an idle receive waits for the peer instead of
/// failing: here the first byte comes after 1.5 s.
#[test]
fn an_idle_receive_waits_by_default() {
    assert_eq!(ReceiverConfig::default().timeout, None);
    assert_eq!(SenderConfig::default().timeout, None);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let writer = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        s.write_all(pattern(0, 4096)).unwrap();
    });
    let mut rx = Receiver::connect(addr, &ReceiverConfig::new(RxPath::Copy)).unwrap();
    let mut got = vec![0u8; 4096];
    rx.read_exact(&mut got).unwrap();
    Verifier::default().check(&got);
    writer.join().unwrap();
}

/// Dropping a zero-copy sender whose buffers the kernel still holds (the peer's window is
/// tiny and it is not reading) does not wait: the drop returns at once, the held buffers are
/// retired from the pool rather than reused, and the peer still receives every byte intact.
#[test]
fn dropping_a_sender_with_buffers_in_flight_does_not_block() {
    let (listener, addr) = small_window_listener();
    let cfg = sender_cfg(TxPath::Zerocopy)
        .pool_buffers(8)
        .sndbuf(16 << 20)
        .policy(zcnet::Policy::always())
        // A drop that waited for completions would wait this long: past the guard below.
        .timeout(Duration::from_secs(120));
    let mut tx = Sender::connect(addr, &cfg).unwrap();
    let pool = tx.pool().clone();
    let (peer, _) = listener.accept().unwrap();
    let mut peer: TcpStream = peer.into();
    let total = 2 << 20;
    for piece in pattern(0, total).chunks(256 * 1024) {
        let mut buf = tx.buffer().unwrap();
        buf.fill_at(0, piece);
        tx.send(buf).unwrap();
    }
    let in_flight = pool.count() - pool.available();
    assert!(
        in_flight > 0,
        "the kernel returned every buffer before the drop"
    );
    // The peer reads only after the drop returns, so a drop that waits for the kernel's
    // completions never returns on its own.
    let (done, dropped) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(tx);
        let _ = done.send(());
    });
    if dropped.recv_timeout(Duration::from_secs(20)).is_err() {
        panic!("drop waited for the kernel while the peer was not reading"); // a hang guard
    }
    assert!(
        pool.retired() > 0,
        "buffers the kernel held went back to the pool"
    );
    let mut got = Vec::new();
    peer.read_to_end(&mut got).unwrap();
    assert_eq!(got.len(), total);
    Verifier::default().check(&got);
}

/// A peer that stops reading, with a timeout set: once every pool buffer is held by the
/// kernel, waiting for one ends in `PoolExhausted` (an `io::ErrorKind::WouldBlock`), not a
/// send timeout — and what was sent before is intact.
#[test]
fn a_pool_held_by_the_kernel_is_pool_exhausted() {
    let (listener, addr) = small_window_listener();
    let cfg = sender_cfg(TxPath::Zerocopy)
        .pool_buffers(2)
        .buf_bytes(256 * 1024)
        .sndbuf(16 << 20)
        .policy(zcnet::Policy::always())
        .timeout(Duration::from_millis(500));
    let mut tx = Sender::connect(addr, &cfg).unwrap();
    let (peer, _) = listener.accept().unwrap();
    let mut peer: TcpStream = peer.into();
    let mut sent = 0u64;
    let err = loop {
        match tx.buffer() {
            Ok(mut buf) => {
                let n = buf.capacity();
                buf.fill_at(0, pattern(sent, n));
                tx.send(buf).unwrap();
                sent += n as u64;
                assert!(sent < 64 << 20, "the pool never ran dry");
            }
            Err(e) => break e,
        }
    };
    assert!(matches!(err, Error::PoolExhausted(_)), "{err:?}");
    assert_eq!(io::Error::from(err).kind(), io::ErrorKind::WouldBlock);
    drop(tx);
    let mut got = Vec::new();
    peer.read_to_end(&mut got).unwrap();
    assert_eq!(got.len() as u64, sent);
    Verifier::default().check(&got);
}

/// A blocking send that times out half-way says how many of its bytes went out first, on
/// the copying, the zero-copy and the file path alike: the peer then reads exactly that
/// many bytes, in order, and a caller can resume from there without sending any twice.
#[test]
fn a_timed_out_send_says_how_much_of_it_was_queued() {
    let dir = tempfile::tempdir().unwrap();
    let file_path = dir.path().join("big");
    let len = 8usize << 20;
    std::fs::write(&file_path, pattern(0, len)).unwrap();
    let file = std::fs::File::open(&file_path).unwrap();
    for what in ["send_slice (copy)", "send_lent (zerocopy)", "send_file"] {
        // A small receive buffer on the peer, so 8 MiB cannot all fit in flight.
        let (listener, addr) = small_window_listener();
        let path = if what.contains("zerocopy") {
            TxPath::Zerocopy
        } else {
            TxPath::Copy
        };
        let cfg = sender_cfg(path)
            .sndbuf(256 * 1024)
            .policy(zcnet::Policy::always())
            .timeout(Duration::from_millis(300));
        let mut tx = Sender::connect(addr, &cfg).unwrap();
        let (peer, _) = listener.accept().unwrap();
        let peer: TcpStream = peer.into();
        // The peer reads nothing until the send has given up.
        let err = match what {
            "send_slice (copy)" => tx.send_slice(pattern(0, len)).unwrap_err(),
            "send_lent (zerocopy)" => tx.send_lent(pattern(0, len).to_vec()).unwrap_err(),
            _ => tx.send_file(&file, 0, len as u64).map(|_| ()).unwrap_err(),
        };
        let queued = match err {
            Error::Timeout { queued, .. } => queued,
            ref other => panic!("{what}: expected a timeout, got {other:?}"),
        };
        assert_eq!(err.queued(), Some(queued));
        assert!(queued > 0 && queued < len as u64, "{what}: queued {queued}");
        eprintln!("{what}: {err}");
        drop(tx);
        let mut got = Vec::new();
        let mut peer = peer;
        peer.read_to_end(&mut got).unwrap();
        assert_eq!(got.len() as u64, queued, "{what}");
        Verifier::default().check(&got);
    }
}

/// `io::copy` into a `Sender` writes 8 KiB pieces, each a copied `send_slice` too small for
/// zero-copy; `send_reader` pours the same reader through whole pool buffers, which the
/// zero-copy path sends as loans. Same bytes, every one verified; the stats tell the two
/// apart.
#[test]
fn send_reader_pours_a_reader_through_whole_buffers_and_io_copy_does_not() {
    const N: usize = 6 << 20;
    let run = |reader: bool| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let cfg = sender_cfg(TxPath::Zerocopy).policy(zcnet::Policy::always());
            let mut tx = Sender::from_stream(stream, &cfg).unwrap();
            // Two slices behind a `Read` that is not a slice: no specialisation helps.
            let mut src = pattern(0, N / 2).chain(pattern((N / 2) as u64, N / 2));
            let n = if reader {
                tx.send_reader(&mut src).unwrap()
            } else {
                io::copy(&mut src, &mut tx).unwrap()
            };
            assert_eq!(n, N as u64);
            tx.finish().unwrap()
        });
        let mut rx_end = Receiver::connect(addr, &receiver_cfg(RxPath::Copy)).unwrap();
        let mut got = Vec::new();
        rx_end.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), N);
        Verifier::default().check(&got);
        server.join().unwrap()
    };
    let copied = run(false);
    let poured = run(true);
    eprintln!(
        "io::copy: {} zero-copy bytes, {} copied in {} calls; send_reader: {} zero-copy bytes in {} calls, {} copied",
        copied.tx_bytes_zerocopy,
        copied.tx_bytes_copy,
        copied.tx_calls_copy,
        poured.tx_bytes_zerocopy,
        poured.tx_calls_zerocopy,
        poured.tx_bytes_copy
    );
    assert_eq!(copied.tx_bytes_zerocopy, 0, "io::copy: {copied}");
    assert_eq!(poured.tx_bytes_zerocopy, N as u64, "send_reader: {poured}");
    assert_eq!(poured.tx_bytes_copy, 0, "send_reader: {poured}");
}
