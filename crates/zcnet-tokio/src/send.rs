//! One owned-buffer send: the policy's choice, the `MSG_ZEROCOPY` calls until every byte is
//! queued, and the hand-over of the buffer to the stream's bookkeeping — done by a guard
//! ([`Flight`]) so that a future dropped at any await point still hands it over.

use crate::choice::Go;
use crate::conn::Conn;
use crate::loan::{Loan, Waiting};
use crate::readiness::Direction;
use bytes::Bytes;
use std::future::poll_fn;
use std::io;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::sync::oneshot;
use zcnet::{FallbackReason, Lend};

/// Attempts at a zero-copy call after `ENOBUFS` (each after draining completions and
/// yielding to the runtime) before the rest of the buffer is copied.
const ENOBUFS_RETRIES: u32 = 3;

/// How one send went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Sent {
    /// Bytes queued on the socket (the whole buffer unless an error is returned).
    pub len: usize,
    /// Of those, bytes sent with `MSG_ZEROCOPY`.
    pub zerocopy: usize,
    /// Bytes sent with a plain `send`, by the policy's choice or a fallback.
    pub copied: usize,
    /// Of the zero-copy bytes, those the kernel reported having copied after all
    /// (`SO_EE_CODE_ZEROCOPY_COPIED`: loopback, veth into a namespace, a device without
    /// scatter-gather). `None` when the send returned before its completion
    /// ([`crate::ZcStream::send_bytes`]); [`zcnet::StatsSnapshot::tx_bytes_zc_copied`]
    /// counts them when they come.
    pub copied_anyway: Option<usize>,
    /// Why bytes were copied, if they were.
    pub fallback: Option<FallbackReason>,
}

/// A buffer on its way out. Dropped before the send finished (a cancelled future), it lends
/// the buffer to the stream's bookkeeping if any zero-copy call named it, and records how
/// many of its bytes were queued ([`crate::Cancelled`]).
pub(crate) struct Flight<B: Lend> {
    conn: Arc<Conn>,
    buf: Option<B>,
    /// First and last zero-copy call ids that named the buffer.
    span: Option<(u64, u64)>,
    /// How the send has gone so far: `sent.len` bytes are queued.
    sent: Sent,
}

impl<B: Lend> Flight<B> {
    /// A send of `buf`, or the error that refuses it (an earlier send cut short and not yet
    /// acknowledged: [`crate::StreamError::CancelledSend`]) with `buf` given back.
    pub(crate) fn new(conn: Arc<Conn>, buf: B) -> Result<Self, (io::Error, B)> {
        if let Err(e) = conn.cancel.check() {
            return Err((e.into(), buf));
        }
        Ok(Flight {
            conn,
            buf: Some(buf),
            span: None,
            sent: Sent::default(),
        })
    }

    /// Disarms the guard: the buffer, the calls that named it, and how the send went.
    pub(crate) fn finish(mut self) -> (B, Option<(u64, u64)>, Sent) {
        let buf = self
            .buf
            .take()
            .expect("a Flight holds its buffer until finished");
        (buf, self.span.take(), self.sent)
    }

    /// Sends every byte, zero-copy where the policy says so. On error the bytes queued so
    /// far are in the [`Sent`] that [`Flight::finish`] returns, beside the calls that still
    /// reference the buffer.
    pub(crate) async fn send_all(&mut self) -> io::Result<()> {
        let conn = self.conn.clone();
        let data = self.buf.as_ref().map(Lend::bytes).unwrap_or_default();
        let go = conn.decide(data);
        let r = send_routed(go, &conn, data, &mut self.sent, &mut self.span).await;
        conn.sent(go, self.sent.len);
        r
    }
}

