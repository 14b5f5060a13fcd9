//! A route found copying is remembered per process: `route_copies.py` (beside this file)
//! sends 64 MiB twice (an 8 MiB buffer in huge pages, eight times), on two connections in turn to one peer, under `auto` with loopback
//! treated as any peer (`ZCNET_LOCAL_ZEROCOPY=1`: the kernel still copies every zero-copy
//! byte at delivery there, as over veth). The first connection goes zero-copy until its
//! COPIED completions demote it; the second must send nothing zero-copy, every byte
//! counted as `route_copies` — pinned by the stats' counts, not by time.

use serde_json::Value;
use std::path::Path;
use std::process::Command;

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
    let out = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/route_copies.py"))
        .env("LD_PRELOAD", &lib)
        .env("ZCNET_TX", "auto")
        .env("ZCNET_LOCAL_ZEROCOPY", "1")
        .env("ZCNET_STATS", &stats)
        .output()
        .expect("running python3");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("ok both connections verified"),
        "{}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let line: Value = serde_json::from_str(
        std::fs::read_to_string(&stats)
            .unwrap()
            .lines()
            .next()
            .expect("a stats line"),
    )
    .unwrap();
    if line["engine"].is_null() {
        eprintln!("SKIP: no write-protection engine in this process");
        return;
    }
    let sent = 64u64 << 20;
    let senders: Vec<&Value> = line["sockets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| {
            s["bytes_copy"].as_u64().unwrap_or(0) + s["bytes_zerocopy"].as_u64().unwrap_or(0)
                == sent
        })
        .collect();
    assert_eq!(senders.len(), 2, "two sending sockets: {}", line["sockets"]);
    let fallback = |s: &Value, r: &str| s["fallback_bytes"][r].as_u64().unwrap_or(0);
    if fallback(senders[0], "protect_costlier") == sent {
        eprintln!(
            "SKIP: protection costs more than the copy here ({}), nothing went zero-copy",
            line["page_cost_ns"]
        );
        return;
    }
    let (first, second) = (senders[0], senders[1]);
    assert!(
        first["bytes_zerocopy"].as_u64() > Some(0) && fallback(first, "demoted_copied") > 0,
        "the first connection sent zero-copy until COPIED demoted it: {first}"
    );
    assert_eq!(second["bytes_zerocopy"].as_u64(), Some(0), "{second}");
    assert_eq!(fallback(second, "route_copies"), sent, "{second}");
}
