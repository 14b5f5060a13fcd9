//! The stats file: at normal exit, one JSON line per process appended to `ZCNET_STATS`
//! (`O_APPEND` keeps lines whole). A forked child writes its own line, of what it did
//! itself: its counters start from zero at the `fork`. A process that never sent on a TCP
//! socket nor called `sendmmsg` on a UDP one (a shell, a helper the program starts, a
//! child that only `exec`s) writes nothing, so the lines add up to what the program sent.
//! A `vfork` child writes nothing before its `exec`: what it sees is its parent's. Under `zcnet run`, the same counters are on its board
//! ([`crate::slot`]): for a process that ends any other way (a signal, `_exit`, `exec`) or
//! went passive, `zcnet run` writes the line.

use crate::globals::{
    config, cost_if_measured, cost_source, detours, engine_is_own, freed, huge_cost_if_measured,
    udp,
};
use crate::stats::Counters;
use crate::table::{reap_closing, reports, SockReport};
use std::io::Write;
use std::sync::Once;

static REGISTERED: Once = Once::new();

/// Registers the exit hook (once per process image).
pub fn register() {
    REGISTERED.call_once(|| {
        if config().stats.is_some() {
            zcnet_sys::preload::real::at_exit(at_exit);
        }
    });
}

extern "C" fn at_exit() {
    // Passive: not one system call of the library's own (zcnet run writes the line).
    if zcnet_sys::preload::entry::passive() {
        return;
    }
    zcnet_sys::preload::entry::as_hook(|| {
        reap_closing();
        let _ = write_stats();
        crate::slot::written();
    });
}

/// The process's line.
pub fn line() -> serde_json::Value {
    let cfg = config();
    let (sockets, others) = reports();
    let total = Counters::default();
    total.absorb(&others);
    for s in &sockets {
        total.absorb(&s.report);
    }
    let listed: Vec<&SockReport> = sockets.iter().filter(|s| s.report.calls > 0).collect();
    let engine = zcnet::cow::engine_stats().filter(|_| engine_is_own());
    // Asked only where the engine ran (it protected pages here): whether a kernel write
    // into them could have been resolved instead of failing.
    let kernel_faults = engine.map(|_| zcnet_sys::cow::uffd::kernel_faults());
    serde_json::json!({
        "pid": std::process::id(),
        "exe": std::env::current_exe().ok().map(|p| p.display().to_string()),
        "tx": cfg.mode,
        "bad_tx": cfg.bad_mode,
        "engine": engine,
        "uffd_kernel_faults": kernel_faults,
        "page_cost_ns": cost_if_measured(),
        "page_cost_from": cost_source(),
        "huge_page_cost_ns": huge_cost_if_measured(),
        "total": total.report(),
        "kernel_write_detours": detours(),
        "freed_in_flight": freed(),
        "io_uring": crate::rings::report(),
        "udp_sendmmsg": udp().report(),
        "sockets": listed,
        "sockets_not_listed": others,
    })
}

/// Before `exec`: the image's line is due now (no exit handler of this image will run).
/// On `zcnet run`'s board the slot is marked and `zcnet run` writes the line; without a
/// board the library writes it itself.
pub fn before_exec() {
    if !crate::slot::execed() {
        let _ = write_stats();
    }
}

/// The `exec` failed: the image goes on, and its line is written at its exit after all.
pub fn exec_failed() {
    crate::slot::exec_failed();
}

fn write_stats() -> std::io::Result<()> {
    let Some(path) = &config().stats else {
        return Ok(());
    };
    let line = line();
    if line["total"]["calls"].as_u64() == Some(0)
        && line["udp_sendmmsg"]["calls"].as_u64() == Some(0)
    {
        return Ok(());
    }
    let mut text = serde_json::to_string(&line).map_err(std::io::Error::other)?;
    text.push('\n');
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    f.write_all(text.as_bytes())
}
