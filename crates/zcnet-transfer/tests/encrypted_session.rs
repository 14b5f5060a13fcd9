//! Sessions inside TLS 1.3 (protocol version 10), end to end over real sockets: a file and a
//! tree arrive byte for byte through the receiver's server and through a one-session
//! receiver, a receiver that is not the pinned key is refused, a sender and a receiver that
//! disagree about encryption both stop and say why (never a silent downgrade), a wrong
//! token fails both ways with the proofs bound to the TLS channel; streams (each its own TLS
//! connection), ranges, resume (a token's holder through the server too) and a sparse file
//! verified by its extents work encrypted; a proxy that flips a data byte fails both
//! ends and one that strips or rewrites the preamble is refused; the kTLS attempt is counted
//! once per connection with the kernel's reason.

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::symlink;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use zcnet::{ReceiverConfig, RxPath, SenderConfig, TxPath};
use zcnet_testbed::pattern::pattern;
use zcnet_transfer::server::{serve, Event, Observer, ServerConfig};
use zcnet_transfer::session::{
    receive_session, send_session, Progress, RecvOptions, RecvSecurity, SendOptions, SendSecurity,
    SessionReport, Source, TransferError,
};
use zcnet_transfer::store::{SenderId, Store, StoreOptions};
use zcnet_transfer::tls::{Expect, Identity, Refusal, TlsError, Trust};
use zcnet_transfer::wire::{Frame, ENCRYPTION_REQUIRED};

fn scfg() -> SenderConfig {
    let mut c = SenderConfig::new(TxPath::Copy);
    c.timeout = Some(Duration::from_secs(30));
    c
}

fn rcfg() -> ReceiverConfig {
    let mut c = ReceiverConfig::new(RxPath::Copy);
    c.timeout = Some(Duration::from_secs(30));
    c
}

fn make_file(path: &Path, len: usize, seed: u64) {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).unwrap();
    }
    let mut f = std::fs::File::create(path).unwrap();
    let mut pos = 0;
    while pos < len {
        let n = (len - pos).min(4 << 20);
        std::io::Write::write_all(&mut f, pattern(seed + pos as u64, n)).unwrap();
        pos += n;
    }
}

