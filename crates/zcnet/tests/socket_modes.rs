//! Every transmit and receive path honours the socket as the caller gave it, on every call:
//!
//! * non-blocking (`O_NONBLOCK` set before `from_stream`): a call that would wait returns
//!   `WouldBlock` at once, with the bytes it queued, and the caller goes on from there —
//!   the peer gets every byte once;
//! * `SO_SNDTIMEO`/`SO_RCVTIMEO` set on the socket before `from_stream`, and the config's
//!   own timeout: a call against a stalled peer ends as `Timeout` within the bound (plus a
//!   generous tolerance: this is behaviour, not speed), the error names how long it really
//!   ran, and after it the stream goes on byte-exact from what the error says was queued.
//!
//! Over paths × calls × modes, on loopback, every byte verified. And `from_stream` refuses
//! what is not a TCP socket.

mod common;

use common::{pattern, Verifier};
use socket2::SockRef;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use zcnet::{
    Error, FileRxMode, FileTxMode, Receiver, ReceiverConfig, RxPath, Sender, SenderConfig, TxPath,
};

/// The timeout under test.
const LIMIT: Duration = Duration::from_millis(300);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// `O_NONBLOCK` on the socket.
    NonBlocking,
    /// `SO_SNDTIMEO`/`SO_RCVTIMEO` on the socket, no timeout in the config.
    SocketTimeout,
    /// The config's timeout.
    ConfigTimeout,
}

const MODES: [Mode; 3] = [Mode::NonBlocking, Mode::SocketTimeout, Mode::ConfigTimeout];

/// A loopback connection: (the end under test, the peer). The peer's receive buffer is
/// small, so a sender stalls after a few hundred KiB.
fn connection() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    (c, s)
}

fn prepare(s: &TcpStream, mode: Mode) {
    match mode {
        Mode::NonBlocking => s.set_nonblocking(true).unwrap(),
        Mode::SocketTimeout => {
            s.set_write_timeout(Some(LIMIT)).unwrap();
            s.set_read_timeout(Some(LIMIT)).unwrap();
        }
        Mode::ConfigTimeout => {}
    }
}

