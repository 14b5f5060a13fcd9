//! The measurement record `zcnet bench --json` prints and the server sends back over the
//! control connection. Its field names and meanings are a public, versioned schema
//! (`docs/bench.md`): add fields freely, but rename or change the meaning of one only
//! together with [`SCHEMA_VERSION`].
//!
//! What is measured follows the papers: throughput alone misleads (Solaris §5.7; CMU §4),
//! so every run carries the CPU time of each side's workers (`getrusage(RUSAGE_THREAD)`),
//! the whole machine's busy time from `/proc/stat` (softirq included: receive processing
//! runs there and `getrusage` charges it to whoever was interrupted), CPU-seconds per GiB
//! (the inverse of the CMU paper's efficiency, throughput / utilisation), the share of bytes
//! that really went without a copy, and per-call latency.

use super::histogram::LatencySummary;
use super::summary::Summary;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use zcnet::stats::StatsSnapshot;
use zcnet::tuning::Spread;

/// Version of the `--json` schema; bump on any incompatible change.
pub const SCHEMA_VERSION: u32 = 1;

/// Bytes in a GiB.
pub const GIB: f64 = (1u64 << 30) as f64;

/// What `--json` prints: one object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`SCHEMA_VERSION`].
    pub schema: u32,
    /// The machine that ran the client (and, locally, the server too).
    pub host: Host,
    /// Every run, repeats included, in the order they ran.
    pub runs: Vec<Run>,
    /// One row per configuration: medians and ranges over its repeats.
    #[serde(default)]
    pub summary: Vec<SummaryRow>,
    /// The one-line verdict, when the runs allow one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    /// `auto → auto` against the best pair of single paths at each size, with the same
    /// pair measured twice beside it, as the text report's last table shows them
    /// (`measure::pair_gaps`); empty where the runs have no `auto → auto`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pair_gaps: Vec<PairGap>,
}

/// The host a report comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Host {
    /// `uname -r`.
    pub kernel: String,
    /// Online CPUs.
    pub cpus: usize,
    /// CPU model from /proc/cpuinfo, if known.
    #[serde(default)]
    pub cpu_model: String,
    /// Host name.
    #[serde(default)]
    pub hostname: String,
    /// zcnet version that measured.
    #[serde(default)]
    pub zcnet: String,
}

/// Transfer pattern of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// ttcp/iperf: the client streams, the server receives.
    Stream,
    /// NetPIPE ping-pong: the client sends `size` bytes, the server sends them back.
    Rr,
}

impl Mode {
    /// JSON/CLI name.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Stream => "stream",
            Mode::Rr => "rr",
        }
    }
}

/// User and system CPU seconds of one side's worker threads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SideCpu {
    /// User seconds.
    pub user: f64,
    /// System seconds.
    pub sys: f64,
}

impl SideCpu {
    /// user + sys.
    pub fn total(&self) -> f64 {
        self.user + self.sys
    }

    /// Field-by-field sum.
    pub fn add(&self, o: &SideCpu) -> SideCpu {
        SideCpu {
            user: self.user + o.user,
            sys: self.sys + o.sys,
        }
    }
}

/// Whole-machine busy seconds over a run, from /proc/stat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SystemCpuTimes {
    /// user + nice.
    pub user: f64,
    /// system + irq.
    pub sys: f64,
    /// softirq (network receive, transmit completion).
    pub softirq: f64,
}

impl SystemCpuTimes {
    /// All busy seconds.
    pub fn busy(&self) -> f64 {
        self.user + self.sys + self.softirq
    }

    /// Busy time since `start` (a [`crate::cpu::SystemCpu::now`] reading); `None` when
    /// /proc/stat could not be read at either end.
    pub fn since(start: Option<crate::cpu::SystemCpu>) -> Option<SystemCpuTimes> {
        let (a, b) = (start?, crate::cpu::SystemCpu::now()?);
        Some(b.since(&a).into())
    }
}

impl From<crate::cpu::SystemCpu> for SystemCpuTimes {
    /// /proc/stat counts in clock ticks: rounding to microseconds drops the float noise of
    /// subtracting two large tick sums and loses nothing real.
    fn from(c: crate::cpu::SystemCpu) -> Self {
        let us = |x: f64| (x * 1e6).round() / 1e6;
        SystemCpuTimes {
            user: us(c.user),
            sys: us(c.sys + c.irq),
            softirq: us(c.softirq),
        }
    }
}

