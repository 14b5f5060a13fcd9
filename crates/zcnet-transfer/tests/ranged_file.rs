//! One large file split into ranges over the streams of one session (protocol version 6),
//! end to end through the exposed receiver (`server::serve`, as `zcnet recv` runs it): a
//! 72 MiB file (not a power of two, so its ranges are unequal and the last chunk short)
//! arrives byte for byte — its BLAKE3 compared with the source's, every byte compared with
//! the pattern — over 1, 2 and 4 streams on loopback and over 4 streams between two network
//! namespaces at MTU 1500 and 9000, next to small files spread by file; a peer that lies
//! about a range's hash gets the file refused and leaves neither a final nor a partial file;
//! a range that is not a node of the file's BLAKE3 tree is refused; a sparse file goes whole
//! and stays sparse; a version-5 session sends the file whole.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;
use zcnet::{Sender, SenderConfig, TxPath};
use zcnet_testbed::netns::{available, VethPair};
use zcnet_testbed::pattern::{pattern, Verifier};
use zcnet_transfer::server::{serve, Quiet, ServerConfig};
use zcnet_transfer::session::{SendOptions, SessionReport, TransferError};
use zcnet_transfer::streams::{send_streams, StreamsReport};
use zcnet_transfer::tree::Walk;
use zcnet_transfer::wire::{Code, Frame, VERSION};

mod common;
use common::{once_cfg, send_as, serve_once};

/// 72 MiB and a bit: above the split threshold, not a power of two of chunks.
const BIG: u64 = (72 << 20) + 4097;

fn write_pattern(p: &Path, seed: u64, len: u64) {
    let mut f = File::create(p).unwrap();
    let mut at = 0;
    while at < len {
        let n = (len - at).min(4 << 20);
        f.write_all(pattern(seed + at, n as usize)).unwrap();
        at += n;
    }
}

/// Every byte of `p` is the pattern from `seed` on, and there are `len` of them.
fn check_pattern(p: &Path, seed: u64, len: u64) {
    let mut f = File::open(p).unwrap();
    let mut v = Verifier { pos: seed };
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        v.check(&buf[..n]);
    }
    assert_eq!(v.pos - seed, len, "{}", p.display());
}

fn hash(path: &Path) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    std::io::copy(&mut File::open(path).unwrap(), &mut h).unwrap();
    *h.finalize().as_bytes()
}

/// Names under `dir` ending in `.partial`.
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

/// `root/tree`: the big file and six small ones.
fn make_tree(root: &Path) -> PathBuf {
    let top = root.join("tree");
    std::fs::create_dir_all(top.join("small")).unwrap();
    write_pattern(&top.join("big.bin"), 11, BIG);
    for i in 0..6u64 {
        write_pattern(
            &top.join(format!("small/f{i}")),
            i * 1000,
            300_000 + i * 777,
        );
    }
    top
}

fn check_tree(src: &Path, dst: &Path) {
    check_pattern(&dst.join("big.bin"), 11, BIG);
    assert_eq!(hash(&src.join("big.bin")), hash(&dst.join("big.bin")));
    for i in 0..6u64 {
        check_pattern(
            &dst.join(format!("small/f{i}")),
            i * 1000,
            300_000 + i * 777,
        );
    }
}

/// Streams that carried at least 8 MiB of file data by `sendfile`.
fn busy_streams(sent: &StreamsReport) -> usize {
    sent.stats
        .iter()
        .filter(|s| s.tx_bytes_file + s.tx_bytes_copy >= 8 << 20)
        .count()
}

fn round_trip(run: impl FnOnce() -> StreamsReport, dst: &Path, top: &Path) {
    let sent = run();
    assert_eq!(sent.report.failures(), 0, "{:?}", sent.report.files);
    // One outcome per file, the big one with all its bytes, verified.
    assert_eq!(sent.report.files.len(), 7, "{:?}", sent.report.files);
    let big = sent
        .report
        .files
        .iter()
        .find(|f| f.name == "tree/big.bin")
        .unwrap();
    assert_eq!(big.bytes, BIG);
    assert!(big.verified);
    check_tree(top, &dst.join("tree"));
    assert!(partials(dst).is_empty());
    if sent.streams > 1 {
        // The big file itself went over more than one stream.
        assert!(busy_streams(&sent) >= 2, "{:?}", sent.stats);
    }
}

