//! The io_uring transmit path: `IORING_OP_SEND_ZC` from the sender's pool, registered once as
//! fixed buffers.
//!
//! Why: the Solaris, CMU and NEC designs all kept transmit buffers pinned and mapped so a send
//! pays neither page lookup nor pinning; io_uring's registered buffers are that cache, and
//! `SEND_ZC` is `MSG_ZEROCOPY` with a per-request completion instead of an error-queue range
//! (docs/measurements/kernel-findings.md §3). One ring per [`crate::Sender`], set up once with the pool registered
//! (`io_uring_register_buffers(3)`); every send names its buffer's index
//! (`IORING_RECVSEND_FIXED_BUF`).
//!
//! Per send:
//!
//! * The [`Policy`] decides as for `MSG_ZEROCOPY` (size, alignment, COPIED demotion); a
//!   declined send is copied with `send(2)` and counted by reason.
//! * The buffer moves into the ring, one `SEND_ZC` is submitted, and `send_buf` waits for its
//!   *result* CQE. A result short of the request (`res < len`: the socket buffer filled) is
//!   continued by a further request on the same buffer, counted in `tx_short_sends`. Waiting
//!   for the result keeps the byte stream in order — a second in-flight send on a stream
//!   socket could overtake the rest of a short one — and means every byte is in the socket
//!   when `send` returns, as `Sender::finish` (shutdown, then flush) requires.
//! * The buffer goes back to the pool only on the *notification* CQE of every request that
//!   named it (`IORING_CQE_F_NOTIF`); until then [`crate::Sender::buffer`] reaps and waits.
//!   Many notifications can be outstanding: that is where the asynchrony is. Usage reports
//!   (`IORING_SEND_ZC_REPORT_USAGE`) say when the kernel copied anyway
//!   (`tx_bytes_zc_copied`; on loopback and veth, always).
//!
//! Fallbacks: a pool that cannot be registered (`RLIMIT_MEMLOCK` without `CAP_IPC_LOCK`, more
//! than 16384 buffers) sends with plain `SEND_ZC` (`tx_uring_register_failures`); a kernel
//! without io_uring or `SEND_ZC` copies every send, counted as
//! [`FallbackReason::Unsupported`]; a ring the kernel would not set up for want of locked
//! memory (`ENOMEM` from `io_uring_setup`: its rings are charged to `RLIMIT_MEMLOCK` without
//! `CAP_IPC_LOCK`, a budget shared by every process of the user) copies every send too,
//! counted as [`FallbackReason::Memlock`].

use super::plain;
use crate::buf::{Pool, TxBuf};
use crate::error::{Error, Result};
use crate::path::FallbackReason;
use crate::policy::{CopiedDemotion, Policy};
use crate::stats::Stats;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};
use zcnet_sys::mem::page_size;
use zcnet_sys::uring::{PushError, SendBuf, SendEvent, SendToken, SendZcRing};

/// Submission queue entries: a send has at most one request submitted at a time, plus
/// cancellations.
const SQ_ENTRIES: u32 = 16;
/// Slots for buffers from outside the pool (sent unregistered), beyond the pool's own.
const EXTRA_SLOTS: usize = 16;
/// How long `abandon` waits for cancelled requests before it retires what is left.
const ABANDON_BOUND: Duration = Duration::from_millis(200);
/// Retries of a send refused for want of pinnable memory before the rest is copied.
const PIN_RETRIES: u32 = 3;
/// Bound on cancelling a send whose result did not come in time.
const CANCEL_BOUND: Duration = Duration::from_millis(500);

impl SendBuf for TxBuf {
    /// Unmaps the storage instead of returning it to the pool: the kernel may still transmit
    /// from these pages, so no later send may overwrite them.
    fn abandon(self) {
        self.retire();
    }
}

/// State of the io_uring path on one socket.
pub(crate) struct UringTx {
    /// `None`: io_uring or `SEND_ZC` unavailable; every send is copied and counted.
    ring: Option<SendZcRing<TxBuf>>,
    /// Why every send is copied when there is no ring: `Memlock` when `io_uring_setup` said
    /// `ENOMEM`, else `Unsupported`.
    no_ring: FallbackReason,
    pool: Pool,
    fixed: bool,
    policy: Policy,
    demotion: CopiedDemotion,
    timeout: Duration,
    events: Vec<SendEvent<TxBuf>>,
    /// This call's `msg_flags`: `MSG_DONTWAIT` when the socket is non-blocking, so a full
    /// socket ends the request with `EAGAIN` and the call gives `WouldBlock`
    /// ([`crate::call`]); 0 lets io_uring wait for room itself (a bounded call bounds the
    /// wait for the result and cancels the request at its deadline).
    flags: i32,
    /// Results not yet claimed by the send waiting for them: (buffer, request, res).
    results: Vec<(SendToken, u16, i32)>,
}

