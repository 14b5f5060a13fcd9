//! Transmit paths: one module per path, one small trait they share.
//!
//! * [`copy`] — `send(2)`: the baseline every measurement is against.
//! * [`auto`] — per operation one of the others, as the host profile says ([`crate::auto`]).
//! * [`zerocopy`] — `MSG_ZEROCOPY`, buffers held until the error-queue completion covers them.
//! * [`cow`] — `MSG_ZEROCOPY` for `send_slice` callers: their pages write-protected while in
//!   flight, a write fault giving the writer a private copy (Solaris's copy-on-write).
//! * [`uring`] — io_uring `SEND_ZC` from the pool registered as fixed buffers, buffers held
//!   until each request's notification CQE.
//! * Files go by [`crate::file::send`]: not a [`TxPath`](crate::TxPath), since they are sent from the page
//!   cache, not from loaned buffers.

pub(crate) mod auto;
pub(crate) mod copy;
pub(crate) mod cow;
pub(crate) mod plain;
pub(crate) mod uring;
pub(crate) mod zerocopy;

use crate::buf::TxBuf;
use crate::error::Result;
use crate::lend::Lend;
use crate::path::FallbackReason;
use crate::stats::Stats;
use std::os::fd::BorrowedFd;
use std::time::Duration;

/// What every transmit path does with a loaned buffer.
pub(crate) trait Transmit: Send {
    /// Sends all of `buf`'s selected bytes (continuing short sends) and keeps `buf` until
    /// the kernel no longer references its pages.
    fn send_buf(&mut self, fd: BorrowedFd<'_>, buf: TxBuf, stats: &Stats) -> Result<()>;

    /// Sends `data` with copy semantics: the caller may reuse `data` as soon as this returns.
    /// Plain `send` unless the path can do better without breaking that promise (`cow`).
    fn send_slice(
        &mut self,
        fd: BorrowedFd<'_>,
        data: &[u8],
        stats: &Stats,
        timeout: Duration,
    ) -> Result<()> {
        plain::send_all(fd, data, stats, timeout)
    }

    /// Sends the caller's own memory ([`crate::Sender::send_lent`]) and keeps it until the
    /// kernel is done with it. Paths that can only send from their own memory (io_uring's
    /// registered buffers, `cow`'s protected slices) copy it instead, counted as
    /// [`FallbackReason::Unsupported`]; the `zerocopy` path lends it.
    fn send_lent(
        &mut self,
        fd: BorrowedFd<'_>,
        owned: Box<dyn Lend>,
        stats: &Stats,
        timeout: Duration,
    ) -> Result<()> {
        let data = owned.bytes();
        stats.fallback(FallbackReason::Unsupported, data.len() as u64);
        plain::send_all(fd, data, stats, timeout)
    }

    /// Reads completions without blocking; returns how many buffers went back.
    fn reap(&mut self, fd: BorrowedFd<'_>, stats: &Stats) -> Result<usize>;

    /// Waits up to `timeout` for a completion to arrive, then reaps.
    fn wait(&mut self, fd: BorrowedFd<'_>, stats: &Stats, timeout: Duration) -> Result<usize>;

    /// Buffers the kernel still holds.
    fn buffers_in_flight(&self) -> usize;

    /// The socket is gone or stuck: give up on the held buffers. Their storage is unmapped
    /// rather than returned to the pool, since the kernel may still read it.
    fn abandon(&mut self) -> usize;
}