/// CPU of a run: both sides' workers and the machine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Cpu {
    /// The client's worker threads (the sender of a stream run).
    pub sender: SideCpu,
    /// The server's worker threads (the receiver of a stream run). Zero for `sink`.
    pub receiver: SideCpu,
    /// The client host, whole machine (on loopback and netns: both sides and the kernel).
    pub system: SystemCpuTimes,
    /// The server host, whole machine, as the server measured it (same machine as
    /// `system` for the local topologies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_system: Option<SystemCpuTimes>,
}

/// An operation count and its bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpsBytes {
    /// Operations.
    pub ops: u64,
    /// Bytes.
    pub bytes: u64,
}

/// What one side's [`StatsSnapshot`] says, in a form that travels over the control
/// connection and into the report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SideStats {
    /// Bytes sent by plain `send`.
    pub tx_bytes_copy: u64,
    /// Bytes sent zero-copy.
    pub tx_bytes_zerocopy: u64,
    /// Of those, bytes the kernel reported as copied anyway (`SO_EE_CODE_ZEROCOPY_COPIED`).
    pub tx_bytes_zc_copied: u64,
    /// Bytes received by mapping pages.
    pub rx_bytes_mapped: u64,
    /// Bytes received by copying.
    pub rx_bytes_copied: u64,
    /// Bytes sent from a file by `sendfile`/`splice` (no user-space copy).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tx_bytes_file: u64,
    /// Bytes spliced from the socket into a file.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rx_bytes_file: u64,
    /// Times a sender waited for a buffer to come back (ring too shallow, Solaris §3.2.4).
    pub pool_waits: u64,
    /// Sockets that stopped asking for zero-copy after repeated COPIED completions.
    pub tx_demotions: u64,
    /// `ENOBUFS` returns.
    pub tx_enobufs: u64,
    /// Fallbacks to copying, by reason name.
    pub fallbacks: BTreeMap<String, OpsBytes>,
    /// The `auto` path's decisions, diversions and demotions on this side (absent when the
    /// side did not run `auto`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub auto: zcnet::auto::AutoStats,
    /// UDP message runs: this side's `zcnet_msg::MsgStats` counters by name (datagrams,
    /// GSO calls, GRO reads, losses by reason, …) and the bench's own (`lost_tail`,
    /// `window_stalls`, `acks`, `late_replies`, `trips_lost`). Absent for TCP.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub msg: BTreeMap<String, u64>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

impl From<&StatsSnapshot> for SideStats {
    fn from(s: &StatsSnapshot) -> Self {
        SideStats {
            tx_bytes_copy: s.tx_bytes_copy,
            tx_bytes_zerocopy: s.tx_bytes_zerocopy,
            tx_bytes_zc_copied: s.tx_bytes_zc_copied,
            rx_bytes_mapped: s.rx_bytes_mapped,
            rx_bytes_copied: s.rx_bytes_copied,
            tx_bytes_file: s.tx_bytes_file,
            rx_bytes_file: s.rx_bytes_file,
            pool_waits: s.pool_waits,
            tx_demotions: s.tx_demotions,
            tx_enobufs: s.tx_enobufs,
            fallbacks: s
                .fallbacks
                .iter()
                .map(|&(r, ops, bytes)| (r.name().to_string(), OpsBytes { ops, bytes }))
                .collect(),
            auto: {
                let mut a = s.auto_tx;
                a.add(&s.auto_rx);
                a
            },
            msg: BTreeMap::new(),
        }
    }
}

