//! The `file` transmit path: a range of a file to the socket without passing through user
//! memory — the Solaris paper's FTP test, where the file's pages go straight to the network.
//!
//! * [`FileTxMode::Sendfile`] (default) — `sendfile(2)`: the kernel hands page-cache pages to
//!   the socket by reference. Findings §4: half the sender CPU of read+send on this host
//!   (0.17 vs 0.36 s/GiB from tmpfs over loopback).
//! * [`FileTxMode::Splice`] — `splice(2)` file → pipe → socket: the same page references
//!   through a pipe we own; slightly dearer than sendfile here, useful where sendfile is not
//!   allowed and as the mirror of the receive path.
//! * [`FileTxMode::ReadSend`] — `pread` into a page-aligned buffer, then `send`: the baseline,
//!   and what the other two fall back to.
//!
//! Either zero-copy mode continues short transfers until the whole range is out and retries
//! `EINTR`, within the call's deadline (`crate::call`): before each call the socket's
//! `SO_SNDTIMEO` is set to what is left of it, so a stalled peer ends the call on time with
//! [`Error::Timeout`]; on a non-blocking socket `EAGAIN` is [`Error::WouldBlock`], with
//! the bytes sent so far, as on every other path.
//! Where the file refuses (`EINVAL`, `ENOSYS`, `EOPNOTSUPP`: no `splice_read`, as for
//! /proc/self/cmdline and many other /proc files), the rest of the range goes by read+send
//! and is counted as [`FallbackReason::FileUnsupported`]. A file that ends before the range
//! does is an [`Error::Truncated`] naming how much went out — never a short transfer that
//! looks complete.

use super::{range_end, refused, sized_pipe};
use crate::error::{Error, Result};
use crate::path::FallbackReason;
use crate::path::FileTxMode;
use crate::stats::Stats;
use crate::tx::plain::send_all;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::time::Duration;
use zcnet_sys::mem::PageBuf;
use zcnet_sys::raw::socket::PollFlags;
use zcnet_sys::raw::splice::{self, Pipe, SpliceFlags};

/// Bytes per `sendfile` call: large enough that the call count is noise, small enough that a
/// signal or a timeout is noticed between calls.
const SENDFILE_CHUNK: usize = 4 << 20;
/// The read+send buffer: page-aligned and pre-faulted like a pool buffer, but the file path's
/// own, so a file send never waits for zero-copy loans to come back.
const SCRATCH_BYTES: usize = 256 * 1024;

/// Refuses a range that ends past the end of a regular file before anything is sent. A size
/// of 0 is not trusted: /proc files report 0 and still have content, so for them (and for
/// character devices) the end is found when a read returns nothing.
fn check_source(file: &File, offset: u64, len: u64) -> Result<()> {
    let end = range_end(offset, len)?;
    let meta = file.metadata().map_err(|e| Error::io("fstat", e))?;
    if meta.is_file() && meta.len() > 0 && end > meta.len() {
        return Err(Error::RangeBeyondEof {
            offset,
            len,
            file_len: meta.len(),
        });
    }
    Ok(())
}

fn truncated(expected: u64, got: u64) -> Error {
    Error::Truncated {
        op: "the file being sent",
        expected,
        got,
    }
}

/// The file path's state on one socket: a pipe for splice and a buffer for read+send, each
/// made on first use and kept for the next file.
#[derive(Debug, Default)]
pub(crate) struct FileTx {
    pipe: Option<(Pipe, usize)>,
    scratch: Option<PageBuf>,
}

/// Where one zero-copy attempt ended.
enum Progress {
    /// The whole range went out.
    Done,
    /// The kernel refused after `sent` bytes; the rest must be copied.
    Refused { sent: u64 },
}

