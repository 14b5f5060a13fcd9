//! The `cow` path on its fallback backend, `mprotect(PROT_READ)` + a chained `SIGSEGV`
//! handler, as used where userfaultfd is unavailable. A separate test binary, hence a
//! separate process, so it can choose the backend before anything starts the engine.
//!
//! Besides copy semantics under overwrites (as in `cow.rs`), it checks that the handler
//! does not break the application's: a fault that is not ours still kills the process with
//! `SIGSEGV`, and Rust's stack-overflow report still works. Those run in a child process
//! (this binary again, one `#[ignore]`d test selected by an environment variable).

#![deny(unsafe_code)]

mod common;
mod cow_support;

use common::{veth_pair, Topo};
use cow_support::*;
use std::io::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use zcnet::cow::{self, BackendKind};
use zcnet::RxPath;
use zcnet_sys::testing::Mapping;

/// The mprotect backend, which needs only /proc/self/pagemap and a `SIGSEGV` handler: a
/// host without it is a failure, with why.
fn require_mprotect() {
    if let Err(why) = cow::use_backend(BackendKind::Mprotect) {
        panic!("mprotect backend unavailable: {why}");
    }
}

#[test]
fn overwrite_in_flight_loopback() {
    require_mprotect();
    for rx in [RxPath::Copy, RxPath::Mmap] {
        let (sent, s) = run(Topo::Loopback, rx, |tx| {
            overwrite_after_each_send(tx, 16, 1 << 20)
        });
        let what = format!("lo cow(mprotect)->{rx}");
        assert_copy_on_write_happened(&what, sent, &s);
        // Less what the kernel would not pin within the locked-memory limit (copied,
        // counted; none with CAP_IPC_LOCK).
        let refused = common::memlock_copied(&s, &what);
        assert_eq!(s.tx_cow_bytes_protected + refused, sent);
    }
    assert_eq!(cow::engine_stats().unwrap().backend, BackendKind::Mprotect);
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn overwrite_in_flight_veth() {
    require_mprotect();
    let pair = veth_pair(1500);
    let (sent, s) = run(Topo::Netns(&pair), RxPath::Copy, |tx| {
        overwrite_after_each_send(tx, 16, (1 << 20) + 3 * PAGE)
    });
    assert_copy_on_write_happened("veth cow(mprotect)", sent, &s);
}

#[test]
fn concurrent_senders_on_threads() {
    require_mprotect();
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..3)
            .map(|i| {
                s.spawn(move || {
                    let (sent, st) = run(Topo::Loopback, RxPath::Copy, |tx| {
                        overwrite_after_each_send(tx, 8, (512 << 10) + i * PAGE)
                    });
                    assert_copy_on_write_happened(&format!("thread {i}"), sent, &st);
                })
            })
            .collect();
        for r in runs {
            r.join().unwrap();
        }
    });
}

/// Runs this binary's `child` test in a child process with `ZCNET_COW_CHILD=what`, killed
/// if it is not done within a minute (so a regression fails instead of hanging).
fn run_child(what: &str) -> std::process::Output {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("ZCNET_COW_CHILD", what)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!(
                "child {what:?} did not finish within 60 s\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// A write to read-only memory that the engine never protected, with the engine running
/// and protecting other memory: the previous handler (Rust's, which restores the default)
/// must see it, and the process dies of SIGSEGV — not a hang, not a silent retry loop.
#[test]
fn foreign_segfault_is_chained() {
    require_mprotect();
    let out = run_child("segv");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSEGV),
        "child: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("engine up, protecting"));
}

/// A stack overflow with the engine's handler installed: Rust's guard-page handler (the
/// action installed before ours) still reports it.
#[test]
fn stack_overflow_report_survives() {
    require_mprotect();
    let out = run_child("overflow");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "child: {:?}\n{err}",
        out.status
    );
    assert!(err.contains("has overflowed its stack"), "{err}");
}

/// Recursion that cannot be turned into a loop: each frame's buffer is used after the
/// call returns (LLVM eliminates `return f(x) + c`-style recursion otherwise).
#[inline(never)]
fn recurse(depth: u64) -> u64 {
    let mut local = [depth as u8; 4096];
    std::hint::black_box(&mut local);
    if std::hint::black_box(depth) == u64::MAX {
        return 0;
    }
    let below = std::hint::black_box(recurse(std::hint::black_box(depth + 1)));
    below ^ u64::from(std::hint::black_box(&local)[depth as usize % 4096])
}

#[test]
#[ignore = "run as a child process by the tests above"]
fn child() {
    let Ok(what) = std::env::var("ZCNET_COW_CHILD") else {
        return;
    };
    cow::use_backend(BackendKind::Mprotect).unwrap();
    // Keep a real protected span in flight while the foreign fault happens.
    let (_sent, _s) = run(Topo::Loopback, RxPath::Copy, |tx| {
        let n = overwrite_after_each_send(tx, 2, 256 << 10);
        println!("engine up, protecting");
        std::io::stdout().flush().unwrap();
        match what.as_str() {
            "segv" => {
                // A read-only page of our own, never protected by the engine.
                let mut page = Mapping::anon_private_readonly(PAGE).unwrap();
                // Deliberately faulting write.
                page.write_volatile(0, 1);
                println!("survived a write to read-only memory");
            }
            "overflow" => {
                std::thread::Builder::new()
                    .stack_size(256 << 10)
                    .spawn(|| recurse(0))
                    .unwrap()
                    .join()
                    .ok();
            }
            _ => {}
        }
        n
    });
}
