//! One session over several connections (protocol version 5's `Open`/`Join`), end to end
//! through the exposed receiver (`server::serve`, as `zcnet recv` runs it): a tree with
//! nested directories, empty files, an empty directory, a symlink and a file too large for
//! a `Put` arrives with every file's BLAKE3, mode and mtime over 1 and 4 streams, on
//! loopback and between two network namespaces at MTU 1500 and 9000; `--max-bytes` holds for
//! the streams of a session together; a `Join` naming no open session is refused with the
//! reason and creates nothing.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;
use zcnet_testbed::netns::{available, VethPair};
use zcnet_testbed::pattern::pattern;
use zcnet_transfer::server::{serve, Quiet, ServerConfig};
use zcnet_transfer::session::TransferError;
use zcnet_transfer::streams::StreamsReport;
use zcnet_transfer::wire::{Code, Frame, VERSION};

mod common;
use common::{once_cfg, send_as, serve_once};

/// A tree under `root/tree`: `n` files in three levels of directories (every 13th empty,
/// sizes up to 9000), one 3 MiB file and every 10th a file of 300 KB or more (`File`s, sent
/// by `sendfile` and, from version 7, several unanswered at once on a stream), an empty
/// directory and a symlink inside the tree. Each file has its own mode and mtime.
fn make_tree(root: &Path, n: usize) -> PathBuf {
    let top = root.join("tree");
    for i in 0..n {
        let (name, len) = match i {
            _ if i == n / 2 => ("big/large.bin".to_string(), (3 << 20) + 4097),
            _ if i % 10 == 7 => (format!("d{}/large{i:04}", i % 3), 300_000 + i * 1001),
            _ if i % 13 == 0 => (format!("d{}/e{}/empty{i:04}", i % 3, i % 4), 0),
            _ => (
                format!("d{}/e{}/f{}/file{i:04}", i % 3, i % 4, i % 2),
                (i * 7919) % 9001,
            ),
        };
        let p = top.join(&name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        File::create(&p)
            .unwrap()
            .write_all(pattern(i as u64 * 131 + 7, len))
            .unwrap();
        std::fs::set_permissions(
            &p,
            std::fs::Permissions::from_mode(0o600 + (i as u32 % 8) * 8),
        )
        .unwrap();
        let t = std::time::UNIX_EPOCH + Duration::new(1_600_000_000 + i as u64, i as u32 * 1001);
        File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }
    std::fs::create_dir_all(top.join("nothing/here")).unwrap();
    std::fs::set_permissions(
        top.join("nothing/here"),
        std::fs::Permissions::from_mode(0o750),
    )
    .unwrap();
    std::os::unix::fs::symlink("../big/large.bin", top.join("d0/to-large")).unwrap();
    top
}

fn hash(path: &Path) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    std::io::copy(&mut File::open(path).unwrap(), &mut h).unwrap();
    *h.finalize().as_bytes()
}

/// Every entry under `src` is at the same place under `dst` with the same kind; files with
/// the same BLAKE3, permission bits and mtime; links with the same target; directories'
/// permission bits for the empty one. Returns the number of regular files compared.
fn assert_same_tree(src: &Path, dst: &Path) -> usize {
    let mut files = 0;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(src.join(&rel)).unwrap() {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            let (a, b) = (src.join(&r), dst.join(&r));
            let ma = std::fs::symlink_metadata(&a).unwrap();
            let mb = std::fs::symlink_metadata(&b)
                .unwrap_or_else(|e| panic!("{} did not arrive: {e}", r.display()));
            assert_eq!(ma.file_type(), mb.file_type(), "{}", r.display());
            if ma.is_dir() {
                stack.push(r);
            } else if ma.file_type().is_symlink() {
                assert_eq!(
                    std::fs::read_link(&a).unwrap(),
                    std::fs::read_link(&b).unwrap()
                );
            } else {
                assert_eq!(ma.len(), mb.len(), "{}", r.display());
                assert_eq!(hash(&a), hash(&b), "{}", r.display());
                assert_eq!(ma.mode() & 0o777, mb.mode() & 0o777, "{}", r.display());
                assert_eq!(
                    (ma.mtime(), ma.mtime_nsec()),
                    (mb.mtime(), mb.mtime_nsec()),
                    "{}",
                    r.display()
                );
                files += 1;
            }
        }
    }
    assert_eq!(
        std::fs::metadata(dst.join("nothing/here")).unwrap().mode() & 0o777,
        0o750
    );
    files
}

