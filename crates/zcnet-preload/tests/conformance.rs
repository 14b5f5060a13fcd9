//! The interposed calls behave as the C library's: `conformance.py` (beside this file) runs
//! its checks — overwrite after every send, EAGAIN and short sends, EINTR under a signal
//! storm, partial `writev`, no spurious POLLERR/EPOLLERR/select readiness/SO_ERROR with
//! sends in flight, a real reset, `fork` and `close` with sends in flight, no completion of
//! one process seen by another sharing the socket after a `fork`, every datagram of a UDP
//! `sendmmsg` whole and in its boundaries, sends from a huge-page buffer, a program's own
//! `MSG_ZEROCOPY`, `close` before the peer reads — first without the library (the checks are right about the kernel), then
//! under it in every mode, forced zero-copy included. The stats each run writes must say
//! which path the bytes took.

mod common;

use common::library;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// Runs the script (under the library in `mode`, or without it) and returns the stats
/// lines written.
fn run(mode: Option<&str>) -> Vec<Value> {
    run_with(mode, &[])
}

/// [`run`] with more of the library's settings in the environment.
fn run_with(mode: Option<&str>, settings: &[(&str, &str)]) -> Vec<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance.py");
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("stats.jsonl");
    let mut cmd = Command::new("python3");
    cmd.arg(&script).env_remove("LD_PRELOAD");
    if let Some(m) = mode {
        cmd.env("LD_PRELOAD", library())
            .env("ZCNET_TX", m)
            .env("ZCNET_PRELOAD_MIN", "65536")
            .env("ZCNET_STATS", &stats)
            // This run's own page costs and routes, not those earlier runs of this boot kept.
            .env("ZCNET_PROFILE_DIR", dir.path())
            .envs(settings.iter().copied());
    }
    let out = cmd.output().expect("running python3");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "mode {mode:?}: {}\n{}\n{}",
        out.status,
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("ok ")).count(),
        14,
        "{text}"
    );
    std::fs::read_to_string(&stats)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("stats line is JSON"))
        .collect()
}

fn total(lines: &[Value], key: &str) -> u64 {
    lines
        .iter()
        .map(|l| l["total"][key].as_u64().unwrap_or(0))
        .sum()
}

#[cfg_attr(
    not(zcnet_has_python3),
    ignore = "needs python3 (apt-get install python3)"
)]
#[test]
fn interposed_calls_keep_the_c_librarys_behaviour_in_every_mode() {
    common::require_python3("ctypes, select");
    run(None);

    let gso = |lines: &[Value]| {
        let u = &lines[0]["udp_sendmmsg"];
        assert!(
            u["gso_sends"].as_u64() > Some(0) && u["forwarded_datagrams"].as_u64() > Some(0),
            "sendmmsg: runs of equal datagrams went as GSO sends, the rest as they were: {u}"
        );
    };

    let copy = run(Some("copy"));
    gso(&copy);
    assert_eq!(
        copy.len(),
        1,
        "one stats line: the child _exits, helpers never send"
    );
    assert!(total(&copy, "bytes_copy") > 100 << 20);
    assert_eq!(total(&copy, "bytes_zerocopy"), 0);

    let zc = run(Some("zerocopy"));
    common::assert_engine(&zc[0]);
    assert!(
        total(&zc, "bytes_zerocopy") > 100 << 20,
        "{:?}",
        zc[0]["total"]
    );
    assert!(
        total(&zc, "protection_faults") > 0,
        "the overwrites faulted"
    );
    assert_eq!(zc[0]["engine"]["errors"].as_u64(), Some(0));
    assert!(
        zc[0]["total"]["fallback_calls"]["forked"].as_u64() > Some(0),
        "sends on a socket shared after a fork were copied, and counted: {:?}",
        zc[0]["total"]
    );

    // Over loopback `auto` copies without measuring anything: delivery is local.
    let auto = run(Some("auto"));
    assert!(
        auto[0]["total"]["fallback_calls"]["local_delivery"].as_u64() > Some(0),
        "{:?}",
        auto[0]["total"]
    );
    assert_eq!(total(&auto, "bytes_zerocopy"), 0);
    assert!(
        auto[0]["page_cost_ns"].is_null(),
        "{}",
        auto[0]["page_cost_ns"]
    );

    // Told to treat this host as any peer, it chooses by the measured costs.
    let auto = run_with(Some("auto"), &[("ZCNET_LOCAL_ZEROCOPY", "1")]);
    assert_eq!(
        auto[0]["total"]["fallback_calls"]["local_delivery"]
            .as_u64()
            .unwrap_or(0),
        0
    );
    let cost = &auto[0]["page_cost_ns"];
    if let (Some(p), Some(c)) = (cost["protect_ns"].as_f64(), cost["copy_ns"].as_f64()) {
        let h = auto[0]["huge_page_cost_ns"].as_f64();
        eprintln!(
            "auto: protect+unprotect {p:.0} ns/page ({h:?} in huge pages), copy {c:.0} ns/page"
        );
        if p >= c {
            assert!(auto[0]["total"]["fallback_calls"]["protect_costlier"].as_u64() > Some(0));
            if h.is_some_and(|h| h < c) {
                // Only the huge-page buffer, left unchanged between its sends, went protected.
                let zc = total(&auto, "bytes_zerocopy");
                assert!((8 << 20..=32 << 20).contains(&zc), "{zc} bytes zero-copy");
            } else {
                assert_eq!(total(&auto, "bytes_zerocopy"), 0);
            }
        }
    }
}
