//! Host facts the unit tests need, found where they build (as zcnet-testbed's probe.rs does
//! for the other crates): a test whose kernel feature is missing shows as ignored, with why.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(zcnet_has_schedstat)");
    println!("cargo::rerun-if-changed=build.rs");
    if std::path::Path::new("/proc/thread-self/schedstat").exists() {
        println!("cargo::rustc-cfg=zcnet_has_schedstat");
    }
}