/// Names under `dir` ending in `.partial` (none may be left by a finished session).
fn partials(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() && !p.is_symlink() {
                stack.push(p);
            } else if p.to_string_lossy().ends_with(".partial") {
                out.push(p);
            }
        }
    }
    out
}

fn send(to: SocketAddr, src: &Path, streams: usize) -> Result<StreamsReport, TransferError> {
    send_as(to, src, streams, VERSION)
}

/// The whole round trip on loopback: what the sender and the receiver report, and the tree.
fn loopback(streams: usize) {
    loopback_joined(streams, streams)
}

/// As [`loopback`], `asked` streams asked for and `joined` expected to carry the files.
fn loopback_joined(asked: usize, streams: usize) {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let top = make_tree(src.path(), 150);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = serve_once(listener, dst.path(), once_cfg());
    let sent = send(addr, &top, asked).unwrap();
    assert_eq!(sent.streams, streams, "{:?}", sent.refused);
    assert_eq!(sent.refused.len(), usize::from(asked > streams));
    assert_eq!(
        sent.stats.len(),
        streams,
        "every stream connected and ended"
    );
    assert_eq!(sent.report.failures(), 0, "{:?}", sent.report.files);
    let got = server.join().unwrap().expect("once: a result").unwrap();
    // `--once` waited for every stream and returns them as one session: 150 files, the
    // empty directory and the symlink.
    assert_eq!(got.files.len(), 152);
    assert_eq!(sent.report.files.len(), 152);
    assert_eq!(got.failures(), 0);
    assert_eq!(got.bytes(), sent.report.bytes());
    let files = assert_same_tree(&top, &dst.path().join("tree"));
    assert_eq!(files, 150);
    assert!(partials(dst.path()).is_empty());
}

#[test]
fn a_tree_arrives_whole_over_one_stream() {
    loopback(1);
}

#[test]
fn a_tree_arrives_whole_over_four_streams_as_one_session() {
    loopback(4);
}

#[test]
fn sixteen_streams_asked_four_joined_within_the_default_limit_per_address() {
    // 4 connections and 8 handshakes at once per address by default: every join counts as a
    // connection of the address, so three join and the fourth is refused; the sender then
    // carries every file on the four it has.
    loopback_joined(16, 4);
}

#[test]
fn a_session_below_version_5_carries_the_whole_tree_on_one_connection() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let top = make_tree(src.path(), 40);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = serve_once(listener, dst.path(), once_cfg());
    // Four asked for, version 4 spoken: no `Open`, so one stream carries everything.
    let sent = send_as(addr, &top, 4, 4).unwrap();
    assert_eq!(sent.streams, 1);
    assert_eq!(sent.stats.len(), 1);
    assert_eq!(sent.report.failures(), 0, "{:?}", sent.report.files);
    let got = server.join().unwrap().unwrap().unwrap();
    assert_eq!(got.files.len(), 42);
    assert_eq!(assert_same_tree(&top, &dst.path().join("tree")), 40);
}

#[test]
fn the_byte_cap_holds_for_the_streams_of_a_session_together() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let top = src.path().join("capped");
    std::fs::create_dir(&top).unwrap();
    // Eight files of 400 KiB (over the `Put` size, so each reserves its length when it
    // starts), four streams, a cap of 1 MiB: at most two fit, whichever streams carry them.
    for i in 0..8u64 {
        File::create(top.join(format!("f{i}")))
            .unwrap()
            .write_all(pattern(i, 400 << 10))
            .unwrap();
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut cfg = once_cfg();
    cfg.store.max_bytes = Some(1 << 20);
    let server = serve_once(listener, dst.path(), cfg);
    let sent = send(addr, &top, 4).unwrap();
    assert_eq!(sent.streams, 4);
    let got = server.join().unwrap().unwrap().unwrap();
    assert_eq!(got.files.len(), 8);
    let ok: Vec<_> = sent
        .report
        .files
        .iter()
        .filter(|f| f.result.is_ok())
        .collect();
    assert!(
        !ok.is_empty() && ok.len() <= 2,
        "{} files fit a 1 MiB cap",
        ok.len()
    );
    for f in &sent.report.files {
        if let Err((code, msg)) = &f.result {
            assert_eq!(*code, Code::TooLarge, "{}: {msg}", f.name);
        }
    }
    // What arrived is whole and verified; nothing else is there under a final name.
    let mut on_disk = 0;
    for i in 0..8u64 {
        let p = dst.path().join(format!("capped/f{i}"));
        if p.exists() {
            assert_eq!(hash(&p), hash(&top.join(format!("f{i}"))));
            on_disk += 1;
        }
    }
    assert_eq!(on_disk, ok.len());
    assert!(partials(dst.path()).is_empty());
}

