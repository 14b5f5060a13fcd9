//! `zcnet bench --suite papers --out DIR`: the seed papers' experiments, one after another,
//! written to `DIR/report.md` with SVG plots and `DIR/report.json` (every run, schema as
//! `--json`). Each section puts the result beside the finding it tests, quoted from the
//! paper, and says in one sentence what this host showed.
//!
//! Adding an experiment is one function: write `fn x(cx: &mut Cx) -> Result<Section, _>`
//! (build [`RunSpec`]s with [`Cx::spec`], run them with [`Cx::run`], describe them) and
//! list it in [`PAPERS`].

use super::plot::{self, Panel, Series};
use super::spec::{default_ring, BenchError, RunSpec, Topology};
use super::topology::{execute, Env};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use zcnet_bench::protocol::{Limit, Params};
use zcnet_bench::report::{summarise, Mode, Report, Run, SummaryRow, SCHEMA_VERSION};
use zcnet_bench::sizes::ByteSize;

/// `--suite`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum SuiteName {
    /// The seed papers' experiments: crossover, touching, ring depth, load, loan vs copy, rr.
    Papers,
}

/// One experiment: an id (file names) and the function that runs and describes it.
type Experiment = (&'static str, fn(&mut Cx) -> Result<Section, BenchError>);

/// The papers suite, in order.
const PAPERS: &[Experiment] = &[
    ("crossover", crossover),
    ("touch", touching),
    ("ring", ring_depth),
    ("streams", loaded_system),
    ("loan", loan_vs_copy),
    ("ftp", file_transfer),
    ("rr", ping_pong),
];

/// A section of report.md.
pub(crate) struct Section {
    pub title: String,
    /// The paper's finding, quoted, with its source.
    pub paper: String,
    /// How it was measured here.
    pub setup: String,
    /// Markdown tables.
    pub tables: String,
    /// SVG files (names inside the output directory).
    pub plots: Vec<String>,
    /// What this host showed.
    pub here: String,
}

/// Sizes of the suite.
#[derive(Debug, Clone, Copy)]
struct Budget {
    repeat: u32,
    /// Seconds per stream run: time, not bytes, so fast and slow configurations get the
    /// same resolution from /proc/stat's 10 ms ticks.
    seconds: f64,
    quick: bool,
}

/// The suite's context: where runs go and what they produced.
pub(crate) struct Cx {
    loopback: Env,
    sink: Result<Env, String>,
    budget: Budget,
    out: PathBuf,
    runs: Vec<Run>,
}

impl Cx {
    /// A stream spec on `env`.
    fn spec(&self, env: &Env, label: &str, tx: &str, rx: &str, size: u64) -> RunSpec {
        RunSpec {
            params: Params {
                mode: Mode::Stream,
                tx: tx.into(),
                rx: rx.into(),
                size,
                streams: 1,
                ring: default_ring(size, Mode::Stream),
                touch: false,
                limit: Limit::Seconds(self.budget.seconds),
                read: None,
            },
            label: label.into(),
            repeat: 0,
            topology: env.info(),
        }
    }

    /// Runs `specs` `repeat` times, interleaved, on `env`; returns their summary rows.
    fn run(&mut self, sink: bool, specs: Vec<RunSpec>) -> Result<Vec<SummaryRow>, BenchError> {
        let mut all = Vec::new();
        for r in 0..self.budget.repeat {
            for s in &specs {
                all.push(RunSpec {
                    repeat: r,
                    ..s.clone()
                });
            }
        }
        let env = if sink {
            self.sink
                .as_ref()
                .map_err(|e| BenchError::Usage(e.clone()))?
        } else {
            &self.loopback
        };
        let runs = execute(env, &all, true)?;
        let rows = summarise(&runs);
        self.runs.extend(runs);
        Ok(rows)
    }

    fn svg(&self, name: &str) -> (PathBuf, String) {
        let file = format!("{name}.svg");
        (self.out.join(&file), file)
    }
}

fn tx_all() -> Vec<&'static str> {
    super::spec::tx_names()
}

fn has_tx(name: &str) -> bool {
    tx_all().contains(&name)
}

/// A table column: header and cell.
type Col = (&'static str, fn(&SummaryRow) -> String);

/// A markdown table of `rows` with the given columns.
fn md(rows: &[&SummaryRow], cols: &[Col]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| {} |",
        cols.iter().map(|c| c.0).collect::<Vec<_>>().join(" | ")
    );
    let _ = writeln!(s, "|{}", "---|".repeat(cols.len()));
    for r in rows {
        let _ = writeln!(
            s,
            "| {} |",
            cols.iter()
                .map(|c| (c.1)(r))
                .collect::<Vec<_>>()
                .join(" | ")
        );
    }
    s
}

fn secs(t: f64) -> String {
    format!("{t} s")
}

fn f3(x: f64) -> String {
    format!("{x:.3}")
}
fn pmd(s: &zcnet_bench::summary::Summary, prec: usize) -> String {
    if s.n > 1 {
        format!(
            "{:.prec$} ({:.prec$}–{:.prec$})",
            s.median,
            s.min,
            s.max,
            prec = prec
        )
    } else {
        format!("{:.prec$}", s.median, prec = prec)
    }
}

const C_SIZE: Col = ("size", |r| ByteSize(r.size).to_string());
const C_PATH: Col = ("tx→rx", |r| format!("{}→{}", r.tx, r.rx));
const C_GBIT: Col = ("Gbit/s", |r| pmd(&r.gbit_per_s, 1));
const C_SND: Col = ("snd CPU-s/GiB", |r| f3(r.sender_cpu_s_per_gib.median));
const C_RCV: Col = ("rcv CPU-s/GiB", |r| f3(r.receiver_cpu_s_per_gib.median));
const C_MACH: Col = ("machine CPU-s/GiB", |r| pmd(&r.cpu_s_per_gib, 3));
const C_EFF: Col = ("Gbit/s per core", |r| {
    format!("{:.1}", r.gbit_per_core.median)
});
const C_ZC: Col = ("tx zc%", |r| {
    format!("{:.0}", r.zc_fraction_tx.median * 100.0)
});
const C_MAP: Col = ("rx mapped%", |r| {
    format!("{:.0}", r.zc_fraction_rx.median * 100.0)
});
const C_SENDLAT: Col = ("send p50/p99 µs", |r| {
    match (&r.send_p50_us, &r.send_p99_us) {
        (Some(a), Some(b)) => format!("{:.1} / {:.1}", a.median, b.median),
        _ => "-".into(),
    }
});
const C_WAITS: Col = ("buffer waits", |r| format!("{:.0}", r.pool_waits.median));

