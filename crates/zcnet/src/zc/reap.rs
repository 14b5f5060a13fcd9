//! Reading `MSG_ZEROCOPY` notifications off the socket error queue and applying them.

use super::completion::Completions;
use crate::auto::AutoStats;
use crate::error::{Error, Result};
use crate::policy::{CopiedDemotion, DemotionChange, Policy};
use crate::stats::Stats;
use std::os::fd::BorrowedFd;
use std::time::Duration;
use zcnet_sys::raw::socket;
use zcnet_sys::raw::zerocopy as zc;

/// Waits up to `timeout` for the error queue to signal (`POLLERR`), then runs `reap`; shared
/// by the paths that read `MSG_ZEROCOPY` completions. A pending socket error also raises
/// `POLLERR` (the next send or recv reports it), so an empty reap sleeps briefly instead of
/// spinning on it.
pub(crate) fn poll_errqueue(
    fd: BorrowedFd<'_>,
    timeout: Duration,
    mut reap: impl FnMut() -> Result<usize>,
) -> Result<usize> {
    match socket::poll(
        fd,
        zcnet_sys::raw::socket::PollFlags::empty(),
        Some(timeout),
    ) {
        Ok(ev) if ev.contains(zcnet_sys::raw::socket::PollFlags::ERR) => {
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

/// Drains the error queue without blocking and applies every zero-copy notification:
/// calls marked done, COPIED bytes and demotions counted (by `policy`'s limits, in
/// notifications and in the bytes they cover). Returns the loans that came free.
pub(crate) fn reap_completions<T>(
    fd: BorrowedFd<'_>,
    entries: &mut Vec<zc::ErrqueueEntry>,
    completions: &mut Completions<T>,
    demotion: &mut CopiedDemotion,
    policy: Policy,
    stats: &Stats,
) -> Result<Vec<T>> {
    let mut released = Vec::new();
    reap_each(
        fd,
        entries,
        completions,
        demotion,
        policy,
        stats,
        |item, _copied| released.push(item),
    )?;
    Ok(released)
}

/// `reap_completions` that hands each freed loan to `release` together with whether the
/// notification that freed it said the kernel copied the data anyway
/// (`SO_EE_CODE_ZEROCOPY_COPIED`). Returns the number of error-queue messages read.
///
/// Public so that an async front end (the `zcnet-tokio` crate) drains completions with the
/// same accounting as the blocking paths, and can tell each caller whether its own buffer
/// was copied, instead of keeping a second copy of this loop.
pub fn reap_each<T>(
    fd: BorrowedFd<'_>,
    entries: &mut Vec<zc::ErrqueueEntry>,
    completions: &mut Completions<T>,
    demotion: &mut CopiedDemotion,
    policy: Policy,
    stats: &Stats,
    mut release: impl FnMut(T, bool),
) -> Result<usize> {
    entries.clear();
    // Notification ranges never overlap, so once the ranges read cover as many calls as
    // were outstanding, the queue holds no more completions: stop without the `EAGAIN`
    // read. Anything else queued (an ICMP error) is read by the next drain.
    let outstanding = completions.calls_in_flight() as u64;
    let n = crate::fault::read_errqueue(fd, entries, |read| {
        outstanding > 0 && notified_calls(read) >= outstanding
    })
    .map_err(|e| Error::io("recvmsg(MSG_ERRQUEUE)", e))?;
    for entry in entries.iter() {
        if let zc::ErrqueueEntry::Zerocopy { lo, hi, copied } = *entry {
            stats.add_tx_notifications(1);
            let done = completions.complete(lo, hi)?;
            stats.add_tx_completed_calls(done.calls);
            if copied {
                stats.add_tx_zc_copied_bytes(done.bytes);
            }
            demotion.count_notified(copied, done.bytes, &policy, stats);
            for item in done.released {
                release(item, copied);
            }
        }
    }
    Ok(n)
}

/// How many calls the zero-copy notifications in `entries` cover.
fn notified_calls(entries: &[zc::ErrqueueEntry]) -> u64 {
    entries
        .iter()
        .map(|e| match *e {
            zc::ErrqueueEntry::Zerocopy { lo, hi, .. } => u64::from(hi.wrapping_sub(lo)) + 1,
            zc::ErrqueueEntry::Other(_) => 0,
        })
        .sum()
}

impl CopiedDemotion {
    /// Counts a send of `bytes` in the demotion (`zerocopy`: it went with `MSG_ZEROCOPY`;
    /// `idle`: no zero-copy call is still waiting for its notification) and what it changed
    /// in `stats`, as [`reap_each`] does for notifications: runs a demoted socket's back-off
    /// down — a retry starts only once the calls sent before the demotion are all notified,
    /// so their COPIED notifications are never taken for the retry's — and a retry's
    /// zero-copy window. For a sender that drives its own sends (zcnet-tokio's streams);
    /// [`CopiedDemotion::is_demoted`] then says whether the next one may ask for zero-copy.
    pub fn count_send(
        &mut self,
        bytes: u64,
        zerocopy: bool,
        idle: bool,
        policy: &Policy,
        stats: &Stats,
    ) {
        count_change(self.sent(bytes, zerocopy, idle, policy), stats);
    }

    /// Counts a notification that completed `bytes` (`copied`: it said
    /// `SO_EE_CODE_ZEROCOPY_COPIED`) in the demotion, and what it changed in `stats`, as
    /// [`reap_each`] does for the notifications it reads. For a sender that reads its own
    /// notifications, not through the error queue (an io_uring ring's `SEND_ZC`
    /// notifications: `zcnet-msg`'s `MsgRing`).
    pub fn count_notified(&mut self, copied: bool, bytes: u64, policy: &Policy, stats: &Stats) {
        count_change(self.notified(copied, bytes, policy), stats);
    }
}

/// Counts what a notification or a send changed in a socket's [`CopiedDemotion`]: every
/// demotion in `tx_demotions`, the retries and their outcomes in `auto_tx` (`retries`,
/// `promotions`, `redemotions`), as `auto`'s own demotion counts them.
fn count_change(change: DemotionChange, stats: &Stats) {
    let mut delta = AutoStats::default();
    match change {
        DemotionChange::None => return,
        DemotionChange::Demoted => {
            stats.add_tx_demotions(1);
            return;
        }
        DemotionChange::Retry => delta.retries = 1,
        DemotionChange::Promoted => delta.promotions = 1,
        DemotionChange::Redemoted => {
            stats.add_tx_demotions(1);
            delta.redemotions = 1;
        }
    }
    stats.add_auto_tx(&delta);
}
