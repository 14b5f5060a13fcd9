//! Zero-copy bodies for an unmodified hyper (or axum) server.
//!
//! hyper writes a response through `poll_write_vectored` with `IoSlice`s that point into
//! the body's own `Bytes` (its queued write strategy, chosen when the I/O type says it
//! writes vectored), and drops each `Bytes` as soon as the write returns — too soon for a
//! `MSG_ZEROCOPY` send, whose pages must stay alive and unchanged until the completion.
//! So the body is wrapped in a [`ZcBody`], which lends each large data frame's `Bytes` (a
//! clone: a reference count) to a [`Lender`] shared with the connection's [`ZcIo`]. When
//! hyper then writes a slice that lies inside a lent `Bytes`, `ZcIo` sends it zero-copy and
//! the stream keeps that `Bytes` until the completion; every other slice (headers, chunk
//! framing, small frames, bodies not wrapped) is copied. Memory that is not held in the
//! lender is never sent zero-copy, so nothing hyper frees can be read by the kernel later.

use crate::stream::ZcStream;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Frames at least this large are lent (zcnet's default zero-copy threshold).
const MIN_LEND: usize = 16 * 1024;
/// Lent frames remembered at once; hyper queues at most 16 buffers per write, so older
/// ones have been written. Forgetting one only means copying it.
const MAX_LENT: usize = 64;

/// The `Bytes` frames a [`ZcBody`] lent and its [`ZcIo`] may send zero-copy.
#[derive(Debug, Clone, Default)]
pub struct Lender {
    lent: Arc<Mutex<VecDeque<Bytes>>>,
}

impl Lender {
    /// An empty lender, to share between one connection's [`ZcIo`] and its bodies.
    pub fn new() -> Self {
        Self::default()
    }

    fn lend(&self, b: &Bytes) {
        let mut lent = self.lent.lock().unwrap_or_else(|e| e.into_inner());
        if lent.len() == MAX_LENT {
            lent.pop_front();
        }
        lent.push_back(b.clone());
    }

    /// The lent `Bytes` holding exactly `slice`'s memory, if any (a sub-slice of it, one
    /// more reference).
    ///
    /// hyper writes frames in the order its body yielded them, so the oldest lent entry
    /// that contains the slice is the frame being written, and older ones are done: they
    /// are forgotten (as is one written to its end, see [`Lender::written`]). Lent frames
    /// may overlap in memory — slices of one larger `Bytes` — so the search is
    /// oldest-first; whichever entry matches holds the same, immutable bytes.
    fn find(&self, slice: &[u8]) -> Option<Bytes> {
        let p = slice.as_ptr() as usize;
        let mut lent = self.lent.lock().unwrap_or_else(|e| e.into_inner());
        let i = lent.iter().position(|b| {
            let start = b.as_ptr() as usize;
            p >= start && p + slice.len() <= start + b.len()
        })?;
        lent.drain(..i);
        let b = &lent[0];
        let off = p - b.as_ptr() as usize;
        Some(b.slice(off..off + slice.len()))
    }

    /// The bytes before address `end` of the oldest entry have been queued: if that is all
    /// of it, it is forgotten (the stream keeps its own reference until the completion).
    fn written(&self, end: usize) {
        let mut lent = self.lent.lock().unwrap_or_else(|e| e.into_inner());
        if lent
            .front()
            .is_some_and(|b| b.as_ptr() as usize + b.len() == end)
        {
            lent.pop_front();
        }
    }
}

/// A body whose large `Bytes` data frames are lent to a [`Lender`], so the connection's
/// [`ZcIo`] can send them zero-copy. Frames, trailers and size hints pass through as they
/// are.
#[derive(Debug)]
pub struct ZcBody<B> {
    inner: B,
    lender: Lender,
}

impl<B> ZcBody<B> {
    /// Wraps `inner`, lending to `lender` (the one its connection's [`ZcIo`] holds).
    pub fn new(inner: B, lender: Lender) -> Self {
        ZcBody { inner, lender }
    }
}

impl<B> Body for ZcBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &r {
            if let Some(data) = frame.data_ref() {
                if data.len() >= MIN_LEND {
                    self.lender.lend(data);
                }
            }
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A [`ZcStream`] as hyper's I/O: wrap it in hyper-util's `TokioIo`. Writes are vectored,
/// so hyper hands over its body's memory instead of copying it into a buffer of its own;
/// slices inside frames a [`ZcBody`] lent go zero-copy, the rest is copied.
#[derive(Debug)]
pub struct ZcIo {
    stream: ZcStream,
    lender: Lender,
}

impl ZcIo {
    /// Serves `stream`, sending zero-copy what bodies lend to `lender`.
    pub fn new(stream: ZcStream, lender: Lender) -> Self {
        ZcIo { stream, lender }
    }

    /// The stream (for its [`crate::Stats`]).
    pub fn stream(&self) -> &ZcStream {
        &self.stream
    }

    /// The lender this connection sends zero-copy from: wrap a response body in
    /// [`ZcBody::new`]`(body, io.lender().clone())` (or serve through
    /// [`crate::axum::ZcBodyLayer`]) so its large frames go out without a copy.
    pub fn lender(&self) -> &Lender {
        &self.lender
    }

    /// The stream back.
    pub fn into_inner(self) -> ZcStream {
        self.stream
    }
}

impl AsyncRead for ZcIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ZcIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let mut total = 0;
        for slice in bufs.iter().filter(|s| !s.is_empty()) {
            let r = match this.lender.find(slice) {
                Some(lent) => {
                    let r = this.stream.poll_send_lent(cx, lent);
                    if let Poll::Ready(Ok(n)) = r {
                        this.lender.written(slice.as_ptr() as usize + n);
                    }
                    r
                }
                None => Pin::new(&mut this.stream).poll_write(cx, slice),
            };
            match r {
                Poll::Ready(Ok(n)) => {
                    total += n;
                    if n < slice.len() {
                        break;
                    }
                }
                // What went out is reported; the error or the wait comes on the next call.
                Poll::Ready(Err(_)) | Poll::Pending if total > 0 => break,
                other => return other,
            }
        }
        Poll::Ready(Ok(total))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_inside_a_lent_frame_is_found_and_keeps_the_frame_alive() {
        let l = Lender::new();
        let frame = Bytes::from(vec![7u8; 100_000]);
        l.lend(&frame);
        let part = l.find(&frame[10..5000]).expect("inside a lent frame");
        assert_eq!(
            part.as_ptr(),
            frame[10..].as_ptr(),
            "the same memory, no copy"
        );
        assert_eq!(part.len(), 4990);
        // Memory nobody lent is never found, even with the same contents.
        let other = vec![7u8; 100_000];
        assert!(l.find(&other[..100]).is_none());
    }

    #[test]
    fn frames_are_forgotten_in_write_order_even_when_they_overlap() {
        let whole = Bytes::from(vec![1u8; 300_000]);
        let (a, b) = (whole.slice(0..200_000), whole.slice(100_000..300_000));
        let l = Lender::new();
        l.lend(&a);
        l.lend(&b);
        // A partial write of `a` keeps it; its end forgets it.
        let p = l.find(&a[..]).unwrap();
        l.written(p.as_ptr() as usize + 50_000);
        assert_eq!(l.lent.lock().unwrap().len(), 2);
        let p = l.find(&a[50_000..]).unwrap();
        l.written(p.as_ptr() as usize + p.len());
        assert_eq!(l.lent.lock().unwrap().len(), 1);
        // `b`'s bytes are found (in `b`), then it too is forgotten at its end.
        let p = l.find(&b[..]).unwrap();
        assert_eq!(p.len(), 200_000);
        l.written(p.as_ptr() as usize + p.len());
        assert!(l.lent.lock().unwrap().is_empty());
    }

    #[test]
    fn matching_a_later_frame_forgets_the_earlier_ones() {
        let l = Lender::new();
        let frames: Vec<Bytes> = (0..3).map(|i| Bytes::from(vec![i; 20_000])).collect();
        for f in &frames {
            l.lend(f);
        }
        assert!(l.find(&frames[2][..]).is_some());
        assert_eq!(l.lent.lock().unwrap().len(), 1);
        assert!(
            l.find(&frames[0][..]).is_none(),
            "written before: forgotten"
        );
    }
}
