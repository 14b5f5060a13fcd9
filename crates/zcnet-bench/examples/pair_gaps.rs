//! The pair table (`auto → auto` against the best pair of single paths, with the twin) of
//! saved `zcnet bench --json` reports, recomputed from their runs by this build — for
//! reports written before the JSON carried `pair_gaps`, or to read old sittings by the
//! current statistics.
//!
//! ```text
//! cargo run --release -p zcnet-bench --example pair_gaps -- report.json [more.json ...]
//! ```
//!
//! One line per report and size: medians, the paired figure (per repeat, against every run
//! of the best pair there) with its 90 % interval (whole repeats resampled), the interval of
//! each row's runs resampled apart, and the twin's paired gap and interval.

use zcnet_bench::measure::pair_gaps;
use zcnet_bench::report::Report;

fn pct(x: Option<f64>) -> String {
    x.map_or("-".into(), |x| format!("{:+.1}%", 100.0 * x))
}

fn interval(x: Option<(f64, f64)>) -> String {
    x.map_or("-".into(), |(lo, hi)| {
        format!("{:+.1}..{:+.1}%", 100.0 * lo, 100.0 * hi)
    })
}

fn main() {
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        eprintln!("usage: pair_gaps REPORT.json [...]");
        std::process::exit(2);
    }
    let mut failed = false;
    for f in &files {
        let report: Report = match std::fs::read_to_string(f)
            .map_err(|e| e.to_string())
            .and_then(|s| serde_json::from_str(&s).map_err(|e| e.to_string()))
        {
            Ok(r) => r,
            Err(e) => {
                eprintln!("{f}: {e}");
                failed = true;
                continue;
            }
        };
        for g in pair_gaps(&report.runs) {
            let twin = g.twin.as_ref().map_or(String::new(), |t| {
                format!(
                    " | twin {} paired {} 90% {}",
                    pct(Some(t.gap)),
                    pct(t.paired_gap),
                    interval(t.paired_gap_interval)
                )
            });
            println!(
                "{f} {}K{}: auto {:.3} ({} runs), best {} {:.3}: {} paired {} 90% {} \
                 (unpaired {}){twin}",
                g.size >> 10,
                if g.touch { " touch" } else { "" },
                g.auto.median,
                g.auto_runs,
                g.best_pair,
                g.best.median,
                pct(Some(g.excess)),
                pct(g.paired_excess),
                interval(g.paired_excess_interval),
                interval(g.excess_interval),
            );
        }
    }
    if failed {
        std::process::exit(1);
    }
}
