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
//! Memory the program gives back while a send still reads it — `free`, a `realloc` that
//! would free it, `munmap`, `madvise(MADV_DONTNEED)`, `mremap` — is let go of first
//! ([`zcnet::cow::let_go`]): no page of it stays write-protected for whatever gets it next
//! (a kernel write there through a call this library does not see would fail with
//! `EFAULT`), and the bytes in flight stay those sent. Counted as `freed_in_flight`.
//!
//! The library makes no system call the program would not have made until a send may go
//! zero-copy: socket kinds are learned from the program's own `socket`, `accept` and
//! `socketpair` calls ([`kind`]). In a process under a seccomp filter — in force at load,
//! or installed through `prctl` or `syscall(SYS_seccomp)` — it goes passive for good:
//! every call is the C library's alone (OpenSSH's pre-authentication child is killed by
//! its filter for a single `getsockopt`). `zcnet run` reports such processes.
//!
//! A process with an `io_uring` ring protects nothing: the ring's reads into a buffer just
//! sent would meet the protection in the kernel and fail with `EFAULT`, unseen. Pages still
//! protected when the ring is found get their private copies at once; later sends copy,
//! counted as `io_uring` (module `rings`).
//!
//! Not covered: static programs and those that make system calls themselves (Go), which
//! never call the C library's symbols; programs the loader runs in secure-execution mode
//! (`AT_SECURE`: setuid to another user, file capabilities), for which it ignores
//! `LD_PRELOAD`; the C library's internal calls (stdio writing to a socket).
//!
//! Every `exec` the program calls settles the old image's sends first and writes its line:
//! `execve`, `execv`, `execvp`, `execvpe` and `fexecve` are interposed, and so — on
//! x86-64 and aarch64 — are the C-variadic `execl`, `execlp` and `execle`, which glibc
//! would otherwise take to the kernel through its internal `execve`, unseen (their list is
//! handed on through a trampoline, [`zcnet_sys::exec_list_trampoline!`]). On other
//! architectures those three stay the C library's: the image they replace settles nothing first (the
//! new image may see `POLLERR` from the old one's completions), and only `zcnet run`'s
//! board keeps its counts.
//!
//! This crate has no `unsafe`: the exported symbols and all raw-pointer handling are
//! `zcnet_sys::preload`'s, instantiated here by [`zcnet_sys::export_preload!`].
#![forbid(unsafe_code)]

mod birth;
mod cache;
pub mod config;
mod copying_peers;
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
mod rings;
mod send;
mod slot;
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
    fn init(&self, filtered: bool) {
        // Read the settings now: a program may replace its environment before it sends.
        globals::config();
        if slot::load() || globals::config().stats.is_some() {
            // A line is due before an `exec`: know whose (a `vfork` child's is not).
            globals::note_own_pid();
        }
        if filtered {
            slot::filtered_at_load();
            return;
        }
        exit::register();
    }

    /// The last moment this library may make system calls of its own here: sockets whose
    /// protected pages the kernel still reads are waited for (a second at most), so that no
    /// page stays protected in a process whose fault handling may be forbidden next.
    fn before_seccomp(&self) {
        slot::filter_installed();
        if globals::zc_ever() {
            table::settle_all(std::time::Duration::from_secs(1));
        }
    }

    /// From the ring on, the kernel may write into the program's memory where this library
    /// cannot see: nothing stays protected (module `rings`).
    fn before_io_uring(&self) {
        rings::setup_call();
    }

    /// A socket this library did not see made is asked of the kernel only for a send that
    /// may go zero-copy (see [`kind`]).
    fn send(&self, call: SendCall<'_>) -> SysResult {
        let cfg = globals::config();
        let may_zc = cfg.mode != config::Mode::Copy
            && call.bufs().iter().map(|b| b.len()).sum::<usize>() >= cfg.min_bytes.max(1);
        let s = if may_zc {
            table::sock(call.fd())
        } else {
            table::known(call.fd())
        };
        match s {
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

    /// Only a page a zero-copy send of this process protected can need a detour: until
    /// there was one, every receive is the C library's, with no call made up around it
    /// (about 300 instructions a call before, 4,625 calls in one `redis-benchmark` run).
    fn detours_receives(&self) -> bool {
        globals::zc_ever()
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
            if let Some(s) = table::known(fd) {
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
            if let Some(s) = table::for_option(fd) {
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

    fn new_socket(&self, fd: i32, domain: i32, ty: i32, proto: i32) {
        table::opened(fd, kind::of_socket(domain, ty, proto));
    }

    fn accepted(&self, listener: i32, fd: i32) {
        let k = match kind::cached(listener) {
            kind::Kind::Tcp => kind::Kind::Tcp,
            kind::Kind::Other => kind::Kind::Other,
            _ => kind::Kind::Unknown,
        };
        table::opened(fd, k);
    }

    fn new_dup(&self, old: i32, new: i32) {
        table::duplicated(old, new);
    }

    /// The old image's zero-copy sockets are settled first (their completions read, two
    /// seconds at most in all): the new image, whose library knows nothing of them, would
    /// see them as `POLLERR` on a healthy socket. Then its counters are final: `zcnet run`
    /// writes its line from the board, or, without one, the library writes it now.
    ///
    /// A `vfork` child (Python's `subprocess`) does neither: its memory, and so every
    /// socket, counter and slot it sees, is its parent's, which goes on sending and writes
    /// its own line at its own end.
    fn before_exec(&self) {
        if globals::borrowed_memory() {
            return;
        }
        if globals::zc_ever() {
            table::settle_all(std::time::Duration::from_secs(2));
        }
        exit::before_exec();
    }

    /// A forked child's engine is its parent's (it protects nothing here): no page is
    /// held in its memory.
    fn holds_pages(&self) -> bool {
        globals::engine_is_own() && zcnet::cow::holds_pages()
    }

    fn holds_any(&self, start: usize, len: usize) -> bool {
        zcnet::cow::any_held(start, len)
    }

    /// Runs inside `free`: no allocation (the engine allocates nothing under its lock; the
    /// counters are atomics).
    fn giving_back(&self, start: usize, len: usize, how: zcnet::cow::GiveBack) {
        let r = zcnet::cow::let_go(start, len, how);
        if r.pages > 0 {
            globals::count_freed(r);
        }
    }

    fn kernel_write_blocked(&self, buf: &[u8]) -> bool {
        globals::zc_ever() && zcnet::cow::is_protected(buf)
    }

    fn detoured(&self) {
        globals::count_detour();
    }

    fn exec_failed(&self) {
        if globals::borrowed_memory() {
            return;
        }
        exit::exec_failed();
    }

    fn before_fork(&self) {
        slot::before_fork();
        table::before_fork();
    }

    /// The child starts counting from zero (its own slot on the board, its sockets'
    /// counters reset): its line, written only if it sends, holds only what it did.
    fn after_fork(&self, pid: i32) {
        slot::after_fork(pid);
        // First: it gives back the engine's locks, which the engine's counters take.
        table::after_fork(pid == 0);
        if pid == 0 {
            globals::after_fork_in_child();
        }
    }
}
