//! The exposed receiver ([`zcnet_transfer::server`]) against hostile and unlucky peers over
//! loopback: floods of stalled handshakes stay bounded while a real sender gets through,
//! every cap answers with a clear refusal, deadlines cut stalled and trickling peers,
//! failed authentications are rate-limited, `once` waits for a real handshake, a stop lets
//! sessions finish within the grace period, and an early close gives back reserved space.

use socket2::{Domain, SockAddr, Socket, Type};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcnet::{SenderConfig, TxPath};
use zcnet_testbed::pattern::pattern;
use zcnet_transfer::server::{serve, Event, Observer, ServerConfig};
use zcnet_transfer::session::{
    send_session, Progress, SendOptions, SessionReport, Source, TransferError,
};
use zcnet_transfer::wire::{Code, Frame};

/// Counts sessions started and ended, so tests can wait for them.
#[derive(Default)]
struct Counting {
    started: AtomicUsize,
    ended: AtomicUsize,
    refused: AtomicUsize,
}

impl Observer for Counting {
    fn event(&self, e: Event<'_>) {
        match e {
            Event::SessionStarted { .. } => {
                self.started.fetch_add(1, Ordering::SeqCst);
            }
            Event::SessionEnded { .. } => {
                self.ended.fetch_add(1, Ordering::SeqCst);
            }
            Event::Refused { .. } => {
                self.refused.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
    }
    fn progress(&self, _: SocketAddr) -> Box<dyn FnMut(Progress<'_>) + Send> {
        Box::new(|_| {})
    }
}

type Outcome = Option<Result<SessionReport, TransferError>>;

struct Running {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    obs: Arc<Counting>,
    handle: std::thread::JoinHandle<Outcome>,
}

impl Running {
    fn finish(self) -> Outcome {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.join().unwrap()
    }
}

fn start(dir: &Path, cfg: ServerConfig) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    start_on(listener, dir, cfg)
}

fn start_on(listener: TcpListener, dir: &Path, cfg: ServerConfig) -> Running {
    let addr = listener.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let obs = Arc::new(Counting::default());
    let (s, o, d) = (stop.clone(), obs.clone(), dir.to_path_buf());
    let handle = std::thread::spawn(move || serve(listener, &d, cfg, &s, o).unwrap());
    Running {
        addr,
        stop,
        obs,
        handle,
    }
}

/// A TCP connection to `to` from the loopback address `from` (any of 127/8).
fn connect_from(from: IpAddr, to: SocketAddr) -> TcpStream {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.bind(&SockAddr::from(SocketAddr::new(from, 0))).unwrap();
    s.connect(&SockAddr::from(to)).unwrap();
    let t: TcpStream = s.into();
    t.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    t
}

fn read_frame(s: &mut TcpStream) -> Option<Frame> {
    let mut h = [0u8; 5];
    s.read_exact(&mut h).ok()?;
    let (ty, len) = Frame::check_header(h).ok()?;
    let mut p = vec![0; len];
    s.read_exact(&mut p).ok()?;
    Frame::decode(ty, &p).ok()
}

fn hello(s: &mut TcpStream) {
    s.write_all(
        &Frame::Hello {
            version: 4, // files right after the Hello: no `Open` (version 5)
            auth: false,
            nonce: [1; 32],
        }
        .to_bytes(),
    )
    .unwrap();
}

fn make_file(path: &Path, len: usize, seed: u64) -> [u8; 32] {
    let mut f = std::fs::File::create(path).unwrap();
    let mut h = blake3::Hasher::new();
    let mut pos = 0;
    while pos < len {
        let n = (len - pos).min(4 << 20);
        let d = pattern(seed + pos as u64, n);
        f.write_all(d).unwrap();
        h.update(d);
        pos += n;
    }
    *h.finalize().as_bytes()
}

fn scfg() -> SenderConfig {
    let mut c = SenderConfig::new(TxPath::Copy);
    c.timeout = Some(Duration::from_secs(30));
    c
}

fn send_from(
    from: IpAddr,
    to: SocketAddr,
    path: &Path,
    name: &str,
    token: Option<&[u8]>,
) -> Result<SessionReport, TransferError> {
    let stream = connect_from(from, to);
    let mut tx = zcnet::Sender::from_stream(stream, &scfg()).unwrap();
    let mut o = SendOptions::default();
    o.verify = true;
    o.token = token.map(|t| t.to_vec());
    send_session(
        &mut tx,
        vec![Source::File {
            path: path.to_path_buf(),
            name: name.into(),
        }],
        &o,
        &mut |_| {},
    )
}

fn partials(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".partial"))
        .collect()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        if t0.elapsed() >= limit {
            panic!("timed out waiting for {what}"); // a hang guard, not a speed check
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Session threads of the server on `port` (they are named for it), from /proc.
fn session_threads(port: u16) -> usize {
    let name = format!("zcrecv {port}");
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter(|t| {
            std::fs::read_to_string(t.as_ref().unwrap().path().join("comm"))
                .is_ok_and(|c| c.trim() == name)
        })
        .count()
}

#[test]
fn a_flood_of_stalled_handshakes_is_bounded_and_a_real_sender_gets_through() {
    let dst = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    let mut cfg = ServerConfig::default();
    cfg.max_pending = 64;
    cfg.max_pending_per_addr = 4;
    cfg.handshake_timeout = Duration::from_secs(20);
    let srv = start(dst.path(), cfg);
    // 100 from one address: 4 are admitted (they get a Hello), the rest a clear refusal.
    let mut one_addr: Vec<TcpStream> = (0..100)
        .map(|_| connect_from(ip("127.0.0.1"), srv.addr))
        .collect();
    let mut admitted = 0;
    for s in &mut one_addr {
        match read_frame(s) {
            Some(Frame::Hello { .. }) => admitted += 1,
            Some(Frame::Refuse { code, message }) => {
                assert_eq!(code, Code::Busy);
                assert!(message.contains("handshake"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(admitted, 4);
    // 300 more from 150 addresses: never more than 64 held; the oldest are let go.
    let many: Vec<TcpStream> = (0..300)
        .map(|i| {
            connect_from(
                ip(&format!("127.0.{}.{}", 1 + i / 200, 2 + (i % 150))),
                srv.addr,
            )
        })
        .collect();
    // Those still held have no refusal waiting; the others do (or are closed).
    std::thread::sleep(Duration::from_millis(300));
    let held = many
        .iter()
        .filter(|s| {
            s.set_nonblocking(true).unwrap();
            let mut b = [0u8; 64];
            let mut h = Vec::new();
            loop {
                match (&**s).read(&mut b) {
                    Ok(0) => return false,
                    Ok(n) => h.extend_from_slice(&b[..n]),
                    Err(_) => break,
                }
            }
            // Only the server's Hello arrived: still in its handshake.
            matches!(Frame::parse(&h), Ok(Some((Frame::Hello { .. }, n))) if n == h.len())
        })
        .count();
    assert!(held <= 64, "{held} handshakes held at once");
    assert_eq!(
        session_threads(srv.addr.port()),
        0,
        "no thread per unauthenticated connection"
    );
    // A real sender from yet another address gets through, every byte checked.
    let f = src.path().join("real");
    let h = make_file(&f, 4 << 20, 3);
    let r = send_from(ip("127.0.9.9"), srv.addr, &f, "real", None).unwrap();
    assert_eq!(r.failures(), 0);
    assert_eq!(
        *blake3::hash(&std::fs::read(dst.path().join("real")).unwrap()).as_bytes(),
        h
    );
    drop(many);
    drop(one_addr);
    assert!(srv.finish().is_none());
}

#[test]
fn a_silent_peer_is_cut_at_the_handshake_deadline() {
    let dst = tempfile::tempdir().unwrap();
    let mut cfg = ServerConfig::default();
    cfg.handshake_timeout = Duration::from_millis(300);
    let srv = start(dst.path(), cfg);
    let mut s = connect_from(ip("127.0.0.1"), srv.addr);
    assert!(matches!(read_frame(&mut s), Some(Frame::Hello { .. })));
    // The refusal comes from the 300 ms deadline; the socket's own 20 s read timeout would
    // end `read_frame` with nothing.
    match read_frame(&mut s) {
        Some(Frame::Refuse { code, message }) => {
            assert_eq!(code, Code::Busy);
            assert!(message.contains("no handshake within"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.read(&mut [0u8; 1]).unwrap(), 0, "closed");
    srv.finish();
}

#[test]
fn at_the_session_cap_a_sender_is_told_the_receiver_is_busy() {
    let dst = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    let mut cfg = ServerConfig::default();
    cfg.max_sessions = 1;
    let srv = start(dst.path(), cfg);
    let mut holder = connect_from(ip("127.0.0.1"), srv.addr);
    assert!(matches!(read_frame(&mut holder), Some(Frame::Hello { .. })));
    hello(&mut holder);
    wait_until("the session", Duration::from_secs(10), || {
        srv.obs.started.load(Ordering::SeqCst) == 1
    });
    let f = src.path().join("f");
    make_file(&f, 1000, 1);
    let e = send_from(ip("127.0.0.2"), srv.addr, &f, "f", None).unwrap_err();
    assert!(
        matches!(&e, TransferError::Refused(m) if m.contains("busy")),
        "{e}"
    );
    // The slot comes back when the holder leaves.
    drop(holder);
    wait_until("the session's end", Duration::from_secs(10), || {
        srv.obs.ended.load(Ordering::SeqCst) == 1
    });
    wait_until("the freed slot", Duration::from_secs(10), || {
        send_from(ip("127.0.0.2"), srv.addr, &f, "f", None).is_ok()
    });
    assert!(dst.path().join("f").exists());
    srv.finish();
}

#[test]
fn a_trickling_session_is_cut_at_its_deadline_and_keeps_only_a_partial_file() {
    let dst = tempfile::tempdir().unwrap();
    let mut cfg = ServerConfig::default();
    cfg.session_deadline = Duration::from_millis(700);
    cfg.idle_timeout = Duration::from_secs(30);
    let srv = start(dst.path(), cfg);
    let mut s = connect_from(ip("127.0.0.1"), srv.addr);
    assert!(matches!(read_frame(&mut s), Some(Frame::Hello { .. })));
    hello(&mut s);
    s.write_all(
        &Frame::File {
            name: "slow".into(),
            size: 1 << 20,
            mode: 0o644,
            mtime_s: 0,
            mtime_ns: 0,
            verify: true,
        }
        .to_bytes(),
    )
    .unwrap();
    assert!(matches!(read_frame(&mut s), Some(Frame::Ready { .. })));
    s.write_all(&Frame::Start { offset: 0 }.to_bytes()).unwrap();
    let t0 = Instant::now();
    // One byte every 100 ms: each read is far inside the idle timeout.
    let mut sent = 0;
    while t0.elapsed() < Duration::from_secs(10) {
        if s.write_all(&[7]).is_err() {
            break;
        }
        sent += 1;
        if srv.obs.ended.load(Ordering::SeqCst) == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Bounded well inside the 30 s idle timeout: only the session deadline can cut it.
    wait_until("the cut", Duration::from_secs(10), || {
        srv.obs.ended.load(Ordering::SeqCst) == 1
    });
    assert!(!dst.path().join("slow").exists());
    let p = partials(dst.path());
    assert_eq!(p.len(), 1);
    let m = std::fs::metadata(&p[0]).unwrap();
    assert!(m.len() <= sent && m.len() > 0, "{} of {sent}", m.len());
    use std::os::unix::fs::MetadataExt;
    assert!(
        m.blocks() <= 16,
        "reservation released: {} blocks",
        m.blocks()
    );
    srv.finish();
}

#[test]
fn failed_authentications_are_rate_limited_per_address() {
    let dst = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    let f = src.path().join("f");
    make_file(&f, 100, 1);
    let mut cfg = ServerConfig::default();
    cfg.token = Some(b"right".to_vec());
    cfg.auth_failures_per_minute = 3;
    let srv = start(dst.path(), cfg);
    for _ in 0..3 {
        let e = send_from(ip("127.0.0.3"), srv.addr, &f, "f", Some(b"wrong")).unwrap_err();
        assert!(matches!(e, TransferError::Auth(_)), "{e}");
    }
    let e = send_from(ip("127.0.0.3"), srv.addr, &f, "f", Some(b"right")).unwrap_err();
    assert!(
        matches!(&e, TransferError::Refused(m) if m.contains("too many failed")),
        "{e}"
    );
    // Another address is not affected.
    send_from(ip("127.0.0.4"), srv.addr, &f, "f", Some(b"right")).unwrap();
    assert!(dst.path().join("f").exists());
    srv.finish();
}

#[test]
fn once_serves_the_first_peer_that_completes_a_handshake() {
    let dst = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    let f = src.path().join("f");
    let h = make_file(&f, 100_000, 2);
    let mut cfg = ServerConfig::default();
    cfg.once = true;
    let srv = start(dst.path(), cfg);
    // A stranger that connects and closes, and one that speaks HTTP.
    drop(connect_from(ip("127.0.0.1"), srv.addr));
    let mut g = connect_from(ip("127.0.0.1"), srv.addr);
    g.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let r = send_from(ip("127.0.0.1"), srv.addr, &f, "f", None).unwrap();
    assert_eq!(r.failures(), 0);
    let outcome = srv.handle.join().unwrap();
    let report = outcome.expect("a session ran").unwrap();
    assert_eq!(report.failures(), 0);
    assert_eq!(
        *blake3::hash(&std::fs::read(dst.path().join("f")).unwrap()).as_bytes(),
        h
    );
}

#[test]
fn a_stop_lets_a_session_in_flight_finish_and_refuses_new_ones() {
    let dst = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    let f = src.path().join("big");
    let h = make_file(&f, 48 << 20, 5);
    let mut cfg = ServerConfig::default();
    cfg.grace = Duration::from_secs(60);
    let srv = start(dst.path(), cfg);
    let addr = srv.addr;
    let sender = {
        let f = f.clone();
        std::thread::spawn(move || send_from(ip("127.0.0.1"), addr, &f, "big", None))
    };
    wait_until("the session", Duration::from_secs(10), || {
        srv.obs.started.load(Ordering::SeqCst) == 1
    });
    srv.stop.store(true, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        TcpStream::connect(addr).is_err(),
        "no more accepting after a stop"
    );
    let r = sender.join().unwrap().unwrap();
    assert_eq!(r.failures(), 0);
    assert!(srv.handle.join().unwrap().is_none());
    assert_eq!(
        *blake3::hash(&std::fs::read(dst.path().join("big")).unwrap()).as_bytes(),
        h
    );
    assert!(partials(dst.path()).is_empty());
}

#[test]
fn after_the_grace_period_a_stalled_session_is_cut_leaving_only_its_partial_file() {
    let dst = tempfile::tempdir().unwrap();
    let mut cfg = ServerConfig::default();
    cfg.grace = Duration::from_millis(200);
    // Nothing but the grace cut can end the stalled session before the hang guard below.
    cfg.idle_timeout = Duration::from_secs(600);
    let srv = start(dst.path(), cfg);
    let mut s = connect_from(ip("127.0.0.1"), srv.addr);
    assert!(matches!(read_frame(&mut s), Some(Frame::Hello { .. })));
    hello(&mut s);
    s.write_all(
        &Frame::File {
            name: "half".into(),
            size: 1000,
            mode: 0o644,
            mtime_s: 0,
            mtime_ns: 0,
            verify: true,
        }
        .to_bytes(),
    )
    .unwrap();
    assert!(matches!(read_frame(&mut s), Some(Frame::Ready { .. })));
    s.write_all(&Frame::Start { offset: 0 }.to_bytes()).unwrap();
    s.write_all(pattern(0, 500)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(srv.finish().is_none()));
    match finished.recv_timeout(Duration::from_secs(30)) {
        Ok(clean) => assert!(clean),
        Err(_) => panic!("the grace period never cut the session"), // a hang guard
    }
    assert!(!dst.path().join("half").exists());
    let p = partials(dst.path());
    assert_eq!(p.len(), 1);
    assert_eq!(std::fs::read(&p[0]).unwrap(), pattern(0, 500));
}

/// Announce a large file, read `Ready`, then close (or send `Abort`): on a small tmpfs the
/// space comes back each time (checked with statvfs, as `df` does), and a legitimate sender
/// of nearly the whole file system then succeeds. Needs root to mount the tmpfs.
#[cfg_attr(
    not(all(zcnet_root, zcnet_has_mount, zcnet_has_umount)),
    ignore = "needs root and mount (mounts a tmpfs)"
)]
#[test]
fn early_ends_give_back_their_reservation_on_a_small_tmpfs() {
    let mnt = tempfile::tempdir().unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64m", "zcnet-test"])
        .arg(mnt.path())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "mounting a tmpfs as root");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _u = Unmount(mnt.path().to_path_buf());
    let free = || {
        let st = rustix::fs::statvfs(mnt.path()).unwrap();
        st.f_bavail * st.f_frsize
    };
    let free0 = free();
    let srv = start(mnt.path(), ServerConfig::default());
    let announce = |s: &mut TcpStream, name: &str| {
        s.write_all(
            &Frame::File {
                name: name.into(),
                size: 48 << 20,
                mode: 0o644,
                mtime_s: 0,
                mtime_ns: 0,
                verify: true,
            }
            .to_bytes(),
        )
        .unwrap();
        read_frame(s)
    };
    for i in 0..8 {
        let mut s = connect_from(ip("127.0.0.1"), srv.addr);
        assert!(matches!(read_frame(&mut s), Some(Frame::Hello { .. })));
        hello(&mut s);
        let f = announce(&mut s, &format!("c{i}"));
        assert!(matches!(f, Some(Frame::Ready { .. })), "c{i}: {f:?}");
        drop(s);
        wait_until("the session's end", Duration::from_secs(10), || {
            srv.obs.ended.load(Ordering::SeqCst) == i + 1
        });
    }
    let mut s = connect_from(ip("127.0.0.1"), srv.addr);
    assert!(matches!(read_frame(&mut s), Some(Frame::Hello { .. })));
    hello(&mut s);
    for i in 0..8 {
        assert!(matches!(
            announce(&mut s, &format!("a{i}")),
            Some(Frame::Ready { .. })
        ));
        s.write_all(
            &Frame::Abort {
                message: "changed my mind".into(),
            }
            .to_bytes(),
        )
        .unwrap();
    }
    s.write_all(&Frame::Bye.to_bytes()).unwrap();
    assert_eq!(read_frame(&mut s), Some(Frame::Bye));
    wait_until("all sessions to end", Duration::from_secs(10), || {
        srv.obs.ended.load(Ordering::SeqCst) == 9
    });
    let after = free();
    assert!(
        after + (1 << 20) >= free0,
        "{} KiB still reserved",
        (free0 - after) >> 10
    );
    assert!(
        partials(mnt.path()).is_empty(),
        "no bytes arrived: nothing left"
    );
    // A file larger than the file system is refused at once and leaves nothing.
    let mut s = connect_from(ip("127.0.0.1"), srv.addr);
    assert!(matches!(read_frame(&mut s), Some(Frame::Hello { .. })));
    hello(&mut s);
    s.write_all(
        &Frame::File {
            name: "huge".into(),
            size: 100 << 20,
            mode: 0o644,
            mtime_s: 0,
            mtime_ns: 0,
            verify: true,
        }
        .to_bytes(),
    )
    .unwrap();
    match read_frame(&mut s) {
        Some(Frame::Refuse { code, message }) => {
            assert_eq!(code, Code::Io);
            assert!(message.contains("space"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    drop(s);
    assert!(
        partials(mnt.path()).is_empty(),
        "a refused file leaves nothing"
    );
    let src = tempfile::tempdir().unwrap();
    let f = src.path().join("legit");
    let h = make_file(&f, 48 << 20, 8);
    send_from(ip("127.0.0.1"), srv.addr, &f, "legit", None).unwrap();
    assert_eq!(
        *blake3::hash(&std::fs::read(mnt.path().join("legit")).unwrap()).as_bytes(),
        h
    );
    srv.finish();
}

#[test]
fn the_byte_cap_holds_per_address_across_connections() {
    let dst = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    let f = src.path().join("f");
    make_file(&f, 600_000, 4);
    let mut cfg = ServerConfig::default();
    cfg.store.max_bytes = Some(1_000_000);
    let srv = start(dst.path(), cfg);
    let r = send_from(ip("127.0.0.5"), srv.addr, &f, "one", None).unwrap();
    assert_eq!(r.failures(), 0);
    // A second connection from the same address: over the cap.
    let r = send_from(ip("127.0.0.5"), srv.addr, &f, "two", None).unwrap();
    let (code, message) = r.files[0].result.clone().unwrap_err();
    assert_eq!(code, Code::TooLarge, "{message}");
    assert!(message.contains("per sender"), "{message}");
    // Another address has its own allowance.
    let r = send_from(ip("127.0.0.6"), srv.addr, &f, "three", None).unwrap();
    assert_eq!(r.failures(), 0);
    assert!(!dst.path().join("two").exists());
    assert!(partials(dst.path()).is_empty());
    srv.finish();
}

/// The same-name race through one real receiver serving both senders at once, 50 rounds in
/// each of the four modes (verify or not × overwrite or not): the final file is always one
/// sender's whole file, never a mix, never missing; without `--overwrite` exactly one sender
/// is told Ok and it is the one whose bytes are final; nothing partial is left.
#[test]
fn concurrent_senders_of_one_name_through_one_receiver_never_mix() {
    let src = tempfile::tempdir().unwrap();
    let (a, b) = (src.path().join("a"), src.path().join("b"));
    let ha = make_file(&a, 300_000, 11);
    let hb = make_file(&b, 300_000, 99_999);
    for verify in [true, false] {
        for overwrite in [false, true] {
            let dst = tempfile::tempdir().unwrap();
            let mut cfg = ServerConfig::default();
            cfg.store.overwrite = overwrite;
            let srv = start(dst.path(), cfg);
            for round in 0..50 {
                let _ = std::fs::remove_file(dst.path().join("same"));
                let send = |path: &Path, from: &str| {
                    let stream = connect_from(ip(from), srv.addr);
                    let mut tx = zcnet::Sender::from_stream(stream, &scfg()).unwrap();
                    let mut o = SendOptions::default();
                    o.verify = verify;
                    send_session(
                        &mut tx,
                        vec![Source::File {
                            path: path.to_path_buf(),
                            name: "same".into(),
                        }],
                        &o,
                        &mut |_| {},
                    )
                    .unwrap()
                };
                let (ra, rb) = std::thread::scope(|s| {
                    let ta = s.spawn(|| send(&a, "127.0.0.1"));
                    let tb = s.spawn(|| send(&b, "127.0.0.2"));
                    (ta.join().unwrap(), tb.join().unwrap())
                });
                let what = format!("verify={verify} overwrite={overwrite} round {round}");
                let p = dst.path().join("same");
                assert!(p.exists(), "{what}: both lost");
                let h = *blake3::hash(&std::fs::read(&p).unwrap()).as_bytes();
                assert!(h == ha || h == hb, "{what}: a mixed final file");
                let ok = [ra.failures() == 0, rb.failures() == 0];
                if overwrite {
                    assert_eq!(ok, [true, true], "{what}");
                } else {
                    assert_eq!(ok.iter().filter(|o| **o).count(), 1, "{what}");
                    assert_eq!(h, if ok[0] { ha } else { hb }, "{what}");
                }
                for r in [&ra, &rb] {
                    assert_eq!(r.files[0].verified, verify && r.failures() == 0, "{what}");
                }
                wait_until("both sessions to end", Duration::from_secs(10), || {
                    srv.obs.ended.load(Ordering::SeqCst) == 2 * (round + 1)
                });
                assert!(partials(dst.path()).is_empty(), "{what}");
            }
            srv.finish();
        }
    }
}

#[test]
fn one_address_cannot_take_every_session() {
    let dst = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    let f = src.path().join("f");
    make_file(&f, 1000, 1);
    let mut cfg = ServerConfig::default();
    cfg.max_sessions = 8;
    cfg.max_sessions_per_addr = 2;
    let srv = start(dst.path(), cfg);
    // Two idle sessions from one address (a Hello is all it takes without a token).
    let held: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = connect_from(ip("127.0.0.7"), srv.addr);
            assert!(matches!(read_frame(&mut s), Some(Frame::Hello { .. })));
            hello(&mut s);
            s
        })
        .collect();
    wait_until("the sessions", Duration::from_secs(10), || {
        srv.obs.started.load(Ordering::SeqCst) == 2
    });
    let e = send_from(ip("127.0.0.7"), srv.addr, &f, "f", None).unwrap_err();
    assert!(
        matches!(&e, TransferError::Refused(m) if m.contains("per address")),
        "{e}"
    );
    send_from(ip("127.0.0.8"), srv.addr, &f, "f", None).unwrap();
    assert!(dst.path().join("f").exists());
    drop(held);
    srv.finish();
}

/// Two peers admitted at once, both completing their handshake while one slot is left: the
/// second is refused after its `Hello` — with its `File` already sent — and reads the
/// refusal with the reason; the slot is free again as soon as the first session has ended.
#[test]
fn a_refusal_after_the_handshake_says_why_and_the_slot_comes_back() {
    let dst = tempfile::tempdir().unwrap();
    let mut cfg = ServerConfig::default();
    cfg.max_sessions = 1;
    let srv = start(dst.path(), cfg);
    for round in 0..20 {
        let mut a = connect_from(ip("127.0.0.1"), srv.addr);
        let mut b = connect_from(ip("127.0.0.2"), srv.addr);
        assert!(matches!(read_frame(&mut a), Some(Frame::Hello { .. })));
        assert!(matches!(read_frame(&mut b), Some(Frame::Hello { .. })));
        hello(&mut a);
        wait_until("a's session", Duration::from_secs(10), || {
            srv.obs.started.load(Ordering::SeqCst) == round + 1
        });
        let mut bytes = Frame::Hello {
            version: 4, // files right after the Hello: no `Open` (version 5)
            auth: false,
            nonce: [2; 32],
        }
        .to_bytes();
        bytes.extend(
            Frame::File {
                name: "x".into(),
                size: 10,
                mode: 0o644,
                mtime_s: 0,
                mtime_ns: 0,
                verify: true,
            }
            .to_bytes(),
        );
        b.write_all(&bytes).unwrap();
        match read_frame(&mut b) {
            Some(Frame::Refuse { code, message }) => {
                assert_eq!(code, Code::Busy);
                assert!(message.contains("busy"), "{message}");
            }
            other => panic!("round {round}: {other:?}"),
        }
        drop(a);
        wait_until("a's end", Duration::from_secs(10), || {
            srv.obs.ended.load(Ordering::SeqCst) == round + 1
        });
    }
    srv.finish();
}
