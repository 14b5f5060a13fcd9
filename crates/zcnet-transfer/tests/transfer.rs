//! The file-transfer sessions end to end over real sockets: many files round-trip (loopback
//! and two namespaces), every unsafe name is refused, misbehaving peers leave no final file,
//! tokens, caps, overwrite, streams and resume behave as specified.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;
use zcnet::stream::Listener;
use zcnet::{ReceiverConfig, RxPath, SenderConfig, TxPath};
use zcnet_testbed::pattern::pattern;
use zcnet_testbed::topo::{veth_pair, Topo};
use zcnet_transfer::handshake::HandshakeError;
use zcnet_transfer::session::{
    receive_session, send_session, RecvOptions, SendOptions, SessionReport, Source, TransferError,
};
use zcnet_transfer::store::{Store, StoreOptions};
use zcnet_transfer::wire::{Code, Frame};

fn rcfg() -> ReceiverConfig {
    let mut c = ReceiverConfig::new(RxPath::Copy);
    c.timeout = Some(Duration::from_secs(20));
    c
}

fn scfg() -> SenderConfig {
    let mut c = SenderConfig::new(TxPath::Copy);
    c.timeout = Some(Duration::from_secs(20));
    c
}

/// Writes `len` pattern bytes starting at pattern offset `seed` into `path`.
fn make_file(path: &Path, len: u64, seed: u64) {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).unwrap();
    }
    let mut f = File::create(path).unwrap();
    let mut pos = 0;
    while pos < len {
        let n = (len - pos).min(4 << 20) as usize;
        f.write_all(pattern(seed + pos, n)).unwrap();
        pos += n as u64;
    }
}

fn hash(path: &Path) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    std::io::copy(&mut File::open(path).unwrap(), &mut h).unwrap();
    *h.finalize().as_bytes()
}

/// A receiver serving one session into `dir`; returns its address and join handle.
struct Served {
    addr: SocketAddr,
    handle: std::thread::JoinHandle<Result<SessionReport, TransferError>>,
}

fn serve(topo: Topo<'_>, dir: &Path, sopts: StoreOptions, ropts: RecvOptions) -> Served {
    let listener = topo
        .on_receiver(|| Listener::bind(topo.receiver_addr(0), &rcfg()))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let dir = dir.to_path_buf();
    let handle = std::thread::spawn(move || {
        let l: Listener = listener;
        let mut rx = l.accept().unwrap();
        let mut store = Store::open(&dir, sopts).unwrap();
        receive_session(&mut rx, &mut store, &ropts, &mut |_| {})
    });
    Served { addr, handle }
}

fn send(
    topo: Topo<'_>,
    addr: SocketAddr,
    sources: Vec<Source>,
    opts: &SendOptions,
) -> Result<SessionReport, TransferError> {
    let mut tx = topo
        .on_sender(|| zcnet::Sender::connect(topo.receiver_addr(addr.port()), &scfg()))
        .unwrap();
    send_session(&mut tx, sources, opts, &mut |_| {})
}

fn verify_opts() -> SendOptions {
    let mut o = SendOptions::default();
    o.verify = true;
    o
}

fn file_src(path: &Path, name: &str) -> Source {
    Source::File {
        path: path.to_path_buf(),
        name: name.into(),
    }
}

/// Builds the standard set of files under `src` and returns (relative name, path) pairs.
fn standard_files(src: &Path, big: Option<u64>) -> Vec<(String, PathBuf)> {
    let mut sizes: Vec<(&str, u64)> = vec![
        ("empty", 0),
        ("one", 1),
        ("page-1", 4095),
        ("odd", 65_537),
        ("ten-meg-plus", (10 << 20) + 7),
        ("tree/a/b/c.txt", 12_345),
        ("tree/a/d.bin", 1 << 20),
        ("tree/e", 3),
    ];
    if let Some(n) = big {
        sizes.push(("big", n));
    }
    sizes
        .into_iter()
        .enumerate()
        .map(|(i, (name, len))| {
            let p = src.join(name);
            make_file(&p, len, i as u64 * 1000 + 17);
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640 + (i as u32 % 2)))
                .unwrap();
            (name.to_string(), p)
        })
        .collect()
}

