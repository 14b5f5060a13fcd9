//! What a person sees: the tables, the verdict, and the live progress line.

use super::spec::{Progress, Transport};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::fmt::Write as _;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use zcnet_bench::report::{ConfigKey, Mode, Report, Run, SummaryRow};
use zcnet_bench::sizes::ByteSize;
use zcnet_bench::summary::Summary;

/// Printed under sink tables: what the topology shows and why it is UDP only.
pub(crate) const SINK_NOTE: &str = "sink: UDP into a veth whose peer is down — the device drops what it is given, as a NIC frees what it sent, \
so zero-copy pages are never copied for local delivery; only the sender's CPU is measured. \
TCP cannot run here: it cannot complete a handshake with a peer that is down.";

/// `median ±spread%` (spread = (max − min) / median over the repeats).
fn pm(s: &Summary, prec: usize) -> String {
    if s.n > 1 {
        format!(
            "{:.prec$} ±{:.0}%",
            s.median,
            s.relative_spread() * 50.0,
            prec = prec
        )
    } else {
        format!("{:.prec$}", s.median, prec = prec)
    }
}

fn lat(p50: &Option<Summary>, p99: &Option<Summary>) -> String {
    match (p50, p99) {
        (Some(a), Some(b)) => format!("{:.1}/{:.1}", a.median, b.median),
        _ => "-".into(),
    }
}

/// Renders the stream table of `rows`.
pub(crate) fn stream_table(rows: &[&SummaryRow]) -> String {
    let mut s = String::new();
    let sink = rows.iter().any(|r| r.rx == "none");
    let _ = writeln!(
        s,
        "{:<6} {:<9} {:<7} {:>13} {:>8} {:>8} {:>14} {:>8} {:>6} {:>6} {:>6} {:>14}",
        "size",
        "tx",
        "rx",
        "Gbit/s",
        "snd cpu",
        "rcv cpu",
        "machine cpu",
        "Gb/core",
        "tx zc%",
        "rx map",
        "waits",
        "send p50/p99µs"
    );
    for r in rows {
        let mark = if r.unsupported { "*" } else { "" };
        let _ = writeln!(
            s,
            "{:<6} {:<9} {:<7} {:>13} {:>8.3} {:>8} {:>14} {:>8.1} {:>6.1} {:>6.1} {:>6.0} {:>14}",
            ByteSize(r.size).to_string(),
            r.tx,
            format!("{}{mark}{}", r.rx, twin_mark(r)),
            pm(&r.gbit_per_s, 1),
            r.sender_cpu_s_per_gib.median,
            if sink {
                "-".to_string()
            } else {
                format!("{:.3}", r.receiver_cpu_s_per_gib.median)
            },
            pm(&r.cpu_s_per_gib, 3),
            r.gbit_per_core.median,
            r.zc_fraction_tx.median * 100.0,
            r.zc_fraction_rx.median * 100.0,
            r.pool_waits.median,
            lat(&r.send_p50_us, &r.send_p99_us),
        );
    }
    if rows.iter().any(|r| r.unsupported) {
        let _ = writeln!(
            s,
            "* not supported on this host: the path fell back to copying (counted as `unsupported`); run once, then skipped"
        );
    }
    if rows.iter().any(|r| !twin_mark(r).is_empty()) {
        let _ = writeln!(
            s,
            "² the same pair measured a second time, interleaved: how far identical configurations read apart"
        );
    }
    s
}

/// `²` on the row of a pair's second measurement ([`zcnet_bench::measure::TWIN`]).
fn twin_mark(r: &SummaryRow) -> &'static str {
    if r.label == zcnet_bench::measure::TWIN {
        "²"
    } else {
        ""
    }
}

