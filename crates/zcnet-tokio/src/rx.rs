//! `recv_zc`: received pages mapped into our address space with `TCP_ZEROCOPY_RECEIVE`
//! (zcnet-sys `raw::zcrecv::SocketMap`), awaited through the stream's readiness.
//!
//! One call maps as many whole pages as the kernel can, copies a small tail into the
//! copybuf and reports in `recv_skip_hint` how many bytes after those cannot be mapped, so
//! the stream's order is: mapped bytes, copybuf bytes, skip-hint bytes (read with `recv`,
//! never discarded). The mapping window is bounded and released with one
//! `madvise(MADV_DONTNEED)` when used up, so buffering is bounded by the window: nothing is
//! read ahead of the caller. End of stream is the kernel's `EIO` (no progress after the
//! peer's FIN). The same rules as zcnet's blocking `rx::mmap` path; see
//! docs/measurements/kernel-findings.md §2 for when pages map (page-multiple payloads).
//!
//! Where mapping does not pay — data keeps arriving in pieces that cannot be mapped — the
//! stream stops asking after [`DEMOTE_AFTER`] such steps in a row and reads with `recv`,
//! each byte counted as [`FallbackReason::DemotedUnmapped`].

use crate::conn::Conn;
use crate::readiness::Direction;
use std::io;
use std::ops::Deref;
use std::task::{ready, Context, Poll};
use tokio::io::ReadBuf;
use zcnet::FallbackReason;
use zcnet_sys::raw::zcrecv::SocketMap;

/// Size of the mapping window: the most mapped bytes held before the batch release.
pub(crate) const WINDOW: usize = 2 << 20;
/// Below this much free window, release before the next call.
const MIN_WINDOW: usize = 64 << 10;
/// Under a page, so the kernel copies instead of mapping only for a tail under a page.
const COPYBUF: usize = 4095;
/// Scratch for the skip-hint bytes and demoted reads.
const SCRATCH: usize = 64 << 10;
/// Consecutive steps that found data but mapped none before mapping is given up.
pub(crate) const DEMOTE_AFTER: u32 = 64;

/// Received bytes lent by [`crate::ZcStream::recv_zc`]: pages mapped from the socket, or
/// bytes that had to be copied. Valid until the next receive on the stream.
#[derive(Debug)]
pub struct RxChunk<'a> {
    data: &'a [u8],
    mapped: bool,
}

impl RxChunk<'_> {
    /// Whether these bytes are pages mapped from the socket (no copy).
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

/// Where one step's bytes are.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Loc {
    Mapped { off: usize, len: usize },
    Copybuf { len: usize },
    Scratch { len: usize },
}

/// Receive state of one stream.
#[derive(Debug)]
pub(crate) struct ZcRx {
    map: SocketMap,
    copybuf: Vec<u8>,
    /// Copybuf bytes not yet handed out: `start..end`.
    pending: (usize, usize),
    skip: usize,
    scratch: Vec<u8>,
    eof: bool,
    unmapped_streak: u32,
    demoted: bool,
}

impl ZcRx {
    pub(crate) fn new(conn: &Conn) -> io::Result<ZcRx> {
        Ok(ZcRx {
            map: SocketMap::new(std::os::fd::AsFd::as_fd(conn.socket()), WINDOW)?,
            copybuf: vec![0; COPYBUF],
            pending: (0, 0),
            skip: 0,
            scratch: vec![0; SCRATCH],
            eof: false,
            unmapped_streak: 0,
            demoted: false,
        })
    }