fn loopback(streams: usize) {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let top = make_tree(src.path());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = serve_once(listener, dst.path(), once_cfg());
    round_trip(
        || {
            let s = send_as(addr, &top, streams, VERSION).unwrap();
            assert_eq!(s.streams, streams);
            s
        },
        dst.path(),
        &top,
    );
    let got = server.join().unwrap().unwrap().unwrap();
    assert_eq!(got.failures(), 0);
    assert_eq!(got.files.len(), 7, "the receiver reports the big file once");
}

#[test]
fn a_large_file_arrives_whole_over_one_stream() {
    loopback(1);
}

#[test]
fn a_large_file_arrives_whole_in_ranges_over_two_streams() {
    loopback(2);
}

#[test]
fn a_large_file_arrives_whole_in_ranges_over_four_streams() {
    loopback(4);
}

fn between_namespaces(mtu: u32) {
    // Its callers are ignored without `zcnet_netns`: the build found root and `ip`.
    if let Err(why) = available() {
        panic!("network namespaces unavailable, though the build found root and `ip`: {why}");
    }
    let pair = VethPair::create(mtu).unwrap();
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let top = make_tree(src.path());
    let b = pair.addr_b();
    let listener = pair
        .run_in_b(|| TcpListener::bind((b, 0)).unwrap())
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let server = serve_once(listener, dst.path(), once_cfg());
    round_trip(
        || {
            pair.run_in_a(|| send_as(addr, &top, 4, VERSION))
                .unwrap()
                .unwrap()
        },
        dst.path(),
        &top,
    );
    let got = server.join().unwrap().unwrap().unwrap();
    assert_eq!(got.failures(), 0);
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn a_large_file_in_ranges_over_four_streams_between_namespaces_at_mtu_1500() {
    between_namespaces(1500);
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn a_large_file_in_ranges_over_four_streams_between_namespaces_at_mtu_9000() {
    between_namespaces(9000);
}

#[test]
fn a_version_5_session_sends_the_large_file_whole() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let top = make_tree(src.path());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = serve_once(listener, dst.path(), once_cfg());
    let sent = send_as(addr, &top, 4, 5).unwrap();
    assert_eq!(sent.streams, 4);
    assert_eq!(sent.report.failures(), 0, "{:?}", sent.report.files);
    // Whole: one stream moved all of it.
    assert!(sent.stats.iter().any(|s| s.tx_bytes_file >= BIG));
    server.join().unwrap().unwrap().unwrap();
    check_tree(&top, &dst.path().join("tree"));
}

#[test]
fn a_sparse_large_file_goes_whole_and_stays_sparse() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let top = src.path().join("sp");
    std::fs::create_dir(&top).unwrap();
    let p = top.join("holes.bin");
    // 80 MiB with 4 MiB of data at 0 and 4 MiB at 60 MiB; the rest holes.
    let f = File::create(&p).unwrap();
    f.set_len(80 << 20).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(pattern(1, 4 << 20), 0).unwrap();
    f.write_all_at(pattern(2, 4 << 20), 60 << 20).unwrap();
    drop(f);
    let sparse_here = std::fs::metadata(&p).unwrap().blocks() * 512 < 80 << 20;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = serve_once(listener, dst.path(), once_cfg());
    let sent = send_as(addr, &top, 4, VERSION).unwrap();
    assert_eq!(sent.report.failures(), 0, "{:?}", sent.report.files);
    server.join().unwrap().unwrap().unwrap();
    let q = dst.path().join("sp/holes.bin");
    assert_eq!(hash(&p), hash(&q));
    let mut got = vec![0u8; 4 << 20];
    let g = File::open(&q).unwrap();
    g.read_exact_at(&mut got, 0).unwrap();
    assert!(got == pattern(1, 4 << 20));
    g.read_exact_at(&mut got, 60 << 20).unwrap();
    assert!(got == pattern(2, 4 << 20));
    g.read_exact_at(&mut got, 30 << 20).unwrap();
    assert!(got.iter().all(|&b| b == 0));
    if sparse_here {
        // Only the data crossed the wire, and the holes stayed holes.
        let moved: u64 = sent.stats.iter().map(|s| s.tx_bytes_file).sum();
        assert!(moved < 9 << 20, "{moved} bytes sent for 8 MiB of data");
        assert!(std::fs::metadata(&q).unwrap().blocks() * 512 < 40 << 20);
    } else {
        eprintln!("note: this file system made no holes in the source; sparseness not checked");
    }
}

