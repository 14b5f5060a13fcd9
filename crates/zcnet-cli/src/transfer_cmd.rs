//! `zcnet send` / `zcnet recv`: file transfer over the `file` paths (sendfile out of the page
//! cache, splice into the partial file), with the receiver's safety rules and per-file
//! verification of `docs/transfer-protocol.md`.

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcnet::{Sender, SenderConfig, StatsSnapshot};
use zcnet_bench::cpu::{process_rusage, CpuSeconds};
use zcnet_transfer::names::printable;
use zcnet_transfer::server::{raise_fd_limit, serve, Event, Observer, ServerConfig};
use zcnet_transfer::session::{Entry, FileOutcome, Progress, SendOptions, Source, TransferError};
use zcnet_transfer::streams::send_streams;
use zcnet_transfer::tls::Trust;
use zcnet_transfer::tree::Walk;

/// Options of `zcnet send`.
#[derive(clap::Args, Debug)]
pub struct SendArgs {
    /// Files and directories to send (directories recursively); `-` reads stdin (needs --name).
    #[arg(required = true)]
    paths: Vec<String>,
    /// Receiver address, HOST:PORT.
    #[arg(long)]
    to: String,
    /// Name for the stdin stream.
    #[arg(long)]
    name: Option<String>,
    /// Skip the BLAKE3 check (rely on TCP's checksum alone; see docs/transfer-protocol.md).
    #[arg(long)]
    no_verify: bool,
    /// Pre-shared token, if the receiver requires one.
    #[arg(long, env = "ZCNET_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Small files sent ahead of their answers (1 to 128; protocol version 2).
    #[arg(long, default_value_t = zcnet_transfer::session::DEFAULT_WINDOW,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=zcnet_transfer::session::MAX_WINDOW as u64))]
    window: usize,
    /// Connections to carry a tree (1 to 16; protocol version 5, one session at the
    /// receiver): files are spread over them by size. More pays when one connection's
    /// thread waits — trees of many small files onto a real disk (each stream's fsyncs and
    /// renames overlap the others': 4 streams moved 5000 files of 4-5 KiB 1.2-1.5x faster
    /// on loopback to ext4 here, `bench/streams.sh`) — less for a few large files
    /// (1.15-1.3x), and nothing when the cores are busy. From protocol version 6 a file of
    /// 64 MiB or more (without holes), when it is more than a stream's share of the whole,
    /// is itself split into ranges over the streams.
    /// Default: 2 for 1000 files or more (5000 small files onto a real disk: 1.3x faster
    /// than 1 stream on a 2-core loopback, the same on tmpfs; `bench/ranges.sh`), or for
    /// 2 files or more over 256 KiB (each waits for its answers, the other stream carries
    /// data meanwhile: a 300-file 1 GiB mixed tree 1.2x faster on loopback); one per
    /// two CPUs (1 to 4) when a file of 256 MiB or more is sent (with both ends on 2 cores,
    /// 2 or 4 streams for one 1 GiB file were within the noise of 1); the larger of the
    /// two; else 1.
    #[arg(long,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=zcnet_transfer::wire::MAX_STREAMS as u64))]
    streams: Option<usize>,
    /// Send without encryption (only to a receiver run with --plaintext too), for a network
    /// you trust where CPU is all that matters. By default every session runs inside
    /// TLS 1.3 (protocol version 10).
    #[arg(long, conflicts_with_all = ["fingerprint", "tls_dir"])]
    plaintext: bool,
    /// The receiver's key, as `zcnet recv` prints it (SHA256:…): any other is refused.
    /// Without it, the key recorded for --to in the known hosts is expected (recorded on
    /// first use; a changed key is refused, naming both).
    #[arg(long, value_name = "SHA256:HEX")]
    fingerprint: Option<String>,
    /// Directory of the known hosts (default: $XDG_STATE_HOME/zcnet, else
    /// ~/.local/state/zcnet).
    #[arg(long, value_name = "DIR")]
    tls_dir: Option<PathBuf>,
    /// No progress bars or per-file lines (errors are still printed).
    #[arg(long, short)]
    quiet: bool,
}