impl SideStats {
    /// Adds `o` (the streams of one side merge into one record).
    pub fn merge(&mut self, o: &SideStats) {
        self.tx_bytes_copy += o.tx_bytes_copy;
        self.tx_bytes_zerocopy += o.tx_bytes_zerocopy;
        self.tx_bytes_zc_copied += o.tx_bytes_zc_copied;
        self.rx_bytes_mapped += o.rx_bytes_mapped;
        self.rx_bytes_copied += o.rx_bytes_copied;
        self.tx_bytes_file += o.tx_bytes_file;
        self.rx_bytes_file += o.rx_bytes_file;
        self.pool_waits += o.pool_waits;
        self.tx_demotions += o.tx_demotions;
        self.tx_enobufs += o.tx_enobufs;
        self.auto.add(&o.auto);
        for (k, v) in &o.msg {
            *self.msg.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &o.fallbacks {
            let e = self.fallbacks.entry(k.clone()).or_default();
            e.ops += v.ops;
            e.bytes += v.bytes;
        }
    }

    /// Share of sent bytes that went zero-copy and were not copied by the kernel anyway,
    /// or went from the page cache by `sendfile` (as `zcnet::StatsSnapshot` counts them).
    pub fn tx_zerocopy_fraction(&self) -> f64 {
        let total = self.tx_bytes_copy + self.tx_bytes_zerocopy + self.tx_bytes_file;
        if total == 0 {
            return 0.0;
        }
        (self
            .tx_bytes_zerocopy
            .saturating_sub(self.tx_bytes_zc_copied)
            + self.tx_bytes_file) as f64
            / total as f64
    }

    /// Share of received bytes that were mapped rather than copied (bytes spliced into a
    /// file count as copied: the pipe-to-file step copies them into the page cache).
    pub fn rx_mapped_fraction(&self) -> f64 {
        let total = self.rx_bytes_mapped + self.rx_bytes_copied + self.rx_bytes_file;
        if total == 0 {
            return 0.0;
        }
        self.rx_bytes_mapped as f64 / total as f64
    }
}

/// Everything one side measured in one run; the server sends its own back in
/// [`super::protocol::Message::Result`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SideReport {
    /// Payload bytes this side sent.
    pub bytes_sent: u64,
    /// Payload bytes this side received.
    pub bytes_received: u64,
    /// UDP message runs: messages this side sent whole (each `size` bytes).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub messages_sent: u64,
    /// UDP message runs: messages this side received whole, every byte verified.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub messages_received: u64,
    /// UDP message runs: of the peer's messages, those this side never received — the ids
    /// below the peer's count that were not delivered (reported lost by `zcnet_msg` with a
    /// reason, or vanished at the end of the run where nothing can reveal them).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub messages_lost: u64,
    /// Wall-clock seconds of this side's data phase.
    pub seconds: f64,
    /// CPU of this side's worker threads, summed.
    pub cpu: SideCpu,
    /// This host's /proc/stat over the data phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<SystemCpuTimes>,
    /// Counters of this side's senders and receivers, merged.
    pub stats: SideStats,
    /// Duration of each `send` call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_latency: Option<LatencySummary>,
    /// Duration of each `recv` call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recv_latency: Option<LatencySummary>,
    /// Request/response round trips (client of an `rr` run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt: Option<LatencySummary>,
    /// Receive path really in effect (a path may fall back to copy on this host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_path_in_effect: Option<String>,
}

/// Per-call latency of a run, microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// `send()` calls of the sender (client).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send: Option<LatencySummary>,
    /// `recv()` calls of the receiver (server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recv: Option<LatencySummary>,
    /// Round trips of an `rr` run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt: Option<LatencySummary>,
}

/// Fallbacks of a run, by side and reason.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Fallbacks {
    /// The sender's (client's).
    pub sender: BTreeMap<String, OpsBytes>,
    /// The receiver's (server's).
    pub receiver: BTreeMap<String, OpsBytes>,
}

/// One measured run: the schema's `runs[]` element.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// Experiment label (the papers suite names its runs), empty otherwise.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub label: String,
    /// `stream` or `rr`.
    pub mode: Mode,
    /// Transmit path name.
    pub tx: String,
    /// Receive path name (`none` for `sink`).
    pub rx: String,
    /// `loopback`, `netns`, `sink` or `remote`.
    pub topology: String,
    /// `tcp`, or `udp` for `sink`.
    pub transport: String,
    /// MTU of the link, when the topology chose one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Bytes per send call (and per request/response in `rr`).
    pub size: u64,
    /// Concurrent connections.
    pub streams: u32,
    /// Buffers in rotation per connection (the sender's pool).
    pub ring: u32,
    /// Sender wrote and receiver read every word of the data.
    pub touch: bool,
    /// Bytes the receiver asked for per receive call (`--read-size`), when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_size: Option<u64>,
    /// Index of this run among the repeats of its configuration (0-based).
    pub repeat: u32,
    /// Payload bytes the client sent.
    pub bytes_sent: u64,
    /// Payload bytes the server received (equal to `bytes_sent`, or the run fails; for
    /// `sink`, the bytes the device took and dropped: equal by construction).
    pub bytes_received: u64,
    /// Wall-clock seconds of the data phase.
    pub seconds: f64,
    /// Payload throughput, 10^9 bits per second (one direction; `rr` counts both).
    pub gbit_per_s: f64,
    /// CPU seconds.
    pub cpu: Cpu,
    /// Whole-machine busy CPU seconds per GiB moved (both ends on the local topologies).
    pub cpu_s_per_gib: f64,
    /// Sender workers' CPU seconds per GiB.
    pub sender_cpu_s_per_gib: f64,
    /// Receiver workers' CPU seconds per GiB (0 for `sink`).
    pub receiver_cpu_s_per_gib: f64,
    /// CMU efficiency: Gbit/s per fully busy core (throughput / whole-machine utilisation).
    pub gbit_per_core: f64,
    /// Share of sent bytes that really went zero-copy.
    pub zc_fraction_tx: f64,
    /// Share of received bytes that were mapped.
    pub zc_fraction_rx: f64,
    /// Copy fallbacks by side and reason.
    pub fallbacks: Fallbacks,
    /// Per-call latency.
    pub latency: Latency,
    /// Sender-side counters.
    pub sender_stats: SideStats,
    /// Receiver-side counters.
    pub receiver_stats: SideStats,
    /// The receive path fell back (e.g. unsupported here): what really ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_in_effect: Option<String>,
    /// UDP message runs: messages the client sent (requests in `rr`); absent for TCP.
    /// `messages_sent == messages_received + messages_lost` and
    /// `bytes_sent == bytes_received + messages_lost × size`, or the run fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages_sent: Option<u64>,
    /// UDP message runs: of those, messages the server received whole, every byte verified
    /// (for `sink`: the messages the device took, equal to `messages_sent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages_received: Option<u64>,
    /// UDP message runs: of those, messages the server never received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages_lost: Option<u64>,
    /// UDP `rr`: replies the server sent (one per request it received).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replies_sent: Option<u64>,
    /// UDP `rr`: of those, replies the client received whole, every byte verified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replies_received: Option<u64>,
    /// UDP `rr`: of those, replies the client never received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replies_lost: Option<u64>,
}

