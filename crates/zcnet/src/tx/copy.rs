//! The copy transmit path: `send(2)`, continued until every byte is queued.

use crate::buf::TxBuf;
use crate::error::{Error, Result};
use crate::stats::Stats;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};
use zcnet_sys::raw::socket;

/// Sends all of `data`, continuing short sends and retrying `EINTR`. `EAGAIN` on a blocking
/// socket means its `SO_SNDTIMEO` (`timeout`) ran out. A signal restarts the kernel's
/// timer, so a steady stream of signals could keep a stalled send alive forever; the time
/// since the last progress is therefore checked here too.
pub fn send_all(fd: BorrowedFd<'_>, data: &[u8], stats: &Stats, timeout: Duration) -> Result<()> {
    let mut off = 0;
    let mut progress = Instant::now();
    while off < data.len() {
        match socket::send(fd, &data[off..], 0) {
            Ok(n) => {
                off += n;
                progress = Instant::now();
                stats.add_tx_copy_bytes(n as u64);
                stats.add_tx_copy_calls(1);
            }
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                if progress.elapsed() >= timeout {
                    return Err(Error::Timeout {
                        op: "send",
                        after: timeout,
                    });
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                return Err(Error::Timeout {
                    op: "send",
                    after: timeout,
                })
            }
            Err(e) => return Err(Error::io("send", e)),
        }
    }
    Ok(())
}

/// The copy path as a `Transmit` implementation: the buffer is free as soon as `send` returns.
#[derive(Debug)]
pub struct CopyTx {
    pub(crate) timeout: Duration,
}

impl super::Transmit for CopyTx {
    fn send_buf(&mut self, fd: BorrowedFd<'_>, buf: TxBuf, stats: &Stats) -> Result<()> {
        send_all(fd, &buf, stats, self.timeout)
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
