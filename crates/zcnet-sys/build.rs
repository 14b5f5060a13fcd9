//! Host facts the unit tests need, found where they build (as zcnet-testbed's probe.rs does
//! for the other crates): a test whose kernel feature is missing shows as ignored, with why.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(zcnet_has_schedstat)");
    println!("cargo::rustc-check-cfg=cfg(zcnet_has_thp)");
    println!("cargo::rerun-if-changed=build.rs");
    if std::path::Path::new("/proc/thread-self/schedstat").exists() {
        println!("cargo::rustc-cfg=zcnet_has_schedstat");
    }
    // Transparent huge pages a `MADV_HUGEPAGE` mapping may get (`always` or `madvise`), as
    // `mem::thp_available` reads it at run time. Re-read when the setting changes.
    const THP: &str = "/sys/kernel/mm/transparent_hugepage/enabled";
    println!("cargo::rerun-if-changed={THP}");
    if std::fs::read_to_string(THP).is_ok_and(|s| s.contains("[always]") || s.contains("[madvise]"))
    {
        println!("cargo::rustc-cfg=zcnet_has_thp");
    }
}