impl Run {
    /// Whether this is a UDP message run (it counts messages).
    pub fn is_messages(&self) -> bool {
        self.messages_sent.is_some()
    }

    /// Messages delivered per second (`rr`: round trips per second); `None` for TCP.
    pub fn messages_per_s(&self) -> Option<f64> {
        let n = match self.mode {
            Mode::Stream => self.messages_received?,
            Mode::Rr => self.latency.rtt.map_or(0, |l| l.count),
        };
        Some(if self.seconds > 0.0 {
            n as f64 / self.seconds
        } else {
            0.0
        })
    }

    /// Share of messages lost (0..1), both directions together in `rr`; `None` for TCP.
    pub fn loss_fraction(&self) -> Option<f64> {
        let sent = self.messages_sent? + self.replies_sent.unwrap_or(0);
        let lost = self.messages_lost.unwrap_or(0) + self.replies_lost.unwrap_or(0);
        Some(if sent == 0 {
            0.0
        } else {
            lost as f64 / sent as f64
        })
    }

    /// Whether a path asked for could not run as itself on this host: every operation of
    /// one side fell back with reason `unsupported`, or the receive path in effect differs
    /// (except for `auto`, whose path in effect is the one it chose).
    pub fn unsupported(&self) -> bool {
        self.sender_stats.fallbacks.contains_key("unsupported")
            || self.receiver_stats.fallbacks.contains_key("unsupported")
            // `auto` always runs as some concrete path: which one is its choice, not a refusal.
            || (self.rx != "auto" && self.rx_in_effect.as_deref().is_some_and(|p| p != self.rx))
    }

    /// The key that groups repeats of one configuration.
    pub fn config_key(&self) -> ConfigKey {
        ConfigKey {
            label: self.label.clone(),
            mode: self.mode,
            tx: self.tx.clone(),
            rx: self.rx.clone(),
            topology: self.topology.clone(),
            size: self.size,
            streams: self.streams,
            ring: self.ring,
            touch: self.touch,
        }
    }
}

/// What makes runs repeats of one another.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConfigKey {
    /// [`Run::label`].
    pub label: String,
    /// [`Run::mode`].
    pub mode: Mode,
    /// [`Run::tx`].
    pub tx: String,
    /// [`Run::rx`].
    pub rx: String,
    /// [`Run::topology`].
    pub topology: String,
    /// [`Run::size`].
    pub size: u64,
    /// [`Run::streams`].
    pub streams: u32,
    /// [`Run::ring`].
    pub ring: u32,
    /// [`Run::touch`].
    pub touch: bool,
}

