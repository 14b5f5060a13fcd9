//! Signals arriving during blocking sends, receives, polls and pool waits: every path retries
//! `EINTR` and the stream arrives whole. In its own test binary (its own process), because it
//! fills the process with signals.

mod common;

use common::{transfer, Case, Topo};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use zcnet::{RxPath, TxPath};

#[test]
fn transfers_survive_a_storm_of_signals() {
    let delivered = Arc::new(AtomicBool::new(false));
    // A handler that does nothing but note it ran. Sockets with SO_RCVTIMEO/SO_SNDTIMEO (all
    // of ours) and poll() return EINTR even with SA_RESTART (signal(7)).
    signal_hook::flag::register(signal_hook::consts::SIGUSR1, delivered.clone()).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU32::new(0));
    let pid = std::process::id();
    let storm = {
        let (done, sent) = (done.clone(), sent.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let ok = usr1(pid).is_ok();
                sent.fetch_add(ok as u32, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    // Keep transferring until a good number of signals have landed (bounded rounds).
    for _round in 0..20 {
        if sent.load(Ordering::Relaxed) >= 100 {
            break;
        }
        run_every_path();
    }
    done.store(true, Ordering::Relaxed);
    storm.join().unwrap();
    assert!(
        sent.load(Ordering::Relaxed) >= 100,
        "too few signals could be sent"
    );
    assert!(
        delivered.load(Ordering::Relaxed),
        "no signal reached the process"
    );
}

fn run_every_path() {
    for tx in TxPath::ALL {
        for rx in RxPath::ALL {
            let out = transfer(
                Topo::Loopback,
                Case {
                    tx,
                    rx,
                    size: 48 << 20,
                    offset: 0,
                },
            );
            assert_eq!(out.received, 48 << 20, "{tx}->{rx}");
        }
    }
}

#[test]
fn a_stalled_peer_still_times_out_under_a_signal_storm() {
    use common::{connect, listen, pattern, receiver_config, sender_config};
    // Every signal restarts the kernel's SO_SNDTIMEO; the send must still give up.
    signal_hook::flag::register(
        signal_hook::consts::SIGUSR1,
        Arc::new(AtomicBool::new(false)),
    )
    .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let pid = std::process::id();
    let storm = {
        let done = done.clone();
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let _ = usr1(pid);
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    let mut rcfg = receiver_config(RxPath::Copy);
    rcfg.rcvbuf = Some(64 << 10);
    let listener = listen(Topo::Loopback, &rcfg);
    let port = listener.local_addr().unwrap().port();
    let stop = AtomicBool::new(false);
    let err = std::thread::scope(|s| {
        s.spawn(|| {
            let _rx = listener.accept().unwrap();
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let mut cfg = sender_config(TxPath::Copy);
        cfg.timeout = Some(Duration::from_secs(1));
        let mut tx = connect(Topo::Loopback, port, &cfg);
        let mut pos = 0u64;
        let err = loop {
            if let Err(e) = tx.send_slice(pattern(pos, 1 << 20)) {
                break e;
            }
            pos += 1 << 20;
        };
        stop.store(true, Ordering::Relaxed);
        err
    });
    done.store(true, Ordering::Relaxed);
    storm.join().unwrap();
    assert!(matches!(err, zcnet::Error::Timeout { .. }), "{err}");
}

/// SIGUSR1 to the whole process `pid` (any thread may take it), by the syscall rather than
/// the `kill` program, which a machine with only Rust may not have.
fn usr1(pid: u32) -> std::io::Result<()> {
    let pid = rustix::process::Pid::from_raw(pid as i32).expect("this process's pid");
    Ok(rustix::process::kill_process(
        pid,
        rustix::process::Signal::USR1,
    )?)
}
