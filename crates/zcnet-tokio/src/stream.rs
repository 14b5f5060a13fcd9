//! [`ZcStream`] and [`ZcListener`]: a TCP stream for tokio with copy semantics through
//! `AsyncRead`/`AsyncWrite` and owned-buffer zero-copy sends beside them.

use crate::cancel::Cancelled;
use crate::choice::SendChoice;
use crate::config::ZcConfig;
use crate::conn::Conn;
use crate::driver;
use crate::readiness::Direction;
use crate::rx::{self, RxChunk, ZcRx};
use crate::send::{self, Sent};
use bytes::Bytes;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf, Ready};
use tokio::net::{TcpListener, TcpSocket, TcpStream, ToSocketAddrs};
use zcnet::{Lend, Stats};
use zcnet_sys::raw::zerocopy::{set_so_zerocopy, so_zerocopy};

/// A TCP stream whose sends can lend their buffers to the kernel (`MSG_ZEROCOPY`).
///
/// * `AsyncRead`/`AsyncWrite`: copy semantics, a drop-in for `tokio::net::TcpStream`.
/// * [`ZcStream::send_zc`]: moves an owned buffer in and gives it back only when the
///   kernel's completion says its pages are free, with how many bytes it copied anyway.
/// * [`ZcStream::send_bytes`]: returns once a `Bytes` is queued; the stream keeps it (a
///   reference count, not a copy) until the completion.
///
/// Completions are read from the socket's error queue by the stream itself — by whichever
/// operation sees `EPOLLERR` first, or by the stream's driver task — and never surface as
/// errors; a real socket error still does. Dropping a `send_zc` future, or the stream, while
/// pages are in flight never frees them under the kernel: the driver keeps the buffers until
/// their completions (see [`crate::leaked_loans`] for the one exception).
#[derive(Debug)]
pub struct ZcStream {
    pub(crate) conn: Arc<Conn>,
    /// `recv_zc`'s mapping window, made on first use.
    pub(crate) rx: Option<ZcRx>,
}

impl ZcStream {
    /// Connects to `addr` with `SO_ZEROCOPY` set before the connection is made.
    pub async fn connect(addr: impl ToSocketAddrs) -> io::Result<ZcStream> {
        Self::connect_with(addr, ZcConfig::new()).await
    }