fn round_trip(topo: Topo<'_>, big: Option<u64>) {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let files = standard_files(src.path(), big);
    let served = serve(
        topo,
        dst.path(),
        StoreOptions::default(),
        RecvOptions::default(),
    );
    let sources = files.iter().map(|(n, p)| file_src(p, n)).collect();
    let sent = send(topo, served.addr, sources, &verify_opts()).unwrap();
    let got = served.handle.join().unwrap().unwrap();
    assert_eq!(sent.failures(), 0, "{:?}", sent.files);
    assert_eq!(got.failures(), 0, "{:?}", got.files);
    assert_eq!(got.files.len(), files.len());
    for (name, path) in &files {
        let out = dst.path().join(name);
        assert_eq!(hash(&out), hash(path), "{name}");
        let (a, b) = (
            std::fs::metadata(path).unwrap(),
            std::fs::metadata(&out).unwrap(),
        );
        assert_eq!(a.len(), b.len(), "{name}");
        assert_eq!(a.mode() & 0o7777, b.mode() & 0o7777, "{name} mode");
        assert_eq!(
            (a.mtime(), a.mtime_nsec()),
            (b.mtime(), b.mtime_nsec()),
            "{name} mtime"
        );
    }
    assert_eq!(partials(dst.path()), Vec::<PathBuf>::new());
}

/// Every partial file under `dir`.
fn partials(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if std::fs::symlink_metadata(&p).unwrap().is_dir() {
            out.extend(partials(&p));
        } else if p.to_string_lossy().ends_with(".partial") {
            out.push(p);
        }
    }
    out
}

#[test]
fn many_files_and_a_gib_round_trip_over_loopback() {
    round_trip(Topo::Loopback, Some(1 << 30));
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn many_files_round_trip_between_namespaces() {
    for mtu in [1500, 9000] {
        let pair = veth_pair(mtu);
        round_trip(Topo::Netns(&pair), (mtu == 9000).then_some(1 << 30));
    }
}

// ---- a hand-driven peer ------------------------------------------------------------------

struct RawPeer {
    s: TcpStream,
}

impl RawPeer {
    fn connect(addr: SocketAddr) -> RawPeer {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        RawPeer { s }
    }
    fn send(&mut self, f: &Frame) {
        self.s.write_all(&f.to_bytes()).unwrap();
    }
    fn recv(&mut self) -> Frame {
        let mut h = [0u8; 5];
        self.s.read_exact(&mut h).unwrap();
        let (ty, len) = Frame::check_header(h).unwrap();
        let mut p = vec![0; len];
        self.s.read_exact(&mut p).unwrap();
        Frame::decode(ty, &p).unwrap()
    }
    fn hello(&mut self) {
        assert!(matches!(self.recv(), Frame::Hello { .. }));
        self.send(&Frame::Hello {
            version: 4, // files right after the Hello: no `Open` (version 5)
            auth: false,
            nonce: [0; 32],
        });
    }
    fn file(&mut self, name: &str, size: u64) {
        self.send(&Frame::File {
            name: name.into(),
            size,
            mode: 0o644,
            mtime_s: 0,
            mtime_ns: 0,
            verify: true,
        });
    }
}

fn lo() -> Topo<'static> {
    Topo::Loopback
}

