//! Sets the `cfg`s that mark this crate's tests needing a program, root, network
//! namespaces or a host feature as ignored, with their reason, where this machine lacks them (see
//! `probe.rs`, a link to `crates/zcnet-testbed/probe.rs`).

include!("probe.rs");

fn main() {
    zcnet_probe(&["prlimit", "setpriv"]);
    zcnet_probe_host(&["thp", "schedstat", "dev_shm", "uring"]);
}