    /// [`ZcStream::connect`] with options.
    pub async fn connect_with(addr: impl ToSocketAddrs, config: ZcConfig) -> io::Result<ZcStream> {
        let mut last = None;
        for a in tokio::net::lookup_host(addr).await? {
            let sock = if a.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            let zerocopy = set_so_zerocopy(sock.as_fd()).is_ok();
            match sock.connect(a).await {
                Ok(s) => return Self::wrap(s, zerocopy, config),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "no address to connect to")
        }))
    }

    /// Wraps an established stream (connected or accepted), enabling `SO_ZEROCOPY` on it.
    /// Must be called inside a tokio runtime with I/O enabled (an error otherwise).
    /// Where the kernel refuses, every zero-copy send is copied and counted as
    /// [`zcnet::FallbackReason::Unsupported`].
    pub fn from_tokio(stream: TcpStream, config: ZcConfig) -> io::Result<ZcStream> {
        let zerocopy =
            so_zerocopy(stream.as_fd()).unwrap_or(false) || set_so_zerocopy(stream.as_fd()).is_ok();
        Self::wrap(stream, zerocopy, config)
    }

    fn wrap(stream: TcpStream, zerocopy: bool, config: ZcConfig) -> io::Result<ZcStream> {
        // The driver is a task on the current runtime; without one, say so instead of panic.
        let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        // Out of tokio's registration: readiness comes through the stream's own epoll
        // instance (see `readiness.rs` for why). The socket stays non-blocking.
        let sock = stream.into_std()?;
        let choice = SendChoice::new(config.policy, config.checks_cost());
        let stats = config.stats.unwrap_or_default();
        let local = crate::conn::starts_local(&sock, &config.policy, config.local_zerocopy);
        let conn = Arc::new(Conn::new(sock, zerocopy, local, choice, stats)?);
        runtime.spawn(driver::drive(conn.clone()));
        Ok(ZcStream { conn, rx: None })
    }

    /// The counters this stream adds to.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.conn.stats
    }

    /// Whether `SO_ZEROCOPY` is on (if not, zero-copy sends are copied and counted).
    pub fn zerocopy_enabled(&self) -> bool {
        self.conn.zerocopy_enabled()
    }

    /// Buffers the kernel may still read (lent by `send_bytes` or cancelled `send_zc`s).
    pub fn loans_in_flight(&self) -> usize {
        self.conn.loans_in_flight()
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.conn.socket().local_addr()
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.conn.socket().peer_addr()
    }

    /// Sets `TCP_NODELAY`.
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.conn.socket().set_nodelay(on)
    }

    /// Sends all of `buf`, zero-copy where the policy says so, and resolves — handing `buf`
    /// back — only when the kernel's completion covers every call that named it (at once if
    /// it was copied). On error the buffer comes back too, after the completions of the
    /// calls that did go out; [`Sent`] is lost then, the stream's [`Stats`] keep the counts.
    ///
    /// Cancel-safe in the memory sense: dropped at any point, the buffer stays with the
    /// stream until its completion and is dropped there. And the stream knows how far it
    /// got: after a cancellation [`ZcStream::take_cancelled`] says how many bytes of `buf`
    /// were queued; until then, if that is not all of them, every write fails with
    /// [`crate::StreamError::CancelledSend`] (see "Cancelling a send" in the crate docs).
    pub async fn send_zc<B: Lend>(&mut self, buf: B) -> (io::Result<Sent>, B) {
        send::send_zc(&self.conn, buf).await
    }

    /// Sends all of `bytes`, zero-copy where the policy says so, and returns once they are
    /// queued; the stream keeps `bytes` (one reference) until the completion. `Bytes` is
    /// immutable, so nobody can change the pages while the kernel reads them: zero-copy
    /// without waiting and without copy-on-write.
    ///
    /// Cancelled, it leaves a record as [`ZcStream::send_zc`] does: keep a clone of `bytes`
    /// (a reference count) and send `bytes.slice(c.queued..)` after
    /// [`ZcStream::take_cancelled`] returned `Some(c)`.
    pub async fn send_bytes(&mut self, bytes: Bytes) -> io::Result<Sent> {
        send::send_bytes(&self.conn, bytes).await
    }

    /// One non-blocking send of `bytes` (or of its first part), zero-copy where the policy
    /// says so; the stream keeps the part the kernel took until its completion. For
    /// writers driven by `poll` (hyper's I/O, see [`crate::ZcIo`]).
    pub fn poll_send_lent(
        &mut self,
        cx: &mut Context<'_>,
        bytes: Bytes,
    ) -> Poll<io::Result<usize>> {
        send::poll_send_lent(&self.conn, cx, bytes)
    }

    /// Sends all of `data` by copying (`send(2)`), counted in [`Stats`] like `AsyncWrite`.
    /// Cancelled, it leaves a record as [`ZcStream::send_zc`] does.
    pub async fn send_copy(&mut self, data: &[u8]) -> io::Result<Sent> {
        send::send_copy(&self.conn, data).await
    }

    /// How far the last cancelled send got, and clears the record: `queued` bytes of its
    /// buffer are on the stream, so the caller continues with the bytes from `queued` on
    /// (or with nothing, if `queued == len`). `None` if no send was cancelled since the
    /// last call, or only ones that had not started (a future dropped before its first
    /// poll queued nothing).
    ///
    /// While a send cut short is unread here, writes fail with
    /// [`crate::StreamError::CancelledSend`]: a stream never goes on with a gap or a repeat
    /// its writer did not choose.
    ///
    /// ```no_run
    /// # async fn f(s: &mut zcnet_tokio::ZcStream, msg: bytes::Bytes) -> std::io::Result<()> {
    /// use std::time::Duration;
    /// match tokio::time::timeout(Duration::from_millis(50), s.send_bytes(msg.clone())).await {
    ///     Ok(sent) => { sent?; }
    ///     Err(_elapsed) => {
    ///         // Where the cancelled send stopped; send the rest (or close the stream).
    ///         let from = s.take_cancelled().map_or(0, |c| c.queued);
    ///         s.send_bytes(msg.slice(from..)).await?;
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn take_cancelled(&mut self) -> Option<Cancelled> {
        self.conn.cancel.take()
    }

    /// The record [`ZcStream::take_cancelled`] would return, left in place.
    pub fn cancelled(&self) -> Option<Cancelled> {
        self.conn.cancel.peek()
    }

    /// Receives the next bytes of the stream without copying where the kernel can map them
    /// (`TCP_ZEROCOPY_RECEIVE`: whole pages of page-aligned payload), copied where it
    /// cannot; `None` at the end of the stream. The chunk borrows the stream: the mapped
    /// pages are released in batches by later receives, never under a live chunk.
    ///
    /// Cancel-safe: a dropped call loses no byte (nothing is taken from the socket until
    /// the step that hands it out). Bytes mapped vs copied are counted in [`Stats`]
    /// (`rx_bytes_mapped`, `rx_bytes_copied`, fallbacks `copybuf`, `unmappable`,
    /// `demoted_unmapped`). `AsyncRead` may be mixed with it on the same stream.
    pub async fn recv_zc(&mut self) -> io::Result<Option<RxChunk<'_>>> {
        rx::recv_zc(&self.conn, &mut self.rx).await
    }

    /// Waits until the socket is ready as `interest` asks (readable, writable or both), as
    /// `tokio::net::TcpStream::ready`; follow it with [`ZcStream::try_read`] or
    /// [`ZcStream::try_write`], which may still say `WouldBlock`. Completions are handled
    /// on the way and never show as readiness.
    pub async fn ready(&self, interest: Interest) -> io::Result<Ready> {
        std::future::poll_fn(|cx| self.conn.poll_ready_interest(cx, interest)).await
    }

    /// Waits until the socket is readable ([`ZcStream::ready`]).
    pub async fn readable(&self) -> io::Result<()> {
        self.ready(Interest::READABLE).await.map(drop)
    }

    /// Waits until the socket is writable ([`ZcStream::ready`]).
    pub async fn writable(&self) -> io::Result<()> {
        self.ready(Interest::WRITABLE).await.map(drop)
    }

    /// One non-blocking read into `buf` (`WouldBlock` if nothing is there), as
    /// `tokio::net::TcpStream::try_read`; `Ok(0)` at the end of the stream.
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        rx::try_read(&self.conn, &mut self.rx, buf)
    }

    /// One non-blocking copying send of `buf` (`WouldBlock` if the send buffer is full), as
    /// `tokio::net::TcpStream::try_write`.
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        self.conn.cancel.check()?;
        self.conn
            .try_io(Direction::Write, || self.conn.send_copy(buf))
    }

    /// The socket as a `std::net::TcpStream` (in non-blocking mode, as tokio's
    /// `into_std` leaves it), once every loan has come back — the kernel may still read
    /// lent buffers until then, so this waits as [`ZcStream::flush_loans`] does.
    /// `SO_ZEROCOPY` stays on; it changes nothing for plain sends.
    ///
    /// Fails with `InvalidData` if bytes [`ZcStream::recv_zc`] took from the socket are
    /// still unread (they would be lost with the stream): read them first.
    pub async fn into_std(mut self) -> io::Result<std::net::TcpStream> {
        if let Some(n) = self.rx.as_ref().map(ZcRx::pending_len).filter(|&n| n > 0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{n} received bytes are still unread: read them before into_std"),
            ));
        }
        self.flush_loans().await?;
        // A second descriptor for the same socket: this one is closed with the stream's
        // bookkeeping, which has nothing left to do (no loan, so its driver sends no FIN).
        let sock = self.conn.socket().try_clone()?;
        self.rx = None;
        Ok(sock)
    }

    /// [`ZcStream::into_std`], as a tokio stream. Must be called inside a tokio runtime.
    pub async fn into_tokio(self) -> io::Result<TcpStream> {
        TcpStream::from_std(self.into_std().await?)
    }

    /// Waits until no buffer is lent to the kernel any more (every completion has come).
    pub async fn flush_loans(&self) -> io::Result<()> {
        std::future::poll_fn(|cx| self.conn.poll_completions(cx)).await
    }
}

