//! A test run again as an ordinary user runs it: under a small `RLIMIT_MEMLOCK` and without
//! `CAP_IPC_LOCK`.
//!
//! Why: io_uring registrations and `SEND_ZC` requests are charged to `RLIMIT_MEMLOCK` only
//! for a process without `CAP_IPC_LOCK`; as root they never are, so a test of what happens
//! past the limit must run itself again with the capability dropped (`setpriv`) and the
//! limit set (`prlimit`). The child is the same test binary running the one test, told by
//! an environment variable that it is the child.

use std::path::PathBuf;
use std::process::Command;

/// Whether this process holds `CAP_IPC_LOCK` in its effective set (root does, an ordinary
/// user does not): with it, nothing it locks or registers is charged to `RLIMIT_MEMLOCK`.
pub fn has_cap_ipc_lock() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").expect("reading /proc/self/status");
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .expect("CapEff in /proc/self/status");
    eff & (1 << 14) != 0
}

/// Runs the test `name` of the current test binary alone, under
/// `prlimit --memlock=limit_bytes:limit_bytes` and — where this process holds
/// `CAP_IPC_LOCK` — `setpriv` dropping it, with the environment variable `child_env` set to
/// `1`. Panics, with the child's output, unless it exited successfully and the test
/// harness reports the one test run and passed (`--exact` with a name that matched nothing
/// would pass too, having run nothing); returns its output.
///
/// The caller's test is `#[cfg_attr(not(...), ignore = ...)]` on the build script's
/// `zcnet_has_prlimit` (and `zcnet_has_setpriv` as root) probes, so finding neither here is
/// a failure, not a skip.
pub fn rerun_limited(limit_bytes: u64, name: &str, child_env: &str) -> String {
    let mut cmd = Command::new(which("prlimit").expect("prlimit, which the build found"));
    cmd.arg(format!("--memlock={limit_bytes}:{limit_bytes}"));
    if has_cap_ipc_lock() {
        cmd.arg(which("setpriv").expect("setpriv, which the build found"))
            .args(["--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock", "--"]);
    }
    let out = cmd
        .arg(std::env::current_exe().expect("the test binary's path"))
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(child_env, "1")
        .output()
        .expect("running prlimit");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(
        text.contains("test result: ok. 1 passed"),
        "the child did not run the test:\n{text}"
    );
    text
}

/// `name` in the first directory on `PATH` that has it, as the build script's probe looks.
fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}
