//! The one-line answer `zcnet bench` ends with: which transmit → receive path moves a GiB
//! for the least CPU, at which sizes — the CMU paper's question (figure 5: which stack is
//! more efficient, and where the crossover lies), asked of this host. The verdict names a
//! winner only when the medians differ by more than repeating the runs showed as noise.

use super::report::{Mode, SummaryRow};
use super::sizes::ByteSize;
use super::summary::Summary;
use std::fmt::Write as _;

/// Which CPU figure decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// Whole-machine busy time per GiB (both ends, softirq included): the honest figure
    /// when both ends share the machine.
    System,
    /// Sender + receiver worker threads per GiB: what can be measured across two hosts.
    Workers,
}

/// The winner at one size.
#[derive(Debug, Clone, PartialEq)]
pub struct SizeVerdict {
    /// Bytes per send.
    pub size: u64,
    /// Winning `tx→rx`.
    pub best: String,
    /// Its CPU-s/GiB.
    pub best_cpu: Summary,
    /// Next best `tx→rx` and its CPU-s/GiB.
    pub runner_up: Option<(String, Summary)>,
}

impl SizeVerdict {
    /// The winner's range overlaps the runner-up's: a tie within the noise.
    pub fn within_noise(&self) -> bool {
        self.runner_up
            .as_ref()
            .is_some_and(|(_, s)| s.overlaps(&self.best_cpu))
    }
}

/// The verdict over a set of stream runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// By size, in the order sizes first appear.
    pub per_size: Vec<SizeVerdict>,
    /// Path combinations that could not run as themselves here.
    pub unsupported: Vec<String>,
    /// Which figure decided.
    pub metric: Metric,
}

fn cpu_of(r: &SummaryRow, metric: Metric) -> Summary {
    match metric {
        Metric::System => r.cpu_s_per_gib,
        Metric::Workers => Summary {
            n: r.sender_cpu_s_per_gib.n,
            median: r.sender_cpu_s_per_gib.median + r.receiver_cpu_s_per_gib.median,
            min: r.sender_cpu_s_per_gib.min + r.receiver_cpu_s_per_gib.min,
            max: r.sender_cpu_s_per_gib.max + r.receiver_cpu_s_per_gib.max,
        },
    }
}

fn pair(r: &SummaryRow) -> String {
    format!("{}→{}", r.tx, r.rx)
}

/// Judges the stream rows of `rows` (other modes are ignored). `None` when no supported
/// stream row has a positive CPU figure.
pub fn judge(rows: &[SummaryRow], metric: Metric) -> Option<Verdict> {
    let mut sizes: Vec<u64> = Vec::new();
    let mut unsupported: Vec<String> = Vec::new();
    for r in rows.iter().filter(|r| r.mode == Mode::Stream) {
        if r.unsupported {
            if !unsupported.contains(&pair(r)) {
                unsupported.push(pair(r));
            }
        } else if !sizes.contains(&r.size) {
            sizes.push(r.size);
        }
    }
    let mut per_size = Vec::new();
    for size in sizes {
        let mut cands: Vec<(String, Summary)> = rows
            .iter()
            .filter(|r| r.mode == Mode::Stream && !r.unsupported && r.size == size)
            .map(|r| (pair(r), cpu_of(r, metric)))
            .filter(|(_, s)| s.median > 0.0 && s.median.is_finite())
            .collect();
        cands.sort_by(|a, b| a.1.median.total_cmp(&b.1.median));
        let mut it = cands.into_iter();
        if let Some((best, best_cpu)) = it.next() {
            per_size.push(SizeVerdict {
                size,
                best,
                best_cpu,
                runner_up: it.next(),
            });
        }
    }
    if per_size.is_empty() {
        return None;
    }
    Some(Verdict {
        per_size,
        unsupported,
        metric,
    })
}