/// Every regular file under `a` is under `b` with the same bytes, and the other way round.
fn same_tree(a: &Path, b: &Path) {
    fn files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                files(root, &p, out);
            } else {
                out.push(p.strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    let (mut fa, mut fb) = (Vec::new(), Vec::new());
    files(a, a, &mut fa);
    files(b, b, &mut fb);
    fa.sort();
    fb.sort();
    assert_eq!(fa, fb, "the same names");
    for f in fa {
        let (pa, pb) = (a.join(&f), b.join(&f));
        if std::fs::symlink_metadata(&pa).unwrap().is_symlink() {
            assert_eq!(
                std::fs::read_link(&pa).unwrap(),
                std::fs::read_link(&pb).unwrap()
            );
        } else {
            assert!(
                std::fs::read(&pa).unwrap() == std::fs::read(&pb).unwrap(),
                "{} differs",
                f.display()
            );
        }
    }
}

/// What the server said, as text.
#[derive(Default)]
struct Log(Mutex<Vec<String>>);

impl Observer for Log {
    fn event(&self, e: Event<'_>) {
        let line = match e {
            Event::HandshakeFailed { error, .. } => format!("handshake failed: {error}"),
            Event::SessionEnded { result, .. } => match result {
                Ok(r) => format!("ended: {} files", r.files.len()),
                Err(e) => format!("ended: {e}"),
            },
            Event::Refused { reason, .. } => format!("refused: {reason}"),
            _ => return,
        };
        self.0.lock().unwrap().push(line);
    }
    fn progress(&self, _: SocketAddr) -> Box<dyn FnMut(Progress<'_>) + Send> {
        Box::new(|_| {})
    }
}

struct Server {
    addr: SocketAddr,
    log: Arc<Log>,
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Option<Result<SessionReport, TransferError>>>,
}

impl Server {
    fn start(dir: &Path, security: RecvSecurity, token: Option<&[u8]>, once: bool) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut cfg = ServerConfig::default();
        cfg.security = security;
        cfg.once = once;
        cfg.token = token.map(<[u8]>::to_vec);
        cfg.handshake_timeout = Duration::from_secs(20);
        let log = Arc::new(Log::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s, d) = (log.clone(), stop.clone(), dir.to_path_buf());
        let handle = std::thread::spawn(move || serve(listener, &d, cfg, &s, l).unwrap());
        Server {
            addr,
            log,
            stop,
            handle,
        }
    }

    /// Stops it; its log.
    fn stop(self) -> Vec<String> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = self.handle.join().unwrap();
        let v = self.log.0.lock().unwrap().clone();
        v
    }

    /// Waits until its log holds a line with `what`; the log.
    fn wait_for(&self, what: &str) -> Vec<String> {
        let t0 = std::time::Instant::now();
        loop {
            let v = self.log.0.lock().unwrap().clone();
            if v.iter().any(|l| l.contains(what)) || t0.elapsed() > Duration::from_secs(20) {
                return v;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn send_to(
    addr: SocketAddr,
    sources: Vec<Source>,
    opts: &SendOptions,
) -> Result<SessionReport, TransferError> {
    let mut tx = zcnet::Sender::connect(addr, &scfg()).map_err(TransferError::from)?;
    send_session(&mut tx, sources, opts, &mut |_| {})
}

fn tls_opts(expect: Expect, token: Option<&[u8]>) -> SendOptions {
    let mut o = SendOptions::default();
    o.verify = true;
    o.security = SendSecurity::Tls(expect);
    o.token = token.map(<[u8]>::to_vec);
    o
}

fn file(path: &Path, name: &str) -> Source {
    Source::File {
        path: path.to_path_buf(),
        name: name.into(),
    }
}

/// A tree with what each path of the protocol carries: `Put`s (small files), files by the
/// data path (over the `Put` size), an empty file, an empty directory and a symlink.
fn tree(root: &Path) -> Vec<Source> {
    let mut out = Vec::new();
    for (i, len) in [0usize, 1, 4096, 100_000, 300_000, 3 << 20]
        .iter()
        .enumerate()
    {
        let name = format!("d{}/f{i}", i % 2);
        make_file(&root.join(&name), *len, i as u64 * 7919);
        out.push(file(&root.join(&name), &name));
    }
    std::fs::create_dir_all(root.join("empty")).unwrap();
    out.push(Source::Dir {
        path: root.join("empty"),
        name: "empty".into(),
    });
    symlink("d0/f0", root.join("link")).unwrap();
    out.push(Source::Link {
        name: "link".into(),
        target: "d0/f0".into(),
    });
    out
}

#[test]
fn a_tree_goes_encrypted_through_the_server_byte_for_byte() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let sources = tree(src.path());
    let id = Arc::new(Identity::generate().unwrap());
    let fp = id.fingerprint();
    let server = Server::start(dst.path(), RecvSecurity::Tls(id), Some(b"tok"), false);
    let r = send_to(
        server.addr,
        sources,
        &tls_opts(Expect::Pinned(fp), Some(b"tok")),
    )
    .unwrap();
    assert_eq!(r.failures(), 0, "{:?}", r.files);
    assert_eq!(r.trust, Some(Trust::Pinned(fp)));
    let log = server.stop();
    assert!(log.iter().any(|l| l == "ended: 8 files"), "{log:?}");
    // `empty` is a directory with nothing in it: compare it by hand.
    assert!(dst.path().join("empty").is_dir());
    std::fs::remove_dir(src.path().join("empty")).unwrap();
    std::fs::remove_dir(dst.path().join("empty")).unwrap();
    same_tree(src.path(), dst.path());
}

#[test]
fn a_file_goes_encrypted_to_a_one_session_receiver_with_known_hosts() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    make_file(&src.path().join("big"), 5 << 20, 3);
    let id = Arc::new(Identity::generate().unwrap());
    let fp = id.fingerprint();
    let listener = zcnet::stream::Listener::bind("127.0.0.1:0".parse().unwrap(), &rcfg()).unwrap();
    let addr = listener.local_addr().unwrap();
    let d = dst.path().to_path_buf();
    let rx = std::thread::spawn(move || {
        let mut rx = listener.accept().unwrap();
        let mut store = Store::open(&d, StoreOptions::default()).unwrap();
        let mut o = RecvOptions::default();
        o.security = RecvSecurity::Tls(id);
        receive_session(&mut rx, &mut store, &o, &mut |_| {})
    });
    let known = state.path().join("known_hosts");
    let expect = Expect::KnownHosts {
        file: known.clone(),
        host: addr.to_string(),
    };
    let r = send_to(
        addr,
        vec![file(&src.path().join("big"), "big")],
        &tls_opts(expect, None),
    )
    .unwrap();
    assert_eq!(r.failures(), 0);
    assert!(r.files[0].verified);
    assert_eq!(r.trust, Some(Trust::FirstUse(fp)), "recorded on first use");
    assert!(std::fs::read_to_string(&known)
        .unwrap()
        .contains(&fp.to_string()));
    assert_eq!(rx.join().unwrap().unwrap().failures(), 0);
    same_tree(src.path(), dst.path());
}

#[test]
fn a_receiver_that_is_not_the_pinned_key_is_refused_and_gets_nothing() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    make_file(&src.path().join("f"), 1000, 1);
    let other = Identity::generate().unwrap().fingerprint();
    let id = Arc::new(Identity::generate().unwrap());
    let presented = id.fingerprint();
    let server = Server::start(dst.path(), RecvSecurity::Tls(id), None, false);
    let e = send_to(
        server.addr,
        vec![file(&src.path().join("f"), "f")],
        &tls_opts(Expect::Pinned(other), None),
    )
    .unwrap_err();
    match &e {
        TransferError::Tls(TlsError::Refused(Refusal::Pinned {
            expected,
            presented: p,
        })) => {
            assert_eq!((*expected, *p), (other, presented));
        }
        e => panic!("not a pin refusal: {e}"),
    }
    let log = server.wait_for("handshake failed");
    assert!(
        log.iter().any(|l| l.starts_with("handshake failed: TLS")),
        "{log:?}"
    );
    server.stop();
    assert_eq!(std::fs::read_dir(dst.path()).unwrap().count(), 0);
}

