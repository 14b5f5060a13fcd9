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
//! of the sender's CPU. The pool registered here is made of 4 KiB pages, though (a
//! registered huge page charges each datagram its offset in the 2 MiB folio as socket
//! memory, `docs/measurements/msg.md`): through the message sender into the sink that costs
//! about 3 %, and the ring stays ~14 % under `MSG_ZEROCOPY` from huge pages.
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
//!
//! An unregistered pool (the registration refused: `RLIMIT_MEMLOCK` without `CAP_IPC_LOCK`,
//! what an ordinary user has) has every request's pages charged to that limit until its
//! notification — a budget all the user's processes share. A request past it fails with
//! `ENOMEM` (`ENOBUFS` from the socket's option memory) having sent nothing, and Linux 6.18
//! charges the pages when the request is issued, which for a batch that found the socket
//! buffer full is only once room came: the refusal can arrive long after the submission.
//! Such a request is no loss: its batch is copied out of the buffer
//! ([`MsgRing::take_refused`]) and sent by copy, counted as a [`FallbackReason::Memlock`]
//! (or `Enobufs`) fallback. So that this happens at once — and not after the receiver's
//! reassembly timeout, when the sender next calls — someone must wait for an unregistered
//! ring's results ([`MsgRing::results_due`]): the blocking sender before its `send`
//! returns, as a blocking `sendmsg` waits for socket room; `zcnet-tokio`'s flusher task
//! for `send_lent`. The copy leaves behind the message's other batches (the receiver
//! places fragments by offset). An unregistered request's bytes count as zero-copy once its
//! result says it sent, not when it is queued. A registered pool is charged once, at
//! registration: nothing of this runs.

use crate::framer::{Framer, Outgoing};
use crate::MsgBuf;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::ops::Range;
use std::os::fd::{BorrowedFd, OwnedFd};
use zcnet::FallbackReason;
use zcnet::Stats;
use zcnet::{Pool, TxBuf};
use zcnet_sys::uring::{PushError, SendEvent, SendToken, SendZcRing};

/// One request's batch: its wire range in the buffer and its `UDP_SEGMENT` size.
type BatchOf = (Range<usize>, Option<u16>);

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
    /// Unregistered only: each buffer's batches (wire range, GSO size) by request number,
    /// so a request the kernel refuses can be sent again by copy.
    batches: HashMap<SendToken, Vec<BatchOf>>,
    /// Batches refused for want of pinnable memory, copied out, not yet sent again.
    refused: VecDeque<Refused>,
    /// Unregistered requests queued whose result has not been read.
    results_due: usize,
}

