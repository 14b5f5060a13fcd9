//! `--grace` and `--session-deadline` hold for a session whose thread does not end when its
//! socket is shut down. Such a thread is made here the way a sender can: with `--resume`, a
//! final file already under the sent name with the announced length is hashed whole before
//! the sender is answered, and a sparse 4 TiB file takes that thread many minutes of `pread`
//! and BLAKE3, never looking at the socket. A receiver that waited for its sessions' threads
//! could be stopped only by `SIGKILL`, and an address whose sessions were stuck past their
//! deadline stayed locked out. Now the process exits about a second after the grace, saying
//! why (the grace does not stop the hashing: the thread is left behind). The hashing looks
//! at the session's deadline between reads, so past `--session-deadline` the session ends
//! by itself with the deadline error and its address is free (a thread stuck in a system
//! call would stop counting against it a second after the deadline). Nothing it touched is
//! presented as final: the file under the name is the one that was there.

mod common;

use common::{run_bounded, zcnet};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, ChildStderr, Stdio};
use std::time::{Duration, Instant};

/// A sparse file of this size takes a thread minutes to hash.
const HUGE: u64 = 4 << 40;

/// A running `zcnet recv` on an ephemeral loopback port, found from its start-up line.
struct Recv {
    child: Child,
    addr: String,
    stderr: BufReader<ChildStderr>,
}

fn start_recv(dir: &Path, extra: &[&str]) -> Recv {
    let mut child = zcnet()
        .args(["recv", "--listen", "127.0.0.1:0", "--dir"])
        .arg(dir)
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .rsplit(" on ")
        .next()
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    Recv {
        child,
        addr,
        stderr,
    }
}

impl Drop for Recv {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `src/big` and `dst/big`: the same sparse [`HUGE`] bytes (all holes), so a `--resume`
/// receiver hashes its copy before it answers.
fn huge_pair(src: &Path, dst: &Path) {
    for d in [src, dst] {
        let f = std::fs::File::create(d.join("big")).unwrap();
        f.set_len(HUGE).unwrap();
    }
}

/// Bytes the process has read (`/proc/PID/io`, `rchar`).
fn read_bytes(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Starts `zcnet send --streams 1 src/big` to the receiver and waits until the receiver is
/// hashing its copy (it has read 64 MiB), or has exited.
fn start_stuck_session(recv: &mut Recv, src: &Path) -> Child {
    let sender = zcnet()
        .args(["send", "--quiet", "--streams", "1", "--to", &recv.addr])
        .arg(src.join("big"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while read_bytes(recv.child.id()) < 64 << 20 && recv.child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "hang guard: the receiver never started hashing its copy"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    sender
}

fn only_big_unchanged(dst: &Path) {
    let names: Vec<String> = std::fs::read_dir(dst)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "small")
        .collect();
    assert_eq!(names, ["big"], "nothing else under a final name");
    let m = std::fs::metadata(dst.join("big")).unwrap();
    assert_eq!(m.len(), HUGE);
    use std::os::unix::fs::MetadataExt;
    assert_eq!(m.blocks(), 0, "still all holes: never written");
}

#[test]
fn sigterm_ends_the_process_when_the_grace_is_over_even_with_a_stuck_session() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    huge_pair(src.path(), dst.path());
    let mut recv = start_recv(dst.path(), &["--resume", "--grace", "1s"]);
    let mut sender = start_stuck_session(&mut recv, src.path());
    let t0 = Instant::now();
    // By the syscall, not the `kill` program (a machine with only Rust may have no procps).
    let pid = rustix::process::Pid::from_raw(recv.child.id() as i32).expect("a child's pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("kill -TERM");
    // Hang guard, far past grace + settle: hashing 4 TiB takes many minutes here.
    let limit = Duration::from_secs(60);
    let status = loop {
        if let Some(st) = recv.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < limit,
            "zcnet recv still running {limit:?} after SIGTERM with --grace 1s (read {} GiB so far)",
            read_bytes(recv.child.id()) >> 30
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = t0.elapsed();
    let mut err = String::new();
    recv.stderr.read_to_string(&mut err).unwrap();
    eprintln!("exited {took:?} after SIGTERM ({status}); it said:\n{err}");
    assert!(status.success(), "a stop is not a failure: {err}");
    assert!(
        err.contains("did not end when their time was over"),
        "{err}"
    );
    let _ = sender.kill();
    let _ = sender.wait();
    only_big_unchanged(dst.path());
}

#[test]
fn a_session_stuck_past_its_deadline_no_longer_locks_its_address_out() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    huge_pair(src.path(), dst.path());
    let small = src.path().join("small");
    std::fs::write(&small, b"a legitimate sender's file, after the deadline").unwrap();
    let mut recv = start_recv(
        dst.path(),
        &[
            "--resume",
            "--session-deadline",
            "1s",
            "--max-sessions-per-addr",
            "1",
        ],
    );
    let mut sender = start_stuck_session(&mut recv, src.path());
    // Each try is refused ("already has 1 sessions") until the stuck one is past its
    // deadline by the settle time; a bound far past both.
    let t0 = Instant::now();
    let mut tries = 0;
    let out = loop {
        tries += 1;
        let out = run_bounded(
            zcnet()
                .args(["send", "--quiet", "--streams", "1", "--to", &recv.addr])
                .arg(&small),
            Duration::from_secs(30),
        );
        if out.status.success() || t0.elapsed() > Duration::from_secs(30) {
            break out;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    eprintln!(
        "the second sender: {} after {:?} and {tries} tries",
        if out.status.success() {
            "through"
        } else {
            "still refused"
        },
        t0.elapsed()
    );
    assert!(
        out.status.success(),
        "still locked out after {tries} tries: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(dst.path().join("small")).unwrap(),
        std::fs::read(&small).unwrap()
    );
    let _ = sender.kill();
    let _ = sender.wait();
    only_big_unchanged(dst.path());
}

#[test]
fn once_ends_with_the_deadline_error_when_resume_hashing_reaches_the_deadline() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    huge_pair(src.path(), dst.path());
    let mut recv = start_recv(
        dst.path(),
        &["--once", "--resume", "--session-deadline", "1s"],
    );
    let t0 = Instant::now();
    let mut sender = start_stuck_session(&mut recv, src.path());
    // Hang guard, far past deadline + settle: hashing 4 TiB takes many minutes here.
    let limit = Duration::from_secs(60);
    let status = loop {
        if let Some(st) = recv.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < limit,
            "zcnet recv --once still running {limit:?} past a 1 s session deadline"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    recv.stderr.read_to_string(&mut err).unwrap();
    eprintln!(
        "--once exited {:?} after the stuck session's sender started ({status}); it said:\n{err}",
        t0.elapsed()
    );
    assert!(!status.success(), "the one session did not complete: {err}");
    // It ended by itself at its deadline (before, its thread hashed on and was abandoned
    // as stuck a second later).
    assert!(err.contains("deadline passed"), "{err}");
    assert!(!err.contains("stuck"), "ended, not abandoned: {err}");
    let _ = sender.kill();
    let _ = sender.wait();
    only_big_unchanged(dst.path());
}
