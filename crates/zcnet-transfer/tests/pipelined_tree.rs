//! Version 2's pipelined small files and version 7's pipelined large ones end to end over
//! loopback: a tree of many small files (empty ones and nested directories among them, a run
//! of large files in the middle, more than a sender keeps unanswered) arrives with every
//! file's bytes, mode and mtime, whatever the window (1, a few, the default, the largest);
//! refusals inside the window are answered in order; a version-1 or version-6 peer on either
//! side is served in its version (a version-6 receiver gets each large file's `Ack` asked
//! for before the next file, a version-7 one at most `FILES_AHEAD` files ahead), and a
//! version neither speaks is refused with the reason.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;
use zcnet::stream::Listener;
use zcnet::{ReceiverConfig, RxPath, SenderConfig, TxPath};
use zcnet_testbed::pattern::pattern;
use zcnet_transfer::session::{
    receive_session, send_session, RecvOptions, SendOptions, SessionReport, Source, TransferError,
    DEFAULT_WINDOW, FILES_AHEAD, MAX_WINDOW, PIPELINED_FILES,
};
use zcnet_transfer::store::{Store, StoreOptions};
use zcnet_transfer::wire::{Code, Frame, MAX_PUT, VERSION};

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

fn hash(path: &Path) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    std::io::copy(&mut File::open(path).unwrap(), &mut h).unwrap();
    *h.finalize().as_bytes()
}

/// Files in a row in the middle of [`make_tree`]'s tree that go by `sendfile`: more than
/// a version-7 sender leaves unanswered.
const LARGE_RUN: usize = FILES_AHEAD + 2;

/// `n` files under `root` in three levels of directories, sizes 0..=9000 (every 17th empty),
/// plus [`LARGE_RUN`] files larger than a `Put` in a row in the middle; returns (name, path)
/// in sending order.
fn make_tree(root: &Path, n: usize) -> Vec<(String, std::path::PathBuf)> {
    let mut out = Vec::new();
    let large = n / 2..n / 2 + LARGE_RUN;
    for i in 0..n {
        let name = if large.contains(&i) {
            format!("big/large{i}.bin")
        } else {
            format!("d{}/e{}/f{}/file{i:04}", i % 3, i % 5, i % 2)
        };
        let len = match i {
            _ if i == n / 2 => MAX_PUT + 4097,
            _ if large.contains(&i) => 300_000 + (i as u64 % 7) * 70_001,
            _ if i % 17 == 0 => 0,
            _ => (i as u64 * 7919) % 9001,
        };
        let p = root.join(&name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        File::create(&p)
            .unwrap()
            .write_all(pattern(i as u64 * 131, len as usize))
            .unwrap();
        std::fs::set_permissions(
            &p,
            std::fs::Permissions::from_mode(0o600 + (i as u32 % 8) * 8),
        )
        .unwrap();
        let t = filetime(1_600_000_000 + i as i64, (i as u32 * 1000) % 1_000_000_000);
        File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(t)
            .unwrap();
        out.push((name, p));
    }
    out
}

fn filetime(s: i64, ns: u32) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + Duration::new(s as u64, ns)
}

fn serve(
    dir: &Path,
    sopts: StoreOptions,
) -> (
    SocketAddr,
    std::thread::JoinHandle<Result<SessionReport, TransferError>>,
) {
    let listener = Listener::bind("127.0.0.1:0".parse().unwrap(), &rcfg()).unwrap();
    let addr = listener.local_addr().unwrap();
    let dir = dir.to_path_buf();
    let h = std::thread::spawn(move || {
        let mut rx = listener.accept().unwrap();
        let mut store = Store::open(&dir, sopts).unwrap();
        receive_session(&mut rx, &mut store, &RecvOptions::default(), &mut |_| {})
    });
    (addr, h)
}

fn opts(window: usize, max_version: u16) -> SendOptions {
    let mut o = SendOptions::default();
    o.verify = true;
    o.window = window;
    o.max_version = max_version;
    o
}

