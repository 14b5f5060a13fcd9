//! The stats lines add up to what the program sent — no more — however it makes children:
//! `fork_exec_stats.py` (beside this file) sends on its own connection, starts children
//! through `subprocess` (`vfork` + `execve`: the child runs in the parent's memory until its
//! `exec`), through `fork` + `execv`, and a forked child that only exits normally, some
//! sending on connections of their own and some nothing; then it sends again. A child
//! counts only what it sent itself (its counters start from zero at the `fork`), and one
//! that sent nothing writes no line: the bytes of all lines are exactly the bytes sent, in
//! one line per sending process. Before, a `vfork` child about to `exec` wrote its parent's
//! counters as its own line, and a forked child exiting normally wrote them again.

mod common;

use common::library;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// Runs the script under the library in `mode`; returns the bytes it says were sent and the
/// stats lines.
fn run(mode: &str) -> (u64, Vec<Value>) {
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("stats.jsonl");
    let out = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fork_exec_stats.py"))
        .env("LD_PRELOAD", library())
        .env("ZCNET_TX", mode)
        .env("ZCNET_PRELOAD_MIN", "65536")
        .env("ZCNET_LOCAL_ZEROCOPY", "1")
        .env("ZCNET_STATS", &stats)
        .env("ZCNET_PROFILE_DIR", dir.path())
        .output()
        .expect("running python3");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{mode}: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let sent = text
        .lines()
        .find_map(|l| l.strip_prefix("ok sent "))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{mode}: {text}"));
    let lines = std::fs::read_to_string(&stats)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("stats line is JSON"))
        .collect();
    (sent, lines)
}

fn bytes(l: &Value) -> u64 {
    let t = &l["total"];
    t["bytes_copy"].as_u64().unwrap() + t["bytes_zerocopy"].as_u64().unwrap()
}

#[cfg_attr(
    not(zcnet_has_python3),
    ignore = "needs python3 (apt-get install python3)"
)]
#[test]
fn children_that_fork_or_vfork_and_exec_count_only_their_own_sends() {
    common::require_python3("socket, subprocess, threading");
    for mode in ["copy", "zerocopy", "auto"] {
        let (sent, lines) = run(mode);
        let each: Vec<(u64, u64)> = lines
            .iter()
            .map(|l| (l["pid"].as_u64().unwrap(), bytes(l)))
            .collect();
        assert_eq!(
            each.iter().map(|(_, b)| b).sum::<u64>(),
            sent,
            "{mode}: the lines add up to what was sent: {each:?}"
        );
        assert_eq!(
            lines.len(),
            3,
            "{mode}: one line per sending process, none for the others: {each:?}"
        );
        let mut pids: Vec<u64> = each.iter().map(|(p, _)| *p).collect();
        pids.dedup();
        assert_eq!(pids.len(), 3, "{mode}: {each:?}");
    }
}
