//! `auto`'s page costs are measured once per boot, not once per process: two processes run
//! `page_cost_cache.py` (beside this file: 4 MiB from a page-aligned buffer over loopback,
//! every byte checked) one after the other under `auto`, with loopback treated as any peer
//! (`ZCNET_LOCAL_ZEROCOPY=1`, so the send is eligible and the costs are needed) and one
//! cache directory. The first measures and writes `page-cost.json`; the second reads it —
//! pinned by each stats line's `page_cost_from`, not by time.

mod common;

#[cfg_attr(
    not(zcnet_has_python3),
    ignore = "needs python3 (apt-get install python3)"
)]
#[test]
fn a_second_process_reads_the_page_costs_the_first_measured() {
    common::require_python3("mmap");
    let dir = tempfile::tempdir().unwrap();
    let first = common::run_auto("page_cost_cache.py", dir.path(), "ok 4 MiB verified");
    common::assert_engine(&first);
    assert!(!first["page_cost_ns"].is_null(), "measured: {first}");
    assert_eq!(first["page_cost_from"], "measured", "{first}");
    assert!(dir.path().join("page-cost.json").is_file());
    let second = common::run_auto("page_cost_cache.py", dir.path(), "ok 4 MiB verified");
    assert_eq!(second["page_cost_from"], "cache", "{second}");
    assert_eq!(second["page_cost_ns"], first["page_cost_ns"]);
}