/// Renders the request/response table of `rows`.
pub(crate) fn rr_table(rows: &[&SummaryRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<6} {:<9} {:<7} {:>11} {:>11} {:>12} {:>14} {:>8}",
        "size", "tx", "rx", "rtt p50 µs", "rtt p99 µs", "Mbit/s", "machine cpu", "tx zc%"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<6} {:<9} {:<7} {:>11} {:>11.1} {:>12.1} {:>14} {:>8.1}",
            ByteSize(r.size).to_string(),
            r.tx,
            r.rx,
            r.rtt_p50_us.as_ref().map_or("-".into(), |x| pm(x, 1)),
            r.rtt_p99_us.as_ref().map_or(0.0, |x| x.median),
            r.gbit_per_s.median * 1000.0,
            pm(&r.cpu_s_per_gib, 3),
            r.zc_fraction_tx.median * 100.0,
        );
    }
    s
}

/// A figure that may be anything from 0.001 to 10⁵ (CPU-s/GiB of 1-byte messages) in a
/// fixed-width column: about four significant digits.
fn num(x: f64) -> String {
    let prec = match x.abs() {
        a if a >= 100.0 => 0,
        a if a >= 10.0 => 1,
        a if a >= 1.0 => 2,
        _ => 3,
    };
    format!("{x:.prec$}")
}

/// [`num`] with the run-to-run spread, as [`pm`].
fn num_pm(s: &Summary) -> String {
    if s.n > 1 {
        format!("{} ±{:.0}%", num(s.median), s.relative_spread() * 50.0)
    } else {
        num(s.median)
    }
}

const NONE: Summary = Summary {
    n: 0,
    median: 0.0,
    min: 0.0,
    max: 0.0,
};

/// Medians of a UDP message configuration's runs: messages (round trips in `rr`) per second
/// and the share of messages lost; `None` for TCP configurations.
fn message_medians(runs: &[Run], row: &SummaryRow) -> Option<(Summary, Summary)> {
    let key = ConfigKey {
        label: row.label.clone(),
        mode: row.mode,
        tx: row.tx.clone(),
        rx: row.rx.clone(),
        topology: row.topology.clone(),
        size: row.size,
        streams: row.streams,
        ring: row.ring,
        touch: row.touch,
    };
    let g: Vec<&Run> = runs
        .iter()
        .filter(|r| r.is_messages() && r.config_key() == key)
        .collect();
    let rate: Vec<f64> = g.iter().filter_map(|r| r.messages_per_s()).collect();
    let loss: Vec<f64> = g.iter().filter_map(|r| r.loss_fraction()).collect();
    Some((Summary::of(&rate)?, Summary::of(&loss)?))
}

/// Renders the UDP message stream table: messages per second beside throughput, each
/// side's CPU per GiB *delivered*, and the losses.
pub(crate) fn msg_stream_table(rows: &[&SummaryRow], runs: &[Run]) -> String {
    let mut s = String::new();
    let sink = rows.iter().any(|r| r.rx == "none");
    let _ = writeln!(
        s,
        "{:<6} {:<9} {:<5} {:>10} {:>13} {:>8} {:>8} {:>14} {:>7} {:>6} {:>14}",
        "msg",
        "tx",
        "rx",
        "msgs/s",
        "Gbit/s",
        "snd cpu",
        "rcv cpu",
        "machine cpu",
        "loss%",
        "tx zc%",
        "send p50/p99µs"
    );
    for r in rows {
        let mark = if r.unsupported { "*" } else { "" };
        let (rate, loss) = message_medians(runs, r).unwrap_or((NONE, NONE));
        let _ = writeln!(
            s,
            "{:<6} {:<9} {:<5} {:>10.0} {:>13} {:>8} {:>8} {:>14} {:>7.2} {:>6.1} {:>14}",
            ByteSize(r.size).to_string(),
            r.tx,
            format!("{}{mark}", r.rx),
            rate.median,
            num_pm(&r.gbit_per_s),
            num(r.sender_cpu_s_per_gib.median),
            if sink {
                "-".to_string()
            } else {
                num(r.receiver_cpu_s_per_gib.median)
            },
            num_pm(&r.cpu_s_per_gib),
            loss.median * 100.0,
            r.zc_fraction_tx.median * 100.0,
            lat(&r.send_p50_us, &r.send_p99_us),
        );
    }
    if rows.iter().any(|r| r.unsupported && r.tx != Transport::LM) {
        let _ = writeln!(
            s,
            "* not supported on this host: the path fell back to copying (counted as `unsupported`); run once, then skipped"
        );
    }
    if rows.iter().any(|r| r.unsupported && r.tx == Transport::LM) {
        let _ = writeln!(
            s,
            "* lm not supported here: AF_XDP cannot carry it on this interface (loopback, or no XSK or XDP), so both \
             ends took the kernel's UDP path (counted as `xsk_unavailable`); run once, then skipped"
        );
    }
    s
}

