//! Memory given back while a zero-copy send still reads it — `free`, a `realloc` that
//! moves, `madvise(MADV_DONTNEED)`, `mremap`, `munmap` — then written by the kernel through
//! a call the library does not interpose (a raw `syscall(SYS_getrandom)`, which no scratch
//! detour can cover): `given_back_in_flight.py` beside this file, under `zerocopy` and
//! `cow`, loopback treated as any peer so that the sends do go zero-copy. The protection is
//! user-mode only, so a kernel write into a page still protected (or registered and
//! zapped) fails with `EFAULT`; the library lets go of such pages when the program gives
//! them back (the kernel keeps the originals it sends). No error, every byte as sent, the
//! bytes `realloc` and `mremap` keep are the program's, and the stats show pages in flight
//! were let go (`freed_in_flight`).

mod common;

#[cfg_attr(
    not(zcnet_has_python3),
    ignore = "needs python3 (apt-get install python3)"
)]
#[test]
fn memory_given_back_in_flight_takes_kernel_writes_and_keeps_the_bytes_sent() {
    common::require_python3("ctypes, hashlib, socket, threading");
    for mode in ["zerocopy", "cow"] {
        let dir = tempfile::tempdir().unwrap();
        let line = common::run_in_mode("given_back_in_flight.py", &["4"], mode, dir.path(), "ok ");
        common::assert_engine(&line);
        let t = &line["total"];
        assert!(
            t["bytes_zerocopy"].as_u64() > Some(0),
            "{mode}: nothing went zero-copy: {t}"
        );
        let f = &line["freed_in_flight"];
        assert!(
            f["pages"].as_u64() > Some(0) && f["protected_pages"].as_u64() > Some(0),
            "{mode}: no page in flight was given back (the test tests nothing): {f}"
        );
        assert_eq!(f["errors"].as_u64(), Some(0), "{mode}: {f}");
        assert_eq!(line["engine"]["errors"].as_u64(), Some(0), "{mode}: {line}");
        let k = &line["uffd_kernel_faults"];
        assert!(k["cap_sys_ptrace"].is_boolean(), "{mode}: {line}");
        eprintln!(
            "{mode}: {} bytes zero-copy; given back in flight: {f}; kernel-mode faults: {k}",
            t["bytes_zerocopy"]
        );
    }
}
