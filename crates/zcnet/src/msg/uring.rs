//! [`MsgRing`]: whole messages out through io_uring `IORING_OP_SEND_ZC` from the message
//! pool registered as fixed buffers ([`super::MsgTx::Uring`]).
//!
//! Why a second zero-copy engine beside `MSG_ZEROCOPY`: a `MSG_ZEROCOPY` `sendmsg` looks up
//! and pins every page of its batch (`get_user_pages`) and drops those references again when
//! the device is done, and each completion is read back with a `recvmsg` on the error queue.
//! A registered pool was pinned once, at registration; a send names it by index, its pages
//! ride in the skb without a reference per page, and completions are CQEs in shared memory.
//! Into a sink where nothing copies (`docs/measurements/uring.md`: 64 KiB from a huge-page
//! pool, `MSG_ZEROCOPY` 8.8–9.3 µs per operation, `SEND_ZC` fixed 6.5–7.3) that is a quarter
//! of the sender's CPU.
//!
//! `SEND_ZC` takes no control message, so the GSO size is the socket's own `UDP_SEGMENT`
//! option, set once to the layout's datagram size ([`MsgRing::new`]): a batch of one datagram
//! is not longer than that and leaves unsegmented, a longer one is cut at exactly the
//! datagram boundaries the framer laid out (the last one may be short, as GSO allows).
//!
//! A message's batches are all queued and submitted in one `io_uring_enter`; the call returns
//! once they are queued. Their results come later: a request that failed (`ECONNREFUSED`
//! from an ICMP error, `EMSGSIZE`, ...) is counted and its error returned by the next call
//! ([`MsgRing::take_failure`]); its message is one the receiver reports lost. The buffer stays
//! in the ring until every request's notification, then drops back to its pool.

use crate::buf::{Pool, TxBuf};
use crate::msg::framer::{Framer, Outgoing};
use crate::msg::MsgBuf;
use crate::stats::Stats;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use zcnet_sys::uring::{PushError, SendEvent, SendZcRing};

/// Submission queue entries: the batches of a few messages (a 64 KiB message is two).
const SQ_ENTRIES: u32 = 64;
/// Slots for buffers from outside the pool (sent unregistered), beyond the pool's own.
const EXTRA_SLOTS: usize = 8;

/// The ring, its registration and what its completions said (see the module docs).
pub struct MsgRing {
    ring: SendZcRing<TxBuf>,
    pool: Pool,
    fixed: bool,
    events: Vec<SendEvent<TxBuf>>,
    /// The first error a request reported since the last [`MsgRing::take_failure`].
    failure: Option<io::Error>,
    /// A polled ring's eventfd, until [`MsgRing::take_watch`] hands it over.
    watch: Option<OwnedFd>,
}

impl std::fmt::Debug for MsgRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MsgRing")
            .field("fixed", &self.fixed)
            .field("held", &self.ring.held())
            .field("failure", &self.failure)
            .finish()
    }
}

/// How [`MsgRing::send`] went.
#[derive(Debug)]
pub enum RingSend {
    /// Every batch is queued: wire bytes handed to the kernel.
    Queued(usize),
    /// Nothing was queued (every slot held, or the ring refused the request): the message
    /// back, untouched, for the caller to send another way.
    Refused(MsgBuf, io::Error),
}