/// `err` is the right one for `mode` after a call that ran `took`; returns its `queued`.
fn check_error(what: &str, mode: Mode, err: &Error, took: Duration) -> u64 {
    eprintln!("{what}: \"{err}\" after {took:?}");
    match (mode, err) {
        (Mode::NonBlocking, Error::WouldBlock { queued, .. }) => *queued,
        (Mode::SocketTimeout | Mode::ConfigTimeout, Error::Timeout { after, queued, .. }) => {
            assert!(
                took >= LIMIT - Duration::from_millis(20),
                "{what}: timed out after {took:?}, bound {LIMIT:?}: {err}"
            );
            assert!(
                *after >= LIMIT - Duration::from_millis(20) && *after <= took,
                "{what}: the error says {after:?}, the call took {took:?}"
            );
            *queued
        }
        _ => panic!("{what}: {mode:?} gave {err} ({err:?}) after {took:?}"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum TxCall {
    Send,
    SendSlice,
    SendOwned,
    Write,
    SendFile(FileTxMode),
}

/// One call sending `pattern(pos, n)`; Ok(bytes that went out) or the error and how long
/// the call took (including, for `send`, the wait for a buffer).
fn tx_call(
    tx: &mut Sender,
    call: TxCall,
    file: &std::fs::File,
    pos: u64,
    n: usize,
) -> (Result<u64, Error>, Duration) {
    let t = Instant::now();
    let r = match call {
        TxCall::Send => match tx.buffer() {
            Ok(mut b) => {
                let n = n.min(b.capacity());
                b.fill_at(0, pattern(pos, n));
                tx.send(b).map(|()| n as u64)
            }
            Err(e) => Err(e),
        },
        TxCall::SendSlice => tx.send_slice(pattern(pos, n)).map(|()| n as u64),
        TxCall::SendOwned => tx.send_lent(pattern(pos, n).to_vec()).map(|()| n as u64),
        TxCall::Write => match tx.write(pattern(pos, n)) {
            Ok(k) => Ok(k as u64),
            Err(e) => match e.into_inner().map(|b| b.downcast::<Error>()) {
                Some(Ok(e)) => Err(*e),
                other => panic!("write's error is not zcnet's: {other:?}"),
            },
        },
        TxCall::SendFile(m) => tx.send_file_with(file, pos, n as u64, m),
    };
    (r, t.elapsed())
}

/// Reads the peer to end of stream, verifying every byte; returns the count.
fn drain(mut peer: TcpStream) -> u64 {
    peer.set_nonblocking(false).unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut v = Verifier::default();
    let mut buf = vec![0u8; 256 << 10];
    loop {
        let n = peer.read(&mut buf).expect("the peer reads");
        if n == 0 {
            return v.pos;
        }
        v.check(&buf[..n]);
    }
}

/// Waits for every loaned buffer (the peer is reading now), then closes.
fn close(mut tx: Sender) {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        match tx.flush() {
            Ok(()) => break,
            Err(Error::Timeout { .. }) if Instant::now() < end => {}
            Err(e) => panic!("flush: {e}"),
        }
    }
    drop(tx);
}

const FILE_BYTES: u64 = 16 << 20;

fn pattern_file() -> (tempfile::TempDir, std::fs::File) {
    let dir = tempfile::tempdir().unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.path().join("pattern"))
        .unwrap();
    let mut pos = 0;
    while pos < FILE_BYTES {
        let n = (1u64 << 20).min(FILE_BYTES - pos) as usize;
        f.write_all_at(pattern(pos, n), pos).unwrap();
        pos += n as u64;
    }
    (dir, f)
}

fn sender(s: TcpStream, path: TxPath, mode: Mode) -> Sender {
    prepare(&s, mode);
    let mut cfg = SenderConfig::new(path)
        .policy(zcnet::Policy::always())
        .profile(zcnet::auto::ProfileSource::BuiltIn)
        .sndbuf(64 << 10);
    if mode == Mode::ConfigTimeout {
        cfg = cfg.timeout(LIMIT);
    }
    Sender::from_stream(s, &cfg).unwrap()
}

/// Against a peer that does not read: the first call that cannot finish fails as `mode`
/// says, promptly or on time; after it, from the byte it says, the stream goes on and the
/// peer (now reading) gets every byte once.
fn tx_case(path: TxPath, call: TxCall, mode: Mode, file: &std::fs::File) {
    let what = format!("{path} {call:?} {mode:?}");
    let (c, peer) = connection();
    SockRef::from(&peer).set_recv_buffer_size(64 << 10).unwrap();
    let mut tx = sender(c, path, mode);
    let chunk = 1 << 20;
    let mut pos = 0u64;
    let mut stalls = 0;
    // Phase 1: the peer reads nothing. The bytes the calls queued fit the socket buffers,
    // so a call must stall within the file's length.
    while stalls == 0 {
        assert!(
            pos < FILE_BYTES / 2,
            "{what}: never stalled after {pos} bytes"
        );
        let (r, took) = tx_call(&mut tx, call, file, pos, chunk);
        match r {
            Ok(n) => pos += n,
            Err(e) => {
                pos += check_error(&what, mode, &e, took);
                stalls += 1;
            }
        }
    }
    // Phase 2: the peer reads (and checks) everything; the sender goes on from `pos`.
    let reader = std::thread::spawn(move || drain(peer));
    let total = pos + 4 * chunk as u64;
    while pos < total {
        let n = (total - pos).min(chunk as u64) as usize;
        let (r, took) = tx_call(&mut tx, call, file, pos, n);
        match r {
            Ok(n) => pos += n,
            // The peer reads now, but a loaded machine may still stall it past the bound:
            // either way the error is the mode's, and the stream goes on from `queued`.
            Err(e) => {
                pos += check_error(&what, mode, &e, took);
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    close(tx);
    assert_eq!(reader.join().unwrap(), total, "{what}: bytes at the peer");
}

fn tx_matrix(path: TxPath, calls: &[TxCall]) {
    let (_dir, file) = pattern_file();
    for &call in calls {
        for mode in MODES {
            tx_case(path, call, mode, &file);
        }
    }
}

const BUFFER_CALLS: [TxCall; 4] = [
    TxCall::Send,
    TxCall::SendSlice,
    TxCall::SendOwned,
    TxCall::Write,
];

#[test]
fn copy_sends_honour_the_socket() {
    tx_matrix(TxPath::Copy, &BUFFER_CALLS);
}

#[test]
fn zerocopy_sends_honour_the_socket() {
    tx_matrix(TxPath::Zerocopy, &BUFFER_CALLS);
}

#[test]
fn uring_sends_honour_the_socket() {
    tx_matrix(TxPath::Uring, &BUFFER_CALLS);
}

#[test]
fn cow_sends_honour_the_socket() {
    tx_matrix(TxPath::Cow, &BUFFER_CALLS);
}

#[test]
fn auto_sends_honour_the_socket() {
    tx_matrix(TxPath::Auto, &BUFFER_CALLS);
}

#[test]
fn file_sends_honour_the_socket() {
    let calls: Vec<TxCall> = FileTxMode::ALL.into_iter().map(TxCall::SendFile).collect();
    tx_matrix(TxPath::Copy, &calls);
}

/// A caller may make the socket non-blocking after handing it over (through a duplicate of
/// the descriptor: one open file, one `O_NONBLOCK`) and back again. No path may decide once
/// and keep the answer: the call that would wait after the flip gives `WouldBlock` (a hang
/// is caught by the watchdog), and once the socket blocks again the stream goes on from
/// what the error said was queued, every byte once.
fn flip_case(path: TxPath) {
    let what = format!("{path} made non-blocking after from_stream");
    let (c, peer) = connection();
    SockRef::from(&peer).set_recv_buffer_size(64 << 10).unwrap();
    let flip = c.try_clone().unwrap();
    let cfg = SenderConfig::new(path)
        .policy(zcnet::Policy::always())
        .profile(zcnet::auto::ProfileSource::BuiltIn)
        .sndbuf(64 << 10);
    let mut tx = Sender::from_stream(c, &cfg).unwrap();
    let chunk = 256 << 10;
    // Blocking first: a few sends the socket buffers take, so the path has run (and could
    // have remembered the socket as blocking).
    let mut pos = 0u64;
    for _ in 0..2 {
        tx.send_slice(pattern(pos, 16 << 10)).unwrap();
        pos += 16 << 10;
    }
    flip.set_nonblocking(true).unwrap();
    let (done, watchdog) = mpsc::channel();
    let what2 = what.clone();
    let worker = std::thread::spawn(move || {
        loop {
            assert!(pos < FILE_BYTES, "{what2}: never stalled after {pos} bytes");
            let t = Instant::now();
            // A pool buffer, so that each path sends it its own way (a slice is copied).
            let sent = tx.buffer().and_then(|mut b| {
                let n = chunk.min(b.capacity());
                b.fill_at(0, pattern(pos, n));
                tx.send(b).map(|()| n as u64)
            });
            match sent {
                Ok(n) => pos += n,
                Err(Error::WouldBlock { queued, op }) => {
                    eprintln!("{what2}: WouldBlock ({op}) after {:?}", t.elapsed());
                    pos += queued;
                    break;
                }
                Err(e) => panic!("{what2}: {e} ({e:?})"),
            }
        }
        done.send(()).unwrap();
        (tx, pos)
    });
    // A hang guard, not a speed check: a send that waits here waits forever.
    if let Err(mpsc::RecvTimeoutError::Timeout) = watchdog.recv_timeout(Duration::from_secs(60)) {
        panic!("{what}: a send waited instead of giving WouldBlock");
    }
    let (mut tx, mut pos) = worker.join().unwrap();
    flip.set_nonblocking(false).unwrap();
    // The duplicate would keep the socket open past the sender: the peer's end of stream
    // comes when the last descriptor goes.
    drop(flip);
    let reader = std::thread::spawn(move || drain(peer));
    let total = pos + 4 * chunk as u64;
    while pos < total {
        let n = (total - pos).min(chunk as u64) as usize;
        tx.send_slice(pattern(pos, n))
            .unwrap_or_else(|e| panic!("{what}: blocking again: {e}"));
        pos += n as u64;
    }
    close(tx);
    assert_eq!(reader.join().unwrap(), total, "{what}: bytes at the peer");
}

#[test]
fn sends_honour_o_nonblock_set_after_from_stream() {
    for path in [
        TxPath::Copy,
        TxPath::Zerocopy,
        TxPath::Uring,
        TxPath::Cow,
        TxPath::Auto,
    ] {
        flip_case(path);
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum RxCall {
    Recv,
    RecvInto,
    Read,
    RecvToFile(FileRxMode),
}

fn receiver(s: TcpStream, path: RxPath, mode: Mode) -> Receiver {
    prepare(&s, mode);
    let mut cfg = ReceiverConfig::new(path)
        .profile(zcnet::auto::ProfileSource::BuiltIn)
        .map_bytes(1 << 20);
    if mode == Mode::ConfigTimeout {
        cfg = cfg.timeout(LIMIT);
    }
    Receiver::from_stream(s, &cfg).unwrap()
}

/// One receive call; Ok(bytes, end of stream) or the error and how long it took. Bytes
/// received go through `v`; for `recv_to_file`, into `file` at the stream offset, checked
/// when the stream ends.
fn rx_call(
    rx: &mut Receiver,
    call: RxCall,
    v: &mut Verifier,
    file: &std::fs::File,
) -> (Result<u64, Error>, Duration) {
    let mut buf = vec![0u8; 100_003];
    let t = Instant::now();
    let r = match call {
        RxCall::Recv => rx.recv().map(|c| match c {
            Some(c) => {
                v.check(&c);
                c.len() as u64
            }
            None => 0,
        }),
        RxCall::RecvInto => rx.recv_into(&mut buf).map(|n| {
            v.check(&buf[..n]);
            n as u64
        }),
        RxCall::Read => match rx.read(&mut buf) {
            Ok(n) => {
                v.check(&buf[..n]);
                Ok(n as u64)
            }
            Err(e) => match e.into_inner().map(|b| b.downcast::<Error>()) {
                Some(Ok(e)) => Err(*e),
                other => panic!("read's error is not zcnet's: {other:?}"),
            },
        },
        RxCall::RecvToFile(m) => {
            // A fixed-size piece at the stream offset; past the end is a truncation.
            let n = 65_536;
            match rx.recv_to_file_with(file, v.pos, n, m) {
                Ok(n) => {
                    v.pos += n;
                    Ok(n)
                }
                Err(Error::Truncated { got, .. }) => {
                    v.pos += got;
                    Ok(0)
                }
                Err(e) => {
                    v.pos += e.queued().unwrap_or(0);
                    Err(e)
                }
            }
        }
    };
    (r, t.elapsed())
}

/// With nothing to read, the first call fails as `mode` says; then the peer sends, the
/// receiver goes on, and every byte arrives once.
fn rx_case(path: RxPath, call: RxCall, mode: Mode) {
    let what = format!("{path} {call:?} {mode:?}");
    let (c, mut peer) = connection();
    let mut rx = receiver(c, path, mode);
    let dir = tempfile::tempdir().unwrap();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.path().join("landed"))
        .unwrap();
    let mut v = Verifier::default();
    let (r, took) = rx_call(&mut rx, call, &mut v, &file);
    let e = r.expect_err("nothing was sent");
    assert_eq!(check_error(&what, mode, &e, took), 0, "{what}: queued");
    // The peer sends in pieces with pauses, so a non-blocking receiver meets empty
    // sockets along the way.
    const TOTAL: u64 = 4 << 20;
    let (go, ready) = mpsc::channel::<()>();
    let writer = std::thread::spawn(move || {
        ready.recv().unwrap();
        let mut pos = 0;
        while pos < TOTAL {
            let n = (TOTAL - pos).min(200_000) as usize;
            peer.write_all(pattern(pos, n)).unwrap();
            pos += n as u64;
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    go.send(()).unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < end, "{what}: stuck at {}", v.pos);
        let (r, took) = rx_call(&mut rx, call, &mut v, &file);
        match r {
            Ok(0) => break,
            Ok(_) => {}
            // The pauses are far shorter than the bound, but a loaded machine may stall the
            // writer past it: either way the error is the mode's, and nothing is lost.
            Err(e) => {
                check_error(&what, mode, &e, took);
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    writer.join().unwrap();
    assert_eq!(v.pos, TOTAL, "{what}: bytes received");
    if let RxCall::RecvToFile(_) = call {
        let mut got = vec![0u8; TOTAL as usize];
        file.read_exact_at(&mut got, 0).unwrap();
        Verifier::default().check(&got);
    }
}

fn rx_matrix(path: RxPath) {
    let mut calls = vec![RxCall::Recv, RxCall::RecvInto, RxCall::Read];
    calls.extend(FileRxMode::ALL.into_iter().map(RxCall::RecvToFile));
    for call in calls {
        for mode in MODES {
            rx_case(path, call, mode);
        }
    }
}

#[test]
fn copy_receives_honour_the_socket() {
    rx_matrix(RxPath::Copy);
}

#[test]
fn mmap_receives_honour_the_socket() {
    rx_matrix(RxPath::Mmap);
}

#[test]
fn uring_receives_honour_the_socket() {
    rx_matrix(RxPath::Uring);
}

#[test]
fn auto_receives_honour_the_socket() {
    rx_matrix(RxPath::Auto);
}

/// A `UnixStream` or a UDP socket forced into a `TcpStream` through its descriptor is
/// refused by both ends, saying what it is — never copied through silently.
#[test]
fn from_stream_refuses_what_is_not_tcp() {
    let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
    let unix = TcpStream::from(OwnedFd::from(a));
    let e = Sender::from_stream(unix, &SenderConfig::new(TxPath::Copy)).unwrap_err();
    assert!(
        matches!(&e, Error::UnsuitableSocket(m) if m.contains("Unix-domain")),
        "{e}"
    );
    let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
    let unix = TcpStream::from(OwnedFd::from(a));
    let e = Receiver::from_stream(unix, &ReceiverConfig::new(RxPath::Copy)).unwrap_err();
    assert!(
        matches!(&e, Error::UnsuitableSocket(m) if m.contains("Unix-domain")),
        "{e}"
    );
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let udp = TcpStream::from(OwnedFd::from(udp));
    let e = Sender::from_stream(udp, &SenderConfig::new(TxPath::Zerocopy)).unwrap_err();
    assert!(
        matches!(&e, Error::UnsuitableSocket(m) if m.contains("datagram")),
        "{e}"
    );
    assert_eq!(
        std::io::Error::from(e).kind(),
        std::io::ErrorKind::InvalidInput
    );
    // A real TCP socket still goes through, with the timeout it came with in force.
    let (c, _peer) = connection();
    c.set_read_timeout(Some(LIMIT)).unwrap();
    let mut rx = Receiver::from_stream(c, &ReceiverConfig::new(RxPath::Copy)).unwrap();
    let t = Instant::now();
    let e = rx.recv().unwrap_err();
    check_error("adopted SO_RCVTIMEO", Mode::SocketTimeout, &e, t.elapsed());
    let _ = rx.as_fd();
}

/// A bounded `sendfile`/`splice` lowers the socket's own `SO_SNDTIMEO`/`SO_RCVTIMEO` to
/// what is left of the call while the syscall runs (the kernel's only way to stop it); the
/// socket must leave each call with the values it came with, or every later call on it —
/// and the caller's own, after `into_inner` — runs with whatever was left of the last one.
#[test]
fn bounded_file_calls_leave_the_socket_timeouts_as_they_found_them() {
    let (_dir, file) = pattern_file();
    let out_dir = tempfile::tempdir().unwrap();
    let (c, s) = connection();
    let timeout = Duration::from_secs(30);
    for tx_mode in [FileTxMode::Sendfile, FileTxMode::Splice] {
        let (c, s) = (c.try_clone().unwrap(), s.try_clone().unwrap());
        let out = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(out_dir.path().join(format!("{tx_mode}")))
            .unwrap();
        let mut tx =
            Sender::from_stream(c, &SenderConfig::new(TxPath::Copy).timeout(timeout)).unwrap();
        let mut rx =
            Receiver::from_stream(s, &ReceiverConfig::new(RxPath::Copy).timeout(timeout)).unwrap();
        let tx_before = SockRef::from(&tx).write_timeout().unwrap();
        let rx_before = SockRef::from(&rx).read_timeout().unwrap();
        assert_eq!(
            tx_before,
            Some(timeout),
            "the config's timeout is the socket's"
        );
        std::thread::scope(|sc| {
            let sending = sc.spawn(|| {
                let n = tx.send_file_with(&file, 0, FILE_BYTES, tx_mode).unwrap();
                assert_eq!(n, FILE_BYTES);
                SockRef::from(&tx).write_timeout().unwrap()
            });
            let mut got = 0;
            while got < FILE_BYTES {
                got += rx
                    .recv_to_file_with(&out, got, FILE_BYTES - got, FileRxMode::Splice)
                    .unwrap();
            }
            assert_eq!(
                SockRef::from(&rx).read_timeout().unwrap(),
                rx_before,
                "recv_to_file left SO_RCVTIMEO changed"
            );
            assert_eq!(
                sending.join().unwrap(),
                tx_before,
                "send_file ({tx_mode}) left SO_SNDTIMEO changed"
            );
        });
        let mut buf = vec![0u8; 1 << 20];
        let mut pos = 0;
        while pos < FILE_BYTES {
            out.read_exact_at(&mut buf, pos).unwrap();
            assert_eq!(&buf[..], pattern(pos, buf.len()), "at {pos}");
            pos += buf.len() as u64;
        }
    }
}