fn by_tx<'a>(rows: &'a [SummaryRow], tx: &str) -> Vec<&'a SummaryRow> {
    rows.iter().filter(|r| r.tx == tx).collect()
}

/// One plot series per transmit path of `txs` (each sending to the `copy` receiver): `y`
/// against `x` over that path's rows, in their order.
fn series_by_tx(
    rows: &[SummaryRow],
    txs: &[&str],
    x: fn(&SummaryRow) -> f64,
    y: fn(&SummaryRow) -> f64,
) -> Vec<Series> {
    txs.iter()
        .map(|tx| Series {
            name: format!("{tx}→copy"),
            points: by_tx(rows, tx).iter().map(|r| (x(r), y(r))).collect(),
        })
        .collect()
}

/// Smallest size from which on `zc`'s figure stays at or below `copy`'s (the crossover),
/// `None` if it never does at the largest size.
fn crossover_size(rows: &[SummaryRow], zc: &str, f: fn(&SummaryRow) -> f64) -> Option<u64> {
    let mut sizes: Vec<u64> = rows.iter().map(|r| r.size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let at = |tx: &str, s: u64| rows.iter().find(|r| r.tx == tx && r.size == s).map(f);
    let mut from = None;
    for &s in sizes.iter().rev() {
        match (at(zc, s), at("copy", s)) {
            (Some(z), Some(c)) if z <= c => from = Some(s),
            _ => break,
        }
    }
    from
}

fn crossover(cx: &mut Cx) -> Result<Section, BenchError> {
    let sizes: Vec<u64> = if cx.budget.quick {
        vec![4 << 10, 64 << 10, 1 << 20]
    } else {
        (12..=20).map(|k| 1u64 << k).collect()
    };
    let txs = tx_all();
    let specs: Vec<RunSpec> = sizes
        .iter()
        .flat_map(|&s| txs.iter().map(move |tx| (s, *tx)).collect::<Vec<_>>())
        .map(|(s, tx)| cx.spec(&cx.loopback, "crossover", tx, "copy", s))
        .collect();
    let rows = cx.run(false, specs)?;
    let all: Vec<&SummaryRow> = rows.iter().collect();
    let (svg, file) = cx.svg("crossover");
    plot::figure(
        &svg,
        "Size sweep, loopback TCP, receiver copies (CMU figure 5)",
        &[
            Panel {
                title: "throughput".into(),
                x_label: "bytes per send".into(),
                y_label: "Gbit/s".into(),
                log_x: true,
                x_is_size: true,
                series: plot::by_size(&all, |r| r.gbit_per_s.median),
            },
            Panel {
                title: "sender CPU per GiB".into(),
                x_label: "bytes per send".into(),
                y_label: "CPU-s/GiB".into(),
                log_x: true,
                x_is_size: true,
                series: plot::by_size(&all, |r| r.sender_cpu_s_per_gib.median),
            },
            Panel {
                title: "efficiency (whole machine)".into(),
                x_label: "bytes per send".into(),
                y_label: "Gbit/s per busy core".into(),
                log_x: true,
                x_is_size: true,
                series: plot::by_size(&all, |r| r.gbit_per_core.median),
            },
        ],
    )?;
    let mut plots = vec![file];
    let mut tables = String::from("Loopback TCP, receiver `copy`:\n\n");
    tables += &md(
        &all,
        &[
            C_SIZE, C_PATH, C_GBIT, C_SND, C_RCV, C_MACH, C_EFF, C_ZC, C_SENDLAT,
        ],
    );
    let mut here = String::new();
    for tx in txs.iter().filter(|t| **t != "copy") {
        let _ = write!(
            here,
            "On loopback, `{tx}` uses no more sender CPU per GiB than `copy` {}. ",
            match crossover_size(&rows, tx, |r| r.sender_cpu_s_per_gib.median) {
                Some(s) if s == sizes[0] => "at every size tried".to_string(),
                Some(s) => format!("from {} on", ByteSize(s)),
                None => "at no size tried".to_string(),
            }
        );
    }
    here += "The kernel copies zero-copy data anyway for local delivery (tx zc% = 0), so loopback cannot show a saving. ";
    // The transmit-only sink is where a crossover can appear.
    let sink_sizes: Vec<u64> = if cx.budget.quick {
        vec![4 << 10, 60 << 10]
    } else {
        vec![4 << 10, 8 << 10, 16 << 10, 32 << 10, 60 << 10]
    };
    match &cx.sink {
        Ok(env) => {
            let specs: Vec<RunSpec> = sink_sizes
                .iter()
                .flat_map(|&s| ["copy", "zerocopy"].map(|tx| (s, tx)))
                .map(|(s, tx)| {
                    let mut sp = cx.spec(env, "crossover-sink", tx, "none", s);
                    // A cold ring (256 MiB per connection at most) as in the findings.
                    sp.params.ring = ((256u64 << 20) / s).min(4096) as u32;
                    sp
                })
                .collect();
            let srows = cx.run(true, specs)?;
            let sall: Vec<&SummaryRow> = srows.iter().collect();
            let (svg, file) = cx.svg("crossover-sink");
            plot::figure(
                &svg,
                "Size sweep, UDP into a dropping device (sink, MTU 1500)",
                &[
                    Panel {
                        title: "sender CPU per GiB".into(),
                        x_label: "bytes per send".into(),
                        y_label: "CPU-s/GiB".into(),
                        log_x: true,
                        x_is_size: true,
                        series: plot::by_size(&sall, |r| r.sender_cpu_s_per_gib.median),
                    },
                    Panel {
                        title: "throughput".into(),
                        x_label: "bytes per send".into(),
                        y_label: "Gbit/s".into(),
                        log_x: true,
                        x_is_size: true,
                        series: plot::by_size(&sall, |r| r.gbit_per_s.median),
                    },
                ],
            )?;
            plots.push(file);
            tables += "\nTransmit-only sink (UDP + GSO into a veth whose peer is down; nothing is copied for local delivery):\n\n";
            tables += &md(
                &sall,
                &[C_SIZE, C_PATH, C_GBIT, C_SND, C_MACH, C_ZC, C_SENDLAT],
            );
            let _ = write!(
                here,
                "Into the sink, where no one copies later, `zerocopy` needs no more sender CPU per GiB than `copy` {} (tx zc% shows what the kernel really left uncopied).",
                match crossover_size(&srows, "zerocopy", |r| r.sender_cpu_s_per_gib.median) {
                    Some(s) if s == sink_sizes[0] => "at every size tried".to_string(),
                    Some(s) => format!("from {} on: that is this host's crossover", ByteSize(s)),
                    None => "at no size tried".to_string(),
                }
            );
        }
        Err(why) => {
            let _ = write!(here, "The transmit-only sink could not run here ({why}).");
        }
    }
    Ok(Section {
        title: "Size sweep and crossover (CMU, figure 5)".into(),
        paper: "\"The single-copy stack is significantly more efficient than the unmodified stack for large writes, but less efficient for small writes. The cross over point is between 8 and 16 KByte, indicating that the single-copy stack will pay off for writes of 16 KByte and higher.\" Efficiency is \"how many Mbit/second of communication can be supported if the full CPU were utilized for communication\", i.e. throughput / utilisation — Kleinpaste, Steenkiste, Zill, §7.2.".into(),
        setup: format!(
            "ttcp-style stream, one connection, every transmit path against the `copy` receiver, {} per run, median of {}; then UDP copy vs MSG_ZEROCOPY into the sink. Gbit/s per core is the CMU efficiency (throughput / whole-machine utilisation); CPU-s/GiB is its inverse per side.",
            secs(cx.budget.seconds),
            cx.budget.repeat
        ),
        tables,
        plots,
        here,
    })
}

fn touching(cx: &mut Cx) -> Result<Section, BenchError> {
    let size = 16 << 10;
    let pairs: Vec<(&str, &str)> = [
        ("copy", "copy"),
        ("zerocopy", "copy"),
        ("copy", "mmap"),
        ("zerocopy", "mmap"),
    ]
    .into_iter()
    .filter(|(t, r)| has_tx(t) && super::spec::rx_names().contains(r))
    .collect();
    let mut specs = Vec::new();
    for touch in [false, true] {
        for (tx, rx) in &pairs {
            let mut s = cx.spec(&cx.loopback, "touch", tx, rx, size);
            s.params.touch = touch;
            specs.push(s);
        }
    }
    let rows = cx.run(false, specs)?;
    let all: Vec<&SummaryRow> = rows.iter().collect();
    const C_TOUCH: Col = ("touch", |r| if r.touch { "yes" } else { "no" }.into());
    const C_SUSR: Col = ("snd usr+sys s/GiB", |r| {
        format!(
            "{:.3}+{:.3}",
            r.sender_user_s_per_gib.median,
            r.sender_cpu_s_per_gib.median - r.sender_user_s_per_gib.median
        )
    });
    const C_RUSR: Col = ("rcv usr+sys s/GiB", |r| {
        format!(
            "{:.3}+{:.3}",
            r.receiver_user_s_per_gib.median,
            r.receiver_cpu_s_per_gib.median - r.receiver_user_s_per_gib.median
        )
    });
    let tables = md(
        &all,
        &[
            C_PATH, C_TOUCH, C_GBIT, C_SENDLAT, C_SUSR, C_RUSR, C_MACH, C_MAP,
        ],
    );
    let find = |tx: &str, rx: &str, t: bool| {
        rows.iter()
            .find(|r| r.tx == tx && r.rx == rx && r.touch == t)
    };
    let mut here = String::new();
    if let (Some(a), Some(b)) = (find("copy", "copy", false), find("copy", "copy", true)) {
        let _ = write!(
            here,
            "Touching makes copy→copy's send call p50 go from {:.1} to {:.1} µs and its sender system time from {:.3} to {:.3} s/GiB. ",
            a.send_p50_us.map_or(0.0, |s| s.median),
            b.send_p50_us.map_or(0.0, |s| s.median),
            a.sender_cpu_s_per_gib.median - a.sender_user_s_per_gib.median,
            b.sender_cpu_s_per_gib.median - b.sender_user_s_per_gib.median,
        );
    }
    if let (Some(c), Some(m)) = (find("copy", "copy", true), find("copy", "mmap", true)) {
        let _ = write!(
            here,
            "With touching, the mapping receiver's user time is {:.3} s/GiB against {:.3} for the copying one ({}). ",
            m.receiver_user_s_per_gib.median,
            c.receiver_user_s_per_gib.median,
            if m.receiver_user_s_per_gib.median > c.receiver_user_s_per_gib.median {
                "colder cache after zero-copy, as the paper saw"
            } else {
                "no cold-cache penalty visible"
            }
        );
    }
    let best = |t: bool| {
        rows.iter()
            .filter(|r| r.touch == t)
            .min_by(|a, b| a.cpu_s_per_gib.median.total_cmp(&b.cpu_s_per_gib.median))
            .map(|r| format!("{}→{}", r.tx, r.rx))
            .unwrap_or_default()
    };
    let _ = write!(
        here,
        "Least machine CPU per GiB: {} without touching, {} with.",
        best(false),
        best(true)
    );
    Ok(Section {
        title: "Data touching (Solaris, table 3)".into(),
        paper: "\"tcp is modified to write into every word of the write buffer before transmit, and to read from every word of the data after it is received … On the transmit side, the copy latency and total system time drop noticeably, apparently due to a warmer data cache. On the receive side, zero-copy costs tcp a higher user time than single-copy due to a colder data cache … On both sides, zero-copy is still a performance win overall.\" — Chu, §6.5, table 3.".into(),
        setup: format!(
            "Loopback stream, {} sends, with and without `--touch` (sender writes every 8-byte word before each send; receiver reads every word after each receive), {} per run, median of {}.",
            ByteSize(size), secs(cx.budget.seconds), cx.budget.repeat
        ),
        tables,
        plots: vec![],
        here,
    })
}

fn ring_depth(cx: &mut Cx) -> Result<Section, BenchError> {
    let size: u64 = 64 << 10;
    let depths: Vec<u32> = if cx.budget.quick {
        vec![1, 8, 64]
    } else {
        vec![1, 2, 4, 8, 16, 64, 256]
    };
    let txs: Vec<&str> = tx_all().into_iter().filter(|t| *t != "copy").collect();
    let mut specs = Vec::new();
    for &d in &depths {
        for tx in &txs {
            let mut s = cx.spec(&cx.loopback, "ring", tx, "copy", size);
            s.params.ring = d;
            s.params.limit = Limit::Seconds(cx.budget.seconds / 2.0);
            specs.push(s);
        }
    }
    let rows = cx.run(false, specs)?;
    let series = |f: fn(&SummaryRow) -> f64| series_by_tx(&rows, &txs, |r| f64::from(r.ring), f);
    let (svg, file) = cx.svg("ring");
    plot::figure(
        &svg,
        "Buffers in rotation per connection, 64K sends (Solaris §3.2.4)",
        &[
            Panel {
                title: "throughput".into(),
                x_label: "ring depth (buffers)".into(),
                y_label: "Gbit/s".into(),
                log_x: true,
                x_is_size: false,
                series: series(|r| r.gbit_per_s.median),
            },
            Panel {
                title: "sender waits for a buffer, per run".into(),
                x_label: "ring depth (buffers)".into(),
                y_label: "waits".into(),
                log_x: true,
                x_is_size: false,
                series: series(|r| r.pool_waits.median),
            },
        ],
    )?;
    const C_RING: Col = ("ring", |r| {
        format!("{} ({})", r.ring, ByteSize(u64::from(r.ring) * r.size))
    });
    let all: Vec<&SummaryRow> = rows.iter().collect();
    let tables = md(
        &all,
        &[C_PATH, C_RING, C_GBIT, C_WAITS, C_SND, C_MACH, C_SENDLAT],
    );
    let wmem = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_wmem")
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    let mut here = String::new();
    for tx in &txs {
        let r = by_tx(&rows, tx);
        let top = r.iter().map(|x| x.gbit_per_s.median).fold(0.0f64, f64::max);
        let enough = r
            .iter()
            .find(|x| x.gbit_per_s.median >= 0.9 * top)
            .map(|x| x.ring);
        let _ = write!(
            here,
            "`{tx}` reaches 90% of its best throughput from a ring of {} buffers ({}); ",
            enough.map_or("-".into(), |n| n.to_string()),
            enough.map_or("-".into(), |n| ByteSize(u64::from(n) * size).to_string())
        );
    }
    let _ = write!(
        here,
        "shallower rings make the sender wait for completions (buffer waits). tcp_wmem here: {wmem}."
    );
    Ok(Section {
        title: "Ring depth (Solaris §3.2.4)".into(),
        paper: "\"Applications still should avoid reusing busy buffers because copy-on-write faults can be very expensive … the networking software imposes an upper bound on how much data can be outstanding before flow control is exerted … if an application uses a circular list of buffers with total size greater than 128K, it will block before it has a chance to overwrite any busy buffer.\" — Chu, §3.2.4 (ttcp used nine circular 16 KB buffers, §5.6).".into(),
        setup: format!(
            "Loopback stream, {} sends, every zero-copy transmit path with rings of {} buffers, {} per run, median of {}. The ring is the sender's pool: a send must wait for a buffer the kernel still holds.",
            ByteSize(size),
            depths.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "),
            secs(cx.budget.seconds / 2.0),
            cx.budget.repeat
        ),
        tables,
        plots: vec![file],
        here,
    })
}

fn loaded_system(cx: &mut Cx) -> Result<Section, BenchError> {
    let size: u64 = 16 << 10;
    let counts: Vec<u32> = if cx.budget.quick {
        vec![1, 2]
    } else {
        vec![1, 2, 3, 4]
    };
    let txs: Vec<&str> = ["copy", "zerocopy"]
        .into_iter()
        .filter(|t| has_tx(t))
        .collect();
    let mut specs = Vec::new();
    for &n in &counts {
        for tx in &txs {
            let mut s = cx.spec(&cx.loopback, "streams", tx, "copy", size);
            s.params.streams = n;
            specs.push(s);
        }
    }
    let rows = cx.run(false, specs)?;
    let series = |f: fn(&SummaryRow) -> f64| series_by_tx(&rows, &txs, |r| f64::from(r.streams), f);
    let (svg, file) = cx.svg("streams");
    plot::figure(
        &svg,
        "Concurrent connections, 16K sends (Solaris figure 3)",
        &[
            Panel {
                title: "send call latency (p50)".into(),
                x_label: "connections".into(),
                y_label: "µs".into(),
                log_x: false,
                x_is_size: false,
                series: series(|r| r.send_p50_us.map_or(0.0, |s| s.median)),
            },
            Panel {
                title: "machine CPU per GiB".into(),
                x_label: "connections".into(),
                y_label: "CPU-s/GiB".into(),
                log_x: false,
                x_is_size: false,
                series: series(|r| r.cpu_s_per_gib.median),
            },
        ],
    )?;
    const C_N: Col = ("connections", |r| r.streams.to_string());
    let all: Vec<&SummaryRow> = rows.iter().collect();
    let tables = md(&all, &[C_PATH, C_N, C_GBIT, C_SENDLAT, C_SND, C_MACH]);
    let mut here = String::new();
    for tx in &txs {
        let r = by_tx(&rows, tx);
        if let (Some(a), Some(b)) = (r.first(), r.last()) {
            let p = |x: &SummaryRow| x.send_p50_us.map_or(0.0, |s| s.median);
            let _ = write!(
                here,
                "`{tx}`: send p50 {:.1} µs with 1 connection, {:.1} µs with {} (×{:.2}), machine CPU {:.3} → {:.3} s/GiB. ",
                p(a),
                p(b),
                b.streams,
                if p(a) > 0.0 { p(b) / p(a) } else { 0.0 },
                a.cpu_s_per_gib.median,
                b.cpu_s_per_gib.median
            );
        }
    }
    here += &format!(
        "This host has {} CPUs: beyond that, connections share cores and every latency grows.",
        super::spec::host().cpus
    );
    Ok(Section {
        title: "Loaded system (Solaris, figure 3)".into(),
        paper: "\"We ran multiple copies of tcp simultaneously … When two copies of tcp are run, copy time of 8K bytes more than doubles to 325μs from 115μs … With more copies of tcp running, single copy latencies increase steadily until saturated around 500μs, whereas both the cache misses and latency curves for zero-copy stay flat.\" — Chu, §6.6, figure 3.".into(),
        setup: format!(
            "Loopback, 1..{} concurrent connections of {} sends each (copy and MSG_ZEROCOPY transmit, copy receive), {} per run over all connections, median of {}. Latency is the time of each send() call.",
            counts.last().copied().unwrap_or(1),
            ByteSize(size),
            secs(cx.budget.seconds),
            cx.budget.repeat
        ),
        tables,
        plots: vec![file],
        here,
    })
}

fn loan_vs_copy(cx: &mut Cx) -> Result<Section, BenchError> {
    let size: u64 = 64 << 10;
    let txs = tx_all();
    let specs: Vec<RunSpec> = txs
        .iter()
        .map(|tx| cx.spec(&cx.loopback, "loan", tx, "copy", size))
        .collect();
    let rows = cx.run(false, specs)?;
    const C_API: Col = ("semantics", |r| {
        match r.tx.as_str() {
            "copy" => "copy (send)",
            "cow" => "protected: write-protect + COW",
            _ => "loan: buffer returned by completion",
        }
        .into()
    });
    const C_SSYS: Col = ("snd sys s/GiB", |r| {
        f3(r.sender_cpu_s_per_gib.median - r.sender_user_s_per_gib.median)
    });
    let all: Vec<&SummaryRow> = rows.iter().collect();
    let mut tables = String::from("Loopback TCP, 64K sends, receiver `copy`:\n\n");
    tables += &md(
        &all,
        &[
            C_PATH, C_API, C_GBIT, C_SENDLAT, C_SSYS, C_SND, C_MACH, C_ZC,
        ],
    );
    let mut here = String::new();
    let get = |tx: &str| rows.iter().find(|r| r.tx == tx);
    if let (Some(c), Some(z)) = (get("copy"), get("zerocopy")) {
        let _ = write!(
            here,
            "On loopback the loaned MSG_ZEROCOPY send costs {:.3} sender CPU-s/GiB against copy's {:.3} (the kernel copies anyway, tx zc% {:.0}). ",
            z.sender_cpu_s_per_gib.median,
            c.sender_cpu_s_per_gib.median,
            z.zc_fraction_tx.median * 100.0
        );
    }
    if let (Some(z), Some(w)) = (get("zerocopy"), get("cow")) {
        let _ = write!(
            here,
            "Protecting the pages (cow) costs {:.3} against the loan's {:.3} s/GiB: the price of keeping copy semantics without completions. ",
            w.sender_cpu_s_per_gib.median, z.sender_cpu_s_per_gib.median
        );
    } else if !has_tx("cow") {
        here += "(No `cow` transmit path in this build, so the with-COW row is missing.) ";
    }
    if let Ok(env) = &cx.sink {
        let sink_size: u64 = 60 << 10;
        let specs: Vec<RunSpec> = ["copy", "zerocopy"]
            .iter()
            .map(|tx| {
                let mut s = cx.spec(env, "loan-sink", tx, "none", sink_size);
                s.params.ring = ((256u64 << 20) / sink_size) as u32;
                s
            })
            .collect();
        let srows = cx.run(true, specs)?;
        let sall: Vec<&SummaryRow> = srows.iter().collect();
        tables += "\nTransmit-only sink (UDP, 60K GSO sends, cold 256 MiB ring):\n\n";
        tables += &md(&sall, &[C_PATH, C_GBIT, C_SENDLAT, C_SSYS, C_SND, C_ZC]);
        let g = |tx: &str| srows.iter().find(|r| r.tx == tx);
        if let (Some(c), Some(z)) = (g("copy"), g("zerocopy")) {
            let _ = write!(
                here,
                "Into the sink, where nothing is copied later, the loan costs {:.3} sender CPU-s/GiB against copy's {:.3} ({:+.0}%).",
                z.sender_cpu_s_per_gib.median,
                c.sender_cpu_s_per_gib.median,
                if c.sender_cpu_s_per_gib.median > 0.0 {
                    (z.sender_cpu_s_per_gib.median / c.sender_cpu_s_per_gib.median - 1.0) * 100.0
                } else {
                    0.0
                }
            );
        }
    }
    Ok(Section {
        title: "Loan vs copy vs copy-on-write (Solaris, table 6)".into(),
        paper: "\"If zero-copy is combined with asynchronous I/O facility, so that applications get notified when a buffer is released by the transport and can be safely reused, COW protection won't be necessary. The saving is significant\": processing time 255 → 190 µs, latency 115 → 72 µs, system CPU 46 → 34 s (SS20-UP, with vs without COW; single copy 360 µs / 220 µs / 65 s) — Chu, §7, table 6.".into(),
        setup: format!(
            "Loopback stream, {} sends, every transmit path (copy; loaned buffers returned by completion: zerocopy{}; {}), receiver copy, {} per run, median of {}; then copy vs loan into the transmit-only sink.",
            ByteSize(size),
            if has_tx("uring") { ", uring" } else { "" },
            if has_tx("cow") { "write-protected with copy-on-write: cow" } else { "no cow path in this build" },
            secs(cx.budget.seconds),
            cx.budget.repeat
        ),
        tables,
        plots: vec![],
        here,
    })
}

/// One file transfer over loopback: sender and receiver threads, each timed with
/// `getrusage(RUSAGE_THREAD)`; returns (Gbit/s, sender CPU-s/GiB, receiver CPU-s/GiB).
fn file_run(
    src: &std::fs::File,
    len: u64,
    dst: &Path,
    tx_mode: zcnet::FileTxMode,
    rx_mode: zcnet::FileRxMode,
) -> Result<(f64, f64, f64), BenchError> {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    use zcnet_bench::cpu::{thread_rusage, CpuSeconds};
    let fail = |e: String| BenchError::Failed(format!("file transfer: {e}"));
    let _ = std::fs::remove_file(dst);
    let out = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(dst)
        .map_err(|e| fail(format!("{}: {e}", dst.display())))?;
    let listener = zcnet::stream::Listener::bind(
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        &zcnet::ReceiverConfig::new(zcnet::RxPath::Copy),
    )
    .map_err(|e| fail(e.to_string()))?;
    let addr = listener.local_addr().map_err(|e| fail(e.to_string()))?;
    let t0 = std::time::Instant::now();
    let (snd, rcv) = std::thread::scope(|s| {
        let r = s.spawn(|| -> Result<CpuSeconds, String> {
            let mut rx = listener.accept().map_err(|e| e.to_string())?;
            let c0 = thread_rusage().map_err(|e| e.to_string())?;
            rx.recv_to_file_with(&out, 0, len, rx_mode)
                .map_err(|e| e.to_string())?;
            Ok(CpuSeconds::between(
                c0,
                thread_rusage().map_err(|e| e.to_string())?,
            ))
        });
        let t = s.spawn(|| -> Result<CpuSeconds, String> {
            let mut tx =
                zcnet::Sender::connect(addr, &zcnet::SenderConfig::new(zcnet::TxPath::Copy))
                    .map_err(|e| e.to_string())?;
            let c0 = thread_rusage().map_err(|e| e.to_string())?;
            tx.send_file_with(src, 0, len, tx_mode)
                .map_err(|e| e.to_string())?;
            let c = CpuSeconds::between(c0, thread_rusage().map_err(|e| e.to_string())?);
            tx.finish().map_err(|e| e.to_string())?;
            Ok(c)
        });
        (
            t.join().unwrap_or_else(|_| Err("sender panicked".into())),
            r.join().unwrap_or_else(|_| Err("receiver panicked".into())),
        )
    });
    let secs = t0.elapsed().as_secs_f64();
    let (snd, rcv) = (snd.map_err(fail)?, rcv.map_err(fail)?);
    let got = out.metadata().map_err(|e| fail(e.to_string()))?.len();
    if got != len {
        return Err(fail(format!("received file has {got} bytes, sent {len}")));
    }
    same_bytes(src, &out, len).map_err(fail)?;
    let gib = len as f64 / (1u64 << 30) as f64;
    Ok((
        len as f64 * 8.0 / secs / 1e9,
        snd.total() / gib,
        rcv.total() / gib,
    ))
}

/// The receive paths the FTP experiment runs a `--tx file` sender against: the memory
/// paths this build has, and `file` (splice into a page-cache file).
fn ftp_receivers() -> Vec<&'static str> {
    let rx = super::spec::rx_names();
    let mut v: Vec<&'static str> = ["copy", "mmap", "uring"]
        .into_iter()
        .filter(|r| rx.contains(r))
        .collect();
    v.push(super::files::FILE);
    v
}

