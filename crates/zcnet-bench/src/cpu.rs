//! CPU accounting for measurements: per-thread `getrusage` and system-wide `/proc/stat`.
//!
//! Network receive runs largely in softirq context, which `getrusage` attributes to whoever
//! was interrupted (or to ksoftirqd) — neper's `--stime_use_proc` and netperf's `-c/-C`
//! read /proc/stat for that reason. zcnet reports both: the workers' own time, and the
//! whole machine's busy time including softirq.

use serde::Serialize;
use std::time::Duration;
use zcnet_sys::raw::cpu::{clock_ticks, Rusage};

pub use zcnet_sys::raw::cpu::{process as process_rusage, thread as thread_rusage};

/// Busy time of the whole machine, summed over CPUs, from the first line of /proc/stat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct SystemCpu {
    /// user + nice seconds.
    pub user: f64,
    /// system seconds.
    pub sys: f64,
    /// irq seconds.
    pub irq: f64,
    /// softirq seconds.
    pub softirq: f64,
    /// idle + iowait seconds.
    pub idle: f64,
}

impl SystemCpu {
    /// Parses the aggregate `cpu ` line of /proc/stat (values in clock ticks).
    pub fn parse(stat: &str, ticks_per_s: u64) -> Option<SystemCpu> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        if v.len() < 7 {
            return None;
        }
        let s = |t: u64| t as f64 / ticks_per_s as f64;
        Some(SystemCpu {
            user: s(v[0] + v[1]),
            sys: s(v[2]),
            idle: s(v[3] + v[4]),
            irq: s(v[5]),
            softirq: s(v[6]),
        })
    }

    /// Reads /proc/stat now.
    pub fn now() -> Option<SystemCpu> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        Self::parse(&stat, clock_ticks())
    }

    /// `self - earlier`, field by field.
    pub fn since(&self, earlier: &SystemCpu) -> SystemCpu {
        SystemCpu {
            user: self.user - earlier.user,
            sys: self.sys - earlier.sys,
            irq: self.irq - earlier.irq,
            softirq: self.softirq - earlier.softirq,
            idle: self.idle - earlier.idle,
        }
    }

    /// Busy seconds: everything but idle.
    pub fn busy(&self) -> f64 {
        self.user + self.sys + self.irq + self.softirq
    }
}

/// User and system seconds, as a serialisable pair.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CpuSeconds {
    /// User seconds.
    pub user: f64,
    /// System seconds.
    pub sys: f64,
}

impl CpuSeconds {
    /// `later - earlier`.
    pub fn between(earlier: Rusage, later: Rusage) -> CpuSeconds {
        let d = |a: Duration, b: Duration| b.saturating_sub(a).as_secs_f64();
        CpuSeconds {
            user: d(earlier.user, later.user),
            sys: d(earlier.sys, later.sys),
        }
    }

    /// user + sys.
    pub fn total(&self) -> f64 {
        self.user + self.sys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_aggregate_line() {
        let stat = "cpu  100 5 50 1000 10 3 7 0 0 0\ncpu0 1 2 3 4 5 6 7\n";
        let c = SystemCpu::parse(stat, 100).unwrap();
        assert_eq!(c.user, 1.05);
        assert_eq!(c.sys, 0.5);
        assert_eq!(c.idle, 10.1);
        assert_eq!(c.irq, 0.03);
        assert_eq!(c.softirq, 0.07);
        assert!((c.busy() - 1.65).abs() < 1e-9);
        assert!(SystemCpu::parse("cpu0 1 2\n", 100).is_none());
        assert!(SystemCpu::parse("cpu  1 2 x 4 5 6 7\n", 100).is_none());
    }

    #[test]
    fn live_readings_move_forward() {
        // RUSAGE_THREAD is sampled at the scheduler tick, so a fixed amount of work can read
        // as zero when optimised (it did under --release). Burn CPU until the reading moves,
        // with a deadline far beyond any tick length: a reading that never moves fails.
        let a = SystemCpu::now().expect("/proc/stat readable");
        let t0 = thread_rusage().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut x = 0u64;
        let t1 = loop {
            for i in 0..1_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            let t1 = thread_rusage().unwrap();
            if CpuSeconds::between(t0, t1).total() > 0.0 {
                break t1;
            }
            if std::time::Instant::now() > deadline {
                panic!("thread CPU time did not move in 10 s of busy work");
            }
        };
        let b = SystemCpu::now().unwrap();
        assert!(CpuSeconds::between(t0, t1).total() > 0.0);
        assert!(b.since(&a).busy() >= 0.0);
    }
}