/// A batch an unregistered request could not send (its pages not pinnable within
/// `RLIMIT_MEMLOCK`, or no option memory): its wire bytes, copied out of the message's buffer,
/// to be sent by copy ([`MsgRing::take_refused`]).
#[derive(Debug, Clone)]
pub struct Refused {
    /// The batch's datagrams, headers included, as the request would have sent them.
    pub wire: Vec<u8>,
    /// The `UDP_SEGMENT` size to send them with (`None`: one datagram).
    pub gso: Option<u16>,
    /// [`FallbackReason::Memlock`] for `ENOMEM`, [`FallbackReason::Enobufs`] for `ENOBUFS`.
    pub reason: FallbackReason,
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

impl Refused {
    /// Counts this batch, sent by copy: copied bytes and call, and the fallback with its
    /// reason.
    pub fn count(&self, stats: &Stats) {
        let n = self.wire.len() as u64;
        stats.add_tx_copy_bytes(n);
        stats.add_tx_copy_calls(1);
        stats.fallback(self.reason, n);
    }
}

impl MsgRing {
    /// Why a sender whose [`MsgRing::new`] failed with `e` sends by `MSG_ZEROCOPY` instead:
    /// [`FallbackReason::Memlock`] when `io_uring_setup` said `ENOMEM` (without
    /// `CAP_IPC_LOCK` the rings are charged to `RLIMIT_MEMLOCK`, which the user's other
    /// processes may have spent), [`FallbackReason::Unsupported`] otherwise.
    pub fn unavailable_reason(e: &io::Error) -> FallbackReason {
        if e.raw_os_error() == Some(libc::ENOMEM) {
            FallbackReason::Memlock
        } else {
            FallbackReason::Unsupported
        }
    }

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
            batches: HashMap::new(),
            refused: VecDeque::new(),
            results_due: 0,
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
    ///
    /// Returns the wire bytes handed to the kernel once every batch is queued; or, when
    /// nothing was queued (every slot held, or the ring refused the request), the message
    /// untouched with why, for the caller to send another way — the buffer comes back on
    /// failure, as tokio-uring's `BufResult` gives it back.
    pub fn send(
        &mut self,
        sock: BorrowedFd<'_>,
        framer: &mut Framer,
        out: &mut Outgoing,
        msg: MsgBuf,
        stats: &Stats,
    ) -> Result<usize, (MsgBuf, io::Error)> {
        let sent = self.queue(sock, framer, out, msg, stats);
        if sent.is_ok() {
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
    ) -> Result<usize, (MsgBuf, io::Error)> {
        let Some(first) = framer.next_batch(out) else {
            return Ok(0);
        };
        let layout = msg.layout;
        let len = msg.len;
        let buf = msg.into_inner();
        let fixed = (self.fixed && self.pool.owns(&buf)).then(|| buf.index() as u16);
        let token = match self.ring.push(sock, buf, first.wire.clone(), fixed, 0) {
            Ok(t) => t,
            Err(PushError::Full(buf)) => {
                let e = io::Error::new(io::ErrorKind::WouldBlock, "every io_uring slot is held");
                return Err((MsgBuf { buf, len, layout }, e));
            }
            Err(PushError::Io(buf, e)) => return Err((MsgBuf { buf, len, layout }, e)),
        };
        let mut queued = 0;
        let mut batch = Some(first);
        let mut error = None;
        let mut requests = Vec::new();
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
                if fixed.is_some() {
                    stats.add_tx_zerocopy_bytes(n as u64);
                    stats.add_tx_zerocopy_calls(1);
                    stats.add_tx_uring_fixed_calls(1);
                } else {
                    // Counted by its result, which may be a refusal (see the module docs).
                    requests.push((b.wire.clone(), b.gso));
                }
            }
            batch = framer.next_batch(out);
        }
        if fixed.is_none() {
            self.results_due += requests.len();
            self.batches.insert(token, requests);
        }
        self.ring.seal(token);
        if let Some(e) = error {
            // Some batches are queued (their bytes stay with the ring until notified); the
            // rest of the message is not: a failure the caller sees now.
            self.failure.get_or_insert(e);
        }
        Ok(queued)
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
    /// request's error, and copies out the batches of unregistered requests refused for want
    /// of pinnable memory ([`MsgRing::take_refused`]). Returns how many buffers came back.
    pub fn reap(&mut self, stats: &Stats) -> usize {
        self.reap_observing(stats, |_, _| {})
    }

    /// [`MsgRing::reap`], telling `observe` each notification's (copied, bytes): what a
    /// sender's COPIED demotion reads ([`zcnet::policy::CopiedDemotion::observe_bytes`]).
    pub fn reap_observing(&mut self, stats: &Stats, mut observe: impl FnMut(bool, u64)) -> usize {
        self.ring.complete(&mut self.events);
        let mut released = 0;
        // Refused requests whose bytes are still to be copied out: (buffer, batch, reason).
        let mut refusals: Vec<(SendToken, usize, FallbackReason)> = Vec::new();
        let mut events = std::mem::take(&mut self.events);
        for e in events.drain(..) {
            match e {
                SendEvent::Sent {
                    token, req, res, ..
                } => {
                    let tracked = self
                        .batches
                        .get(&token)
                        .is_some_and(|b| usize::from(req) < b.len());
                    if tracked {
                        self.results_due = self.results_due.saturating_sub(1);
                    }
                    match res {
                        // An unregistered request sent its batch: a zero-copy call now.
                        0.. if tracked => {
                            stats.add_tx_zerocopy_bytes(res as u64);
                            stats.add_tx_zerocopy_calls(1);
                        }
                        0.. => {}
                        _ if tracked && (res == -libc::ENOMEM || res == -libc::ENOBUFS) => {
                            let reason = if res == -libc::ENOMEM {
                                FallbackReason::Memlock
                            } else {
                                stats.add_tx_enobufs(1);
                                FallbackReason::Enobufs
                            };
                            refusals.push((token, usize::from(req), reason));
                        }
                        _ => {
                            self.failure
                                .get_or_insert(io::Error::from_raw_os_error(-res));
                        }
                    }
                }
                // A request that sent nothing still gets its notification, but completes no
                // zero-copy call: an unregistered one was never counted as one.
                SendEvent::Notified {
                    token, bytes: 0, ..
                } if self.batches.contains_key(&token) => {}
                SendEvent::Notified { bytes, copied, .. } => {
                    stats.add_tx_notifications(1);
                    stats.add_tx_completed_calls(1);
                    if copied {
                        stats.add_tx_zc_copied_bytes(u64::from(bytes));
                    }
                    observe(copied, u64::from(bytes));
                }
                SendEvent::Released { token, buf } => {
                    // The last of its CQEs may have been a refusal: copy out before the
                    // buffer goes back.
                    copy_refused(&self.batches, &mut self.refused, token, &buf, &mut refusals);
                    self.batches.remove(&token);
                    drop(buf); // back to the pool: every request on it is done
                    released += 1;
                }
            }
        }
        self.events = events;
        if !refusals.is_empty() {
            // Their buffers are still in the ring (notifications outstanding).
            let tokens: Vec<SendToken> = refusals.iter().map(|r| r.0).collect();
            for t in tokens {
                if let Some(bytes) = self.ring.bytes(t) {
                    copy_refused(&self.batches, &mut self.refused, t, bytes, &mut refusals);
                }
            }
            // A refusal whose buffer was gone cannot be sent again: a lost message.
            if !refusals.is_empty() {
                self.failure.get_or_insert(io::Error::other(
                    "io_uring SEND_ZC refused a batch whose buffer was already released",
                ));
            }
        }
        released
    }

