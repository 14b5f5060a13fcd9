//! The `file` receive path: the next bytes of the stream straight into a file range — the
//! design's "connect zero-copy network to another zero-copy I/O path".
//!
//! * [`FileRxMode::Splice`] (default) — `splice(2)` socket → pipe → file at the right offset
//!   (`off_out`, so the file position never moves). The bytes never enter user memory; the
//!   kernel still copies them once, from the socket's pages into the page cache (splice into
//!   a file is a copy; `SpliceFlags::MOVE` is a no-op). Findings §4: 20–50% less receiver CPU
//!   than recv+write on this host.
//! * [`FileRxMode::Write`] — the receiver's own path, then `pwrite`: recv+pwrite for a copy
//!   receiver; for an mmap receiver, "mapped receive plus write" — mapped pages are written
//!   from where they are mapped, with no user-space copy (`Receive::recv_lend`).
//!
//! Before either, what the receiver already holds from an earlier `recv`/`recv_into` (the
//! mmap path's leftover and copybuf tail) is written first, so the file gets the stream in
//! order whatever was read before. A receive path that cannot hand its socket over (one
//! with reads in flight) is never spliced around: it takes the `Write` way, counted as a
//! [`FallbackReason::FileUnsupported`], as is a file (or socket) that refuses splice
//! (`EINVAL`/`ENOSYS`/`EOPNOTSUPP`, e.g. procfs files without `splice_write`).
//!
//! The range is pre-sized with `fallocate(2)` (tmpfs and ext4 support it; tmpfs allocates —
//! and zeroes — the pages up front); where that is unsupported, the file is extended with
//! `ftruncate`, and where that fails too (pseudo-files), nothing is done. If the stream ends
//! before `len` bytes, the result is [`Error::Truncated`] with the count that arrived, and a
//! file we grew is cut back to the bytes actually written — never a silently short (or
//! zero-padded) file.

use super::{range_end, refused, sized_pipe};
use crate::error::{Error, Result};
use crate::path::FallbackReason;
use crate::path::FileRxMode;
use crate::rx::Receive;
use crate::stats::Stats;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::time::Duration;
use zcnet_sys::raw::socket::PollFlags;
use zcnet_sys::raw::splice::{self, Pipe, SpliceFlags};

/// The recv+pwrite buffer (made on first use).
const SCRATCH_BYTES: usize = 256 * 1024;

/// Refuses a file whose positional writes would not land where asked: on Linux, `pwrite` to
/// an `O_APPEND` file appends whatever the offset (pwrite(2), BUGS), and splice refuses it.
fn check_sink(file: &File) -> Result<()> {
    let flags = splice::status_flags(file.as_fd()).map_err(|e| Error::io("fcntl(F_GETFL)", e))?;
    if flags.contains(zcnet_sys::raw::splice::OFlags::APPEND) {
        return Err(Error::UnsuitableFile(
            "opened with O_APPEND: positional writes would append",
        ));
    }
    Ok(())
}

/// Pre-sizes `file` to cover `offset..end`. Returns the size before when the file grew (so
/// a failed receive can cut it back), `None` when it did not or could not.
fn preallocate(file: &File, offset: u64, len: u64, end: u64) -> Result<Option<u64>> {
    let meta = file.metadata().map_err(|e| Error::io("fstat", e))?;
    if !meta.is_file() {
        return Ok(None);
    }
    let before = meta.len();
    loop {
        match splice::fallocate(
            file.as_fd(),
            zcnet_sys::raw::splice::FallocateFlags::empty(),
            offset,
            len,
        ) {
            Ok(()) => return Ok((before < end).then_some(before)),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            // Out of space is known now rather than halfway through the stream.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) => {
                return Err(Error::io("fallocate", e))
            }
            // Unsupported here (EOPNOTSUPP on some file systems; ENODEV, ESPIPE, EFBIG on
            // pseudo-files): set the size at least, or leave the file alone.
            Err(_) => {
                return Ok((before < end && file.set_len(end).is_ok()).then_some(before));
            }
        }
    }
}

fn truncated(expected: u64, got: u64) -> Error {
    Error::Truncated {
        op: "the stream",
        expected,
        got,
    }
}

fn pwrite_all(file: &File, data: &[u8], pos: u64) -> Result<()> {
    file.write_all_at(data, pos)
        .map_err(|e| Error::io("pwrite", e))
}