    /// The bytes of a step.
    pub(crate) fn chunk(&self, loc: Loc) -> RxChunk<'_> {
        match loc {
            Loc::Mapped { off, len } => RxChunk {
                data: self.map.slice(off, len),
                mapped: true,
            },
            Loc::Copybuf { len } => RxChunk {
                data: &self.copybuf[..len],
                mapped: false,
            },
            Loc::Scratch { len } => RxChunk {
                data: &self.scratch[..len],
                mapped: false,
            },
        }
    }

    /// Copybuf bytes an earlier step left behind, which `AsyncRead` must hand out before
    /// reading the socket again. Copies up to `dst.len()` of them; returns how many.
    pub(crate) fn take_pending(&mut self, dst: &mut [u8]) -> usize {
        let (s, e) = self.pending;
        let n = (e - s).min(dst.len());
        dst[..n].copy_from_slice(&self.copybuf[s..s + n]);
        self.pending = if s + n < e { (s + n, e) } else { (0, 0) };
        n
    }

    /// Copybuf bytes taken from the socket and not yet handed out.
    pub(crate) fn pending_len(&self) -> usize {
        self.pending.1 - self.pending.0
    }

    /// Advances the stream by one step; `None` at its end.
    pub(crate) fn poll_step(
        &mut self,
        conn: &Conn,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<Option<Loc>>> {
        let stats = &conn.stats;
        if self.eof {
            return Poll::Ready(Ok(None));
        }
        let (s, e) = self.pending;
        if s < e {
            // Whole copybuf steps are handed out from its start.
            if s > 0 {
                self.copybuf.copy_within(s..e, 0);
            }
            self.pending = (0, 0);
            return Poll::Ready(Ok(Some(Loc::Copybuf { len: e - s })));
        }
        if self.skip > 0 || self.demoted {
            let want = if self.skip > 0 {
                self.skip.min(SCRATCH)
            } else {
                SCRATCH
            };
            let scratch = &mut self.scratch[..want];
            let n = ready!(conn.poll_io(cx, Direction::Read, || conn.recv_copy(scratch)))?;
            if n == 0 {
                self.eof = true;
                return Poll::Ready(Ok(None));
            }
            let reason = if self.skip > 0 {
                self.skip -= n.min(self.skip);
                FallbackReason::Unmappable
            } else {
                FallbackReason::DemotedUnmapped
            };
            stats.fallback(reason, n as u64);
            return Poll::Ready(Ok(Some(Loc::Scratch { len: n })));
        }
        if self.map.remaining() < MIN_WINDOW {
            let n = self.map.release_all()?;
            stats.add_rx_release_calls(1);
            stats.add_rx_released_bytes(n as u64);
        }
        let (map, copybuf) = (&mut self.map, &mut self.copybuf);
        let fd = std::os::fd::AsFd::as_fd(conn.socket());
        let out = ready!(conn.poll_io(cx, Direction::Read, || {
            let want = map.remaining();
            match map.receive(fd, want, copybuf) {
                Ok(o) => {
                    stats.add_rx_zc_calls(1);
                    if o.err == 0 && o.mapped == 0 && o.copied == 0 && o.skip_hint == 0 {
                        stats.add_rx_zc_empty_calls(1);
                        // Nothing queued: wait for the socket to become readable.
                        return Err(io::ErrorKind::WouldBlock.into());
                    }
                    Ok(Some(o))
                }
                // No progress and the peer's FIN is in: end of stream.
                Err(e) if e.raw_os_error() == Some(libc::EIO) => Ok(None),
                Err(e) => Err(e),
            }
        }))?;
        let Some(out) = out else {
            self.eof = true;
            return Poll::Ready(Ok(None));
        };
        if out.err != 0 {
            // The kernel stores sock_error(), a negative errno.
            return Poll::Ready(Err(io::Error::from_raw_os_error(out.err.abs())));
        }
        if out.copied > 0 {
            self.pending = (0, out.copied);
            stats.add_rx_copied_bytes(out.copied as u64);
            stats.fallback(FallbackReason::Copybuf, out.copied as u64);
        }
        self.skip = out.skip_hint;
        if out.mapped > 0 {
            self.unmapped_streak = 0;
            stats.add_rx_mapped_bytes(out.mapped as u64);
            let off = self.map.mapped_end() - out.mapped;
            return Poll::Ready(Ok(Some(Loc::Mapped {
                off,
                len: out.mapped,
            })));
        }
        self.unmapped_streak += 1;
        if self.unmapped_streak >= DEMOTE_AFTER {
            self.demoted = true;
        }
        // Copybuf or skip-hint bytes only: the next step hands them out at once (it takes
        // the copybuf or skip branch above, so this recursion is one level deep).
        self.poll_step(conn, cx)
    }
}

/// [`crate::ZcStream::recv_zc`], for the stream and its read half: `rx` is made on first use.
pub(crate) async fn recv_zc<'a>(
    conn: &Conn,
    rx: &'a mut Option<ZcRx>,
) -> io::Result<Option<RxChunk<'a>>> {
    let rx = match rx {
        Some(rx) => rx,
        None => rx.insert(ZcRx::new(conn)?),
    };
    let loc = std::future::poll_fn(|cx| rx.poll_step(conn, cx)).await?;
    let rx: &ZcRx = rx;
    Ok(loc.map(move |l| rx.chunk(l)))
}

/// `AsyncRead::poll_read` of the stream and its read half: copybuf bytes a `recv_zc` step
/// left come first (they precede the socket's), then one `recv`.
pub(crate) fn poll_read(
    conn: &Conn,
    rx: &mut Option<ZcRx>,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
) -> Poll<io::Result<()>> {
    let dst = buf.initialize_unfilled();
    if let Some(rx) = rx.as_mut() {
        let n = rx.take_pending(dst);
        if n > 0 {
            buf.advance(n);
            return Poll::Ready(Ok(()));
        }
    }
    let n = ready!(conn.poll_io(cx, Direction::Read, || conn.recv_copy(dst)))?;
    buf.advance(n);
    Poll::Ready(Ok(()))
}

/// `try_read` of the stream and its read half: copybuf bytes first, then one `recv` if the
/// socket was last seen readable (`WouldBlock` otherwise, as tokio's `try_read`).
pub(crate) fn try_read(conn: &Conn, rx: &mut Option<ZcRx>, dst: &mut [u8]) -> io::Result<usize> {
    if let Some(rx) = rx.as_mut() {
        let n = rx.take_pending(dst);
        if n > 0 {
            return Ok(n);
        }
    }
    conn.try_io(Direction::Read, || conn.recv_copy(dst))
}
