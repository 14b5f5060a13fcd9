//! What `zcnet send` and `zcnet recv` say about a tree when stderr is not a terminal: no
//! progress bar (no carriage returns, no terminal escapes), and a summary at each end with
//! the files, the bytes, what was skipped by kind, that end's CPU-s/GiB and the paths that
//! carried the bytes.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The binary, with its TLS identity and known hosts in cargo's scratch space (never in
/// the developer's home).
fn zcnet() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_zcnet"));
    c.env(
        "XDG_STATE_HOME",
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("state"),
    );
    c
}

fn no_bar(what: &str, text: &str) {
    assert!(
        !text.contains('\r') && !text.contains('\x1b'),
        "{what} drew a progress bar off a terminal: {text:?}"
    );
}

#[test]
fn both_ends_summarise_a_tree_and_draw_no_bar_off_a_terminal() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let root = src.path().join("tree");
    let mut bytes = 0;
    for i in 0..40 {
        let p = root.join(format!("d{}/f{i}", i % 4));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let data = zcnet_testbed::pattern::pattern(i, 3000 + i as usize * 100).to_vec();
        bytes += data.len();
        std::fs::write(&p, data).unwrap();
    }
    let fifo = root.join("d0/fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());

    let mut recv = zcnet()
        .args(["recv", "--once", "--listen", "127.0.0.1:0", "--dir"])
        .arg(dst.path())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut rerr = BufReader::new(recv.stderr.take().unwrap());
    let mut first = String::new();
    rerr.read_line(&mut first).unwrap();
    let addr = first.trim().rsplit(" on ").next().unwrap().to_string();
    let out = zcnet()
        .args(["send", "--to", &addr])
        .arg(&root)
        .output()
        .unwrap();
    let says = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{says}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while recv.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            panic!("hang guard: the receiver did not exit");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut heard = String::new();
    rerr.read_to_string(&mut heard).unwrap();

    no_bar("the sender", &says);
    no_bar("the receiver", &heard);
    // The sender: files, bytes, skipped by kind, its CPU per GiB, the paths.
    assert!(says.contains("40 file(s), 0 failed"), "{says}");
    let human = zcnet::stats::fmt_bytes(bytes as u64);
    assert!(says.contains(&format!("; {human} in ")), "{says}");
    assert!(heard.contains(&format!("; {human} in ")), "{heard}");
    assert!(says.contains("skipped 1 FIFO(s)"), "{says}");
    assert!(says.contains("CPU-s/GiB"), "{says}");
    assert!(says.contains("paths: "), "{says}");
    // The receiver prints its own: the same files, its CPU per GiB, its paths.
    assert!(heard.contains("40 file(s), 0 failed"), "{heard}");
    assert!(heard.contains("CPU-s/GiB"), "{heard}");
    assert!(heard.contains("paths: "), "{heard}");
    for i in 0..40 {
        let name = format!("tree/d{}/f{i}", i % 4);
        assert_eq!(
            std::fs::read(dst.path().join(&name)).unwrap(),
            std::fs::read(src.path().join(&name)).unwrap(),
            "{name}"
        );
    }
    assert!(!Path::new(&dst.path().join("tree/d0/fifo")).exists());
}

#[test]
fn a_tree_over_four_streams_is_one_session_with_a_summary_of_the_tree_at_each_end() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let root = src.path().join("tree");
    let mut bytes = 0;
    for i in 0..30u64 {
        let p = root.join(format!("d{}/f{i}", i % 3));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        // One file past the `Put` size, so a stream also carries a `File` by sendfile.
        let len = if i == 7 { 600_000 } else { i as usize * 211 };
        let data = zcnet_testbed::pattern::pattern(i, len).to_vec();
        bytes += data.len();
        std::fs::write(&p, data).unwrap();
    }
    let mut recv = zcnet()
        .args(["recv", "--once", "--listen", "127.0.0.1:0", "--dir"])
        .arg(dst.path())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut rerr = BufReader::new(recv.stderr.take().unwrap());
    let mut first = String::new();
    rerr.read_line(&mut first).unwrap();
    let addr = first.trim().rsplit(" on ").next().unwrap().to_string();
    let out = zcnet()
        .args(["send", "--streams", "4", "--to", &addr])
        .arg(&root)
        .output()
        .unwrap();
    let says = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{says}");
    // `--once` ends when all four streams of the one session have ended.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = recv.try_wait().unwrap() {
            break s;
        }
        if Instant::now() >= deadline {
            panic!("hang guard: the receiver did not exit");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut heard = String::new();
    rerr.read_to_string(&mut heard).unwrap();
    assert!(status.success(), "{heard}");
    assert!(says.contains("30 file(s), 0 failed"), "{says}");
    let human = zcnet::stats::fmt_bytes(bytes as u64);
    assert!(says.contains(&format!("; {human} in ")), "{says}");
    assert!(says.contains("over 4 streams, one session"), "{says}");
    assert!(
        heard.contains(&format!(
            "session over 4 streams: 30 file(s), 0 failed; {human}"
        )),
        "{heard}"
    );
    for i in 0..30 {
        let name = format!("tree/d{}/f{i}", i % 3);
        assert_eq!(
            std::fs::read(dst.path().join(&name)).unwrap(),
            std::fs::read(src.path().join(&name)).unwrap(),
            "{name}"
        );
    }
}