impl std::fmt::Debug for UringTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringTx")
            .field("ring", &self.ring.is_some())
            .field("fixed", &self.fixed)
            .field("in_flight", &self.ring.as_ref().map_or(0, |r| r.held()))
            .finish()
    }
}

impl UringTx {
    /// Sets up the ring for a sender with `pool` and registers the pool as fixed buffers;
    /// failures are counted in `stats` and degrade as the module doc says.
    pub(crate) fn new(pool: &Pool, policy: Policy, timeout: Duration, stats: &Stats) -> Self {
        let (ring, no_ring) = match SendZcRing::new(SQ_ENTRIES, pool.count() + EXTRA_SLOTS) {
            Ok(r) => (Some(r), FallbackReason::Unsupported),
            Err(e) if e.raw_os_error() == Some(libc::ENOMEM) => (None, FallbackReason::Memlock),
            Err(_) => (None, FallbackReason::Unsupported),
        };
        let mut fixed = false;
        let ring = ring.map(|mut r| {
            match r.register_buffers(pool.regions()) {
                Ok(()) => fixed = true,
                Err(_) => stats.add_tx_uring_register_failures(1),
            }
            r
        });
        UringTx {
            ring,
            no_ring,
            pool: pool.clone(),
            fixed,
            policy,
            demotion: CopiedDemotion::default(),
            timeout,
            events: Vec::new(),
            flags: 0,
            results: Vec::new(),
        }
    }

    /// Moves completion events into the stats and the pool; returns buffers released.
    fn absorb(&mut self, stats: &Stats) -> usize {
        let Some(ring) = self.ring.as_mut() else {
            return 0;
        };
        ring.complete(&mut self.events);
        let mut released = 0;
        for e in self.events.drain(..) {
            match e {
                SendEvent::Sent {
                    token, req, res, ..
                } => self.results.push((token, req, res)),
                // A request that sent nothing (its result an error: `ENOMEM` past
                // RLIMIT_MEMLOCK, `EAGAIN`) still gets its notification from the kernel, but
                // completes no zero-copy call (`tx_calls_zerocopy` counts only those
                // that sent): counting it would make notifications outnumber calls.
                SendEvent::Notified { bytes: 0, .. } => {}
                SendEvent::Notified { bytes, copied, .. } => {
                    stats.add_tx_notifications(1);
                    stats.add_tx_completed_calls(1);
                    if copied {
                        stats.add_tx_zc_copied_bytes(u64::from(bytes));
                    }
                    if self
                        .demotion
                        .observe_bytes(copied, u64::from(bytes), &self.policy)
                    {
                        stats.add_tx_demotions(1);
                    }
                }
                SendEvent::Released { buf, .. } => {
                    drop(buf); // back to the pool: every request on it is done
                    released += 1;
                }
            }
        }
        released
    }

    /// Waits (bounded by the send timeout) for the result of request `req` on `token`.
    fn await_result(&mut self, token: SendToken, req: u16, stats: &Stats) -> Result<i32> {
        let d = crate::call::deadline(self.timeout);
        loop {
            self.absorb(stats);
            if let Some(i) = self
                .results
                .iter()
                .position(|&(t, r, _)| t == token && r == req)
            {
                return Ok(self.results.swap_remove(i).2);
            }
            if d.expired() {
                return Err(self.cancel_send(token, req, stats, &d));
            }
            let ring = self.ring.as_mut().expect("ring present on this path");
            ring.wait(d.slice(Duration::from_millis(100)))
                .map_err(|e| Error::io("io_uring_enter", e))?;
        }
    }

    /// The send did not complete in time: cancel it and wait briefly for its result so the
    /// ring's books stay right. The stream is then cut short, as with a timed-out `send`.
    fn cancel_send(
        &mut self,
        token: SendToken,
        req: u16,
        stats: &Stats,
        d: &crate::call::Deadline,
    ) -> Error {
        if let Some(ring) = self.ring.as_mut() {
            let _ = ring.cancel(token, CANCEL_BOUND);
        }
        let deadline = Instant::now() + CANCEL_BOUND;
        while Instant::now() < deadline {
            self.absorb(stats);
            if let Some(i) = self
                .results
                .iter()
                .position(|&(t, r, _)| t == token && r == req)
            {
                let res = self.results.swap_remove(i).2;
                if res > 0 {
                    stats.add_tx_zerocopy_bytes(res as u64);
                    stats.add_tx_zerocopy_calls(1);
                }
                break;
            }
            if let Some(ring) = self.ring.as_mut() {
                let _ = ring.wait(Duration::from_millis(20));
            }
        }
        d.timed_out("io_uring SEND_ZC", 0)
    }