// ---- a peer that lies -------------------------------------------------------------------

fn read_frame(s: &mut TcpStream) -> Option<Frame> {
    let mut h = [0u8; 5];
    s.read_exact(&mut h).ok()?;
    let (ty, len) = Frame::check_header(h).ok()?;
    let mut p = vec![0; len];
    s.read_exact(&mut p).ok()?;
    Frame::decode(ty, &p).ok()
}

/// A raw version-6 session: `Hello`, `Open{1}`, the receiver's `Session`.
fn raw_session(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    assert!(matches!(read_frame(&mut s), Some(Frame::Hello { .. })));
    let mut b = Frame::Hello {
        version: 6,
        auth: false,
        nonce: [4; 32],
    }
    .to_bytes();
    b.extend(Frame::Open { streams: 1 }.to_bytes());
    s.write_all(&b).unwrap();
    assert!(matches!(read_frame(&mut s), Some(Frame::Session { .. })));
    s
}

fn range(offset: u64, len: u64, size: u64) -> Frame {
    Frame::Range {
        name: "lied.bin".into(),
        size,
        mode: 0o644,
        mtime_s: 1_700_000_000,
        mtime_ns: 0,
        verify: true,
        offset,
        len,
    }
}

/// Sends one range of `data` with `cv` as its trailer; returns the `Ack`.
fn send_range(s: &mut TcpStream, data: &[u8], offset: u64, len: u64, cv: [u8; 32]) -> Frame {
    s.write_all(&range(offset, len, data.len() as u64).to_bytes())
        .unwrap();
    assert_eq!(
        read_frame(s),
        Some(Frame::Ready {
            offset,
            prefix: None
        })
    );
    s.write_all(&Frame::Start { offset }.to_bytes()).unwrap();
    s.write_all(&data[offset as usize..(offset + len) as usize])
        .unwrap();
    s.write_all(&Frame::Trailer { hash: Some(cv) }.to_bytes())
        .unwrap();
    read_frame(s).unwrap()
}

fn cv(data: &[u8], offset: u64, len: u64) -> [u8; 32] {
    use blake3::hazmat::HasherExt;
    let mut h = blake3::Hasher::new();
    h.set_input_offset(offset);
    h.update(&data[offset as usize..(offset + len) as usize]);
    h.finalize_non_root()
}

#[test]
fn a_range_whose_hash_lies_fails_the_file_and_leaves_nothing() {
    let dst = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = serve_once(listener, dst.path(), once_cfg());
    let mut s = raw_session(addr);
    // 3 MiB + 5: ranges 0+2Mi (left subtree) and 2Mi+1Mi+5 (right).
    let size = (3 << 20) + 5;
    let data = pattern(9, size as usize);
    let left = 2 << 20;
    // The first range is true.
    match send_range(&mut s, data, 0, left, cv(data, 0, left)) {
        Frame::Ack { code, .. } => assert_eq!(code, Code::Ok),
        other => panic!("{other:?}"),
    }
    // The second one's bytes are not what its hash says (one byte flipped in flight).
    let mut bad = data.to_vec();
    bad[(left + 1000) as usize] ^= 1;
    let rest = size - left;
    match send_range(&mut s, &bad, left, rest, cv(data, left, rest)) {
        Frame::Ack { code, message, .. } => {
            assert_eq!(code, Code::HashMismatch, "{message}")
        }
        other => panic!("{other:?}"),
    }
    // Nothing final, nothing partial: the file failed.
    assert!(!dst.path().join("lied.bin").exists());
    assert!(partials(dst.path()).is_empty());
    // A range that is not a node of the tree (crossing the left subtree's end) is refused
    // before any data.
    s.write_all(&range(1 << 20, 2 << 20, size).to_bytes())
        .unwrap();
    match read_frame(&mut s) {
        Some(Frame::Refuse { code, .. }) => assert_eq!(code, Code::Protocol),
        other => panic!("{other:?}"),
    }
    // Nor is a node shorter than 1 MiB that is not the file's last (a peer chopping a file
    // into chunks to make the receiver keep a claim per KiB).
    s.write_all(&range(0, 1024, size).to_bytes()).unwrap();
    match read_frame(&mut s) {
        Some(Frame::Refuse { code, .. }) => assert_eq!(code, Code::Protocol),
        other => panic!("{other:?}"),
    }
    s.write_all(&Frame::Bye.to_bytes()).unwrap();
    assert_eq!(read_frame(&mut s), Some(Frame::Bye));
    let got = server.join().unwrap().unwrap().unwrap();
    assert_eq!(got.failures(), 3);
    assert!(!dst.path().join("lied.bin").exists());
    assert!(partials(dst.path()).is_empty());
}

