//! Only regular files are opened for data. A local user who can write into the receive
//! directory plants FIFOs under the names a `--resume` receiver will open — a partial file's
//! name is computable from the sender's address, and a final name is the sender's — and the
//! session neither hangs in `open` nor takes the FIFO for a file: a FIFO under a partial
//! file's name is passed over (the file arrives whole, every byte checked), one under a
//! final name is refused with a reason naming it. Each session must end within a bound; a
//! receiver that opened a FIFO without `O_NONBLOCK` waited in `open` for ever.

mod common;

use common::{once_cfg, send_as, serve_once};
use rustix::fs::{FileType, Mode};
use std::net::TcpListener;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use zcnet_testbed::pattern::pattern;
use zcnet_transfer::store::{SenderId, Store, StoreOptions};
use zcnet_transfer::streams::StreamsReport;
use zcnet_transfer::wire::{Code, VERSION};

/// How long a session may take here before it counts as hung (a hang guard, not a speed
/// check: each moves about a megabyte on loopback).
const HANG: Duration = Duration::from_secs(20);

/// The owner tag in the partial file names of a sender from 127.0.0.1 without a token.
fn loopback_owner(dir: &Path) -> String {
    let sender = SenderId {
        address: Some("127.0.0.1".parse().unwrap()),
        token: None,
    };
    Store::open_for(dir, StoreOptions::default(), None, &sender)
        .unwrap()
        .owner()
        .to_string()
}

fn mkfifo(p: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p,
        FileType::Fifo,
        Mode::from_raw_mode(0o666),
        0,
    )
    .unwrap();
}

fn is_fifo(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(p)
        .map(|m| m.file_type().is_fifo())
        .unwrap_or(false)
}

/// A small file (a `Put`), a 1 MiB file (a `File`) and a third one, in `src/tree`.
fn tree(src: &Path) -> std::path::PathBuf {
    let t = src.join("tree");
    std::fs::create_dir_all(&t).unwrap();
    std::fs::write(t.join("f"), pattern(1, 1000)).unwrap();
    std::fs::write(t.join("g"), pattern(2, 1 << 20)).unwrap();
    std::fs::write(t.join("h"), pattern(3, 5000)).unwrap();
    t
}

/// Serves one session with `--resume` into `dst` and sends `tree` to it, on threads of
/// their own; the sender's report, and how long it took, or a panic past [`HANG`].
fn session(dst: &Path, tree: &Path) -> (StreamsReport, Duration) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut cfg = once_cfg();
    cfg.store.resume = true;
    let t0 = Instant::now();
    let served = serve_once(listener, dst, cfg);
    let (tx, rx) = mpsc::channel();
    let src = tree.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(send_as(addr, &src, 1, VERSION));
    });
    let sent = match rx.recv_timeout(HANG) {
        Ok(r) => r.expect("the session itself runs"),
        Err(_) => panic!(
            "the session hung for {HANG:?}: the receiver is stuck opening a FIFO (threads left behind)"
        ),
    };
    let took = t0.elapsed();
    served.join().unwrap();
    (sent, took)
}

fn bytes_match(dst: &Path, src: &Path, name: &str) {
    assert_eq!(
        std::fs::read(dst.join("tree").join(name)).unwrap(),
        std::fs::read(src.join(name)).unwrap(),
        "{name}"
    );
}

#[test]
fn fifos_under_partial_names_are_passed_over_and_the_files_arrive() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let t = tree(src.path());
    let o = loopback_owner(dst.path());
    std::fs::create_dir(dst.path().join("tree")).unwrap();
    // A `Put`'s partial (16 hex digits, swept at start with --resume) and a resumable
    // `File`'s (8 hex digits, looked for when `g` starts).
    let put_fifo = dst
        .path()
        .join(format!("tree/f.{o}.0123456789abcdef.partial"));
    let file_fifo = dst.path().join(format!("tree/g.{o}.01234567.partial"));
    mkfifo(&put_fifo);
    mkfifo(&file_fifo);
    let (sent, took) = session(dst.path(), &t);
    eprintln!("FIFOs under partial names: session over in {took:?}");
    assert_eq!(sent.report.failures(), 0, "{:?}", sent.report.files);
    for n in ["f", "g", "h"] {
        bytes_match(dst.path(), &t, n);
    }
    assert!(
        is_fifo(&put_fifo) && is_fifo(&file_fifo),
        "left as they were"
    );
}

#[test]
fn fifos_under_final_names_are_refused_with_the_reason_and_the_rest_arrives() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let t = tree(src.path());
    std::fs::create_dir(dst.path().join("tree")).unwrap();
    // `f` comes as a `Put` (with --resume, an identical final file is looked for first),
    // `g` as a `File`.
    mkfifo(&dst.path().join("tree/f"));
    mkfifo(&dst.path().join("tree/g"));
    let (sent, took) = session(dst.path(), &t);
    eprintln!("FIFOs under final names: session over in {took:?}");
    let by_name = |n: &str| {
        sent.report
            .files
            .iter()
            .find(|f| f.name == format!("tree/{n}"))
            .unwrap_or_else(|| panic!("no report for {n}: {:?}", sent.report.files))
            .result
            .clone()
    };
    for n in ["f", "g"] {
        let (code, msg) = by_name(n).unwrap_err();
        eprintln!("tree/{n}: {code:?} {msg}");
        assert_eq!(code, Code::Exists, "{msg}");
        assert!(msg.contains("FIFO"), "the reason names it: {msg}");
        assert!(is_fifo(&dst.path().join("tree").join(n)));
    }
    by_name("h").unwrap();
    bytes_match(dst.path(), &t, "h");
    let left: Vec<_> = std::fs::read_dir(dst.path().join("tree"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".partial"))
        .collect();
    assert!(left.is_empty(), "no partial left behind: {left:?}");
}