/// Medians and ranges of one configuration's repeats: the schema's `summary[]` element.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryRow {
    /// Experiment label.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub label: String,
    /// Mode.
    pub mode: Mode,
    /// Transmit path.
    pub tx: String,
    /// Receive path.
    pub rx: String,
    /// Topology.
    pub topology: String,
    /// Bytes per call.
    pub size: u64,
    /// Connections.
    pub streams: u32,
    /// Ring depth.
    pub ring: u32,
    /// Data touched.
    pub touch: bool,
    /// Some path could not run as itself here (see [`Run::unsupported`]).
    pub unsupported: bool,
    /// Gbit/s.
    pub gbit_per_s: Summary,
    /// Whole-machine CPU-s per GiB.
    pub cpu_s_per_gib: Summary,
    /// Sender CPU-s per GiB.
    pub sender_cpu_s_per_gib: Summary,
    /// Receiver CPU-s per GiB.
    pub receiver_cpu_s_per_gib: Summary,
    /// Sender user seconds per GiB.
    pub sender_user_s_per_gib: Summary,
    /// Receiver user seconds per GiB.
    pub receiver_user_s_per_gib: Summary,
    /// Gbit/s per busy core.
    pub gbit_per_core: Summary,
    /// Zero-copy share, transmit.
    pub zc_fraction_tx: Summary,
    /// Mapped share, receive.
    pub zc_fraction_rx: Summary,
    /// Median send-call p50, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_p50_us: Option<Summary>,
    /// Median send-call p99, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_p99_us: Option<Summary>,
    /// Median recv-call p50, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recv_p50_us: Option<Summary>,
    /// Round-trip p50, µs (`rr`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_p50_us: Option<Summary>,
    /// Round-trip p99, µs (`rr`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_p99_us: Option<Summary>,
    /// Times the sender waited for a buffer, median per run.
    pub pool_waits: Summary,
}

/// The agreement of a UDP message run's two ends in one direction: every message the
/// `sender` sent was either received whole by the `receiver` or counted lost by it, and the
/// bytes follow (every message of a run is `size` bytes), so
/// `bytes_sent == bytes_received + messages_lost × size`. `from`/`to` name the ends.
pub fn check_message_counts(
    sender: &SideReport,
    receiver: &SideReport,
    size: u64,
    from: &str,
    to: &str,
) -> Result<(), crate::refusal::Refusal> {
    counts_agree(sender, receiver, size, from, to).map_err(crate::refusal::Refusal)
}

fn counts_agree(
    sender: &SideReport,
    receiver: &SideReport,
    size: u64,
    from: &str,
    to: &str,
) -> Result<(), String> {
    let bytes = |n: u64| n.saturating_mul(size);
    if sender.bytes_sent != bytes(sender.messages_sent) {
        return Err(format!(
            "the {from} counted {} messages of {size} bytes but {} bytes sent",
            sender.messages_sent, sender.bytes_sent
        ));
    }
    if receiver.bytes_received != bytes(receiver.messages_received) {
        return Err(format!(
            "the {to} counted {} messages of {size} bytes but {} bytes received",
            receiver.messages_received, receiver.bytes_received
        ));
    }
    if receiver
        .messages_received
        .checked_add(receiver.messages_lost)
        != Some(sender.messages_sent)
    {
        return Err(format!(
            "the {from} sent {} messages ({} bytes) but the {to} received {} ({} bytes) and lost {}",
            sender.messages_sent,
            sender.bytes_sent,
            receiver.messages_received,
            receiver.bytes_received,
            receiver.messages_lost
        ));
    }
    Ok(())
}

fn per_gib(seconds: f64, bytes: u64) -> f64 {
    if bytes == 0 {
        0.0
    } else {
        seconds / (bytes as f64 / GIB)
    }
}

/// Groups runs by configuration (first appearance order) and summarises each group.
pub fn summarise(runs: &[Run]) -> Vec<SummaryRow> {
    let mut order: Vec<ConfigKey> = Vec::new();
    let mut groups: BTreeMap<ConfigKey, Vec<&Run>> = BTreeMap::new();
    for r in runs {
        let k = r.config_key();
        if !groups.contains_key(&k) {
            order.push(k.clone());
        }
        groups.entry(k).or_default().push(r);
    }
    order
        .into_iter()
        .filter_map(|k| {
            let g = groups.remove(&k)?;
            let s = |f: &dyn Fn(&Run) -> f64| -> Summary {
                let v: Vec<f64> = g.iter().map(|r| f(r)).collect();
                Summary::of(&v).unwrap_or(Summary {
                    n: v.len(),
                    median: 0.0,
                    min: 0.0,
                    max: 0.0,
                })
            };
            let opt = |f: &dyn Fn(&Run) -> Option<f64>| -> Option<Summary> {
                let v: Option<Vec<f64>> = g.iter().map(|r| f(r)).collect();
                v.and_then(|v| Summary::of(&v))
            };
            Some(SummaryRow {
                label: k.label.clone(),
                mode: k.mode,
                tx: k.tx.clone(),
                rx: k.rx.clone(),
                topology: k.topology.clone(),
                size: k.size,
                streams: k.streams,
                ring: k.ring,
                touch: k.touch,
                unsupported: g.iter().any(|r| r.unsupported()),
                gbit_per_s: s(&|r| r.gbit_per_s),
                cpu_s_per_gib: s(&|r| r.cpu_s_per_gib),
                sender_cpu_s_per_gib: s(&|r| r.sender_cpu_s_per_gib),
                receiver_cpu_s_per_gib: s(&|r| r.receiver_cpu_s_per_gib),
                sender_user_s_per_gib: s(&|r| per_gib(r.cpu.sender.user, r.bytes_sent)),
                receiver_user_s_per_gib: s(&|r| per_gib(r.cpu.receiver.user, r.bytes_received)),
                gbit_per_core: s(&|r| r.gbit_per_core),
                zc_fraction_tx: s(&|r| r.zc_fraction_tx),
                zc_fraction_rx: s(&|r| r.zc_fraction_rx),
                send_p50_us: opt(&|r| r.latency.send.map(|l| l.p50_us)),
                send_p99_us: opt(&|r| r.latency.send.map(|l| l.p99_us)),
                recv_p50_us: opt(&|r| r.latency.recv.map(|l| l.p50_us)),
                rtt_p50_us: opt(&|r| r.latency.rtt.map(|l| l.p50_us)),
                rtt_p99_us: opt(&|r| r.latency.rtt.map(|l| l.p99_us)),
                pool_waits: s(&|r| r.sender_stats.pool_waits as f64),
            })
        })
        .collect()
}