#[test]
fn a_plaintext_sender_is_told_the_receiver_requires_encryption() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    make_file(&src.path().join("f"), 1000, 1);
    let id = Arc::new(Identity::generate().unwrap());
    let server = Server::start(dst.path(), RecvSecurity::Tls(id), None, false);
    // This version's plaintext sender, and one that speaks version 9, the last before TLS
    // (an older zcnet).
    for max_version in [zcnet_transfer::wire::VERSION, 9] {
        let mut o = SendOptions::default();
        o.max_version = max_version;
        let e = send_to(server.addr, vec![file(&src.path().join("f"), "f")], &o).unwrap_err();
        match &e {
            TransferError::Refused(m) => assert_eq!(m, ENCRYPTION_REQUIRED),
            e => panic!("version {max_version}: {e}"),
        }
        assert!(e.to_string().contains("this receiver requires encryption"));
    }
    let log = server.wait_for("does not encrypt");
    assert!(
        log.iter()
            .any(|l| l.contains("it does not encrypt") && l.contains("requires encryption")),
        "{log:?}"
    );
    // What an older sender reads first, on a raw socket: the refusal, in plaintext.
    let mut s = TcpStream::connect(server.addr).unwrap();
    let mut h = [0u8; 5];
    s.read_exact(&mut h).unwrap();
    let (ty, len) = Frame::check_header(h).unwrap();
    let mut p = vec![0; len];
    s.read_exact(&mut p).unwrap();
    assert!(matches!(Frame::decode(ty, &p).unwrap(),
        Frame::Refuse { message, .. } if message == ENCRYPTION_REQUIRED));
    drop(s);
    server.stop();
    assert_eq!(std::fs::read_dir(dst.path()).unwrap().count(), 0);
}