fn send_tree(
    addr: SocketAddr,
    files: &[(String, std::path::PathBuf)],
    o: &SendOptions,
) -> Result<SessionReport, TransferError> {
    let mut tx = zcnet::Sender::connect(addr, &scfg()).unwrap();
    let sources = files
        .iter()
        .map(|(n, p)| Source::File {
            path: p.clone(),
            name: n.clone(),
        })
        .collect();
    send_session(&mut tx, sources, o, &mut |_| {})
}

/// Every file arrived whole (BLAKE3 of its bytes), with its mode and mtime, and nothing else
/// (no partial file) is left in `dst`.
fn assert_tree_arrived(files: &[(String, std::path::PathBuf)], dst: &Path) {
    for (name, p) in files {
        let got = dst.join(name);
        assert_eq!(hash(&got), hash(p), "{name}: contents differ");
        let (a, b) = (p.metadata().unwrap(), got.metadata().unwrap());
        assert_eq!(a.len(), b.len(), "{name}");
        assert_eq!(a.mode() & 0o777, b.mode() & 0o777, "{name}: mode");
        assert_eq!(
            (a.mtime(), a.mtime_nsec()),
            (b.mtime(), b.mtime_nsec()),
            "{name}: mtime"
        );
    }
    let mut count = 0;
    let mut stack = vec![dst.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                assert!(
                    !e.file_name().to_string_lossy().ends_with(".partial"),
                    "{:?} left",
                    e.path()
                );
                count += 1;
            }
        }
    }
    assert_eq!(count, files.len(), "exactly the files sent");
}

fn round_trip(n: usize, window: usize, max_version: u16) {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let files = make_tree(src.path(), n);
    let (addr, h) = serve(dst.path(), StoreOptions::default());
    let sent = send_tree(addr, &files, &opts(window, max_version)).unwrap();
    let got = h.join().unwrap().unwrap();
    assert_eq!(
        sent.failures(),
        0,
        "{:?}",
        sent.files.iter().find(|f| f.result.is_err())
    );
    assert_eq!(got.failures(), 0);
    // The answers came back in sending order, one per file, each verified.
    let names: Vec<_> = sent.files.iter().map(|f| f.name.as_str()).collect();
    let want: Vec<_> = files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, want);
    assert!(sent.files.iter().all(|f| f.verified));
    assert_eq!(got.files.len(), n);
    assert_tree_arrived(&files, dst.path());
}

#[test]
fn a_tree_of_small_files_arrives_whole_with_a_window_of_one() {
    round_trip(120, 1, VERSION);
}

#[test]
fn a_tree_of_small_files_arrives_whole_with_a_window_of_three() {
    round_trip(120, 3, VERSION);
}

#[test]
fn a_tree_of_small_files_arrives_whole_with_the_default_and_largest_windows() {
    round_trip(600, DEFAULT_WINDOW, VERSION);
    round_trip(600, MAX_WINDOW, VERSION);
    // Out of range is clamped, not a hang or a panic.
    round_trip(40, 0, VERSION);
    round_trip(40, usize::MAX, VERSION);
}

#[test]
fn a_sender_limited_to_version_1_is_served_one_file_at_a_time() {
    round_trip(60, DEFAULT_WINDOW, 1);
}

#[test]
fn a_version_6_sender_is_served_each_large_file_in_its_turn() {
    round_trip(120, DEFAULT_WINDOW, PIPELINED_FILES - 1);
}

#[test]
fn refusals_inside_the_window_are_answered_in_order_and_the_rest_arrives() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let files = make_tree(src.path(), 200);
    // Every 10th name already exists at the receiver (with other contents).
    for (name, _) in files.iter().step_by(10) {
        let p = dst.path().join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b"older").unwrap();
    }
    let (addr, h) = serve(dst.path(), StoreOptions::default());
    let sent = send_tree(addr, &files, &opts(8, VERSION)).unwrap();
    h.join().unwrap().unwrap();
    for (i, (f, (name, p))) in sent.files.iter().zip(&files).enumerate() {
        assert_eq!(&f.name, name);
        let got = dst.path().join(name);
        if i % 10 == 0 {
            assert!(
                matches!(f.result, Err((Code::Exists, _))),
                "{name}: {:?}",
                f.result
            );
            assert_eq!(
                std::fs::read(&got).unwrap(),
                b"older",
                "{name} was replaced"
            );
        } else {
            assert_eq!(f.result, Ok(()), "{name}");
            assert_eq!(hash(&got), hash(p), "{name}");
        }
    }
}

