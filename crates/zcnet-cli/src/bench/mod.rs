//! `zcnet bench`: the measurement tool — ttcp/iperf-class transfers over every transmit ×
//! receive path, reporting what the papers judged zero-copy by: CPU seconds per GiB at both
//! ends and for the whole machine (softirq included), Gbit/s per busy core (the CMU paper's
//! efficiency), the share of bytes that really went without a copy, fallbacks by reason, and
//! per-call latency — beside throughput, with medians and ranges over repeated runs.
//!
//! Roles (iperf3's model): `--server` answers runs, `--client HOST` drives them, and the
//! default runs both here (server on a thread). A versioned control connection
//! ([`zcnet_bench::protocol`]) carries the parameters and each side's measurements; data
//! moves on `--streams` connections. Topologies: loopback, two network namespaces joined by
//! veth, or a transmit-only sink ([`topology`]). `--suite papers` runs the seed papers'
//! experiments and writes a report ([`suite`]).
//!
//! The pure parts — statistics, protocol, report schema, size sweeps, verdict — live in
//! the library's [`zcnet_bench`] and are tested there without sockets.

mod client;
mod lm;
mod output;
pub(crate) mod plot;
mod server;
mod sink;
mod suite;
mod topology;
mod udp;
mod workers;

use std::collections::HashSet;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64};
use zcnet::{RxPath, TxPath};
use zcnet_bench::protocol::{
    Limit, Params, Proto, ProtocolError, DEFAULT_PORT, MAX_UDP_MESSAGE, PROTOCOL_VERSION, UDP_RX,
    UDP_TX,
};
use zcnet_bench::report::{summarise, Host, Mode, Report, Run, SCHEMA_VERSION};
use zcnet_bench::sizes::{parse_size, parse_sizes};
use zcnet_bench::verdict::{self, Metric};

pub(crate) use topology::{Env, Topology, TopologyInfo};

/// Options of `zcnet bench`.
#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "Examples:\n  \
    zcnet bench                                  every path on loopback, table + verdict\n  \
    zcnet bench --tx copy,zerocopy --rx copy --size 4K..1M --plot sweep.svg\n  \
    zcnet bench --touch --size 16K               the Solaris data-touching test\n  \
    zcnet bench --rr --size 64..64K              NetPIPE ping-pong\n  \
    zcnet bench --topology netns --mtu 9000      two namespaces joined by veth (root)\n  \
    zcnet bench --topology sink --tx all         transmit-only UDP into a dropping device (root)\n  \
    zcnet bench --proto udp --tx copy,zerocopy --rx gro --size 1,1472,64K,1M [--rr]\n  \
    zcnet bench --server  /  zcnet bench --client HOST\n  \
    zcnet bench --suite papers --out DIR         the papers' experiments, report.md + SVG\n\n\
    The --json schema is documented in docs/bench.md.")]
