//! One owned-buffer send: the policy's choice, the `MSG_ZEROCOPY` calls until every byte is
//! queued, and the hand-over of the buffer to the stream's bookkeeping — done by a guard
//! ([`Flight`]) so that a future dropped at any await point still hands it over.

use crate::choice::Go;
use crate::conn::Conn;
use crate::loan::Loan;
use crate::readiness::Direction;
use std::future::poll_fn;
use std::io;
use std::sync::Arc;
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
/// the buffer to the stream's bookkeeping if any zero-copy call named it.
pub(crate) struct Flight<B: Lend> {
    conn: Arc<Conn>,
    buf: Option<B>,
    /// First and last zero-copy call ids that named the buffer.
    span: Option<(u64, u64)>,
}

impl<B: Lend> Flight<B> {
    pub(crate) fn new(conn: Arc<Conn>, buf: B) -> Self {
        Flight {
            conn,
            buf: Some(buf),
            span: None,
        }
    }

    /// Disarms the guard: the buffer and the calls that named it.
    pub(crate) fn finish(mut self) -> (B, Option<(u64, u64)>) {
        let buf = self
            .buf
            .take()
            .expect("a Flight holds its buffer until finished");
        (buf, self.span.take())
    }

    /// Sends every byte, zero-copy where the policy says so. On error the bytes queued so
    /// far are in `sent`, and [`Flight::finish`] says which calls still reference the buffer.
    pub(crate) async fn send_all(&mut self, sent: &mut Sent) -> io::Result<()> {
        let conn = self.conn.clone();
        let data = self.buf.as_ref().map(Lend::bytes).unwrap_or_default();
        let go = conn.decide(data);
        let r = send_routed(go, &conn, data, sent, &mut self.span).await;
        conn.sent(go, sent.len);
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
        Go::Probe => return copy_all(conn, data, sent).await,
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
        if let (Some(buf), Some((first, last))) = (self.buf.take(), self.span) {
            self.conn.lend(Loan::Held(Box::new(buf)), first, last);
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