/// File → socket → each receive path, bench runs (both ends' CPU, like every other
/// experiment): the table and the one-line finding.
fn ftp_matrix(cx: &mut Cx, size: u64) -> Result<(String, String), BenchError> {
    let mut specs = Vec::new();
    for touch in [false, true] {
        for rx in ftp_receivers() {
            let mut s = cx.spec(&cx.loopback, "ftp", super::files::FILE, rx, size);
            s.params.touch = touch;
            specs.push(s);
        }
    }
    let rows = cx.run(false, specs)?;
    const C_TOUCH: Col = ("rcv touches", |r| if r.touch { "yes" } else { "no" }.into());
    const C_BOTH: Col = ("both ends CPU-s/GiB", |r| {
        f3(r.sender_cpu_s_per_gib.median + r.receiver_cpu_s_per_gib.median)
    });
    let all: Vec<&SummaryRow> = rows.iter().collect();
    let table = md(
        &all,
        &[
            C_PATH, C_TOUCH, C_GBIT, C_SND, C_RCV, C_BOTH, C_MACH, C_ZC, C_MAP,
        ],
    );
    let both = |r: &SummaryRow| r.sender_cpu_s_per_gib.median + r.receiver_cpu_s_per_gib.median;
    let mut here = String::new();
    for touch in [false, true] {
        let of = |rx: &str| rows.iter().find(|r| r.rx == rx && r.touch == touch);
        let best = rows
            .iter()
            .filter(|r| r.touch == touch)
            .min_by(|a, b| both(a).total_cmp(&both(b)));
        if let (Some(b), Some(c)) = (best, of("copy")) {
            let _ =
                write!(
                here,
                "{}: least CPU both ends with file→{} ({:.3} s/GiB, ×{:.2} of file→copy's {:.3}). ",
                if touch { "Receiver touching" } else { "Untouched" },
                b.rx,
                both(b),
                both(b) / both(c),
                both(c),
            );
        }
    }
    Ok((table, here))
}

