//! The pure half of `zcnet bench` (quinn-proto style: no sockets, no clocks, all tested):
//!
//! * [`protocol`] — the versioned control protocol between `--client` and `--server`;
//! * [`iperf3`] — iperf3's own control protocol and `-J` schema (`zcnet bench -s`/`-c`);
//! * [`report`] — the `--json` schema (runs, CPU, efficiency, zero-copy shares) and the
//!   grouping of repeats into medians;
//! * [`summary`] — median and spread of repeated runs;
//! * [`histogram`] — the per-call latency histogram;
//! * [`sizes`] — `64K`, `4K..4M` sweeps;
//! * [`touch`] — the Solaris data-touching workload;
//! * [`verdict`] — which path moves a GiB for the least CPU, at which sizes;
//! * [`cpu`] — CPU seconds of a thread, a process and the whole system;
//! * [`measure`] — `auto` profile tables from bench runs, and `auto`'s gap to the best path.
//!
//! The measuring half (threads, sockets, namespaces, output) is the `zcnet` binary's.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(unreachable_pub)]

pub mod cpu;
pub mod histogram;
pub mod iperf3;
pub mod measure;
pub mod mix;
pub mod protocol;
pub mod refusal;
pub mod report;
pub mod sizes;
pub mod summary;
pub mod touch;
pub mod verdict;