impl TryFrom<TcpStream> for ZcStream {
    type Error = io::Error;

    /// [`ZcStream::from_tokio`] with default options. Fallible: the stream's epoll instance
    /// can fail to be created (`EMFILE`).
    fn try_from(stream: TcpStream) -> io::Result<ZcStream> {
        ZcStream::from_tokio(stream, ZcConfig::new())
    }
}

impl Drop for ZcStream {
    fn drop(&mut self) {
        self.conn.release();
    }
}

/// The socket, for options this type does not wrap. Reading or writing through it directly
/// bypasses the stream's accounting (and a `recv_zc` chunk's order).
impl AsFd for ZcStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.conn.socket().as_fd()
    }
}

impl AsRawFd for ZcStream {
    fn as_raw_fd(&self) -> RawFd {
        self.conn.socket().as_raw_fd()
    }
}

impl AsyncRead for ZcStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        rx::poll_read(&this.conn, &mut this.rx, cx, buf)
    }
}

impl AsyncWrite for ZcStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        send::poll_write(&self.conn, cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Nothing is buffered in user space.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.conn.socket().shutdown(std::net::Shutdown::Write))
    }
}

/// A listener whose accepted streams have `SO_ZEROCOPY` (inherited from the listening
/// socket, where it is set before `listen`).
#[derive(Debug)]
pub struct ZcListener {
    listener: TcpListener,
    config: ZcConfig,
}

