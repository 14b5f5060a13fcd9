//! What the CLI's integration tests share: the built binary, run with a bound.
#![allow(dead_code)] // each test crate uses its own subset

pub mod procfs;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `zcnet` binary under test.
/// The `zcnet` binary, blind to this machine's `auto` profiles: a developer's
/// `~/.config/zcnet` (or `$ZCNET_PROFILE`) must not change what a test runs. A test that
/// wants a profile sets `ZCNET_PROFILE` itself, after this.
pub fn zcnet() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_zcnet"));
    c.env_remove("ZCNET_PROFILE")
        .env_remove("ZCNET_PROFILE_DIR")
        .env("XDG_CONFIG_HOME", no_profiles_dir())
        .env("XDG_STATE_HOME", state_dir());
    c
}

/// The tests' `$XDG_STATE_HOME`, in cargo's scratch space: `send`/`recv` keep their TLS
/// identity and known hosts there, never in the developer's home.
pub fn state_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("state")
}

/// An empty directory standing in for `$XDG_CONFIG_HOME` (absolute, as XDG requires), in
/// cargo's scratch space for integration tests: nothing is ever written into it.
fn no_profiles_dir() -> std::path::PathBuf {
    let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-profiles");
    let _ = std::fs::create_dir_all(&d);
    d
}

/// A child's output as text (lossy: a test wants to read it, not to judge its encoding).
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The number at `path` (dot-separated keys) of a `--json` report, which must be finite:
/// a report's figures are read by scripts that choke on `NaN`.
pub fn finite(v: &serde_json::Value, path: &str) -> f64 {
    let mut cur = v;
    for k in path.split('.') {
        cur = &cur[k];
    }
    let x = cur
        .as_f64()
        .unwrap_or_else(|| panic!("{path} is not a number: {cur}"));
    assert!(x.is_finite(), "{path} = {x} is not finite");
    x
}

/// Asserts network namespaces can be made here, for a test marked ignored without
/// `zcnet_netns`: the build found root and `ip`, so a host that cannot is a failure, with why.
pub fn require_netns() {
    if let Err(why) = zcnet_testbed::netns::available() {
        panic!("network namespaces unavailable, though the build found root and `ip`: {why}");
    }
}

/// Runs to completion, bounded: a hung bench fails the test instead of hanging it.
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn zcnet");
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "zcnet did not finish within {limit:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `zcnet bench --server` child on 127.0.0.1 and the address it announced.
pub struct Server {
    child: Child,
    pub addr: String,
}

impl Server {
    /// Starts `zcnet bench --server --bind 127.0.0.1:0 EXTRA…` and reads its address.
    pub fn start(extra: &[&str]) -> Server {
        let mut child = zcnet()
            .args(["bench", "--server", "--bind", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("server announces its address");
        let addr = line
            .split_whitespace()
            .find(|w| w.starts_with("127.0.0.1:"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_string();
        Server { child, addr }
    }

    /// The server's process id, for `/proc` and `prlimit`.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Takes the server's stderr, to read its log as it comes.
    pub fn take_stderr(&mut self) -> std::process::ChildStderr {
        self.child.stderr.take().expect("stderr taken once")
    }

    /// Waits (bounded) for a `--once` server to exit; returns its success and stderr.
    pub fn finish(mut self) -> (bool, String) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() >= deadline {
                panic!("server did not exit"); // a hang guard, not a speed check
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (status.success(), err)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The most failed `accept`s a server that backs off at its descriptor limit reports in a
/// two-second window: waiting 10 ms, doubling to 1 s, it tries at most 9 times in its first
/// 2.3 s (10+20+…+640+1000 ms of waits) — fewer, never more, on a loaded machine, whose
/// sleeps only run long. A count, not a clock. Without the back-off it tries as fast as
/// `poll` and `accept` return: hundreds of thousands of times a second.
pub const BACKED_OFF_FAILURES: u64 = 16;

/// How many failed `accept`s the server's log lines report: each `accept:` line is one, plus
/// the "(N more like it … not shown)" its one-line-a-second limit left out before it.
pub fn accept_failures(lines: &[&str]) -> u64 {
    lines
        .iter()
        .filter(|l| l.contains("accept:"))
        .map(|l| {
            let left_out = l
                .split_once(" more like it")
                .and_then(|(head, _)| head.rsplit_once('(').map(|(_, n)| n))
                .map(|n| n.parse::<u64>().expect("the count of lines left out"))
                .unwrap_or(0);
            1 + left_out
        })
        .sum()
}
