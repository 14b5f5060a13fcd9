//! `zcnet bench --tx file` / `--rx file` end to end: the built binary sends from a
//! page-cache file with `sendfile` and splices into a file, and the report counts those
//! bytes as file bytes at both ends (what went through is checked byte for byte by the
//! library's own tests, `crates/zcnet/tests/file_paths.rs`; here the bench's accounting
//! is). The files live in `--file-dir`, unnamed, and leave nothing behind. Runs are a few
//! MiB: nothing here asserts on speed.

mod common;
use common::{run_bounded, zcnet};
use serde_json::Value;
use std::time::Duration;

const BYTES: u64 = 8 << 20;

fn runs(stdout: &[u8]) -> Vec<Value> {
    let v: Value = serde_json::from_slice(stdout).expect("stdout is one JSON value");
    v["runs"].as_array().expect("runs").clone()
}

#[test]
fn file_paths_count_every_byte_as_file_bytes_and_leave_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_bounded(
        zcnet().args([
            "bench",
            "--tx",
            "file",
            "--rx",
            "file,copy",
            "--size",
            "64K",
            "--bytes",
            "8M",
            "--repeat",
            "1",
            "--json",
            "--file-dir",
            dir.path().to_str().unwrap(),
        ]),
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let runs = runs(&out.stdout);
    assert_eq!(runs.len(), 2);
    for r in &runs {
        assert_eq!(r["tx"], "file");
        assert_eq!(r["bytes_sent"], BYTES, "{r}");
        assert_eq!(r["bytes_received"], BYTES, "{r}");
        assert_eq!(
            r["sender_stats"]["tx_bytes_file"], BYTES,
            "sent by sendfile: {r}"
        );
        assert_eq!(r["zc_fraction_tx"], 1.0);
        if r["rx"] == "file" {
            assert_eq!(r["receiver_stats"]["rx_bytes_file"], BYTES, "spliced: {r}");
        } else {
            assert!(r["receiver_stats"].get("rx_bytes_file").is_none());
        }
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "the bench's files are unnamed and gone"
    );
}

#[test]
fn cold_file_sends_count_the_same_bytes() {
    let out = run_bounded(
        zcnet().args([
            "bench", "--tx", "file", "--rx", "copy", "--size", "1M", "--bytes", "8M", "--repeat",
            "1", "--json", "--cold",
        ]),
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = &runs(&out.stdout)[0];
    assert_eq!(r["bytes_received"], BYTES);
    assert_eq!(r["sender_stats"]["tx_bytes_file"], BYTES);
}

#[test]
fn file_paths_refuse_what_they_cannot_do_by_name() {
    for (args, needle) in [
        (
            &["bench", "--rr", "--tx", "file", "--rx", "copy"][..],
            "stream paths",
        ),
        (
            &["bench", "--tx", "file", "--file-dir", "/nonexistent/zcnet"][..],
            "not a directory",
        ),
    ] {
        let out = run_bounded(zcnet().args(args), Duration::from_secs(30));
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// `--tx read_send` sends the same page-cache file by `pread` + `send`: every byte counted,
/// none of them as a file (zero-copy) byte — the yardstick `file` is measured against. It is
/// named, not swept: `--tx all` leaves it out.
#[test]
fn read_send_copies_the_same_file_and_is_not_in_all() {
    let out = run_bounded(
        zcnet().args([
            "bench",
            "--tx",
            "read_send",
            "--rx",
            "copy",
            "--size",
            "64K",
            "--bytes",
            "8M",
            "--repeat",
            "1",
            "--json",
        ]),
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let one = runs(&out.stdout);
    assert_eq!(one.len(), 1);
    let r = &one[0];
    assert_eq!(r["tx"], "read_send");
    assert_eq!(r["bytes_sent"], BYTES, "{r}");
    assert_eq!(r["bytes_received"], BYTES, "{r}");
    assert!(r["sender_stats"].get("tx_bytes_file").is_none(), "{r}");
    assert_eq!(r["sender_stats"]["tx_bytes_copy"], BYTES, "{r}");
    assert_eq!(r["zc_fraction_tx"], 0.0);
    // `all` sweeps every transmit path, file among them, but not read_send.
    let out = run_bounded(
        zcnet().args([
            "bench", "--tx", "all", "--rx", "copy", "--size", "64K", "--bytes", "1M", "--repeat",
            "1", "--json",
        ]),
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let txs: Vec<String> = runs(&out.stdout)
        .iter()
        .map(|r| r["tx"].as_str().unwrap().to_string())
        .collect();
    assert!(txs.iter().any(|t| t == "file"), "{txs:?}");
    assert!(txs.iter().all(|t| t != "read_send"), "{txs:?}");
}
