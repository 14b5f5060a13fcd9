//! `zcnet send` / `zcnet recv` as processes: a directory tree and stdin end to end, and a
//! sender killed with SIGKILL in the middle of a file leaves only its partial file, which
//! `--resume` then completes; SIGTERM stops a receiver gracefully; `--once` waits for a
//! sender that completes its handshake.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStderr, Command, Stdio};
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

fn hash(p: &Path) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    std::io::copy(&mut std::fs::File::open(p).unwrap(), &mut h).unwrap();
    *h.finalize().as_bytes()
}

/// `len` bytes: a pseudo-random block of 8 MiB + 13 repeated (fast to write, and no page- or
/// MiB-aligned shift of the data matches itself).
fn write_data(p: &Path, len: usize, seed: u64) {
    let mut x = seed | 1;
    let block: Vec<u8> = (0..(8 << 20) + 13)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect();
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    let mut f = std::fs::File::create(p).unwrap();
    let mut left = len;
    while left > 0 {
        let n = left.min(block.len());
        f.write_all(&block[..n]).unwrap();
        left -= n;
    }
}

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

impl Recv {
    /// Waits (bounded) for the receiver to exit; returns success and what it printed.
    fn finish(mut self) -> (bool, String) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("zcnet recv did not finish");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut err = String::new();
        self.stderr.read_to_string(&mut err).unwrap();
        (status.success(), err)
    }
}

impl Drop for Recv {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_directory_tree_and_stdin_arrive_verified() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let root = src.path().join("tree");
    let files = [("a", 0), ("b/c", 1), ("b/d/e", 70_001), ("f", 2 << 20)];
    for (i, (name, len)) in files.iter().enumerate() {
        write_data(&root.join(name), *len, i as u64 + 1);
    }
    let recv = start_recv(dst.path(), &[]);
    let out = zcnet()
        .args(["send", "--to", &recv.addr])
        .arg(&root)
        .output()
        .unwrap();
    let says = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{says}");
    assert!(says.contains("4 file(s), 0 failed"), "summary: {says}");
    assert!(
        says.contains("CPU-s/GiB"),
        "summary has CPU per GiB: {says}"
    );
    let mut child = zcnet()
        .args([
            "send", "--quiet", "--to", &recv.addr, "--name", "piped", "-",
        ])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"through a pipe")
        .unwrap();
    assert!(child.wait().unwrap().success());
    drop(recv);
    for (name, _) in files {
        assert_eq!(
            hash(&dst.path().join("tree").join(name)),
            hash(&root.join(name)),
            "{name}"
        );
    }
    assert_eq!(
        std::fs::read(dst.path().join("piped")).unwrap(),
        b"through a pipe"
    );
}

