//! `--pin`: the data threads on fixed CPUs — receivers on the first CPU this process may use,
//! senders on the second — as `taskset -c 0` / `-c 1` pin two processes. On a 2-CPU machine
//! the scheduler otherwise moves the two ends together and apart mid-run, and which it did
//! shows up as run-to-run spread in CPU-s/GiB; whether pinning cuts that spread is measured
//! (the twin beside `auto → auto`'s comparison), not assumed.

use super::spec::BenchError;
use std::sync::OnceLock;
use zcnet_sys::raw::cpu;

/// (receivers' CPU, senders' CPU), once `--pin` was asked for.
static CPUS: OnceLock<(usize, usize)> = OnceLock::new();

/// Turns pinning on for this process's runs; an error if fewer than 2 CPUs are allowed.
pub(crate) fn set() -> Result<(), String> {
    let cpus = cpu::allowed_cpus().map_err(|e| format!("--pin: sched_getaffinity: {e}"))?;
    match cpus[..] {
        [rx, tx, ..] => {
            let _ = CPUS.set((rx, tx));
            Ok(())
        }
        _ => Err(format!(
            "--pin needs 2 CPUs; this process may run on {} ({cpus:?})",
            cpus.len()
        )),
    }
}

/// Which CPUs the ends are pinned to, if they are.
pub(crate) fn cpus() -> Option<(usize, usize)> {
    CPUS.get().copied()
}

fn pin(cpu: Option<usize>) -> Result<(), BenchError> {
    match cpu {
        Some(c) => cpu::pin_thread(c).map_err(|e| BenchError::io("sched_setaffinity (--pin)", e)),
        None => Ok(()),
    }
}

/// Pins the calling receiving thread, if `--pin`.
pub(crate) fn receiver() -> Result<(), BenchError> {
    pin(cpus().map(|c| c.0))
}

/// Pins the calling sending thread, if `--pin`.
pub(crate) fn sender() -> Result<(), BenchError> {
    pin(cpus().map(|c| c.1))
}
