//! A route found copying is remembered, in the process and for the later ones of this boot:
//! `route_copies.py` (beside this file) sends 64 MiB twice (an 8 MiB buffer in huge pages,
//! eight times), on two connections in turn to one peer, under `auto` with loopback
//! treated as any peer (`ZCNET_LOCAL_ZEROCOPY=1`: the kernel still copies every zero-copy
//! byte at delivery there, as over veth). The first connection goes zero-copy until its
//! COPIED completions demote it; the second must send nothing zero-copy, every byte
//! counted as `route_copies`. Then a second process, with the same cache directory, must
//! send nothing zero-copy on either connection, and never start the protection engine
//! (whose fault-handling thread would be its one extra thread) nor need the page costs —
//! pinned by the stats' counts, not by time.

use serde_json::Value;
use std::path::Path;
use std::process::Command;

const SENT: u64 = 64 << 20;

/// Runs the script under the library with `dir` as its cache directory; its stats line.
fn run(lib: &Path, dir: &Path, stats: &Path) -> Value {
    let out = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/route_copies.py"))
        .env("LD_PRELOAD", lib)
        .env("ZCNET_TX", "auto")
        .env("ZCNET_LOCAL_ZEROCOPY", "1")
        .env("ZCNET_PROFILE_DIR", dir)
        .env("ZCNET_STATS", stats)
        .output()
        .expect("running python3");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("ok both connections verified"),
        "{}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let all = std::fs::read_to_string(stats).unwrap();
    serde_json::from_str(all.lines().last().expect("a stats line")).unwrap()
}

/// The sockets of a stats line that sent the script's 64 MiB.
fn senders(line: &Value) -> Vec<&Value> {
    line["sockets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| {
            s["bytes_copy"].as_u64().unwrap_or(0) + s["bytes_zerocopy"].as_u64().unwrap_or(0)
                == SENT
        })
        .collect()
}

fn fallback(s: &Value, r: &str) -> u64 {
    s["fallback_bytes"][r].as_u64().unwrap_or(0)
}

#[test]
fn a_second_connection_to_a_peer_found_copying_copies_from_its_first_send() {
    if Command::new("python3")
        .arg("-c")
        .arg("import mmap")
        .status()
        .map_or(true, |s| !s.success())
    {
        eprintln!("SKIP: python3 is not installed");
        return;
    }
    let lib = std::env::current_exe()
        .unwrap()
        .with_file_name("libzcnet_preload.so");
    assert!(lib.is_file(), "{} not built", lib.display());
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("stats.jsonl");
    let line = run(&lib, dir.path(), &stats);
    if line["engine"].is_null() {
        eprintln!("SKIP: no write-protection engine in this process");
        return;
    }
    let sent = SENT;
    let senders1 = senders(&line);
    assert_eq!(
        senders1.len(),
        2,
        "two sending sockets: {}",
        line["sockets"]
    );
    if fallback(senders1[0], "protect_costlier") == sent {
        eprintln!(
            "SKIP: protection costs more than the copy here ({}), nothing went zero-copy",
            line["page_cost_ns"]
        );
        return;
    }
    let (first, second) = (senders1[0], senders1[1]);
    assert!(
        first["bytes_zerocopy"].as_u64() > Some(0) && fallback(first, "demoted_copied") > 0,
        "the first connection sent zero-copy until COPIED demoted it: {first}"
    );
    assert_eq!(second["bytes_zerocopy"].as_u64(), Some(0), "{second}");
    assert_eq!(fallback(second, "route_copies"), sent, "{second}");

    let later = run(&lib, dir.path(), &stats);
    let senders2 = senders(&later);
    assert_eq!(
        senders2.len(),
        2,
        "two sending sockets: {}",
        later["sockets"]
    );
    for s in senders2 {
        assert_eq!(s["bytes_zerocopy"].as_u64(), Some(0), "{s}");
        assert_eq!(fallback(s, "route_copies"), sent, "{s}");
    }
    assert!(later["engine"].is_null(), "no engine: {}", later["engine"]);
    assert!(later["page_cost_ns"].is_null(), "{}", later["page_cost_ns"]);
}
