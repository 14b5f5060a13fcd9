//! Memory freed while a zero-copy send still reads it, then reused by a kernel write: the
//! Python loop of issue 42 (`freed_in_flight.py` beside this file: `data =
//! os.urandom(8 << 20); s.sendall(data); del data`, 24 times) under `zerocopy` and `cow`,
//! loopback treated as any peer so that the sends do go zero-copy. glibc's malloc hands
//! the freed pages, still in flight, to the next `os.urandom`, whose `getrandom` the
//! kernel would fail with `EFAULT` on a page still write-protected (the protection is
//! user-mode only). The library lets go of such pages in `free` (`freed_in_flight`, see
//! `given_back_in_flight.rs`), and a `getrandom` into a page still protected otherwise
//! writes into scratch memory copied in by user-mode writes, which the engine resolves.
//! No error, every byte as sent, and the stats show the loop did run zero-copy.

mod common;

#[cfg_attr(
    not(zcnet_has_python3),
    ignore = "needs python3 (apt-get install python3)"
)]
#[test]
fn sending_then_freeing_fresh_random_buffers_never_fails() {
    common::require_python3("hashlib, socket, threading");
    for mode in ["zerocopy", "cow"] {
        let dir = tempfile::tempdir().unwrap();
        let line = common::run_in_mode("freed_in_flight.py", &["24"], mode, dir.path(), "ok ");
        common::assert_engine(&line);
        let t = &line["total"];
        assert!(
            t["bytes_zerocopy"].as_u64() > Some(0),
            "{mode}: the loop never sent zero-copy: {t}"
        );
        assert_eq!(line["engine"]["errors"].as_u64(), Some(0), "{mode}: {line}");
        eprintln!(
            "{mode}: {} bytes zero-copy, {} kernel writes detoured, {} faults, freed in flight {}",
            t["bytes_zerocopy"],
            line["kernel_write_detours"],
            t["protection_faults"],
            line["freed_in_flight"]
        );
    }
}