impl FileTx {
    /// Sends `file[offset..offset+len]` to `sock` with `mode`; returns `len`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn send(
        &mut self,
        sock: BorrowedFd<'_>,
        file: &File,
        offset: u64,
        len: u64,
        mode: FileTxMode,
        stats: &Stats,
        timeout: Duration,
    ) -> Result<u64> {
        check_source(file, offset, len)?;
        if len == 0 {
            return Ok(0);
        }
        // Read-ahead hint for the page cache; purely advisory, so its failure is ignored.
        let _ = splice::fadvise(file.as_fd(), offset, len, splice::Advice::Sequential);
        let progress = match mode {
            FileTxMode::Sendfile => sendfile_range(sock, file, offset, len, stats, timeout)?,
            FileTxMode::Splice => self.splice_range(sock, file, offset, len, stats, timeout)?,
            FileTxMode::ReadSend => {
                read_send(
                    &mut self.scratch,
                    sock,
                    file,
                    offset,
                    len,
                    (len, 0),
                    stats,
                    timeout,
                )?;
                Progress::Done
            }
        };
        if let Progress::Refused { sent } = progress {
            stats.fallback(FallbackReason::FileUnsupported, len - sent);
            read_send(
                &mut self.scratch,
                sock,
                file,
                offset + sent,
                len - sent,
                (len, sent),
                stats,
                timeout,
            )?;
        }
        Ok(len)
    }

    /// file → pipe → socket. The pipe is dropped whenever a step fails with bytes still in
    /// it, so no stale byte can leak into a later transfer.
    fn splice_range(
        &mut self,
        sock: BorrowedFd<'_>,
        file: &File,
        offset: u64,
        len: u64,
        stats: &Stats,
        timeout: Duration,
    ) -> Result<Progress> {
        if self.pipe.is_none() {
            self.pipe = Some(sized_pipe()?);
        }
        let mut done = 0u64;
        let d = crate::call::deadline(timeout);
        while done < len {
            let Some((pipe, cap)) = self.pipe.as_mut() else {
                unreachable!("pipe made above and only dropped on return");
            };
            let want = bounded_chunk(sock, &d, (len - done).min(*cap as u64) as usize);
            let n = match splice::splice(
                file.as_fd(),
                Some(offset + done),
                pipe.write_end(),
                None,
                want,
                SpliceFlags::MOVE,
            ) {
                Ok(0) => return Err(truncated(len, done)),
                Ok(n) => n,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                    if d.expired() {
                        return Err(d.timed_out("splice (file → pipe)", done));
                    }
                    continue;
                }
                Err(e) if refused(&e) => return Ok(Progress::Refused { sent: done }),
                Err(e) => return Err(Error::io("splice (file → pipe)", e)),
            };
            let mut left = n;
            while left > 0 {
                let more = if done + (n as u64) < len {
                    SpliceFlags::MORE
                } else {
                    SpliceFlags::empty()
                };
                let _armed = match d.arm_kernel(sock, true) {
                    Ok(armed) => armed,
                    Err(e) => {
                        self.pipe = None;
                        return Err(e);
                    }
                };
                match splice::splice_to_socket(
                    pipe.read_end(),
                    sock,
                    left,
                    SpliceFlags::MOVE | more,
                ) {
                    Ok(0) => {
                        self.pipe = None;
                        return Err(Error::io(
                            "splice (pipe → socket)",
                            std::io::Error::other("moved nothing with bytes in the pipe"),
                        ));
                    }
                    Ok(m) => {
                        left -= m;
                        stats.add_tx_file_bytes(m as u64);
                        stats.add_tx_file_calls(1);
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                        if d.expired() {
                            self.pipe = None;
                            let sent = done + (n - left) as u64;
                            return Err(d.timed_out("splice (pipe → socket)", sent));
                        }
                        continue;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                        let sent = done + (n - left) as u64;
                        if let Err(e) =
                            d.wait_fd(sock, PollFlags::OUT, "splice (pipe → socket)", sent)
                        {
                            // The file's bytes still in the pipe were not sent: drop them;
                            // the error says where the stream stopped.
                            self.pipe = None;
                            return Err(e);
                        }
                    }
                    Err(e) if refused(&e) => {
                        // The socket refuses splice. The pipe only holds references to the
                        // file's pages: drop it and copy from the file where the socket
                        // stopped taking bytes.
                        self.pipe = None;
                        return Ok(Progress::Refused {
                            sent: done + (n - left) as u64,
                        });
                    }
                    Err(e) => {
                        self.pipe = None;
                        return Err(Error::io("splice (pipe → socket)", e));
                    }
                }
            }
            done += n as u64;
        }
        Ok(Progress::Done)
    }
}

