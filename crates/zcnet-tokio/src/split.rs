//! A [`ZcStream`]'s owned halves, as `tokio::net::TcpStream::into_split` makes them: the
//! read half in one task, the write half — with `send_zc` and `send_bytes` — in another
//! (a proxy's two directions). Both share the stream's socket and bookkeeping; the socket
//! closes when both are gone (and every loan has come back, as for a dropped stream).

use crate::cancel::Cancelled;
use crate::conn::Conn;
use crate::readiness::Direction;
use crate::rx::{self, RxChunk, ZcRx};
use crate::send::{self, Sent};
use crate::stream::ZcStream;
use bytes::Bytes;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf, Ready};
use zcnet::{Lend, Stats};

impl ZcStream {
    /// Splits the stream into a read half and a write half that can move to different
    /// tasks; the write half keeps [`OwnedWriteHalf::send_zc`] and
    /// [`OwnedWriteHalf::send_bytes`]. [`OwnedReadHalf::reunite`] puts them back together.
    /// As with tokio's halves, dropping the write half shuts the write side down (the peer
    /// reads the end of the stream after the queued bytes).
    pub fn into_split(mut self) -> (OwnedReadHalf, OwnedWriteHalf) {
        let conn = self.conn.clone();
        let rx = self.rx.take();
        // Two handles now; dropping `self` gives up its own.
        conn.acquire();
        conn.acquire();
        drop(self);
        (
            OwnedReadHalf {
                conn: conn.clone(),
                rx,
            },
            OwnedWriteHalf {
                conn,
                shutdown_on_drop: true,
            },
        )
    }
}

/// The read half of a [`ZcStream`] ([`ZcStream::into_split`]): `AsyncRead` and `recv_zc`.
#[derive(Debug)]
pub struct OwnedReadHalf {
    conn: Arc<Conn>,
    rx: Option<ZcRx>,
}

/// The write half of a [`ZcStream`] ([`ZcStream::into_split`]): `AsyncWrite`, `send_zc`,
/// `send_bytes`, `send_copy`, with the stream's cancellation record.
#[derive(Debug)]
pub struct OwnedWriteHalf {
    conn: Arc<Conn>,
    shutdown_on_drop: bool,
}

/// [`OwnedReadHalf::reunite`] was given halves of two different streams; here they are back.
#[derive(Debug, thiserror::Error)]
#[error("tried to reunite halves that are not from the same stream")]
pub struct ReuniteError(pub OwnedReadHalf, pub OwnedWriteHalf);

impl OwnedReadHalf {
    /// Puts the stream back together (without shutting its write side down), or gives
    /// both halves back if they are not of one stream.
    // tokio's shape: the halves come back by value in the error, as tokio's `reunite` does.
    #[allow(clippy::result_large_err)]
    pub fn reunite(self, mut write: OwnedWriteHalf) -> Result<ZcStream, ReuniteError> {
        if !Arc::ptr_eq(&self.conn, &write.conn) {
            return Err(ReuniteError(self, write));
        }
        write.shutdown_on_drop = false;
        let mut read = self;
        let stream = ZcStream {
            conn: read.conn.clone(),
            rx: read.rx.take(),
        };
        // The stream is one handle, taking over from the two halves dropped here.
        stream.conn.acquire();
        drop(read);
        drop(write);
        Ok(stream)
    }

    /// [`ZcStream::recv_zc`].
    pub async fn recv_zc(&mut self) -> io::Result<Option<RxChunk<'_>>> {
        rx::recv_zc(&self.conn, &mut self.rx).await
    }

    /// [`ZcStream::readable`].
    pub async fn readable(&self) -> io::Result<()> {
        self.ready(Interest::READABLE).await.map(drop)
    }

    /// [`ZcStream::ready`] (the read half may wait for writability too, as tokio's does).
    pub async fn ready(&self, interest: Interest) -> io::Result<Ready> {
        std::future::poll_fn(|cx| self.conn.poll_ready_interest(cx, interest)).await
    }

    /// [`ZcStream::try_read`].
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        rx::try_read(&self.conn, &mut self.rx, buf)
    }

    /// The counters the stream adds to.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.conn.stats
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.conn.socket().local_addr()
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.conn.socket().peer_addr()
    }
}

