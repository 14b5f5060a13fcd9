//! Host facts the unit tests need, found where they build (as zcnet-testbed's probe.rs does
//! for the other crates): a test whose kernel feature is missing shows as ignored, with why.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(zcnet_has_schedstat)");
    println!("cargo::rustc-check-cfg=cfg(zcnet_has_thp)");
    println!("cargo::rustc-check-cfg=cfg(zcnet_root)");
    // Root (effective uid 0), as zcnet-testbed's probe.rs finds it: some kernel interfaces
    // answer EPERM before anything else without CAP_NET_ADMIN.
    println!("cargo::rerun-if-env-changed=HOME");
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .is_some_and(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2))
                == Some("0")
        });
    if root {
        println!("cargo::rustc-cfg=zcnet_root");
    }
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
