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
//!
//! `steps` times each step of the data path alone, in memory, without a socket: a copy,
//! BLAKE3, rustls's seal, rustls's open as a receiving session drives it (and without its
//! copy out), AES-GCM alone through rustls's own record encrypter and decrypter, and a
//! `pwrite` to tmpfs per piece and per 16 KiB record (see [`steps`]).
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

/// A client and a server connection with their handshake done in memory.
fn pair(id: &Identity) -> (rustls::ClientConnection, rustls::ServerConnection) {
    use rustls::{ClientConnection, ServerConnection};
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
    (c, s)
}

/// Ciphertext taken from the socket per `recv` at the receiver (`TlsLink`'s inbox).
const INBOX: usize = 256 << 10;

/// Opens `batch` (records cut anywhere, as a `recv` of [`INBOX`] bytes gives them) the way
/// `TlsLink::read` does: `read_tls` from the batch whenever rustls has no plaintext, then
/// `process_new_packets`; the plaintext drained into `staging` with `Reader::read` (a copy,
/// what a session does today) or, with `in_place`, taken where rustls holds it
/// (`fill_buf`/`consume`, no copy). Returns how many `read_tls` calls it took.
fn open_batch(
    s: &mut rustls::ServerConnection,
    batch: &[u8],
    staging: &mut [u8],
    in_place: bool,
    check: &mut u8,
) -> u64 {
    use std::io::{BufRead, Read};
    let mut rd = batch;
    let mut feeds = 0;
    let mut k = 0;
    loop {
        if in_place {
            let mut r = s.reader();
            while let Ok(b) = r.fill_buf() {
                if b.is_empty() {
                    break;
                }
                *check ^= b[b.len() / 2];
                let n = b.len();
                r.consume(n);
            }
        } else {
            loop {
                match s.reader().read(&mut staging[k..]) {
                    Ok(n) if n > 0 => {
                        *check ^= staging[k];
                        k += n;
                        if k == staging.len() {
                            k = 0;
                        }
                    }
                    _ => break,
                }
            }
        }
        if rd.is_empty() {
            return feeds;
        }
        s.read_tls(&mut rd).unwrap();
        feeds += 1;
        s.process_new_packets().unwrap();
    }
}

