//! The client side of a run: the one dispatch from a run to its transport.

use super::spec::{BenchError, Progress, RunSpec, Transport};
use super::{lm, tcp, udp};
use std::net::SocketAddr;
use zcnet_bench::report::Run;

/// Runs `spec` against the server whose control port is `ctrl`, over the transport the run
/// names. Must be called from a thread in the client's network namespace.
pub(crate) fn run(
    ctrl: SocketAddr,
    spec: &RunSpec,
    progress: &Progress,
) -> Result<Run, BenchError> {
    match Transport::of(spec.topology.proto, &spec.params) {
        Transport::Tcp => tcp::run(ctrl, spec, progress),
        Transport::Udp => udp::run(ctrl, spec, progress),
        Transport::Lm => lm::run(ctrl, spec, progress),
    }
}