/// Options of `zcnet recv`.
#[derive(clap::Args, Debug)]
pub struct RecvArgs {
    /// Address to listen on (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1:7878")]
    listen: String,
    /// Directory to receive into (must exist).
    #[arg(long)]
    dir: PathBuf,
    /// Replace existing files.
    #[arg(long)]
    overwrite: bool,
    /// Continue NAME.partial files after checking their prefix hash, and take a file
    /// already there with the sender's exact contents as done (to finish an interrupted tree).
    #[arg(long)]
    resume: bool,
    /// Cap on the bytes one sender (address, and token when set) may write across its
    /// connections, reservations included (suffixes K, M, G).
    #[arg(long, value_parser = parse_bytes)]
    max_bytes: Option<u64>,
    /// Require senders to prove this pre-shared token.
    #[arg(long, env = "ZCNET_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Serve the first sender that completes a handshake, then exit with its status.
    #[arg(long)]
    once: bool,
    /// Keep setuid, setgid and sticky bits as sent (dropped by default).
    #[arg(long)]
    keep_special_bits: bool,
    /// Sessions at once; more senders are told the receiver is busy.
    #[arg(long, default_value_t = 16)]
    max_sessions: usize,
    /// Connections past their handshake at once from one address: sessions, and each
    /// further stream of a session (`send --streams`) counted as one.
    #[arg(long, default_value_t = 4)]
    max_sessions_per_addr: usize,
    /// Descriptors one session may hold at the receiver: 8 per connection, and each file
    /// arriving by ranges 1 (2 with --resume) until its last range; past it a file is
    /// refused as busy.
    #[arg(long, default_value_t = zcnet_transfer::server::DEFAULT_FDS_PER_SESSION)]
    max_fds_per_session: usize,
    /// Descriptors the sessions of one address may hold together, counted the same way.
    #[arg(long, default_value_t = zcnet_transfer::server::DEFAULT_FDS_PER_ADDR)]
    max_fds_per_addr: usize,
    /// Connections still in their handshake, all addresses (the oldest goes when full).
    #[arg(long, default_value_t = 1024)]
    max_pending: usize,
    /// Connections still in their handshake from one address.
    #[arg(long, default_value_t = 8)]
    max_pending_per_addr: usize,
    /// Time a sender has for its handshake (hello and token proof).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    handshake_timeout: Duration,
    /// Longest wait for the next byte within a session.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    idle_timeout: Duration,
    /// Longest a session may last in all.
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    session_deadline: Duration,
    /// On SIGTERM/SIGINT: how long sessions in flight may go on before they are cut.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    grace: Duration,
    /// Failed token proofs allowed per address per minute.
    #[arg(long, default_value_t = 10)]
    auth_failures_per_minute: usize,
    /// Receive without encryption, from senders run with --plaintext too (others are
    /// refused). By default every session runs inside TLS 1.3 (protocol version 10) and a
    /// sender that does not encrypt is told this receiver requires encryption.
    #[arg(long, conflicts_with_all = ["tls_dir", "tls_cert", "tls_key"])]
    plaintext: bool,
    /// Directory of the TLS identity, generated there on first use (default:
    /// $XDG_STATE_HOME/zcnet, else ~/.local/state/zcnet).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["tls_cert", "tls_key"])]
    tls_dir: Option<PathBuf>,
    /// The TLS certificate (PEM) to present, with --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM, mode 0600) of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// No progress bars or per-file lines.
    #[arg(long, short)]
    quiet: bool,
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    zcnet_bench::sizes::parse_size(s).map_err(|e| e.to_string())
}

