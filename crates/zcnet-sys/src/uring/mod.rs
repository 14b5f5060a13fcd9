//! io_uring rings for zcnet's `uring` paths, built on the `io-uring` crate (its raw builders,
//! submission and completion queues) with the ownership rules that crate leaves to its caller.
//!
//! * [`SendZcRing`] — `IORING_OP_SEND_ZC` (Linux 6.0; io_uring_enter(2), "IORING_OP_SEND_ZC"),
//!   optionally from registered ("fixed") buffers (`IORING_RECVSEND_FIXED_BUF`,
//!   io_uring_register_buffers(3)). Each request posts a *result* CQE, flagged
//!   `IORING_CQE_F_MORE` exactly when a *notification* CQE (`IORING_CQE_F_NOTIF`, same
//!   `user_data`) follows; only the notification says the kernel no longer references the
//!   pages. The ring therefore owns every buffer a request names until then.
//! * [`BufRingRecv`] — multishot `IORING_OP_RECV` (`IORING_RECV_MULTISHOT`, 6.0) into a ring of
//!   provided buffers (`IORING_REGISTER_PBUF_RING`, 5.19; io_uring_register_buf_ring(3)). The
//!   kernel *writes* into those buffers, so the ring owns their memory, lends a buffer only
//!   after a CQE handed it over, and takes it back before re-providing it.
//!
//! Why owning is enough, and what `Drop` must do:
//!
//! * A send only ever *reads* the buffer. The kernel takes its own page references (pinned at
//!   registration for fixed buffers, per request otherwise), so even freeing the memory early
//!   could not make the kernel write into memory Rust owns; what it would break is the bytes on
//!   the wire. So a buffer is given back only after its notification, and one whose
//!   notification never came within a bound is disposed of by [`SendBuf::abandon`] (a pooled
//!   buffer is unmapped, never recycled), not handed back.
//! * A receive *writes* through the user address in the buffer ring (`copy_to_user`). Memory
//!   may only be freed when no request can still do that: [`BufRingRecv`]'s `Drop` cancels the
//!   multishot request and waits, bounded, for its final CQE; if that does not come it closes
//!   the ring and *leaks* the buffer memory rather than free it.

pub mod zcrx;

use crate::mem::{round_to_pages, PageBuf};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::collections::VecDeque;
use std::io;
use std::mem::ManuallyDrop;
use std::ops::{Deref, Range};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// `IORING_SEND_ZC_REPORT_USAGE` (6.2, in the SQE's `ioprio`): the notification's `res` says
/// whether the kernel had to copy the data after all. Debian's liburing 2.3 lacks it.
pub const IORING_SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
/// `IORING_NOTIF_USAGE_ZC_COPIED`: set in a notification's `res` (with
/// [`IORING_SEND_ZC_REPORT_USAGE`]) when some of the request's data was copied, or none of it
/// went zero-copy (local delivery always copies: docs/measurements/kernel-findings.md §3).
pub const IORING_NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;
/// `IORING_CQE_F_MORE`: more CQEs for this request follow.
pub const IORING_CQE_F_MORE: u32 = 1 << 1;
/// `IORING_CQE_F_NOTIF`: this CQE is a zero-copy notification.
pub const IORING_CQE_F_NOTIF: u32 = 1 << 3;

/// `user_data` of cancellation requests: never a request of ours.
const CANCEL_USER_DATA: u64 = u64::MAX;
/// How long `Drop` waits for cancelled requests to finish before it stops trusting them.
pub const DROP_BOUND: Duration = Duration::from_millis(500);

/// Whether this kernel's io_uring supports every opcode in `ops` (`IORING_REGISTER_PROBE`).
pub fn supports(ring: &IoUring, ops: &[u8]) -> io::Result<bool> {
    let mut probe = io_uring::Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    Ok(ops.iter().all(|&op| probe.is_supported(op)))
}

/// Submits what is queued and waits up to `timeout` (forever with `None`) for `want` CQEs.
/// Returns false when the wait timed out (`ETIME`). `EINTR` (a signal) and `EBUSY` (the kernel
/// still holds overflowed CQEs) return true: the caller drains the queue and decides again.
fn enter<S: squeue::EntryMarker, C: cqueue::EntryMarker>(
    ring: &IoUring<S, C>,
    want: usize,
    timeout: Option<Duration>,
) -> io::Result<bool> {
    let r = match timeout {
        Some(d) => {
            let ts = types::Timespec::from(d);
            let args = types::SubmitArgs::new().timespec(&ts);
            ring.submitter().submit_with_args(want, &args)
        }
        None => ring.submitter().submit_and_wait(want),
    };
    match r {
        Ok(_) => Ok(true),
        Err(e) => match e.raw_os_error() {
            Some(libc::ETIME) => Ok(false),
            Some(libc::EINTR) | Some(libc::EBUSY) => Ok(true),
            _ => Err(e),
        },
    }
}

/// Pushes one SQE, submitting first if the submission queue is full.
///
/// # Safety
///
/// Every buffer or struct `entry` points at must stay valid (and, for buffers the kernel
/// writes, untouched by Rust) until the request's last CQE.
unsafe fn push_entry<C: cqueue::EntryMarker>(
    ring: &mut IoUring<squeue::Entry, C>,
    entry: &squeue::Entry,
) -> io::Result<()> {
    if ring.submission().is_full() {
        ring.submit()?;
    }
    // SAFETY: forwarded to the caller.
    unsafe { ring.submission().push(entry) }
        .map_err(|_| io::Error::new(io::ErrorKind::WouldBlock, "io_uring submission queue full"))
}