/// Inputs to [`Run`]'s derived figures.
#[derive(Debug, Clone, Copy)]
pub struct Derived {
    /// Payload bytes the efficiency is per (received, or sent for `sink`).
    pub bytes: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Sender workers' CPU.
    pub sender: SideCpu,
    /// Receiver workers' CPU.
    pub receiver: SideCpu,
    /// Whole machine.
    pub system: SystemCpuTimes,
}

impl Derived {
    /// Gbit/s.
    pub fn gbit_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 * 8.0 / self.seconds / 1e9
        } else {
            0.0
        }
    }

    /// Whole-machine busy CPU-s per GiB.
    pub fn cpu_s_per_gib(&self) -> f64 {
        per_gib(self.system.busy(), self.bytes)
    }

    /// Sender CPU-s per GiB.
    pub fn sender_cpu_s_per_gib(&self) -> f64 {
        per_gib(self.sender.total(), self.bytes)
    }

    /// Receiver CPU-s per GiB.
    pub fn receiver_cpu_s_per_gib(&self) -> f64 {
        per_gib(self.receiver.total(), self.bytes)
    }

    /// Gbit moved per busy CPU-second: throughput divided by utilisation in cores (the CMU
    /// paper's efficiency, "Mbit/s supportable if the full CPU were used for
    /// communication"). Falls back to the workers' CPU when /proc/stat saw nothing.
    pub fn gbit_per_core(&self) -> f64 {
        let busy = if self.system.busy() > 0.0 {
            self.system.busy()
        } else {
            self.sender.total() + self.receiver.total()
        };
        if busy > 0.0 {
            self.bytes as f64 * 8.0 / 1e9 / busy
        } else {
            0.0
        }
    }
}

/// How `auto → auto` did against the best single pair at one size.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PairGap {
    /// Operation size.
    pub size: u64,
    /// Touch variant.
    pub touch: bool,
    /// `auto → auto`'s median cost and its range.
    pub auto: Spread,
    /// How many `auto → auto` runs the median is of.
    pub auto_runs: usize,
    /// The cheapest pair of single paths at this size ("tx/rx").
    pub best_pair: String,
    /// Its median cost and range.
    pub best: Spread,
    /// `auto / best − 1` of the medians.
    pub excess: f64,
    /// `auto / best − 1` within each repeat, median over the repeats both ran in: the
    /// repeats are interleaved, so a load that comes and goes over the sitting moves both
    /// sides of each ratio alike and drops out of it. Where the best pair is also the twin
    /// ([`TWIN`](crate::measure::TWIN)), a repeat's `best` is the mean of its two runs there: they bracket the
    /// repeat (first and last), and one run of a pair against itself in a repeat has read
    /// up to a fifth apart.
    pub paired_excess: Option<f64>,
    /// The 90 % interval of `excess` over bootstrap resamples of both rows' runs
    /// ([`ratio_interval`](crate::measure::ratio_interval)): each row's runs drawn apart, so a drift over the sitting
    /// that moves every row of a repeat alike counts as noise here.
    pub excess_interval: Option<(f64, f64)>,
    /// The 90 % interval of `paired_excess` over bootstrap resamples of the repeats
    /// ([`paired_interval`](crate::measure::paired_interval)): what the sitting can tell of `auto` against the best pair,
    /// an interval that straddles one
    /// says these runs cannot tell which side of it `auto` is on.
    pub paired_excess_interval: Option<(f64, f64)>,
    /// The same pair measured twice in this sitting, if it was ([`TWIN`](crate::measure::TWIN)).
    pub twin: Option<Twin>,
}

