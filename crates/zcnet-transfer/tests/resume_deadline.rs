//! `--resume` hashes a final file already there (of the announced size) before it answers,
//! and that hashing honours the session's deadline: with an 8 GiB sparse file in the
//! directory and a 2-second `--session-deadline`, the session ends with the deadline error,
//! the file untouched and nothing partial left — not a thread that goes on hashing past its
//! deadline until the receiver gives up on it as stuck.
//!
//! What is asserted is the error's kind; how long the session took is printed, not
//! asserted (speed belongs to benchmarks).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};
use zcnet_transfer::session::TransferError;
use zcnet_transfer::wire::{Frame, VERSION};

mod common;
use common::{once_cfg, serve_once};

const GIB: u64 = 1 << 30;

fn read_frame(s: &mut TcpStream) -> Option<Frame> {
    let mut h = [0u8; 5];
    s.read_exact(&mut h).ok()?;
    let (ty, len) = Frame::check_header(h).ok()?;
    let mut p = vec![0; len];
    s.read_exact(&mut p).ok()?;
    Frame::decode(ty, &p).ok()
}

#[test]
fn hashing_an_existing_final_file_for_resume_stops_at_the_session_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(8 * GIB).unwrap();
    drop(f);

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut cfg = once_cfg();
    cfg.store.resume = true;
    let deadline = Duration::from_secs(2);
    cfg.session_deadline = deadline;
    let t0 = Instant::now();
    let server = serve_once(listener, dir.path(), cfg);

    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    assert!(matches!(read_frame(&mut s), Some(Frame::Hello { .. })));
    let mut bytes = Frame::Hello {
        version: VERSION,
        auth: false,
        nonce: [5; 32],
    }
    .to_bytes();
    bytes.extend(Frame::Open { streams: 1 }.to_bytes());
    bytes.extend(
        Frame::File {
            name: "big".into(),
            size: 8 * GIB,
            mode: 0o644,
            mtime_s: 1_700_000_000,
            mtime_ns: 0,
            verify: true,
        }
        .to_bytes(),
    );
    s.write_all(&bytes).unwrap();
    assert!(matches!(read_frame(&mut s), Some(Frame::Session { .. })));
    let answer = read_frame(&mut s);
    let result = server.join().unwrap();
    let took = t0.elapsed();
    println!("answer {answer:?}; session {result:?} after {took:?}");
    match result {
        Some(Err(TransferError::DeadlinePassed { .. })) => {}
        other => panic!("the session should end at its deadline, saying so: {other:?}"),
    }
    assert!(
        !matches!(answer, Some(Frame::Ready { .. })),
        "nothing offered once the deadline passed: {answer:?}"
    );
    // The final file is untouched and nothing partial is left.
    assert_eq!(std::fs::metadata(&big).unwrap().len(), 8 * GIB);
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(names, vec!["big".to_string()]);
}