// ---------------------------------------------------------------------------------------
// Transmit: SEND_ZC.

/// A buffer a [`SendZcRing`] may own while the kernel reads it: its bytes are
/// `Deref<Target = [u8]>`.
pub trait SendBuf: Deref<Target = [u8]> + Send + 'static {
    /// Disposes of a buffer whose notification never came (the ring was shut down while the
    /// kernel may still transmit its pages): the owner must make sure the storage is never
    /// written again. The default leaks it; pooled buffers unmap their storage instead.
    fn abandon(self)
    where
        Self: Sized,
    {
        std::mem::forget(self);
    }
}

impl SendBuf for Vec<u8> {}
impl SendBuf for Box<[u8]> {}

/// Names one buffer owned by a [`SendZcRing`] (one slot, one generation of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SendToken {
    slot: u32,
    gen: u16,
}

/// What a [`SendZcRing`] reports from its completion queue.
#[derive(Debug)]
pub enum SendEvent<B> {
    /// Request number `req` on `token`'s buffer has sent: `res` bytes (`>= 0`) or `-errno`.
    /// `notif_follows` is `IORING_CQE_F_MORE`: a [`SendEvent::Notified`] will come for it.
    Sent {
        /// The buffer.
        token: SendToken,
        /// The request's number on that buffer (0 for the first, then continuations).
        req: u16,
        /// Bytes queued, or a negative errno.
        res: i32,
        /// A notification follows.
        notif_follows: bool,
    },
    /// The kernel no longer references the pages of request `req` (`IORING_CQE_F_NOTIF`).
    Notified {
        /// The buffer.
        token: SendToken,
        /// The request's number on that buffer.
        req: u16,
        /// Bytes that request had sent (its result).
        bytes: u32,
        /// `IORING_NOTIF_USAGE_ZC_COPIED`: the kernel copied the data after all.
        copied: bool,
    },
    /// Every request on the buffer is done and the caller sealed it: it is the caller's again.
    Released {
        /// The buffer's token (now stale).
        token: SendToken,
        /// The buffer.
        buf: B,
    },
}

/// Why [`SendZcRing::push`] did not take a buffer; the buffer comes back with it.
#[derive(Debug)]
pub enum PushError<B> {
    /// Every slot holds a buffer: reap notifications first.
    Full(B),
    /// The request could not be queued (bad range, buffer outside its fixed region, or the
    /// submission failed).
    Io(B, io::Error),
}

#[derive(Debug)]
struct SendSlot<B> {
    buf: Option<B>,
    gen: u16,
    /// CQEs still expected for this slot's requests (results, then notifications).
    pending: u32,
    /// The owner will push no further request on this buffer.
    sealed: bool,
    /// Result of each request, by request number (for the notification's byte count).
    results: Vec<u32>,
}

/// An io_uring that sends with `IORING_OP_SEND_ZC` from buffers it owns until the kernel's
/// notification says it is done with them.
///
/// The slots live in one allocation made at construction, so a buffer never moves while a
/// request names it, and the number of buffers in flight is bounded by the slot count.
/// Usage reports (`IORING_SEND_ZC_REPORT_USAGE`) are always asked for.
pub struct SendZcRing<B: SendBuf> {
    ring: IoUring,
    slots: Box<[SendSlot<B>]>,
    free: Vec<u32>,
    /// Registered fixed buffers: `(address, length)` by index.
    fixed: Vec<(usize, usize)>,
    released: VecDeque<(SendToken, B)>,
    held: usize,
    requests_in_flight: usize,
    /// The eventfd registered with [`SendZcRing::register_eventfd`], kept open here.
    eventfd: Option<std::os::fd::OwnedFd>,
}

impl<B: SendBuf> std::fmt::Debug for SendZcRing<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendZcRing")
            .field("slots", &self.slots.len())
            .field("held", &self.held)
            .field("requests_in_flight", &self.requests_in_flight)
            .field("fixed_buffers", &self.fixed.len())
            .finish()
    }
}

fn send_user_data(t: SendToken, req: u16) -> u64 {
    (u64::from(t.slot) << 32) | (u64::from(t.gen) << 16) | u64::from(req)
}

impl<B: SendBuf> SendZcRing<B> {
    /// A ring of `entries` submission slots able to own `slots` buffers at once.
    ///
    /// Fails with the kernel's error if io_uring is unavailable (`ENOSYS`, `EPERM` with
    /// `kernel.io_uring_disabled`), or with `EOPNOTSUPP` if it lacks `IORING_OP_SEND_ZC`.
    pub fn new(entries: u32, slots: usize) -> io::Result<Self> {
        Self::build(entries, slots, true)
    }

    /// As [`SendZcRing::new`], for a ring whose completions an event loop waits for
    /// ([`SendZcRing::register_eventfd`]; tokio's reactor in `zcnet-tokio`): without
    /// `IORING_SETUP_COOP_TASKRUN`. A notification's CQE is posted by task work on the thread
    /// that submitted the request, and with cooperative task running io_uring_setup(2)
    /// promises that work only "at any kernel/user transition" — which a thread asleep in
    /// `epoll_wait` does not make. On Linux 6.18 the thread was woken either way (zcnet-tokio's
    /// `ring_notifications_wake_a_sleeping_runtime` passes with both) and the sink bench
    /// measured no difference in cost, so the ring an event loop sleeps on takes the setting
    /// that is documented to wake it.
    pub fn new_polled(entries: u32, slots: usize) -> io::Result<Self> {
        Self::build(entries, slots, false)
    }