impl MsgRing {
    /// A ring for messages of `pool`'s buffers, the pool registered as fixed buffers (a
    /// failed registration — `RLIMIT_MEMLOCK` — is counted in `stats` and the ring sends
    /// unregistered), and `UDP_SEGMENT` on `sock` set to `segment` when batches carry more
    /// than one datagram. `polled`: an event loop waits for its completions, on an eventfd
    /// ([`MsgRing::take_watch`], [`SendZcRing::new_polled`]). Fails where io_uring or `SEND_ZC` is missing (`ENOSYS`,
    /// `EPERM` under `kernel.io_uring_disabled`, `EOPNOTSUPP`), or the socket option is.
    pub fn new(
        sock: BorrowedFd<'_>,
        pool: &Pool,
        segment: Option<u16>,
        polled: bool,
        stats: &Stats,
    ) -> io::Result<MsgRing> {
        let slots = pool.count() + EXTRA_SLOTS;
        let mut ring = if polled {
            SendZcRing::new_polled(SQ_ENTRIES, slots)?
        } else {
            SendZcRing::new(SQ_ENTRIES, slots)?
        };
        if let Some(seg) = segment {
            zcnet_sys::raw::udp::set_udp_segment(sock, seg)?;
        }
        let watch = if polled {
            Some(ring.register_eventfd()?)
        } else {
            None
        };
        let fixed = match ring.register_buffers(pool.regions()) {
            Ok(()) => true,
            Err(_) => {
                stats.add_tx_uring_register_failures(1);
                false
            }
        };
        Ok(MsgRing {
            ring,
            pool: pool.clone(),
            fixed,
            events: Vec::new(),
            failure: None,
            watch,
        })
    }

    /// A polled ring's eventfd (once): readable after completions were posted while
    /// [`MsgRing::arm`]ed.
    pub fn take_watch(&mut self) -> Option<OwnedFd> {
        self.watch.take()
    }

    /// Whether posting a completion signals the eventfd: on only while someone waits, since
    /// each signal costs the sender a wake-up of whoever polls it.
    pub fn arm(&mut self, on: bool) {
        self.ring.set_eventfd_enabled(on);
    }

    /// Resets the eventfd, after a wake-up, so that it signals only newer completions.
    pub fn clear_watch(&self) {
        self.ring.clear_eventfd();
    }

    /// Whether the pool is registered (sends skip pinning).
    pub fn has_fixed_buffers(&self) -> bool {
        self.fixed
    }

    /// Buffers the kernel may still read (waiting for their notifications).
    pub fn held(&self) -> usize {
        self.ring.held()
    }

    /// Whether [`MsgRing::send`] has a slot for another buffer: every pool buffer always
    /// has one, a buffer from elsewhere only while fewer than a few such are in flight.
    pub fn can_take(&self) -> bool {
        self.ring.held() < self.pool.count() + EXTRA_SLOTS
    }

    /// Queues every batch `out` has left from `msg` (stamped already) as `SEND_ZC` requests
    /// on `sock` and submits them in one `io_uring_enter`. The ring keeps the buffer until
    /// the last notification. The framer counts each batch as sent when queued.
    pub fn send(
        &mut self,
        sock: BorrowedFd<'_>,
        framer: &mut Framer,
        out: &mut Outgoing,
        msg: MsgBuf,
        stats: &Stats,
    ) -> RingSend {
        let sent = self.queue(sock, framer, out, msg, stats);
        if matches!(sent, RingSend::Queued(_)) {
            self.submit(stats);
        }
        sent
    }

    /// [`MsgRing::send`] without the system call: the requests wait in the submission
    /// queue for [`MsgRing::submit`] (or for a later message's `send`, or for the queue to
    /// fill). For an event loop that can promise the submission — `zcnet-tokio`'s
    /// `ZcUdpSocket` submits several messages' batches in one `io_uring_enter`. `sock` must
    /// stay open until they are submitted: the kernel looks the descriptor up then.
    pub fn queue(
        &mut self,
        sock: BorrowedFd<'_>,
        framer: &mut Framer,
        out: &mut Outgoing,
        msg: MsgBuf,
        stats: &Stats,
    ) -> RingSend {
        let Some(first) = framer.next_batch(out) else {
            return RingSend::Queued(0);
        };
        let layout = msg.layout;
        let len = msg.len;
        let buf = msg.into_inner();
        let fixed = (self.fixed && self.pool.owns(&buf)).then(|| buf.index() as u16);
        let token = match self.ring.push(sock, buf, first.wire.clone(), fixed, 0) {
            Ok(t) => t,
            Err(PushError::Full(buf)) => {
                let e = io::Error::new(io::ErrorKind::WouldBlock, "every io_uring slot is held");
                return RingSend::Refused(MsgBuf { buf, len, layout }, e);
            }
            Err(PushError::Io(buf, e)) => return RingSend::Refused(MsgBuf { buf, len, layout }, e),
        };
        let mut queued = 0;
        let mut batch = Some(first);
        let mut error = None;
        while let Some(b) = batch {
            if queued > 0 {
                if let Err(e) = self.ring.push_more(sock, token, b.wire.clone(), fixed, 0) {
                    error = Some(e);
                    break;
                }
            }
            let n = b.wire.len();
            // Queued whole: a datagram socket's send takes all of it or fails.
            if let Ok(Some(n)) = framer.after(out, &b, Ok(n)) {
                queued += n;
                stats.add_tx_zerocopy_bytes(n as u64);
                stats.add_tx_zerocopy_calls(1);
                if fixed.is_some() {
                    stats.add_tx_uring_fixed_calls(1);
                }
            }
            batch = framer.next_batch(out);
        }
        self.ring.seal(token);
        if let Some(e) = error {
            // Some batches are queued (their bytes stay with the ring until notified); the
            // rest of the message is not: a failure the caller sees now.
            self.failure.get_or_insert(e);
        }
        RingSend::Queued(queued)
    }