/// Sends all of `data` where `go` says; `span` collects the zero-copy calls' ids.
async fn send_routed(
    go: Go,
    conn: &Conn,
    data: &[u8],
    sent: &mut Sent,
    span: &mut Option<(u64, u64)>,
) -> io::Result<()> {
    match go {
        Go::ZeroCopy => {}
        Go::Copy(reason) => {
            sent.fallback = Some(reason);
            return copy_all(conn, data, sent).await;
        }
        Go::CopySample => return copy_all(conn, data, sent).await,
    }
    let mut enobufs = 0;
    while sent.len < data.len() {
        let rest = &data[sent.len..];
        let r = poll_fn(|cx| conn.poll_io(cx, Direction::Write, || conn.send_zerocopy(rest))).await;
        match r {
            Ok((n, id)) => {
                *span = Some(span.map_or((id, id), |(first, _)| (first, id)));
                sent.len += n;
                sent.zerocopy += n;
                enobufs = 0;
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                // Nothing was queued, and the kernel does not fall back by itself: free
                // option memory by reading completions, then retry or copy the rest.
                conn.stats.add_tx_enobufs(1);
                if enobufs < ENOBUFS_RETRIES {
                    enobufs += 1;
                    conn.drain()?;
                    tokio::task::yield_now().await;
                } else {
                    conn.stats
                        .fallback(FallbackReason::Enobufs, rest.len() as u64);
                    sent.fallback = Some(FallbackReason::Enobufs);
                    return copy_all(conn, rest, sent).await;
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl<B: Lend> Drop for Flight<B> {
    fn drop(&mut self) {
        let Some(buf) = self.buf.take() else {
            return;
        };
        // Dropped unfinished: the future was cancelled mid-send.
        self.conn.cancel.cancelled(self.sent.len, buf.bytes().len());
        if let Some((first, last)) = self.span {
            self.conn.lend(Loan::Held(Box::new(buf)), first, last);
        }
    }
}

/// A send whose bytes are all queued and which still waits (for its completion): dropped
/// before [`Settling::done`], it records a cancellation with nothing left to send.
pub(crate) struct Settling<'a> {
    conn: &'a Conn,
    len: usize,
    armed: bool,
}

impl<'a> Settling<'a> {
    pub(crate) fn new(conn: &'a Conn, len: usize) -> Self {
        Settling {
            conn,
            len,
            armed: true,
        }
    }

    pub(crate) fn done(mut self) {
        self.armed = false;
    }
}

impl Drop for Settling<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.conn.cancel.cancelled(self.len, self.len);
        }
    }
}

/// A copying send of a borrowed slice in progress ([`crate::ZcStream::send_copy`]):
/// dropped unfinished, it records how far it got, as [`Flight`] does.
pub(crate) struct CopyFlight<'a> {
    conn: &'a Conn,
    len: usize,
    sent: Sent,
    armed: bool,
}

impl<'a> CopyFlight<'a> {
    pub(crate) fn new(conn: &'a Conn, len: usize) -> io::Result<Self> {
        conn.cancel.check()?;
        Ok(CopyFlight {
            conn,
            len,
            sent: Sent::default(),
            armed: true,
        })
    }

    /// Copies all of `data` (the slice this flight was made for).
    pub(crate) async fn send(mut self, data: &[u8]) -> io::Result<Sent> {
        let r = copy_all(self.conn, data, &mut self.sent).await;
        self.armed = false;
        r.map(|()| self.sent)
    }
}

impl Drop for CopyFlight<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.conn.cancel.cancelled(self.sent.len, self.len);
        }
    }
}

/// Sends all of `data` by copying, adding to `sent`.
pub(crate) async fn copy_all(conn: &Conn, data: &[u8], sent: &mut Sent) -> io::Result<()> {
    let mut off = 0;
    while off < data.len() {
        let n = poll_fn(|cx| conn.poll_send_copy(cx, &data[off..])).await?;
        off += n;
        sent.len += n;
        sent.copied += n;
    }
    Ok(())
}