    fn build(entries: u32, slots: usize, coop: bool) -> io::Result<Self> {
        let slots = slots.clamp(1, u32::MAX as usize);
        // Every buffer can have a result and a notification queued at once, and a short send
        // adds a pair; with IORING_FEAT_NODROP an overflow is slow, not lost.
        let cq = (4 * slots + 16).next_power_of_two().min(1 << 16) as u32;
        let mut builder = IoUring::builder();
        builder.setup_cqsize(cq.max(2 * entries));
        if coop {
            builder.setup_coop_taskrun().setup_taskrun_flag();
        }
        let ring = builder.build(entries)?;
        if !supports(&ring, &[opcode::SendZc::CODE])? {
            return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        }
        Ok(SendZcRing {
            ring,
            slots: (0..slots)
                .map(|_| SendSlot {
                    buf: None,
                    gen: 0,
                    pending: 0,
                    sealed: false,
                    results: Vec::new(),
                })
                .collect(),
            free: (0..slots as u32).rev().collect(),
            fixed: Vec::new(),
            released: VecDeque::new(),
            held: 0,
            requests_in_flight: 0,
            eventfd: None,
        })
    }

    /// Registers `regions` (`(address, length)`, index = position) as fixed buffers
    /// (`IORING_REGISTER_BUFFERS`): the kernel pins their pages once, and a send that names
    /// an index skips the per-request page lookup and pinning. Fails as the kernel does:
    /// `ENOMEM` past `RLIMIT_MEMLOCK` (without `CAP_IPC_LOCK`), `EINVAL` for more than 16384
    /// buffers or one over 1 GiB, `EFAULT` for unmapped memory.
    pub fn register_buffers(&mut self, regions: &[(usize, usize)]) -> io::Result<()> {
        if regions.len() > usize::from(u16::MAX) + 1 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let iov: Vec<libc::iovec> = regions
            .iter()
            .map(|&(addr, len)| libc::iovec {
                iov_base: addr as *mut libc::c_void,
                iov_len: len,
            })
            .collect();
        // SAFETY: the kernel pins the pages behind these ranges (EFAULT if unmapped) and keeps
        // its own references until the ring is gone; this type only ever issues *sends* from
        // them (SEND_ZC reads), so no Rust memory can be written through the registration,
        // and memory unmapped later cannot be reached through it either (the kernel reads its
        // pinned pages, not the address range).
        unsafe { self.ring.submitter().register_buffers(&iov) }?;
        self.fixed = regions.to_vec();
        Ok(())
    }

    /// Registers a new eventfd (`IORING_REGISTER_EVENTFD`) that the kernel signals as
    /// completions are posted — while [`SendZcRing::set_eventfd_enabled`] says so: it starts
    /// disabled (`IORING_CQ_EVENTFD_DISABLED`, a flag in the shared completion ring, so no
    /// system call turns it on or off). Returns a duplicate for an event loop to poll.
    ///
    /// Why not poll the ring's own descriptor: every posted CQE then wakes its
    /// poll waiters, an epoll callback per result and per notification even while the
    /// sender is busy and nobody waits — measured at about 0.4 µs of system time per 64 KiB
    /// message (four CQEs) into a UDP sink (`zcnet-tokio`'s `bench_udp`). A disabled
    /// eventfd costs one flag test per CQE.
    pub fn register_eventfd(&mut self) -> io::Result<std::os::fd::OwnedFd> {
        use rustix::event::{eventfd, EventfdFlags};
        let efd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        self.ring.completion().disable_eventfd();
        self.ring.submitter().register_eventfd(efd.as_raw_fd())?;
        let dup = efd.try_clone()?;
        self.eventfd = Some(efd);
        Ok(dup)
    }

    /// Turns the registered eventfd's signals on (before waiting) or off (while busy).
    pub fn set_eventfd_enabled(&mut self, on: bool) {
        if on {
            self.ring.completion().enable_eventfd();
        } else {
            self.ring.completion().disable_eventfd();
        }
    }

    /// Reads the registered eventfd's count back to zero (non-blocking), so that it turns
    /// readable again only for completions posted after this.
    pub fn clear_eventfd(&self) {
        if let Some(fd) = &self.eventfd {
            let mut count = [0u8; 8];
            let _ = rustix::io::read(fd, &mut count);
        }
    }

    /// Whether fixed buffers are registered.
    pub fn has_fixed_buffers(&self) -> bool {
        !self.fixed.is_empty()
    }

    /// Buffers the ring owns (waiting for results or notifications, or not yet sealed).
    pub fn held(&self) -> usize {
        self.held
    }

    /// Requests (results or notifications) the kernel has not completed yet.
    pub fn requests_in_flight(&self) -> usize {
        self.requests_in_flight
    }

    /// Requests pushed and not yet submitted (waiting in the submission queue).
    pub fn unsubmitted(&mut self) -> usize {
        self.ring.submission().len()
    }

    fn slot(&self, t: SendToken) -> Option<&SendSlot<B>> {
        self.slots
            .get(t.slot as usize)
            .filter(|s| s.gen == t.gen && s.buf.is_some())
    }

