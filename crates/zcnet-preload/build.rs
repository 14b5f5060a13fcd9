//! Sets the `cfg`s that mark this crate's tests needing a program, root or network
//! namespaces as ignored, with their reason, where this machine lacks them (see
//! `probe.rs`, a link to `crates/zcnet-testbed/probe.rs`).

include!("probe.rs");

fn main() {
    zcnet_probe(&["python3"]);
    zcnet_probe_host(&["io_uring"]);
}
