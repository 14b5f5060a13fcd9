//! `zcnet send` / `zcnet recv` encrypt by default (TLS 1.3, protocol version 10), as
//! processes: the receiver prints its key's fingerprint at start and keeps its identity
//! (mode 0600) in its state directory; a sender pins the key with `--fingerprint` or
//! records it on first use in its known hosts and refuses a changed one loudly, naming
//! both; `--plaintext` works only when both ends ask for it, and each end says why
//! otherwise.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, ChildStderr, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn zcnet(state: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_zcnet"));
    c.env("XDG_STATE_HOME", state)
        .env_remove("ZCNET_TOKEN")
        .env("XDG_CONFIG_HOME", state.join("no-config"));
    c
}

/// A running `zcnet recv --once` on an ephemeral loopback port: its address and the line
/// after its start-up line (the identity's, or the plaintext notice).
struct Recv {
    child: Child,
    addr: String,
    second: String,
    stderr: BufReader<ChildStderr>,
}

fn start_recv(state: &Path, dir: &Path, extra: &[&str]) -> Recv {
    let mut child = zcnet(state)
        .args(["recv", "--once", "--listen", "127.0.0.1:0", "--dir"])
        .arg(dir)
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let (mut line, mut second) = (String::new(), String::new());
    stderr.read_line(&mut line).unwrap();
    stderr.read_line(&mut second).unwrap();
    let addr = line.trim().rsplit(" on ").next().unwrap().to_string();
    Recv {
        child,
        addr,
        second,
        stderr,
    }
}

impl Recv {
    /// The fingerprint it printed.
    fn fingerprint(&self) -> String {
        let at = self.second.find("SHA256:").expect("a fingerprint");
        self.second[at..]
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    }

    /// Waits (bounded) for it to exit: success and what it printed after its first lines.
    fn finish(mut self) -> (bool, String) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            assert!(Instant::now() < deadline, "zcnet recv did not finish");
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut err = String::new();
        self.stderr.read_to_string(&mut err).unwrap();
        (status.success(), err)
    }

    /// Stops it; what it printed after its first lines.
    fn kill(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut err = String::new();
        self.stderr.read_to_string(&mut err).unwrap();
        err
    }
}

fn send(state: &Path, to: &str, path: &Path, extra: &[&str]) -> Output {
    let mut c = zcnet(state);
    c.args(["send", "--to", to]).args(extra).arg(path);
    common::run_bounded(&mut c, Duration::from_secs(60))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn data(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("data.bin");
    let bytes: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn recv_prints_its_key_and_a_pinned_send_arrives_encrypted() {
    let (state, src, dst) = (tempdir(), tempdir(), tempdir());
    let file = data(src.path());
    let r = start_recv(state.path(), dst.path(), &[]);
    let fp = r.fingerprint();
    assert!(r.second.contains("generated now"), "{}", r.second);
    let id = state.path().join("zcnet/tls-identity.pem");
    let mode = std::fs::metadata(&id).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the identity is private");
    let out = send(state.path(), &r.addr, &file, &["--fingerprint", &fp]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("encrypted (TLS 1.3) to the pinned key {fp}")),
        "{err}"
    );
    // The kTLS attempt: counted once (one stream) with the kernel's reason, at both ends.
    assert!(err.contains("fallback ktls_unavailable: 1 ops"), "{err}");
    assert!(
        err.contains("TLS records made in user space, not by the kernel: "),
        "{err}"
    );
    let (ok, log) = r.finish();
    assert!(ok);
    assert!(log.contains("fallback ktls_unavailable: 1 ops"), "{log}");
    assert!(log.contains("TLS records made in user space"), "{log}");
    assert!(std::fs::read(&file).unwrap() == std::fs::read(dst.path().join("data.bin")).unwrap());
    // The second start loads the same identity.
    let dst2 = tempdir();
    let r = start_recv(state.path(), dst2.path(), &[]);
    assert_eq!(r.fingerprint(), fp);
    assert!(r.second.contains("from "), "{}", r.second);
    r.kill();
}

#[test]
fn a_pin_that_does_not_match_is_refused_and_nothing_arrives() {
    let (state, src, dst) = (tempdir(), tempdir(), tempdir());
    let file = data(src.path());
    let r = start_recv(state.path(), dst.path(), &[]);
    let wrong = format!("SHA256:{}", "ab".repeat(32));
    let out = send(state.path(), &r.addr, &file, &["--fingerprint", &wrong]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("is not the pinned one")
            && err.contains(&wrong)
            && err.contains(&r.fingerprint()),
        "{err}"
    );
    r.kill();
    assert_eq!(std::fs::read_dir(dst.path()).unwrap().count(), 0);
}

#[test]
fn known_hosts_record_a_key_on_first_use_and_refuse_a_changed_one_loudly() {
    let (state, src, dst) = (tempdir(), tempdir(), tempdir());
    let file = data(src.path());
    let r = start_recv(state.path(), dst.path(), &[]);
    let fp = r.fingerprint();
    let out = send(state.path(), &r.addr, &file, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("first connection to"));
    assert!(r.finish().0);
    let known = state.path().join("zcnet/known_hosts");
    let line = std::fs::read_to_string(&known).unwrap();
    assert!(line.contains(&fp), "{line}");
    // Another receiver (another key) at an address known with a different key.
    let (state2, dst2) = (tempdir(), tempdir());
    let r2 = start_recv(state2.path(), dst2.path(), &[]);
    std::fs::write(&known, format!("{} {fp}\n", r2.addr)).unwrap();
    let out = send(state.path(), &r2.addr, &file, &[]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("HAS CHANGED") && err.contains(&fp) && err.contains(&r2.fingerprint()),
        "{err}"
    );
    r2.kill();
    assert_eq!(std::fs::read_dir(dst2.path()).unwrap().count(), 0);
}

#[test]
fn plaintext_only_when_both_ends_ask_for_it() {
    let (state, src) = (tempdir(), tempdir());
    let file = data(src.path());
    // A plaintext sender, an encrypting receiver.
    let dst = tempdir();
    let r = start_recv(state.path(), dst.path(), &[]);
    let out = send(state.path(), &r.addr, &file, &["--plaintext"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("this receiver requires encryption"),
        "{}",
        text(&out.stderr)
    );
    let log = r.kill();
    assert!(log.contains("it does not encrypt"), "{log}");
    assert_eq!(std::fs::read_dir(dst.path()).unwrap().count(), 0);
    // An encrypting sender, a plaintext receiver.
    let dst = tempdir();
    let r = start_recv(state.path(), dst.path(), &["--plaintext"]);
    assert!(r.second.contains("not encrypted"), "{}", r.second);
    let out = send(state.path(), &r.addr, &file, &[]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("the receiver does not encrypt"),
        "{}",
        text(&out.stderr)
    );
    let log = r.kill();
    assert!(log.contains("the sender encrypts"), "{log}");
    assert_eq!(std::fs::read_dir(dst.path()).unwrap().count(), 0);
    // Both.
    let dst = tempdir();
    let r = start_recv(state.path(), dst.path(), &["--plaintext"]);
    let out = send(state.path(), &r.addr, &file, &["--plaintext"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("not encrypted (--plaintext)"));
    assert!(r.finish().0);
    assert!(std::fs::read(&file).unwrap() == std::fs::read(dst.path().join("data.bin")).unwrap());
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}