    /// Waits up to `timeout` for a buffer to come back (or nothing is in flight).
    fn await_release(&mut self, timeout: Duration, stats: &Stats) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.absorb(stats) > 0 {
                return Ok(());
            }
            let now = Instant::now();
            let ring = self.ring.as_mut().expect("ring present on this path");
            if now >= deadline || ring.requests_in_flight() <= 1 {
                return Ok(());
            }
            ring.wait(deadline - now)
                .map_err(|e| Error::io("io_uring_enter", e))?;
        }
    }

    /// Puts `buf` into the ring, waiting for a free slot if every one holds a buffer.
    fn push(
        &mut self,
        fd: BorrowedFd<'_>,
        mut buf: TxBuf,
        fixed: Option<u16>,
        stats: &Stats,
    ) -> Result<SendToken> {
        let d = crate::call::deadline(self.timeout);
        let range = 0..buf.len();
        loop {
            let ring = self.ring.as_mut().expect("ring present on this path");
            match ring.push(fd, buf, range.clone(), fixed, self.flags) {
                Ok(t) => return Ok(t),
                Err(PushError::Io(_, e)) => return Err(Error::io("io_uring SEND_ZC (queue)", e)),
                Err(PushError::Full(b)) => {
                    buf = b;
                    if d.expired() {
                        return Err(Error::PoolExhausted(d.elapsed()));
                    }
                    ring.wait(d.slice(Duration::from_millis(10)))
                        .map_err(|e| Error::io("io_uring_enter", e))?;
                    self.absorb(stats);
                }
            }
        }
    }

    /// Sends every byte of the buffer behind `token` (whose request 0 is queued), continuing
    /// short results.
    fn drive(
        &mut self,
        fd: BorrowedFd<'_>,
        token: SendToken,
        len: usize,
        fixed: Option<u16>,
        stats: &Stats,
    ) -> Result<()> {
        let mut off = 0usize;
        let mut req = 0u16;
        let mut pin_retries = 0u32;
        loop {
            // Submitted by the wait for its result: one io_uring_enter per request, which
            // returns at once when the send completes inline (the socket had room).
            let res = self.await_result(token, req, stats)?;
            if res == -libc::ENOMEM || res == -libc::ENOBUFS {
                // The pages could not be pinned within RLIMIT_MEMLOCK (io_uring charges it
                // without CAP_IPC_LOCK): nothing was queued. In-flight sends give pages back
                // as their notifications arrive; wait for some, retry, then copy the rest.
                stats.add_tx_enobufs(1);
                if pin_retries < PIN_RETRIES {
                    pin_retries += 1;
                    self.await_release(Duration::from_millis(1 << pin_retries), stats)?;
                    let ring = self.ring.as_mut().expect("ring present on this path");
                    ring.push_more(fd, token, off..len, fixed, self.flags)
                        .map_err(|e| Error::io("io_uring SEND_ZC (queue)", e))?;
                    req += 1;
                    continue;
                }
                let reason = if res == -libc::ENOMEM {
                    FallbackReason::Memlock
                } else {
                    FallbackReason::Enobufs
                };
                stats.fallback(reason, (len - off) as u64);
                let ring = self.ring.as_ref().expect("ring present on this path");
                let bytes = ring.bytes(token).expect("buffer owned until sealed");
                return plain::send_all(fd, &bytes[off..len], stats, self.timeout);
            }
            pin_retries = 0;
            if res == -libc::EAGAIN {
                // MSG_DONTWAIT on a full socket: nothing of this request went out. Wait
                // for room within the call's bound (not at all on a non-blocking socket).
                crate::call::deadline(self.timeout).wait_fd(
                    fd,
                    zcnet_sys::raw::socket::PollFlags::OUT,
                    "io_uring SEND_ZC",
                    off as u64,
                )?;
                let ring = self.ring.as_mut().expect("ring present on this path");
                ring.push_more(fd, token, off..len, fixed, self.flags)
                    .map_err(|e| Error::io("io_uring SEND_ZC (queue)", e))?;
                req += 1;
                continue;
            }
            if res < 0 {
                return Err(Error::io(
                    "io_uring SEND_ZC",
                    std::io::Error::from_raw_os_error(-res),
                ));
            }
            if res == 0 {
                return Err(Error::io(
                    "io_uring SEND_ZC",
                    std::io::Error::new(std::io::ErrorKind::WriteZero, "the socket took no bytes"),
                ));
            }
            let n = res as usize;
            stats.add_tx_zerocopy_bytes(n as u64);
            stats.add_tx_zerocopy_calls(1);
            if fixed.is_some() {
                stats.add_tx_uring_fixed_calls(1);
            }
            off += n;
            if off >= len {
                return Ok(());
            }
            stats.add_tx_short_sends(1);
            let ring = self.ring.as_mut().expect("ring present on this path");
            ring.push_more(fd, token, off..len, fixed, self.flags)
                .map_err(|e| Error::io("io_uring SEND_ZC (queue)", e))?;
            req += 1;
        }
    }
}

