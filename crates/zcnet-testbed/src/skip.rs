//! A test that cannot run here says so — and in CI, where everything must run, fails.
//!
//! What can be known when the tests are built (a program on PATH, root, network
//! namespaces) is a `cfg` set by the crate's build script (`probe.rs` beside this crate's
//! manifest), and such a test is `#[ignore]`d with its reason, counted in `cargo test`'s
//! summary. What only shows when the test runs (io_uring's `SEND_ZC` refused by this kernel,
//! transparent huge pages off, a file system without holes) goes through [`skip`]: a line on
//! stderr that libtest does not swallow, and, with `ZCNET_REQUIRE_ALL=1` (set by `.ci/run`),
//! a failure. A skip CI must tolerate (a host property CI's machine may lack) is
//! [`skip_allowed`].

use std::io::Write as _;

/// Whether this run must not skip anything (`ZCNET_REQUIRE_ALL` set, not `0`).
pub fn require_all() -> bool {
    std::env::var("ZCNET_REQUIRE_ALL").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The calling test cannot run here, for `reason`: says so on stderr (one write, straight
/// to the descriptor, so libtest neither captures nor interleaves it) and returns, so the
/// test can return early — or panics when [`require_all`].
pub fn skip(reason: &str) {
    assert!(
        !require_all(),
        "SKIPPED where ZCNET_REQUIRE_ALL forbids it: {reason}"
    );
    skip_allowed(reason);
}

/// [`skip`] for a property of the host that even CI's machine may lack (transparent huge
/// pages turned off, a kernel without per-thread schedstat): said, never a failure.
pub fn skip_allowed(reason: &str) {
    let _ = std::io::stderr().write_all(format!("SKIPPED: {reason}\n").as_bytes());
}
