//! The `cow` transmit path: zero-copy for callers of [`crate::Sender::send_slice`], who keep
//! copy semantics (Solaris's page remapping + copy-on-write, Chu, "Zero-Copy TCP in Solaris", §3.2.4).
//!
//! Per `send_slice`: the unaligned head and tail of the slice are copied (counted as
//! [`FallbackReason::Unaligned`]); the page-aligned middle, if at least
//! [`Policy::min_zerocopy_bytes`], is write-protected ([`crate::cow`]) and sent with
//! `MSG_ZEROCOPY`; the protection is lifted when the completion covering its calls arrives.
//! Declined (counted) instead: slices below the threshold, a socket without `SO_ZEROCOPY`
//! or a process without the engine, a socket demoted after COPIED completions, a working set
//! below Solaris's threshold ([`FallbackReason::SmallWorkingSet`]), and memory that cannot
//! be protected ([`FallbackReason::Unprotectable`]).
//!
//! Loaned buffers ([`crate::Sender::send`]) need no protection — the application gave them
//! up — and take the plain `MSG_ZEROCOPY` path, sharing the socket's completion counter
//! with the protected spans.
//!
//! A sender dropped while protected spans are still in flight (its bounded wait for
//! completions ran out: the peer stopped reading) aborts the connection with a reset: only
//! that makes the kernel drop the pages at once, and the protection cannot be lifted before
//! it does without letting later writes reach the wire.

use super::plain;
use super::zerocopy::{send_all_zerocopy, ZerocopyCalls};
use crate::buf::TxBuf;
use crate::cow::gate::{WorkingSet, SNDBUF_REFRESH};
use crate::cow::{engine, CowPolicy, Engine, Ineligible};
use crate::error::Result;
use crate::path::FallbackReason;
use crate::policy::{CopiedDemotion, Policy};
use crate::stats::Stats;
use crate::zc::completion::Completions;
use crate::zc::reap::{poll_errqueue, reap_completions};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;
use zcnet_sys::cow::{abort_connection, Protected};
use zcnet_sys::mem::page_size;
use zcnet_sys::raw::socket;
use zcnet_sys::raw::zerocopy as zc;

/// What a completion gives back.
#[derive(Debug)]
enum Loan {
    /// A loaned buffer: back to its pool.
    Buf(TxBuf),
    /// A protected span of the application's memory: protection lifted.
    Span(Protected),
}

/// State of the `cow` path on one socket.
pub(crate) struct CowTx {
    completions: Completions<Loan>,
    demotion: CopiedDemotion,
    policy: Policy,
    cow: CowPolicy,
    timeout: Duration,
    entries: Vec<zc::ErrqueueEntry>,
    /// `SO_ZEROCOPY` could not be enabled: every send is copied and counted.
    unsupported: bool,
    engine: Option<&'static Engine>,
    working_set: WorkingSet,
    /// Bytes handed to the socket so far (the working set's clock).
    stream_pos: u64,
    sndbuf: usize,
    sends_until_sndbuf: u32,
    /// Completed spans waiting to be released together (coalesced runs, one lock).
    done: Vec<Protected>,
    /// A second descriptor of the socket, to abort it from [`super::Transmit::abandon`].
    sock: Option<OwnedFd>,
}

impl std::fmt::Debug for CowTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CowTx")
            .field("cow", &self.cow)
            .field("engine", &self.engine.map(|e| e.kind()))
            .field("in_flight", &self.completions.loans_in_flight())
            .finish()
    }
}

impl CowTx {
    /// Path state for `fd`, on which `SO_ZEROCOPY` was (or, with `unsupported`, could not
    /// be) enabled. Starts the process's copy-on-write engine if it is not running; if it
    /// cannot run here, every `send_slice` copies ([`FallbackReason::Unsupported`]).
    pub(crate) fn new(
        fd: BorrowedFd<'_>,
        policy: Policy,
        cow: CowPolicy,
        timeout: Duration,
        unsupported: bool,
    ) -> Self {
        CowTx {
            completions: Completions::new(),
            demotion: CopiedDemotion::default(),
            policy,
            cow,
            timeout,
            entries: Vec::new(),
            unsupported,
            engine: engine().ok(),
            working_set: WorkingSet::default(),
            stream_pos: 0,
            sndbuf: 0,
            sends_until_sndbuf: 0,
            done: Vec::new(),
            sock: fd.try_clone_to_owned().ok(),
        }
    }