    /// Takes `buf` and queues a `SEND_ZC` of `buf[range]` on `fd` (with `flags`, e.g.
    /// `MSG_WAITALL`); with `fixed`, from registered buffer `fixed` (the range must lie inside
    /// it). The request is submitted by the next [`SendZcRing::submit`] or wait; `fd` must
    /// still be open then (the kernel resolves it at submission). The buffer stays in the ring
    /// until [`SendZcRing::seal`] and every CQE of its requests.
    pub fn push(
        &mut self,
        fd: BorrowedFd<'_>,
        buf: B,
        range: Range<usize>,
        fixed: Option<u16>,
        flags: i32,
    ) -> Result<SendToken, PushError<B>> {
        if range.start > range.end || range.end > buf.len() || range.len() > u32::MAX as usize {
            return Err(PushError::Io(
                buf,
                io::Error::new(io::ErrorKind::InvalidInput, "send range outside the buffer"),
            ));
        }
        let Some(idx) = self.free.pop() else {
            return Err(PushError::Full(buf));
        };
        let slot = &mut self.slots[idx as usize];
        slot.gen = slot.gen.wrapping_add(1);
        slot.buf = Some(buf);
        slot.pending = 0;
        slot.sealed = false;
        slot.results.clear();
        let token = SendToken {
            slot: idx,
            gen: slot.gen,
        };
        self.held += 1;
        match self.push_request(fd, token, range, fixed, flags) {
            Ok(()) => Ok(token),
            Err(e) => {
                let slot = &mut self.slots[idx as usize];
                let buf = slot.buf.take().expect("slot filled above");
                self.held -= 1;
                self.free.push(idx);
                Err(PushError::Io(buf, e))
            }
        }
    }

