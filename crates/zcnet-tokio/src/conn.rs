//! The state one stream shares with its in-flight sends and its completion driver: the
//! socket, its readiness, and the `MSG_ZEROCOPY` bookkeeping (zcnet's `zc::completion`).

use crate::cancel::Record;
use crate::choice::{Go, SendChoice};
use crate::loan::Loan;
use crate::readiness::{Direction, Readiness, Seen, Watch};
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};
use tokio::sync::Notify;
use zcnet::auto::AutoStats;
use zcnet::policy::CopiedDemotion;
use zcnet::zc::reap_each;
use zcnet::zc::Completions;
use zcnet::{FallbackReason, Stats};
use zcnet_sys::raw::epoll::EventFlags;
use zcnet_sys::raw::socket::{self, RecvFlags, SendFlags};
use zcnet_sys::raw::zerocopy::{self as zc, ErrqueueEntry};

/// Completion bookkeeping of one socket.
#[derive(Debug)]
pub(crate) struct TxState {
    completions: Completions<Loan>,
    demotion: CopiedDemotion,
    choice: SendChoice,
    entries: Vec<ErrqueueEntry>,
    /// `SO_ZEROCOPY` could not be enabled: every send is copied, counted as unsupported.
    unsupported: bool,
    /// Whether the latest notification said COPIED (for a loan whose calls were all
    /// completed before it was lent).
    last_copied: bool,
    /// Whether any zero-copy notification was read on this socket (see
    /// [`FallbackReason::AwaitingFirstCompletion`]).
    notified_any: bool,
}

impl Drop for TxState {
    fn drop(&mut self) {
        // The last reference to the socket is going: loans still referenced are given up.
        for loan in self.completions.abandon() {
            loan.leak();
        }
    }
}

/// Whether a socket that has had no notification read may not send more zero-copy: its
/// calls not yet notified cover twice what the COPIED demotion needs to decide (a policy
/// without a byte limit, or without demotion, never caps).
fn first_try_unanswered_is_full<T>(policy: &zcnet::Policy, calls: &Completions<T>) -> bool {
    match policy.demote_after_copied_bytes {
        Some(limit) if policy.demotes() => calls.bytes_in_flight() >= limit.saturating_mul(2),
        _ => false,
    }
}

/// A socket a [`Conn`] can drive: what its completion driver does when the handle is gone
/// with loans in flight.
pub(crate) trait Socket: AsFd + std::fmt::Debug + Send + Sync + 'static {
    /// When the socket sits in its epoll instance (`readiness.rs`).
    const WATCH: Watch;
    /// Ends the sending side without closing (TCP: the FIN a close would send).
    fn close_write(&self);
    /// The socket's own address and its peer's (an error if not connected).
    fn addrs(&self) -> io::Result<(SocketAddr, SocketAddr)>;
}

/// Whether a socket with `policy` starts demoted for good: the policy demotes, the caller
/// did not ask for zero-copy on local routes, and the socket is connected to this host
/// ([`zcnet::policy::delivery_is_local`]), where the kernel copies every zero-copy byte at
/// delivery — so the 4 MiB (and more: notifications lag the sends) the COPIED demotion
/// would take to learn it are not spent.
pub(crate) fn starts_local<S: Socket>(sock: &S, policy: &zcnet::Policy, allow_local: bool) -> bool {
    policy.demotes()
        && !allow_local
        && sock
            .addrs()
            .is_ok_and(|(local, peer)| zcnet::policy::delivery_is_local(local.ip(), peer.ip()))
}

impl Socket for TcpStream {
    const WATCH: Watch = Watch::Always;
    fn close_write(&self) {
        let _ = self.shutdown(std::net::Shutdown::Write);
    }
    fn addrs(&self) -> io::Result<(SocketAddr, SocketAddr)> {
        Ok((self.local_addr()?, self.peer_addr()?))
    }
}

impl Socket for std::net::UdpSocket {
    /// Watched only while waited on, and its driver waits only while the socket is idle
    /// (`driver.rs`): UDP wakes its sleepers per sent batch.
    const WATCH: Watch = Watch::WhileWaited;
    /// UDP has nothing to end: the queued datagrams leave, the completions come.
    fn close_write(&self) {}
    fn addrs(&self) -> io::Result<(SocketAddr, SocketAddr)> {
        Ok((self.local_addr()?, self.peer_addr()?))
    }
}