    /// Why the protected path is declined for a slice of `len` bytes whose page-aligned
    /// middle is `span`; `None` to protect.
    fn decline(&mut self, fd: BorrowedFd<'_>, len: usize, span: &[u8]) -> Option<FallbackReason> {
        if len < self.policy.min_zerocopy_bytes.max(1) {
            return Some(FallbackReason::TooSmall);
        }
        if self.unsupported || self.engine.is_none() {
            return Some(FallbackReason::Unsupported);
        }
        if self.demotion.is_demoted() {
            return Some(FallbackReason::DemotedCopied);
        }
        if span.len() < self.policy.min_zerocopy_bytes.max(page_size()) {
            return Some(FallbackReason::Unaligned);
        }
        self.working_set
            .observe(span.as_ptr() as usize, self.stream_pos);
        if self.sends_until_sndbuf == 0 {
            self.sends_until_sndbuf = SNDBUF_REFRESH;
            if let Ok(n) = socket::get_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF) {
                self.sndbuf = n.max(0) as usize;
            }
        }
        self.sends_until_sndbuf -= 1;
        if !self.working_set.allows(self.cow.working_set, self.sndbuf) {
            return Some(FallbackReason::SmallWorkingSet);
        }
        None
    }

    /// `send(MSG_ZEROCOPY)` of all of `data`, continuing short sends; each successful call
    /// takes the next notification id. Returns the id of the first call; the calls made are
    /// `first..next_id()` even when an error ends the loop.
    fn send_zerocopy(
        &mut self,
        fd: BorrowedFd<'_>,
        data: &[u8],
        stats: &Stats,
    ) -> (u64, Result<()>) {
        let first = self.completions.next_id();
        let timeout = self.timeout;
        (first, send_all_zerocopy(self, fd, data, stats, timeout))
    }

    /// Holds `loan` until the calls `first..next_id()` complete; releases at once if they
    /// already did (or none was made).
    fn lend(&mut self, loan: Loan, first: u64, stats: &Stats) {
        let next = self.completions.next_id();
        let back = if next > first {
            self.completions.lend(loan, first, next - 1)
        } else {
            Some(loan)
        };
        if let Some(l) = back {
            self.give_back(l);
            self.release_done(stats);
        }
    }

    fn give_back(&mut self, loan: Loan) {
        match loan {
            Loan::Buf(b) => drop(b),
            Loan::Span(p) => self.done.push(p),
        }
    }

    /// Lifts the protection of completed spans and credits their faults to `stats`.
    fn release_done(&mut self, stats: &Stats) {
        if self.done.is_empty() {
            return;
        }
        if let Some(e) = self.engine {
            let rel = e.release(&mut self.done);
            stats.add_tx_cow_faults(rel.faults);
            stats.add_tx_cow_fault_ns(rel.fault_ns);
            stats.add_tx_cow_copies(rel.copies);
        }
        self.done.clear();
    }

    /// Gives up on every span still in flight: aborts the connection so the kernel drops
    /// the pages, waits briefly for it to let go, then lifts the protection.
    fn abandon_spans(&mut self) -> usize {
        let held = self.completions.abandon();
        let spans = held.iter().filter(|l| matches!(l, Loan::Span(_))).count();
        if spans > 0 {
            if let Some(s) = &self.sock {
                let _ = abort_connection(s.as_fd());
            }
            // Packets already handed to a device queue keep their page references for a
            // moment after the send queue is purged.
            std::thread::sleep(Duration::from_millis(20));
        }
        let n = held.len();
        for l in held {
            match l {
                Loan::Buf(b) => b.retire(),
                Loan::Span(p) => self.done.push(p),
            }
        }
        if let Some(e) = self.engine {
            e.release(&mut self.done);
        }
        self.done.clear();
        n
    }
}

impl ZerocopyCalls for CowTx {
    fn record_call(&mut self, bytes: usize) {
        self.completions.record_call(bytes);
    }

    fn wait_for_completions(
        &mut self,
        fd: BorrowedFd<'_>,
        stats: &Stats,
        pause: Duration,
    ) -> Result<usize> {
        super::Transmit::wait(self, fd, stats, pause)
    }
}

