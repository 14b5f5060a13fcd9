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
//!
//! Layout, imports pointing down this list:
//!
//! * this file — the options, the plan of runs, and printing the report;
//! * [`iperf3`] — iperf3 mode (`-s`, `-c HOST`): iperf3's own protocol with zcnet's paths on
//!   this end, a world of its own beside the bench's runs;
//! * [`suite`] (the papers' experiments), [`topology`] (where runs go, and running them),
//!   [`server`] and [`client`] — the one dispatch each way from a run to its
//!   [`spec::Transport`];
//! * the transports, which do not import each other: [`tcp`] (with [`workers`], the data
//!   connections), [`udp`] (`zcnet_msg`), [`lm`] (`zcnet_afxdp`), [`sink`] (the raw GSO
//!   sender into a dropping device);
//! * what they share: [`control`] (control connection, accounting, assembling a run),
//!   [`files`] (the page-cache files of `--tx file` / `--rx file`),
//!   [`ledger`] (message ids delivered or lost), [`output`] and [`plot`];
//! * [`pin`] — `--pin`'s placement of the data threads; [`backoff`] — both servers' answer
//!   to a failing `accept` (a wait, and a log line a second at most), a leaf;
//! * [`spec`] — the shared terms (`RunSpec`, `BenchError`, `Transport`), a leaf.

mod backoff;
mod client;
mod control;
mod files;
mod iperf3;
mod ledger;
mod lm;
mod output;
mod pin;
pub(crate) mod plot;
mod server;
mod sink;
mod spec;
mod suite;
mod tcp;
mod topology;
mod udp;
mod workers;

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use zcnet_bench::protocol::{
    Limit, Params, Proto, DEFAULT_PORT, MAX_UDP_MESSAGE, PROTOCOL_VERSION, UDP_RX, UDP_TX,
};
use zcnet_bench::report::Mode;
use zcnet_bench::sizes::{parse_size, parse_sizes};

