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

mod common;

use serde_json::Value;

const SENT: u64 = 64 << 20;

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

#[cfg_attr(
    not(zcnet_has_python3),
    ignore = "needs python3 (apt-get install python3)"
)]
#[test]
fn a_second_connection_to_a_peer_found_copying_copies_from_its_first_send() {
    common::require_python3("mmap");
    let dir = tempfile::tempdir().unwrap();
    // Whether protecting a page costs less than copying it is measured on the host, and a
    // loaded machine can answer either way; this test is about the route, so the answer
    // is given (this boot's page-cost cache, as an earlier process would have left it).
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    std::fs::write(
        dir.path().join("page-cost.json"),
        serde_json::json!({"boot_id": boot.trim(), "protect_ns": 1.0, "copy_ns": 1000.0})
            .to_string(),
    )
    .unwrap();
    let run = || {
        common::run_auto(
            "route_copies.py",
            dir.path(),
            "ok both connections verified",
        )
    };
    let line = run();
    common::assert_engine(&line);
    assert_eq!(
        line["page_cost_from"], "cache",
        "the given page costs: {line}"
    );
    let sent = SENT;
    let senders1 = senders(&line);
    assert_eq!(
        senders1.len(),
        2,
        "two sending sockets: {}",
        line["sockets"]
    );
    assert_eq!(
        fallback(senders1[0], "protect_costlier"),
        0,
        "protection was given as the cheaper: {}",
        line["page_cost_ns"]
    );
    let (first, second) = (senders1[0], senders1[1]);
    assert!(
        first["bytes_zerocopy"].as_u64() > Some(0) && fallback(first, "demoted_copied") > 0,
        "the first connection sent zero-copy until COPIED demoted it: {first}"
    );
    assert_eq!(second["bytes_zerocopy"].as_u64(), Some(0), "{second}");
    assert_eq!(fallback(second, "route_copies"), sent, "{second}");

    let later = run();
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