    /// Queues a further `SEND_ZC` on a buffer the ring already owns, for example the rest of
    /// a short send. `range` indexes the buffer's bytes as in [`SendZcRing::push`].
    pub fn push_more(
        &mut self,
        fd: BorrowedFd<'_>,
        token: SendToken,
        range: Range<usize>,
        fixed: Option<u16>,
        flags: i32,
    ) -> io::Result<()> {
        let Some(slot) = self.slot(token) else {
            return Err(io::Error::new(io::ErrorKind::NotFound, "stale send token"));
        };
        if slot.sealed {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "buffer already sealed",
            ));
        }
        let len = slot.buf.as_ref().map_or(0, |b| b.len());
        if range.start > range.end || range.end > len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "send range outside the buffer",
            ));
        }
        self.push_request(fd, token, range, fixed, flags)
    }

    fn push_request(
        &mut self,
        fd: BorrowedFd<'_>,
        token: SendToken,
        range: Range<usize>,
        fixed: Option<u16>,
        flags: i32,
    ) -> io::Result<()> {
        let slot = &self.slots[token.slot as usize];
        let req = slot.results.len();
        let req = u16::try_from(req).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "too many requests on one buffer",
            )
        })?;
        let bytes = &slot.buf.as_ref().expect("owned buffer")[range];
        let (ptr, len) = (bytes.as_ptr(), bytes.len());
        if let Some(i) = fixed {
            let Some(&(start, rlen)) = self.fixed.get(usize::from(i)) else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "no such fixed buffer",
                ));
            };
            let addr = ptr as usize;
            if addr < start || addr + len > start + rlen {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "bytes outside their fixed buffer",
                ));
            }
        }
        let entry = opcode::SendZc::new(types::Fd(fd.as_raw_fd()), ptr, len as u32)
            .buf_index(fixed)
            .flags(flags | libc::MSG_NOSIGNAL)
            .zc_flags(IORING_SEND_ZC_REPORT_USAGE)
            .build()
            .user_data(send_user_data(token, req));
        // SAFETY: `ptr..ptr+len` lies in a buffer this ring owns in a slot that neither moves
        // nor is emptied until every CQE of this request arrived (or the buffer is abandoned
        // and so never written again); SEND_ZC only reads it.
        unsafe { push_entry(&mut self.ring, &entry) }?;
        let slot = &mut self.slots[token.slot as usize];
        slot.results.push(0);
        slot.pending += 1;
        self.requests_in_flight += 1;
        Ok(())
    }

    /// The bytes of a buffer the ring owns (for copying what a refused send left over).
    /// Reading is safe while the kernel reads too: a send never writes.
    pub fn bytes(&self, token: SendToken) -> Option<&[u8]> {
        self.slot(token).and_then(|s| s.buf.as_deref())
    }

    /// The owner will queue nothing more on this buffer: it is released once its requests are
    /// done (reported as [`SendEvent::Released`]).
    pub fn seal(&mut self, token: SendToken) {
        let Some(slot) = self.slots.get_mut(token.slot as usize) else {
            return;
        };
        if slot.gen != token.gen || slot.buf.is_none() || slot.sealed {
            return;
        }
        slot.sealed = true;
        if slot.pending == 0 {
            self.release(token.slot);
        }
    }

    fn release(&mut self, idx: u32) {
        let slot = &mut self.slots[idx as usize];
        if let Some(buf) = slot.buf.take() {
            let token = SendToken {
                slot: idx,
                gen: slot.gen,
            };
            self.held -= 1;
            self.free.push(idx);
            self.released.push_back((token, buf));
        }
    }

    /// Submits queued requests without waiting. Entering the kernel also runs pending
    /// completion work (the ring is set up with `IORING_SETUP_COOP_TASKRUN`).
    pub fn submit(&mut self) -> io::Result<()> {
        enter(&self.ring, 0, None).map(drop)
    }

    /// Submits what is queued and waits up to `timeout` for at least one CQE (not at all if
    /// one is already there); false if the time ran out.
    pub fn wait(&mut self, timeout: Duration) -> io::Result<bool> {
        if !self.released.is_empty() || !self.ring.completion().is_empty() {
            if !self.ring.submission().is_empty() {
                self.submit()?;
            }
            return Ok(true);
        }
        enter(&self.ring, 1, Some(timeout))
    }

    /// Drains the completion queue into `out`; returns how many events it added.
    pub fn complete(&mut self, out: &mut Vec<SendEvent<B>>) -> usize {
        let before = out.len();
        let cqes: Vec<cqueue::Entry> = self.ring.completion().collect();
        for cqe in cqes {
            let ud = cqe.user_data();
            if ud == CANCEL_USER_DATA {
                continue;
            }
            let token = SendToken {
                slot: (ud >> 32) as u32,
                gen: (ud >> 16) as u16,
            };
            let req = ud as u16;
            let Some(slot) = self.slots.get_mut(token.slot as usize) else {
                continue;
            };
            if slot.gen != token.gen || slot.buf.is_none() || slot.pending == 0 {
                continue;
            }
            let flags = cqe.flags();
            let res = cqe.result();
            slot.pending -= 1;
            self.requests_in_flight -= 1;
            if flags & IORING_CQE_F_NOTIF != 0 {
                let bytes = slot.results.get(usize::from(req)).copied().unwrap_or(0);
                out.push(SendEvent::Notified {
                    token,
                    req,
                    bytes,
                    copied: (res as u32) & IORING_NOTIF_USAGE_ZC_COPIED != 0,
                });
            } else {
                let more = flags & IORING_CQE_F_MORE != 0;
                if more {
                    slot.pending += 1;
                    self.requests_in_flight += 1;
                }
                if let Some(r) = slot.results.get_mut(usize::from(req)) {
                    *r = res.max(0) as u32;
                }
                out.push(SendEvent::Sent {
                    token,
                    req,
                    res,
                    notif_follows: more,
                });
            }
            if slot.sealed && slot.pending == 0 {
                self.release(token.slot);
            }
        }
        while let Some((token, buf)) = self.released.pop_front() {
            out.push(SendEvent::Released { token, buf });
        }
        out.len() - before
    }

    /// Cancels the not-yet-sent requests on `token`'s buffer (`IORING_ASYNC_CANCEL_ALL` by
    /// `user_data`, synchronously, bounded by `bound`). Their results arrive as
    /// `-ECANCELED` (or as what they sent before). Sends that already queued their bytes
    /// cannot be cancelled; their notification comes when the socket frees the data.
    pub fn cancel(&mut self, token: SendToken, bound: Duration) -> io::Result<()> {
        let Some(slot) = self.slot(token) else {
            return Ok(());
        };
        let reqs = slot.results.len() as u16;
        for req in 0..reqs {
            let b = types::CancelBuilder::user_data(send_user_data(token, req)).all();
            match self
                .ring
                .submitter()
                .register_sync_cancel(Some(bound.into()), b)
            {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) if e.raw_os_error() == Some(libc::EALREADY) => {}
                Err(e) if e.raw_os_error() == Some(libc::ETIME) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Cancels every request the kernel still has (`IORING_ASYNC_CANCEL_ANY`), waits up to
    /// `bound` for their CQEs, and reports what arrived in `out`. Every buffer still owned
    /// after that is sealed and, if the kernel may still read it, disposed of with
    /// [`SendBuf::abandon`]. Returns how many were abandoned; the ring is empty afterwards.
    pub fn shutdown(&mut self, bound: Duration, out: &mut Vec<SendEvent<B>>) -> usize {
        let deadline = Instant::now() + bound;
        for i in 0..self.slots.len() {
            let s = &self.slots[i];
            if s.buf.is_some() {
                let t = SendToken {
                    slot: i as u32,
                    gen: s.gen,
                };
                self.seal(t);
            }
        }
        if self.requests_in_flight > 0 {
            let _ = self.submit();
            let any = types::CancelBuilder::any();
            let _ = self
                .ring
                .submitter()
                .register_sync_cancel(Some(bound.into()), any);
        }
        self.complete(out);
        while self.requests_in_flight > 0 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            match self.wait((deadline - now).min(Duration::from_millis(20))) {
                Ok(_) => {}
                Err(_) => break,
            }
            self.complete(out);
        }
        let mut abandoned = 0;
        for i in 0..self.slots.len() {
            let slot = &mut self.slots[i];
            if let Some(buf) = slot.buf.take() {
                // The kernel may still read these pages: never hand them back for reuse. The
                // slot is not reused either, so a late CQE for it cannot be mistaken for one
                // of a newer buffer's.
                self.requests_in_flight -= slot.pending as usize;
                slot.pending = 0;
                self.held -= 1;
                buf.abandon();
                abandoned += 1;
            }
        }
        abandoned
    }
}

impl<B: SendBuf> Drop for SendZcRing<B> {
    fn drop(&mut self) {
        if self.held > 0 {
            let mut events = Vec::new();
            self.shutdown(DROP_BOUND, &mut events);
            // Released buffers are done with: dropping them returns them to their owner.
        }
    }
}

