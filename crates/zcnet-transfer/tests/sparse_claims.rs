//! A sparse claim costs the receiver what was sent, not what was claimed: a peer that
//! announces a file of 64 MiB, then one of the largest size the receiver takes (its free
//! space, here tens of GiB; a terabyte where there is one), and sends three one-byte
//! extents with `StartSparse` makes the receiver read back about the same few bytes either
//! way — the
//! holes are never read, zeroed or hashed (version 9: the `Trailer` carries the sparse
//! digest of `docs/transfer-protocol.md`, over the extent list and the extents' bytes). A
//! sender that chooses an older version, whose hash covers the holes as zeros, cannot make
//! the receiver hash more holes than its budget (64 × the data it sent, plus 64 MiB a
//! session): past it the session ends as a protocol error before the holes are read.
//!
//! The count is this process's `rchar` (`/proc/self/io`: every byte any of its threads
//! passed to `read`/`pread`), so the tests run one at a time ([`serial`]); the CPU-seconds
//! are printed for the record, never asserted. Raw frames through [`Frame`], over loopback,
//! against a `--once` receiver ([`serve_once`]).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::time::Duration;
use zcnet_transfer::server::ServerConfig;
use zcnet_transfer::session::{SessionReport, TransferError};
use zcnet_transfer::wire::{Code, Frame, VERSION};

mod common;
use common::{once_cfg, serve_once};

const MIB: u64 = 1 << 20;
/// A bound on what the receiver may read for three bytes of data, far below any claim.
const FEW: u64 = 4 << 20;

/// The largest claim the receiver takes in `dir`: it refuses a file larger than the free
/// space (holes or not), so half of what is free now, at most a terabyte.
fn largest_claim(dir: &std::path::Path) -> u64 {
    let st = rustix::fs::statvfs(dir).unwrap();
    (st.f_bavail * st.f_frsize / 2).min(1 << 40)
}

/// One test at a time: they count the process's reads.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Bytes this process has passed to `read`/`pread` so far (`rchar`, proc(5)).
fn rchar() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap();
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// User + system CPU-seconds of this process (`/proc/self/stat`, clock ticks of 1/100 s).
fn cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of the line; `after` starts at field 3.
    (f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()) as f64 / 100.0
}

fn read_frame(s: &mut TcpStream) -> Option<Frame> {
    let mut h = [0u8; 5];
    s.read_exact(&mut h).ok()?;
    let (ty, len) = Frame::check_header(h).ok()?;
    let mut p = vec![0; len];
    s.read_exact(&mut p).ok()?;
    Frame::decode(ty, &p).ok()
}

/// A raw sender at `version` past its handshake (no token, one stream).
fn connect(to: SocketAddr, version: u16) -> TcpStream {
    let mut s = TcpStream::connect(to).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.set_nodelay(true).unwrap();
    assert!(matches!(read_frame(&mut s), Some(Frame::Hello { .. })));
    let mut bytes = Frame::Hello {
        version,
        auth: false,
        nonce: [9; 32],
    }
    .to_bytes();
    if version >= 5 {
        bytes.extend(Frame::Open { streams: 1 }.to_bytes());
    }
    s.write_all(&bytes).unwrap();
    if version >= 5 {
        assert!(matches!(read_frame(&mut s), Some(Frame::Session { .. })));
    }
    s
}

/// The version-9 sparse digest as `docs/transfer-protocol.md` defines it, written out here
/// from the document (not taken from the crate): BLAKE3 in key-derivation mode with the
/// context below, over size, offset, the prefix's BLAKE3, the extent count, the extents,
/// then the extents' bytes in order.
fn sparse_digest(size: u64, extents: &[(u64, u64)], data: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key("zcnet transfer protocol v9 sparse file digest");
    h.update(&size.to_be_bytes());
    h.update(&0u64.to_be_bytes());
    h.update(blake3::hash(b"").as_bytes());
    h.update(&(extents.len() as u32).to_be_bytes());
    for &(o, l) in extents {
        h.update(&o.to_be_bytes());
        h.update(&l.to_be_bytes());
    }
    h.update(data);
    *h.finalize().as_bytes()
}

/// Three one-byte extents of a `size`-byte file: its first byte, one in the middle, its
/// last; and their bytes.
fn claim(size: u64) -> (Vec<(u64, u64)>, Vec<u8>) {
    (vec![(0, 1), (size / 2, 1), (size - 1, 1)], b"zcn".to_vec())
}

/// What one claim cost the receiver: bytes read, CPU-seconds, and the session's end.
struct Cost {
    read: u64,
    cpu: f64,
    session: Option<Result<SessionReport, TransferError>>,
    answer: Option<Frame>,
}