impl ZcListener {
    /// Binds `addr` (port 0 for any free port; a name is looked up, and the first address
    /// that binds is kept, as `tokio::net::TcpListener::bind` does) with `SO_REUSEADDR` and
    /// `SO_ZEROCOPY`.
    pub async fn bind(addr: impl ToSocketAddrs) -> io::Result<ZcListener> {
        Self::bind_with(addr, ZcConfig::new()).await
    }

    /// [`ZcListener::bind`] with options for every accepted stream.
    pub async fn bind_with(addr: impl ToSocketAddrs, config: ZcConfig) -> io::Result<ZcListener> {
        let mut last = None;
        for a in tokio::net::lookup_host(addr).await? {
            match Self::bind_one(a) {
                Ok(listener) => return Ok(ZcListener { listener, config }),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "no address to bind to")
        }))
    }

    fn bind_one(addr: SocketAddr) -> io::Result<TcpListener> {
        let sock = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        sock.set_reuseaddr(true)?;
        // Refused only by kernels without SO_ZEROCOPY; each stream then says so itself.
        let _ = set_so_zerocopy(sock.as_fd());
        sock.bind(addr)?;
        sock.listen(1024)
    }

    /// Takes over a tokio listener, turning `SO_ZEROCOPY` on for the streams it accepts
    /// from now on (each stream also asks for itself: [`ZcStream::from_tokio`]).
    pub fn from_tokio(listener: TcpListener, config: ZcConfig) -> ZcListener {
        let _ = set_so_zerocopy(listener.as_fd());
        ZcListener { listener, config }
    }

    /// The tokio listener underneath.
    pub fn into_tokio(self) -> TcpListener {
        self.listener
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts one connection.
    pub async fn accept(&self) -> io::Result<(ZcStream, SocketAddr)> {
        let (s, peer) = self.listener.accept().await?;
        Ok((ZcStream::from_tokio(s, self.config.clone())?, peer))
    }
}

impl TryFrom<TcpListener> for ZcListener {
    type Error = io::Error;

    /// [`ZcListener::from_tokio`] with default options (infallible; `TryFrom` to match
    /// `ZcStream`'s).
    fn try_from(listener: TcpListener) -> io::Result<ZcListener> {
        Ok(ZcListener::from_tokio(listener, ZcConfig::new()))
    }
}

impl AsFd for ZcListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }
}

impl AsRawFd for ZcListener {
    fn as_raw_fd(&self) -> RawFd {
        self.listener.as_raw_fd()
    }
}