pub struct Args {
    /// Serve runs for clients (`--client`) until interrupted.
    #[arg(long, conflicts_with_all = ["client", "suite"])]
    server: bool,
    /// Server address to listen on (with --server).
    #[arg(long, value_name = "ADDR", requires = "server")]
    bind: Option<String>,
    /// Exit after serving one run (with --server; for scripts and tests).
    #[arg(long, requires = "server")]
    once: bool,
    /// Run against a `zcnet bench --server` at HOST[:PORT] (default port 5301).
    #[arg(long, value_name = "HOST[:PORT]", conflicts_with = "suite")]
    client: Option<String>,
    /// Transport: `tcp` byte streams, or `udp` whole messages through zcnet::msg
    /// (`--tx copy|zerocopy`, `--rx copy|gro`, `--size` = message size).
    #[arg(long, value_enum, default_value = "tcp")]
    proto: ProtoArg,
    /// Transmit paths: a comma-separated list, or `all`.
    #[arg(long, default_value = "all")]
    tx: String,
    /// Receive paths: a comma-separated list, or `all`.
    #[arg(long, default_value = "all")]
    rx: String,
    /// Bytes per send: `64K`, a sweep `4K..4M` (powers of two), or a list `4K,64K`.
    /// Default 16K,256K (stream), 1,64,1K,16K,64K,256K,1M (--rr). With --proto udp: the
    /// message size, 1 B to 16 MiB (default 1472,64K,1M; --rr 1,1472,64K,1M).
    #[arg(long, value_name = "SIZES")]
    size: Option<String>,
    /// Seconds per run (instead of --bytes).
    #[arg(long, value_name = "S", conflicts_with = "bytes")]
    time: Option<f64>,
    /// Bytes per run over all streams (default: time-limited, 0.2 to 1 s per run so the
    /// whole bench takes under a minute; --rr: 200 to 5000 round trips).
    #[arg(long, value_name = "N", value_parser = size_arg)]
    bytes: Option<u64>,
    /// Concurrent connections (the loaded-system test).
    #[arg(long, default_value_t = 1, value_name = "N")]
    streams: u32,
    /// Buffers in rotation per connection (the sender's pool); default 16 MiB / size, 8..1024.
    #[arg(long, value_name = "N")]
    ring: Option<u32>,
    /// Sender writes every word before sending, receiver reads every word after receiving.
    #[arg(long)]
    touch: bool,
    /// Request/response ping-pong (NetPIPE): round-trip latency and bandwidth by size.
    #[arg(long)]
    rr: bool,
    /// Runs per configuration; medians and ranges are reported.
    #[arg(long, default_value_t = 3, value_name = "N")]
    repeat: u32,
    /// Where the two ends live.
    #[arg(long, value_enum, default_value = "loopback")]
    topology: Topology,
    /// Link MTU for --topology netns|sink (default 1500).
    #[arg(long, value_name = "N")]
    mtu: Option<u32>,
    /// One JSON object on stdout (schema in docs/bench.md) instead of a table.
    #[arg(long)]
    json: bool,
    /// Write an SVG plot of throughput and CPU-s/GiB against size (for sweeps).
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Run an experiment suite: `papers` (the seed papers' experiments).
    #[arg(long, value_enum)]
    suite: Option<suite::SuiteName>,
    /// Directory for the suite's report.md, plots and report.json.
    #[arg(long, value_name = "DIR", requires = "suite")]
    out: Option<PathBuf>,
    /// A small, fast suite (for tests and a first look; numbers are noisier).
    #[arg(long, requires = "suite")]
    quick: bool,
}

/// `--proto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ProtoArg {
    /// Byte streams over TCP.
    Tcp,
    /// Whole messages over UDP (GSO/GRO, MSG_ZEROCOPY loans).
    Udp,
}

impl From<ProtoArg> for Proto {
    fn from(p: ProtoArg) -> Proto {
        match p {
            ProtoArg::Tcp => Proto::Tcp,
            ProtoArg::Udp => Proto::Udp,
        }
    }
}

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
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

/// Entry point from `main`.
pub fn run(args: &Args) -> Result<(), String> {
    run_inner(args).map_err(|e| e.to_string())
}

fn run_inner(args: &Args) -> Result<(), BenchError> {
    if args.server {
        return serve_standalone(args);
    }
    if let Some(name) = args.suite {
        return suite::run(name, args);
    }
    let env = Env::open(args.topology, args.mtu, args.client.as_deref())?;
    let specs = plan(args, &env)?;
    let runs = execute(&env, &specs, !args.json)?;
    let report = make_report(runs);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report)
                .map_err(|e| BenchError::Failed(format!("serialising the report: {e}")))?
        );
    } else {
        print!(
            "{}",
            output::tables(&report, &describe(args, &env, specs.len()))
        );
        if env.is_sink() {
            println!("{}", output::SINK_NOTE);
        }
    }
    if let Some(path) = &args.plot {
        plot::sweep(path, &report.summary, "zcnet bench")?;
        if !args.json {
            println!("plot: {}", path.display());
        }
    }
    Ok(())
}

fn serve_standalone(args: &Args) -> Result<(), BenchError> {
    topology::install_interrupt_handler();
    let bind = args
        .bind
        .clone()
        .unwrap_or_else(|| format!("127.0.0.1:{DEFAULT_PORT}"));
    let addr = topology::resolve(&bind)?;
    let listener =
        TcpListener::bind(addr).map_err(|e| BenchError::io_owned(format!("binding {addr}"), e))?;
    let local = listener
        .local_addr()
        .map_err(|e| BenchError::io("getsockname", e))?;
    println!(
        "zcnet bench server listening on {local} (protocol {PROTOCOL_VERSION}); Ctrl-C to stop"
    );
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let stop = AtomicBool::new(false);
    server::serve(
        &listener,
        &stop,
        server::ServeOptions {
            log: true,
            once: args.once,
        },
    )
}

