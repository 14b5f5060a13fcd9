//! The copy transmit path: `send(2)`, continued until every byte is queued.

use super::plain::send_all;
use crate::buf::TxBuf;
use crate::error::Result;
use crate::lend::Lend;
use crate::stats::Stats;
use std::os::fd::BorrowedFd;
use std::time::Duration;

/// The copy path as a `Transmit` implementation: the buffer is free as soon as `send` returns.
#[derive(Debug)]
pub(crate) struct CopyTx {
    pub(crate) timeout: Duration,
}

impl super::Transmit for CopyTx {
    fn send_buf(&mut self, fd: BorrowedFd<'_>, buf: TxBuf, stats: &Stats) -> Result<()> {
        send_all(fd, &buf, stats, self.timeout)
    }

    /// The copy path copies by definition: no fallback to count.
    fn send_lent(
        &mut self,
        fd: BorrowedFd<'_>,
        owned: Box<dyn Lend>,
        stats: &Stats,
        timeout: Duration,
    ) -> Result<()> {
        send_all(fd, owned.bytes(), stats, timeout)
    }

    fn reap(&mut self, _fd: BorrowedFd<'_>, _stats: &Stats) -> Result<usize> {
        Ok(0)
    }

    fn wait(&mut self, _fd: BorrowedFd<'_>, _stats: &Stats, timeout: Duration) -> Result<usize> {
        // Nothing of ours is in flight; a buffer can only come back from another holder.
        std::thread::sleep(timeout.min(Duration::from_millis(1)));
        Ok(0)
    }

    fn buffers_in_flight(&self) -> usize {
        0
    }

    fn abandon(&mut self) -> usize {
        0
    }
}