#[test]
fn ranges_told_truly_over_a_raw_session_make_the_file() {
    // The same raw peer, honest and with the ranges out of order: the file is final after
    // the last, and only then.
    let dst = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = serve_once(listener, dst.path(), once_cfg());
    let mut s = raw_session(addr);
    let size = (3 << 20) + 5;
    let data = pattern(9, size as usize);
    let left = 2 << 20;
    let rest = size - left;
    match send_range(&mut s, data, left, rest, cv(data, left, rest)) {
        Frame::Ack { code, .. } => assert_eq!(code, Code::Ok),
        other => panic!("{other:?}"),
    }
    assert!(!dst.path().join("lied.bin").exists(), "not final yet");
    // Split the left subtree further: two 1 MiB nodes.
    for off in [1 << 20, 0] {
        match send_range(&mut s, data, off, 1 << 20, cv(data, off, 1 << 20)) {
            Frame::Ack { code, bytes, .. } => {
                assert_eq!(code, Code::Ok);
                if off == 0 {
                    assert_eq!(bytes, size, "the last range's ack: the file is final");
                }
            }
            other => panic!("{other:?}"),
        }
    }
    s.write_all(&Frame::Bye.to_bytes()).unwrap();
    assert_eq!(read_frame(&mut s), Some(Frame::Bye));
    let got = server.join().unwrap().unwrap().unwrap();
    assert_eq!(got.failures(), 0);
    assert_eq!(got.files.len(), 1);
    check_pattern(&dst.path().join("lied.bin"), 9, size);
    assert!(partials(dst.path()).is_empty());
}

// ---- resume ------------------------------------------------------------------------------

/// The token of the resume tests: what a ranged partial file recorded is offered only to a
/// sender that proves the token it was started under (an address proves nothing).
const TOKEN: &[u8] = b"ranged resume";

fn serve_once_resuming(
    listener: TcpListener,
    dir: &Path,
    token: Option<&[u8]>,
) -> std::thread::JoinHandle<Option<Result<SessionReport, TransferError>>> {
    let d = dir.to_path_buf();
    let token = token.map(<[u8]>::to_vec);
    std::thread::spawn(move || {
        let mut cfg = ServerConfig::default();
        cfg.once = true;
        cfg.idle_timeout = Duration::from_secs(20);
        cfg.store.resume = true;
        cfg.token = token;
        let stop = AtomicBool::new(false);
        serve(listener, &d, cfg, &stop, Arc::new(Quiet)).unwrap()
    })
}

/// Files under `dir` whose name ends in `suffix`.
fn ending(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect()
}