pub(crate) use spec::{
    default_ring, default_seconds, host, make_report, rr_bytes, rx_names, tx_names, BenchError,
    RunSpec, Topology, TopologyInfo, Transport,
};
pub(crate) use topology::{execute, yield_to_interrupt, Env};

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
    #[arg(long, conflicts_with_all = ["client", "suite", "iperf3_server", "iperf3_client"])]
    server: bool,
    /// Address to listen on (with --server or -s; default loopback).
    #[arg(long, short = 'B', value_name = "ADDR")]
    bind: Option<String>,
    /// Exit after serving one run (with --server or -s; for scripts and tests).
    #[arg(long, short = '1')]
    once: bool,
    /// iperf3 mode: serve iperf3's own protocol (an unmodified `iperf3 -c` tests against
    /// zcnet's paths), many clients at once. Port 5201 unless -p.
    #[arg(short = 's', conflicts_with_all = ["client", "suite", "iperf3_client"])]
    iperf3_server: bool,
    /// iperf3 mode: run a test against an iperf3 server (`iperf3 -s` or `zcnet bench -s`).
    #[arg(short = 'c', value_name = "HOST", conflicts_with_all = ["client", "suite"])]
    iperf3_client: Option<String>,
    /// iperf3 mode: the server's port (default 5201).
    #[arg(short = 'p', long, value_name = "PORT")]
    port: Option<u16>,
    /// iperf3 mode: the server sends, the client receives.
    #[arg(short = 'R', long, conflicts_with = "bidir")]
    reverse: bool,
    /// iperf3 mode: both send at once, on -P connections each way.
    #[arg(long)]
    bidir: bool,
    /// iperf3 mode: one JSON object per line for start, each interval, and end.
    #[arg(long, conflicts_with = "json")]
    json_stream: bool,
    /// iperf3 mode (-c): a UDP test, iperf3's -u: datagrams of -l bytes (default: the
    /// control connection's MSS), each stream paced at -b.
    #[arg(short = 'u', long = "udp")]
    iperf3_udp: bool,
    /// iperf3 mode (-c -u): bits per second per stream, K/M/G = 10^3/10^6/10^9 (default 1M
    /// as iperf3's 1 Mbit/s = 1048576; 0 for unlimited).
    #[arg(short = 'b', long = "bitrate", value_name = "RATE")]
    bitrate: Option<String>,
    /// iperf3 mode (-c -u): 64-bit packet numbers in each datagram.
    #[arg(long)]
    udp_counters_64bit: bool,
    /// iperf3 mode (-s): bytes the buffers of all tests running at once may hold (default
    /// 1G). A test that does not fit now is told the server is busy (iperf3's
    /// ACCESS_DENIED); one that never could, that its -P or -l is too large.
    #[arg(long, value_name = "BYTES")]
    max_memory: Option<String>,
    /// iperf3 mode: append the report to FILE instead of stdout.
    #[arg(long, value_name = "FILE")]
    logfile: Option<PathBuf>,
    /// iperf3 mode: seconds between interval reports (default 1; 0 for none).
    #[arg(short = 'i', long, value_name = "S")]
    interval: Option<f64>,
    /// iperf3 mode: send from a page-cache file with sendfile (iperf3's -Z); = --tx file.
    #[arg(short = 'Z', long)]
    zerocopy: bool,
    /// iperf3 mode: TCP_NODELAY on the data connections.
    #[arg(short = 'N', long)]
    no_delay: bool,
    /// Where `--tx file` and `--rx file` keep their files (unnamed, removed after the run;
    /// default: the temporary directory).
    #[arg(long, value_name = "DIR")]
    file_dir: Option<PathBuf>,
    /// `--tx file` reads from a cold file: its pages are dropped from the page cache
    /// (posix_fadvise DONTNEED) before the run and at each pass over it.
    #[arg(long)]
    cold: bool,
    /// Bytes of the send file `--tx file` cycles through, in whole blocks (default 64M):
    /// `--file-window 1` sends the same block again and again, as `iperf3 -Z` does
    /// (its sendfile always starts at offset 0 of a one-block file).
    #[arg(long, value_name = "BYTES")]
    file_window: Option<String>,
    /// Run against a `zcnet bench --server` at HOST or HOST:PORT (default port 5301).
    #[arg(long, value_name = "HOST[:PORT]", conflicts_with = "suite")]
    client: Option<String>,
    /// Transport: `tcp` byte streams, or `udp` whole messages through zcnet_msg
    /// (`--tx copy|zerocopy`, `--rx copy|gro`, `--size` = message size).
    #[arg(long, value_enum, default_value = "tcp")]
    proto: ProtoArg,
    /// Transmit paths: a comma-separated list, or `all` (the default). iperf3 mode: this
    /// end's one path, `auto` by default, or `file` (sendfile from a page-cache file).
    #[arg(long)]
    tx: Option<String>,
    /// Receive paths: a comma-separated list, or `all` (the default). iperf3 mode: this
    /// end's one path, `auto` by default.
    #[arg(long)]
    rx: Option<String>,
    /// Bytes per send: `64K`, a sweep `4K..4M` (powers of two), or a list `4K,64K`.
    /// Default 16K,256K (stream), 1,64,1K,16K,64K,256K,1M (--rr). With --proto udp: the
    /// message size, 1 B to 16 MiB (default 1472,64K,1M; --rr 1,1472,64K,1M).
    /// iperf3 mode (-l): bytes per write, one size (default 128K).
    #[arg(long, short = 'l', value_name = "SIZES")]
    size: Option<String>,
    /// Seconds per run (instead of --bytes). iperf3 mode (-t): the test's length (default 10).
    #[arg(long, short = 't', value_name = "S", conflicts_with = "bytes")]
    time: Option<f64>,
    /// Bytes per run over all streams (default: time-limited, 0.2 to 1 s per run so the
    /// whole bench takes under a minute; --rr: 200 to 5000 round trips). iperf3 mode (-n):
    /// bytes to move instead of a time.
    #[arg(long, short = 'n', value_name = "N", value_parser = size_arg)]
    bytes: Option<u64>,
    /// Concurrent connections (the loaded-system test). iperf3 mode (-P): per direction.
    #[arg(long, short = 'P', default_value_t = 1, value_name = "N")]
    streams: u32,
    /// Buffers in rotation per connection (the sender's pool); default 16 MiB / size, 8..1024.
    #[arg(long, value_name = "N")]
    ring: Option<u32>,
    /// Sender writes every word before sending, receiver reads every word after receiving.
    #[arg(long)]
    touch: bool,
    /// Bytes the receiver asks for per receive call, as netperf's `-M` (TCP streams): the
    /// copy path's buffer, the mapping path's scratch, the uring path's provided buffers.
    /// Default: as many as the sender writes, at least 256 KiB.
    #[arg(long, value_name = "BYTES", value_parser = size_arg)]
    read_size: Option<u64>,
    /// Request/response ping-pong (NetPIPE): round-trip latency and bandwidth by size.
    #[arg(long)]
    rr: bool,
    /// Pin the data threads: receivers to the first CPU this process may use, senders to
    /// the second (needs 2), as `taskset -c 0` / `-c 1` would pin two processes.
    #[arg(long)]
    pin: bool,
    /// Runs per configuration; medians and ranges are reported.
    #[arg(long, default_value_t = 3, value_name = "N")]
    repeat: u32,
    /// Where the two ends live.
    #[arg(long, value_enum, default_value = "loopback")]
    topology: Topology,
    /// Link MTU for --topology netns|sink (default 1500).
    #[arg(long, value_name = "N")]
    mtu: Option<u32>,
    /// One JSON object on stdout (schema in docs/bench.md) instead of a table. iperf3 mode
    /// (-J): iperf3's JSON document, with zcnet's figures under `end.zcnet`.
    #[arg(long, short = 'J')]
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
    /// Only these experiments of the suite (ids: crossover, touch, ring, streams, loan,
    /// ftp, rr).
    #[arg(long, value_name = "ID,…", requires = "suite", value_delimiter = ',')]
    only: Vec<String>,
}