#[test]
fn a_refused_file_fails_the_sender_with_the_reason() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    write_data(&src.path().join("x"), 10, 1);
    std::fs::write(dst.path().join("x"), b"already here").unwrap();
    let recv = start_recv(dst.path(), &["--once"]);
    let out = zcnet()
        .args(["send", "--to", &recv.addr])
        .arg(src.path().join("x"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let says = String::from_utf8_lossy(&out.stderr);
    assert!(says.contains("exists"), "{says}");
    assert_eq!(
        std::fs::read(dst.path().join("x")).unwrap(),
        b"already here"
    );
    let (ok, err) = recv.finish();
    assert!(!ok, "the receiver reports the refusal too");
    assert!(err.contains("refused"), "{err}");
}

#[test]
fn a_killed_sender_leaves_only_the_partial_and_resume_completes_it() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let f = src.path().join("big");
    write_data(&f, 1 << 30, 7);
    let final_path = dst.path().join("big");
    let partial_of = |dir: &Path| -> Option<std::path::PathBuf> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                let n = p.file_name().unwrap().to_string_lossy().to_string();
                n.starts_with("big.") && n.ends_with(".partial")
            })
    };

    let recv = start_recv(dst.path(), &["--once", "--resume"]);
    let mut sender = zcnet()
        .args(["send", "--quiet", "--to", &recv.addr])
        .arg(&f)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while partial_of(dst.path()).map_or(0, |p| std::fs::metadata(p).map_or(0, |m| m.len())) == 0 {
        if Instant::now() >= deadline {
            panic!("no data arrived"); // a hang guard, not a speed check
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    // The receiver sizes each 16 MiB step with fallocate before data arrives: give the
    // data a moment to flow, so the kill lands mid-file rather than before the first byte.
    std::thread::sleep(Duration::from_millis(300));
    sender.kill().unwrap(); // SIGKILL, mid-file
    sender.wait().unwrap();
    let (ok, err) = recv.finish();
    assert!(
        !final_path.exists(),
        "a killed sender must not leave a file that looks complete"
    );
    assert!(!ok, "the receiver reports the interrupted session");
    assert!(err.contains("big"), "the error names the file: {err}");
    let partial = partial_of(dst.path()).expect("the partial file is kept");
    let kept = std::fs::metadata(&partial).unwrap().len();
    assert!(kept < 1 << 30);

    let recv = start_recv(dst.path(), &["--once", "--resume"]);
    let out = zcnet()
        .args(["send", "--to", &recv.addr])
        .arg(&f)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (ok, err) = recv.finish();
    assert!(ok, "{err}");
    assert_eq!(hash(&final_path), hash(&f));
    assert!(!partial.exists());
}

/// Sends `sig` (`-TERM`, `-INT`) to `child` by the syscall, not the `kill` program: a
/// machine with only Rust may have no procps.
fn signal(child: &Child, sig: &str) {
    use rustix::process::{kill_process, Pid, Signal};
    let sig = match sig {
        "-TERM" => Signal::TERM,
        "-INT" => Signal::INT,
        other => panic!("no such signal here: {other}"),
    };
    let pid = Pid::from_raw(child.id() as i32).expect("a child's pid");
    kill_process(pid, sig).expect("kill");
}

fn partials(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".partial"))
        .collect()
}