impl super::Transmit for UringTx {
    fn send_buf(&mut self, fd: BorrowedFd<'_>, buf: TxBuf, stats: &Stats) -> Result<()> {
        if self.ring.is_none() {
            stats.fallback(self.no_ring, buf.len() as u64);
            return plain::send_all(fd, &buf, stats, self.timeout);
        }
        let refused = self.policy.refuses(
            buf.len(),
            buf.data_addr(),
            page_size(),
            self.demotion.is_demoted(),
        );
        if let Some(reason) = refused {
            stats.fallback(reason, buf.len() as u64);
            return plain::send_all(fd, &buf, stats, self.timeout);
        }
        if buf.is_empty() {
            return Ok(());
        }
        // A foreign buffer (another pool's) is sent unregistered; ours name their index.
        let fixed = (self.fixed && self.pool.owns(&buf))
            .then(|| u16::try_from(buf.index()).ok())
            .flatten();
        let len = buf.len();
        // Only a non-blocking socket sends with MSG_DONTWAIT: a bounded call lets io_uring
        // wait for room itself (one request per buffer, as without a bound) and bounds the
        // wait for the result instead, cancelling the request at the deadline. Read before
        // every send, so a caller may flip O_NONBLOCK at any time: one fcntl, 186–264 ns,
        // about 1 % of a 64 KiB send on loopback and within the noise side by side
        // (docs/measurements/uring.md, "The socket as given").
        self.flags = if crate::call::nonblocking(fd) {
            libc::MSG_DONTWAIT
        } else {
            0
        };
        let token = self.push(fd, buf, fixed, stats)?;
        let result = self.drive(fd, token, len, fixed, stats);
        // Sealed even on error: requests that did go out still reference the pages, and the
        // buffer comes back when their notifications arrive.
        if let Some(ring) = self.ring.as_mut() {
            ring.seal(token);
        }
        self.absorb(stats);
        // Results of this buffer's requests nobody waited for (after an error) are stale now.
        self.results.retain(|&(t, _, _)| t != token);
        result
    }

    fn reap(&mut self, _fd: BorrowedFd<'_>, stats: &Stats) -> Result<usize> {
        let Some(ring) = self.ring.as_mut() else {
            return Ok(0);
        };
        if ring.requests_in_flight() > 0 {
            // Entering the kernel runs the deferred completion work that posts notifications.
            ring.submit().map_err(|e| Error::io("io_uring_enter", e))?;
        }
        Ok(self.absorb(stats))
    }

    fn wait(&mut self, fd: BorrowedFd<'_>, stats: &Stats, timeout: Duration) -> Result<usize> {
        let released = self.reap(fd, stats)?;
        if released > 0 {
            return Ok(released);
        }
        let Some(ring) = self.ring.as_mut() else {
            std::thread::sleep(timeout.min(Duration::from_millis(1)));
            return Ok(0);
        };
        if ring.held() == 0 {
            std::thread::sleep(timeout.min(Duration::from_millis(1)));
            return Ok(0);
        }
        ring.wait(timeout)
            .map_err(|e| Error::io("io_uring_enter", e))?;
        Ok(self.absorb(stats))
    }

    fn buffers_in_flight(&self) -> usize {
        self.ring.as_ref().map_or(0, |r| r.held())
    }

    fn abandon(&mut self) -> usize {
        let Some(ring) = self.ring.as_mut() else {
            return 0;
        };
        let mut events = Vec::new();
        let n = ring.shutdown(ABANDON_BOUND, &mut events);
        // Buffers released during the shutdown are done with: they go back to the pool.
        drop(events);
        n
    }
}
