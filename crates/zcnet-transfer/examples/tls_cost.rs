//! What encryption costs per GiB on the transfer's data path (issue 45): the same bytes over
//! loopback, plaintext and through the TLS channel, each end's thread CPU.
//!
//!     cargo run --release -p zcnet-transfer --example tls_cost -- [GIB=1] [ROUNDS=3]
//!     cargo run --release -p zcnet-transfer --example tls_cost -- steps [GIB=1] [PIECE_KIB=64]
//!
//! Ways, interleaved round by round (the median of ROUNDS printed):
//!
//! * `plain-loan`  — the bytes copied into zerocopy loan buffers and sent (`Sender::send`);
//!   the receiver reads them into a buffer.
//! * `plain-slice` — `send_slice` on the copy path (the kernel copies); same receiver.
//! * `tls-loan`    — [`SealedSender`] on the zerocopy path: records sealed into the loans;
//!   the receiver decrypts ([`Channel::recv_with`]) and drops the bytes.
//! * `tls-copy`    — [`SealedSender`] on the copy path (the loans sent by a copying send).
//!
//! The source is a 64 MiB buffer sent over and over (memory, like a file in the page
//! cache). The receiver checks nothing (the tests check every byte); it only reads.
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Instant;
use zcnet::{Sender, SenderConfig, TxPath};
use zcnet_transfer::tls::{Channel, Expect, Identity, SealedSender};

const SRC: usize = 64 << 20;
const PIECE: usize = 1 << 20;

fn cpu() -> f64 {
    zcnet_sys::raw::cpu::thread_cpu_ns() as f64 * 1e-9
}

#[derive(Clone, Copy, Debug)]
enum Way {
    PlainLoan,
    PlainSlice,
    TlsLoan,
    TlsCopy,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::PlainLoan => "plain-loan",
            Way::PlainSlice => "plain-slice",
            Way::TlsLoan => "tls-loan",
            Way::TlsCopy => "tls-copy",
        }
    }
}