/// The file path's state on one socket: a pipe for splice and a buffer for recv+pwrite,
/// each made on first use and kept for the next file.
#[derive(Debug, Default)]
pub(crate) struct FileRx {
    pipe: Option<(Pipe, usize)>,
    scratch: Vec<u8>,
}

/// Where the splice loop stopped early.
enum Progress {
    Done,
    /// Splicing is refused; the rest goes the `Write` way.
    Refused,
}

impl FileRx {
    /// Receives exactly `len` bytes into `file[offset..offset+len]`; returns `len`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn recv(
        &mut self,
        sock: BorrowedFd<'_>,
        rx: &mut dyn Receive,
        file: &File,
        offset: u64,
        len: u64,
        mode: FileRxMode,
        prealloc: bool,
        stats: &Stats,
        timeout: Duration,
    ) -> Result<u64> {
        let end = range_end(offset, len)?;
        check_sink(file)?;
        if len == 0 {
            return Ok(0);
        }
        let grown_from = if prealloc {
            preallocate(file, offset, len, end)?
        } else {
            None
        };
        let mut done = 0u64;
        let r = self.fill(sock, rx, file, offset, len, mode, stats, timeout, &mut done);
        if r.is_err() {
            if let Some(before) = grown_from {
                // Cut back what we grew to what arrived; the error says how much that is.
                let _ = file.set_len(before.max(offset + done));
            }
        }
        // A receive that stopped early (non-blocking, timed out) says how much of the range
        // is in the file, so the caller goes on from there.
        r.map(|()| len).map_err(|e| e.with_queued(done))
    }

    #[allow(clippy::too_many_arguments)]
    fn fill(
        &mut self,
        sock: BorrowedFd<'_>,
        rx: &mut dyn Receive,
        file: &File,
        offset: u64,
        len: u64,
        mode: FileRxMode,
        stats: &Stats,
        timeout: Duration,
        done: &mut u64,
    ) -> Result<()> {
        if mode == FileRxMode::Splice {
            rx.release_socket(sock, stats)?;
            if rx.socket_handover_ok() {
                // What the path already holds comes first in the stream.
                while *done < len {
                    let pos = offset + *done;
                    let max = usize::try_from(len - *done).unwrap_or(usize::MAX);
                    let n = rx.take_buffered(max, &mut |b| pwrite_all(file, b, pos))?;
                    if n == 0 {
                        break;
                    }
                    *done += n as u64;
                }
                if let Progress::Done =
                    self.splice_in(sock, rx, file, offset, len, stats, timeout, done)?
                {
                    return Ok(());
                }
            } else {
                stats.fallback(FallbackReason::FileUnsupported, len - *done);
            }
        }
        self.write_rest(sock, rx, file, offset, len, stats, done)
    }

    /// The `Write` way: the path's own receive, then `pwrite` at the right offset.
    #[allow(clippy::too_many_arguments)]
    fn write_rest(
        &mut self,
        sock: BorrowedFd<'_>,
        rx: &mut dyn Receive,
        file: &File,
        offset: u64,
        len: u64,
        stats: &Stats,
        done: &mut u64,
    ) -> Result<()> {
        if self.scratch.is_empty() {
            self.scratch = vec![0; SCRATCH_BYTES];
        }
        while *done < len {
            let pos = offset + *done;
            let max = usize::try_from(len - *done).unwrap_or(usize::MAX);
            let n = rx.recv_lend(sock, &mut self.scratch, max, stats, &mut |b| {
                pwrite_all(file, b, pos)
            })?;
            if n == 0 {
                return Err(truncated(len, *done));
            }
            *done += n as u64;
        }
        Ok(())
    }

    /// socket → pipe → file until `len`, or until splice is refused.
    #[allow(clippy::too_many_arguments)]
    fn splice_in(
        &mut self,
        sock: BorrowedFd<'_>,
        rx: &mut dyn Receive,
        file: &File,
        offset: u64,
        len: u64,
        stats: &Stats,
        timeout: Duration,
        done: &mut u64,
    ) -> Result<Progress> {
        if *done < len && self.pipe.is_none() {
            self.pipe = Some(sized_pipe()?);
        }
        let d = crate::call::deadline(timeout);
        while *done < len {
            let Some((pipe, cap)) = self.pipe.as_mut() else {
                unreachable!("pipe made above and only dropped on return");
            };
            // Never more than the range still wants: the bytes after it belong to the caller.
            let want = (len - *done).min(*cap as u64) as usize;
            let _armed = d.arm_kernel(sock, false)?;
            let n = match splice::splice(
                sock,
                None,
                pipe.write_end(),
                None,
                want,
                SpliceFlags::MOVE | SpliceFlags::MORE,
            ) {
                Ok(0) => return Err(truncated(len, *done)),
                Ok(n) => n,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                    if d.expired() {
                        return Err(d.timed_out("splice (socket → pipe)", 0));
                    }
                    continue;
                }
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                    d.wait_fd(sock, PollFlags::IN, "splice (socket → pipe)", 0)?;
                    continue;
                }
                Err(e) if refused(&e) => {
                    stats.fallback(FallbackReason::FileUnsupported, len - *done);
                    return Ok(Progress::Refused);
                }
                Err(e) => return Err(Error::io("splice (socket → pipe)", e)),
            };
            rx.socket_bytes_taken(n as u64);
            stats.add_rx_file_calls(1);
            let mut left = n;
            while left > 0 {
                match splice::splice(
                    pipe.read_end(),
                    None,
                    file.as_fd(),
                    Some(offset + *done),
                    left,
                    SpliceFlags::MOVE,
                ) {
                    Ok(0) => {
                        self.pipe = None;
                        return Err(Error::io(
                            "splice (pipe → file)",
                            std::io::Error::other("moved nothing with bytes in the pipe"),
                        ));
                    }
                    Ok(m) => {
                        left -= m;
                        *done += m as u64;
                        stats.add_rx_file_bytes(m as u64);
                    }
                    // Writing a file is not bounded by the socket timeout; retry.
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                    Err(e) if refused(&e) => {
                        // The file refuses splice: the bytes already in the pipe are the
                        // stream's next ones; write them by copy, then the rest the Write way.
                        stats.fallback(FallbackReason::FileUnsupported, len - *done);
                        self.drain_pipe(file, offset, left, stats, done)?;
                        return Ok(Progress::Refused);
                    }
                    Err(e) => {
                        self.pipe = None;
                        return Err(Error::io("splice (pipe → file)", e));
                    }
                }
            }
        }
        Ok(Progress::Done)
    }

    /// Reads the `left` bytes known to be in the pipe and `pwrite`s them at the stream's
    /// place; the pipe is empty afterwards, or dropped if that fails.
    fn drain_pipe(
        &mut self,
        file: &File,
        offset: u64,
        mut left: usize,
        stats: &Stats,
        done: &mut u64,
    ) -> Result<()> {
        if self.scratch.is_empty() {
            self.scratch = vec![0; SCRATCH_BYTES];
        }
        let Some((pipe, _)) = self.pipe.as_mut() else {
            return Ok(());
        };
        while left > 0 {
            let want = left.min(self.scratch.len());
            let n = match pipe.read(&mut self.scratch[..want]) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.pipe = None;
                    return Err(Error::io("read (pipe)", e));
                }
            };
            if let Err(e) = pwrite_all(file, &self.scratch[..n], offset + *done) {
                self.pipe = None;
                return Err(e);
            }
            stats.add_rx_copied_bytes(n as u64);
            *done += n as u64;
            left -= n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_have_names_and_parse_back() {
        for m in FileRxMode::ALL {
            assert_eq!(m.name().parse::<FileRxMode>().unwrap(), m);
        }
        assert_eq!(FileRxMode::default(), FileRxMode::Splice);
        assert!("mmap".parse::<FileRxMode>().is_err());
    }

    #[test]
    fn an_append_only_file_is_refused() {
        let dir = std::env::temp_dir().join(format!("zcnet-rxfile-unit-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&dir)
            .unwrap();
        std::fs::remove_file(&dir).unwrap();
        assert!(matches!(check_sink(&f), Err(Error::UnsuitableFile(_))));
    }

    #[test]
    fn preallocation_grows_and_reports_the_old_size() {
        let path = std::env::temp_dir().join(format!("zcnet-prealloc-unit-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f.set_len(100).unwrap();
        assert_eq!(preallocate(&f, 50, 1000, 1050).unwrap(), Some(100));
        assert_eq!(f.metadata().unwrap().len(), 1050);
        // Already big enough: nothing to cut back later.
        assert_eq!(preallocate(&f, 0, 10, 10).unwrap(), None);
    }
}
