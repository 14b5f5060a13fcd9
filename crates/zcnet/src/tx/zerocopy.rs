//! The `MSG_ZEROCOPY` transmit path.
//!
//! Per send: the [`Policy`] decides (size, alignment, demotion, with a retry after the
//! policy's back-off: every send is counted in the demotion); a zero-copy send is
//! continued until every byte is queued, each successful call taking the next notification
//! id; the buffer is lent to the [`Completions`] bookkeeping and comes back when every call
//! that named it is done. Completions are drained with non-blocking reads after each send,
//! so the data path never waits for them unless the pool runs dry.
//!
//! `ENOBUFS` (the per-socket option-memory limit, `net.core.optmem_max`) queues nothing and
//! the kernel does not fall back by itself: we reap and retry a few times, then send the rest
//! by copying, counted as [`FallbackReason::Enobufs`].

use super::plain;
use crate::buf::TxBuf;
use crate::error::{Error, Result};
use crate::lend::{Lend, Lent, Owned};
use crate::path::FallbackReason;
use crate::policy::{CopiedDemotion, Policy};
use crate::stats::Stats;
use crate::zc::completion::Completions;
use crate::zc::reap::{poll_errqueue, reap_completions};
use std::os::fd::BorrowedFd;
use std::time::Duration;
use zcnet_sys::mem::page_size;
use zcnet_sys::raw::socket::{PollFlags, SendFlags};
use zcnet_sys::raw::zerocopy as zc;

/// Attempts at a zero-copy send after `ENOBUFS` (each after reaping) before copying.
const ENOBUFS_RETRIES: u32 = 3;

/// State of the zero-copy path on one socket.
#[derive(Debug)]
pub(crate) struct ZerocopyTx {
    completions: Completions<Lent>,
    demotion: CopiedDemotion,
    policy: Policy,
    timeout: Duration,
    entries: Vec<zc::ErrqueueEntry>,
    /// `SO_ZEROCOPY` could not be enabled: every send is copied and counted.
    unsupported: bool,
}

impl ZerocopyTx {
    /// Path state for a socket on which `SO_ZEROCOPY` was (or, with `unsupported`, could
    /// not be) enabled.
    pub(crate) fn new(policy: Policy, timeout: Duration, unsupported: bool) -> Self {
        ZerocopyTx {
            completions: Completions::new(),
            demotion: CopiedDemotion::default(),
            policy,
            timeout,
            entries: Vec::new(),
            unsupported,
        }
    }

    /// Why `data` must copy, if it must.
    fn refuses(&self, data: &[u8]) -> Option<FallbackReason> {
        if self.unsupported {
            return Some(FallbackReason::Unsupported);
        }
        self.policy.refuses(
            data.len(),
            data.as_ptr() as usize,
            page_size(),
            self.demotion.is_demoted(),
        )
    }

    /// Sends a loan's bytes with `MSG_ZEROCOPY` (or copies them, counted, where the policy
    /// says so) and keeps the loan until every call that named it is complete.
    fn lend(&mut self, fd: BorrowedFd<'_>, lent: Lent, stats: &Stats) -> Result<()> {
        let len = lent.len() as u64;
        if let Some(reason) = self.refuses(&lent) {
            stats.fallback(reason, len);
            if self.demotion.counts_sends() && !self.completions.is_idle() {
                // A retry waits until every call before it is notified, and a copying
                // send reads no completions by itself: a notification that arrived after the
                // last zero-copy send's reap (a loaded machine) was never read, and the
                // socket stayed demoted for good. One non-blocking read per copy, only
                // while calls are outstanding.
                super::Transmit::reap(self, fd, stats)?;
            }
            let idle = self.completions.is_idle();
            self.demotion
                .count_send(len, false, idle, &self.policy, stats);
            return plain::send_all(fd, &lent, stats, self.timeout);
        }
        let first = self.completions.next_id();
        let timeout = self.timeout;
        let result = send_all_zerocopy(self, fd, &lent, stats, timeout);
        // Lend the buffer even on error: calls that did go out still reference its pages.
        let next = self.completions.next_id();
        if next > first {
            if let Some(back) = self.completions.lend(lent, first, next - 1) {
                drop(back);
            }
        }
        let idle = self.completions.is_idle();
        self.demotion
            .count_send(len, true, idle, &self.policy, stats);
        result?;
        super::Transmit::reap(self, fd, stats)?;
        Ok(())
    }
}