fn read_frame(s: &mut TcpStream) -> Frame {
    let mut h = [0u8; 5];
    s.read_exact(&mut h).unwrap();
    let (ty, len) = Frame::check_header(h).unwrap();
    let mut p = vec![0; len];
    s.read_exact(&mut p).unwrap();
    Frame::decode(ty, &p).unwrap()
}

/// A receiver of version 1 (its `Hello` says 1): our sender answers in version 1 and sends
/// its small file as a `File` waiting for `Ready`, never a `Put` the old peer would not know.
#[test]
fn a_version_1_receiver_gets_version_1_frames() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let src = tempfile::tempdir().unwrap();
    let p = src.path().join("small");
    std::fs::write(&p, pattern(5, 3000)).unwrap();
    let peer = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(
            &Frame::Hello {
                version: 1,
                auth: false,
                nonce: [1; 32],
            }
            .to_bytes(),
        )
        .unwrap();
        let Frame::Hello { version, .. } = read_frame(&mut s) else {
            panic!("hello first")
        };
        let first = read_frame(&mut s);
        // Refuse it, as a version-1 receiver may; the sender goes on to its goodbye.
        s.write_all(
            &Frame::Refuse {
                code: Code::Exists,
                message: "old peer says no".into(),
            }
            .to_bytes(),
        )
        .unwrap();
        let bye = read_frame(&mut s);
        s.write_all(&Frame::Bye.to_bytes()).unwrap();
        (version, first, bye)
    });
    let mut tx = zcnet::Sender::connect(addr, &scfg()).unwrap();
    let report = send_session(
        &mut tx,
        vec![Source::File {
            path: p,
            name: "small".into(),
        }],
        &opts(DEFAULT_WINDOW, VERSION),
        &mut |_| {},
    )
    .unwrap();
    let (version, first, bye) = peer.join().unwrap();
    assert_eq!(version, 1);
    assert!(
        matches!(first, Frame::File { ref name, size: 3000, .. } if name == "small"),
        "{first:?}"
    );
    assert_eq!(bye, Frame::Bye);
    assert!(
        matches!(report.files[0].result, Err((Code::Exists, ref m)) if m == "old peer says no")
    );
}

/// A sender that chose version 1 must not send a `Put`: the receiver ends the session with a
/// protocol error and creates nothing. A version neither side speaks is refused by name.
#[test]
fn a_put_in_a_version_1_session_and_an_unknown_version_are_refused() {
    let dst = tempfile::tempdir().unwrap();
    let (addr, h) = serve(dst.path(), StoreOptions::default());
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let Frame::Hello { version, .. } = read_frame(&mut s) else {
        panic!()
    };
    assert_eq!(version, VERSION);
    s.write_all(
        &Frame::Hello {
            version: 1,
            auth: false,
            nonce: [0; 32],
        }
        .to_bytes(),
    )
    .unwrap();
    let mut b = Frame::Put {
        name: "x".into(),
        size: 3,
        mode: 0o644,
        mtime_s: 0,
        mtime_ns: 0,
        verify: false,
    }
    .to_bytes();
    b.extend_from_slice(b"abc");
    b.extend(Frame::Trailer { hash: None }.to_bytes());
    s.write_all(&b).unwrap();
    let e = h.join().unwrap().unwrap_err();
    assert!(
        matches!(e, TransferError::Unexpected { got: "put", .. }),
        "{e}"
    );
    assert!(std::fs::read_dir(dst.path()).unwrap().next().is_none());

    let (addr, h) = serve(dst.path(), StoreOptions::default());
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    read_frame(&mut s);
    s.write_all(
        &Frame::Hello {
            version: VERSION + 7,
            auth: false,
            nonce: [0; 32],
        }
        .to_bytes(),
    )
    .unwrap();
    match read_frame(&mut s) {
        Frame::Refuse { code, message } => {
            assert_eq!(code, Code::Version);
            assert!(
                message.contains(&format!("sender {}", VERSION + 7)),
                "{message}"
            );
        }
        f => panic!("{f:?}"),
    }
    assert!(h.join().unwrap().is_err());
}

