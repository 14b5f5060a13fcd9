//! What a test reads of a server process it spawned, and the limits it sets on it: peak
//! and current memory, CPU time and threads from `/proc/PID/`, and resource limits through
//! util-linux's `prlimit(1)` (the limit applies to the running server, as an operator's
//! `ulimit` would).

use std::process::Command;

/// A `kB` field of `/proc/PID/status` (`VmHWM`, `VmRSS`, `VmSize`), in bytes.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
        * 1024
}

/// Threads of the process.
pub fn threads(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// Open descriptors of the process.
pub fn descriptors(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count() as u64
}

/// User + system CPU seconds the process used so far (`/proc/PID/stat`, clock ticks).
pub fn cpu_seconds(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command's closing parenthesis: state is field 3; utime 14, stime 15.
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

/// Sets resource `which` (`nofile`, `as`, …, as prlimit(1) names them) of a running
/// process: its soft limit, which the process meets, leaving the hard limit as it was so
/// the soft one can be raised again (raising a hard limit needs `CAP_SYS_RESOURCE`);
/// `None` for unlimited. Returns false (with a note on stderr) where prlimit(1) is missing
/// or refused.
pub fn set_limit(pid: u32, which: &str, value: Option<u64>) -> bool {
    let v = value.map_or("unlimited".to_string(), |v| v.to_string());
    match Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--{which}={v}:")])
        .output()
    {
        Ok(o) if o.status.success() => true,
        Ok(o) => {
            eprintln!("prlimit --{which}: {}", String::from_utf8_lossy(&o.stderr));
            false
        }
        Err(e) => {
            eprintln!("prlimit: {e}");
            false
        }
    }
}
