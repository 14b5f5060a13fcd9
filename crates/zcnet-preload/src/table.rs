//! Descriptor → socket state, the descriptors each epoll instance watches, and the sockets
//! closed while the kernel still read their protected pages.
//!
//! One lock, held only for map look-ups: never across a call that can block.

use crate::globals::config;
use crate::kind::{cached, classify, remember, Kind};
use crate::reaper;
use crate::sock::Sock;
use crate::stats::{Counters, Report};
use serde::Serialize;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use zcnet_sys::preload::real;

/// One socket in the stats file.
#[derive(Debug, Clone, Serialize)]
pub struct SockReport {
    /// A descriptor it had.
    pub fd: i32,
    /// The peer address when first seen.
    pub peer: String,
    /// Its counters.
    #[serde(flatten)]
    pub report: Report,
}

/// Sockets listed one by one in the stats; the rest are summed into `others`.
const LISTED_MAX: usize = 512;

#[derive(Default)]
struct Table {
    fds: HashMap<i32, Arc<Sock>>,
    /// epoll fd → (event data → (fd, interest)).
    epoll: HashMap<i32, HashMap<u64, (i32, u32)>>,
    /// Hidden duplicates of closed sockets whose protected pages were still in flight.
    closing: Vec<(i32, Arc<Sock>)>,
    finished: Vec<SockReport>,
    others: Counters,
}

static TABLE: LazyLock<Mutex<Table>> = LazyLock::new(Mutex::default);

fn table() -> MutexGuard<'static, Table> {
    TABLE.lock().unwrap_or_else(PoisonError::into_inner)
}

thread_local! {
    static FORK_HOLD: RefCell<Option<MutexGuard<'static, Table>>> = const { RefCell::new(None) };
}

fn peer_of(fd: i32) -> String {
    real::with_fd(fd, |b| {
        socket2::SockRef::from(&b)
            .peer_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map(|a| a.to_string())
    })
    .flatten()
    .unwrap_or_default()
}

fn ino_of(fd: i32) -> Option<u64> {
    real::with_fd(fd, |b| rustix::fs::fstat(b).ok().map(|s| s.st_ino)).flatten()
}

/// The state of `fd` if it is a TCP socket.
pub fn sock(fd: i32) -> Option<Arc<Sock>> {
    match cached(fd) {
        Kind::Other => return None,
        Kind::Tcp => {
            if let Some(s) = table().fds.get(&fd) {
                return Some(s.clone());
            }
        }
        Kind::Unknown => {}
    }
    let kind = classify(fd);
    remember(fd, kind);
    if kind != Kind::Tcp {
        return None;
    }
    let ino = ino_of(fd)?;
    let mut t = table();
    if let Some(s) = t.fds.get(&fd).filter(|s| s.ino == ino) {
        return Some(s.clone());
    }
    let shared = t.fds.values().find(|s| s.ino == ino).cloned();
    let s = match shared {
        Some(s) => {
            s.fds.fetch_add(1, Relaxed);
            s
        }
        None => Arc::new(Sock::new(ino, peer_of(fd))),
    };
    if let Some(old) = t.fds.insert(fd, s.clone()) {
        retire(&mut t, fd, old);
    }
    Some(s)
}

fn retire(t: &mut Table, fd: i32, s: Arc<Sock>) {
    if s.fds.fetch_sub(1, Relaxed) == 1 {
        let report = s.counters.report();
        if t.finished.len() < LISTED_MAX {
            t.finished.push(SockReport {
                fd,
                peer: s.peer.clone(),
                report,
            });
        } else {
            t.others.absorb(&report);
        }
    }
}

/// `fd` is a new descriptor: forget what its number was.
pub fn forget(fd: i32) {
    remember(fd, Kind::Unknown);
    let mut t = table();
    if let Some(old) = t.fds.remove(&fd) {
        retire(&mut t, fd, old);
    }
}

/// Waits up to `limit` for the kernel to finish with `s`'s protected pages; true when it has.
fn settle(fd: i32, s: &Sock, limit: Duration) -> bool {
    let demote = demote_after();
    let start = Instant::now();
    loop {
        s.drain(fd, demote);
        if s.in_flight() == 0 {
            return true;
        }
        if start.elapsed() >= limit {
            return false;
        }
        // A completion makes the socket report POLLERR; wake for it or after 10 ms.
        let mut p = [libc::pollfd {
            fd,
            events: 0,
            revents: 0,
        }];
        let _ = real::poll(&mut p, 10);
    }
}

/// How many COPIED completions in a row demote a socket, in this mode.
pub fn demote_after() -> Option<u32> {
    match config().mode {
        crate::config::Mode::Zerocopy => None,
        _ => zcnet::Policy::default().demote_after_copied,
    }
}