/// Whether the first `len` bytes of `a` and `b` are equal (after the CPU was measured):
/// a transfer that loses or reorders bytes fails the experiment.
fn same_bytes(a: &std::fs::File, b: &std::fs::File, len: u64) -> Result<(), String> {
    use std::os::unix::fs::FileExt as _;
    let (mut x, mut y) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut at = 0u64;
    while at < len {
        let n = (len - at).min(x.len() as u64) as usize;
        a.read_exact_at(&mut x[..n], at)
            .map_err(|e| e.to_string())?;
        b.read_exact_at(&mut y[..n], at)
            .map_err(|e| e.to_string())?;
        if x[..n] != y[..n] {
            return Err(format!(
                "received file differs from the sent one in bytes {at}..{}",
                at + n as u64
            ));
        }
        at += n as u64;
    }
    Ok(())
}

fn file_transfer(cx: &mut Cx) -> Result<Section, BenchError> {
    use zcnet::{FileRxMode as R, FileTxMode as T};
    let size: u64 = 64 << 10;
    let (matrix, matrix_here) = ftp_matrix(cx, size)?;
    let len: u64 = if cx.budget.quick { 32 << 20 } else { 512 << 20 };
    // tmpfs keeps the disk out of the comparison, as the paper's cached-file FTP test did.
    let dir = tempfile::Builder::new()
        .prefix("zcnet-ftp")
        .tempdir_in(if Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        })
        .map_err(|e| BenchError::Failed(format!("temp dir: {e}")))?;
    let src_path = dir.path().join("src");
    {
        let mut f =
            std::fs::File::create(&src_path).map_err(|e| BenchError::Failed(e.to_string()))?;
        let block: Vec<u8> = (0..(1u32 << 20))
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let mut left = len;
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            std::io::Write::write_all(&mut f, &block[..n])
                .map_err(|e| BenchError::Failed(e.to_string()))?;
            left -= n as u64;
        }
    }
    let src = std::fs::File::open(&src_path).map_err(|e| BenchError::Failed(e.to_string()))?;
    let combos: [(&str, T, &str, R); 4] = [
        ("read+send", T::ReadSend, "recv+write", R::Write),
        ("sendfile", T::Sendfile, "recv+write", R::Write),
        ("read+send", T::ReadSend, "splice", R::Splice),
        ("sendfile", T::Sendfile, "splice", R::Splice),
    ];
    let mut table = String::from("| sender | receiver | Gbit/s | snd CPU-s/GiB | rcv CPU-s/GiB | both |\n|---|---|---|---|---|---|\n");
    let mut both_by = Vec::new();
    for (tn, tm, rn, rm) in combos {
        let mut g = Vec::new();
        let mut sc = Vec::new();
        let mut rc = Vec::new();
        for _ in 0..cx.budget.repeat {
            let (gb, s, r) = file_run(&src, len, &dir.path().join("dst"), tm, rm)?;
            g.push(gb);
            sc.push(s);
            rc.push(r);
        }
        let m = |v: &[f64]| zcnet_bench::summary::median(v).unwrap_or(f64::NAN);
        let (g, s, r) = (m(&g), m(&sc), m(&rc));
        let _ = writeln!(
            table,
            "| {tn} | {rn} | {g:.1} | {s:.3} | {r:.3} | {:.3} |",
            s + r
        );
        both_by.push((tn, rn, s, r));
    }
    let find = |t: &str, r: &str| {
        both_by
            .iter()
            .find(|x| x.0 == t && x.1 == r)
            .map(|x| (x.2, x.3))
    };
    let mut here = matrix_here;
    if let (Some(base), Some(zc)) = (find("read+send", "recv+write"), find("sendfile", "splice")) {
        let _ = write!(
            here,
            "sendfile out of the page cache costs {:.3} sender CPU-s/GiB against read+send's {:.3} (×{:.2}); splice into the file costs {:.3} receiver CPU-s/GiB against recv+write's {:.3} (×{:.2}). Both ends together: {:.3} vs {:.3} s/GiB.",
            zc.0,
            base.0,
            zc.0 / base.0,
            zc.1,
            base.1,
            zc.1 / base.1,
            zc.0 + zc.1,
            base.0 + base.1
        );
    }
    Ok(Section {
        title: "File transfer (Solaris, FTP test)".into(),
        paper: "\"zero-copy works best with other copyless I/O paths, such as memory mapped file, where data is moved to or from disks without being copied\" — the FTP test sent a cached file from an mmap'd buffer straight to the socket (Chu, §6.4, figure 2).".into(),
        setup: format!(
            "First table: loopback stream runs, the sender `--tx file` (sendfile of {} pieces from a page-cache file, `Sender::send_file`), the receiver each receive path — copy, mmap, uring (where this kernel has it), and `file` (splice into a page-cache file, `Receiver::recv_to_file`) — without and with the receiver touching every word it received (for `file`: read back from the page cache with pread, as an application must to look at a file); {} per run, median of {}. The sender never touches: its data never passes through the application. Second table: one {} file on tmpfs sent whole with read+send or sendfile into a new file written by recv+write or splice, checked byte for byte against the source; CPU of the sending and receiving threads (getrusage), median of {}.",
            ByteSize(size),
            secs(cx.budget.seconds),
            cx.budget.repeat,
            ByteSize(len),
            cx.budget.repeat
        ),
        tables: format!("{matrix}\n{table}"),
        plots: vec![],
        here,
    })
}