#[test]
fn an_encrypting_sender_refuses_a_plaintext_receiver_and_the_receiver_says_why() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    make_file(&src.path().join("f"), 1000, 1);
    let server = Server::start(dst.path(), RecvSecurity::Plaintext, None, false);
    let fp = Identity::generate().unwrap().fingerprint();
    let e = send_to(
        server.addr,
        vec![file(&src.path().join("f"), "f")],
        &tls_opts(Expect::Pinned(fp), None),
    )
    .unwrap_err();
    assert!(
        matches!(&e, TransferError::NotEncrypted(m) if m.contains("the receiver does not encrypt")),
        "{e}"
    );
    let log = server.wait_for("handshake failed");
    assert!(
        log.iter()
            .any(|l| l.contains("the sender encrypts") && l.contains("--plaintext")),
        "{log:?}"
    );
    server.stop();
    assert_eq!(std::fs::read_dir(dst.path()).unwrap().count(), 0);
}

#[test]
fn a_wrong_token_fails_both_ways_inside_tls() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    make_file(&src.path().join("f"), 1000, 1);
    let id = Arc::new(Identity::generate().unwrap());
    let fp = id.fingerprint();
    let server = Server::start(dst.path(), RecvSecurity::Tls(id), Some(b"right"), false);
    // The sender's token is wrong: the receiver refuses its proof.
    let e = send_to(
        server.addr,
        vec![file(&src.path().join("f"), "f")],
        &tls_opts(Expect::Pinned(fp), Some(b"wrong")),
    )
    .unwrap_err();
    assert!(
        matches!(&e, TransferError::Auth(m) if m.contains("wrong or missing token")),
        "{e}"
    );
    let log = server.wait_for("handshake failed");
    assert!(
        log.iter()
            .any(|l| l.contains("did not prove it knows the token")),
        "{log:?}"
    );
    server.stop();
    // The receiver's token is another: the sender's proof fails there, and a receiver
    // that would skip its own check still could not prove a token it does not have.
    let id = Arc::new(Identity::generate().unwrap());
    let fp = id.fingerprint();
    let server = Server::start(dst.path(), RecvSecurity::Tls(id), Some(b"other"), false);
    let e = send_to(
        server.addr,
        vec![file(&src.path().join("f"), "f")],
        &tls_opts(Expect::Pinned(fp), Some(b"right")),
    )
    .unwrap_err();
    assert!(matches!(&e, TransferError::Auth(_)), "{e}");
    // A receiver without a token cannot prove one: the sender refuses to send.
    server.stop();
    let id = Arc::new(Identity::generate().unwrap());
    let fp = id.fingerprint();
    let server = Server::start(dst.path(), RecvSecurity::Tls(id), None, false);
    let e = send_to(
        server.addr,
        vec![file(&src.path().join("f"), "f")],
        &tls_opts(Expect::Pinned(fp), Some(b"right")),
    )
    .unwrap_err();
    assert!(
        matches!(&e, TransferError::Auth(m) if m.contains("did not ask for the token")),
        "{e}"
    );
    server.stop();
    assert_eq!(std::fs::read_dir(dst.path()).unwrap().count(), 0);
}

fn connect_to(addr: SocketAddr) -> impl Fn() -> Result<zcnet::Sender, TransferError> + Sync {
    move || zcnet::Sender::connect(addr, &scfg()).map_err(TransferError::from)
}

