//! A stress run against an exposed receiver, shared by `tests/peer_limits.rs` (a few
//! seconds) and `examples/hold_fds.rs` (the full run, with the receiver in a process of its
//! own): sessions from several loopback addresses start files by ranges as fast as they are
//! answered and finish none, while a legitimate sender from another address sends a file
//! over two streams; the file must arrive byte-exact.

#![allow(dead_code)] // each user takes what it needs

use blake3::hazmat::HasherExt;
use socket2::{Domain, SockAddr, Socket, Type};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcnet::{Sender, SenderConfig, TxPath};
use zcnet_testbed::pattern::pattern;
use zcnet_transfer::session::{SendOptions, Source, TransferError};
use zcnet_transfer::streams::{send_streams, StreamsReport};
use zcnet_transfer::wire::{Code, Frame, VERSION};

/// A TCP connection to `to` from the loopback address `from` (any of 127/8).
pub fn connect_from(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    s.bind(&SockAddr::from(SocketAddr::new(from, 0)))?;
    s.connect(&SockAddr::from(to))?;
    let t: TcpStream = s.into();
    t.set_read_timeout(Some(Duration::from_secs(20)))?;
    t.set_nodelay(true)?;
    Ok(t)
}

fn read_frame(s: &mut TcpStream) -> Option<Frame> {
    let mut h = [0u8; 5];
    s.read_exact(&mut h).ok()?;
    let (ty, len) = Frame::check_header(h).ok()?;
    let mut p = vec![0; len];
    s.read_exact(&mut p).ok()?;
    Frame::decode(ty, &p).ok()
}

/// What the attackers did.
#[derive(Debug, Default)]
pub struct Attack {
    /// Sessions that got in.
    pub sessions: AtomicU64,
    /// Connections refused (at the handshake or at their limits).
    pub refused_sessions: AtomicU64,
    /// Files started by ranges and left unfinished.
    pub started: AtomicU64,
    /// Ranges refused (the caps on descriptors).
    pub refused_files: AtomicU64,
}

/// One attacker: until `stop`, opens a session from `from` and starts files by ranges
/// (2 KiB files, their last KiB sent and checked, the first never), as fast as they are
/// answered; a session that is refused a file keeps trying (holding what it has), one
/// that is cut or refused opens anew.
pub fn attacker(from: IpAddr, to: SocketAddr, stop: &AtomicBool, tag: &str, out: &Attack) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = connect_from(from, to) else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let mut bytes = match read_frame(&mut s) {
            Some(Frame::Hello { .. }) => Frame::Hello {
                version: VERSION,
                auth: false,
                nonce: [7; 32],
            }
            .to_bytes(),
            _ => {
                out.refused_sessions.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        bytes.extend(Frame::Open { streams: 1 }.to_bytes());
        if s.write_all(&bytes).is_err()
            || !matches!(read_frame(&mut s), Some(Frame::Session { .. }))
        {
            out.refused_sessions.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        out.sessions.fetch_add(1, Ordering::Relaxed);
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            match start_unfinished(&mut s, &format!("{tag}/f{n}")) {
                Some(Frame::Ack { code: Code::Ok, .. }) => {
                    out.started.fetch_add(1, Ordering::Relaxed);
                }
                Some(Frame::Refuse { .. }) | Some(Frame::Ack { .. }) => {
                    out.refused_files.fetch_add(1, Ordering::Relaxed);
                }
                _ => break,
            }
        }
    }
}

/// Starts a 2 KiB file `name` by ranges with its last range, whole and checked.
fn start_unfinished(s: &mut TcpStream, name: &str) -> Option<Frame> {
    let (size, offset, len) = (2048u64, 1024u64, 1024u64);
    s.write_all(
        &Frame::Range {
            name: name.into(),
            size,
            mode: 0o644,
            mtime_s: 0,
            mtime_ns: 0,
            verify: true,
            offset,
            len,
        }
        .to_bytes(),
    )
    .ok()?;
    match read_frame(s)? {
        Frame::Ready { .. } => {}
        f => return Some(f),
    }
    let data = pattern(offset, len as usize);
    let mut h = zcnet_transfer::ranges::range_hasher(offset);
    h.update(data);
    let mut bytes = Frame::Start { offset }.to_bytes();
    bytes.extend_from_slice(data);
    bytes.extend(
        Frame::Trailer {
            hash: Some(h.finalize_non_root()),
        }
        .to_bytes(),
    );
    s.write_all(&bytes).ok()?;
    read_frame(s)
}

/// Runs `per_addr` attackers from each of `addrs` until `stop`.
pub fn attack(
    addrs: &[IpAddr],
    per_addr: usize,
    to: SocketAddr,
    stop: Arc<AtomicBool>,
    out: Arc<Attack>,
) -> Vec<std::thread::JoinHandle<()>> {
    let mut threads = Vec::new();
    for (a, &from) in addrs.iter().enumerate() {
        for k in 0..per_addr {
            let (stop, out) = (stop.clone(), out.clone());
            threads.push(std::thread::spawn(move || {
                attacker(from, to, &stop, &format!("a{a}s{k}"), &out)
            }));
        }
    }
    threads
}

/// A file of `len` bytes of a pattern at `path`; its BLAKE3.
pub fn make_file(path: &Path, len: usize) -> [u8; 32] {
    let mut f = std::fs::File::create(path).unwrap();
    let mut h = blake3::Hasher::new();
    let mut pos = 0;
    while pos < len {
        let n = (len - pos).min(4 << 20);
        let d = pattern(pos as u64 * 3 + 1, n);
        f.write_all(d).unwrap();
        h.update(d);
        pos += n;
    }
    *h.finalize().as_bytes()
}

/// BLAKE3 of the file at `path`.
pub fn hash(path: &Path) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    std::io::copy(&mut std::fs::File::open(path).unwrap(), &mut h).unwrap();
    *h.finalize().as_bytes()
}

/// The legitimate sender: `path` as `name` over `streams` streams from `from`, verified;
/// retried (a refusal at a busy receiver is an answer, not a failure) until `patience`.
pub fn legit_send(
    from: IpAddr,
    to: SocketAddr,
    path: &Path,
    name: &str,
    streams: usize,
    patience: Duration,
) -> (Result<StreamsReport, TransferError>, u32, Duration) {
    let t0 = Instant::now();
    let mut tries = 0;
    loop {
        tries += 1;
        let connect = || -> Result<Sender, TransferError> {
            let mut c = SenderConfig::new(TxPath::Copy);
            c.timeout = Some(Duration::from_secs(30));
            let s = connect_from(from, to).map_err(|e| TransferError::Io {
                what: "connecting".into(),
                source: e,
            })?;
            Ok(Sender::from_stream(s, &c)?)
        };
        let mut o = SendOptions::default();
        o.verify = true;
        let r = send_streams(
            &connect,
            streams,
            vec![Source::File {
                path: path.to_path_buf(),
                name: name.into(),
            }],
            &o,
            &mut |_| {},
        );
        match r {
            Err(TransferError::Refused(_)) | Err(TransferError::Auth(_))
                if t0.elapsed() < patience =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            r => return (r, tries, t0.elapsed()),
        }
    }
}