fn resolve(s: &str) -> Result<SocketAddr, String> {
    s.to_socket_addrs()
        .map_err(|e| format!("cannot resolve {s:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("{s:?} resolves to no address"))
}

/// Expands the command line into sources with their relative names; the third part is the
/// walk's note for the summary (skipped special files, hard links sent as copies).
fn sources(
    args: &SendArgs,
    warn: &dyn Fn(String),
) -> Result<(Vec<Source>, u64, Option<String>), String> {
    let mut walk = Walk::new();
    for p in &args.paths {
        if p == "-" {
            let name = args
                .name
                .clone()
                .ok_or("sending stdin ('-') needs --name NAME")?;
            // In command-line order among the walked files.
            walk.sources.push(Source::Stream {
                reader: Box::new(std::io::stdin()),
                name,
            });
            continue;
        }
        walk.add(Path::new(p)).map_err(|e| e.to_string())?;
    }
    for s in &walk.skipped {
        warn(format!(
            "skipping {}: {}",
            s.path.display(),
            s.kind.describe()
        ));
    }
    let note = walk.summary();
    Ok((walk.sources, walk.total, note))
}

fn human(n: u64) -> String {
    zcnet::stats::fmt_bytes(n)
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar())
}

/// Per-file and total progress bars (hidden with --quiet or when stderr is not a terminal).
struct Bars {
    multi: MultiProgress,
    total: ProgressBar,
    file: Option<ProgressBar>,
    quiet: bool,
    /// No bars are drawn (`--quiet`, or stderr is not a terminal): asked once, not per line
    /// (indicatif's `is_hidden` asks the terminal, an `ioctl` per call).
    hidden: bool,
    /// Entries (files, directories, symlinks) done, and how many there are when known.
    entries: (usize, Option<usize>),
}

impl Bars {
    /// `total`: bytes to send, when known; `files`: entries to send (files, directories,
    /// symlinks), when known.
    fn new(quiet: bool, total: Option<u64>, files: Option<usize>) -> Bars {
        let hidden = quiet || !std::io::stderr().is_terminal();
        let multi = MultiProgress::with_draw_target(if hidden {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr()
        });
        let t = multi.add(match total {
            Some(n) => ProgressBar::new(n).with_style(style(
                "{msg} {bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
            )),
            None => {
                ProgressBar::no_length().with_style(style("{msg} {bytes} {binary_bytes_per_sec}"))
            }
        });
        let bars = Bars {
            multi,
            total: t,
            file: None,
            quiet,
            hidden,
            entries: (0, files),
        };
        bars.count();
        bars
    }

    /// The entries done (and of how many, when known) at the head of the total bar.
    fn count(&self) {
        if self.hidden {
            return;
        }
        self.total.set_message(match self.entries {
            (done, Some(n)) => format!("{done}/{n} files"),
            (done, None) => format!("{done} files"),
        });
    }

    /// A line above the bars; plain stderr when bars are not drawn (not a terminal), so
    /// scripts still see per-file results.
    fn line(&self, s: String) {
        if self.quiet {
            return;
        }
        if self.hidden {
            eprintln!("{s}");
        } else {
            let _ = self.multi.println(s);
        }
    }

    fn event(&mut self, p: Progress<'_>, verb: &str) {
        match p {
            Progress::Start(name, size, already) => {
                let bar = match size {
                    Some(n) => ProgressBar::new(n).with_style(style(
                        "{msg:30!} {bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
                    )),
                    None => ProgressBar::no_length()
                        .with_style(style("{msg:30!} {bytes} {binary_bytes_per_sec}")),
                };
                bar.set_position(already);
                bar.set_message(printable(name));
                // From protocol 7 a file's answer may come after the next file started:
                // the earlier bar has moved all its bytes and goes now.
                if let Some(b) = self
                    .file
                    .replace(self.multi.insert_before(&self.total, bar))
                {
                    b.finish_and_clear();
                    self.multi.remove(&b);
                }
                self.total.inc(already);
            }
            Progress::Bytes(n) => {
                if let Some(b) = &self.file {
                    b.inc(n);
                }
                self.total.inc(n);
            }
            Progress::Done(o) => {
                // Only the bar of this file: a later file's may be running already.
                if let Some(b) = self
                    .file
                    .take_if(|b| self.hidden || b.message() == printable(&o.name))
                {
                    b.finish_and_clear();
                    self.multi.remove(&b);
                }
                self.entries.0 += 1;
                self.count();
                self.report(o, verb);
            }
        }
    }

    fn report(&self, o: &FileOutcome, verb: &str) {
        match &o.result {
            Ok(()) if o.entry != Entry::File => self.line(format!(
                "{} {}",
                if o.entry == Entry::Dir {
                    "directory"
                } else {
                    "symlink"
                },
                printable(&o.name)
            )),
            Ok(()) => self.line(format!(
                "{verb} {} ({}), {}",
                printable(&o.name),
                human(o.bytes),
                if o.verified {
                    "verified"
                } else {
                    "not verified (--no-verify: TCP checksum only)"
                }
            )),
            Err((code, msg)) => {
                let line = format!("FAILED {}: {msg} ({code:?})", printable(&o.name));
                if self.quiet || self.hidden {
                    eprintln!("zcnet: {line}");
                } else {
                    let _ = self.multi.println(line);
                }
            }
        }
    }
}

fn summary(
    bytes: u64,
    seconds: f64,
    cpu: CpuSeconds,
    st: &StatsSnapshot,
    files: usize,
    failures: usize,
) -> String {
    let gib = bytes as f64 / (1u64 << 30) as f64;
    let mut s = format!(
        "{files} file(s), {failures} failed; {} in {seconds:.2} s = {:.2} Gbit/s; CPU {:.2} s user + {:.2} s sys",
        human(bytes),
        bytes as f64 * 8.0 / seconds.max(1e-9) / 1e9,
        cpu.user,
        cpu.sys
    );
    if gib > 0.0 {
        s += &format!(" = {:.3} CPU-s/GiB", cpu.total() / gib);
    }
    s += &format!("\npaths: {}", zcnet_transfer::paths_summary(st));
    s
}

/// `zcnet send`.
pub fn send(args: &SendArgs) -> Result<(), String> {
    let addr = resolve(&args.to)?;
    let quiet = args.quiet;
    let (srcs, total, walk_note) = sources(args, &|w| {
        if !quiet {
            eprintln!("zcnet: {w}")
        }
    })?;
    let nfiles = srcs.len();
    let has_stream = srcs.iter().any(|s| matches!(s, Source::Stream { .. }));
    // `auto` (the default): file bytes go by sendfile whatever it chooses; it decides the
    // memory sends (control frames, a stdin stream) from this host's profile.
    let warned = AtomicBool::new(false);
    let connect = |/* one per stream */| -> Result<Sender, TransferError> {
        let tx = Sender::connect(addr, &crate::library_opts::sender(SenderConfig::default()))?;
        if !warned.swap(true, Ordering::Relaxed) {
            warn_refused_profile(tx.profile_note(), quiet);
        }
        Ok(tx)
    };
    let opts = {
        let mut o = SendOptions::default();
        o.verify = !args.no_verify;
        o.window = args.window;
        o.token = args.token.as_ref().map(|t| t.as_bytes().to_vec());
        o.security = crate::library_opts::send_security(
            args.plaintext,
            args.fingerprint.as_deref(),
            args.tls_dir.as_deref(),
            &args.to,
        )?;
        o
    };
    let mut bars = Bars::new(quiet, (!has_stream).then_some(total), Some(nfiles));
    let cpu0 = process_rusage().map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let streams = args.streams.unwrap_or_else(|| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        zcnet_transfer::streams::default_streams(&srcs, cpus)
    });
    let sent = send_streams(&connect, streams, srcs, &opts, &mut |p| {
        bars.event(p, "sent")
    })
    .map_err(|e| format!("to {addr}: {e}"))?;
    let report = &sent.report;
    let secs = t0.elapsed().as_secs_f64();
    let cpu = CpuSeconds::between(cpu0, process_rusage().map_err(|e| e.to_string())?);
    bars.total.finish_and_clear();
    let st = sent.total_stats();
    if !quiet {
        eprintln!(
            "{}",
            summary(report.bytes(), secs, cpu, &st, nfiles, report.failures())
        );
        if let Some(n) = walk_note {
            eprintln!("{n}");
        }
        eprintln!("{}", security_line(report.trust.as_ref(), &args.to));
        if let Some(why) = &report.ktls {
            eprintln!("TLS records made in user space, not by the kernel: {why}");
        }
        if let Some(cipher) = report.kernel_tls {
            eprintln!("TLS records made by the kernel (kTLS, {cipher})");
        }
        for why in &sent.refused {
            eprintln!(
                "zcnet: a further stream was not joined ({why}); {} stream(s) carried every file",
                sent.streams
            );
        }
        if sent.streams > 1 {
            eprintln!("over {} streams, one session", sent.streams);
        } else if streams > 1 && args.streams.is_some() && sent.refused.is_empty() {
            eprintln!(
                "zcnet: the receiver speaks no protocol version 5: one stream, not {streams}"
            );
        }
    }
    match report.failures() {
        0 => Ok(()),
        n => Err(format!("{n} of {nfiles} file(s) were not delivered")),
    }
}