fn ping_pong(cx: &mut Cx) -> Result<Section, BenchError> {
    let sizes: Vec<u64> = if cx.budget.quick {
        vec![64, 64 << 10]
    } else {
        (0..=10).map(|k| 1u64 << (2 * k)).collect()
    };
    let mut pairs: Vec<(String, &str)> = tx_all()
        .into_iter()
        .map(|t| (t.to_string(), "copy"))
        .collect();
    if super::spec::rx_names().contains(&"mmap") {
        pairs.push(("copy".into(), "mmap"));
    }
    let mut specs = Vec::new();
    for &s in &sizes {
        for (tx, rx) in &pairs {
            let mut sp = cx.spec(&cx.loopback, "rr", tx, rx, s);
            sp.params.mode = Mode::Rr;
            sp.params.ring = default_ring(s, Mode::Rr);
            let trips = if cx.budget.quick {
                100
            } else {
                ((16u64 << 20) / s).clamp(100, 2000)
            };
            sp.params.limit = Limit::Bytes(s * trips);
            specs.push(sp);
        }
    }
    let rows = cx.run(false, specs)?;
    let all: Vec<&SummaryRow> = rows.iter().collect();
    let (svg, file) = cx.svg("rr");
    plot::figure(
        &svg,
        "Ping-pong over loopback TCP (NetPIPE)",
        &[
            Panel {
                title: "round-trip time (p50)".into(),
                x_label: "message size".into(),
                y_label: "µs".into(),
                log_x: true,
                x_is_size: true,
                series: plot::by_size(&all, |r| r.rtt_p50_us.map_or(0.0, |s| s.median)),
            },
            Panel {
                title: "bandwidth (both directions)".into(),
                x_label: "message size".into(),
                y_label: "Gbit/s".into(),
                log_x: true,
                x_is_size: true,
                series: plot::by_size(&all, |r| r.gbit_per_s.median),
            },
        ],
    )?;
    const C_RTT: Col = ("rtt p50 / p99 µs", |r| {
        match (&r.rtt_p50_us, &r.rtt_p99_us) {
            (Some(a), Some(b)) => format!("{:.1} / {:.1}", a.median, b.median),
            _ => "-".into(),
        }
    });
    const C_MBIT: Col = ("Mbit/s", |r| {
        let m = r.gbit_per_s.median * 1000.0;
        if m < 10.0 {
            format!("{m:.2}")
        } else {
            format!("{m:.0}")
        }
    });
    let tables = md(&all, &[C_SIZE, C_PATH, C_RTT, C_MBIT, C_MACH]);
    let mut here = String::new();
    let (lo, hi) = (sizes[0], *sizes.last().unwrap_or(&sizes[0]));
    for (tx, rx) in &pairs {
        let f = |s: u64| {
            rows.iter()
                .find(|r| &r.tx == tx && r.rx == *rx && r.size == s)
                .and_then(|r| r.rtt_p50_us.map(|x| x.median))
                .unwrap_or(0.0)
        };
        let _ = write!(
            here,
            "`{tx}→{rx}`: {:.1} µs at {}, {:.1} µs at {}. ",
            f(lo),
            ByteSize(lo),
            f(hi),
            ByteSize(hi)
        );
    }
    here += "Small messages are dominated by per-call and wake-up costs, where zero-copy's notifications can only add; large ones by the copy the kernel still makes on loopback.";
    Ok(Section {
        title: "Request/response ping-pong (Lightweight Messages / NetPIPE)".into(),
        paper: "\"The bandwidth and end-to-end latency are measured through 'ping pong' micro-benchmarks modified from NetPIPE, where the packet size increases exponentially and each size repeats 5000 times … LM can achieve 28.9 μs latency and 668.6 Mbps bandwidth compared with that of 68.1 μs latency and 398.6 Mbps bandwidth for standard UDP.\" — Jin, Zhang, Tan, §4.".into(),
        setup: format!(
            "Loopback TCP with TCP_NODELAY: the client sends a message, the server sends one of the same size back; sizes {}..{} by factors of 4, {} round trips per size, median of {}. Bandwidth counts both directions (NetPIPE's size / half the round trip).",
            ByteSize(lo),
            ByteSize(hi),
            if cx.budget.quick { "100".to_string() } else { "100 to 2000".to_string() },
            cx.budget.repeat
        ),
        tables,
        plots: vec![file],
        here,
    })
}