/// With a bound on the call, what one `sendfile`/`splice` may take: no more than the
/// socket has room for (at least [`BOUNDED_MIN`]). The kernel's `SO_SNDTIMEO` bounds each
/// send *inside* such a call afresh, so a call of many megabytes into a socket that drains
/// slowly could run several timeouts long; one that fits the free space waits at most once.
/// Without a bound, `want` as it is.
fn bounded_chunk(sock: BorrowedFd<'_>, d: &crate::call::Deadline, want: usize) -> usize {
    if !d.dontwait() {
        return want;
    }
    let sndbuf = zcnet_sys::raw::socket::get_int(sock, libc::SOL_SOCKET, libc::SO_SNDBUF)
        .map_or(0, |b| b.max(0) as usize);
    let queued = zcnet_sys::raw::socket::outq(sock).unwrap_or(0);
    want.min(sndbuf.saturating_sub(queued).max(BOUNDED_MIN))
}

/// The least a bounded file send asks for per call (a few segments).
const BOUNDED_MIN: usize = 64 << 10;

fn scratch(slot: &mut Option<PageBuf>) -> Result<&mut PageBuf> {
    if slot.is_none() {
        *slot = Some(PageBuf::new(SCRATCH_BYTES).map_err(|e| Error::io("mmap (file buffer)", e))?);
    }
    Ok(slot.as_mut().expect("just made"))
}

/// `sendfile` until the range is out, or the file refuses.
fn sendfile_range(
    sock: BorrowedFd<'_>,
    file: &File,
    offset: u64,
    len: u64,
    stats: &Stats,
    timeout: Duration,
) -> Result<Progress> {
    let mut done = 0u64;
    let d = crate::call::deadline(timeout);
    while done < len {
        let want = bounded_chunk(sock, &d, (len - done).min(SENDFILE_CHUNK as u64) as usize);
        let _armed = d.arm_kernel(sock, true)?;
        match splice::sendfile(sock, file.as_fd(), offset + done, want) {
            Ok(0) => return Err(truncated(len, done)),
            Ok(n) => {
                done += n as u64;
                stats.add_tx_file_bytes(n as u64);
                stats.add_tx_file_calls(1);
            }
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                if d.expired() {
                    return Err(d.timed_out("sendfile", done));
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                d.wait_fd(sock, PollFlags::OUT, "sendfile", done)?
            }
            Err(e) if refused(&e) => return Ok(Progress::Refused { sent: done }),
            Err(e) => return Err(Error::io("sendfile", e)),
        }
    }
    Ok(Progress::Done)
}

/// `pread` + `send` of `file[pos..pos+len]`. `(expected, before)` place this piece in the
/// whole request, for the truncation error.
#[allow(clippy::too_many_arguments)]
fn read_send(
    slot: &mut Option<PageBuf>,
    sock: BorrowedFd<'_>,
    file: &File,
    pos: u64,
    len: u64,
    (expected, before): (u64, u64),
    stats: &Stats,
    timeout: Duration,
) -> Result<()> {
    let buf = scratch(slot)?;
    let mut done = 0u64;
    while done < len {
        let want = (len - done).min(buf.len() as u64) as usize;
        let n = match file.read_at(&mut buf.as_mut_slice()[..want], pos + done) {
            Ok(0) => return Err(truncated(expected, before + done)),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io("pread", e)),
        };
        send_all(sock, &buf.as_slice()[..n], stats, timeout)?;
        done += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::{PIPE_MAX, PIPE_MIN};

    #[test]
    fn modes_have_names_and_parse_back() {
        for m in FileTxMode::ALL {
            assert_eq!(m.name().parse::<FileTxMode>().unwrap(), m);
        }
        assert_eq!(FileTxMode::default(), FileTxMode::Sendfile);
        assert!("mmap".parse::<FileTxMode>().is_err());
    }

    #[test]
    fn range_end_refuses_offsets_past_off_t() {
        assert_eq!(range_end(5, 10).unwrap(), 15);
        assert!(range_end(i64::MAX as u64, 1).is_err());
        assert!(range_end(u64::MAX, 1).is_err());
    }

    #[test]
    fn the_pipe_is_sized_up() {
        let (p, cap) = sized_pipe().unwrap();
        assert_eq!(p.size().unwrap(), cap);
        let max = splice::pipe_max_size().unwrap_or(PIPE_MIN);
        assert!(
            cap >= max.min(PIPE_MAX),
            "pipe {cap} B, pipe-max-size {max} B"
        );
    }
}
