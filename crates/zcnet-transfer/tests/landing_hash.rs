//! The receiver verifies a file while its bytes land (`landing::LandingHash`), not in a pass
//! afterwards: a hand-driven sender shows that this still catches one wrong byte anywhere —
//! in a range that landed early, in a resumed file's old prefix, in a stream — and that a
//! right file arrives whole.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;
use zcnet::stream::Listener;
use zcnet::{ReceiverConfig, RxPath};
use zcnet_testbed::pattern::{pattern, Verifier};
use zcnet_transfer::landing::LAND_STEP;
use zcnet_transfer::session::{receive_session, RecvOptions, SessionReport, TransferError};
use zcnet_transfer::store::{Store, StoreOptions};
use zcnet_transfer::wire::{Code, Frame, STREAM_SIZE};

struct Served {
    addr: SocketAddr,
    handle: std::thread::JoinHandle<Result<SessionReport, TransferError>>,
}

fn serve(dir: &Path, sopts: StoreOptions) -> Served {
    let mut c = ReceiverConfig::new(RxPath::Copy);
    c.timeout = Some(Duration::from_secs(20));
    let listener = Listener::bind("127.0.0.1:0".parse().unwrap(), &c).unwrap();
    let addr = listener.local_addr().unwrap();
    let dir = dir.to_path_buf();
    let handle = std::thread::spawn(move || {
        let mut rx = listener.accept().unwrap();
        let mut store = Store::open(&dir, sopts).unwrap();
        receive_session(&mut rx, &mut store, &RecvOptions::default(), &mut |_| {})
    });
    Served { addr, handle }
}

struct Peer {
    s: TcpStream,
}

impl Peer {
    fn connect(addr: SocketAddr) -> Peer {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut p = Peer { s };
        assert!(matches!(p.recv(), Frame::Hello { .. }));
        p.send(&Frame::Hello {
            version: 4, // files right after the Hello: no `Open` (version 5)
            auth: false,
            nonce: [0; 32],
        });
        p
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
    /// Announces `name` of `size` bytes; returns the offset the receiver offers.
    fn file(&mut self, name: &str, size: u64) -> u64 {
        self.send(&Frame::File {
            name: name.into(),
            size,
            mode: 0o640,
            mtime_s: 1_000_000,
            mtime_ns: 5,
            verify: true,
        });
        match self.recv() {
            Frame::Ready { offset, .. } => offset,
            other => panic!("{other:?}"),
        }
    }
    /// Sends `Start{start}`, `wire` raw, and a trailer with `hash`; returns the Ack's code.
    fn body(&mut self, start: u64, wire: &[u8], hash: [u8; 32]) -> Code {
        self.send(&Frame::Start { offset: start });
        self.s.write_all(wire).unwrap();
        self.send(&Frame::Trailer { hash: Some(hash) });
        self.ack()
    }
    fn ack(&mut self) -> Code {
        match self.recv() {
            Frame::Ack { code, .. } => code,
            other => panic!("{other:?}"),
        }
    }
    fn bye(mut self) {
        self.send(&Frame::Bye);
        assert_eq!(self.recv(), Frame::Bye);
    }
}

/// Every byte of `path` against the pattern from `seed`.
fn check(path: &Path, seed: u64, len: u64) {
    let got = std::fs::read(path).unwrap();
    assert_eq!(got.len() as u64, len, "{}", path.display());
    Verifier { pos: seed }.check(&got);
}

/// `len` pattern bytes from `seed` (the pattern hands out at most 8 MiB at a time).
fn pat(seed: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        let n = (len - v.len()).min(4 << 20);
        v.extend_from_slice(pattern(seed + v.len() as u64, n));
    }
    v
}