impl Args {
    fn tx(&self) -> &str {
        self.tx.as_deref().unwrap_or("all")
    }

    fn rx(&self) -> &str {
        self.rx.as_deref().unwrap_or("all")
    }
}

/// The first option given that only iperf3 mode reads.
fn iperf3_only(args: &Args) -> Option<&'static str> {
    [
        (args.port.is_some(), "-p/--port"),
        (args.reverse, "-R/--reverse"),
        (args.bidir, "--bidir"),
        (args.json_stream, "--json-stream"),
        (args.logfile.is_some(), "--logfile"),
        (args.interval.is_some(), "-i/--interval"),
        (args.zerocopy, "-Z/--zerocopy"),
        (args.no_delay, "-N/--no-delay"),
        (args.max_memory.is_some(), "--max-memory"),
        (args.iperf3_udp, "-u/--udp"),
        (args.bitrate.is_some(), "-b/--bitrate"),
        (args.udp_counters_64bit, "--udp-counters-64bit"),
    ]
    .into_iter()
    .find_map(|(given, name)| given.then_some(name))
}

/// The first option given that iperf3 mode does not read.
fn bench_only(args: &Args) -> Option<&'static str> {
    [
        (args.rr, "--rr"),
        (args.proto != ProtoArg::Tcp, "--proto"),
        (args.topology != Topology::Loopback, "--topology"),
        (args.mtu.is_some(), "--mtu"),
        (args.ring.is_some(), "--ring"),
        (args.touch, "--touch"),
        (args.read_size.is_some(), "--read-size"),
        (args.plot.is_some(), "--plot"),
        (args.suite.is_some(), "--suite"),
        (args.server, "--server"),
        (args.client.is_some(), "--client"),
    ]
    .into_iter()
    .find_map(|(given, name)| given.then_some(name))
}

