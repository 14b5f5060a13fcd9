//! `libzcnet_preload.so`: zcnet's transmit paths for programs that were never written for
//! them. `zcnet run -- CMD` starts CMD with this library in `LD_PRELOAD`.
//!
//! Sockets stay kernel sockets, so `epoll`, `dup`, `fork`, `exec` and `sendfile` keep their
//! meaning. On UDP sockets, runs of equal datagrams in a `sendmmsg` go out as one GSO send
//! each ([`plan::gso_runs`]). On TCP sockets only, each `send`, `sendto`, `sendmsg`, `write` and `writev` is
//! either made as the program made it (copied, counted) or — when `ZCNET_TX` and this
//! host's measured costs say so — cut so that the page-aligned middle of a large buffer
//! goes out with `MSG_ZEROCOPY` *under write protection* (zcnet's `cow` engine): the
//! program may overwrite its buffer the moment the call returns, as with a copy, and a
//! write to a page still in flight gets a private copy (Chu, "Zero-Copy TCP in Solaris",
//! §3.2.4). Unprotected zero-copy of a program's buffer is never done: it would break the
//! copy semantics every unmodified program relies on.
//!
//! The library hides its bookkeeping: completions are read by it, never by the program
//! (`poll`, `select`, `epoll_wait` and `SO_ERROR` show only real errors); results,
//! `EAGAIN`, `EINTR`, short sends and `SIGPIPE` are those the single call would have had;
//! `close` of a socket still in flight lets the program go on at once. A socket open in two
//! processes (across a `fork`) shares one error queue, so neither sends zero-copy on it
//! again; the parent's completions still due are read promptly by its reaper thread, and
//! the child, which must not read them, hides the `POLLERR` they cause (a TCP socket has a
//! real error only once it is closed: `tcp_done`). Sockets opened after the fork are each
//! process's own.
//!
//! Not covered: static programs and those that make system calls themselves (Go), which
//! never call the C library's symbols; setuid programs, for which the loader ignores
//! `LD_PRELOAD`; the C library's internal calls (stdio writing to a socket).
//!
//! This crate has no `unsafe`: the exported symbols and all raw-pointer handling are
//! `zcnet_sys::preload`'s, instantiated here by [`zcnet_sys::export_preload!`].
#![forbid(unsafe_code)]

mod birth;
mod cache;
pub mod config;
pub mod cost;
mod detour;
mod exit;
mod globals;
mod hide;
pub mod huge;
pub mod kind;
mod lineage;
mod mmsg;
pub mod plan;
mod reaper;
mod route;
mod send;
mod sock;
pub mod stats;
mod table;

use zcnet_sys::preload::{FdSet, Hook, MmsgCall, RecvCall, SendCall, SysResult};

/// The policy behind every interposed call.
#[derive(Debug)]
pub struct Preload;

/// The one instance the exported symbols call.
pub static HOOK: Preload = Preload;

#[cfg(not(test))]
zcnet_sys::export_preload!(HOOK);

impl Preload {
    fn start(&self) {
        exit::register();
    }
}

impl Hook for Preload {
    fn init(&self) {
        // Read the settings now: a program may replace its environment before it sends.
        globals::config();
        exit::register();
    }

    fn send(&self, call: SendCall<'_>) -> SysResult {
        match table::sock(call.fd()) {
            Some(s) => {
                self.start();
                send::send(&s, call)
            }
            None => call.forward(),
        }
    }

    fn send_mmsg(&self, call: MmsgCall<'_>) -> SysResult {
        exit::register();
        mmsg::send(call)
    }

    fn recv(&self, call: RecvCall<'_>) -> SysResult {
        detour::recv(call)
    }

    /// Only completions of this process's zero-copy sends (or, in a forked child, of its
    /// parent's: the child inherits the flag) are hidden; until there were any, `poll` and
    /// `epoll_wait` are the C library's, with no clock read per call.
    fn hides_readiness(&self) -> bool {
        globals::zc_ever()
    }

    fn after_poll(&self, fds: &mut [libc::pollfd], ready: usize) -> usize {
        if !globals::zc_ever() {
            return ready;
        }
        hide::poll(fds, ready)
    }

    fn after_epoll(&self, epfd: i32, events: &mut [libc::epoll_event]) -> usize {
        if !globals::zc_ever() {
            return events.len();
        }
        hide::epoll(epfd, events)
    }

    fn epoll_ctl(&self, epfd: i32, op: i32, fd: i32, ev: Option<(u32, u64)>) {
        // Registrations matter only to hide completions, which `copy` never causes.
        if globals::config().mode != config::Mode::Copy {
            table::epoll_ctl(epfd, op, fd, ev);
        }
    }

    fn after_select(
        &self,
        nfds: i32,
        read: Option<&mut FdSet<'_>>,
        write: Option<&mut FdSet<'_>>,
        _except: Option<&mut FdSet<'_>>,
        ready: usize,
    ) -> usize {
        if !globals::zc_ever() {
            return ready;
        }
        hide::select(nfds, read, write, ready)
    }

    fn before_error_read(&self, fd: i32) {
        if globals::zc_ever() {
            if let Some(s) = table::sock(fd) {
                s.drain(fd, table::demote_after());
            }
        }
    }

    fn after_setsockopt(&self, fd: i32, level: i32, name: i32, _value: Option<i32>) {
        let errqueue = matches!(
            (level, name),
            (libc::SOL_SOCKET, zcnet_sys::raw::zerocopy::SO_ZEROCOPY)
                | (libc::SOL_SOCKET, libc::SO_TIMESTAMPING)
                | (libc::SOL_IP, libc::IP_RECVERR)
                | (libc::SOL_IPV6, libc::IPV6_RECVERR)
        );
        if errqueue {
            if let Some(s) = table::sock(fd) {
                s.zc().app_errqueue = true;
            }
        }
    }

    fn before_close(&self, fd: i32) {
        table::close(fd);
    }

    fn new_fd(&self, fd: i32) {
        table::forget(fd);
    }

    fn new_dup(&self, old: i32, new: i32) {
        table::duplicated(old, new);
    }

    fn before_fork(&self) {
        table::before_fork();
    }

    fn after_fork(&self, child: bool) {
        table::after_fork(child);
    }
}
