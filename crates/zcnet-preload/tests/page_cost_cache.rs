//! `auto`'s page costs are measured once per boot, not once per process: two processes run
//! `page_cost_cache.py` (beside this file: 4 MiB from a page-aligned buffer over loopback,
//! every byte checked) one after the other under `auto`, with loopback treated as any peer
//! (`ZCNET_LOCAL_ZEROCOPY=1`, so the send is eligible and the costs are needed) and one
//! cache directory. The first measures and writes `page-cost.json`; the second reads it —
//! pinned by each stats line's `page_cost_from`, not by time.

use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn run(lib: &Path, dir: &Path, stats: &Path) -> Value {
    let out = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/page_cost_cache.py"))
        .env("LD_PRELOAD", lib)
        .env("ZCNET_TX", "auto")
        .env("ZCNET_LOCAL_ZEROCOPY", "1")
        .env("ZCNET_PROFILE_DIR", dir)
        .env("ZCNET_STATS", stats)
        .output()
        .expect("running python3");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("ok 4 MiB verified"),
        "{}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let all = std::fs::read_to_string(stats).unwrap();
    serde_json::from_str(all.lines().last().expect("a stats line")).unwrap()
}

#[test]
fn a_second_process_reads_the_page_costs_the_first_measured() {
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
    let first = run(&lib, dir.path(), &stats);
    if first["page_cost_ns"].is_null() {
        eprintln!("SKIP: no write-protection engine here: {}", first["engine"]);
        return;
    }
    assert_eq!(first["page_cost_from"], "measured", "{first}");
    assert!(dir.path().join("page-cost.json").is_file());
    let second = run(&lib, dir.path(), &stats);
    assert_eq!(second["page_cost_from"], "cache", "{second}");
    assert_eq!(second["page_cost_ns"], first["page_cost_ns"]);
}
