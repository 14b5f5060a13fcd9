//! The `MSG_ZEROCOPY` transmit path.
//!
//! Per send: the [`Policy`] decides (size, alignment, demotion); a zero-copy send is
//! continued until every byte is queued, each successful call taking the next notification
//! id; the buffer is lent to the [`Completions`] bookkeeping and comes back when every call
//! that named it is done. Completions are drained with non-blocking reads after each send,
//! so the data path never waits for them unless the pool runs dry.
//!
//! `ENOBUFS` (the per-socket option-memory limit, `net.core.optmem_max`) queues nothing and
//! the kernel does not fall back by itself: we reap and retry a few times, then send the rest
//! by copying, counted as [`FallbackReason::Enobufs`].

use super::copy;
use crate::buf::TxBuf;
use crate::completion::Completions;
use crate::error::{Error, Result};
use crate::policy::{CopiedDemotion, Policy, TxDecision};
use crate::stats::{FallbackReason, Stats};
use crate::sys::{mem::page_size, socket, zerocopy as zc};
use std::os::fd::BorrowedFd;
use std::time::Duration;

/// Attempts at a zero-copy send after `ENOBUFS` (each after reaping) before copying.
const ENOBUFS_RETRIES: u32 = 3;

/// State of the zero-copy path on one socket.
#[derive(Debug)]
pub struct ZerocopyTx {
    completions: Completions<TxBuf>,
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

    fn decide(&self, buf: &TxBuf) -> TxDecision {
        if self.unsupported {
            return TxDecision::Copy(FallbackReason::Unsupported);
        }
        self.policy.decide(
            buf.len(),
            buf.data_addr(),
            page_size(),
            self.demotion.is_demoted(),
        )
    }
}

impl super::Transmit for ZerocopyTx {
    fn send_buf(&mut self, fd: BorrowedFd<'_>, buf: TxBuf, stats: &Stats) -> Result<()> {
        if let TxDecision::Copy(reason) = self.decide(&buf) {
            stats.fallback(reason, buf.len() as u64);
            return copy::send_all(fd, &buf, stats, self.timeout);
        }
        let first = self.completions.next_id();
        let mut off = 0;
        let mut enobufs = 0;
        let mut result = Ok(());
        while off < buf.len() {
            match zc::send_zerocopy(fd, &buf[off..], 0) {
                Ok(n) => {
                    self.completions.record_call(n);
                    stats.add_tx_zerocopy_bytes(n as u64);
                    stats.add_tx_zerocopy_calls(1);
                    off += n;
                    enobufs = 0;
                }
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::ENOBUFS) => {
                        stats.add_tx_enobufs(1);
                        if enobufs < ENOBUFS_RETRIES {
                            enobufs += 1;
                            let _ = self.wait(fd, stats, Duration::from_millis(1 << enobufs))?;
                        } else {
                            stats.fallback(FallbackReason::Enobufs, (buf.len() - off) as u64);
                            result = copy::send_all(fd, &buf[off..], stats, self.timeout);
                            break;
                        }
                    }
                    Some(libc::EAGAIN) => {
                        result = Err(Error::Timeout {
                            op: "send(MSG_ZEROCOPY)",
                            after: self.timeout,
                        });
                        break;
                    }
                    _ => {
                        result = Err(Error::io("send(MSG_ZEROCOPY)", e));
                        break;
                    }
                },
            }
        }
        // Lend the buffer even on error: calls that did go out still reference its pages.
        let next = self.completions.next_id();
        if next > first {
            if let Some(back) = self.completions.lend(buf, first, next - 1) {
                drop(back);
            }
        }
        result?;
        self.reap(fd, stats)?;
        Ok(())
    }

    fn reap(&mut self, fd: BorrowedFd<'_>, stats: &Stats) -> Result<usize> {
        self.entries.clear();
        zc::read_errqueue(fd, &mut self.entries)
            .map_err(|e| Error::io("recvmsg(MSG_ERRQUEUE)", e))?;
        let mut released = 0;
        for i in 0..self.entries.len() {
            if let zc::ErrqueueEntry::Zerocopy { lo, hi, copied } = self.entries[i] {
                stats.add_tx_notifications(1);
                let done = self.completions.complete(lo, hi)?;
                stats.add_tx_completed_calls(done.calls);
                if copied {
                    stats.add_tx_zc_copied_bytes(done.bytes);
                }
                if self
                    .demotion
                    .observe(copied, self.policy.demote_after_copied)
                {
                    stats.add_tx_demotions(1);
                }
                released += done.released.len();
            }
        }
        Ok(released)
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
        held.into_iter().for_each(TxBuf::retire);
        n
    }
}

/// Waits up to `timeout` for the error queue to signal (`POLLERR`), then runs `reap`; shared
/// by the paths that read `MSG_ZEROCOPY` completions. A pending socket error also raises
/// `POLLERR` (the next send or recv reports it), so an empty reap sleeps briefly instead of
/// spinning on it.
pub(crate) fn poll_errqueue(
    fd: BorrowedFd<'_>,
    timeout: Duration,
    mut reap: impl FnMut() -> Result<usize>,
) -> Result<usize> {
    match socket::poll(fd, 0, Some(timeout)) {
        Ok(ev) if ev & libc::POLLERR != 0 => {
            let n = reap()?;
            if n == 0 {
                std::thread::sleep(Duration::from_micros(200));
            }
            Ok(n)
        }
        Ok(_) => Ok(0),
        Err(e) if e.raw_os_error() == Some(libc::EINTR) => Ok(0),
        Err(e) => Err(Error::io("poll", e)),
    }
}
