//! The copying `send(2)` loop: the whole work of the `copy` path, and where every other
//! path's fallback bytes go.

use crate::error::{Error, Result};
use crate::stats::Stats;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

/// Sends all of `data`, continuing short sends and retrying `EINTR`. `EAGAIN` on a blocking
/// socket means its `SO_SNDTIMEO` (`timeout`) ran out. A signal restarts the kernel's
/// timer, so a steady stream of signals could keep a stalled send alive forever; the time
/// since the last progress is therefore checked here too.
pub fn send_all(fd: BorrowedFd<'_>, data: &[u8], stats: &Stats, timeout: Duration) -> Result<()> {
    let mut off = 0;
    let mut progress = Instant::now();
    while off < data.len() {
        match crate::fault::send(fd, &data[off..], zcnet_sys::raw::socket::SendFlags::empty()) {
            Ok(n) => {
                off += n;
                progress = Instant::now();
                stats.add_tx_copy_bytes(n as u64);
                stats.add_tx_copy_calls(1);
            }
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                if progress.elapsed() >= timeout {
                    return Err(Error::timeout("send", timeout));
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                return Err(Error::eagain(fd, "send", off as u64, timeout))
            }
            Err(e) => return Err(Error::io("send", e)),
        }
    }
    Ok(())
}