/// `all` or a comma-separated list of names from `known`.
fn parse_paths(
    spec: &str,
    known: &[&'static str],
    what: &str,
    pass_unknown: bool,
) -> Result<Vec<String>, BenchError> {
    if spec.trim() == "all" {
        return Ok(known.iter().map(|s| s.to_string()).collect());
    }
    let mut out = Vec::new();
    for p in spec.split(',').map(str::trim) {
        if p.is_empty() {
            return Err(BenchError::Usage(format!("empty {what} path in {spec:?}")));
        }
        if !known.contains(&p) && !pass_unknown {
            return Err(BenchError::Usage(format!(
                "unknown {what} path {p:?} (known here: {})",
                known.join(", ")
            )));
        }
        if !out.iter().any(|o| o == p) {
            out.push(p.to_string());
        }
    }
    Ok(out)
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

/// Turns the options into the list of runs, repeats interleaved (so drift over the
/// sitting hits every configuration alike).
fn plan(args: &Args, env: &Env) -> Result<Vec<RunSpec>, BenchError> {
    let mode = if args.rr { Mode::Rr } else { Mode::Stream };
    if args.repeat == 0 {
        return Err(BenchError::Usage("--repeat must be at least 1".into()));
    }
    let proto = Proto::from(args.proto);
    let udp = proto == Proto::Udp;
    let default_sizes = match (proto, mode) {
        (Proto::Tcp, Mode::Stream) => "16K,256K",
        (Proto::Tcp, Mode::Rr) => "1,64,1K,16K,64K,256K,1M",
        (Proto::Udp, Mode::Stream) => "1472,64K,1M",
        (Proto::Udp, Mode::Rr) => "1,1472,64K,1M",
    };
    let sizes = parse_sizes(args.size.as_deref().unwrap_or(default_sizes))
        .map_err(|e| BenchError::Usage(e.to_string()))?;
    if udp {
        if let Some(&s) = sizes.iter().find(|&&s| s > MAX_UDP_MESSAGE) {
            return Err(BenchError::Usage(format!(
                "--proto udp: message size {s} is above the limit of {MAX_UDP_MESSAGE} bytes"
            )));
        }
    } else if args.rx.split(',').any(|r| r.trim() == "gro") {
        return Err(BenchError::Usage(
            "receive path \"gro\" is a UDP message path (UDP_GRO): add --proto udp".into(),
        ));
    }
    if env.is_sink() {
        // The sink drops everything: nothing answers, nothing receives.
        if mode == Mode::Rr {
            return Err(BenchError::Usage(
                "the sink drops everything: --rr needs an answering peer (use loopback or netns)"
                    .into(),
            ));
        }
        if args.rx != "all" {
            return Err(BenchError::Usage(
                "the sink has no receiver: leave --rx out".into(),
            ));
        }
    }
    let (txs, rxs) = if env.is_sink() && udp {
        let mut txs = udp_paths(&args.tx, &UDP_TX, "transmit")?;
        if args.tx == "all" {
            txs.retain(|t| t != "lm");
        } else if txs.iter().any(|t| t == "lm") {
            return Err(BenchError::Usage(
                "the sink has no receiver to admit Lightweight Messages: --tx lm needs an \
                 answering peer (--topology netns)"
                    .into(),
            ));
        }
        (txs, vec!["none".to_string()])
    } else if udp {
        (
            udp_paths(&args.tx, &UDP_TX, "transmit")?,
            udp_paths(&args.rx, &UDP_RX, "receive")?,
        )
    } else if env.is_sink() {
        let mtu = env.info().mtu.unwrap_or(1500);
        for &s in &sizes {
            sink::check_size(s, mtu).map_err(BenchError::Usage)?;
        }
        (
            parse_paths(&args.tx, &sink::SINK_TX, "transmit (sink: UDP)", false)?,
            vec!["none".to_string()],
        )
    } else {
        // Against a remote server, receive paths this build does not know may be ones the
        // server knows: it decides, and rejects with a reason if not.
        let remote = matches!(env, Env::Remote { .. });
        (
            parse_paths(&args.tx, &tx_names(), "transmit", false)?,
            parse_paths(&args.rx, &rx_names(), "receive", remote)?,
        )
    };
    let mut specs = Vec::new();
    for repeat in 0..args.repeat {
        for &size in &sizes {
            for tx in &txs {
                for rx in &rxs {
                    if udp && !env.is_sink() && !zcnet_bench::protocol::udp_paths_pair(tx, rx) {
                        // lm pairs only with lm; the other UDP paths with each other.
                        continue;
                    }
                    let limit = match (args.time, args.bytes, mode) {
                        (Some(t), _, _) => Limit::Seconds(t),
                        (None, Some(b), _) => Limit::Bytes(b),
                        // Set below, once the number of runs is known.
                        (None, None, Mode::Stream) => Limit::Seconds(1.0),
                        (None, None, Mode::Rr) => Limit::Bytes(rr_bytes(size)),
                    };
                    let params = Params {
                        mode,
                        tx: tx.clone(),
                        rx: rx.clone(),
                        size,
                        streams: args.streams,
                        ring: args.ring.unwrap_or_else(|| default_ring(size, mode)),
                        touch: args.touch,
                        limit,
                    };
                    let known_rx: Vec<&str> = if env.is_sink() {
                        vec!["none"]
                    } else {
                        rxs.iter().map(String::as_str).collect()
                    };
                    if udp {
                        params
                            .validate(&UDP_TX, &known_rx)
                            .and_then(|()| params.udp_limits())
                    } else {
                        params.validate(&tx_names(), &known_rx)
                    }
                    .map_err(BenchError::Usage)?;
                    specs.push(RunSpec {
                        params,
                        label: String::new(),
                        repeat,
                        topology: TopologyInfo {
                            proto,
                            ..env.info()
                        },
                    });
                }
            }
        }
    }
    if specs.is_empty() {
        return Err(BenchError::Usage(format!(
            "--tx {} --rx {}: no pair of these paths can meet (lm is a transport of its own and \
             pairs only with lm)",
            args.tx, args.rx
        )));
    }
    if args.time.is_none() && args.bytes.is_none() && mode == Mode::Stream {
        let t = default_seconds(specs.len());
        for s in &mut specs {
            s.params.limit = Limit::Seconds(t);
        }
    }
    Ok(specs)
}

/// `all` or a comma-separated list of UDP message paths; anything else is named as not a
/// UDP path (a TCP path such as `uring` or `mmap` given with `--proto udp`).
fn udp_paths(spec: &str, known: &[&'static str], what: &str) -> Result<Vec<String>, BenchError> {
    let paths = parse_paths(spec, known, what, true)?;
    if let Some(p) = paths.iter().find(|p| !known.contains(&p.as_str())) {
        return Err(BenchError::Usage(format!(
            "{what} path {p:?} is not a UDP message path (--proto udp knows: {})",
            known.join(", ")
        )));
    }
    Ok(paths)
}

/// Seconds per stream run when neither `--time` nor `--bytes` is given: the whole bench
/// within about 40 s (so `zcnet bench` with no arguments stays under a minute however many
/// paths this build has), each run between 0.2 s (enough for /proc/stat's 10 ms ticks)
/// and 1 s. Time rather than bytes keeps slow and fast paths equally long under the clock.
pub(crate) fn default_seconds(runs: usize) -> f64 {
    (40.0 / runs.max(1) as f64).clamp(0.2, 1.0)
}

/// Runs `specs` in order. A path pair found unsupported on this host (every operation fell
/// back with reason `unsupported`) is run once, marked, and skipped afterwards. Any failure
/// stops everything with the run named.
pub(crate) fn execute(
    env: &Env,
    specs: &[RunSpec],
    show_progress: bool,
) -> Result<Vec<Run>, BenchError> {
    let mut runs = Vec::new();
    let mut unsupported: HashSet<(String, String)> = HashSet::new();
    output::with_progress(show_progress, specs.len(), |ui| {
        for (i, spec) in specs.iter().enumerate() {
            let p = &spec.params;
            let pair = (p.tx.clone(), p.rx.clone());
            if unsupported.contains(&pair) {
                continue;
            }
            ui.begin(i, &describe_spec(spec));
            let run = env.run(spec, &ui.progress).map_err(|e| {
                BenchError::Failed(format!("run {} failed: {e}", describe_spec(spec)))
            })?;
            if run.unsupported() {
                unsupported.insert(pair);
            }
            runs.push(run);
        }
        Ok(runs)
    })
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

fn describe(args: &Args, env: &Env, runs: usize) -> String {
    let t = env.info();
    let mut s = t.name.clone();
    if let Some(m) = t.mtu {
        s += &format!(" (MTU {m})");
    }
    if args.proto == ProtoArg::Udp && env.is_sink() {
        s += ", UDP messages (zcnet::msg's sender)";
    } else if args.proto == ProtoArg::Udp {
        s += ", UDP messages (zcnet::msg";
        if args.tx == "all" || args.tx.split(',').any(|t| t.trim() == "lm") {
            s += " and zcnet::lm over AF_XDP";
        }
        s += "; every byte verified)";
    }
    if args.streams > 1 {
        s += &format!(", {} streams", args.streams);
    }
    if args.touch {
        s += ", data touched";
    }
    match (args.time, args.bytes) {
        (Some(t), _) => s += &format!(", {t} s per run"),
        (None, Some(b)) => s += &format!(", {} per run", zcnet_bench::sizes::ByteSize(b)),
        _ if !args.rr => s += &format!(", {:.2} s per run", default_seconds(runs)),
        _ => s += ", 200 to 5000 round trips per run",
    }
    s += &format!(", median of {}", args.repeat);
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
    Report {
        schema: SCHEMA_VERSION,
        host: host(),
        runs,
        summary,
        verdict,
    }
}