/// A session of three streams, each its own TLS connection — each checked against the pin
/// and each with its own token proof bound to its own channel — carries a tree and a file
/// large enough to be split into ranges over them, byte for byte; the server's `--once`
/// sees the one session's streams together.
#[test]
fn streams_and_ranges_go_encrypted_each_stream_its_own_tls() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let mut sources = tree(src.path());
    // Over the range threshold and over a stream's share: split into ranges.
    let big = src.path().join("big");
    make_file(&big, (72 << 20) + 4097, 99);
    sources.push(file(&big, "big"));
    let id = Arc::new(Identity::generate().unwrap());
    let fp = id.fingerprint();
    let server = Server::start(dst.path(), RecvSecurity::Tls(id), Some(b"tok"), true);
    let opts = tls_opts(Expect::Pinned(fp), Some(b"tok"));
    let r = zcnet_transfer::streams::send_streams(
        &connect_to(server.addr),
        3,
        sources,
        &opts,
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(r.streams, 3, "every stream joined: {:?}", r.refused);
    assert_eq!(r.report.failures(), 0, "{:?}", r.report.files);
    let big_out = r.report.files.iter().find(|f| f.name == "big").unwrap();
    assert!(big_out.verified);
    assert_eq!(r.report.trust, Some(Trust::Pinned(fp)));
    // The ranges went over more than one stream: each carried data.
    assert!(
        r.stats.iter().all(|s| s.tx_bytes_copy > 1 << 20),
        "{:?}",
        r.stats.iter().map(|s| s.tx_bytes_copy).collect::<Vec<_>>()
    );
    let outcome = server.handle.join().unwrap().unwrap().unwrap();
    assert_eq!(outcome.failures(), 0);
    std::fs::remove_dir(src.path().join("empty")).unwrap();
    std::fs::remove_dir(dst.path().join("empty")).unwrap();
    same_tree(src.path(), dst.path());
}

/// Streams that find the receiver's key in the known hosts: the first records it, the joins
/// find it recorded.
#[test]
fn streams_with_known_hosts_record_once_and_join_as_known() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let sources = tree(src.path());
    let id = Arc::new(Identity::generate().unwrap());
    let fp = id.fingerprint();
    let server = Server::start(dst.path(), RecvSecurity::Tls(id), None, true);
    let known = state.path().join("known_hosts");
    let expect = Expect::KnownHosts {
        file: known.clone(),
        host: server.addr.to_string(),
    };
    let r = zcnet_transfer::streams::send_streams(
        &connect_to(server.addr),
        2,
        sources,
        &tls_opts(expect, None),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!((r.streams, r.report.failures()), (2, 0));
    assert_eq!(r.report.trust, Some(Trust::FirstUse(fp)));
    let lines = std::fs::read_to_string(&known).unwrap();
    assert_eq!(lines.lines().count(), 1, "recorded once: {lines}");
    server.handle.join().unwrap().unwrap().unwrap();
}

/// `--resume` inside TLS: the receiver offers its partial file's prefix hash through the
/// channel, the sender checks it and sends only the tail; a foreign prefix starts over.
#[test]
fn resume_goes_encrypted_and_sends_only_the_tail() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let f = src.path().join("r");
    make_file(&f, 3 << 20, 9);
    let whole = std::fs::read(&f).unwrap();
    let mut so = StoreOptions::default();
    so.resume = true;
    let owner = Store::open(dst.path(), so).unwrap().owner().to_string();
    let seeded = dst.path().join(format!("r.{owner}.0000beef.partial"));
    for (prefix, sent) in [
        (whole[..1 << 20].to_vec(), 2u64 << 20),
        (vec![0xEE; 1 << 20], 3 << 20),
    ] {
        let _ = std::fs::remove_file(dst.path().join("r"));
        std::fs::write(&seeded, &prefix).unwrap();
        let id = Arc::new(Identity::generate().unwrap());
        let fp = id.fingerprint();
        let listener =
            zcnet::stream::Listener::bind("127.0.0.1:0".parse().unwrap(), &rcfg()).unwrap();
        let addr = listener.local_addr().unwrap();
        let d = dst.path().to_path_buf();
        let rx = std::thread::spawn(move || {
            let mut rx = listener.accept().unwrap();
            let mut store = Store::open(&d, so).unwrap();
            let mut o = RecvOptions::default();
            o.security = RecvSecurity::Tls(id);
            receive_session(&mut rx, &mut store, &o, &mut |_| {})
        });
        let r = send_to(
            addr,
            vec![file(&f, "r")],
            &tls_opts(Expect::Pinned(fp), None),
        )
        .unwrap();
        rx.join().unwrap().unwrap();
        assert_eq!(r.files[0].bytes, sent, "bytes that crossed the wire");
        assert!(r.files[0].verified);
        assert!(std::fs::read(dst.path().join("r")).unwrap() == whole);
    }
}