#[test]
fn every_unsafe_name_is_refused_and_nothing_leaves_the_directory() {
    let dst = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    symlink(outside.path(), dst.path().join("link")).unwrap();
    let served = serve(
        lo(),
        dst.path(),
        StoreOptions::default(),
        RecvOptions::default(),
    );
    let mut p = RawPeer::connect(served.addr);
    p.hello();
    let long = "n".repeat(300);
    let deep = "d/".repeat(2100) + "f";
    for name in [
        "../evil",
        "/etc/evil",
        "a/../../evil",
        "a\0b",
        long.as_str(),
        deep.as_str(),
        "link/evil",
        "./x",
        "a//b",
        "x.partial",
        "",
    ] {
        p.file(name, 1);
        match p.recv() {
            Frame::Refuse { code, message } => {
                assert_eq!(code, Code::UnsafeName, "{name:?}: {message}");
                assert!(!message.is_empty());
            }
            other => panic!("{name:?} was not refused: {other:?}"),
        }
    }
    // The session goes on: a good file after the bad ones still arrives.
    p.file("good", 3);
    assert!(matches!(p.recv(), Frame::Ready { offset: 0, .. }));
    p.send(&Frame::Start { offset: 0 });
    p.s.write_all(b"abc").unwrap();
    p.send(&Frame::Trailer {
        hash: Some(*blake3::hash(b"abc").as_bytes()),
    });
    assert!(matches!(
        p.recv(),
        Frame::Ack {
            code: Code::Ok,
            bytes: 3,
            ..
        }
    ));
    p.send(&Frame::Bye);
    assert_eq!(p.recv(), Frame::Bye);
    let report = served.handle.join().unwrap().unwrap();
    assert_eq!(report.failures(), 11);
    assert_eq!(std::fs::read(dst.path().join("good")).unwrap(), b"abc");
    assert!(
        std::fs::read_dir(outside.path()).unwrap().next().is_none(),
        "nothing written outside"
    );
    let names: Vec<_> = std::fs::read_dir(dst.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "only link and good: {names:?}");
}

fn no_final_file(dir: &Path, name: &str) {
    assert!(
        !dir.join(name).exists(),
        "{name} must not exist with its final name"
    );
}

#[test]
fn garbage_instead_of_a_hello_is_a_clear_error() {
    let dst = tempfile::tempdir().unwrap();
    let served = serve(
        lo(),
        dst.path(),
        StoreOptions::default(),
        RecvOptions::default(),
    );
    let mut p = RawPeer::connect(served.addr);
    assert!(matches!(p.recv(), Frame::Hello { .. }));
    p.s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let err = served.handle.join().unwrap().unwrap_err();
    assert!(matches!(err, TransferError::Handshake(_)), "{err}");
}

#[test]
fn a_hostile_frame_length_is_refused_without_allocating() {
    let dst = tempfile::tempdir().unwrap();
    let served = serve(
        lo(),
        dst.path(),
        StoreOptions::default(),
        RecvOptions::default(),
    );
    let mut p = RawPeer::connect(served.addr);
    p.hello();
    p.s.write_all(&[3, 0xff, 0xff, 0xff, 0xff]).unwrap();
    let err = served.handle.join().unwrap().unwrap_err();
    assert!(err.to_string().contains("exceeds the limit"), "{err}");
}

#[test]
fn short_data_then_close_leaves_only_the_partial_file() {
    let dst = tempfile::tempdir().unwrap();
    let served = serve(
        lo(),
        dst.path(),
        StoreOptions::default(),
        RecvOptions::default(),
    );
    let mut p = RawPeer::connect(served.addr);
    p.hello();
    p.file("f", 100);
    assert!(matches!(p.recv(), Frame::Ready { .. }));
    p.send(&Frame::Start { offset: 0 });
    p.s.write_all(&[7u8; 50]).unwrap();
    drop(p);
    let err = served.handle.join().unwrap().unwrap_err();
    match err {
        TransferError::Truncated { expected, got, .. } => assert_eq!((expected, got), (100, 50)),
        other => panic!("unexpected {other}"),
    }
    no_final_file(dst.path(), "f");
    let left = partials(dst.path());
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(std::fs::read(&left[0]).unwrap(), vec![7u8; 50]);
    // Only the bytes that arrived stay allocated, not the announced size.
    assert!(std::fs::metadata(&left[0]).unwrap().blocks() <= 16);
}