/// `-s` / `-c HOST`: iperf3's protocol, zcnet's paths on this end.
fn iperf3_mode(args: &Args) -> Result<(), BenchError> {
    if let Some(flag) = bench_only(args) {
        return Err(BenchError::Usage(format!(
            "{flag} is not an iperf3-mode option (-s / -c speak iperf3's protocol)"
        )));
    }
    let tx_name = args
        .tx
        .as_deref()
        .unwrap_or(if args.zerocopy { "file" } else { "auto" });
    if args.zerocopy && tx_name != "file" {
        return Err(BenchError::Usage(format!(
            "-Z sends from a file (--tx file); it cannot be combined with --tx {tx_name}"
        )));
    }
    let (file, tx) = match tx_name {
        "file" => (true, zcnet::TxPath::Copy),
        t => (false, workers::tx_path(t)?),
    };
    let (rx_file, rx) = match args.rx.as_deref().unwrap_or("auto") {
        "file" => (true, zcnet::RxPath::Copy),
        r => (false, workers::rx_path(r)?),
    };
    let interval = args.interval.unwrap_or(1.0);
    if !(0.0..=60.0).contains(&interval) {
        return Err(BenchError::Usage(
            "-i: seconds between reports, 0 (none) to 60".into(),
        ));
    }
    let common = iperf3::Common {
        tx,
        file,
        rx,
        rx_file,
        interval,
        format: if args.json_stream {
            iperf3::Format::JsonStream
        } else if args.json {
            iperf3::Format::Json
        } else {
            iperf3::Format::Text
        },
        logfile: args.logfile.clone(),
    };
    let port = args.port.unwrap_or(zcnet_bench::iperf3::DEFAULT_PORT);
    let max_memory = match &args.max_memory {
        None => zcnet_bench::iperf3::budget::DEFAULT_MAX_MEMORY,
        Some(_) if !args.iperf3_server => {
            return Err(BenchError::Usage(
                "--max-memory is a server option (-s)".into(),
            ))
        }
        Some(s) => parse_size(s).map_err(|e| BenchError::Usage(format!("--max-memory: {e}")))?,
    };
    if args.iperf3_server {
        topology::install_interrupt_handler();
        let host = args.bind.as_deref().unwrap_or("127.0.0.1");
        let addr = if host
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            topology::resolve(host)?
        } else {
            topology::resolve(&format!("{host}:{port}"))?
        };
        let listener = TcpListener::bind(addr)
            .map_err(|e| BenchError::io_owned(format!("binding {addr}"), e))?;
        let local = listener
            .local_addr()
            .map_err(|e| BenchError::io("getsockname", e))?;
        if common.format == iperf3::Format::Text {
            println!("-----------------------------------------------------------");
            println!(
                "Server listening on {local} (iperf3 protocol; zcnet tx {tx_name}, rx {})",
                common.rx_name()
            );
            println!("-----------------------------------------------------------");
        } else {
            eprintln!("zcnet bench -s: listening on {local} (iperf3 protocol)");
        }
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        let stop = AtomicBool::new(false);
        return iperf3::serve(
            iperf3::ServerOpts {
                once: args.once,
                max_memory,
                common,
            },
            listener,
            &stop,
        );
    }
    if args.once || args.bind.is_some() {
        return Err(BenchError::Usage(
            "-1 and --bind are server options (-s)".into(),
        ));
    }
    let host = args.iperf3_client.clone().unwrap_or_default();
    let udp = args.iperf3_udp;
    if !udp && (args.bitrate.is_some() || args.udp_counters_64bit) {
        return Err(BenchError::Usage(
            "-b and --udp-counters-64bit are UDP options (-u)".into(),
        ));
    }
    let bandwidth = match &args.bitrate {
        None => zcnet_bench::iperf3::udp::DEFAULT_UDP_RATE,
        Some(b) => parse_rate(b).map_err(|e| BenchError::Usage(format!("-b: {e}")))?,
    };
    let len = match &args.size {
        None if udp => zcnet_bench::iperf3::udp::DEFAULT_UDP_BLKSIZE,
        None => zcnet_bench::iperf3::DEFAULT_BLKSIZE,
        Some(s) => match parse_sizes(s).map_err(|e| BenchError::Usage(e.to_string()))?[..] {
            [one] => one,
            _ => {
                return Err(BenchError::Usage(
                    "-l: one size in iperf3 mode (a sweep is the bench's --size)".into(),
                ))
            }
        },
    };
    let time = match args.time {
        None => zcnet_bench::iperf3::DEFAULT_SECONDS,
        Some(t) if t > 0.0 && t <= 86_400.0 => t.ceil() as u32,
        Some(_) => return Err(BenchError::Usage("-t: 1 to 86400 seconds".into())),
    };
    let params = zcnet_bench::iperf3::TestParams {
        time,
        bytes: args.bytes.unwrap_or(0),
        parallel: args.streams,
        len,
        direction: zcnet_bench::iperf3::TestParams::direction_of(args.reverse, args.bidir),
        nodelay: args.no_delay,
        zerocopy: file,
        udp,
        bandwidth: if udp { bandwidth } else { 0 },
        udp_counters_64bit: args.udp_counters_64bit,
        ..Default::default()
    };
    if udp && file {
        return Err(BenchError::Usage(
            "-Z / --tx file send TCP streams from a file; a UDP test (-u) sends datagrams".into(),
        ));
    }
    // What the server would check, checked here first, with the same words.
    zcnet_bench::iperf3::TestParams::from_json(&params.to_json())
        .map_err(|e| BenchError::Usage(e.to_string()))?;
    iperf3::client(&iperf3::ClientOpts {
        host,
        port,
        params,
        udp_len_from_mss: udp && args.size.is_none(),
        common,
    })
}