impl Verdict {
    /// The verdict as one line.
    pub fn line(&self) -> String {
        let what = match self.metric {
            Metric::System => "CPU-s/GiB, whole machine",
            Metric::Workers => "CPU-s/GiB, sender + receiver",
        };
        let mut s = String::from("verdict: ");
        let first = &self.per_size[0].best;
        if self.per_size.len() > 1 && self.per_size.iter().all(|v| &v.best == first) {
            let _ = write!(
                s,
                "{first} moves a GiB for the least CPU at every size tried ("
            );
            for (i, v) in self.per_size.iter().enumerate() {
                let sep = if i > 0 { ", " } else { "" };
                let _ = write!(s, "{sep}{}: {:.3}", ByteSize(v.size), v.best_cpu.median);
            }
            let _ = write!(s, " {what})");
        } else {
            let _ = write!(s, "least CPU per GiB ({what}): ");
            for (i, v) in self.per_size.iter().enumerate() {
                let sep = if i > 0 { "; " } else { "" };
                let _ = write!(
                    s,
                    "{sep}{} at {} ({:.3})",
                    v.best,
                    ByteSize(v.size),
                    v.best_cpu.median
                );
            }
        }
        let ties: Vec<String> = self
            .per_size
            .iter()
            .filter(|v| v.within_noise())
            .filter_map(|v| {
                v.runner_up
                    .as_ref()
                    .map(|(p, _)| format!("{p} at {}", ByteSize(v.size)))
            })
            .collect();
        if !ties.is_empty() {
            let _ = write!(s, "; within run-to-run noise of {}", ties.join(", "));
        }
        if !self.unsupported.is_empty() {
            let _ = write!(s, "; not supported here: {}", self.unsupported.join(", "));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(tx: &str, rx: &str, size: u64, cpu: &[f64]) -> SummaryRow {
        let s = Summary::of(cpu).unwrap();
        let half = Summary {
            median: s.median / 2.0,
            min: s.min / 2.0,
            max: s.max / 2.0,
            ..s
        };
        SummaryRow {
            label: String::new(),
            mode: Mode::Stream,
            tx: tx.into(),
            rx: rx.into(),
            topology: "loopback".into(),
            size,
            streams: 1,
            ring: 8,
            touch: false,
            unsupported: false,
            gbit_per_s: s,
            cpu_s_per_gib: s,
            sender_cpu_s_per_gib: half,
            receiver_cpu_s_per_gib: half,
            sender_user_s_per_gib: half,
            receiver_user_s_per_gib: half,
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
    fn one_winner_everywhere() {
        let rows = vec![
            row("copy", "copy", 16384, &[0.50, 0.52, 0.51]),
            row("copy", "mmap", 16384, &[0.40, 0.41, 0.42]),
            row("copy", "copy", 262144, &[0.45, 0.46, 0.47]),
            row("copy", "mmap", 262144, &[0.35, 0.36, 0.37]),
        ];
        let v = judge(&rows, Metric::System).unwrap();
        assert_eq!(v.per_size.len(), 2);
        assert!(v
            .per_size
            .iter()
            .all(|s| s.best == "copy→mmap" && !s.within_noise()));
        let line = v.line();
        assert!(line.starts_with("verdict: copy→mmap moves a GiB for the least CPU at every size tried (16K: 0.410, 256K: 0.360"), "{line}");
        assert!(!line.contains("noise"), "{line}");
    }

    #[test]
    fn winners_by_size_ties_and_unsupported() {
        let mut zcrx = row("copy", "zcrx", 4096, &[0.01]);
        zcrx.unsupported = true;
        let rows = vec![
            row("copy", "copy", 4096, &[0.50, 0.60, 0.55]),
            row("zerocopy", "copy", 4096, &[0.58, 0.70, 0.65]),
            row("copy", "copy", 65536, &[0.50, 0.51]),
            row("zerocopy", "copy", 65536, &[0.30, 0.31]),
            zcrx,
        ];
        let v = judge(&rows, Metric::System).unwrap();
        assert_eq!(v.per_size[0].best, "copy→copy");
        assert!(v.per_size[0].within_noise());
        assert_eq!(v.per_size[1].best, "zerocopy→copy");
        assert!(!v.per_size[1].within_noise());
        let line = v.line();
        assert!(line.contains("copy→copy at 4K (0.550)"), "{line}");
        assert!(line.contains("zerocopy→copy at 64K (0.305)"), "{line}");
        assert!(
            line.contains("within run-to-run noise of zerocopy→copy at 4K"),
            "{line}"
        );
        assert!(line.contains("not supported here: copy→zcrx"), "{line}");
    }

    #[test]
    fn workers_metric_adds_both_sides_and_nothing_means_no_verdict() {
        let rows = vec![
            row("copy", "copy", 4096, &[0.4]),
            row("zerocopy", "copy", 4096, &[0.2]),
        ];
        let v = judge(&rows, Metric::Workers).unwrap();
        assert_eq!(v.per_size[0].best, "zerocopy→copy");
        assert!((v.per_size[0].best_cpu.median - 0.2).abs() < 1e-12);
        assert!(v.line().contains("sender + receiver"));
        let mut rr = row("copy", "copy", 4096, &[0.4]);
        rr.mode = Mode::Rr;
        assert_eq!(judge(&[rr], Metric::System), None);
        assert_eq!(judge(&[], Metric::System), None);
    }
}