/// [`crate::ZcStream::send_zc`], for the stream and its write half.
pub(crate) async fn send_zc<B: Lend>(conn: &Arc<Conn>, buf: B) -> (io::Result<Sent>, B) {
    let mut flight = match Flight::new(conn.clone(), buf) {
        Ok(f) => f,
        Err((e, buf)) => return (Err(e), buf),
    };
    let result = flight.send_all().await;
    let (buf, span, mut sent) = flight.finish();
    let Some((first, last)) = span else {
        // Nothing went zero-copy, so nothing can have been copied behind our back.
        sent.copied_anyway = Some(0);
        return (result.map(|()| sent), buf);
    };
    let (back, returned) = oneshot::channel();
    conn.lend(Loan::Waiting(Box::new(Waiting { buf, back })), first, last);
    let settling = Settling::new(conn, sent.len);
    match returned.await {
        Ok((buf, copied)) => {
            settling.done();
            sent.copied_anyway = Some(if copied { sent.zerocopy } else { 0 });
            (result.map(|()| sent), buf)
        }
        // The loan was leaked (the runtime is shutting down under the socket): its
        // buffer must not come back, so this future never resolves.
        Err(_) => std::future::pending().await,
    }
}

/// [`crate::ZcStream::send_bytes`], for the stream and its write half.
pub(crate) async fn send_bytes(conn: &Arc<Conn>, bytes: Bytes) -> io::Result<Sent> {
    let mut flight = Flight::new(conn.clone(), bytes).map_err(|(e, _)| e)?;
    let result = flight.send_all().await;
    let (bytes, span, sent) = flight.finish();
    if let Some((first, last)) = span {
        conn.lend(Loan::Bytes(bytes), first, last);
    }
    result.map(|()| sent)
}

/// [`crate::ZcStream::send_copy`], for the stream and its write half.
pub(crate) async fn send_copy(conn: &Conn, data: &[u8]) -> io::Result<Sent> {
    CopyFlight::new(conn, data.len())?.send(data).await
}

/// `AsyncWrite::poll_write` of the stream and its write half: one copying send.
pub(crate) fn poll_write(
    conn: &Conn,
    cx: &mut Context<'_>,
    data: &[u8],
) -> Poll<io::Result<usize>> {
    conn.cancel.check()?;
    conn.poll_send_copy(cx, data)
}

/// [`crate::ZcStream::poll_send_lent`], for the stream and its write half.
pub(crate) fn poll_send_lent(
    conn: &Conn,
    cx: &mut Context<'_>,
    bytes: Bytes,
) -> Poll<io::Result<usize>> {
    conn.cancel.check()?;
    // Decided on every poll; counted once, for the write that goes out.
    let go = conn.decide(&bytes);
    let r = poll_send_routed(conn, cx, go, bytes);
    if let Poll::Ready(Ok(n)) = r {
        conn.sent(go, n);
    }
    r
}

fn poll_send_routed(
    conn: &Conn,
    cx: &mut Context<'_>,
    go: Go,
    bytes: Bytes,
) -> Poll<io::Result<usize>> {
    if go != Go::ZeroCopy {
        let n = ready!(conn.poll_send_copy(cx, &bytes))?;
        return Poll::Ready(Ok(n));
    }
    match ready!(conn.poll_io(cx, Direction::Write, || conn.send_zerocopy(&bytes))) {
        Ok((n, id)) => {
            conn.lend(Loan::Bytes(bytes.slice(..n)), id, id);
            Poll::Ready(Ok(n))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
            // Nothing queued; the kernel does not fall back by itself. Read what
            // completions there are and copy this write (counted).
            conn.stats.add_tx_enobufs(1);
            conn.drain()?;
            let n = ready!(conn.poll_send_copy(cx, &bytes))?;
            conn.stats.fallback(FallbackReason::Enobufs, n as u64);
            Poll::Ready(Ok(n))
        }
        Err(e) => Poll::Ready(Err(e)),
    }
}