/// A bit rate as iperf3's `-b` takes it: a number with an optional K, M, G or T suffix
/// (powers of 1000).
fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1e3),
        Some('m' | 'M') => (&t[..t.len() - 1], 1e6),
        Some('g' | 'G') => (&t[..t.len() - 1], 1e9),
        Some('t' | 'T') => (&t[..t.len() - 1], 1e12),
        _ => (t, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a rate (e.g. 100M)"))?;
    if !(v >= 0.0 && (v * mult).is_finite()) {
        return Err(format!("{s:?} is not a rate (e.g. 100M)"));
    }
    Ok((v * mult) as u64)
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

/// Entry point from `main`.
pub fn run(args: &Args) -> Result<(), String> {
    run_inner(args).map_err(|e| e.to_string())
}

fn run_inner(args: &Args) -> Result<(), BenchError> {
    if let Some(d) = &args.file_dir {
        if !d.is_dir() {
            return Err(BenchError::Usage(format!(
                "--file-dir {}: not a directory",
                d.display()
            )));
        }
    }
    let window = match &args.file_window {
        Some(w) => {
            Some(parse_size(w).map_err(|e| BenchError::Usage(format!("--file-window: {e}")))?)
        }
        None => None,
    };
    files::set_up(files::FileSetup {
        dir: args.file_dir.clone(),
        cold: args.cold,
        window,
    });
    if args.iperf3_server || args.iperf3_client.is_some() {
        return iperf3_mode(args);
    }
    if let Some(flag) = iperf3_only(args) {
        return Err(BenchError::Usage(format!(
            "{flag} belongs to iperf3 mode: add -s (serve iperf3's protocol) or -c HOST"
        )));
    }
    if args.once && !args.server {
        return Err(BenchError::Usage("--once (-1) needs --server or -s".into()));
    }
    if args.bind.is_some() && !args.server {
        return Err(BenchError::Usage("--bind needs --server or -s".into()));
    }
    if args.server {
        return serve_standalone(args);
    }
    if let Some(name) = args.suite {
        let opts = suite::SuiteOptions {
            out: args.out.clone(),
            quick: args.quick,
            only: args.only.clone(),
            repeat: args.repeat,
            time: args.time,
        };
        return suite::run(name, &opts);
    }
    if args.pin {
        pin::set().map_err(BenchError::Usage)?;
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
    } else if args.rx().split(',').any(|r| r.trim() == "gro") {
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
        if args.rx() != "all" {
            return Err(BenchError::Usage(
                "the sink has no receiver: leave --rx out".into(),
            ));
        }
    }
    let (txs, rxs) = if env.is_sink() && udp {
        let mut txs = udp_paths(args.tx(), &UDP_TX, "transmit")?;
        if args.tx() == "all" {
            txs.retain(|t| t != Transport::LM);
        } else if txs.iter().any(|t| t == Transport::LM) {
            return Err(BenchError::Usage(
                "the sink has no receiver to admit Lightweight Messages: --tx lm needs an \
                 answering peer (--topology netns)"
                    .into(),
            ));
        }
        (txs, vec!["none".to_string()])
    } else if udp {
        (
            udp_paths(args.tx(), &UDP_TX, "transmit")?,
            udp_paths(args.rx(), &UDP_RX, "receive")?,
        )
    } else if env.is_sink() {
        let mtu = env.info().mtu.unwrap_or(1500);
        for &s in &sizes {
            sink::check_size(s, mtu).map_err(BenchError::Usage)?;
        }
        (
            parse_paths(args.tx(), &sink::SINK_TX, "transmit (sink: UDP)", false)?,
            vec!["none".to_string()],
        )
    } else {
        // Against a remote server, receive paths this build does not know may be ones the
        // server knows: it decides, and rejects with a reason if not.
        let remote = matches!(env, Env::Remote { .. });
        // The file paths (sendfile from a page-cache file, splice into a file) are stream
        // paths of the bench, not zcnet paths: no request/response without a message.
        let (mut known_tx, mut known_rx) = (tx_names(), rx_names());
        if mode == Mode::Stream {
            known_tx.push(files::FILE);
            known_rx.push(files::FILE);
            // read_send is file's yardstick, named when wanted (tune does), not swept by
            // `all`.
            if args.tx().trim() != "all" {
                known_tx.push(files::READ_SEND);
            }
        } else if [args.tx(), args.rx()].iter().any(|l| {
            l.split(',')
                .any(|p| [files::FILE, files::READ_SEND].contains(&p.trim()))
        }) {
            return Err(BenchError::Usage(
                "--tx/--rx file are stream paths (a file sent or received whole); --rr \
                 exchanges messages from memory"
                    .into(),
            ));
        }
        (
            parse_paths(args.tx(), &known_tx, "transmit", false)?,
            parse_paths(args.rx(), &known_rx, "receive", remote)?,
        )
    };
    let twin = twin_pair(&txs, &rxs);
    let mut specs = Vec::new();
    for repeat in 0..args.repeat {
        for &size in &sizes {
            let first = specs.len();
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
                        read: args.read_size,
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
                        let mut known_tx = tx_names();
                        known_tx.extend([files::FILE, files::READ_SEND]);
                        params.validate(&known_tx, &known_rx)
                    }
                    .map_err(|r| BenchError::Usage(r.0))?;
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
            turn(&mut specs[first..], twin.as_ref(), repeat as usize);
            // The twin last, after `auto → auto`: as far from its first measurement as
            // this size's runs allow.
            let again = twin.as_ref().and_then(|(t, r)| {
                specs[first..]
                    .iter()
                    .find(|s: &&RunSpec| &s.params.tx == t && &s.params.rx == r)
                    .cloned()
            });
            if let Some(mut s) = again {
                s.label = zcnet_bench::measure::TWIN.to_string();
                specs.push(s);
            }
        }
    }
    if specs.is_empty() {
        return Err(BenchError::Usage(format!(
            "--tx {} --rx {}: no pair of these paths can meet (lm is a transport of its own and \
             pairs only with lm)",
            args.tx(),
            args.rx()
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

/// Orders one repeat's runs of one size: the twin's pair (if any) first, as its twin closes
/// the round, and the others turned `repeat` places, so that over the repeats every pair
/// runs at every place in the round and after every other pair. Without the turn each pair
/// kept its place: over veth at 16K, one sitting read `copy → mmap`, always second right
/// after `copy → copy`, at 1.549 CPU-s/GiB and `auto → mmap`, always fifth, at 1.773; the
/// same two alone, in either order, read within 3 % of each other.
fn turn(group: &mut [RunSpec], twin: Option<&(String, String)>, repeat: usize) {
    let lead = twin.and_then(|(t, r)| {
        group
            .iter()
            .position(|s| &s.params.tx == t && &s.params.rx == r)
    });
    let rest = match lead {
        Some(i) => {
            group[..=i].rotate_right(1);
            &mut group[1..]
        }
        None => group,
    };
    if !rest.is_empty() {
        let k = repeat % rest.len();
        rest.rotate_left(k);
    }
}

/// Where the run compares `auto → auto` with the best pair of single paths, the pair measured
/// twice (interleaved, the second time labelled [`zcnet_bench::measure::TWIN`]): `copy →
/// copy` if both lists have it, else the first pair of single paths. How far its two
/// measurements read apart is the noise floor printed beside the comparison — a gap
/// smaller than that is this sitting's noise, not a wrong choice.
fn twin_pair(txs: &[String], rxs: &[String]) -> Option<(String, String)> {
    let auto = |l: &[String]| l.iter().any(|p| p == "auto");
    if !auto(txs) || !auto(rxs) {
        return None;
    }
    use zcnet::tuning::AutoPath as _;
    let is_pair = |t: &String, r: &String| {
        zcnet::tuning::PathPair::from_name(&format!("{t}/{r}")).is_some()
            && !(t == "auto" || r == "auto")
    };
    let pairs = || {
        txs.iter()
            .flat_map(move |t| rxs.iter().map(move |r| (t, r)))
            .filter(|(t, r)| is_pair(t, r))
    };
    pairs()
        .find(|(t, r)| *t == "copy" && *r == "copy")
        .or_else(|| pairs().next())
        .map(|(t, r)| (t.clone(), r.clone()))
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

fn describe(args: &Args, env: &Env, runs: usize) -> String {
    let t = env.info();
    let mut s = t.name.clone();
    if let Some(m) = t.mtu {
        s += &format!(" (MTU {m})");
    }
    if args.proto == ProtoArg::Udp && env.is_sink() {
        s += ", UDP messages (zcnet_msg's sender)";
    } else if args.proto == ProtoArg::Udp {
        s += ", UDP messages (zcnet_msg";
        if args.tx() == "all" || args.tx().split(',').any(|t| t.trim() == Transport::LM) {
            s += " and zcnet_afxdp over AF_XDP";
        }
        s += "; every byte verified)";
    }
    if args.streams > 1 {
        s += &format!(", {} streams", args.streams);
    }
    if let Some((rx, tx)) = pin::cpus() {
        s += &format!(", receivers pinned to CPU {rx} and senders to CPU {tx}");
    }
    if args.touch {
        s += ", data touched";
    }
    if let Some(r) = args.read_size {
        s += &format!(
            ", receivers read at most {} per call",
            zcnet_bench::sizes::ByteSize(r)
        );
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