fn read_frame(s: &mut TcpStream) -> Option<Frame> {
    let mut h = [0u8; 5];
    s.read_exact(&mut h).ok()?;
    let (ty, len) = Frame::check_header(h).ok()?;
    let mut p = vec![0; len];
    s.read_exact(&mut p).ok()?;
    Frame::decode(ty, &p).ok()
}

#[test]
fn a_join_naming_no_open_session_is_refused_and_creates_nothing() {
    let dst = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let d = dst.path().to_path_buf();
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let server = std::thread::spawn(move || {
        let mut cfg = ServerConfig::default();
        cfg.idle_timeout = Duration::from_secs(20);
        serve(listener, &d, cfg, &s2, Arc::new(Quiet)).unwrap()
    });
    let join = |session: [u8; 16]| -> (Option<Frame>, Option<Frame>) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        assert!(matches!(read_frame(&mut s), Some(Frame::Hello { .. })));
        let mut b = Frame::Hello {
            version: VERSION,
            auth: false,
            nonce: [2; 32],
        }
        .to_bytes();
        b.extend(Frame::Join { session }.to_bytes());
        // A file behind it, which must not be read as one.
        b.extend(
            Frame::Put {
                name: "planted".into(),
                size: 3,
                mode: 0o644,
                mtime_s: 0,
                mtime_ns: 0,
                verify: false,
            }
            .to_bytes(),
        );
        b.extend(b"abc");
        b.extend(Frame::Trailer { hash: None }.to_bytes());
        s.write_all(&b).unwrap();
        (read_frame(&mut s), read_frame(&mut s))
    };
    // An id never handed out.
    let (answer, after) = join([0x5a; 16]);
    match answer {
        Some(Frame::Refuse { code, message }) => {
            assert_eq!(code, Code::NoSession);
            assert!(message.contains("no session"), "{message}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(after, None, "the connection is closed after the refusal");
    // An id of a session of one stream (no place left to join) is refused the same way.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    assert!(matches!(read_frame(&mut s), Some(Frame::Hello { .. })));
    let mut b = Frame::Hello {
        version: VERSION,
        auth: false,
        nonce: [3; 32],
    }
    .to_bytes();
    b.extend(Frame::Open { streams: 1 }.to_bytes());
    s.write_all(&b).unwrap();
    let Some(Frame::Session { id }) = read_frame(&mut s) else {
        panic!("an Open is answered with the session id")
    };
    let (answer, _) = join(id);
    assert!(
        matches!(
            answer,
            Some(Frame::Refuse {
                code: Code::NoSession,
                ..
            })
        ),
        "{answer:?}"
    );
    s.write_all(&Frame::Bye.to_bytes()).unwrap();
    assert_eq!(read_frame(&mut s), Some(Frame::Bye));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    server.join().unwrap();
    assert_eq!(
        std::fs::read_dir(dst.path()).unwrap().count(),
        0,
        "nothing was created"
    );
}

/// Between two namespaces over a veth pair of the given MTU, over `streams` streams.
fn between_namespaces(mtu: u32, streams: usize) {
    // Its callers are ignored without `zcnet_netns`: the build found root and `ip`.
    if let Err(why) = available() {
        panic!("network namespaces unavailable, though the build found root and `ip`: {why}");
    }
    let pair = VethPair::create(mtu).unwrap();
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let top = make_tree(src.path(), 60);
    let b = pair.addr_b();
    let listener = pair
        .run_in_b(|| TcpListener::bind((b, 0)).unwrap())
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let server = serve_once(listener, dst.path(), once_cfg());
    let sent = pair
        .run_in_a(|| send(addr, &top, streams))
        .unwrap()
        .unwrap();
    assert_eq!(sent.streams, streams);
    assert_eq!(sent.report.failures(), 0, "{:?}", sent.report.files);
    let got = server.join().unwrap().unwrap().unwrap();
    assert_eq!(got.files.len(), 62);
    assert_eq!(assert_same_tree(&top, &dst.path().join("tree")), 60);
    assert!(partials(dst.path()).is_empty());
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn four_streams_between_namespaces_at_mtu_1500() {
    between_namespaces(1500, 4);
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn four_streams_between_namespaces_at_mtu_9000() {
    between_namespaces(9000, 4);
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn one_stream_between_namespaces_at_mtu_1500() {
    between_namespaces(1500, 1);
}