/// Runs the suite and writes the report.
/// What `zcnet bench --suite` takes from the command line.
#[derive(Debug, Clone)]
pub(crate) struct SuiteOptions {
    /// `--out DIR`: where the report goes (required).
    pub out: Option<std::path::PathBuf>,
    /// `--quick`: one short repeat of everything, to check the suite runs.
    pub quick: bool,
    /// `--only`: these experiments' ids (all when empty).
    pub only: Vec<String>,
    /// `--repeat`.
    pub repeat: u32,
    /// `--time`, seconds per run.
    pub time: Option<f64>,
}

pub(crate) fn run(name: SuiteName, args: &SuiteOptions) -> Result<(), BenchError> {
    let SuiteName::Papers = name;
    let out = args
        .out
        .clone()
        .ok_or_else(|| BenchError::Usage("--suite needs --out DIR".into()))?;
    if let Some(bad) = args
        .only
        .iter()
        .find(|id| !PAPERS.iter().any(|(p, _)| p == id))
    {
        let ids: Vec<&str> = PAPERS.iter().map(|(p, _)| *p).collect();
        return Err(BenchError::Usage(format!(
            "--only {bad}: no such experiment (the papers suite has {})",
            ids.join(", ")
        )));
    }
    std::fs::create_dir_all(&out)
        .map_err(|e| BenchError::io_owned(format!("creating {}", out.display()), e))?;
    let budget = if args.quick {
        Budget {
            repeat: 1,
            seconds: 0.1,
            quick: true,
        }
    } else {
        Budget {
            repeat: args.repeat.max(1),
            seconds: args.time.unwrap_or(0.6),
            quick: false,
        }
    };
    let loopback = Env::open(Topology::Loopback, None, None)?;
    let sink = Env::open(Topology::Sink, Some(1500), None).map_err(|e| e.to_string());
    let mut cx = Cx {
        loopback,
        sink,
        budget,
        out: out.clone(),
        runs: Vec::new(),
    };
    let started = std::time::Instant::now();
    let mut sections = Vec::new();
    for (id, f) in PAPERS {
        if !args.only.is_empty() && !args.only.iter().any(|o| o == id) {
            continue;
        }
        let t = std::time::Instant::now();
        let s = f(&mut cx).map_err(|e| BenchError::Failed(format!("experiment {id}: {e}")))?;
        eprintln!(
            "zcnet bench: {id} done in {:.0} s",
            t.elapsed().as_secs_f64()
        );
        sections.push(s);
    }
    let md = render(&cx, &sections, started.elapsed().as_secs_f64());
    write(&out.join("report.md"), md.as_bytes())?;
    let runs = std::mem::take(&mut cx.runs);
    let report = Report {
        schema: SCHEMA_VERSION,
        host: super::spec::host(),
        summary: summarise(&runs),
        pair_gaps: zcnet_bench::measure::pair_gaps(&runs),
        runs,
        verdict: None,
    };
    let json = serde_json::to_string_pretty(&report)
        .map_err(|e| BenchError::Failed(format!("serialising the report: {e}")))?;
    write(&out.join("report.json"), json.as_bytes())?;
    println!("{md}");
    println!("wrote {}", out.join("report.md").display());
    Ok(())
}