fn leftovers(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn one_wrong_byte_in_any_landed_range_is_caught_and_a_right_file_arrives_whole() {
    let dst = tempfile::tempdir().unwrap();
    let served = serve(dst.path(), StoreOptions::default());
    let mut p = Peer::connect(served.addr);
    // Several landing steps and a ragged tail.
    let len = 4 * LAND_STEP + 4097;
    let data = pat(3, len as usize);
    let right = *blake3::hash(&data).as_bytes();
    for (name, flip) in [
        ("early", Some(17usize)),
        ("middle", Some(2 * LAND_STEP as usize + 1)),
        ("last", Some(len as usize - 1)),
        ("good", None),
    ] {
        let mut wire = data.clone();
        if let Some(at) = flip {
            wire[at] ^= 0x40;
        }
        assert_eq!(p.file(name, len), 0);
        let want = if flip.is_some() {
            Code::HashMismatch
        } else {
            Code::Ok
        };
        assert_eq!(p.body(0, &wire, right), want, "{name}");
    }
    p.bye();
    let r = served.handle.join().unwrap().unwrap();
    assert_eq!(r.files.len(), 4);
    assert!(r.files[3].verified && r.files[3].result.is_ok());
    check(&dst.path().join("good"), 3, len);
    let meta = std::fs::metadata(dst.path().join("good")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(meta.mode() & 0o7777, 0o640);
    assert_eq!((meta.mtime(), meta.mtime_nsec()), (1_000_000, 5));
    // No final and no partial file for the three with a flipped byte.
    assert_eq!(leftovers(dst.path()), vec!["good".to_string()]);
}

#[test]
fn a_resumed_file_is_hashed_from_its_first_byte_not_from_where_it_resumed() {
    let dst = tempfile::tempdir().unwrap();
    let len = 3 * LAND_STEP + 11;
    let data = pat(7, len as usize);
    let right = *blake3::hash(&data).as_bytes();
    let owner = Store::open(dst.path(), StoreOptions::default())
        .unwrap()
        .owner()
        .to_string();
    let have = LAND_STEP + 5;
    let mut so = StoreOptions::default();
    so.resume = true;
    for (name, bad_prefix) in [("bad", true), ("fine", false)] {
        let mut prefix = data[..have as usize].to_vec();
        if bad_prefix {
            prefix[1000] ^= 1;
        }
        let seeded = dst.path().join(format!("{name}.{owner}.0000cafe.partial"));
        std::fs::write(&seeded, &prefix).unwrap();
        let served = serve(dst.path(), so);
        let mut p = Peer::connect(served.addr);
        assert_eq!(p.file(name, len), have, "the partial file is offered");
        // A sender that continues after the offered prefix without checking it: only the
        // tail crosses the wire, yet the whole file is what gets verified.
        let code = p.body(have, &data[have as usize..], right);
        p.bye();
        served.handle.join().unwrap().unwrap();
        if bad_prefix {
            assert_eq!(code, Code::HashMismatch);
            assert!(!dst.path().join(name).exists());
        } else {
            assert_eq!(code, Code::Ok);
            check(&dst.path().join(name), 7, len);
        }
    }
    assert_eq!(leftovers(dst.path()), vec!["fine".to_string()]);
}

#[test]
fn a_stream_is_hashed_as_its_frames_arrive() {
    let dst = tempfile::tempdir().unwrap();
    let served = serve(dst.path(), StoreOptions::default());
    let mut p = Peer::connect(served.addr);
    let data = pat(11, 3 << 20);
    let right = *blake3::hash(&data).as_bytes();
    for (name, flip) in [("s-bad", Some(2_000_000usize)), ("s-good", None)] {
        let mut wire = data.clone();
        if let Some(at) = flip {
            wire[at] ^= 0x80;
        }
        assert_eq!(p.file(name, STREAM_SIZE), 0);
        p.send(&Frame::Start { offset: 0 });
        for chunk in wire.chunks(700_001) {
            p.send(&Frame::Data(chunk.to_vec()));
        }
        p.send(&Frame::EndData);
        p.send(&Frame::Trailer { hash: Some(right) });
        let want = if flip.is_some() {
            Code::HashMismatch
        } else {
            Code::Ok
        };
        assert_eq!(p.ack(), want, "{name}");
    }
    p.bye();
    served.handle.join().unwrap().unwrap();
    check(&dst.path().join("s-good"), 11, 3 << 20);
    assert_eq!(leftovers(dst.path()), vec!["s-good".to_string()]);
}