/// A `Put` announcing more than `MAX_PUT` is malformed from its header fields: nothing is
/// allocated for it and nothing is created.
#[test]
fn an_oversized_put_ends_the_session_before_its_bytes_are_read() {
    let dst = tempfile::tempdir().unwrap();
    let (addr, h) = serve(dst.path(), StoreOptions::default());
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    read_frame(&mut s);
    s.write_all(
        &Frame::Hello {
            version: 4, // files right after the Hello: no `Open` (version 5)
            auth: false,
            nonce: [0; 32],
        }
        .to_bytes(),
    )
    .unwrap();
    let mut b = Frame::Put {
        name: "x".into(),
        size: 0,
        mode: 0o644,
        mtime_s: 0,
        mtime_ns: 0,
        verify: false,
    }
    .to_bytes();
    // Patch the size field (after 5 header bytes, 2 + 1 name bytes) to u64::MAX - 1.
    b[8..16].copy_from_slice(&(u64::MAX - 1).to_be_bytes());
    s.write_all(&b).unwrap();
    let e = h.join().unwrap().unwrap_err();
    assert!(matches!(e, TransferError::Wire(_)), "{e}");
    assert!(std::fs::read_dir(dst.path()).unwrap().next().is_none());
}

/// The largest window full of refusals with the longest messages: every unread `Ack` must
/// fit between the two ends' socket buffers, or the receiver would block writing answers
/// while the sender blocks writing files. Every refusal comes back in order, and the valid
/// files between them arrive whole.
#[test]
fn a_full_window_of_long_refusals_does_not_deadlock() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let data = src.path().join("data");
    std::fs::write(&data, pattern(9, 700)).unwrap();
    let long = "n".repeat(250);
    let sources: Vec<(String, bool)> = (0..3 * MAX_WINDOW)
        .map(|i| {
            if i % 3 == 0 {
                (format!("ok/{i}"), true)
            } else {
                // Refused as unsafe, with the name (and so the message) as long as allowed.
                (
                    format!("{}/../{i}", vec![long.as_str(); 15].join("/")),
                    false,
                )
            }
        })
        .collect();
    let (addr, h) = serve(dst.path(), StoreOptions::default());
    let mut tx = zcnet::Sender::connect(addr, &scfg()).unwrap();
    let report = send_session(
        &mut tx,
        sources
            .iter()
            .map(|(n, _)| Source::File {
                path: data.clone(),
                name: n.clone(),
            })
            .collect(),
        &opts(MAX_WINDOW, VERSION),
        &mut |_| {},
    )
    .unwrap();
    h.join().unwrap().unwrap();
    assert_eq!(report.files.len(), sources.len());
    for (f, (name, ok)) in report.files.iter().zip(&sources) {
        assert_eq!(&f.name, name);
        if *ok {
            assert_eq!(f.result, Ok(()));
            assert_eq!(
                std::fs::read(dst.path().join(name)).unwrap(),
                pattern(9, 700)
            );
        } else {
            let Err((Code::UnsafeName, m)) = &f.result else {
                panic!("{:?}", f.result)
            };
            // The message names the ~3.8 KB name, cut to 512 bytes for the window's sake.
            assert!(m.len() <= 512 && m.len() > 400, "{}", m.len());
        }
    }
}