fn write(path: &Path, data: &[u8]) -> Result<(), BenchError> {
    std::fs::write(path, data)
        .map_err(|e| BenchError::io_owned(format!("writing {}", path.display()), e))
}

fn render(cx: &Cx, sections: &[Section], secs: f64) -> String {
    let h = super::spec::host();
    let mut s = String::new();
    let _ = writeln!(s, "# zcnet bench: the papers' experiments on this host\n");
    let _ = writeln!(
        s,
        "Host `{}`: {} CPUs ({}), kernel {}, zcnet {}. {} runs in {:.0} s, median of {} per configuration{}. Command: `zcnet bench --suite papers{}`.\n",
        h.hostname,
        h.cpus,
        h.cpu_model,
        h.kernel,
        h.zcnet,
        cx.runs.len(),
        secs,
        cx.budget.repeat,
        if cx.budget.quick { " (--quick: small and noisy)" } else { "" },
        if cx.budget.quick { " --quick" } else { "" }
    );
    s += "How to read: CPU-s/GiB is CPU time per GiB of payload moved — *snd*/*rcv* for each side's worker threads (getrusage), *machine* for the whole host from /proc/stat, softirq included (both ends share this machine). Gbit/s per core is the CMU efficiency. *tx zc%* is the share of sent bytes the kernel did not copy after all; *rx mapped%* the share of received bytes mapped rather than copied. Ranges in parentheses are min–max over the repeats: compare rows within a table, and treat differences inside the ranges as noise (two shared cores).\n\n";
    if let Err(why) = &cx.sink {
        let _ = writeln!(
            s,
            "The transmit-only sink topology was not available: {why}.\n"
        );
    }
    for (i, sec) in sections.iter().enumerate() {
        let _ = writeln!(s, "## {}. {}\n", i + 1, sec.title);
        let _ = writeln!(s, "**The paper:** {}\n", sec.paper);
        let _ = writeln!(s, "**Here:** {}\n", sec.setup);
        s += &sec.tables;
        s.push('\n');
        for p in &sec.plots {
            let _ = writeln!(s, "![{p}]({p})\n");
        }
        let _ = writeln!(s, "**What this host shows:** {}\n", sec.here);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use zcnet_bench::summary::Summary;

    fn row(tx: &str, size: u64, cpu: f64) -> SummaryRow {
        let s = Summary {
            n: 1,
            median: cpu,
            min: cpu,
            max: cpu,
        };
        SummaryRow {
            label: String::new(),
            mode: Mode::Stream,
            tx: tx.into(),
            rx: "copy".into(),
            topology: "loopback".into(),
            size,
            streams: 1,
            ring: 8,
            touch: false,
            unsupported: false,
            gbit_per_s: s,
            cpu_s_per_gib: s,
            sender_cpu_s_per_gib: s,
            receiver_cpu_s_per_gib: s,
            sender_user_s_per_gib: s,
            receiver_user_s_per_gib: s,
            gbit_per_core: s,
            zc_fraction_tx: s,
            zc_fraction_rx: s,
            send_p50_us: None,
            send_p99_us: None,
            recv_p50_us: None,
            rtt_p50_us: None,
            rtt_p99_us: None,
            pool_waits: s,
        }
    }

    #[test]
    fn crossover_is_where_zero_copy_stays_cheaper() {
        let f = |r: &SummaryRow| r.sender_cpu_s_per_gib.median;
        let rows = vec![
            row("copy", 4096, 0.3),
            row("zerocopy", 4096, 0.5),
            row("copy", 16384, 0.3),
            row("zerocopy", 16384, 0.29),
            row("copy", 65536, 0.3),
            row("zerocopy", 65536, 0.2),
        ];
        assert_eq!(crossover_size(&rows, "zerocopy", f), Some(16384));
        let never = vec![row("copy", 4096, 0.3), row("zerocopy", 4096, 0.5)];
        assert_eq!(crossover_size(&never, "zerocopy", f), None);
        // A dip below at a small size that does not last is not a crossover.
        let dip = vec![
            row("copy", 4096, 0.3),
            row("zerocopy", 4096, 0.2),
            row("copy", 65536, 0.3),
            row("zerocopy", 65536, 0.4),
        ];
        assert_eq!(crossover_size(&dip, "zerocopy", f), None);
    }

    #[test]
    fn markdown_tables_have_a_header_and_a_row_each() {
        let rows = [row("copy", 4096, 0.3), row("zerocopy", 4096, 0.5)];
        let refs: Vec<&SummaryRow> = rows.iter().collect();
        let t = md(&refs, &[C_SIZE, C_PATH, C_MACH]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0], "| size | tx→rx | machine CPU-s/GiB |");
        assert_eq!(lines[2], "| 4K | copy→copy | 0.300 |");
    }
}