    /// Requests queued by [`MsgRing::queue`] and not submitted yet.
    pub fn unsubmitted(&mut self) -> usize {
        self.ring.unsubmitted()
    }

    /// Submits what [`MsgRing::queue`] left queued, in one `io_uring_enter` (none if
    /// nothing is), counted in `stats` (`tx_uring_submits`). A failed submission is kept for
    /// [`MsgRing::take_failure`].
    pub fn submit(&mut self, stats: &Stats) {
        if self.ring.unsubmitted() == 0 {
            return;
        }
        stats.add_tx_uring_submits(1);
        if let Err(e) = self.ring.submit() {
            self.failure.get_or_insert(e);
        }
    }

    /// Reads the completion queue: counts notifications (and bytes the kernel copied after
    /// all) in `stats`, drops released buffers back to their pool, keeps the first failed
    /// request's error. Returns how many buffers came back.
    pub fn reap(&mut self, stats: &Stats) -> usize {
        self.reap_observing(stats, |_, _| {})
    }

    /// [`MsgRing::reap`], telling `observe` each notification's (copied, bytes): what a
    /// sender's COPIED demotion reads ([`crate::policy::CopiedDemotion::notified`]).
    pub fn reap_observing(&mut self, stats: &Stats, mut observe: impl FnMut(bool, u64)) -> usize {
        self.ring.complete(&mut self.events);
        let mut released = 0;
        for e in self.events.drain(..) {
            match e {
                SendEvent::Sent { res, .. } if res < 0 => {
                    self.failure
                        .get_or_insert(io::Error::from_raw_os_error(-res));
                }
                SendEvent::Sent { .. } => {}
                SendEvent::Notified { bytes, copied, .. } => {
                    stats.add_tx_notifications(1);
                    stats.add_tx_completed_calls(1);
                    if copied {
                        stats.add_tx_zc_copied_bytes(u64::from(bytes));
                    }
                    observe(copied, u64::from(bytes));
                }
                SendEvent::Released { buf, .. } => {
                    drop(buf); // back to the pool: every request on it is done
                    released += 1;
                }
            }
        }
        released
    }

    /// The first error a request reported after its message was queued, once.
    pub fn take_failure(&mut self) -> Option<io::Error> {
        self.failure.take()
    }

    /// Waits (blocking) up to `timeout` for a completion, then reaps; how many buffers came
    /// back.
    pub fn wait(&mut self, timeout: std::time::Duration, stats: &Stats) -> io::Result<usize> {
        self.wait_observing(timeout, stats, |_, _| {})
    }

    /// [`MsgRing::wait`] with [`MsgRing::reap_observing`]'s `observe`.
    pub fn wait_observing(
        &mut self,
        timeout: std::time::Duration,
        stats: &Stats,
        observe: impl FnMut(bool, u64),
    ) -> io::Result<usize> {
        self.ring.wait(timeout)?;
        Ok(self.reap_observing(stats, observe))
    }
}