/// What protected the session, for the sender's summary.
fn security_line(trust: Option<&Trust>, host: &str) -> String {
    match trust {
        None => "not encrypted (--plaintext): anyone on the path could read and change the data".into(),
        Some(Trust::Pinned(fp)) => format!("encrypted (TLS 1.3) to the pinned key {fp}"),
        Some(Trust::Known(fp)) => {
            format!("encrypted (TLS 1.3) to the key known for {host}, {fp}")
        }
        Some(Trust::FirstUse(fp)) => format!(
            "encrypted (TLS 1.3); first connection to {host}: its key {fp} is now recorded in the known hosts, unverified (compare it with what the receiver printed, or pin it with --fingerprint)"
        ),
    }
}

/// A profile that was refused (foreign, old schema, unreadable) is worth a warning; one that
/// simply was never written is not (`auto` then runs on built-in defaults, as documented).
fn warn_refused_profile(note: Option<&str>, quiet: bool) {
    if let Some(n) = note.filter(|n| !quiet && !n.starts_with("no profile")) {
        eprintln!("zcnet: warning: {n}");
    }
}

/// Logs the server's events and draws a progress bar per session.
struct RecvLog {
    quiet: bool,
    started: std::sync::Mutex<std::collections::HashMap<SocketAddr, zcnet_sys::raw::cpu::Rusage>>,
    /// Connections served (with `--once`, the streams of the one session).
    ended: std::sync::atomic::AtomicUsize,
}

