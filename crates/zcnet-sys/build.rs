//! Host facts the unit tests need, found where they build (see `probe.rs`, a link to
//! `crates/zcnet-testbed/probe.rs`): a test whose kernel feature is missing shows as
//! ignored, with why; with `ZCNET_REQUIRE_ALL=1` a missing one fails the build.

include!("probe.rs");

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    // `zcnet_root`: some kernel interfaces answer EPERM before anything else without
    // CAP_NET_ADMIN.
    zcnet_probe(&[]);
    zcnet_probe_host(&["thp", "schedstat"]);
}