/// `--resume` through the server inside TLS with a token: the sender proves the token the
/// partial file was started under (inside TLS, bound to the channel), so it is offered the
/// prefix hash (issue 40's rule: a prefix only for a sender that proves it owns it) and
/// sends only the tail.
#[test]
fn the_tokens_holder_resumes_through_the_server_inside_tls() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let f = src.path().join("mine");
    make_file(&f, 3 << 20, 11);
    let whole = std::fs::read(&f).unwrap();
    let token = b"the holder's token".to_vec();
    let holder = SenderId {
        address: Some("127.0.0.1".parse().unwrap()),
        token: Some(token.clone()),
    };
    let owner = Store::open_for(dst.path(), StoreOptions::default(), None, &holder)
        .unwrap()
        .owner()
        .to_string();
    std::fs::write(
        dst.path().join(format!("mine.{owner}.0000beef.partial")),
        &whole[..1 << 20],
    )
    .unwrap();
    let id = Arc::new(Identity::generate().unwrap());
    let fp = id.fingerprint();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut cfg = ServerConfig::default();
    cfg.security = RecvSecurity::Tls(id);
    cfg.once = true;
    cfg.token = Some(token.clone());
    cfg.store.resume = true;
    cfg.idle_timeout = Duration::from_secs(20);
    let d = dst.path().to_path_buf();
    let server = std::thread::spawn(move || {
        let stop = AtomicBool::new(false);
        serve(listener, &d, cfg, &stop, Arc::new(Log::default())).unwrap()
    });
    let r = send_to(
        addr,
        vec![file(&f, "mine")],
        &tls_opts(Expect::Pinned(fp), Some(&token)),
    )
    .unwrap();
    server.join().unwrap().unwrap().unwrap();
    assert_eq!(r.files[0].result, Ok(()));
    assert!(r.files[0].verified);
    assert_eq!(r.files[0].bytes, 2 << 20, "only the tail crossed the wire");
    assert!(std::fs::read(dst.path().join("mine")).unwrap() == whole);
}

/// A sparse file inside TLS: version 10 carries version 9's sparse digest, so the file is
/// verified by its extents (both ends agree on the digest through the TLS channel), its
/// holes are neither sent nor written, and it arrives byte for byte.
#[cfg_attr(
    not(zcnet_has_holes),
    ignore = "needs a temp directory that keeps holes (TMPDIR on ext4, xfs, btrfs, tmpfs...)"
)]
#[test]
fn a_sparse_file_goes_encrypted_verified_by_its_extents() {
    const MIB: u64 = 1 << 20;
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let path = src.path().join("sparse.img");
    let f = std::fs::File::create(&path).unwrap();
    f.write_all_at(pattern(1, MIB as usize), 8 * MIB).unwrap();
    f.write_all_at(pattern(2, (3 * MIB / 2) as usize), 30 * MIB)
        .unwrap();
    f.set_len(64 * MIB).unwrap();
    drop(f);
    let allocated = std::fs::metadata(&path).unwrap().blocks() * 512;
    assert!(
        allocated <= 8 * MIB,
        "{} keeps no holes, though the build found the temp directory does",
        src.path().display()
    );
    let id = Arc::new(Identity::generate().unwrap());
    let fp = id.fingerprint();
    let server = Server::start(dst.path(), RecvSecurity::Tls(id), Some(b"tok"), false);
    let r = send_to(
        server.addr,
        vec![file(&path, "sparse.img")],
        &tls_opts(Expect::Pinned(fp), Some(b"tok")),
    )
    .unwrap();
    server.stop();
    assert_eq!(r.files[0].result, Ok(()));
    assert!(r.files[0].verified);
    let got = dst.path().join("sparse.img");
    assert_eq!(std::fs::metadata(&got).unwrap().len(), 64 * MIB);
    assert!(std::fs::read(&got).unwrap() == std::fs::read(&path).unwrap());
    let blocks = std::fs::metadata(&got).unwrap().blocks() * 512;
    assert!(
        blocks <= allocated + MIB,
        "the received file has {blocks} bytes allocated, the sent one {allocated}"
    );
}