/// Renders the UDP message ping-pong table: round-trip latency and bandwidth per size.
pub(crate) fn msg_rr_table(rows: &[&SummaryRow], runs: &[Run]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<6} {:<9} {:<5} {:>11} {:>11} {:>9} {:>12} {:>14} {:>7} {:>6}",
        "msg",
        "tx",
        "rx",
        "rtt p50 µs",
        "rtt p99 µs",
        "trips/s",
        "Mbit/s",
        "machine cpu",
        "loss%",
        "tx zc%"
    );
    for r in rows {
        let (rate, loss) = message_medians(runs, r).unwrap_or((NONE, NONE));
        let _ = writeln!(
            s,
            "{:<6} {:<9} {:<5} {:>11} {:>11.1} {:>9.0} {:>12} {:>14} {:>7.2} {:>6.1}",
            ByteSize(r.size).to_string(),
            r.tx,
            r.rx,
            r.rtt_p50_us.as_ref().map_or("-".into(), |x| pm(x, 1)),
            r.rtt_p99_us.as_ref().map_or(0.0, |x| x.median),
            rate.median,
            num(r.gbit_per_s.median * 1000.0),
            num_pm(&r.cpu_s_per_gib),
            loss.median * 100.0,
            r.zc_fraction_tx.median * 100.0,
        );
    }
    s
}

/// Printed under UDP message tables.
pub(crate) const MSG_NOTE: &str = "udp: msg = message size; every message received is compared byte for byte with what was sent; \
CPU per GiB delivered; loss% = messages lost / sent (rr: both directions). zcnet_msg's sender keeps at most \
clamp(4 MiB / size, 2, 1024) messages unacknowledged (acks on the control connection); lm (Lightweight \
Messages over AF_XDP) waits for the receiver's admission of each message instead. plain = one datagram per \
sendmsg (no GSO).";

/// Printed under UDP message tables of the sink.
pub(crate) const MSG_SINK_NOTE: &str = "udp sink: msg = message size; zcnet_msg's sender (header holes, GSO batches, MSG_ZEROCOPY loans \
with --tx zerocopy) into the dropping device; nothing receives, so nothing is verified or lost.";

/// The whole text report: a header, one table per mode, the verdict.
pub(crate) fn tables(report: &Report, what: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "zcnet bench: {what}; host {} ({} CPUs, kernel {})",
        report.host.hostname, report.host.cpus, report.host.kernel
    );
    let _ = writeln!(
        s,
        "CPU columns are seconds per GiB moved: snd/rcv = the worker threads (getrusage), \
         machine = /proc/stat busy time incl. softirq; ±x% = half the run-to-run range"
    );
    let is_msg = |r: &SummaryRow| message_medians(&report.runs, r).is_some();
    let select = |mode: Mode, msg: bool| -> Vec<&SummaryRow> {
        report
            .summary
            .iter()
            .filter(|r| r.mode == mode && is_msg(r) == msg)
            .collect()
    };
    let (stream, rr) = (select(Mode::Stream, false), select(Mode::Rr, false));
    let (msg_stream, msg_rr) = (select(Mode::Stream, true), select(Mode::Rr, true));
    if !stream.is_empty() {
        s += &stream_table(&stream);
    }
    if !rr.is_empty() {
        s += &rr_table(&rr);
    }
    if !msg_stream.is_empty() {
        s += &msg_stream_table(&msg_stream, &report.runs);
    }
    if !msg_rr.is_empty() {
        s += &msg_rr_table(&msg_rr, &report.runs);
    }
    if !msg_rr.is_empty() || msg_stream.iter().any(|r| r.rx != "none") {
        let _ = writeln!(s, "{MSG_NOTE}");
    } else if !msg_stream.is_empty() {
        let _ = writeln!(s, "{MSG_SINK_NOTE}");
    }
    s += &auto_table(&report.runs);
    s += &pair_table(&report.runs);
    if let Some(v) = &report.verdict {
        let _ = writeln!(s, "{v}");
    }
    s
}