impl Observer for RecvLog {
    fn event(&self, e: Event<'_>) {
        match e {
            Event::SessionStarted { peer } => {
                if let Ok(r) = process_rusage() {
                    self.started
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(peer, r);
                }
            }
            Event::SessionEnded {
                peer,
                result,
                stats,
                elapsed,
            } => {
                self.ended.fetch_add(1, Ordering::Relaxed);
                let cpu0 = self
                    .started
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&peer);
                match result {
                    Err(e) => eprintln!("zcnet: from {peer}: {e}"),
                    Ok(report) => {
                        if !self.quiet {
                            let cpu = match (cpu0, process_rusage()) {
                                (Some(a), Ok(b)) => CpuSeconds::between(a, b),
                                _ => CpuSeconds::default(),
                            };
                            eprintln!(
                                "from {peer}: {}",
                                summary(
                                    report.bytes(),
                                    elapsed.as_secs_f64(),
                                    cpu,
                                    stats,
                                    report.files.len(),
                                    report.failures()
                                )
                            );
                            if let Some(why) = &report.ktls {
                                eprintln!(
                                    "from {peer}: TLS records made in user space, not by the kernel: {why}"
                                );
                            }
                            if let Some(cipher) = report.kernel_tls {
                                eprintln!(
                                    "from {peer}: TLS records made by the kernel (kTLS, {cipher})"
                                );
                            }
                        }
                        if report.failures() > 0 {
                            eprintln!(
                                "zcnet: from {peer}: {} file(s) refused or failed",
                                report.failures()
                            );
                        }
                    }
                }
            }
            Event::Refused { peer, reason } if !self.quiet => {
                eprintln!("zcnet: refused {peer}: {reason}");
            }
            Event::HandshakeFailed { peer, error } if !self.quiet => {
                eprintln!("zcnet: handshake with {peer} failed: {error}");
            }
            Event::Trouble { what } => eprintln!("zcnet: {what} (still serving)"),
            Event::Abandoned { sessions } => eprintln!(
                "zcnet: {sessions} session(s) did not end when their time was over (stuck in a system call); exiting without them, their partial files left partial"
            ),
            Event::Stopping { sessions } if !self.quiet => {
                eprintln!(
                    "zcnet: stopping: no new senders; {sessions} session(s) in flight may finish"
                );
            }
            _ => {}
        }
    }

    fn progress(&self, _peer: SocketAddr) -> Box<dyn FnMut(Progress<'_>) + Send> {
        let mut bars = Bars::new(self.quiet, None, None);
        Box::new(move |p| bars.event(p, "received"))
    }
}