/// Before `close(fd)`: if it is the last descriptor of a socket whose protected pages the
/// kernel still reads, keep a hidden duplicate and return at once; the reaper thread reads
/// the remaining completions, lifts the protections and closes the duplicate — which is
/// when the socket's FIN goes out (after the data is acknowledged, instead of right after
/// it is queued). Nothing waits in the program.
pub fn close(fd: i32) {
    remember(fd, Kind::Unknown);
    let s = {
        let mut t = table();
        for m in t.epoll.values_mut() {
            m.retain(|_, v| v.0 != fd);
        }
        t.epoll.remove(&fd);
        t.fds.remove(&fd)
    };
    let Some(s) = s else {
        return;
    };
    let last = s.fds.load(Relaxed) == 1;
    if last && s.zc_ever() && !settle(fd, &s, Duration::ZERO) {
        if let Ok(hidden) = real::dup(fd) {
            table().closing.push((hidden as i32, s));
            reaper::wake(reap_closing);
            return;
        }
        // No descriptor left to read completions with: wait for them here instead.
        settle(fd, &s, Duration::from_secs(5));
    }
    let mut t = table();
    retire(&mut t, fd, s);
}

/// Reads the completions of closed sockets and closes those the kernel is done with.
/// Returns the hidden descriptors still waiting.
pub fn reap_closing() -> Vec<i32> {
    let pending: Vec<(i32, Arc<Sock>)> = {
        let mut t = table();
        if t.closing.is_empty() {
            return Vec::new();
        }
        std::mem::take(&mut t.closing)
    };
    let mut keep = Vec::new();
    for (fd, s) in pending {
        if settle(fd, &s, Duration::ZERO) {
            let _ = real::close(fd);
            retire(&mut table(), fd, s);
        } else {
            keep.push((fd, s));
        }
    }
    let waiting = keep.iter().map(|(fd, _)| *fd).collect();
    table().closing.extend(keep);
    waiting
}

/// Whether `fd` is still the socket `s` (a descriptor closed where this library could not
/// see it may have been reused).
pub fn same_socket(fd: i32, s: &Sock) -> bool {
    ino_of(fd) == Some(s.ino)
}

/// Records `epoll_ctl(epfd, op, fd, ev)`.
pub fn epoll_ctl(epfd: i32, op: i32, fd: i32, ev: Option<(u32, u64)>) {
    let mut t = table();
    let m = t.epoll.entry(epfd).or_default();
    m.retain(|_, v| v.0 != fd);
    if op != libc::EPOLL_CTL_DEL {
        if let Some((events, data)) = ev {
            m.insert(data, (fd, events));
        }
    }
}

/// The descriptor and interest registered in `epfd` with event data `data`.
pub fn epoll_target(epfd: i32, data: u64) -> Option<(i32, u32)> {
    table().epoll.get(&epfd)?.get(&data).copied()
}

/// Every socket with protected pages in flight, with a descriptor of it.
pub fn in_flight() -> Vec<(i32, Arc<Sock>)> {
    let t = table();
    let mut v: Vec<(i32, Arc<Sock>)> = t.fds.iter().map(|(f, s)| (*f, s.clone())).collect();
    v.extend(t.closing.iter().cloned());
    v.retain(|(_, s)| s.zc_ever() && s.in_flight() > 0);
    v
}

/// Before `fork`: let the kernel finish with what is in flight (so that the child, which
/// shares the sockets but must not read their error queues, inherits no pending
/// completion), then hold the table so the child gets it unlocked and consistent.
pub fn before_fork() {
    for (fd, s) in in_flight() {
        settle(fd, &s, Duration::from_secs(1));
    }
    let g = table();
    FORK_HOLD.with(|h| *h.borrow_mut() = Some(g));
}

/// After `fork`, in either process: let go of the table. In the child, the sockets the
/// parent sent zero-copy on become inherited (see [`Sock::inherited`]), and the hidden
/// duplicates of closed ones are closed (the parent keeps its own).
pub fn after_fork(child: bool) {
    let Some(mut t) = FORK_HOLD.with(|h| h.borrow_mut().take()) else {
        return;
    };
    if child {
        for s in t.fds.values() {
            if s.zc_ever() {
                s.set_inherited();
            }
        }
        for (fd, s) in std::mem::take(&mut t.closing) {
            s.set_inherited();
            let _ = real::close(fd);
        }
    }
}

/// Every socket's report: open, closing and closed ones, and the sum of the rest.
pub fn reports() -> (Vec<SockReport>, Report) {
    let t = table();
    let mut v = t.finished.clone();
    let mut seen = Vec::new();
    for (fd, s) in t.fds.iter().chain(t.closing.iter().map(|(f, s)| (f, s))) {
        if !seen.contains(&s.ino) {
            seen.push(s.ino);
            v.push(SockReport {
                fd: *fd,
                peer: s.peer.clone(),
                report: s.counters.report(),
            });
        }
    }
    (v, t.others.report())
}
