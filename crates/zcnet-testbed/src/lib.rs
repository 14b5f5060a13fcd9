//! zcnet-testbed: what zcnet's tests and its bench share to build a two-host network on one
//! machine and to check every byte that crosses it.
//!
//! * [`memlock`] — a test run again under a small `RLIMIT_MEMLOCK` without `CAP_IPC_LOCK`.
//! * [`mutate`] — a wire parser's fuzz input made from a valid one.
//! * [`netns`] — network namespaces joined by a veth pair with a chosen MTU (the papers'
//!   large-MTU networks), entered per thread, removed on drop.
//! * [`pattern`] — a prime-period byte pattern and a [`pattern::Verifier`] that names the first
//!   wrong byte.
//! * [`topo`] — a test written once runs on loopback and across a veth pair.
//!
//! A test that cannot run here (no root, a program or a kernel feature missing) is never a
//! pass that ran nothing: the build script of its crate finds what this machine has
//! (`probe.rs` beside this crate's manifest, included by the others) and sets a `cfg`, and
//! the test is `#[cfg_attr(not(<cfg>), ignore = "needs ...")]`, counted as ignored, with
//! its reason, in `cargo test`'s summary. With `ZCNET_REQUIRE_ALL=1` (set by `.ci/run`) a
//! missing condition fails the build instead. Where the build found a condition and the
//! test still finds it missing, the test fails, saying so.
//!
//! It depends on no other zcnet crate, so any of them can use it in tests.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(unreachable_pub)]

pub mod memlock;
pub mod mutate;
pub mod netns;
pub mod pattern;
pub mod topo;
