//! iperf3 mode: `zcnet bench -s` serves iperf3's own control protocol, so an unmodified
//! `iperf3 -c` tests against zcnet's paths; `zcnet bench -c HOST` drives an unmodified
//! `iperf3 -s` (or a `zcnet bench -s`). The protocol's pure parts — cookie, states, JSON
//! framing, parameters, results, UDP's datagram header and counting, the memory budget, the
//! `-J` schema — are [`zcnet_bench::iperf3`]'s.
//!
//! Layout, imports pointing down: [`server`] and [`client`](mod@client) (the two roles); [`start`]
//! and [`report`] (what a side prints); [`udp`] (`-u` streams: iperf3's UDP connect, GSO
//! sends, GRO receives) over [`streams`] (TCP data connections through zcnet's
//! `Sender`/`Receiver`, and the running-stream handle both share); [`wire`] (blocking
//! control-message I/O) and [`opts`] (what was asked), leaves.

mod client;
mod opts;
mod report;
mod server;
mod start;
mod streams;
mod udp;
mod wire;

pub(crate) use opts::{ClientOpts, Common, Format, ServerOpts};

/// Serves iperf3 clients on `listener` until `stop` (or after one test with `-1`).
pub(crate) fn serve(
    opts: ServerOpts,
    listener: std::net::TcpListener,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<(), crate::bench::spec::BenchError> {
    server::serve(opts, listener, stop)
}

/// Runs one test against an iperf3 server.
pub(crate) fn client(opts: &ClientOpts) -> Result<(), crate::bench::spec::BenchError> {
    client::run(opts)
}