#[test]
fn sigterm_lets_a_transfer_in_flight_finish_then_exits_0() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let f = src.path().join("f");
    write_data(&f, 256 << 20, 3);
    let recv = start_recv(dst.path(), &["--grace", "60s"]);
    let sender = zcnet()
        .args(["send", "--quiet", "--to", &recv.addr])
        .arg(&f)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while partials(dst.path()).is_empty() && !dst.path().join("f").exists() {
        if Instant::now() >= deadline {
            panic!("hang guard: the transfer never started");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    signal(&recv.child, "-TERM");
    let out = sender.wait_with_output().unwrap();
    assert!(out.status.success(), "the sender in flight finished");
    let (ok, err) = recv.finish();
    assert!(ok, "exit 0 after a graceful stop: {err}");
    assert!(err.contains("stopping"), "{err}");
    assert_eq!(hash(&dst.path().join("f")), hash(&f));
    assert!(partials(dst.path()).is_empty());
}

#[test]
fn sigint_stops_an_idle_receiver_at_once() {
    let dst = tempfile::tempdir().unwrap();
    // A grace period longer than `finish`'s 60 s hang guard: only a receiver that stops
    // at once, without waiting out the grace, gets through.
    let recv = start_recv(dst.path(), &["--grace", "120"]);
    signal(&recv.child, "-INT");
    let (ok, err) = recv.finish();
    assert!(ok, "{err}");
}

#[test]
fn once_is_not_spent_on_a_stranger_that_closes_first() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    write_data(&src.path().join("x"), 1000, 1);
    let recv = start_recv(dst.path(), &["--once"]);
    drop(std::net::TcpStream::connect(&recv.addr).unwrap());
    let out = zcnet()
        .args(["send", "--quiet", "--to", &recv.addr])
        .arg(src.path().join("x"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (ok, err) = recv.finish();
    assert!(ok, "{err}");
    assert_eq!(hash(&dst.path().join("x")), hash(&src.path().join("x")));
}

/// With its descriptors used up by stalled peers, `accept` fails with `EMFILE`: the receiver
/// refuses those peers (or drops the oldest handshakes) and keeps serving, and once the
/// stalled peers are gone a real sender gets through.
#[cfg_attr(
    not(zcnet_has_prlimit),
    ignore = "needs prlimit (apt-get install util-linux)"
)]
#[test]
fn out_of_descriptors_refuses_peers_and_keeps_serving() {
    use socket2::{Domain, SockAddr, Socket, Type};
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    write_data(&src.path().join("x"), 100_000, 1);
    let mut child = Command::new("prlimit")
        .args(["--nofile=40:40", "--"])
        .arg(env!("CARGO_BIN_EXE_zcnet"))
        .args(["recv", "--listen", "127.0.0.1:0", "--max-pending", "1000"])
        .args(["--handshake-timeout", "2s", "--dir"])
        .arg(dst.path())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let addr: std::net::SocketAddr = line.trim().rsplit(" on ").next().unwrap().parse().unwrap();
    let mut recv = Recv {
        child,
        addr: addr.to_string(),
        stderr,
    };
    let stalled: Vec<std::net::TcpStream> = (0..80)
        .map(|i| {
            let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
            let from: std::net::IpAddr = format!("127.0.3.{}", 1 + i).parse().unwrap();
            s.bind(&SockAddr::from(std::net::SocketAddr::new(from, 0)))
                .unwrap();
            s.connect(&SockAddr::from(addr)).unwrap();
            s.into()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        recv.child.try_wait().unwrap().is_none(),
        "the receiver must survive running out of descriptors"
    );
    drop(stalled);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = zcnet()
            .args(["send", "--quiet", "--to", &recv.addr])
            .arg(src.path().join("x"))
            .output()
            .unwrap();
        if out.status.success() {
            break;
        }
        if Instant::now() >= deadline {
            // a hang guard, not a speed check
            panic!("{}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(hash(&dst.path().join("x")), hash(&src.path().join("x")));
    signal(&recv.child, "-TERM");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = recv.child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() >= deadline {
            panic!("hang guard: the wait did not end");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    recv.stderr.read_to_string(&mut err).unwrap();
    assert!(status.success(), "{err}");
    assert!(err.contains("out of file descriptors"), "{err}");
}

/// A name with terminal escapes reaches neither side's terminal raw, and "verified" is said
/// only when a hash was checked.
#[test]
fn names_are_printed_escaped_and_verified_only_when_checked() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let evil = "a\u{1b}]0;pwned\u{7}\u{1b}[2Jb";
    write_data(&src.path().join(evil), 100, 1);
    write_data(&src.path().join("plain"), 100, 2);
    let recv = start_recv(dst.path(), &[]);
    let out = zcnet()
        .args(["send", "--to", &recv.addr])
        .arg(src.path().join(evil))
        .output()
        .unwrap();
    assert!(out.status.success());
    let sent = String::from_utf8_lossy(&out.stderr).to_string();
    let out = zcnet()
        .args(["send", "--no-verify", "--to", &recv.addr])
        .arg(src.path().join("plain"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let unverified = String::from_utf8_lossy(&out.stderr).to_string();
    signal(&recv.child, "-TERM");
    let (ok, got) = recv.finish();
    assert!(ok, "{got}");
    for log in [&sent, &got] {
        assert!(!log.contains('\u{1b}') && !log.contains('\u{7}'), "{log:?}");
        assert!(log.contains("a\\u{1b}]0;pwned"), "{log:?}");
    }
    assert!(
        sent.contains("verified") && !sent.contains("not verified"),
        "{sent}"
    );
    assert!(unverified.contains("not verified"), "{unverified}");
    assert!(got.contains("not verified"), "{got}");
    assert_eq!(
        std::fs::read(dst.path().join(evil)).unwrap(),
        std::fs::read(src.path().join(evil)).unwrap()
    );
}

/// A thread that cannot be started (here: the pids cgroup at its limit) refuses that one
/// sender with the reason, and the receiver serves the next once threads are available.
#[cfg_attr(
    not(zcnet_has_cgroup_pids),
    ignore = "needs root and a cgroup-v1 pids hierarchy (/sys/fs/cgroup/pids)"
)]
#[test]
fn a_failed_thread_spawn_refuses_one_sender_and_keeps_serving() {
    let root = Path::new("/sys/fs/cgroup/pids");
    let cg = root.join(format!("zcnet-test-{}", std::process::id()));
    std::fs::create_dir(&cg).expect("a cgroup in the pids hierarchy the build found, as root");
    struct Remove(std::path::PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            // Empty once the receiver has exited (it is killed before this runs).
            for _ in 0..100 {
                if std::fs::remove_dir(&self.0).is_ok() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    let _rm = Remove(cg.clone());
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    write_data(&src.path().join("x"), 1000, 1);
    let recv = start_recv(dst.path(), &[]);
    let pid = recv.child.id();
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count();
    std::fs::write(cg.join("pids.max"), threads.to_string()).unwrap();
    std::fs::write(cg.join("cgroup.procs"), pid.to_string()).unwrap();
    let out = zcnet()
        .args(["send", "--to", &recv.addr])
        .arg(src.path().join("x"))
        .output()
        .unwrap();
    let says = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{says}");
    assert!(says.contains("cannot start a session"), "{says}");
    assert!(!dst.path().join("x").exists());
    std::fs::write(cg.join("pids.max"), "max").unwrap();
    let out = zcnet()
        .args(["send", "--to", &recv.addr])
        .arg(src.path().join("x"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(hash(&dst.path().join("x")), hash(&src.path().join("x")));
    signal(&recv.child, "-TERM");
    let (ok, err) = recv.finish();
    assert!(ok, "{err}");
    assert!(err.contains("starting a session thread"), "{err}");
}

/// A tree with a FIFO, a symlink inside it and one out of it, an empty directory and a hard
/// link: the sender never blocks on the FIFO, says what it skipped and that the hard link
/// went as a copy; the receiver gets the files (hash-compared), the link and the directory.
#[test]
fn a_tree_with_special_files_links_and_an_empty_directory() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let root = src.path().join("tree");
    write_data(&root.join("a"), 5000, 1);
    std::fs::hard_link(root.join("a"), root.join("a2")).unwrap();
    std::fs::create_dir_all(root.join("empty/inner")).unwrap();
    std::os::unix::fs::symlink("a", root.join("in")).unwrap();
    std::os::unix::fs::symlink("../../x", root.join("out")).unwrap();
    let st = Command::new("mkfifo")
        .arg(root.join("pipe"))
        .status()
        .unwrap();
    assert!(st.success());
    let recv = start_recv(dst.path(), &[]);
    let out = zcnet()
        .args(["send", "--to", &recv.addr])
        .arg(&root)
        .output()
        .unwrap();
    let says = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{says}");
    assert!(
        says.contains("skipped 1 FIFO(s), 1 symlink(s) pointing outside the tree"),
        "{says}"
    );
    assert!(
        says.contains("1 hard link(s) sent as separate copies"),
        "{says}"
    );
    assert!(
        says.contains("pipe: a FIFO (named pipe), not opened"),
        "{says}"
    );
    drop(recv);
    let got = dst.path().join("tree");
    assert_eq!(hash(&got.join("a")), hash(&root.join("a")));
    assert_eq!(hash(&got.join("a2")), hash(&root.join("a")));
    assert_eq!(std::fs::read_link(got.join("in")).unwrap(), Path::new("a"));
    assert!(std::fs::metadata(got.join("empty/inner")).unwrap().is_dir());
    for absent in ["out", "pipe"] {
        assert!(
            std::fs::symlink_metadata(got.join(absent)).is_err(),
            "{absent}"
        );
    }
}