/// A session at `version` whose one file `name` claims `size` bytes sparse, sent as
/// [`claim`] with the version-9 digest in its trailer.
fn sparse_claim(dir: &std::path::Path, version: u16, name: &str, size: u64) -> Cost {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut cfg: ServerConfig = once_cfg();
    cfg.idle_timeout = Duration::from_secs(60);
    // A hang guard only: a receiver that hashes the holes is cut (and its session
    // abandoned) rather than left to run for an hour.
    cfg.session_deadline = Duration::from_secs(30);
    let (read0, cpu0) = (rchar(), cpu_s());
    let server = serve_once(listener, dir, cfg);
    let mut s = connect(addr, version);
    s.write_all(
        &Frame::File {
            name: name.into(),
            size,
            mode: 0o644,
            mtime_s: 1_700_000_000,
            mtime_ns: 0,
            verify: true,
        }
        .to_bytes(),
    )
    .unwrap();
    match read_frame(&mut s) {
        Some(Frame::Ready { offset: 0, .. }) => {}
        other => panic!("no Ready for {name}: {other:?}"),
    }
    let (extents, data) = claim(size);
    let mut bytes = Frame::StartSparse {
        offset: 0,
        extents: extents.clone(),
    }
    .to_bytes();
    bytes.extend(&data);
    bytes.extend(
        Frame::Trailer {
            hash: Some(sparse_digest(size, &extents, &data)),
        }
        .to_bytes(),
    );
    // A receiver that ends the session on `StartSparse` may reset the connection
    // before the rest is written.
    let _ = s.write_all(&bytes);
    let answer = read_frame(&mut s);
    let _ = s.write_all(&Frame::Bye.to_bytes());
    let _ = read_frame(&mut s);
    drop(s);
    let session = server.join().unwrap();
    Cost {
        read: rchar() - read0,
        cpu: cpu_s() - cpu0,
        session,
        answer,
    }
}

#[cfg_attr(
    not(zcnet_has_holes),
    ignore = "needs a temp directory that keeps holes (TMPDIR on ext4, xfs, btrfs, tmpfs...)"
)]
#[test]
fn a_sparse_claim_costs_the_extents_sent_not_the_size_claimed() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut read = Vec::new();
    let large = largest_claim(dir.path());
    for (name, size) in [("small.img", 64 * MIB), ("large.img", large)] {
        let c = sparse_claim(dir.path(), VERSION, name, size);
        println!(
            "{name}: claimed {size} bytes, 3 sent: receiver read {} bytes, {:.2} CPU-s",
            c.read, c.cpu
        );
        // A bound for the first claim before the second: without it the large claim would
        // run for minutes.
        assert!(
            c.read < FEW,
            "{name}: the receiver read {} bytes for a claim of {size} with 3 bytes of data",
            c.read
        );
        match c.answer {
            Some(Frame::Ack { code: Code::Ok, .. }) => {}
            other => panic!("{name}: {other:?}"),
        }
        let report = c.session.expect("the one session").expect("its report");
        assert_eq!(report.files.len(), 1);
        assert_eq!(report.files[0].result, Ok(()), "{name}");
        assert!(report.files[0].verified, "{name}");
        // Every byte sent is there, at its offset; the rest are holes (nothing allocated
        // for them) of the claimed length.
        let f = std::fs::File::open(dir.path().join(name)).unwrap();
        let m = f.metadata().unwrap();
        assert_eq!(m.len(), size, "{name}");
        let (extents, data) = claim(size);
        for (&(o, _), &b) in extents.iter().zip(&data) {
            let mut got = [0u8];
            f.read_exact_at(&mut got, o).unwrap();
            assert_eq!(got[0], b, "{name}: byte {o}");
        }
        assert!(m.blocks() * 512 < 64 << 20, "{name}: {} blocks", m.blocks());
        read.push(c.read);
    }
    // The same three extents, a claim hundreds of times larger: the same work.
    println!(
        "claims of {} and {large} bytes ({}x): {} and {} bytes read",
        64 * MIB,
        large / (64 * MIB),
        read[0],
        read[1]
    );
    assert!(
        read[1] < 2 * read[0] + MIB,
        "64 MiB claim: {} bytes read; {large}-byte claim: {} bytes read",
        read[0],
        read[1]
    );
}

#[test]
fn an_older_sender_cannot_make_the_receiver_hash_holes_beyond_its_budget() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    // Version 8 hashes the whole file, holes as zeros: tens of GiB of holes for 3 bytes
    // are past the budget, so the session ends before a hole is read.
    let size = largest_claim(dir.path());
    let c = sparse_claim(dir.path(), 8, "old.img", size);
    println!(
        "version 8, {size} bytes claimed, 3 sent: receiver read {} bytes, {:.2} CPU-s, session {:?}",
        c.read,
        c.cpu,
        c.session.as_ref().map(|r| r.as_ref().map(|_| "ok"))
    );
    assert!(c.read < FEW, "the receiver read {} bytes", c.read);
    let err = match c.session {
        Some(Err(e)) => e.to_string(),
        other => panic!("the session should end as a protocol error: {other:?}"),
    };
    assert!(err.contains("holes"), "{err}");
    assert!(
        !dir.path().join("old.img").exists(),
        "nothing final for a refused claim"
    );
}
