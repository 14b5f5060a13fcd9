//! What the tests that run a python script under the library share.

// Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Asserts python3 has `modules` (as an `import` line names them), for a test marked
/// ignored without `zcnet_has_python3`: the build found python3, so a module it lacks is a
/// failure, with why, never a pass that ran nothing.
pub fn require_python3(modules: &str) {
    let ok = Command::new("python3")
        .arg("-c")
        .arg(format!("import {modules}"))
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "python3, which the build found, cannot import {modules}"
    );
}

/// Asserts the stats `line` names a write-protection engine: the automatic choice falls back
/// from userfaultfd to mprotect, which needs only /proc/self/pagemap, so a zero-copy sender
/// always has one.
pub fn assert_engine(line: &Value) {
    assert!(
        !line["engine"].is_null(),
        "no write-protection engine in the process: {line}"
    );
}

/// `target/<profile>/deps/libzcnet_preload.so`: cargo builds the library (cdylib and rlib
/// in one go) before the tests, beside the test binary.
pub fn library() -> PathBuf {
    let lib = std::env::current_exe()
        .unwrap()
        .with_file_name("libzcnet_preload.so");
    assert!(lib.is_file(), "{} not built", lib.display());
    lib
}

/// Runs `tests/<script>` under the library in `auto`, loopback treated as any peer
/// (`ZCNET_LOCAL_ZEROCOPY=1`), with `dir` as its cache directory and its stats appended to
/// `dir/stats.jsonl`; asserts it succeeded and printed `ok`, and returns its stats line.
pub fn run_auto(script: &str, dir: &Path, ok: &str) -> Value {
    run_in_mode(script, &[], "auto", dir, ok)
}

/// [`run_auto`] with the script's arguments `args` and the transmit mode `mode`
/// (`ZCNET_TX`).
pub fn run_in_mode(script: &str, args: &[&str], mode: &str, dir: &Path, ok: &str) -> Value {
    let stats = dir.join("stats.jsonl");
    let out = Command::new("python3")
        .arg(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests")
                .join(script),
        )
        .args(args)
        .env("LD_PRELOAD", library())
        .env("ZCNET_TX", mode)
        .env("ZCNET_LOCAL_ZEROCOPY", "1")
        .env("ZCNET_PROFILE_DIR", dir)
        .env("ZCNET_STATS", &stats)
        .output()
        .expect("running python3");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains(ok),
        "{mode}: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let all = std::fs::read_to_string(stats).unwrap();
    serde_json::from_str(all.lines().last().expect("a stats line")).unwrap()
}
