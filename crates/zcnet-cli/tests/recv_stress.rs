//! A measurement, not a check (ignored by default): `zcnet recv` under 10,000 stalled
//! connections over loopback, from many source addresses of 127/8 so the per-address cap
//! does not simply refuse them. Samples the receiver's peak RSS, threads and descriptors
//! while they are held, and times a legitimate 100 MiB send (every byte checked) meanwhile.
//!
//! ```text
//! cargo test -p zcnet-cli --test recv_stress -- --ignored --nocapture
//! ZCNET_STRESS_BIN=/path/to/zcnet ZCNET_STRESS_CONNS=10000 ZCNET_STRESS_RECV_ARGS="--max-pending 20000" …
//! ```
//!
//! `ZCNET_STRESS_BIN` runs another build (e.g. `main`'s) the same way;
//! `ZCNET_STRESS_JUNK=1` makes each peer send a 4 MiB frame (all but its last byte) where
//! the Hello is due, instead of nothing.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn proc_status(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn ten_thousand_stalled_connections() {
    let conns: usize = std::env::var("ZCNET_STRESS_CONNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let bin = std::env::var("ZCNET_STRESS_BIN").unwrap_or(env!("CARGO_BIN_EXE_zcnet").into());
    let extra = std::env::var("ZCNET_STRESS_RECV_ARGS").unwrap_or_default();
    // ZCNET_STRESS_JUNK=1: each peer sends a 4 MiB frame header where the Hello is due.
    let junk = std::env::var("ZCNET_STRESS_JUNK").is_ok_and(|v| v == "1");
    // Descriptors for both ends: raise this process's limit (root may raise the hard one).
    let me = std::process::id().to_string();
    let want = (2 * conns + 1000).to_string();
    let _ = Command::new("prlimit")
        .args(["--pid", &me, &format!("--nofile={want}:{want}")])
        .status();
    let dst = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    let f = src.path().join("legit");
    {
        let mut w = std::fs::File::create(&f).unwrap();
        let mut x = 0x9e3779b97f4a7c15u64;
        let block: Vec<u8> = (0..(1 << 20) + 7)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let mut left = 100usize << 20;
        while left > 0 {
            let n = left.min(block.len());
            w.write_all(&block[..n]).unwrap();
            left -= n;
        }
    }
    let mut child = Command::new(&bin)
        .args(["recv", "--quiet", "--listen", "127.0.0.1:0", "--dir"])
        .arg(dst.path())
        .args(extra.split_whitespace())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // --quiet hides the start-up line: find the port from /proc.
    let port = {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let out = Command::new("ss").args(["-Hltnp"]).output().unwrap();
            let s = String::from_utf8_lossy(&out.stdout);
            if let Some(p) = s
                .lines()
                .find(|l| l.contains(&format!("pid={pid},")))
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse::<u16>().ok())
            {
                break p;
            }
            if Instant::now() >= deadline {
                panic!("hang guard: no listening socket");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let base = (
        proc_status(pid, "VmRSS:"),
        proc_status(pid, "Threads:"),
        fds(pid),
    );
    let peak = Arc::new(Mutex::new(base));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let now = (
                    proc_status(pid, "VmRSS:"),
                    proc_status(pid, "Threads:"),
                    fds(pid),
                );
                let mut p = peak.lock().unwrap();
                *p = (p.0.max(now.0), p.1.max(now.1), p.2.max(now.2));
                drop(p);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    // The stalled peers: 8 per source address (the default per-address cap), never a byte.
    let t0 = Instant::now();
    let held: Vec<TcpStream> = std::thread::scope(|s| {
        let parts: Vec<_> = (0..4)
            .map(|k| {
                s.spawn(move || {
                    let mut v = Vec::new();
                    for i in (k..conns).step_by(4) {
                        let a = i / 8;
                        let from: IpAddr = format!("127.1.{}.{}", a / 250, 1 + a % 250)
                            .parse()
                            .unwrap();
                        let sock = socket2::Socket::new(
                            socket2::Domain::IPV4,
                            socket2::Type::STREAM,
                            None,
                        )
                        .unwrap();
                        sock.bind(&socket2::SockAddr::from(SocketAddr::new(from, 0)))
                            .unwrap();
                        match sock
                            .connect_timeout(&socket2::SockAddr::from(addr), Duration::from_secs(5))
                        {
                            Ok(()) => {
                                let mut t = TcpStream::from(sock);
                                if junk {
                                    // A 4 MiB Data frame where the Hello is due, all but
                                    // its last byte (a receiver that buffers it holds it all).
                                    let _ = t.set_write_timeout(Some(Duration::from_secs(2)));
                                    let _ = t.write_all(&[6, 0, 0x40, 0, 0]);
                                    let _ = t.write_all(&vec![0x5a; (4 << 20) - 1]);
                                }
                                v.push(t)
                            }
                            Err(e) => eprintln!("connect {i}: {e}"),
                        }
                    }
                    v
                })
            })
            .collect();
        parts.into_iter().flat_map(|p| p.join().unwrap()).collect()
    });
    let opened = t0.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    let alive = child.try_wait().unwrap().is_none();
    let t1 = Instant::now();
    let out = Command::new(&bin)
        .args(["send", "--quiet", "--to", &addr.to_string()])
        .arg(&f)
        .output()
        .unwrap();
    let send_time = t1.elapsed();
    let sent_ok = out.status.success()
        && std::fs::read(dst.path().join("legit")).ok() == std::fs::read(&f).ok();
    std::thread::sleep(Duration::from_millis(200));
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let p = *peak.lock().unwrap();
    let still_alive = child.try_wait().unwrap().is_none();
    println!(
        "stress: {} of {conns} connections opened in {:.2} s; receiver {} (alive after: {still_alive}); \
         baseline RSS {} KiB, {} threads, {} fds; peak RSS {} KiB (VmHWM {} KiB), {} threads, {} fds; \
         legitimate 100 MiB send: {} in {:.2} s{}",
        held.len(),
        opened.as_secs_f64(),
        if alive { "alive" } else { "DEAD" },
        base.0,
        base.1,
        base.2,
        p.0,
        proc_status(pid, "VmHWM:"),
        p.1,
        p.2,
        if sent_ok { "ok, verified" } else { "FAILED" },
        send_time.as_secs_f64(),
        if sent_ok {
            String::new()
        } else {
            format!(" ({})", String::from_utf8_lossy(&out.stderr).trim())
        }
    );
    drop(held);
    let _ = child.kill();
    let _ = child.wait();
    let mut err = String::new();
    let _ = BufReader::new(child.stderr.take().unwrap()).read_line(&mut err);
}