/// `auto → auto` against the cheapest pair of single paths at each size: the check that
/// `auto` on both ends lands within 5 % of the best pair it could have been.
pub(crate) fn pair_table(runs: &[zcnet_bench::report::Run]) -> String {
    let gaps = zcnet_bench::measure::pair_gaps(runs);
    if gaps.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "\nauto → auto vs the best pair of single paths (worker CPU-s/GiB of both ends, \
         medians [min–max]; paired: within each repeat, against every run of the pair \
         there; 90%: bootstrap interval of the paired figure, whole repeats resampled)\n",
    );
    let _ = writeln!(
        s,
        "{:>8} {:>6} {:>22} {:>4} {:>14} {:>22} {:>8}{:<17}{:<20}  same pair twice",
        "size", "touch", "auto → auto", "runs", "best pair", "best", "excess", "", ""
    );
    for g in &gaps {
        let twin = g.twin.as_ref().map_or(String::new(), |t| {
            format!(
                "{} {:.3} vs {:.3}: {:+.1}%{}{}",
                t.pair,
                t.first.median,
                t.second.median,
                100.0 * t.gap,
                paired(t.paired_gap),
                interval(t.paired_gap_interval.or(t.gap_interval))
            )
        });
        let _ = writeln!(
            s,
            "{:>8} {:>6} {:>22} {:>4} {:>14} {:>22} {:>+7.1}%{:<17}{:<20}  {twin}",
            ByteSize(g.size).to_string(),
            if g.touch { "yes" } else { "no" },
            format!("{:.3} [{:.3}–{:.3}]", g.auto.median, g.auto.lo, g.auto.hi),
            g.auto_runs,
            g.best_pair,
            format!("{:.3} [{:.3}–{:.3}]", g.best.median, g.best.lo, g.best.hi),
            100.0 * g.excess,
            paired(g.paired_excess),
            interval(g.paired_excess_interval.or(g.excess_interval))
        );
    }
    let within = gaps.iter().filter(|g| g.excess <= 0.05).count();
    let _ = write!(
        s,
        "auto → auto within 5% of the best pair at {within} of {} points",
        gaps.len()
    );
    let resolved: Vec<(f64, f64)> = gaps
        .iter()
        .filter_map(|g| g.paired_excess_interval.or(g.excess_interval))
        .collect();
    if !resolved.is_empty() {
        let inside = resolved.iter().filter(|(_, hi)| *hi <= 0.05).count();
        let over = resolved.iter().filter(|(lo, _)| *lo > 0.05).count();
        let _ = write!(
            s,
            " by medians; by 90% intervals within at {inside}, over at {over}, \
             not resolved by these runs at {}",
            resolved.len() - inside - over
        );
    }
    let noise = gaps
        .iter()
        .filter_map(|g| g.twin.as_ref().map(|t| t.gap.abs()))
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
    match noise {
        Some(n) => {
            let _ = writeln!(
                s,
                "; the same pair measured twice read up to {:.1}% apart in this sitting \
                 (a gap within that is noise, not a wrong choice)",
                100.0 * n
            );
        }
        None => s.push('\n'),
    }
    s
}

/// ` (paired +x%)`: a per-repeat median ratio beside a ratio of medians.
fn paired(x: Option<f64>) -> String {
    x.map_or(String::new(), |x| format!(" (paired {:+.1}%)", 100.0 * x))
}

