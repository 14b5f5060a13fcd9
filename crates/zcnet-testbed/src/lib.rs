//! zcnet-testbed: what zcnet's tests and its bench share to build a two-host network on one
//! machine and to check every byte that crosses it.
//!
//! * [`netns`] — network namespaces joined by a veth pair with a chosen MTU (the papers'
//!   large-MTU networks), entered per thread, removed on drop.
//! * [`pattern`] — a prime-period byte pattern and a [`pattern::Verifier`] that names the first
//!   wrong byte.
//! * [`topo`] — a test written once runs on loopback and across a veth pair.
//! * [`skip`] — a test that cannot run here says so, and fails in CI.
//!
//! It depends on no other zcnet crate, so any of them can use it in tests.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod netns;
pub mod pattern;
pub mod skip;
pub mod topo;
