//! Files to and from sockets without passing through user memory: the Solaris paper's FTP
//! test, where the file's pages go straight to the network, and its mirror on receive.
//!
//! * [`send`] — [`crate::Sender::send_file`]: `sendfile(2)` or `splice(2)` file → pipe →
//!   socket, with `pread` + `send` as the counted fallback.
//! * [`recv`] — [`crate::Receiver::recv_to_file`]: `splice(2)` socket → pipe → file, with
//!   the receiver's own path + `pwrite(2)` as the counted fallback.
//!
//! This file holds what both directions share: the sized pipe, the `EINTR` stall bound, the
//! range arithmetic and which errors mean "this file cannot do zero-copy".

pub(crate) mod recv;
pub(crate) mod send;

use crate::error::{Error, Result};

use zcnet_sys::raw::splice::{self, Pipe};

/// Largest pipe we ask for; `pipe-max-size` (1 MiB by default) usually caps it first.
pub(crate) const PIPE_MAX: usize = 16 << 20;
pub(crate) const PIPE_MIN: usize = 64 * 1024;

/// A pipe sized up with `F_SETPIPE_SZ` to `/proc/sys/fs/pipe-max-size` (capped at 16 MiB),
/// halving on refusal (`EPERM` past the per-user pipe page limit) down to the 64 KiB
/// default. Returns the pipe and its capacity in bytes.
pub(crate) fn sized_pipe() -> Result<(Pipe, usize)> {
    let pipe = Pipe::new().map_err(|e| Error::io("pipe2", e))?;
    let mut want = splice::pipe_max_size()
        .unwrap_or(1 << 20)
        .clamp(PIPE_MIN, PIPE_MAX);
    while want > PIPE_MIN && pipe.set_size(want).is_err() {
        want /= 2;
    }
    let cap = pipe.size().unwrap_or(PIPE_MIN).max(4096);
    Ok((pipe, cap))
}

/// `offset + len` as an end offset that fits an `off_t`.
pub(crate) fn range_end(offset: u64, len: u64) -> Result<u64> {
    offset
        .checked_add(len)
        .filter(|&e| e <= i64::MAX as u64)
        .ok_or(Error::UnsuitableFile(
            "offset + length exceeds the largest file offset",
        ))
}

/// `EINVAL`, `ENOSYS`, `EOPNOTSUPP`: the file (or the socket) does not support the zero-copy
/// call at all; anything else is a real failure.
pub(crate) fn refused(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP)
    )
}