// ---------------------------------------------------------------------------------------
// Receive: multishot recv into a provided buffer ring.

static NEXT_RING_ID: AtomicU64 = AtomicU64::new(1);

/// One provided buffer handed to the application by a [`BufRingRecv`] CQE: the kernel will
/// not write to it until it is given back with [`BufRingRecv::recycle`]. Dropping it without
/// recycling keeps the buffer out of the ring for good (the ring runs dry sooner).
#[derive(Debug, PartialEq, Eq)]
pub struct Lent {
    ring: u64,
    bid: u16,
    len: u32,
}

impl Lent {
    /// Bytes received into the buffer.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the CQE carried no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer id.
    pub fn bid(&self) -> u16 {
        self.bid
    }
}

/// One completion of the multishot receive.
#[derive(Debug, PartialEq, Eq)]
pub enum RecvEvent {
    /// Bytes arrived in a provided buffer. Without `more` the multishot request ended after
    /// this CQE and must be armed again.
    Data {
        /// The buffer, lent until recycled.
        buf: Lent,
        /// `IORING_CQE_F_MORE`: the request is still armed.
        more: bool,
    },
    /// The request ended without data: `res` 0 is end of stream, `-ENOBUFS` means the
    /// buffer ring ran dry (re-arm after recycling), any other negative value is `-errno`.
    End {
        /// The final CQE's result.
        res: i32,
    },
}

/// An io_uring with a ring of provided buffers (`IORING_REGISTER_PBUF_RING`) and at most one
/// multishot `recv` armed on it.
///
/// The kernel picks a buffer per CQE and copies the received bytes into it; the CQE names it
/// (`IORING_CQE_F_BUFFER`, id in the upper 16 flag bits). Memory: one page-aligned mapping for
/// the ring entries, one for the buffers, both pre-faulted (`MAP_POPULATE`).
pub struct BufRingRecv {
    ring: ManuallyDrop<IoUring>,
    bufs: ManuallyDrop<PageBuf>,
    entries_mem: ManuallyDrop<PageBuf>,
    id: u64,
    entries: u16,
    buf_size: u32,
    bgid: u16,
    /// Our copy of the ring tail (the kernel reads the shared one).
    tail: u16,
    armed: Option<u64>,
    arm_seq: u64,
    events: VecDeque<RecvEvent>,
}

impl std::fmt::Debug for BufRingRecv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufRingRecv")
            .field("entries", &self.entries)
            .field("buf_size", &self.buf_size)
            .field("armed", &self.armed.is_some())
            .field("queued_events", &self.events.len())
            .finish()
    }
}

/// `struct io_uring_buf` is 16 bytes: addr (u64), len (u32), bid (u16), resv (u16); the first
/// entry's `resv` is the ring tail (io_uring_register_buf_ring(3)).
const BUF_ENTRY_SIZE: usize = 16;
const BUF_TAIL_OFFSET: usize = 14;

