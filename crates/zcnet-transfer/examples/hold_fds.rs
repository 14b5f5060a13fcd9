//! The stress run of issue 40 against a receiver in a process of its own: 20 sessions from
//! four addresses (127.0.0.2 to 127.0.0.5) start files by ranges as fast as they are
//! answered and finish none, for SECS seconds (30 by default), while a legitimate 100 MiB
//! file goes over two streams from 127.0.0.6 and must arrive byte-exact. Prints the
//! receiver's peak descriptors (`/proc/PID/fd`, sampled every 20 ms) and resident memory
//! (`VmHWM`).
//!
//! `cargo run -p zcnet-transfer --example hold_fds -- [SECS]`
//!
//! The receiver is this program run as `hold_fds serve DIR` (`--resume`, so each ranged file
//! holds its record too; 24 sessions, so the measure is descriptors, not session slots).

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcnet_transfer::server::{serve, Quiet, ServerConfig};

#[path = "../tests/stress/mod.rs"]
mod stress;

fn receiver(dir: &str) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    println!("{}", listener.local_addr().unwrap().port());
    let mut cfg = ServerConfig::default();
    cfg.store.resume = true;
    cfg.max_sessions = 24;
    zcnet_transfer::server::raise_fd_limit();
    let stop = AtomicBool::new(false);
    serve(listener, dir.as_ref(), cfg, &stop, Arc::new(Quiet)).unwrap();
}

fn status_kib(pid: u32, field: &str) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("serve") {
        return receiver(&args[2]);
    }
    let secs: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(30);
    let dst = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .arg("serve")
        .arg(dst.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let to = SocketAddr::new("127.0.0.1".parse().unwrap(), line.trim().parse().unwrap());
    let f = src.path().join("legit");
    let h = stress::make_file(&f, 100 << 20);
    let idle_fds = fds(pid);
    let idle_rss = status_kib(pid, "VmRSS:");

    let sampling = Arc::new(AtomicBool::new(true));
    let peak_fds = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (sampling, peak_fds) = (sampling.clone(), peak_fds.clone());
        std::thread::spawn(move || {
            while sampling.load(Ordering::Relaxed) {
                peak_fds.fetch_max(fds(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let (stop, out) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(stress::Attack::default()),
    );
    let addrs: Vec<IpAddr> = (2..6)
        .map(|i| format!("127.0.0.{i}").parse().unwrap())
        .collect();
    let t0 = Instant::now();
    let threads = stress::attack(&addrs, 5, to, stop.clone(), out.clone());
    std::thread::sleep(Duration::from_secs(2.min(secs)));
    let (sent, tries, took) = stress::legit_send(
        "127.0.0.6".parse().unwrap(),
        to,
        &f,
        "legit",
        2,
        Duration::from_secs(secs),
    );
    let legit = match &sent {
        Ok(r) if r.report.failures() == 0 => {
            if stress::hash(&dst.path().join("legit")) == h {
                "byte-exact".to_string()
            } else {
                "DIFFERENT BYTES".to_string()
            }
        }
        Ok(r) => format!("failed: {:?}", r.report.files),
        Err(e) => format!("failed: {e}"),
    };
    let rest = Duration::from_secs(secs).saturating_sub(t0.elapsed());
    std::thread::sleep(rest);
    let held_fds = fds(pid);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    sampling.store(false, Ordering::Relaxed);
    sampler.join().unwrap();
    let hwm = status_kib(pid, "VmHWM:");
    let mut partials = 0;
    let mut stack = vec![dst.path().to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            } else if e.file_name() != "legit" {
                partials += 1;
            }
        }
    }
    println!(
        "{secs} s, 20 sessions from 4 addresses starting unfinished ranged files: {} sessions got in, {} connections refused, {} files started, {} refused",
        out.sessions.load(Ordering::Relaxed),
        out.refused_sessions.load(Ordering::Relaxed),
        out.started.load(Ordering::Relaxed),
        out.refused_files.load(Ordering::Relaxed),
    );
    println!(
        "legitimate 100 MiB over 2 streams from 127.0.0.6: {legit}, in {took:.2?} ({tries} tries, {} stream(s))",
        sent.as_ref().map_or(0, |r| r.streams)
    );
    println!(
        "receiver: descriptors idle {idle_fds}, peak {}, at the end {held_fds}; resident idle {} KiB, peak (VmHWM) {hwm} KiB; partial and record files left in DIR {partials}",
        peak_fds.load(Ordering::Relaxed),
        idle_rss,
    );
    let _ = child.kill();
    let _ = child.wait();
}
