//! Receive paths: one module per path, one small trait they share.
//!
//! * [`copy`] — `recv(2)` into a buffer the receiver owns.
//! * [`mmap`] — `TCP_ZEROCOPY_RECEIVE`: received pages are mapped, not copied, when the
//!   sender and the MSS let the kernel (see [`zcnet_sys::raw::zcrecv`]).
//! * `place` — where the copying paths put what they read (a page offset that follows
//!   the stream, away from the band where the kernel's copy runs at half speed).
//! * [`uring`] — io_uring: multishot `recv` into provided buffers (`uring`), and zero-copy
//!   receive into a registered area where the NIC allows it (`zcrx`).
//! * Files are written by [`crate::file::recv`], on top of whichever path the receiver has.

pub(crate) mod auto;
pub(crate) mod copy;
pub(crate) mod mmap;
mod place;
pub(crate) mod uring;

use crate::error::Result;
use crate::stats::Stats;
use std::ops::Deref;
use std::os::fd::BorrowedFd;

/// Received bytes, lent by the [`crate::Receiver`] until dropped.
///
/// Mapped chunks point straight at the pages the NIC (or the kernel's deferred copy) filled;
/// the receiver releases them in batches once the mapping window is used up, and cannot
/// reuse the window while a chunk borrows it.
#[derive(Debug)]
pub struct RxChunk<'a> {
    data: &'a [u8],
    mapped: bool,
}

impl<'a> RxChunk<'a> {
    pub(crate) fn new(data: &'a [u8], mapped: bool) -> Self {
        RxChunk { data, mapped }
    }

    /// True when these bytes were mapped rather than copied.
    pub fn is_mapped(&self) -> bool {
        self.mapped
    }
}

impl Deref for RxChunk<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.data
    }
}

/// What every receive path does.
pub(crate) trait Receive: Send {
    /// The next bytes of the stream, `None` at end of stream.
    fn recv<'a>(&'a mut self, fd: BorrowedFd<'_>, stats: &Stats) -> Result<Option<RxChunk<'a>>>;

    /// Copies the next bytes into `buf`; 0 means end of stream (or an empty `buf`).
    fn recv_into(&mut self, fd: BorrowedFd<'_>, buf: &mut [u8], stats: &Stats) -> Result<usize>;

    /// Lends up to `max` bytes that this path already took off the socket but has not handed
    /// out (the rest of a chunk `recv_into` cut short, the kernel's copybuf tail) to `sink`,
    /// the first held piece only; returns how many were consumed, 0 when nothing is held.
    /// Never reads the socket. Paths that hold nothing keep the default.
    fn take_buffered(
        &mut self,
        _max: usize,
        _sink: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<usize> {
        Ok(0)
    }

    /// Before the socket is read by someone else (spliced into a file, handed back): stop
    /// any request that could still take bytes from it. What was already received stays
    /// here, for [`Receive::take_buffered`] and the next receive. A no-op for the paths
    /// whose reads are all synchronous.
    fn release_socket(&mut self, _fd: BorrowedFd<'_>, _stats: &Stats) -> Result<()> {
        Ok(())
    }

    /// Whether, once [`Receive::take_buffered`] returns 0, another reader (`splice`) may take
    /// the next bytes straight from the socket. False (the default) for a path that may have
    /// reads in flight the kernel can still complete (an armed multishot io_uring recv): the
    /// file receive then goes through [`Receive::recv_lend`] instead, never around the path.
    fn socket_handover_ok(&self) -> bool {
        false
    }

    /// `n` bytes were taken from the socket by another reader: adjust per-stream hints
    /// (the mmap path's pending `recv_skip_hint`).
    fn socket_bytes_taken(&mut self, _n: u64) {}

    /// Receives up to `max` of the next bytes and lends them to `sink`; returns how many (0:
    /// end of stream). The default copies through `scratch` with `recv_into`; a path with its
    /// own memory (mapped pages) lends that directly.
    fn recv_lend(
        &mut self,
        fd: BorrowedFd<'_>,
        scratch: &mut [u8],
        max: usize,
        stats: &Stats,
        sink: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<usize> {
        let held = self.take_buffered(max, sink)?;
        if held > 0 {
            return Ok(held);
        }
        let want = max.min(scratch.len());
        if want == 0 {
            return Ok(0);
        }
        let n = self.recv_into(fd, &mut scratch[..want], stats)?;
        if n > 0 {
            sink(&scratch[..n])?;
        }
        Ok(n)
    }
}