impl BufRingRecv {
    /// A ring of `entries` provided buffers (a power of two, at most 32768) of `buf_size`
    /// bytes each (rounded up to whole pages), registered as buffer group 0.
    pub fn new(entries: u16, buf_size: usize) -> io::Result<BufRingRecv> {
        if !entries.is_power_of_two() || entries > 1 << 15 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "buffer ring entries must be a power of two up to 32768",
            ));
        }
        let buf_size = round_to_pages(buf_size);
        if buf_size > u32::MAX as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "buffer too large",
            ));
        }
        let ring = IoUring::builder()
            .setup_cqsize((u32::from(entries) * 2).max(64))
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(8)?;
        if !supports(&ring, &[opcode::RecvMulti::CODE])? {
            return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        }
        let entries_mem = PageBuf::new(usize::from(entries) * BUF_ENTRY_SIZE)?;
        let bufs = PageBuf::new(usize::from(entries) * buf_size)?;
        let mut this = BufRingRecv {
            ring: ManuallyDrop::new(ring),
            bufs: ManuallyDrop::new(bufs),
            entries_mem: ManuallyDrop::new(entries_mem),
            id: NEXT_RING_ID.fetch_add(1, Ordering::Relaxed),
            entries,
            buf_size: buf_size as u32,
            bgid: 0,
            tail: 0,
            armed: None,
            arm_seq: 0,
            events: VecDeque::new(),
        };
        // SAFETY: the entries mapping is page-aligned, `entries` entries long, zero-filled
        // (so the tail starts at 0), and outlives the registration: Drop closes the ring
        // before unmapping it, or leaks it.
        unsafe {
            this.ring.submitter().register_buf_ring_with_flags(
                this.entries_mem.as_ptr() as u64,
                entries,
                this.bgid,
                0,
            )
        }?;
        for bid in 0..entries {
            this.provide(bid);
        }
        this.publish_tail();
        Ok(this)
    }

    /// Buffers in the ring.
    pub fn entries(&self) -> u16 {
        self.entries
    }

    /// Size of each buffer.
    pub fn buf_size(&self) -> usize {
        self.buf_size as usize
    }

    /// Whether a multishot receive is armed.
    pub fn is_armed(&self) -> bool {
        self.armed.is_some()
    }

    /// Whether the receive must be armed (again) before more data can come: nothing is
    /// armed and every completion of the last request has been taken. Arming earlier would
    /// start a request while queued completions still hold buffers, and it would find the
    /// ring empty.
    pub fn needs_arm(&self) -> bool {
        self.armed.is_none() && self.events.is_empty()
    }

    fn buf_addr(&self, bid: u16) -> *mut u8 {
        // In bounds: bid < entries and the mapping holds entries * buf_size bytes.
        self.bufs
            .as_ptr()
            .cast_mut()
            .wrapping_add(usize::from(bid) * self.buf_size as usize)
    }

    /// Writes buffer `bid` into the ring entry at our tail (not yet visible to the kernel).
    fn provide(&mut self, bid: u16) {
        let idx = usize::from(self.tail & (self.entries - 1));
        let base = self.entries_mem.as_ptr().cast_mut();
        let addr = self.buf_addr(bid) as u64;
        // SAFETY: entry `idx` lies inside the entries mapping we own. The kernel only reads
        // entries between its head and the published tail; this one is past the tail (at most
        // `entries` buffers exist, so the slot was consumed). Writing the addr, len and bid
        // fields one by one leaves `resv` alone, which for entry 0 is the shared tail.
        unsafe {
            let e = base.add(idx * BUF_ENTRY_SIZE);
            std::ptr::write_volatile(e.cast::<u64>(), addr);
            std::ptr::write_volatile(e.add(8).cast::<u32>(), self.buf_size);
            std::ptr::write_volatile(e.add(12).cast::<u16>(), bid);
        }
        self.tail = self.tail.wrapping_add(1);
    }

    fn publish_tail(&self) {
        // SAFETY: the tail is the u16 at offset 14 of the page-aligned entries mapping (so
        // 2-byte aligned), shared with the kernel, and only ever accessed atomically here.
        let tail = unsafe {
            AtomicU16::from_ptr(
                self.entries_mem
                    .as_ptr()
                    .cast_mut()
                    .add(BUF_TAIL_OFFSET)
                    .cast::<u16>(),
            )
        };
        // Release: the entry writes above are visible before the kernel sees the new tail.
        tail.store(self.tail, Ordering::Release);
    }

    /// The bytes in a lent buffer.
    ///
    /// Panics if `lent` came from another ring (a caller bug, not a peer's doing).
    pub fn data(&self, lent: &Lent) -> &[u8] {
        assert_eq!(lent.ring, self.id, "buffer lent by another ring");
        // SAFETY: the kernel handed buffer `bid` over in a CQE (checked: bid < entries, len <=
        // buf_size) and gets it back only through `recycle`, which consumes the unique `Lent`;
        // so for as long as `&self` (and `lent`) live nothing writes these bytes.
        unsafe { std::slice::from_raw_parts(self.buf_addr(lent.bid), lent.len as usize) }
    }

    /// Gives a lent buffer back to the kernel.
    ///
    /// Panics if `lent` came from another ring.
    pub fn recycle(&mut self, lent: Lent) {
        assert_eq!(lent.ring, self.id, "buffer lent by another ring");
        self.provide(lent.bid);
        self.publish_tail();
    }

    /// Arms a multishot `recv` on `fd` (`IORING_RECV_MULTISHOT` with buffer selection from
    /// this ring) and submits it. The kernel keeps a reference to the socket until the
    /// request ends. Fails with `EBUSY` if one is already armed.
    pub fn arm(&mut self, fd: BorrowedFd<'_>) -> io::Result<()> {
        if self.armed.is_some() {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        self.arm_seq += 1;
        let ud = self.arm_seq;
        let entry = opcode::RecvMulti::new(types::Fd(fd.as_raw_fd()), self.bgid)
            .build()
            .user_data(ud);
        // SAFETY: the request writes only into provided buffers, which this ring owns and
        // lends out only after a CQE handed them over; the entries and buffers outlive the
        // request (Drop waits for its final CQE or leaks them).
        unsafe { push_entry(&mut self.ring, &entry) }?;
        enter(&self.ring, 0, None)?;
        self.armed = Some(ud);
        Ok(())
    }

    fn drain(&mut self) -> io::Result<()> {
        let cqes: Vec<cqueue::Entry> = self.ring.completion().collect();
        for cqe in cqes {
            let flags = cqe.flags();
            if Some(cqe.user_data()) != self.armed {
                // A cancellation's own CQE, or one of a request already written off: a
                // buffer it names goes straight back.
                if let Some(bid) = cqueue::buffer_select(flags).filter(|&b| b < self.entries) {
                    self.provide(bid);
                    self.publish_tail();
                }
                continue;
            }
            let more = cqueue::more(flags);
            if !more {
                self.armed = None;
            }
            let res = cqe.result();
            match cqueue::buffer_select(flags) {
                Some(bid) => {
                    let len = res.max(0) as u32;
                    if bid >= self.entries || len > self.buf_size {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("kernel named buffer {bid} with {res} bytes"),
                        ));
                    }
                    let buf = Lent {
                        ring: self.id,
                        bid,
                        len,
                    };
                    if res <= 0 {
                        // A buffer with no data: straight back to the kernel.
                        self.recycle(buf);
                        if !more {
                            self.events.push_back(RecvEvent::End { res });
                        }
                    } else {
                        self.events.push_back(RecvEvent::Data { buf, more });
                    }
                }
                None if !more => self.events.push_back(RecvEvent::End { res }),
                None => {} // nothing carried, still armed
            }
        }
        Ok(())
    }

    /// The next completion, waiting up to `timeout`; `None` if none came in time.
    pub fn next(&mut self, timeout: Duration) -> io::Result<Option<RecvEvent>> {
        self.drain()?;
        if self.events.is_empty() && self.armed.is_some() {
            enter(&self.ring, 1, Some(timeout))?;
            self.drain()?;
        }
        Ok(self.events.pop_front())
    }

    /// Cancels the armed request and waits up to `bound` for its final CQE; true when it is
    /// known to be over (events it posted meanwhile stay queued for [`BufRingRecv::next`]).
    pub fn disarm(&mut self, bound: Duration) -> bool {
        let Some(ud) = self.armed else {
            return true;
        };
        let deadline = Instant::now() + bound;
        let _ = self
            .ring
            .submitter()
            .register_sync_cancel(Some(bound.into()), types::CancelBuilder::user_data(ud));
        loop {
            if self.drain().is_err() || self.armed.is_none() {
                return self.armed.is_none();
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            if enter(
                &self.ring,
                1,
                Some((deadline - now).min(Duration::from_millis(20))),
            )
            .is_err()
            {
                return false;
            }
        }
    }
}