/// (sender CPU s, receiver CPU s, wall s, the sender's paths) for `total` bytes.
fn run(way: Way, src: &[u8], total: u64, id: &std::sync::Arc<Identity>) -> (f64, f64, f64, String) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let tls = matches!(way, Way::TlsLoan | Way::TlsCopy);
    let fp = id.fingerprint();
    let id2 = id.clone();
    let rx = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        if tls {
            let mut ch = Channel::accept(s, &id2).unwrap();
            let t0 = cpu();
            let got = ch.recv_with(total, |_| Ok(())).unwrap();
            assert_eq!(got, total);
            let t = cpu() - t0;
            // Up to the sender's close_notify: closing with it unread would reset the
            // connection under the sender's last calls.
            assert_eq!(ch.read(&mut [0u8; 1]).unwrap(), 0);
            t
        } else {
            let mut s = s;
            let mut buf = vec![0u8; 256 << 10];
            let t0 = cpu();
            let mut got = 0u64;
            while got < total {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0);
                got += n as u64;
            }
            let t = cpu() - t0;
            assert_eq!(s.read(&mut buf).unwrap(), 0);
            t
        }
    });
    let stream = TcpStream::connect(addr).unwrap();
    let mut cfg = SenderConfig::new(match way {
        Way::PlainSlice | Way::TlsCopy => TxPath::Copy,
        Way::PlainLoan | Way::TlsLoan => TxPath::Zerocopy,
    });
    cfg.buf_bytes = 256 << 10;
    cfg.pool_buffers = 32;
    let wall = Instant::now();
    let (t0, t1, st);
    if tls {
        let ch = Channel::connect(stream, Expect::Pinned(fp)).unwrap();
        let mut tx = SealedSender::new(ch, &cfg).unwrap();
        t0 = cpu();
        let mut sent = 0u64;
        while sent < total {
            let off = (sent % SRC as u64) as usize;
            let n = PIECE.min((total - sent) as usize).min(SRC - off);
            tx.send(&src[off..off + n]).unwrap();
            sent += n as u64;
        }
        tx.flush().unwrap();
        t1 = cpu();
        st = tx.finish().unwrap();
    } else {
        let mut tx = Sender::from_stream(stream, &cfg).unwrap();
        t0 = cpu();
        let mut sent = 0u64;
        while sent < total {
            let off = (sent % SRC as u64) as usize;
            let n = PIECE.min((total - sent) as usize).min(SRC - off);
            match way {
                Way::PlainSlice => tx.send_slice(&src[off..off + n]).unwrap(),
                _ => {
                    let mut done = 0;
                    while done < n {
                        let mut b = tx.buffer().unwrap();
                        let k = b.append(&src[off + done..off + n]);
                        done += k;
                        tx.send(b).unwrap();
                    }
                }
            }
            sent += n as u64;
        }
        tx.flush().unwrap();
        t1 = cpu();
        st = tx.finish().unwrap();
    }
    let r = rx.join().unwrap();
    (
        t1 - t0,
        r,
        wall.elapsed().as_secs_f64(),
        zcnet_transfer::paths_summary(&st),
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The steps alone, in memory, no socket (`tls_cost steps [GIB] [PIECE_KIB]`): a copy of
/// each piece (64 KiB unless given, at most 240; sessions seal 256 KiB per call and read
/// up to 256 KiB of records per `recv`) — what a copying send or receive costs the CPU per
/// pass —, BLAKE3 of the piece just copied (in cache), rustls sealing a piece
/// into records and writing them into a 256 KiB buffer (`SealedSender`'s work), and
/// rustls taking those records in and opening them (`Channel::recv_with`'s work), each
/// timed on its own with the thread's CPU clock.
fn steps(total: u64, piece: usize, src: &[u8], id: &Identity) {
    use rustls::{ClientConnection, ServerConnection};
    use std::io::{BufRead, Write};
    let (ccfg, _) =
        zcnet_transfer::tls::client_config(Expect::Pinned(id.fingerprint()), &[]).unwrap();
    let mut c = ClientConnection::new(ccfg, "zcnet".try_into().unwrap()).unwrap();
    let mut s = ServerConnection::new(zcnet_transfer::tls::server_config(id).unwrap()).unwrap();
    while c.is_handshaking() || s.is_handshaking() || c.wants_write() || s.wants_write() {
        let mut b = Vec::new();
        c.write_tls(&mut b).unwrap();
        s.read_tls(&mut &b[..]).unwrap();
        s.process_new_packets().unwrap();
        b.clear();
        s.write_tls(&mut b).unwrap();
        c.read_tls(&mut &b[..]).unwrap();
        c.process_new_packets().unwrap();
    }
    c.set_buffer_limit(None);
    let mut out = vec![0u8; 256 << 10];
    let (mut t_copy, mut t_seal, mut t_open, mut t_hash) = (0.0, 0.0, 0.0, 0.0);
    let mut hasher = blake3::Hasher::new();
    let mut done = 0u64;
    let mut check = 0u8;
    while done < total {
        let off = (done % SRC as u64) as usize;
        let n = piece.min(SRC - off);
        let piece = &src[off..off + n];
        let t = cpu();
        out[..n].copy_from_slice(piece);
        t_copy += cpu() - t;
        check ^= out[n / 2];
        // BLAKE3 of the piece just copied (in cache), as both ends now hash each chunk
        // where it lies in memory.
        let t = cpu();
        hasher.update(&out[..n]);
        t_hash += cpu() - t;
        let t = cpu();
        c.writer().write_all(piece).unwrap();
        let mut w = 0;
        while c.wants_write() {
            w += c.write_tls(&mut &mut out[w..]).unwrap();
        }
        t_seal += cpu() - t;
        let t = cpu();
        let mut rd = &out[..w];
        while !rd.is_empty() {
            s.read_tls(&mut rd).unwrap();
            s.process_new_packets().unwrap();
            let mut r = s.reader();
            while let Ok(b) = r.fill_buf() {
                if b.is_empty() {
                    break;
                }
                check ^= b[0];
                let k = b.len();
                r.consume(k);
            }
        }
        t_open += cpu() - t;
        done += n as u64;
    }
    let gib = total as f64 / (1u64 << 30) as f64;
    println!(
        "steps per GiB (thread CPU s), {} in memory, {} KiB pieces: copy {:.3}, BLAKE3 in cache {:.3}, seal (rustls: copy in, AES-GCM, copy out) {:.3}, open (rustls: copy in, AES-GCM, copy out) {:.3}  [{check} {}]",
        c.negotiated_cipher_suite().unwrap().suite().as_str().unwrap_or("?"),
        piece >> 10,
        t_copy / gib,
        t_hash / gib,
        t_seal / gib,
        t_open / gib,
        hasher.finalize().as_bytes()[0]
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("steps") {
        let gib: f64 = args.get(2).map_or(1.0, |s| s.parse().unwrap());
        // Plaintext per piece: its records must fit the 256 KiB output buffer (15 records
        // of 16 KiB at most).
        let piece = args
            .get(3)
            .map_or(64 << 10, |s| s.parse::<usize>().unwrap() << 10)
            .min(240 << 10);
        let total = (gib * (1u64 << 30) as f64) as u64;
        let src: Vec<u8> = (0..SRC)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let id = Identity::generate().unwrap();
        for _ in 0..3 {
            steps(total, piece, &src, &id);
        }
        return;
    }
    let gib: f64 = args.get(1).map_or(1.0, |s| s.parse().unwrap());
    let rounds: usize = args.get(2).map_or(3, |s| s.parse().unwrap());
    let total = (gib * (1u64 << 30) as f64) as u64;
    let src: Vec<u8> = (0..SRC)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let id = std::sync::Arc::new(Identity::generate().unwrap());
    let ways = [Way::PlainLoan, Way::PlainSlice, Way::TlsLoan, Way::TlsCopy];
    let mut res: Vec<Vec<(f64, f64, f64, String)>> = vec![Vec::new(); ways.len()];
    for _ in 0..rounds {
        for (i, w) in ways.iter().enumerate() {
            res[i].push(run(*w, &src, total, &id));
        }
    }
    let per = |s: f64| s / (total as f64 / (1u64 << 30) as f64);
    println!(
        "{:<12} {:>12} {:>12} {:>12} {:>8}   (CPU-s per GiB, medians of {rounds}; {gib} GiB each)",
        "way", "sender", "receiver", "both", "wall s"
    );
    let mut both = Vec::new();
    for (i, w) in ways.iter().enumerate() {
        let s = median(res[i].iter().map(|r| per(r.0)).collect());
        let r = median(res[i].iter().map(|r| per(r.1)).collect());
        let b = median(res[i].iter().map(|r| per(r.0 + r.1)).collect());
        let wall = median(res[i].iter().map(|r| r.2).collect());
        println!("{:<12} {s:>12.3} {r:>12.3} {b:>12.3} {wall:>8.2}", w.name());
        both.push((s, b));
    }
    for (i, w) in ways.iter().enumerate() {
        println!("{}: {}", w.name(), res[i].last().unwrap().3);
    }
    println!(
        "ratio tls-loan / plain-loan: sender {:.2}x, both ends {:.2}x",
        both[2].0 / both[0].0,
        both[2].1 / both[0].1
    );
    println!(
        "ratio tls-copy / plain-slice: sender {:.2}x, both ends {:.2}x",
        both[3].0 / both[1].0,
        both[3].1 / both[1].1
    );
}