/// One pair measured twice, interleaved, in one sitting: how far identical configurations
/// read apart, beside which an `auto → auto` gap is read.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Twin {
    /// The pair ("tx/rx").
    pub pair: String,
    /// Its first measurement (the pair's own runs), median and range.
    pub first: Spread,
    /// Its second ([`TWIN`](crate::measure::TWIN)-labelled runs).
    pub second: Spread,
    /// `second / first − 1` of the medians.
    pub gap: f64,
    /// `second / first − 1` within each repeat, median over the repeats.
    pub paired_gap: Option<f64>,
    /// The 90 % interval of `gap` over bootstrap resamples ([`ratio_interval`](crate::measure::ratio_interval)): the
    /// sitting's resolution, measured on a configuration against itself.
    pub gap_interval: Option<(f64, f64)>,
    /// The 90 % interval of `paired_gap` over bootstrap resamples of the repeats
    /// ([`paired_interval`](crate::measure::paired_interval)): the resolution of [`PairGap::paired_excess_interval`].
    pub paired_gap_interval: Option<(f64, f64)>,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use zcnet::stats::Stats;
    use zcnet::FallbackReason;

    pub(crate) fn sample_run(tx: &str, rx: &str, size: u64, cpu: f64) -> Run {
        Run {
            label: String::new(),
            mode: Mode::Stream,
            tx: tx.into(),
            rx: rx.into(),
            topology: "loopback".into(),
            transport: "tcp".into(),
            mtu: None,
            size,
            streams: 1,
            ring: 8,
            touch: false,
            read_size: None,
            repeat: 0,
            bytes_sent: 1 << 30,
            bytes_received: 1 << 30,
            seconds: 1.0,
            gbit_per_s: 8.6,
            cpu: Cpu::default(),
            cpu_s_per_gib: cpu,
            sender_cpu_s_per_gib: cpu / 2.0,
            receiver_cpu_s_per_gib: cpu / 2.0,
            gbit_per_core: 8.6 / cpu,
            zc_fraction_tx: 0.0,
            zc_fraction_rx: 0.0,
            fallbacks: Fallbacks::default(),
            latency: Latency::default(),
            sender_stats: SideStats::default(),
            receiver_stats: SideStats::default(),
            rx_in_effect: None,
            messages_sent: None,
            messages_received: None,
            messages_lost: None,
            replies_sent: None,
            replies_received: None,
            replies_lost: None,
        }
    }

    #[test]
    fn message_counts_must_add_up() {
        let sender = SideReport {
            messages_sent: 10,
            bytes_sent: 10 * 1472,
            ..Default::default()
        };
        let mut receiver = SideReport {
            messages_received: 8,
            bytes_received: 8 * 1472,
            messages_lost: 2,
            ..Default::default()
        };
        assert_eq!(
            check_message_counts(&sender, &receiver, 1472, "client", "server"),
            Ok(())
        );
        receiver.messages_lost = 1;
        let e = check_message_counts(&sender, &receiver, 1472, "client", "server").unwrap_err();
        assert!(
            e.contains("sent 10 messages") && e.contains("lost 1"),
            "{e}"
        );
        receiver.messages_lost = 2;
        receiver.bytes_received -= 1;
        let e = check_message_counts(&sender, &receiver, 1472, "client", "server").unwrap_err();
        assert!(e.contains("bytes received"), "{e}");
        let liar = SideReport {
            bytes_sent: 10 * 1472 + 1,
            ..sender.clone()
        };
        assert!(check_message_counts(&liar, &receiver, 1472, "client", "server").is_err());
        // TCP runs omit the message fields, UDP runs carry them.
        let v = serde_json::to_value(sample_run("copy", "copy", 4096, 0.4)).unwrap();
        assert!(v.get("messages_sent").is_none());
        let mut r = sample_run("zerocopy", "gro", 65536, 0.4);
        r.mode = Mode::Stream;
        r.messages_sent = Some(10);
        r.messages_received = Some(9);
        r.messages_lost = Some(1);
        assert!(r.is_messages());
        assert!((r.loss_fraction().unwrap() - 0.1).abs() < 1e-12);
        assert!((r.messages_per_s().unwrap() - 9.0).abs() < 1e-12);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["messages_lost"], 1);
        assert_eq!(serde_json::from_value::<Run>(v).unwrap(), r);
    }

    #[test]
    fn a_receive_path_in_effect_is_a_refusal_except_for_auto() {
        let mut r = sample_run("copy", "zcrx", 4096, 0.5);
        r.rx_in_effect = Some("uring".into());
        assert!(r.unsupported());
        let mut r = sample_run("copy", "auto", 4096, 0.5);
        r.rx_in_effect = Some("copy".into());
        assert!(!r.unsupported(), "auto chose copy: that is not a refusal");
        r.receiver_stats
            .fallbacks
            .insert("unsupported".into(), OpsBytes { ops: 1, bytes: 0 });
        assert!(r.unsupported());
    }

    #[test]
    fn side_stats_carry_fractions_and_fallbacks() {
        let s = Stats::new();
        s.add_tx_copy_bytes(100);
        s.add_tx_zerocopy_bytes(300);
        s.add_tx_zc_copied_bytes(100);
        s.fallback(FallbackReason::TooSmall, 100);
        let mut a = SideStats::from(&s.snapshot());
        assert!((a.tx_zerocopy_fraction() - 0.5).abs() < 1e-12);
        assert_eq!(a.fallbacks["too_small"], OpsBytes { ops: 1, bytes: 100 });
        let b = a.clone();
        a.merge(&b);
        assert_eq!(a.fallbacks["too_small"], OpsBytes { ops: 2, bytes: 200 });
        assert!((a.tx_zerocopy_fraction() - 0.5).abs() < 1e-12);
        assert_eq!(SideStats::default().rx_mapped_fraction(), 0.0);
    }

    #[test]
    fn derived_figures() {
        let d = Derived {
            bytes: 2 << 30,
            seconds: 2.0,
            sender: SideCpu {
                user: 0.1,
                sys: 0.4,
            },
            receiver: SideCpu {
                user: 0.2,
                sys: 0.3,
            },
            system: SystemCpuTimes {
                user: 0.3,
                sys: 0.7,
                softirq: 0.5,
            },
        };
        assert!((d.gbit_per_s() - 8.589934592).abs() < 1e-9);
        assert!((d.cpu_s_per_gib() - 0.75).abs() < 1e-12);
        assert!((d.sender_cpu_s_per_gib() - 0.25).abs() < 1e-12);
        assert!((d.receiver_cpu_s_per_gib() - 0.25).abs() < 1e-12);
        assert!((d.gbit_per_core() - 17.179869184 / 1.5).abs() < 1e-9);
        let idle = Derived {
            bytes: 0,
            seconds: 0.0,
            ..d
        };
        assert_eq!(idle.gbit_per_s(), 0.0);
        assert_eq!(idle.cpu_s_per_gib(), 0.0);
    }

    #[test]
    fn summary_groups_repeats_in_first_seen_order() {
        let mut runs = vec![
            sample_run("copy", "copy", 4096, 0.5),
            sample_run("zerocopy", "copy", 4096, 0.7),
            sample_run("copy", "copy", 4096, 0.3),
            sample_run("copy", "copy", 4096, 0.4),
        ];
        runs[3]
            .sender_stats
            .fallbacks
            .insert("unsupported".into(), OpsBytes { ops: 1, bytes: 0 });
        let rows = summarise(&runs);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].tx, "copy");
        assert_eq!(rows[0].cpu_s_per_gib.n, 3);
        assert_eq!(rows[0].cpu_s_per_gib.median, 0.4);
        assert!(rows[0].unsupported);
        assert!(!rows[1].unsupported);
        assert_eq!(rows[0].send_p50_us, None);
    }

    #[test]
    fn a_run_serialises_with_the_documented_fields() {
        let v = serde_json::to_value(sample_run("copy", "mmap", 65536, 0.4)).unwrap();
        for k in [
            "tx",
            "rx",
            "topology",
            "size",
            "streams",
            "bytes_sent",
            "bytes_received",
            "seconds",
            "gbit_per_s",
            "cpu",
            "cpu_s_per_gib",
            "zc_fraction_tx",
            "zc_fraction_rx",
            "fallbacks",
        ] {
            assert!(v.get(k).is_some(), "{k} missing");
        }
        for side in ["sender", "receiver"] {
            assert!(v["cpu"][side]["user"].is_number());
            assert!(v["cpu"][side]["sys"].is_number());
        }
        assert!(v["cpu"]["system"]["softirq"].is_number());
        let back: Run = serde_json::from_value(v).unwrap();
        assert_eq!(back, sample_run("copy", "mmap", 65536, 0.4));
    }
}
