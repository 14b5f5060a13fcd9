//! The copy receive path: `recv(2)`.

use super::{Receive, RxChunk};
use crate::error::{Error, Result};
use crate::stats::Stats;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

/// `recv` into `buf`, retrying `EINTR`; `EAGAIN` means `SO_RCVTIMEO` (`timeout`) ran out.
/// Signals restart the kernel's timer, so the wait is also bounded here.
pub fn recv_some(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    stats: &Stats,
    timeout: Duration,
) -> Result<usize> {
    if buf.is_empty() {
        return Ok(0);
    }
    let start = Instant::now();
    loop {
        match crate::fault::recv(fd, buf, zcnet_sys::raw::socket::RecvFlags::empty()) {
            Ok(n) => {
                stats.add_rx_copied_bytes(n as u64);
                return Ok(n);
            }
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                if start.elapsed() >= timeout {
                    return Err(Error::timeout("recv", timeout));
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                return Err(Error::eagain(fd, "recv", 0, timeout))
            }
            Err(e) => return Err(Error::io("recv", e)),
        }
    }
}

/// The copy path: one owned buffer, refilled by each `recv`.
#[derive(Debug)]
pub struct CopyRx {
    buf: Vec<u8>,
    timeout: Duration,
}

impl CopyRx {
    pub(crate) fn new(buf_bytes: usize, timeout: Duration) -> Self {
        CopyRx {
            buf: vec![0; buf_bytes.max(1)],
            timeout,
        }
    }
}

impl Receive for CopyRx {
    fn recv<'a>(&'a mut self, fd: BorrowedFd<'_>, stats: &Stats) -> Result<Option<RxChunk<'a>>> {
        let n = recv_some(fd, &mut self.buf, stats, self.timeout)?;
        Ok((n > 0).then(|| RxChunk::new(&self.buf[..n], false)))
    }

    fn recv_into(&mut self, fd: BorrowedFd<'_>, buf: &mut [u8], stats: &Stats) -> Result<usize> {
        recv_some(fd, buf, stats, self.timeout)
    }

    /// Every `recv` hands out all it read, so nothing is ever held: the socket is free.
    fn socket_handover_ok(&self) -> bool {
        true
    }
}