impl OwnedWriteHalf {
    /// [`ZcStream::send_zc`].
    pub async fn send_zc<B: Lend>(&mut self, buf: B) -> (io::Result<Sent>, B) {
        send::send_zc(&self.conn, buf).await
    }

    /// [`ZcStream::send_bytes`].
    pub async fn send_bytes(&mut self, bytes: Bytes) -> io::Result<Sent> {
        send::send_bytes(&self.conn, bytes).await
    }

    /// [`ZcStream::send_copy`].
    pub async fn send_copy(&mut self, data: &[u8]) -> io::Result<Sent> {
        send::send_copy(&self.conn, data).await
    }

    /// [`ZcStream::poll_send_lent`].
    pub fn poll_send_lent(
        &mut self,
        cx: &mut Context<'_>,
        bytes: Bytes,
    ) -> Poll<io::Result<usize>> {
        send::poll_send_lent(&self.conn, cx, bytes)
    }

    /// [`ZcStream::take_cancelled`].
    pub fn take_cancelled(&mut self) -> Option<Cancelled> {
        self.conn.cancel.take()
    }

    /// [`ZcStream::cancelled`].
    pub fn cancelled(&self) -> Option<Cancelled> {
        self.conn.cancel.peek()
    }

    /// [`ZcStream::flush_loans`].
    pub async fn flush_loans(&self) -> io::Result<()> {
        std::future::poll_fn(|cx| self.conn.poll_completions(cx)).await
    }

    /// Buffers the kernel may still read.
    pub fn loans_in_flight(&self) -> usize {
        self.conn.loans_in_flight()
    }

    /// [`ZcStream::writable`].
    pub async fn writable(&self) -> io::Result<()> {
        self.ready(Interest::WRITABLE).await.map(drop)
    }

    /// [`ZcStream::ready`].
    pub async fn ready(&self, interest: Interest) -> io::Result<Ready> {
        std::future::poll_fn(|cx| self.conn.poll_ready_interest(cx, interest)).await
    }

    /// [`ZcStream::try_write`].
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        self.conn.cancel.check()?;
        self.conn
            .try_io(Direction::Write, || self.conn.send_copy(buf))
    }

    /// The counters the stream adds to.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.conn.stats
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.conn.socket().local_addr()
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.conn.socket().peer_addr()
    }

    /// Drops the half without shutting the write side down (tokio's `forget`).
    pub fn forget(mut self) {
        self.shutdown_on_drop = false;
    }
}

impl Drop for OwnedReadHalf {
    fn drop(&mut self) {
        self.conn.release();
    }
}

impl Drop for OwnedWriteHalf {
    fn drop(&mut self) {
        if self.shutdown_on_drop {
            let _ = self.conn.socket().shutdown(std::net::Shutdown::Write);
        }
        self.conn.release();
    }
}

impl AsyncRead for OwnedReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        rx::poll_read(&this.conn, &mut this.rx, cx, buf)
    }
}

impl AsyncWrite for OwnedWriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        send::poll_write(&self.conn, cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.conn.socket().shutdown(std::net::Shutdown::Write))
    }
}

impl AsFd for OwnedReadHalf {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.conn.socket().as_fd()
    }
}

impl AsFd for OwnedWriteHalf {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.conn.socket().as_fd()
    }
}

impl AsRawFd for OwnedReadHalf {
    fn as_raw_fd(&self) -> RawFd {
        self.conn.socket().as_raw_fd()
    }
}

impl AsRawFd for OwnedWriteHalf {
    fn as_raw_fd(&self) -> RawFd {
        self.conn.socket().as_raw_fd()
    }
}
