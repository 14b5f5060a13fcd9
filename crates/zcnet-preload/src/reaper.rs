//! The thread that finishes closes: started on the first `close` that leaves pages in
//! flight (again in a forked child, which has no thread but the forking one). It sleeps
//! until woken, then until the waiting sockets report their completions (`POLLERR`, which
//! `poll` reports whether asked for or not), and runs the given work each time.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};
use std::thread::Thread;
use std::time::Duration;
use zcnet_sys::preload::{entry::as_hook, real};

static OWNER: AtomicU32 = AtomicU32::new(0);
static HANDLE: Mutex<Option<Thread>> = Mutex::new(None);

/// Starts the reaper in this process if needed, and wakes it. `work` reads what it can and
/// returns the descriptors still waiting.
pub fn wake(work: fn() -> Vec<i32>) {
    let me = std::process::id();
    let mut h = HANDLE.lock().unwrap_or_else(PoisonError::into_inner);
    if OWNER.load(Relaxed) != me {
        let spawned = std::thread::Builder::new()
            .name("zcnet-close".into())
            .spawn(move || as_hook(|| run(work)));
        if let Ok(j) = spawned {
            OWNER.store(me, Relaxed);
            *h = Some(j.thread().clone());
        }
    }
    if let Some(t) = h.as_ref() {
        t.unpark();
    }
}

fn run(work: fn() -> Vec<i32>) {
    loop {
        let waiting = work();
        if waiting.is_empty() {
            std::thread::park_timeout(Duration::from_secs(1));
            continue;
        }
        let mut fds: Vec<libc::pollfd> = waiting
            .iter()
            .map(|&fd| libc::pollfd {
                fd,
                events: 0,
                revents: 0,
            })
            .collect();
        let _ = real::poll(&mut fds, 50);
    }
}