/// ` 90% −a..+b%`: a bootstrap interval — of the paired figure where the runs were paired
/// by repeat ([`zcnet_bench::measure::paired_interval`]), else of the ratio of medians
/// ([`zcnet_bench::measure::ratio_interval`]).
fn interval(x: Option<(f64, f64)>) -> String {
    x.map_or(String::new(), |(lo, hi)| {
        format!(" 90% {:+.1}..{:+.1}%", 100.0 * lo, 100.0 * hi)
    })
}

/// `auto` against the cheapest single path at each size, per direction (transmit paths into
/// a `copy` receiver, a `copy` sender into receive paths): the "within 5%" check.
pub(crate) fn auto_table(runs: &[zcnet_bench::report::Run]) -> String {
    let gaps = zcnet_bench::measure::auto_gaps(runs);
    if gaps.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "\nauto vs the best single path (worker CPU-s/GiB of both ends, medians; \
         tx rows into a copy receiver, rx rows from a copy sender)\n",
    );
    let _ = writeln!(
        s,
        "{:>3} {:>8} {:>6} {:>8} {:>10} {:>8} {:>8}",
        "dir", "size", "touch", "auto", "best path", "best", "excess"
    );
    let mut worst: f64 = 0.0;
    for g in &gaps {
        worst = worst.max(g.excess);
        let _ = writeln!(
            s,
            "{:>3} {:>8} {:>6} {:>8.3} {:>10} {:>8.3} {:>+7.1}%",
            g.direction,
            ByteSize(g.size).to_string(),
            if g.touch { "yes" } else { "no" },
            g.auto,
            g.best_path,
            g.best,
            100.0 * g.excess
        );
    }
    let within = gaps.iter().filter(|g| g.excess <= 0.05).count();
    let _ = writeln!(
        s,
        "auto within 5% of the best path at {within} of {} points (worst {:+.1}%)",
        gaps.len(),
        100.0 * worst
    );
    s
}

/// The progress display shared with the run loop.
pub(crate) struct Ui {
    /// Byte counter the workers add to.
    pub progress: Progress,
    current: Mutex<(usize, String, Instant)>,
}

impl Ui {
    /// Marks the start of run `i`.
    pub(crate) fn begin(&self, i: usize, label: &str) {
        if let Ok(mut c) = self.current.lock() {
            *c = (i, label.to_string(), Instant::now());
        }
        self.progress.bytes.store(0, Ordering::Relaxed);
    }
}

/// Runs `f` with a live progress line on stderr: shown only when `enabled`, stderr is a
/// terminal, and the whole thing has taken more than two seconds (short runs stay quiet).
pub(crate) fn with_progress<R>(enabled: bool, total: usize, f: impl FnOnce(&Ui) -> R) -> R {
    let ui = Ui {
        progress: Progress::default(),
        current: Mutex::new((0, String::new(), Instant::now())),
    };
    if !enabled || !std::io::stderr().is_terminal() {
        return f(&ui);
    }
    let done = AtomicBool::new(false);
    /// Stops the ticker even if `f` panics, so the scope can join it.
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            let start = Instant::now();
            let mut bar: Option<ProgressBar> = None;
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                if start.elapsed() < Duration::from_secs(2) {
                    continue;
                }
                let b = bar.get_or_insert_with(|| {
                    let b = ProgressBar::with_draw_target(
                        Some(total as u64),
                        ProgressDrawTarget::stderr(),
                    )
                    .with_elapsed(start.elapsed());
                    if let Ok(st) = ProgressStyle::with_template(
                        "{elapsed_precise} [{bar:25}] {pos}/{len} runs  {msg}",
                    ) {
                        b.set_style(st.progress_chars("=> "));
                    }
                    b
                });
                if let Ok(c) = ui.current.lock() {
                    let secs = c.2.elapsed().as_secs_f64().max(1e-3);
                    let bytes = ui.progress.bytes.load(Ordering::Relaxed);
                    b.set_position(c.0 as u64);
                    b.set_message(format!(
                        "{}  {:.1} Gbit/s",
                        c.1,
                        bytes as f64 * 8.0 / secs / 1e9
                    ));
                }
            }
            if let Some(b) = bar {
                b.finish_and_clear();
            }
        });
        let _stop = Stop(&done);
        f(&ui)
    })
}