/// Cuts a transfer of the big file over `streams` streams once `cut` bytes were sent,
/// reruns it with `--resume`, checks every byte, and returns the bytes sent again.
fn cut_and_resume(streams: usize, cut: u64) -> u64 {
    use std::sync::Mutex;
    use zcnet_transfer::session::Progress;
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let top = src.path().join("r");
    std::fs::create_dir(&top).unwrap();
    write_pattern(&top.join("big.bin"), 5, BIG);
    let mut o = SendOptions::default();
    o.verify = true;
    o.token = Some(TOKEN.to_vec());

    // First run: every connection is cut once 40 MiB have been sent.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = serve_once_resuming(listener, dst.path(), Some(TOKEN));
    let socks: Mutex<Vec<TcpStream>> = Mutex::new(Vec::new());
    let connect = || -> Result<Sender, TransferError> {
        let mut c = SenderConfig::new(TxPath::Copy);
        c.timeout = Some(Duration::from_secs(20));
        let tx = Sender::connect(addr, &c)?;
        let dup = tx.socket().try_clone_to_owned().unwrap();
        socks.lock().unwrap().push(TcpStream::from(dup));
        Ok(tx)
    };
    let mut sent = 0u64;
    let mut w = Walk::new();
    w.add(&top).unwrap();
    let first = send_streams(&connect, streams, w.sources, &o, &mut |p| {
        if let Progress::Bytes(n) = p {
            sent += n;
            if sent >= cut {
                for s in socks.lock().unwrap().iter() {
                    let _ = s.shutdown(std::net::Shutdown::Both);
                }
            }
        }
    });
    assert!(
        first.as_ref().map_or(true, |r| r.report.failures() > 0),
        "the cut transfer did not complete"
    );
    let _ = server.join().unwrap();
    let there = dst.path().join("r");
    assert!(
        !there.join("big.bin").exists(),
        "nothing final after the cut"
    );
    assert_eq!(ending(&there, ".partial").len(), 1);
    assert_eq!(
        ending(&there, ".ranges").len(),
        1,
        "the record of landed ranges"
    );

    // Rerun with --resume: only what was not recorded is sent again.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = serve_once_resuming(listener, dst.path(), Some(TOKEN));
    let connect = || -> Result<Sender, TransferError> {
        let mut c = SenderConfig::new(TxPath::Copy);
        c.timeout = Some(Duration::from_secs(20));
        Ok(Sender::connect(addr, &c)?)
    };
    let mut w = Walk::new();
    w.add(&top).unwrap();
    let again = send_streams(&connect, streams, w.sources, &o, &mut |_| {}).unwrap();
    assert_eq!(again.report.failures(), 0, "{:?}", again.report.files);
    server.join().unwrap().unwrap().unwrap();
    let resent: u64 = again.stats.iter().map(|s| s.tx_bytes_file).sum();
    assert_eq!(again.report.bytes(), resent);
    assert!(
        resent > 0 && resent < BIG - (8 << 20),
        "{resent} of {BIG} sent again"
    );
    eprintln!("resume sent {resent} of {BIG} bytes again");
    check_pattern(&there.join("big.bin"), 5, BIG);
    assert!(partials(dst.path()).is_empty());
    assert!(
        ending(&there, ".ranges").is_empty(),
        "the record goes with the partial"
    );
    resent
}

#[test]
fn an_interrupted_ranged_file_resumes_each_range_from_what_it_recorded() {
    // Eight ranges of about 9 MiB: the ranges that landed whole are recorded and skipped.
    cut_and_resume(4, 40 << 20);
}

#[test]
fn an_interrupted_range_resumes_from_inside_itself() {
    // Two streams: one carries the ranges of 32 and 8 MiB, the other both of 16 MiB. Cut
    // at 56 MiB (about 28 each), the 32 MiB range has been recorded at 16 MiB
    // (`ranges::JOURNAL_STEP`) while it landed and the first 16 MiB range whole, so the
    // rerun sends at most 72 - 32 MiB; without the record inside the range it would be 56.
    let resent = cut_and_resume(2, 56 << 20);
    assert!(resent <= BIG - (32 << 20), "{resent}");
}

#[test]
fn a_session_ending_before_a_ranges_data_leaves_nothing() {
    let dst = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = serve_once_resuming(listener, dst.path(), None);
    let mut s = raw_session(addr);
    let size = (3 << 20) + 5;
    s.write_all(&range(0, 2 << 20, size).to_bytes()).unwrap();
    assert_eq!(
        read_frame(&mut s),
        Some(Frame::Ready {
            offset: 0,
            prefix: None
        })
    );
    // The partial file and its record exist now; the sender goes away.
    assert_eq!(ending(dst.path(), ".ranges").len(), 1);
    drop(s);
    assert!(server.join().unwrap().unwrap().is_err());
    assert!(partials(dst.path()).is_empty());
    assert!(ending(dst.path(), ".ranges").is_empty());
    assert!(!dst.path().join("lied.bin").exists());
}