impl ZerocopyCalls for ZerocopyTx {
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

impl super::Transmit for ZerocopyTx {
    fn send_buf(&mut self, fd: BorrowedFd<'_>, buf: TxBuf, stats: &Stats) -> Result<()> {
        self.lend(fd, Lent::Pool(buf), stats)
    }

    fn send_lent(
        &mut self,
        fd: BorrowedFd<'_>,
        owned: Box<dyn Lend>,
        stats: &Stats,
        _timeout: Duration,
    ) -> Result<()> {
        self.lend(fd, Lent::Owned(Owned(owned)), stats)
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
        Ok(released.len())
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
        let held = self.completions.abandon();
        let n = held.len();
        held.into_iter().for_each(Lent::retire);
        n
    }
}

/// What [`send_all_zerocopy`] needs from a path that sends with `MSG_ZEROCOPY` (the
/// `zerocopy` and `cow` paths keep different loans but number calls the same way).
pub(crate) trait ZerocopyCalls {
    /// Records one successful zero-copy call of `bytes` (it took the next notification id).
    fn record_call(&mut self, bytes: usize);
    /// Waits up to `pause` for completions, so option memory frees up after `ENOBUFS`.
    fn wait_for_completions(
        &mut self,
        fd: BorrowedFd<'_>,
        stats: &Stats,
        pause: Duration,
    ) -> Result<usize>;
}

/// Sends all of `data` with `MSG_ZEROCOPY`, continuing short sends and retrying `EINTR`.
/// `ENOBUFS` queues nothing and the kernel does not fall back by itself: reap and retry
/// [`ENOBUFS_RETRIES`] times, then send the rest by copying, counted as
/// [`FallbackReason::Enobufs`]. The caller lends the pages to its bookkeeping afterwards
/// even on error, since calls that did go out still reference them.
pub(crate) fn send_all_zerocopy(
    path: &mut impl ZerocopyCalls,
    fd: BorrowedFd<'_>,
    data: &[u8],
    stats: &Stats,
    timeout: Duration,
) -> Result<()> {
    let d = crate::call::deadline(timeout);
    let flags = if d.dontwait() {
        SendFlags::DONTWAIT
    } else {
        SendFlags::empty()
    };
    let mut off = 0;
    let mut enobufs = 0;
    while off < data.len() {
        match crate::fault::send_zerocopy(fd, &data[off..], flags) {
            Ok(n) => {
                path.record_call(n);
                stats.add_tx_zerocopy_bytes(n as u64);
                stats.add_tx_zerocopy_calls(1);
                off += n;
                enobufs = 0;
            }
            Err(e) => match e.raw_os_error() {
                Some(libc::EINTR) if d.expired() => {
                    return Err(d.timed_out("send(MSG_ZEROCOPY)", off as u64))
                }
                Some(libc::EINTR) => continue,
                Some(libc::ENOBUFS) => {
                    stats.add_tx_enobufs(1);
                    if enobufs < ENOBUFS_RETRIES {
                        enobufs += 1;
                        path.wait_for_completions(fd, stats, Duration::from_millis(1 << enobufs))?;
                    } else {
                        stats.fallback(FallbackReason::Enobufs, (data.len() - off) as u64);
                        return plain::send_all(fd, &data[off..], stats, timeout);
                    }
                }
                Some(libc::EAGAIN) => {
                    d.wait_fd(fd, PollFlags::OUT, "send(MSG_ZEROCOPY)", off as u64)?
                }
                _ => return Err(Error::io("send(MSG_ZEROCOPY)", e)),
            },
        }
    }
    Ok(())
}
