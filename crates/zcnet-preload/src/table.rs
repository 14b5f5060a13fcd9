//! Descriptor → socket state, the descriptors each epoll instance watches, and the sockets
//! closed while the kernel still read their protected pages.
//!
//! One lock, held only for map look-ups: never across a call that can block.

use crate::birth;
use crate::globals::config;
use crate::kind::{cached, classify, remember, Kind};
use crate::lineage;
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
    /// Hidden duplicates through which the reaper reads completions: of closed sockets
    /// whose protected pages were still in flight, and (not to be retired) of sockets
    /// open in a forked child too, whose completions must not wait for this process to
    /// look at them.
    closing: Vec<Watched>,
    finished: Vec<SockReport>,
    others: Counters,
}

/// A hidden duplicate the reaper reads completions through.
#[derive(Clone)]
struct Watched {
    fd: i32,
    sock: Arc<Sock>,
    /// The program closed the socket: retire it (into the stats) when done.
    closed: bool,
}

static TABLE: LazyLock<Mutex<Table>> = LazyLock::new(Mutex::default);

fn table() -> MutexGuard<'static, Table> {
    TABLE.lock().unwrap_or_else(PoisonError::into_inner)
}

thread_local! {
    static FORK_HOLD: RefCell<Option<MutexGuard<'static, Table>>> = const { RefCell::new(None) };
    static COW_HOLD: RefCell<Option<zcnet::cow::ForkHold>> = const { RefCell::new(None) };
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

/// The state of `fd` if this library knows it for a TCP socket — learned from the calls
/// the program made ([`crate::kind`]): no system call.
pub fn known(fd: i32) -> Option<Arc<Sock>> {
    (cached(fd) == Kind::Tcp).then(|| entry(&mut table(), fd))
}

/// The state of `fd`, made if missing (no system call).
fn entry(t: &mut Table, fd: i32) -> Arc<Sock> {
    t.fds
        .entry(fd)
        .or_insert_with(|| {
            let s = Arc::new(Sock::new());
            if birth::may_be_shared(fd) {
                s.set_shared();
            }
            s
        })
        .clone()
}

/// The state of `fd` if it is a TCP socket, for a send that may go zero-copy: a
/// descriptor this library did not see made is asked of the kernel now, and the socket is
/// identified (its inode: descriptors of one socket share one state, even duplicates this
/// library did not see made, `fcntl(F_DUPFD)` or one received over a Unix socket) and its
/// peer named for the stats.
pub fn sock(fd: i32) -> Option<Arc<Sock>> {
    if cached(fd) == Kind::Unknown {
        remember(fd, classify(fd));
    }
    let s = known(fd)?;
    if s.ino().is_some() {
        return Some(s);
    }
    let ino = ino_of(fd)?;
    let mut t = table();
    let other = t
        .fds
        .values()
        .find(|o| o.ino() == Some(ino) && !Arc::ptr_eq(o, &s))
        .cloned();
    match other {
        Some(o) if s.fds.load(Relaxed) == 1 && !s.zc_ever() => {
            // Another descriptor of this socket already has its state: one state for both,
            // keeping what this descriptor counted so far.
            o.counters.absorb(&s.counters.report());
            o.fds.fetch_add(1, Relaxed);
            t.fds.insert(fd, o.clone());
            Some(o)
        }
        _ => {
            s.identify(ino, peer_of(fd));
            Some(s)
        }
    }
}

/// The state `setsockopt` on `fd` records into (the program reads the error queue itself):
/// also for a descriptor whose kind is not known yet, which may turn out a TCP socket.
pub fn for_option(fd: i32) -> Option<Arc<Sock>> {
    matches!(cached(fd), Kind::Tcp | Kind::Unknown).then(|| entry(&mut table(), fd))
}

fn retire(t: &mut Table, fd: i32, s: Arc<Sock>) {
    if s.fds.fetch_sub(1, Relaxed) == 1 {
        let report = s.counters.report();
        if t.finished.len() < LISTED_MAX {
            t.finished.push(SockReport {
                fd,
                peer: s.peer(),
                report,
            });
        } else {
            t.others.absorb(&report);
        }
    }
}

/// `fd` is a new descriptor: forget what its number was.
pub fn forget(fd: i32) {
    birth::opened(fd);
    forget_kind(fd);
}

/// `fd` was made by the program as a socket of `kind` (`socket`, `socketpair`, `accept`).
pub fn opened(fd: i32, kind: Kind) {
    forget(fd);
    remember(fd, kind);
}

/// `new` is a duplicate of `old`: the same socket, of the same kind, under another number.
pub fn duplicated(old: i32, new: i32) {
    birth::duplicated(old, new);
    forget_kind(new);
    remember(new, cached(old));
    let mut t = table();
    if let Some(s) = t.fds.get(&old).cloned() {
        s.fds.fetch_add(1, Relaxed);
        t.fds.insert(new, s);
    }
}

fn forget_kind(fd: i32) {
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
    birth::closed(fd);
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
    // A forked child's loans are its parent's, which it never completes: waiting for them
    // would keep the connection open (no FIN for the peer) until the child exits.
    let ours = s.foreign_owner().is_none();
    if last && ours && s.zc_ever() && !settle(fd, &s, Duration::ZERO) {
        if let Some(hidden) = hidden_dup(fd) {
            table().closing.push(Watched {
                fd: hidden,
                sock: s,
                closed: true,
            });
            reaper::wake(reap_closing);
            return;
        }
        // No descriptor left to read completions with: wait for them here instead.
        settle(fd, &s, Duration::from_secs(5));
    }
    let mut t = table();
    retire(&mut t, fd, s);
}

/// A duplicate of `fd` the program never sees (close-on-exec, made by a system call this
/// library does not interpose).
fn hidden_dup(fd: i32) -> Option<i32> {
    real::with_fd(fd, |b| rustix::io::fcntl_dupfd_cloexec(b, 0).ok())
        .flatten()
        .map(std::os::fd::IntoRawFd::into_raw_fd)
}

/// Reads the completions waiting behind the hidden duplicates and closes those the kernel
/// is done with. Returns the hidden descriptors still waiting.
pub fn reap_closing() -> Vec<i32> {
    let pending: Vec<Watched> = {
        let mut t = table();
        if t.closing.is_empty() {
            return Vec::new();
        }
        std::mem::take(&mut t.closing)
    };
    let mut keep = Vec::new();
    for w in pending {
        if settle(w.fd, &w.sock, Duration::ZERO) {
            let _ = real::close(w.fd);
            if w.closed {
                retire(&mut table(), w.fd, w.sock);
            }
        } else {
            keep.push(w);
        }
    }
    let waiting = keep.iter().map(|w| w.fd).collect();
    table().closing.extend(keep);
    waiting
}

/// Whether `fd` is still the socket `s` (a descriptor closed where this library could not
/// see it may have been reused).
pub fn same_socket(fd: i32, s: &Sock) -> bool {
    s.ino().is_some() && ino_of(fd) == s.ino()
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
    v.extend(t.closing.iter().map(|w| (w.fd, w.sock.clone())));
    v.retain(|(_, s)| s.zc_ever() && s.in_flight() > 0);
    v
}

/// Before `fork`: read the completions already there (no waiting: the kernel finishes
/// with the rest when the peer acknowledges, which may take for ever), then hold the table
/// so the child gets it unlocked and consistent.
pub fn before_fork() {
    // Only a child of a process that sent zero-copy needs to name its parent (whose
    // completions it must leave alone): no `/proc` read otherwise.
    if crate::globals::zc_ever() {
        lineage::before_fork();
    }
    let demote = demote_after();
    for (fd, s) in in_flight() {
        s.drain(fd, demote);
    }
    let g = table();
    FORK_HOLD.with(|h| *h.borrow_mut() = Some(g));
    // Last: the engine's locks come after the table's (a socket given back under the table
    // lock gives its protections back to the engine).
    COW_HOLD.with(|h| *h.borrow_mut() = Some(zcnet::cow::hold_for_fork()));
}

/// After `fork`, in either process: every socket open now is open in both, so neither
/// sends zero-copy on it again (see [`crate::birth`]). The parent keeps reading the
/// completions of its sends still in flight — promptly, on the reaper thread, since the
/// child sees them as `POLLERR` until they are read; the child never reads them (they end
/// the parent's protections) and hides what they cause, and closes the parent's hidden
/// duplicates. The child's counters start from zero.
pub fn after_fork(child: bool) {
    COW_HOLD.with(|h| h.borrow_mut().take());
    birth::forked();
    // Every child takes (and clears) the start time it inherited, sockets or not: it is
    // its parent's, never its own. `getppid` only where the parent sent zero-copy.
    let parent = (child && crate::globals::zc_ever()).then(lineage::parent_after_fork);
    let Some(mut t) = FORK_HOLD.with(|h| h.borrow_mut().take()) else {
        return;
    };
    for s in t.fds.values() {
        s.set_shared();
    }
    if child {
        // What was counted so far is the parent's: it writes it in its own line. The child
        // reports only what it does itself, and nothing at all if it never sends.
        for s in t.fds.values() {
            s.counters.reset();
        }
        t.finished.clear();
        t.others.reset();
        // Completions still due are the parent's — or, for a socket the parent inherited
        // itself, those of the process it inherited them from.
        let adopt = |s: &Sock| {
            if let (None, Some(p)) = (s.foreign_owner(), parent) {
                s.set_owner(p);
            }
        };
        for s in t.fds.values() {
            adopt(s);
        }
        for w in std::mem::take(&mut t.closing) {
            adopt(&w.sock);
            let _ = real::close(w.fd);
        }
        return;
    }
    let mut watch = Vec::new();
    for (&fd, s) in &t.fds {
        if s.zc_ever() && s.in_flight() > 0 && !t.closing.iter().any(|w| Arc::ptr_eq(&w.sock, s)) {
            if let Some(hidden) = hidden_dup(fd) {
                watch.push(Watched {
                    fd: hidden,
                    sock: s.clone(),
                    closed: false,
                });
            }
        }
    }
    if !watch.is_empty() {
        t.closing.extend(watch);
        drop(t);
        reaper::wake(reap_closing);
    }
}

/// Waits up to `limit` in all for every socket with protected pages in flight (open or
/// closed) to have its completions: before the process's last chance to read them.
pub fn settle_all(limit: Duration) {
    let start = Instant::now();
    for (fd, s) in in_flight() {
        settle(fd, &s, limit.saturating_sub(start.elapsed()));
    }
    reap_closing();
}

/// Every socket's report: open, closing and closed ones, and the sum of the rest.
pub fn reports() -> (Vec<SockReport>, Report) {
    let t = table();
    let mut v = t.finished.clone();
    let mut seen: Vec<&Arc<Sock>> = Vec::new();
    for (fd, s) in t
        .fds
        .iter()
        .chain(t.closing.iter().map(|w| (&w.fd, &w.sock)))
    {
        if !seen.iter().any(|o| Arc::ptr_eq(o, s)) {
            seen.push(s);
            v.push(SockReport {
                fd: *fd,
                peer: s.peer(),
                report: s.counters.report(),
            });
        }
    }
    (v, t.others.report())
}
