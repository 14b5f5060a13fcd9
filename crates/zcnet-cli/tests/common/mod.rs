//! What the CLI's integration tests share: the built binary, run with a bound.
#![allow(dead_code)] // each test crate uses its own subset

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `zcnet` binary under test.
pub fn zcnet() -> Command {
    Command::new(env!("CARGO_BIN_EXE_zcnet"))
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