    /// The oldest batch the kernel refused (see the module docs), for the caller to send by
    /// copy and count ([`Refused::count`]); put it back with [`MsgRing::put_back_refused`]
    /// if that fails. `None` when there is none.
    pub fn take_refused(&mut self) -> Option<Refused> {
        self.refused.pop_front()
    }

    /// Returns a batch [`MsgRing::take_refused`] gave out that could not be sent yet: it is
    /// the next one again.
    pub fn put_back_refused(&mut self, r: Refused) {
        self.refused.push_front(r);
    }

    /// Whether refused batches wait to be sent by copy.
    pub fn has_refused(&self) -> bool {
        !self.refused.is_empty()
    }

    /// Whether requests are counted by their results, and may be refused for want of
    /// pinnable memory: the pool is not registered. Someone must then wait for the results
    /// ([`MsgRing::results_due`]) and send what was refused by copy (see the module docs).
    pub fn awaits_results(&self) -> bool {
        !self.fixed
    }

    /// Unregistered requests whose result has not been read yet (none on a registered
    /// ring): while any is due, a refusal may still come.
    pub fn results_due(&self) -> usize {
        self.results_due
    }

    /// Sends every refused batch by copy on `sock`, a blocking socket (its send timeout
    /// bounds each), counting each in `stats`. A batch that fails stays queued, first.
    pub fn send_refused_blocking(&mut self, sock: BorrowedFd<'_>, stats: &Stats) -> io::Result<()> {
        while let Some(r) = self.refused.pop_front() {
            let iov = [io::IoSlice::new(&r.wire)];
            loop {
                match zcnet_sys::raw::udp_msg::send_vectored_gso(sock, &iov, false, r.gso) {
                    Ok(_) => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        self.refused.push_front(r);
                        return Err(e);
                    }
                }
            }
            r.count(stats);
        }
        Ok(())
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

/// Moves the refusals on `token` out of `refusals`, their batches (`batches`' ranges) copied
/// from `bytes` (the buffer's wire bytes) into `refused`.
fn copy_refused(
    batches: &HashMap<SendToken, Vec<BatchOf>>,
    refused: &mut VecDeque<Refused>,
    token: SendToken,
    bytes: &[u8],
    refusals: &mut Vec<(SendToken, usize, FallbackReason)>,
) {
    let Some(ranges) = batches.get(&token) else {
        return;
    };
    refusals.retain(|&(t, req, reason)| {
        let Some((range, gso)) = ranges.get(req).filter(|_| t == token) else {
            return true;
        };
        let Some(wire) = bytes.get(range.clone()) else {
            return true;
        };
        refused.push_back(Refused {
            wire: wire.to_vec(),
            gso: *gso,
            reason,
        });
        false
    });
}