impl super::Transmit for CowTx {
    fn send_buf(&mut self, fd: BorrowedFd<'_>, buf: TxBuf, stats: &Stats) -> Result<()> {
        self.stream_pos += buf.len() as u64;
        let refused = if self.unsupported {
            Some(FallbackReason::Unsupported)
        } else {
            self.policy.refuses(
                buf.len(),
                buf.data_addr(),
                page_size(),
                self.demotion.is_demoted(),
            )
        };
        if let Some(reason) = refused {
            stats.fallback(reason, buf.len() as u64);
            return plain::send_all(fd, &buf, stats, self.timeout);
        }
        let (first, result) = self.send_zerocopy(fd, &buf, stats);
        // Lend the buffer even on error: calls that did go out still reference its pages.
        self.lend(Loan::Buf(buf), first, stats);
        result?;
        self.reap(fd, stats)?;
        Ok(())
    }

    fn send_slice(
        &mut self,
        fd: BorrowedFd<'_>,
        data: &[u8],
        stats: &Stats,
        timeout: Duration,
    ) -> Result<()> {
        let page = page_size();
        let addr = data.as_ptr() as usize;
        let head = (addr.next_multiple_of(page) - addr).min(data.len());
        let body = (data.len() - head) / page * page;
        let (h, rest) = data.split_at(head);
        let (span, tail) = rest.split_at(body);
        let declined = self.decline(fd, data.len(), span);
        self.stream_pos += data.len() as u64;
        if let Some(reason) = declined {
            stats.fallback(reason, data.len() as u64);
            return plain::send_all(fd, data, stats, timeout);
        }
        let Some(engine) = self.engine else {
            stats.fallback(FallbackReason::Unsupported, data.len() as u64);
            return plain::send_all(fd, data, stats, timeout);
        };
        // Protect before sending: the pages were checked resident, so the kernel's page
        // lookup for MSG_ZEROCOPY never meets a missing page in the registered range.
        let protected = match engine.protect(span) {
            Ok(p) => p,
            Err(Ineligible::Forked) => {
                stats.fallback(FallbackReason::Unsupported, data.len() as u64);
                return plain::send_all(fd, data, stats, timeout);
            }
            Err(_) => {
                stats.fallback(FallbackReason::Unprotectable, data.len() as u64);
                return plain::send_all(fd, data, stats, timeout);
            }
        };
        stats.add_tx_cow_protections(1);
        stats.add_tx_cow_pages_protected(protected.pages() as u64);
        if !h.is_empty() {
            stats.fallback(FallbackReason::Unaligned, h.len() as u64);
            if let Err(e) = plain::send_all(fd, h, stats, timeout) {
                self.done.push(protected);
                self.release_done(stats);
                return Err(e);
            }
        }
        let (first, result) = self.send_zerocopy(fd, span, stats);
        let sent_zc = self.completions.next_id() > first;
        if sent_zc {
            stats.add_tx_cow_bytes_protected(span.len() as u64);
        }
        self.lend(Loan::Span(protected), first, stats);
        result?;
        if !tail.is_empty() {
            stats.fallback(FallbackReason::Unaligned, tail.len() as u64);
            plain::send_all(fd, tail, stats, timeout)?;
        }
        self.reap(fd, stats)?;
        Ok(())
    }

    fn reap(&mut self, fd: BorrowedFd<'_>, stats: &Stats) -> Result<usize> {
        let released = reap_completions(
            fd,
            &mut self.entries,
            &mut self.completions,
            &mut self.demotion,
            self.policy,
            stats,
        )?;
        let n = released.len();
        for loan in released {
            self.give_back(loan);
        }
        self.release_done(stats);
        Ok(n)
    }

    fn wait(&mut self, fd: BorrowedFd<'_>, stats: &Stats, timeout: Duration) -> Result<usize> {
        let released = self.reap(fd, stats)?;
        if released > 0 || self.completions.is_idle() {
            return Ok(released);
        }
        poll_errqueue(fd, timeout, || self.reap(fd, stats))
    }

    fn buffers_in_flight(&self) -> usize {
        self.completions.loans_in_flight()
    }

    fn abandon(&mut self) -> usize {
        self.abandon_spans()
    }
}

impl Drop for CowTx {
    fn drop(&mut self) {
        // Normally empty (Sender::drop waits, then abandons); never leave pages protected.
        if self.completions.loans_in_flight() > 0 {
            self.abandon_spans();
        }
    }
}
