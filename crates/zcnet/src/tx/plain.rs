//! The copying `send(2)` loop: the whole work of the `copy` path, and where every other
//! path's fallback bytes go.

use crate::error::{Error, Result};
use crate::stats::Stats;
use std::os::fd::BorrowedFd;
use std::time::Duration;
use zcnet_sys::raw::socket::{PollFlags, SendFlags};

/// Sends all of `data`, continuing short sends and retrying `EINTR`, within the running
/// call's deadline (`timeout` from now outside a call; `crate::call`): with a bound each
/// `send` is `MSG_DONTWAIT` and the waits are ours, so the whole call ends on time; a
/// non-blocking socket gives [`Error::WouldBlock`] with the bytes queued so far.
pub(crate) fn send_all(
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
    while off < data.len() {
        match crate::fault::send(fd, &data[off..], flags) {
            Ok(n) => {
                off += n;
                stats.add_tx_copy_bytes(n as u64);
                stats.add_tx_copy_calls(1);
            }
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                if d.expired() {
                    return Err(d.timed_out("send", off as u64));
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                d.wait_fd(fd, PollFlags::OUT, "send", off as u64)?
            }
            Err(e) => return Err(Error::io("send", e)),
        }
    }
    Ok(())
}