#[test]
fn a_wrong_hash_leaves_no_file_and_says_so_to_both_sides() {
    let dst = tempfile::tempdir().unwrap();
    let served = serve(
        lo(),
        dst.path(),
        StoreOptions::default(),
        RecvOptions::default(),
    );
    let mut p = RawPeer::connect(served.addr);
    p.hello();
    p.file("f", 4);
    assert!(matches!(p.recv(), Frame::Ready { .. }));
    p.send(&Frame::Start { offset: 0 });
    p.s.write_all(b"abcd").unwrap();
    p.send(&Frame::Trailer {
        hash: Some(*blake3::hash(b"abce").as_bytes()),
    });
    match p.recv() {
        Frame::Ack { code, message, .. } => {
            assert_eq!(code, Code::HashMismatch);
            assert!(message.contains("hash"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    p.send(&Frame::Bye);
    assert_eq!(p.recv(), Frame::Bye);
    let r = served.handle.join().unwrap().unwrap();
    assert_eq!(
        r.files[0].result.as_ref().unwrap_err().0,
        Code::HashMismatch
    );
    no_final_file(dst.path(), "f");
    assert_eq!(partials(dst.path()), Vec::<PathBuf>::new());
}

#[test]
fn a_peer_closing_before_the_trailer_leaves_no_final_file() {
    let dst = tempfile::tempdir().unwrap();
    let served = serve(
        lo(),
        dst.path(),
        StoreOptions::default(),
        RecvOptions::default(),
    );
    let mut p = RawPeer::connect(served.addr);
    p.hello();
    p.file("f", 4);
    assert!(matches!(p.recv(), Frame::Ready { .. }));
    p.send(&Frame::Start { offset: 0 });
    p.s.write_all(b"abcd").unwrap();
    drop(p);
    let err = served.handle.join().unwrap().unwrap_err();
    assert!(err.to_string().contains("closed"), "{err}");
    no_final_file(dst.path(), "f");
}

#[test]
fn existing_files_caps_and_overwrite() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    make_file(&src.path().join("a"), 1000, 1);
    make_file(&src.path().join("b"), 5000, 2);
    std::fs::write(dst.path().join("a"), b"old").unwrap();
    let mut so = StoreOptions::default();
    so.max_bytes = Some(4000);
    let served = serve(lo(), dst.path(), so, RecvOptions::default());
    let r = send(
        lo(),
        served.addr,
        vec![
            file_src(&src.path().join("a"), "a"),
            file_src(&src.path().join("b"), "b"),
        ],
        &verify_opts(),
    )
    .unwrap();
    served.handle.join().unwrap().unwrap();
    assert_eq!(r.files[0].result.as_ref().unwrap_err().0, Code::Exists);
    assert_eq!(r.files[1].result.as_ref().unwrap_err().0, Code::TooLarge);
    assert_eq!(
        std::fs::read(dst.path().join("a")).unwrap(),
        b"old",
        "not overwritten"
    );
    no_final_file(dst.path(), "b");

    let mut so = StoreOptions::default();
    so.overwrite = true;
    let served = serve(lo(), dst.path(), so, RecvOptions::default());
    let r = send(
        lo(),
        served.addr,
        vec![file_src(&src.path().join("a"), "a")],
        &verify_opts(),
    )
    .unwrap();
    served.handle.join().unwrap().unwrap();
    assert_eq!(r.failures(), 0);
    assert_eq!(hash(&dst.path().join("a")), hash(&src.path().join("a")));
}

#[test]
fn tokens_are_checked_both_ways_and_never_sent() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    make_file(&src.path().join("a"), 100, 1);
    let token = b"correct horse".to_vec();
    let ropts = {
        let mut o = RecvOptions::default();
        o.token = Some(token.clone());
        o
    };
    // Right token.
    let served = serve(lo(), dst.path(), StoreOptions::default(), ropts.clone());
    let mut so = verify_opts();
    so.token = Some(token.clone());
    send(
        lo(),
        served.addr,
        vec![file_src(&src.path().join("a"), "a")],
        &so,
    )
    .unwrap();
    served.handle.join().unwrap().unwrap();
    assert_eq!(hash(&dst.path().join("a")), hash(&src.path().join("a")));
    // Wrong and missing tokens.
    for bad in [Some(b"wrong".to_vec()), None] {
        let served = serve(lo(), dst.path(), StoreOptions::default(), ropts.clone());
        let mut so = verify_opts();
        so.token = bad;
        let e = send(
            lo(),
            served.addr,
            vec![file_src(&src.path().join("a"), "b")],
            &so,
        )
        .unwrap_err();
        assert!(matches!(e, TransferError::Auth(_)), "{e}");
        let e = served.handle.join().unwrap().unwrap_err();
        assert!(
            matches!(
                e,
                TransferError::Handshake(HandshakeError::AuthFailed) | TransferError::Net(_)
            ),
            "{e}"
        );
        no_final_file(dst.path(), "b");
    }
    // A sender with a token refuses a receiver that does not ask for it (it cannot prove
    // it knows the token): nothing is sent.
    let served = serve(
        lo(),
        dst.path(),
        StoreOptions::default(),
        RecvOptions::default(),
    );
    let e = send(
        lo(),
        served.addr,
        vec![file_src(&src.path().join("a"), "c")],
        &so_with(token.clone()),
    )
    .unwrap_err();
    assert!(
        matches!(&e, TransferError::Auth(m) if m.contains("did not ask")),
        "{e}"
    );
    let _ = served.handle.join().unwrap();
    no_final_file(dst.path(), "c");
    assert_eq!(partials(dst.path()), Vec::<PathBuf>::new());
}

fn so_with(token: Vec<u8>) -> SendOptions {
    let mut so = verify_opts();
    so.token = Some(token);
    so
}

#[test]
fn a_stream_of_unknown_length_arrives_whole() {
    let dst = tempfile::tempdir().unwrap();
    let data: Vec<u8> = pattern(5, 3 << 20).to_vec();
    let served = serve(
        lo(),
        dst.path(),
        StoreOptions::default(),
        RecvOptions::default(),
    );
    let r = send(
        lo(),
        served.addr,
        vec![Source::Stream {
            reader: Box::new(std::io::Cursor::new(data.clone())),
            name: "from-stdin".into(),
        }],
        &verify_opts(),
    )
    .unwrap();
    served.handle.join().unwrap().unwrap();
    assert_eq!(r.failures(), 0);
    assert_eq!(std::fs::read(dst.path().join("from-stdin")).unwrap(), data);
}

#[test]
fn resume_sends_only_the_missing_tail_and_restarts_on_a_foreign_prefix() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let f = src.path().join("r");
    make_file(&f, 3 << 20, 9);
    let whole = std::fs::read(&f).unwrap();
    let owner = Store::open(dst.path(), StoreOptions::default())
        .unwrap()
        .owner()
        .to_string();
    let seeded = dst.path().join(format!("r.{owner}.0000beef.partial"));
    std::fs::write(&seeded, &whole[..1 << 20]).unwrap();
    let mut so = StoreOptions::default();
    so.resume = true;
    let served = serve(lo(), dst.path(), so, RecvOptions::default());
    let r = send(lo(), served.addr, vec![file_src(&f, "r")], &verify_opts()).unwrap();
    served.handle.join().unwrap().unwrap();
    assert_eq!(r.files[0].bytes, 2 << 20, "only the tail crossed the wire");
    assert_eq!(hash(&dst.path().join("r")), hash(&f));
    // A partial that is not a prefix of ours: start over, still correct.
    std::fs::remove_file(dst.path().join("r")).unwrap();
    std::fs::write(&seeded, vec![0xEEu8; 1 << 20]).unwrap();
    let served = serve(lo(), dst.path(), so, RecvOptions::default());
    let r = send(lo(), served.addr, vec![file_src(&f, "r")], &verify_opts()).unwrap();
    served.handle.join().unwrap().unwrap();
    assert_eq!(r.files[0].bytes, 3 << 20);
    assert_eq!(hash(&dst.path().join("r")), hash(&f));
}

/// Two senders of one name at once, into one directory, in each of the four modes (verify or
/// not × overwrite or not), many rounds: the final file is always one sender's whole file,
/// never a mix and never missing; without `--overwrite` exactly one is told Ok and the other
/// "exists"; a sender told Ok without overwrite is the one whose bytes are final; no partial
/// file is left behind.
#[test]
fn two_senders_of_one_name_never_mix_and_never_both_lose() {
    let src = tempfile::tempdir().unwrap();
    let (a, b) = (src.path().join("a"), src.path().join("b"));
    make_file(&a, 300_000, 1);
    make_file(&b, 300_000, 7_777);
    let (ha, hb) = (hash(&a), hash(&b));
    for verify in [true, false] {
        for overwrite in [false, true] {
            for round in 0..50 {
                let dst = tempfile::tempdir().unwrap();
                let mut so = StoreOptions::default();
                so.overwrite = overwrite;
                let s1 = serve(lo(), dst.path(), so, RecvOptions::default());
                let s2 = serve(lo(), dst.path(), so, RecvOptions::default());
                let mut opts = SendOptions::default();
                opts.verify = verify;
                let results: Vec<SessionReport> = std::thread::scope(|sc| {
                    let ta = sc.spawn(|| send(lo(), s1.addr, vec![file_src(&a, "same")], &opts));
                    let tb = sc.spawn(|| send(lo(), s2.addr, vec![file_src(&b, "same")], &opts));
                    vec![ta.join().unwrap().unwrap(), tb.join().unwrap().unwrap()]
                });
                s1.handle.join().unwrap().unwrap();
                s2.handle.join().unwrap().unwrap();
                let final_path = dst.path().join("same");
                let what = format!("verify={verify} overwrite={overwrite} round {round}");
                assert!(final_path.exists(), "{what}: both lost");
                let h = hash(&final_path);
                assert!(h == ha || h == hb, "{what}: a mixed final file");
                let ok: Vec<bool> = results.iter().map(|r| r.failures() == 0).collect();
                for r in &results {
                    assert_eq!(r.files[0].verified, verify && r.failures() == 0, "{what}");
                }
                if overwrite {
                    assert_eq!(ok, vec![true, true], "{what}: {results:?}");
                } else {
                    assert_eq!(ok.iter().filter(|o| **o).count(), 1, "{what}: {results:?}");
                    let loser = results.iter().find(|r| r.failures() == 1).unwrap();
                    assert_eq!(loser.files[0].result.as_ref().unwrap_err().0, Code::Exists);
                    assert_eq!(h, if ok[0] { ha } else { hb }, "{what}: the winner's bytes");
                }
                assert_eq!(partials(dst.path()), Vec::<PathBuf>::new(), "{what}");
            }
        }
    }
}

/// A file truncated while it is being sent: the sender fails with what happened and how far
/// it got, and the receiver keeps no final file.
#[test]
fn a_file_that_shrinks_mid_send_fails_clearly() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let f = src.path().join("shrinks");
    make_file(&f, 64 << 20, 3);
    let served = serve(
        lo(),
        dst.path(),
        StoreOptions::default(),
        RecvOptions::default(),
    );
    let mut tx = zcnet::Sender::connect(served.addr, &scfg()).unwrap();
    let path = f.clone();
    let e = send_session(
        &mut tx,
        vec![file_src(&f, "shrinks")],
        &verify_opts(),
        &mut |p| {
            if let zcnet_transfer::session::Progress::Start(..) = p {
                // After the size was announced, before the data flows.
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .unwrap()
                    .set_len(1 << 20)
                    .unwrap();
            }
        },
    )
    .unwrap_err();
    match &e {
        TransferError::Shrank { expected, got, .. } => {
            assert_eq!(*expected, 64 << 20);
            assert!(*got <= 1 << 20, "{e}");
        }
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("shrank"), "{e}");
    drop(tx);
    let _ = served.handle.join().unwrap();
    no_final_file(dst.path(), "shrinks");
}

/// A file appended to while it is being sent: the sender fails with both sizes rather than
/// send the announced prefix as if it were the file, and the receiver keeps no final file.
#[test]
fn a_file_that_grows_mid_send_fails_clearly() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let f = src.path().join("grows");
    make_file(&f, 4 << 20, 5);
    let served = serve(
        lo(),
        dst.path(),
        StoreOptions::default(),
        RecvOptions::default(),
    );
    let mut tx = zcnet::Sender::connect(served.addr, &scfg()).unwrap();
    let path = f.clone();
    let e = send_session(
        &mut tx,
        vec![file_src(&f, "grows")],
        &verify_opts(),
        &mut |p| {
            if let zcnet_transfer::session::Progress::Start(..) = p {
                // After the size was announced, before the data flows.
                use std::io::Write;
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .unwrap()
                    .write_all(&[7u8; 1 << 20])
                    .unwrap();
            }
        },
    )
    .unwrap_err();
    match &e {
        TransferError::Grew { expected, now, .. } => {
            assert_eq!(*expected, 4 << 20);
            assert_eq!(*now, 5 << 20);
        }
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("grew"), "{e}");
    drop(tx);
    let _ = served.handle.join().unwrap();
    no_final_file(dst.path(), "grows");
}