/// A `File` waits for its `Ready`; a peer that sends its data right behind it (as if it
/// were a `Put`) is out of step: the session ends as a protocol error and nothing is created
/// — the bytes already read ahead are never lost under a file that then looks complete.
#[test]
fn data_sent_behind_a_file_before_its_ready_is_a_protocol_error() {
    let dst = tempfile::tempdir().unwrap();
    let (addr, h) = serve(dst.path(), StoreOptions::default());
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    read_frame(&mut s);
    let mut b = Frame::Hello {
        version: 4, // files right after the Hello: no `Open` (version 5)
        auth: false,
        nonce: [0; 32],
    }
    .to_bytes();
    b.extend(
        Frame::File {
            name: "x".into(),
            size: 3,
            mode: 0o644,
            mtime_s: 0,
            mtime_ns: 0,
            verify: false,
        }
        .to_bytes(),
    );
    b.extend(Frame::Start { offset: 0 }.to_bytes());
    b.extend_from_slice(b"abc");
    b.extend(Frame::Trailer { hash: None }.to_bytes());
    // One write: the receiver's handshake reads exactly the Hello, and the rest is queued
    // together behind it.
    s.write_all(&b).unwrap();
    let e = h.join().unwrap().unwrap_err();
    assert!(
        matches!(
            e,
            TransferError::Unexpected {
                got: "bytes sent ahead of it",
                ..
            }
        ),
        "{e}"
    );
    assert!(std::fs::read_dir(dst.path()).unwrap().next().is_none());
}

/// A sender that vanishes in the middle of a window (here: inside the bytes of a `Put`)
/// leaves only verified final files and no final file for what was cut; the files it sent
/// whole before that are finished as promised (their answers simply find no one).
#[test]
fn a_sender_gone_inside_a_window_leaves_only_whole_verified_files() {
    let dst = tempfile::tempdir().unwrap();
    let (addr, h) = serve(dst.path(), StoreOptions::default());
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    read_frame(&mut s);
    let mut b = Frame::Hello {
        version: 4, // files right after the Hello: no `Open` (version 5)
        auth: false,
        nonce: [0; 32],
    }
    .to_bytes();
    let body = |i: u64| pattern(i * 977, 3000 + i as usize);
    for i in 0..40u64 {
        let data = body(i);
        b.extend(
            Frame::Put {
                name: format!("w/{i}"),
                size: data.len() as u64,
                mode: 0o644,
                mtime_s: 0,
                mtime_ns: 0,
                verify: true,
            }
            .to_bytes(),
        );
        b.extend_from_slice(data);
        b.extend(
            Frame::Trailer {
                hash: Some(*blake3::hash(data).as_bytes()),
            }
            .to_bytes(),
        );
    }
    b.extend(
        Frame::Put {
            name: "w/cut".into(),
            size: 5000,
            mode: 0o644,
            mtime_s: 0,
            mtime_ns: 0,
            verify: true,
        }
        .to_bytes(),
    );
    b.extend_from_slice(&pattern(1, 5000)[..1234]);
    s.write_all(&b).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(h.join().unwrap().is_err(), "a cut Put is an error");
    assert!(!dst.path().join("w/cut").exists());
    for e in std::fs::read_dir(dst.path().join("w")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!name.ends_with(".partial"), "{name} left behind");
        let i: u64 = name.parse().expect("only the numbered files are final");
        assert_eq!(
            std::fs::read(dst.path().join("w").join(&name)).unwrap(),
            body(i),
            "{name}"
        );
    }
    // All 40 were whole: each is final, none left partial (7 final and 33 partial files
    // before the finishing thread went on without the session).
    assert_eq!(std::fs::read_dir(dst.path().join("w")).unwrap().count(), 40);
}

