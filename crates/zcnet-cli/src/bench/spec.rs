//! The terms every part of the bench shares: what a run is ([`RunSpec`]), where it runs
//! ([`Topology`], [`TopologyInfo`]), which transport carries it ([`Transport`]), how it fails
//! ([`BenchError`]), and the defaults and host facts the report needs. A leaf: it imports no
//! other module of the bench, so the transports and runners can all name these.

use std::sync::atomic::AtomicU64;
use zcnet::{RxPath, TxPath};
use zcnet_bench::protocol::{Params, Proto, ProtocolError};
use zcnet_bench::report::{summarise, Host, Mode, Report, Run, SCHEMA_VERSION};
use zcnet_bench::verdict::{self, Metric};

/// Which transport carries a run: chosen once, from the run's protocol and transmit path,
/// and dispatched on by the client and the server (`client.rs`, `server.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// TCP streams through `zcnet::Sender`/`Receiver` (`workers.rs`, `tcp.rs`).
    Tcp,
    /// Whole messages over UDP through `zcnet_msg` (`udp.rs`).
    Udp,
    /// Lightweight Messages over AF_XDP through `zcnet_afxdp` (`lm.rs`).
    Lm,
}

impl Transport {
    /// The name of the one transmit path that is its own transport.
    pub(crate) const LM: &'static str = "lm";

    /// The transport of a run with `params` over `proto`.
    pub(crate) fn of(proto: Proto, params: &Params) -> Transport {
        match proto {
            Proto::Tcp => Transport::Tcp,
            Proto::Udp if params.tx == Self::LM => Transport::Lm,
            Proto::Udp => Transport::Udp,
        }
    }
}

/// Why a bench failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BenchError {
    /// Bad options or a topology this host cannot build.
    #[error("{0}")]
    Usage(String),
    /// The control protocol failed.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// The server turned a run down (logged on the server side).
    #[error("rejected: {0}")]
    Rejected(String),
    /// A zcnet operation failed.
    #[error("{context}: {source}")]
    Zcnet {
        context: &'static str,
        #[source]
        source: zcnet::Error,
    },
    /// A system call failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// Namespaces could not be built or entered.
    #[error(transparent)]
    Netns(#[from] zcnet_testbed::netns::NetnsError),
    /// The two ends counted different bytes.
    #[error("byte counts disagree: {0}")]
    Mismatch(String),
    /// Anything else that stops a run.
    #[error("{0}")]
    Failed(String),
}

impl BenchError {
    pub(crate) fn io(context: &'static str, source: std::io::Error) -> Self {
        BenchError::Io {
            context: context.to_string(),
            source,
        }
    }

    pub(crate) fn io_owned(context: String, source: std::io::Error) -> Self {
        BenchError::Io { context, source }
    }
}

/// Live byte count of the run in progress, for the progress line.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    pub bytes: AtomicU64,
}

/// One run to make.
#[derive(Debug, Clone)]
pub(crate) struct RunSpec {
    pub params: Params,
    pub label: String,
    pub repeat: u32,
    pub topology: TopologyInfo,
}

pub(crate) fn tx_names() -> Vec<&'static str> {
    TxPath::ALL.iter().map(|p| p.name()).collect()
}

pub(crate) fn rx_names() -> Vec<&'static str> {
    RxPath::ALL.iter().map(|p| p.name()).collect()
}

/// Default ring depth: 16 MiB of buffers per connection, between 8 and 1024 of them — more
/// than sndbuf + window, so a sender never waits for a buffer the kernel still holds (the
/// Solaris paper's rule, §3.2.4), unless `--ring` asks to see what happens when it does.
pub(crate) fn default_ring(size: u64, mode: Mode) -> u32 {
    match mode {
        Mode::Rr => 2,
        Mode::Stream => ((16u64 << 20) / size.max(1)).clamp(8, 1024) as u32,
    }
}

/// Default limit of an `rr` run at `size`: 200 to 5000 round trips, about 32 MiB.
pub(crate) fn rr_bytes(size: u64) -> u64 {
    size * ((32u64 << 20) / size).clamp(200, 5000)
}

/// Seconds per stream run when neither `--time` nor `--bytes` is given: the whole bench
/// within about 40 s (so `zcnet bench` with no arguments stays under a minute however many
/// paths this build has), each run between 0.2 s (enough for /proc/stat's 10 ms ticks)
/// and 1 s. Time rather than bytes keeps slow and fast paths equally long under the clock.
pub(crate) fn default_seconds(runs: usize) -> f64 {
    (40.0 / runs.max(1) as f64).clamp(0.2, 1.0)
}

pub(crate) fn describe_spec(spec: &RunSpec) -> String {
    let p = &spec.params;
    let mut s = format!(
        "{}{} {}→{} {}",
        if spec.topology.proto == Proto::Udp {
            "udp "
        } else {
            ""
        },
        p.mode.name(),
        p.tx,
        p.rx,
        zcnet_bench::sizes::ByteSize(p.size)
    );
    if p.streams > 1 {
        s += &format!(" ×{}", p.streams);
    }
    if p.touch {
        s += " touch";
    }
    if !spec.label.is_empty() {
        s = format!("[{}] {s}", spec.label);
    }
    s
}

pub(crate) fn host() -> Host {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let cpu_model = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    Host {
        kernel: read("/proc/sys/kernel/osrelease"),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_model,
        hostname: read("/proc/sys/kernel/hostname"),
        zcnet: env!("CARGO_PKG_VERSION").to_string(),
    }
}

/// Builds the report. The verdict is decided by the worker threads' CPU (sender +
/// receiver): on a shared machine the whole-machine figure also counts other tenants'
/// work, and with tick-based accounting (no `CONFIG_IRQ_TIME_ACCOUNTING`, as here) the
/// softirq work a thread triggers in its own context is charged to that thread anyway. The
/// machine figure stays in the table and the JSON beside it.
pub(crate) fn make_report(runs: Vec<Run>) -> Report {
    let summary = summarise(&runs);
    let verdict = verdict::judge(&summary, Metric::Workers).map(|v| v.line());
    let pair_gaps = zcnet_bench::measure::pair_gaps(&runs);
    Report {
        schema: SCHEMA_VERSION,
        host: host(),
        runs,
        summary,
        verdict,
        pair_gaps,
    }
}

/// `--topology`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Topology {
    /// Both ends on 127.0.0.1.
    Loopback,
    /// Two network namespaces joined by veth (root).
    Netns,
    /// Transmit-only into a veth whose peer is down; UDP (root).
    Sink,
}

/// Name and MTU of the topology a run used, and the transport over it, for the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopologyInfo {
    /// `loopback`, `netns`, `sink` or `remote`.
    pub name: String,
    /// Link MTU, where the topology set one.
    pub mtu: Option<u32>,
    /// TCP streams, or UDP messages (`--proto udp`); `Env::info` says TCP, and the plan
    /// sets what `--proto` asks. On `sink`, TCP means the raw GSO sender of [`super::sink`].
    pub proto: Proto,
}