impl Drop for BufRingRecv {
    fn drop(&mut self) {
        let over = self.disarm(DROP_BOUND);
        // SAFETY: each field is dropped or forgotten exactly once, here, and never used after.
        unsafe {
            // Closing the ring kills its context before close(2) returns: no request of it
            // runs afterwards (task work on a dying ring is cancelled, not executed).
            ManuallyDrop::drop(&mut self.ring);
            if over {
                ManuallyDrop::drop(&mut self.bufs);
                ManuallyDrop::drop(&mut self.entries_mem);
            }
            // Otherwise the request's end was never seen: leak the memory it may write.
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn send_zc_returns_the_buffer_only_after_its_notification() {
        let (a, mut b) = pair();
        let mut ring: SendZcRing<Vec<u8>> = SendZcRing::new(8, 4).unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let t = ring
            .push(a.as_fd(), data.clone(), 0..data.len(), None, 0)
            .unwrap();
        ring.seal(t);
        let mut got = vec![0u8; data.len()];
        let reader = std::thread::spawn(move || {
            b.read_exact(&mut got).unwrap();
            got
        });
        let mut events = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut sent = 0usize;
        let mut back = None;
        while back.is_none() && Instant::now() < deadline {
            ring.wait(Duration::from_millis(100)).unwrap();
            ring.complete(&mut events);
            for e in events.drain(..) {
                match e {
                    SendEvent::Sent { res, .. } => {
                        assert!(res > 0, "{res}");
                        sent += res as usize;
                    }
                    SendEvent::Notified { bytes, copied, .. } => {
                        assert!(bytes > 0);
                        assert!(copied, "loopback copies");
                    }
                    SendEvent::Released { buf, .. } => back = Some(buf),
                }
            }
            if sent < data.len() && back.is_none() && ring.requests_in_flight() == 0 {
                // A short send on a sealed buffer is the caller's to continue; here the
                // socket buffer is large enough that it does not happen.
                panic!("short send {sent}");
            }
        }
        assert_eq!(back.as_deref(), Some(&data[..]));
        assert_eq!(reader.join().unwrap(), data);
        assert_eq!(ring.held(), 0);
    }

    #[test]
    fn fixed_buffer_bounds_are_checked_before_the_kernel_sees_them() {
        let (a, _b) = pair();
        let mut ring: SendZcRing<Vec<u8>> = SendZcRing::new(8, 2).unwrap();
        let reg = vec![0u8; 4096];
        ring.register_buffers(&[(reg.as_ptr() as usize, reg.len())])
            .unwrap();
        let other = vec![1u8; 64];
        match ring.push(a.as_fd(), other, 0..64, Some(0), 0) {
            Err(PushError::Io(b, e)) => {
                assert_eq!(b.len(), 64);
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            }
            r => panic!("{r:?}"),
        }
        match ring.push(a.as_fd(), vec![0u8; 8], 0..9, None, 0) {
            Err(PushError::Io(_, e)) => assert_eq!(e.kind(), io::ErrorKind::InvalidInput),
            r => panic!("{r:?}"),
        }
        assert_eq!(ring.held(), 0);
    }

    #[test]
    fn buf_ring_lends_and_recycles_and_reports_eof() {
        let (mut a, b) = pair();
        let mut ring = BufRingRecv::new(4, 4096).unwrap();
        ring.arm(b.as_fd()).unwrap();
        let data: Vec<u8> = (0..50_000u32).map(|i| (i % 253) as u8).collect();
        a.write_all(&data).unwrap();
        drop(a);
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut enobufs = 0;
        loop {
            if Instant::now() >= deadline {
                panic!("stalled"); // a hang guard, not a speed check
            }
            if ring.needs_arm() {
                ring.arm(b.as_fd()).unwrap();
            }
            match ring.next(Duration::from_millis(100)).unwrap() {
                None => {}
                Some(RecvEvent::Data { buf, .. }) => {
                    got.extend_from_slice(ring.data(&buf));
                    ring.recycle(buf);
                }
                Some(RecvEvent::End { res: 0 }) => break,
                Some(RecvEvent::End { res }) if res == -libc::ENOBUFS => enobufs += 1,
                Some(e) => panic!("{e:?}"),
            }
        }
        assert_eq!(got, data);
        // Every re-arm happens after all buffers are back: at most one dry ring per
        // four buffers' worth of data.
        assert!(enobufs <= data.len() / (4 * 4096) + 1, "{enobufs}");
    }
}