/// `Put`s of up to `MAX_CONTROL` bytes are hashed and written straight from the receiver's
/// read-ahead buffer, larger ones through a buffer of their own. Sizes on both sides of
/// that line, with every byte arriving in small pieces (so a file's data, its trailer and
/// the next header straddle many `recv`s), each land whole, with their mode and mtime; a
/// peer that closes after a `Put`'s data but before its trailer leaves no final file.
#[test]
fn puts_arriving_in_pieces_on_both_sides_of_the_read_ahead_land_whole() {
    use zcnet_transfer::wire::MAX_CONTROL;
    let dst = tempfile::tempdir().unwrap();
    let (addr, h) = serve(dst.path(), StoreOptions::default());
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    read_frame(&mut s);
    let mut b = Frame::Hello {
        version: 4, // files right after the Hello: no `Open` (version 5)
        auth: false,
        nonce: [0; 32],
    }
    .to_bytes();
    let sizes = [
        0,
        1,
        4500,
        MAX_CONTROL - 1,
        MAX_CONTROL,
        MAX_CONTROL + 1,
        3000,
    ];
    let body = |i: usize| pattern(i as u64 * 131, sizes[i]);
    for (i, _) in sizes.iter().enumerate() {
        let data = body(i);
        b.extend(
            Frame::Put {
                name: format!("p/{i}"),
                size: data.len() as u64,
                mode: 0o640 + i as u32 % 8,
                mtime_s: 1_600_000_000 + i as i64,
                mtime_ns: 1000 * i as u32,
                verify: true,
            }
            .to_bytes(),
        );
        b.extend_from_slice(data);
        b.extend(
            Frame::Trailer {
                hash: Some(*blake3::hash(data).as_bytes()),
            }
            .to_bytes(),
        );
    }
    b.extend(Frame::Bye.to_bytes());
    for piece in b.chunks(4093) {
        s.write_all(piece).unwrap();
        std::thread::sleep(Duration::from_micros(300));
    }
    for _ in &sizes {
        match read_frame(&mut s) {
            Frame::Ack { code, .. } => assert_eq!(code, Code::Ok),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(read_frame(&mut s), Frame::Bye);
    let report = h.join().unwrap().unwrap();
    assert_eq!(report.files.len(), sizes.len());
    for (i, _) in sizes.iter().enumerate() {
        let p = dst.path().join(format!("p/{i}"));
        assert_eq!(std::fs::read(&p).unwrap(), body(i), "file {i}");
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o640 + i as u32 % 8, "mode of {i}");
        assert_eq!(
            (m.mtime(), m.mtime_nsec()),
            (1_600_000_000 + i as i64, 1000 * i as i64),
            "mtime of {i}"
        );
    }

    // The data of a `Put`, then the end of the stream where its trailer should be.
    let dst = tempfile::tempdir().unwrap();
    let (addr, h) = serve(dst.path(), StoreOptions::default());
    let mut s = TcpStream::connect(addr).unwrap();
    read_frame(&mut s);
    let mut b = Frame::Hello {
        version: 4,
        auth: false,
        nonce: [0; 32],
    }
    .to_bytes();
    b.extend(
        Frame::Put {
            name: "t".into(),
            size: 100,
            mode: 0o644,
            mtime_s: 0,
            mtime_ns: 0,
            verify: true,
        }
        .to_bytes(),
    );
    b.extend_from_slice(pattern(5, 100));
    s.write_all(&b).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let e = h.join().unwrap().unwrap_err();
    assert!(e.to_string().contains("trailer"), "{e}");
    assert!(!dst.path().join("t").exists());
}

/// A receiver speaking `version` that answers each `File` with `Ready` at once but each
/// `Ack` only once the sender has sent nothing for a while (300 ms): returns the most files
/// the sender had sent whose `Ack` it had not yet had, and the files received, each checked
/// against its trailer's hash.
fn slow_acking_peer(l: TcpListener, version: u16) -> (usize, usize) {
    let (mut s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(
        &Frame::Hello {
            version,
            auth: false,
            nonce: [1; 32],
        }
        .to_bytes(),
    )
    .unwrap();
    let Frame::Hello {
        version: chosen, ..
    } = read_frame(&mut s)
    else {
        panic!("hello first")
    };
    assert_eq!(chosen, version);
    assert_eq!(read_frame(&mut s), Frame::Open { streams: 1 });
    s.write_all(&Frame::Session { id: [3; 16] }.to_bytes())
        .unwrap();
    let mut owed: std::collections::VecDeque<u64> = Default::default();
    let (mut most, mut files) = (0, 0);
    loop {
        // The first byte of the next frame, or a quiet spell: then one `Ack` is due.
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut first = [0u8; 1];
        match s.read(&mut first) {
            Ok(1) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                let bytes = owed
                    .pop_front()
                    .expect("the sender waits only for an answer");
                s.write_all(
                    &Frame::Ack {
                        code: Code::Ok,
                        bytes,
                        message: String::new(),
                    }
                    .to_bytes(),
                )
                .unwrap();
                continue;
            }
            r => panic!("{r:?}"),
        }
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut rest = [0u8; 4];
        s.read_exact(&mut rest).unwrap();
        let (ty, len) =
            Frame::check_header([first[0], rest[0], rest[1], rest[2], rest[3]]).unwrap();
        let mut p = vec![0; len];
        s.read_exact(&mut p).unwrap();
        match Frame::decode(ty, &p).unwrap() {
            Frame::File { size, .. } => {
                s.write_all(
                    &Frame::Ready {
                        offset: 0,
                        prefix: None,
                    }
                    .to_bytes(),
                )
                .unwrap();
                assert_eq!(read_frame(&mut s), Frame::Start { offset: 0 });
                let mut data = vec![0; size as usize];
                s.read_exact(&mut data).unwrap();
                let Frame::Trailer { hash: Some(h) } = read_frame(&mut s) else {
                    panic!("a verified trailer")
                };
                assert_eq!(h, *blake3::hash(&data).as_bytes(), "file {files}'s bytes");
                owed.push_back(size);
                files += 1;
                most = most.max(owed.len());
            }
            Frame::Bye => {
                assert!(owed.is_empty(), "every answer was read before the goodbye");
                s.write_all(&Frame::Bye.to_bytes()).unwrap();
                return (most, files);
            }
            other => panic!("{other:?}"),
        }
    }
}

/// Large files sent to a slow-acking receiver of `version`: returns the most files left
/// unanswered at once, after checking every file was reported delivered, in order.
fn files_ahead_with(version: u16) -> usize {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let src = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..LARGE_RUN).map(|i| format!("large{i}")).collect();
    for (i, n) in names.iter().enumerate() {
        std::fs::write(src.path().join(n), pattern(i as u64, 300_000 + i * 1000)).unwrap();
    }
    let peer = std::thread::spawn(move || slow_acking_peer(l, version));
    let mut tx = zcnet::Sender::connect(addr, &scfg()).unwrap();
    let report = send_session(
        &mut tx,
        names
            .iter()
            .map(|n| Source::File {
                path: src.path().join(n),
                name: n.clone(),
            })
            .collect(),
        &opts(DEFAULT_WINDOW, VERSION),
        &mut |_| {},
    )
    .unwrap();
    let (most, files) = peer.join().unwrap();
    assert_eq!(files, LARGE_RUN);
    let got: Vec<_> = report.files.iter().map(|f| f.name.clone()).collect();
    assert_eq!(got, names, "outcomes in sending order");
    assert!(report.files.iter().all(|f| f.result.is_ok() && f.verified));
    most
}

/// A version-6 receiver is asked for nothing new: each large file's `Ack` comes before the
/// next file is sent.
#[test]
fn a_version_6_receiver_answers_each_large_file_before_the_next() {
    assert_eq!(files_ahead_with(PIPELINED_FILES - 1), 1);
}

/// A version-7 receiver gets the next large files while it finishes one, at most
/// `FILES_AHEAD` unanswered at once.
#[test]
fn a_version_7_receiver_gets_large_files_ahead_of_their_answers_within_the_bound() {
    assert_eq!(files_ahead_with(PIPELINED_FILES), FILES_AHEAD);
}