/// `zcnet recv`.
pub fn recv(args: &RecvArgs) -> Result<(), String> {
    let addr = resolve(&args.listen)?;
    let meta = std::fs::metadata(&args.dir).map_err(|e| format!("{}: {e}", args.dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", args.dir.display()));
    }
    let fds = raise_fd_limit();
    let listener =
        std::net::TcpListener::bind(addr).map_err(|e| format!("listening on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let mut cfg = ServerConfig::default();
    cfg.token = args.token.as_ref().map(|t| t.as_bytes().to_vec());
    cfg.store.overwrite = args.overwrite;
    cfg.store.resume = args.resume;
    cfg.store.max_bytes = args.max_bytes;
    cfg.store.keep_special_bits = args.keep_special_bits;
    cfg.max_sessions = args.max_sessions.max(1);
    cfg.max_sessions_per_addr = args.max_sessions_per_addr.max(1);
    cfg.max_fds_per_session = args
        .max_fds_per_session
        .max(zcnet_transfer::descriptors::PER_CONNECTION);
    cfg.max_fds_per_addr = args.max_fds_per_addr;
    cfg.max_pending = args.max_pending.max(1);
    cfg.max_pending_per_addr = args.max_pending_per_addr.max(1);
    cfg.handshake_timeout = args.handshake_timeout;
    cfg.idle_timeout = args.idle_timeout;
    cfg.session_deadline = args.session_deadline;
    cfg.grace = args.grace;
    cfg.auth_failures_per_minute = args.auth_failures_per_minute;
    cfg.once = args.once;
    let cert_key = args.tls_cert.as_deref().zip(args.tls_key.as_deref());
    let (security, identity_line) =
        crate::library_opts::recv_security(args.plaintext, args.tls_dir.as_deref(), cert_key)?;
    cfg.security = security;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || stop.store(true, Ordering::Relaxed))
            .map_err(|e| format!("installing the SIGTERM/SIGINT handler: {e}"))?;
    }
    if !args.quiet {
        eprintln!(
            "zcnet: receiving into {} (up to {} sessions, {} handshakes, {fds} descriptors) on {local}",
            args.dir.display(),
            cfg.max_sessions,
            cfg.max_pending
        );
        match &identity_line {
            Some(l) => eprintln!("{l}"),
            None => eprintln!(
                "zcnet: not encrypted (--plaintext): only senders run with --plaintext are served"
            ),
        }
    }
    // Sessions receive on the copy path with file data spliced, so the profile decides
    // nothing here; one that was refused is still worth saying, once.
    let loaded = zcnet::tuning::load(&zcnet::auto::ProfileSource::DefaultLocation, local.ip());
    warn_refused_profile(loaded.note.as_deref(), args.quiet);
    let observer = Arc::new(RecvLog {
        quiet: args.quiet,
        started: Default::default(),
        ended: Default::default(),
    });
    let outcome =
        serve(listener, &args.dir, cfg, &stop, observer.clone()).map_err(|e| e.to_string())?;
    let streams = observer.ended.load(Ordering::Relaxed);
    if let (Some(Ok(report)), true, false) = (&outcome, streams > 1, args.quiet) {
        // Each stream said its own line; the session's tree as a whole.
        eprintln!(
            "session over {streams} streams: {} file(s), {} failed; {}",
            report.files.len(),
            report.failures(),
            human(report.bytes())
        );
    }
    if stop.load(Ordering::Relaxed) && !args.quiet {
        eprintln!("zcnet: stopped");
    }
    match outcome {
        Some(Ok(report)) if report.failures() > 0 => {
            Err(format!("{} file(s) refused or failed", report.failures()))
        }
        Some(Err(e)) => Err(e.to_string()),
        _ => Ok(()),
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 500ms, 10s, 5m, 1h)"))?;
    let scale = match unit {
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (ms, s, m, h)")),
    };
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("{s:?} is not a duration"));
    }
    Ok(Duration::from_secs_f64(v * scale))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_refuse_nonsense() {
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5h").unwrap(), Duration::from_secs(5400));
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("3d").is_err());
    }
}