/// One socket's shared state (a stream's, or a UDP socket's).
#[derive(Debug)]
pub(crate) struct Conn<S: Socket = TcpStream> {
    sock: S,
    readiness: Readiness,
    tx: Mutex<TxState>,
    pub(crate) stats: Arc<Stats>,
    closed: AtomicBool,
    pub(crate) wake_driver: Notify,
    /// Thread CPU time (ns) spent in this socket's send-side polls while the cost check
    /// measures a window: the clock of [`crate::choice`] (see there why not the thread's).
    cpu_ns: AtomicU64,
    /// Whether polls add to `cpu_ns` now.
    metering: AtomicBool,
    /// Sends so far (`driver.rs` watches a UDP socket's completions only once it is idle).
    activity: AtomicU64,
    /// Without a cost check the choice needs no state but the demotion's: the policy and
    /// this mirror of it, read without the lock (`None` with a cost check).
    lockless: Option<zcnet::Policy>,
    /// Whether the demotion needs a look under the lock: demoted, or retrying (mirrors
    /// `TxState::demotion`; a socket that asks for zero-copy takes no lock for it).
    demoted: AtomicBool,
    /// Delivery is local: copied for good, from the start ([`starts_local`]).
    local: bool,
    /// `SO_ZEROCOPY` is off (fixed at creation).
    unsupported: bool,
    /// The last cancelled send of a stream (`cancel.rs`): a cut-short one refuses writes.
    pub(crate) cancel: Record,
    /// Handles on the socket (a stream, or its two halves): the last one gone closes it.
    handles: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<S: Socket> Conn<S> {
    /// Takes a non-blocking socket; `zerocopy` says whether `SO_ZEROCOPY` is on, `local`
    /// whether the socket starts demoted for good ([`starts_local`]).
    pub(crate) fn new(
        sock: S,
        zerocopy: bool,
        local: bool,
        choice: SendChoice,
        stats: Arc<Stats>,
    ) -> io::Result<Conn<S>> {
        let readiness = Readiness::new(sock.as_fd(), S::WATCH)?;
        let lockless = (!choice.checks_cost()).then(|| choice.policy());
        let demotion = if local {
            CopiedDemotion::local()
        } else {
            CopiedDemotion::default()
        };
        Ok(Conn {
            sock,
            readiness,
            tx: Mutex::new(TxState {
                completions: Completions::new(),
                demotion,
                choice,
                entries: Vec::new(),
                unsupported: !zerocopy,
                last_copied: false,
                notified_any: false,
            }),
            stats,
            closed: AtomicBool::new(false),
            wake_driver: Notify::new(),
            cpu_ns: AtomicU64::new(0),
            metering: AtomicBool::new(false),
            activity: AtomicU64::new(0),
            lockless,
            demoted: AtomicBool::new(local),
            local,
            unsupported: !zerocopy,
            cancel: Record::default(),
            handles: AtomicUsize::new(1),
        })
    }

    /// One more handle on the socket (a stream split into halves).
    pub(crate) fn acquire(&self) {
        self.handles.fetch_add(1, Ordering::Relaxed);
    }

    /// A handle is gone; the last one closes the socket ([`Conn::close`]).
    pub(crate) fn release(&self) {
        if self.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.close();
        }
    }

    pub(crate) fn socket(&self) -> &S {
        &self.sock
    }