/// What a proxy does to the bytes going one way: given the offset of a chunk in its
/// direction and the chunk, changes it in place (or replaces it).
type Mangle = Box<dyn FnMut(u64, Vec<u8>) -> Vec<u8> + Send>;

/// A forwarding proxy on loopback for one connection: sender → `up` → receiver, receiver
/// → `down` → sender.
fn proxy(target: SocketAddr, up: Mangle, down: Mangle) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let (a, _) = l.accept().unwrap();
        let b = TcpStream::connect(target).unwrap();
        let pump = |mut from: TcpStream, mut to: TcpStream, mut f: Mangle| {
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 16 << 10];
                let mut at = 0u64;
                loop {
                    let n = match from.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    let out = f(at, buf[..n].to_vec());
                    at += n as u64;
                    if std::io::Write::write_all(&mut to, &out).is_err() {
                        break;
                    }
                }
                let _ = to.shutdown(std::net::Shutdown::Write);
                let _ = from.shutdown(std::net::Shutdown::Read);
            })
        };
        let up_t = pump(a.try_clone().unwrap(), b.try_clone().unwrap(), up);
        let down_t = pump(b, a, down);
        let _ = up_t.join();
        let _ = down_t.join();
    });
    addr
}

fn pass() -> Mangle {
    Box::new(|_, v| v)
}

/// Flips one byte at offset `at` of its direction (past the TLS handshake: in file data).
fn flip_at(at: u64) -> Mangle {
    Box::new(move |off, mut v| {
        if (off..off + v.len() as u64).contains(&at) {
            v[(at - off) as usize] ^= 0x20;
        }
        v
    })
}

/// One byte of the file's data flipped on the way: the receiver's record check fails, it
/// tells the sender (an alert) and stops; both ends fail saying so, and nothing is under
/// the final name — with a token, and with a pinned key alone.
#[test]
fn a_flipped_data_byte_fails_both_ends_and_leaves_no_final_file() {
    for token in [Some(&b"tok"[..]), None] {
        let src = tempfile::tempdir().unwrap();
        let dst = tempfile::tempdir().unwrap();
        make_file(&src.path().join("big"), 3 << 20, 5);
        let id = Arc::new(Identity::generate().unwrap());
        let fp = id.fingerprint();
        let server = Server::start(dst.path(), RecvSecurity::Tls(id), token, true);
        let via = proxy(server.addr, flip_at(1 << 20), pass());
        let e = send_to(
            via,
            vec![file(&src.path().join("big"), "big")],
            &tls_opts(Expect::Pinned(fp), token),
        )
        .unwrap_err();
        let said = e.to_string();
        assert!(
            said.contains("bad_record_mac")
                || said.contains("BadRecordMac")
                || said.contains("detected tampering"),
            "the sender is told: {said}"
        );
        let ended = server.handle.join().unwrap().unwrap().unwrap_err();
        assert!(
            ended.to_string().contains("failed its integrity check"),
            "the receiver: {ended}"
        );
        assert!(!dst.path().join("big").exists(), "no final file");
        eprintln!("token {token:?}: the sender: {said}\nthe receiver: {ended}");
    }
}