/// The steps alone, in memory, no socket (`tls_cost steps [GIB] [PIECE_KIB]`), each timed
/// on its own with the thread's CPU clock:
///
/// * a copy of each piece (64 KiB unless given, at most 240; sessions seal 256 KiB per
///   call) from a 64 MiB source — what a copying send or receive costs the CPU per pass —,
///   and a second copy of it while it is in cache;
/// * BLAKE3 of the piece just copied (in cache);
/// * rustls sealing the piece into records, written out into a buffer (`TlsLink`'s work
///   at the sender: plaintext copied into each record, AES-GCM in place, the records
///   copied out — the last copy is the kernel's in a session);
/// * rustls opening those records as the receiving session does (`TlsLink::read`: a
///   stream of records cut into [`INBOX`]-byte batches, `read_tls` + `process_new_packets`,
///   the plaintext read out into a 256 KiB buffer), and the same with the plaintext taken
///   where rustls holds it (`fill_buf`, no copy out); the two alternate batch by batch;
/// * AES-GCM alone: rustls's own record encrypter and decrypter (the suite's
///   `MessageEncrypter`/`MessageDecrypter`, from a second session's extracted keys) on each
///   16 KiB record, no buffering: sealing copies the plaintext in (and allocates the
///   record), opening decrypts in place.
fn steps(total: u64, piece: usize, src: &[u8], id: &Identity) {
    use rustls::crypto::cipher::{InboundOpaqueMessage, OutboundChunks, OutboundPlainMessage};
    use rustls::{ContentType, ProtocolVersion};
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    let (mut c, mut s) = pair(id);
    let suite = c.negotiated_cipher_suite().unwrap();
    let aead = suite.tls13().unwrap().aead_alg;
    // The record layer alone, from a second session's keys (client tx = server rx).
    let (c2, s2) = pair(id);
    let tx = c2.dangerous_extract_secrets().unwrap().tx.1;
    let rx = s2.dangerous_extract_secrets().unwrap().rx.1;
    let keys = |t: rustls::ConnectionTrafficSecrets| match t {
        rustls::ConnectionTrafficSecrets::Aes128Gcm { key, iv }
        | rustls::ConnectionTrafficSecrets::Aes256Gcm { key, iv }
        | rustls::ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (key, iv),
        _ => unreachable!(),
    };
    let (k, iv) = keys(tx);
    let mut enc = aead.encrypter(k, iv);
    let (k, iv) = keys(rx);
    let mut dec = aead.decrypter(k, iv);
    let mut seq = 0u64;

    let mut out = vec![0u8; 256 << 10];
    let mut staging = vec![0u8; 256 << 10];
    let mut wire: Vec<u8> = Vec::with_capacity(4 * INBOX);
    let (mut t_copy, mut t_copy2, mut t_seal, mut t_hash) = (0.0, 0.0, 0.0, 0.0);
    let (mut t_aseal, mut t_aopen) = (0.0, 0.0);
    // [read out, in place]: CPU s, plaintext bytes, read_tls calls.
    let mut t_open = [0.0f64; 2];
    let mut opened = [0u64; 2];
    let mut feeds = [0u64; 2];
    let mut batch = 0usize;
    let mut hasher = blake3::Hasher::new();
    let mut done = 0u64;
    let mut check = 0u8;
    let mut records: Vec<Vec<u8>> = Vec::new();
    // Writing the plaintext to a file on tmpfs, a piece per `pwrite` or a `pwrite` per
    // 16 KiB record (what the receiver does when it writes each record's plaintext where
    // rustls holds it), over two 64 MiB files written once before.
    let dir = std::env::temp_dir();
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        dir
    };
    let names = [0, 1].map(|i| dir.join(format!("tls_cost.{}.{i}", std::process::id())));
    let files = names.clone().map(|p| {
        let f = std::fs::File::create(&p).unwrap();
        f.write_all_at(&src[..SRC], 0).unwrap();
        f
    });
    let (mut t_wbig, mut t_wrec) = (0.0, 0.0);
    while done < total {
        let off = (done % SRC as u64) as usize;
        let n = piece.min(SRC - off);
        let piece = &src[off..off + n];
        let t = cpu();
        out[..n].copy_from_slice(piece);
        t_copy += cpu() - t;
        let t = cpu();
        staging[..n].copy_from_slice(&out[..n]);
        t_copy2 += cpu() - t;
        check ^= out[n / 2] ^ staging[n / 3];
        // BLAKE3 of the piece just copied (in cache), as both ends now hash each chunk
        // where it lies in memory.
        let t = cpu();
        hasher.update(&out[..n]);
        t_hash += cpu() - t;
        let t = cpu();
        c.writer().write_all(piece).unwrap();
        while c.wants_write() {
            c.write_tls(&mut wire).unwrap();
        }
        t_seal += cpu() - t;
        while wire.len() >= INBOX {
            let w = batch % 2;
            let before = opened[w];
            let t = cpu();
            feeds[w] += open_batch(&mut s, &wire[..INBOX], &mut staging, w == 1, &mut check);
            t_open[w] += cpu() - t;
            // Plaintext per batch, near enough (the overhead is 22 of 16,406 bytes).
            opened[w] = before + (INBOX as u64 * 16384 / 16406);
            wire.drain(..INBOX);
            batch += 1;
        }
        // The record layer alone.
        records.clear();
        let t = cpu();
        for rec in piece.chunks(16 << 10) {
            let m = OutboundPlainMessage {
                typ: ContentType::ApplicationData,
                version: ProtocolVersion::TLSv1_2,
                payload: OutboundChunks::Single(rec),
            };
            records.push(enc.encrypt(m, seq).unwrap().encode());
            seq += 1;
        }
        t_aseal += cpu() - t;
        let first = seq - records.len() as u64;
        let t = cpu();
        for (i, r) in records.iter_mut().enumerate() {
            let m = InboundOpaqueMessage::new(
                ContentType::ApplicationData,
                ProtocolVersion::TLSv1_2,
                &mut r[5..],
            );
            let p = dec.decrypt(m, first + i as u64).unwrap();
            check ^= p.payload[0];
        }
        t_aopen += cpu() - t;
        let at = off as u64;
        let t = cpu();
        files[0].write_all_at(&out[..n], at).unwrap();
        t_wbig += cpu() - t;
        let t = cpu();
        for (i, rec) in out[..n].chunks(16 << 10).enumerate() {
            files[1].write_all_at(rec, at + (i << 14) as u64).unwrap();
        }
        t_wrec += cpu() - t;
        done += n as u64;
    }
    for p in &names {
        let _ = std::fs::remove_file(p);
    }
    let gib = total as f64 / (1u64 << 30) as f64;
    let per = |t: f64, b: u64| t / (b as f64 / (1u64 << 30) as f64);
    println!(
        "steps per GiB (thread CPU s), {} in memory, {} KiB pieces: copy {:.3}, copy in cache {:.3}, BLAKE3 in cache {:.3}, seal (rustls: copy in, AES-GCM, copy out) {:.3}, open as sessions do (read_tls copy in, AES-GCM, copy into rustls's chunk, read out) {:.3}, open in place (no read out) {:.3}, AES-GCM record seal alone (copy in) {:.3}, open alone (in place) {:.3}, pwrite to tmpfs a piece at a time {:.3}, a 16 KiB record at a time {:.3}; read_tls calls per 16 KiB record {:.2}  [{check} {}]",
        suite.suite().as_str().unwrap_or("?"),
        piece >> 10,
        t_copy / gib,
        t_copy2 / gib,
        t_hash / gib,
        t_seal / gib,
        per(t_open[0], opened[0]),
        per(t_open[1], opened[1]),
        t_aseal / gib,
        t_aopen / gib,
        t_wbig / gib,
        t_wrec / gib,
        (feeds[0] + feeds[1]) as f64 / ((opened[0] + opened[1]) as f64 / 16384.0),
        hasher.finalize().as_bytes()[0]
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("steps") {
        let gib: f64 = args.get(2).map_or(1.0, |s| s.parse().unwrap());
        // Plaintext per piece: at most the 256 KiB copy buffers.
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