    /// The stream handle is gone: the driver finishes the loans and lets the socket close.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake_driver.notify_one();
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Sends so far on a UDP socket (for the driver's idle check).
    pub(crate) fn activity(&self) -> u64 {
        self.activity.load(Ordering::Relaxed)
    }

    /// Buffers the kernel may still read.
    pub(crate) fn loans_in_flight(&self) -> usize {
        lock(&self.tx).completions.loans_in_flight()
    }

    /// Whether `SO_ZEROCOPY` is on.
    pub(crate) fn zerocopy_enabled(&self) -> bool {
        !self.unsupported
    }

    /// Where a send of `data` goes ([`SendChoice`]). Counted by [`Conn::sent`].
    pub(crate) fn decide(&self, data: &[u8]) -> Go {
        if self.unsupported {
            return Go::Copy(FallbackReason::Unsupported);
        }
        if self.local {
            // For good: nothing for the cost check to decide, no lock to take.
            return Go::Copy(FallbackReason::LocalDelivery);
        }
        let (len, addr, page) = (
            data.len(),
            data.as_ptr() as usize,
            zcnet_sys::mem::page_size(),
        );
        let by_policy = |policy: zcnet::Policy| match policy.refuses(len, addr, page, false) {
            None => Go::ZeroCopy,
            Some(reason) => Go::Copy(reason),
        };
        let demoted = self.demoted.load(Ordering::Relaxed);
        if let (Some(policy), false) = (self.lockless, demoted) {
            return by_policy(policy);
        }
        let mut guard = lock(&self.tx);
        let tx = &mut *guard;
        if tx.unsupported {
            return Go::Copy(FallbackReason::Unsupported);
        }
        if let Some(reason) = tx.demotion.refuses() {
            return Go::Copy(reason);
        }
        if let Some(policy) = self.lockless {
            return by_policy(policy);
        }
        if !tx.notified_any && first_try_unanswered_is_full(&tx.choice.policy(), &tx.completions) {
            return Go::Copy(FallbackReason::AwaitingFirstCompletion);
        }
        let go = tx.choice.decide(len, addr, page, false, || {
            self.cpu_ns.load(Ordering::Relaxed)
        });
        self.metering
            .store(tx.choice.measuring(), Ordering::Relaxed);
        go
    }

    /// A send that [`Conn::decide`] routed to `go` is done with `len` bytes queued: counts
    /// its fallback and feeds the demotion's back-off and the cost check.
    pub(crate) fn sent(&self, go: Go, len: usize) {
        if let Go::Copy(reason) = go {
            self.stats.fallback(reason, len as u64);
        }
        if self.local {
            return;
        }
        if self.lockless.is_some() {
            self.count_send(len, go == Go::ZeroCopy);
            return;
        }
        let mut guard = lock(&self.tx);
        let tx = &mut *guard;
        self.count_demotion(tx, len, go == Go::ZeroCopy);
        if matches!(
            go,
            Go::Copy(FallbackReason::DemotedCopied | FallbackReason::AwaitingFirstCompletion)
        ) {
            // Demoted, or waiting for the first try's answer: the cost check measures nothing
            // until zero-copy is asked for again.
            self.metering.store(false, Ordering::Relaxed);
            return;
        }
        let mut delta = AutoStats::default();
        tx.choice
            .after(go, len, || self.cpu_ns.load(Ordering::Relaxed), &mut delta);
        self.metering
            .store(tx.choice.measuring(), Ordering::Relaxed);
        if delta != AutoStats::default() {
            self.stats.add_auto_tx(&delta);
        }
    }

    /// Counts a send of `len` bytes in the COPIED demotion's back-off and retry
    /// ([`CopiedDemotion::count_send`]); no lock while the socket asks for zero-copy.
    pub(crate) fn count_send(&self, len: usize, zerocopy: bool) {
        if self.local || !self.demoted.load(Ordering::Relaxed) {
            return;
        }
        self.count_demotion(&mut lock(&self.tx), len, zerocopy);
    }

    fn count_demotion(&self, tx: &mut TxState, len: usize, zerocopy: bool) {
        if !self.demoted.load(Ordering::Relaxed) {
            return;
        }
        let policy = tx.choice.policy();
        let idle = tx.completions.is_idle();
        tx.demotion
            .count_send(len as u64, zerocopy, idle, &policy, &self.stats);
        self.mirror(tx);
    }

    /// Updates the lock-free mirror of the demotion.
    fn mirror(&self, tx: &TxState) {
        let look = tx.demotion.is_demoted() || tx.demotion.counts_sends();
        self.demoted.store(look, Ordering::Relaxed);
    }

    /// Runs `f`, adding the thread CPU time it took to the cost check's clock while a window
    /// is measured. One poll runs on one thread, so the difference is meaningful.
    #[inline]
    fn metered<R>(&self, f: impl FnOnce() -> R) -> R {
        if !self.metering.load(Ordering::Relaxed) {
            return f();
        }
        let t0 = zcnet_sys::raw::cpu::thread_cpu_ns();
        let r = f();
        let dt = zcnet_sys::raw::cpu::thread_cpu_ns().saturating_sub(t0);
        self.cpu_ns.fetch_add(dt, Ordering::Relaxed);
        r
    }

    /// Reads the error queue without blocking and releases every loan whose calls are all
    /// complete. Returns the number of error-queue messages read.
    ///
    /// Loans are released under the lock, so once [`Conn::loans_in_flight`] says 0 every
    /// buffer has been handed back or dropped (releasing wakes a task or frees memory,
    /// neither of which comes back to this stream).
    pub(crate) fn drain(&self) -> io::Result<usize> {
        self.drain_locked(&mut lock(&self.tx))
    }

    /// [`Conn::drain`] under a hold of the completions' lock the caller already has.
    fn drain_locked(&self, tx: &mut TxState) -> io::Result<usize> {
        let policy = tx.choice.policy();
        let mut released = 0usize;
        let n = reap_each(
            self.sock.as_fd(),
            &mut tx.entries,
            &mut tx.completions,
            &mut tx.demotion,
            policy,
            &self.stats,
            |loan, copied| {
                released += 1;
                loan.release(copied)
            },
        )?;
        if released > 0 && tx.completions.loans_in_flight() == 0 {
            // Whoever waits for the last loan (`flush_loans`, the driver) may have looked
            // before this drain and be asleep on the error queue — whose event this drain's
            // caller took, so no event is coming to wake it. Wake it here; a waiter that
            // looks after this sees no loan ([`Conn::poll_completions`]).
            self.readiness.wake_waiters();
        }
        if let Some(copied) = tx.entries.iter().rev().find_map(|e| match e {
            ErrqueueEntry::Zerocopy { copied, .. } => Some(*copied),
            ErrqueueEntry::Other(_) => None,
        }) {
            tx.last_copied = copied;
            tx.notified_any = true;
        }
        if !self.local {
            self.mirror(tx);
        }
        Ok(n)
    }

    /// Keeps `loan` until calls `first..=last` are complete (released at once if they are).
    pub(crate) fn lend(&self, loan: Loan, first: u64, last: u64) {
        self.lend_locked(&mut lock(&self.tx), loan, first, last);
    }

    /// [`Conn::lend`], then — under the same hold of the lock — [`Conn::drain`] if `at` or
    /// more loans are in flight: a message sender's batched completion read, one lock per
    /// message instead of two.
    pub(crate) fn lend_and_drain_at(
        &self,
        loan: Loan,
        first: u64,
        last: u64,
        at: usize,
    ) -> io::Result<()> {
        self.lend_and_drain_locked(&mut lock(&self.tx), loan, first, last, at)
    }

    /// [`Conn::lend_and_drain_at`] under a hold of the completions' lock the caller already
    /// has ([`Conn::calls`]).
    pub(crate) fn lend_and_drain_locked(
        &self,
        tx: &mut TxState,
        loan: Loan,
        first: u64,
        last: u64,
        at: usize,
    ) -> io::Result<()> {
        self.lend_locked(tx, loan, first, last);
        if tx.completions.loans_in_flight() >= at {
            self.drain_locked(tx)?;
        }
        Ok(())
    }

    fn lend_locked(&self, tx: &mut TxState, loan: Loan, first: u64, last: u64) {
        let copied = tx.last_copied;
        let idle = tx.completions.loans_in_flight() == 0;
        match tx.completions.lend(loan, first, last) {
            Some(loan) => loan.release(copied),
            // The driver waits for a notification only while no loan is in flight; with
            // loans already out it is watching the error queue and will see this one too.
            // One wake-up per idle-to-busy edge, not per send.
            None if idle => self.wake_driver.notify_one(),
            None => {}
        }
    }

    /// One `send(MSG_ZEROCOPY)` call; the call is numbered under the same lock the
    /// completions are applied under, so its notification cannot be read before it is known.
    /// Returns the bytes queued and the call's id.
    pub(crate) fn send_zerocopy(&self, data: &[u8]) -> io::Result<(usize, u64)> {
        let mut tx = lock(&self.tx);
        let n = zc::send_zerocopy(self.sock.as_fd(), data, SendFlags::DONTWAIT)?;
        let id = tx.completions.record_call(n);
        self.stats.add_tx_zerocopy_bytes(n as u64);
        self.stats.add_tx_zerocopy_calls(1);
        Ok((n, id))
    }

    /// One `sendmsg` of `iov` on a connected UDP socket, `UDP_SEGMENT` = `gso` when given,
    /// with `MSG_ZEROCOPY` when `zerocopy` (the call numbered under the completions' lock,
    /// as for [`Conn::send_zerocopy`]). Returns the bytes queued and the zero-copy call's id.
    pub(crate) fn send_gso(
        &self,
        iov: &[std::io::IoSlice<'_>],
        zerocopy: bool,
        gso: Option<u16>,
    ) -> io::Result<(usize, Option<u64>)> {
        // A hint for the driver, not a count: no read-modify-write needed.
        self.activity
            .store(self.activity.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        if !zerocopy {
            let n = zcnet_sys::raw::udp_msg::send_vectored_gso(self.sock.as_fd(), iov, false, gso)?;
            self.stats.add_tx_copy_bytes(n as u64);
            self.stats.add_tx_copy_calls(1);
            return Ok((n, None));
        }
        self.send_gso_zerocopy(&mut lock(&self.tx), iov, gso)
    }

    /// The completions' lock, for a caller that makes several zero-copy calls in a row
    /// ([`Conn::send_gso_zerocopy`]: one message's batches under one hold).
    pub(crate) fn calls(&self) -> MutexGuard<'_, TxState> {
        lock(&self.tx)
    }

    /// [`Conn::send_gso`] with `MSG_ZEROCOPY`, the call numbered under `tx` (from
    /// [`Conn::calls`]).
    pub(crate) fn send_gso_zerocopy(
        &self,
        tx: &mut TxState,
        iov: &[std::io::IoSlice<'_>],
        gso: Option<u16>,
    ) -> io::Result<(usize, Option<u64>)> {
        self.activity
            .store(self.activity.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        let n = zcnet_sys::raw::udp_msg::send_vectored_gso(self.sock.as_fd(), iov, true, gso)?;
        let id = tx.completions.record_call(n);
        self.stats.add_tx_zerocopy_bytes(n as u64);
        self.stats.add_tx_zerocopy_calls(1);
        Ok((n, Some(id)))
    }

    /// One plain (copying) `send`.
    pub(crate) fn send_copy(&self, data: &[u8]) -> io::Result<usize> {
        let n = socket::send(self.sock.as_fd(), data, SendFlags::DONTWAIT)?;
        self.stats.add_tx_copy_bytes(n as u64);
        self.stats.add_tx_copy_calls(1);
        Ok(n)
    }

    /// One plain `recv`.
    pub(crate) fn recv_copy(&self, buf: &mut [u8]) -> io::Result<usize> {
        let n = socket::recv(self.sock.as_fd(), buf, RecvFlags::DONTWAIT)?;
        self.stats.add_rx_copied_bytes(n as u64);
        Ok(n)
    }

    /// Runs `op` once `dir` is ready, until it does not say `WouldBlock`. Completions that
    /// raised `EPOLLERR` on the way are drained here and never reach `op`'s caller; an
    /// `EPOLLERR` with an empty error queue is the socket's own error, which `op` reports.
    #[inline]
    pub(crate) fn poll_io<R>(
        &self,
        cx: &mut Context<'_>,
        dir: Direction,
        op: impl FnMut() -> io::Result<R>,
    ) -> Poll<io::Result<R>> {
        if dir == Direction::Read {
            return self.poll_io_unmetered(cx, dir, op);
        }
        self.metered(|| self.poll_io_unmetered(cx, dir, op))
    }

    #[inline]
    fn poll_io_unmetered<R>(
        &self,
        cx: &mut Context<'_>,
        dir: Direction,
        op: impl FnMut() -> io::Result<R>,
    ) -> Poll<io::Result<R>> {
        self.poll_io_then(cx, dir, op, |_| false)
    }

    /// One copying send of `data` once the socket is writable ([`Conn::send_copy`]).
    ///
    /// A stream send that took only part of `data` found the send buffer full: Linux's TCP
    /// returns short to a non-blocking sender only then, and marks the socket to signal
    /// writable once a third of the buffer is free (`SOCK_NOSPACE`, `sk_stream_write_space`).
    /// So the write readiness is cleared, and the next send waits for that edge instead of
    /// trying at once for a sliver or `EAGAIN` — tokio's own rule for its `TcpStream`
    /// (`PollEvented::poll_write`). Without it, across a veth pair at 1 MiB writes a
    /// `ZcStream` made 2.8 `sendto` per write (120 of them `EAGAIN`) against plain tokio's 1.5.
    pub(crate) fn poll_send_copy(
        &self,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.metered(|| {
            self.poll_io_then(
                cx,
                Direction::Write,
                || self.send_copy(data),
                |&n| n > 0 && n < data.len(),
            )
        })
    }

    /// [`Conn::poll_io`], clearing the write readiness after a result `buffer_full` says
    /// left the send buffer full.
    ///
    /// Each operation that completes spends one unit of tokio's cooperative budget, as
    /// tokio's own sockets do: a task sending on a socket that never fills (UDP, or a TCP
    /// peer that keeps up) would otherwise never return `Pending` and starve every other
    /// task on its worker. With the budget spent, the poll yields once and goes on.
    fn poll_io_then<R>(
        &self,
        cx: &mut Context<'_>,
        dir: Direction,
        mut op: impl FnMut() -> io::Result<R>,
        buffer_full: impl Fn(&R) -> bool,
    ) -> Poll<io::Result<R>> {
        let coop = ready!(tokio::task::coop::poll_proceed(cx));
        loop {
            let seen = ready!(self.readiness.poll_ready(cx, dir, self.sock.as_fd()))?;
            let mut attempt = seen.flags.intersects(dir.mask());
            if seen.flags.contains(EventFlags::ERR) {
                self.readiness.clear(EventFlags::ERR, seen);
                if self.drain()? == 0 {
                    attempt = true;
                }
            }
            if !attempt {
                continue;
            }
            match op() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let edge = match dir {
                        Direction::Read => EventFlags::IN,
                        Direction::Write => EventFlags::OUT,
                        Direction::Errqueue => EventFlags::ERR,
                    };
                    self.readiness.clear(edge, seen);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(v) => {
                    if buffer_full(&v) {
                        self.readiness.clear(EventFlags::OUT, seen);
                    }
                    coop.made_progress();
                    return Poll::Ready(Ok(v));
                }
                r => {
                    coop.made_progress();
                    return Poll::Ready(r);
                }
            }
        }
    }

    /// One attempt at `op` if `dir` was last seen ready (`WouldBlock` if not, as tokio's
    /// `try_read`/`try_write`); a `WouldBlock` from `op` clears that readiness, so the next
    /// [`Conn::poll_ready_interest`] waits for a new edge.
    pub(crate) fn try_io<R>(
        &self,
        dir: Direction,
        op: impl FnOnce() -> io::Result<R>,
    ) -> io::Result<R> {
        let seen = self.readiness.snapshot();
        if seen.flags.contains(EventFlags::ERR) {
            self.readiness.clear(EventFlags::ERR, seen);
            if self.drain()? == 0 {
                // The socket's own error: `op` reports it.
                return op();
            }
        }
        if !seen.flags.intersects(dir.mask()) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let r = op();
        if matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
            let edge = match dir {
                Direction::Read => EventFlags::IN,
                Direction::Write => EventFlags::OUT,
                Direction::Errqueue => EventFlags::ERR,
            };
            self.readiness.clear(edge, seen);
        }
        r
    }

    /// Ready once the socket is readable or writable as `interest` asks (tokio's
    /// `TcpStream::ready`); completions that raise `EPOLLERR` on the way are drained, never
    /// reported. The socket's own error is reported as `ERROR` with the directions asked
    /// for, so the next operation returns it.
    pub(crate) fn poll_ready_interest(
        &self,
        cx: &mut Context<'_>,
        interest: tokio::io::Interest,
    ) -> Poll<io::Result<tokio::io::Ready>> {
        use tokio::io::Ready;
        let dirs = [
            (interest.is_readable(), Direction::Read),
            (interest.is_writable(), Direction::Write),
        ];
        loop {
            let mut seen = None;
            for (_, dir) in dirs.iter().filter(|(on, _)| *on) {
                if let Poll::Ready(r) = self.readiness.poll_ready(cx, *dir, self.sock.as_fd()) {
                    seen = Some(r?);
                    break;
                }
            }
            let Some(seen) = seen else {
                return Poll::Pending;
            };
            let f = seen.flags;
            if f.contains(EventFlags::ERR) {
                self.readiness.clear(EventFlags::ERR, seen);
                if self.drain()? == 0 {
                    let mut r = Ready::ERROR;
                    if interest.is_readable() {
                        r |= Ready::READABLE;
                    }
                    if interest.is_writable() {
                        r |= Ready::WRITABLE;
                    }
                    return Poll::Ready(Ok(r));
                }
            }
            let mut r = Ready::EMPTY;
            if interest.is_readable() {
                if f.intersects(Direction::Read.mask()) {
                    r |= Ready::READABLE;
                }
                if f.intersects(EventFlags::RDHUP | EventFlags::HUP) {
                    r |= Ready::READ_CLOSED;
                }
            }
            if interest.is_writable() {
                if f.intersects(Direction::Write.mask()) {
                    r |= Ready::WRITABLE;
                }
                if f.contains(EventFlags::HUP) {
                    r |= Ready::WRITE_CLOSED;
                }
            }
            if !r.is_empty() {
                return Poll::Ready(Ok(r));
            }
        }
    }

    /// Ready after one error-queue signal has been drained (or at once with no loan left):
    /// for a waiter that needs any one loan back, not all of them.
    pub(crate) fn poll_completion_event(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.metered(|| self.poll_completion_event_unmetered(cx))
    }

    fn poll_completion_event_unmetered(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.loans_in_flight() == 0 {
            return Poll::Ready(Ok(()));
        }
        if let Some(seen) = ready!(self.poll_errqueue_or_no_loan(cx))? {
            self.readiness.clear(EventFlags::ERR, seen);
            self.drain_after_err()?;
        }
        Poll::Ready(Ok(()))
    }

    /// [`Conn::drain`] after `EPOLLERR`: nothing read means the socket's own error is
    /// pending, so the readiness keeps watching it for the next edge (see
    /// [`Readiness::hold`]) until a completion comes.
    fn drain_after_err(&self) -> io::Result<usize> {
        let n = self.drain()?;
        self.readiness.hold(n == 0);
        Ok(n)
    }

    /// Ready once no loan is left; drains the error queue whenever it signals.
    pub(crate) fn poll_completions(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.metered(|| self.poll_completions_unmetered(cx))
    }

    fn poll_completions_unmetered(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if self.loans_in_flight() == 0 {
                return Poll::Ready(Ok(()));
            }
            let Some(seen) = ready!(self.poll_errqueue_or_no_loan(cx))? else {
                return Poll::Ready(Ok(()));
            };
            self.readiness.clear(EventFlags::ERR, seen);
            self.drain_after_err()?;
        }
    }

    /// The error queue's readiness for a task waiting on loans (`None`: no loan is left);
    /// `Pending` only if a loan is still out once the task is listed as a waiter. Another
    /// task's drain may release the last loan between the caller's look and its listing —
    /// after taking the very event this task would have woken on — and that drain wakes
    /// only tasks already listed ([`Conn::drain`]), so the look is repeated once listed.
    /// (A waiter that goes to sleep with no loan left sleeps for ever: every byte
    /// acknowledged, every call complete.)
    fn poll_errqueue_or_no_loan(&self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Seen>>> {
        match self
            .readiness
            .poll_ready(cx, Direction::Errqueue, self.sock.as_fd())
        {
            Poll::Pending if self.loans_in_flight() == 0 => Poll::Ready(Ok(None)),
            Poll::Pending => Poll::Pending,
            Poll::Ready(r) => Poll::Ready(r.map(Some)),
        }
    }
}

impl<S: Socket> Drop for Conn<S> {
    fn drop(&mut self) {
        // A last look: what is complete is released; the rest is leaked by TxState.
        let _ = self.drain();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_first_try_unanswered_is_full_at_twice_the_demotion_bytes() {
        let policy = zcnet::Policy::default().with_demotion_bytes(Some(4 << 20));
        let mut calls: Completions<()> = Completions::new();
        for _ in 0..7 {
            calls.record_call(1 << 20);
        }
        assert!(
            !first_try_unanswered_is_full(&policy, &calls),
            "7 MiB < 8 MiB"
        );
        calls.record_call(1 << 20);
        assert!(
            first_try_unanswered_is_full(&policy, &calls),
            "8 MiB unanswered"
        );
        // Notified calls no longer count.
        let done = calls.complete(0, 3).unwrap();
        drop(done);
        assert!(!first_try_unanswered_is_full(&policy, &calls));
        // A policy that never demotes never caps.
        calls.record_call(64 << 20);
        assert!(!first_try_unanswered_is_full(
            &zcnet::Policy::always(),
            &calls
        ));
    }
}