/// A relay that rewrites the receiver's first bytes into a plaintext receiver's `Hello`
/// (version 9, the last before TLS: an older one), or drops them, cannot make an
/// encrypting sender send in the clear: it stops, and the receiver gets nothing.
#[test]
fn a_relay_that_strips_or_downgrades_the_preamble_is_refused() {
    let src = tempfile::tempdir().unwrap();
    make_file(&src.path().join("f"), 100_000, 5);
    let older_hello = Frame::Hello {
        version: 9,
        auth: false,
        nonce: [7; 32],
    }
    .to_bytes();
    let preamble_len = zcnet_transfer::wire::tls_preamble().len() as u64;
    let rewrites: Vec<(&str, Mangle)> = vec![
        (
            "downgraded",
            Box::new(move |off, v| match off {
                0 => {
                    let mut out = older_hello.clone();
                    out.extend_from_slice(&v[preamble_len as usize..]);
                    out
                }
                _ => v,
            }),
        ),
        (
            "stripped",
            Box::new(move |off, v| match off {
                0 => v[preamble_len as usize..].to_vec(),
                _ => v,
            }),
        ),
    ];
    for (what, down) in rewrites {
        let dst = tempfile::tempdir().unwrap();
        let id = Arc::new(Identity::generate().unwrap());
        let fp = id.fingerprint();
        let server = Server::start(dst.path(), RecvSecurity::Tls(id), None, false);
        let via = proxy(server.addr, pass(), down);
        let e = send_to(
            via,
            vec![file(&src.path().join("f"), "f")],
            &tls_opts(Expect::Pinned(fp), None),
        )
        .unwrap_err();
        if what == "downgraded" {
            assert!(matches!(e, TransferError::NotEncrypted(_)), "{what}: {e}");
        }
        server.stop();
        assert_eq!(
            std::fs::read_dir(dst.path()).unwrap().count(),
            0,
            "{what}: {e}"
        );
    }
}

/// After each connection's TLS handshake the kernel is offered the records (kTLS); where it
/// does not take them (here: no `tls` module) the fallback is counted once per connection,
/// at both ends, with the kernel's reason.
#[test]
fn the_ktls_attempt_is_counted_once_per_stream_with_its_reason() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let sources = tree(src.path());
    let id = Arc::new(Identity::generate().unwrap());
    let fp = id.fingerprint();
    let server = Server::start(dst.path(), RecvSecurity::Tls(id), None, true);
    let r = zcnet_transfer::streams::send_streams(
        &connect_to(server.addr),
        2,
        sources,
        &tls_opts(Expect::Pinned(fp), None),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(r.streams, 2);
    let ktls = |s: &zcnet::StatsSnapshot| {
        s.fallbacks
            .iter()
            .filter(|f| f.0 == zcnet::FallbackReason::KtlsUnavailable)
            .map(|f| f.1)
            .sum::<u64>()
    };
    for s in &r.stats {
        assert_eq!(ktls(s), 1, "once per stream: {:?}", s.fallbacks);
    }
    assert_eq!(ktls(&r.total_stats()), 2);
    let why = r.report.ktls.clone().expect("a reason");
    let available =
        std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp").unwrap_or_default();
    if !available.split_whitespace().any(|u| u == "tls") {
        assert!(why.contains("kTLS unavailable"), "{why}");
    }
    eprintln!("the sender's reason: {why}");
    let report = server.handle.join().unwrap().unwrap().unwrap();
    assert!(report.ktls.is_some(), "the receiver's reason");
    // Plaintext: no attempt, nothing counted.
    let dst = tempfile::tempdir().unwrap();
    let server = Server::start(dst.path(), RecvSecurity::Plaintext, None, true);
    let r = zcnet_transfer::streams::send_streams(
        &connect_to(server.addr),
        1,
        vec![file(&src.path().join("d0/f0"), "f0")],
        &SendOptions::default(),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(ktls(&r.total_stats()), 0);
    assert!(r.report.ktls.is_none());
    server.handle.join().unwrap().unwrap().unwrap();
}
