//! [`ZcStream`] and [`ZcListener`]: a TCP stream for tokio with copy semantics through
//! `AsyncRead`/`AsyncWrite` and owned-buffer zero-copy sends beside them.

use crate::choice::{Go, SendChoice};
use crate::config::ZcConfig;
use crate::conn::Conn;
use crate::driver;
use crate::loan::{Loan, Waiting};
use crate::readiness::Direction;
use crate::rx::{RxChunk, ZcRx};
use crate::send::{copy_all, Flight, Sent};
use bytes::Bytes;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream, ToSocketAddrs};
use tokio::sync::oneshot;
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
    conn: Arc<Conn>,
    /// `recv_zc`'s mapping window, made on first use.
    rx: Option<ZcRx>,
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
    /// stream until its completion and is dropped there. What was written to the stream is
    /// unknown after a cancellation, as for any cancelled `write_all`.
    pub async fn send_zc<B: Lend>(&mut self, buf: B) -> (io::Result<Sent>, B) {
        let mut flight = Flight::new(self.conn.clone(), buf);
        let mut sent = Sent::default();
        let result = flight.send_all(&mut sent).await;
        let (buf, span) = flight.finish();
        let Some((first, last)) = span else {
            // Nothing went zero-copy, so nothing can have been copied behind our back.
            sent.copied_anyway = Some(0);
            return (result.map(|()| sent), buf);
        };
        let (back, returned) = oneshot::channel();
        self.conn
            .lend(Loan::Waiting(Box::new(Waiting { buf, back })), first, last);
        match returned.await {
            Ok((buf, copied)) => {
                sent.copied_anyway = Some(if copied { sent.zerocopy } else { 0 });
                (result.map(|()| sent), buf)
            }
            // The loan was leaked (the runtime is shutting down under the socket): its
            // buffer must not come back, so this future never resolves.
            Err(_) => std::future::pending().await,
        }
    }

    /// Sends all of `bytes`, zero-copy where the policy says so, and returns once they are
    /// queued; the stream keeps `bytes` (one reference) until the completion. `Bytes` is
    /// immutable, so nobody can change the pages while the kernel reads them: zero-copy
    /// without waiting and without copy-on-write.
    pub async fn send_bytes(&mut self, bytes: Bytes) -> io::Result<Sent> {
        let mut flight = Flight::new(self.conn.clone(), bytes);
        let mut sent = Sent::default();
        let result = flight.send_all(&mut sent).await;
        let (bytes, span) = flight.finish();
        if let Some((first, last)) = span {
            self.conn.lend(Loan::Bytes(bytes), first, last);
        }
        result.map(|()| sent)
    }

    /// One non-blocking send of `bytes` (or of its first part), zero-copy where the policy
    /// says so; the stream keeps the part the kernel took until its completion. For
    /// writers driven by `poll` (hyper's I/O, see [`crate::ZcIo`]).
    pub fn poll_send_lent(
        &mut self,
        cx: &mut Context<'_>,
        bytes: Bytes,
    ) -> Poll<io::Result<usize>> {
        // Decided on every poll; counted once, for the write that goes out.
        let go = self.conn.decide(&bytes);
        let r = self.poll_send_routed(cx, go, bytes);
        if let Poll::Ready(Ok(n)) = r {
            self.conn.sent(go, n);
        }
        r
    }

    fn poll_send_routed(
        &mut self,
        cx: &mut Context<'_>,
        go: Go,
        bytes: Bytes,
    ) -> Poll<io::Result<usize>> {
        let conn = &self.conn;
        if go != Go::ZeroCopy {
            let n = std::task::ready!(conn.poll_send_copy(cx, &bytes))?;
            return Poll::Ready(Ok(n));
        }
        match std::task::ready!(conn.poll_io(cx, Direction::Write, || conn.send_zerocopy(&bytes))) {
            Ok((n, id)) => {
                conn.lend(Loan::Bytes(bytes.slice(..n)), id, id);
                Poll::Ready(Ok(n))
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                // Nothing queued; the kernel does not fall back by itself. Read what
                // completions there are and copy this write (counted).
                conn.stats.add_tx_enobufs(1);
                conn.drain()?;
                let n = std::task::ready!(conn.poll_send_copy(cx, &bytes))?;
                conn.stats
                    .fallback(zcnet::FallbackReason::Enobufs, n as u64);
                Poll::Ready(Ok(n))
            }
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    /// Sends all of `data` by copying (`send(2)`), counted in [`Stats`] like `AsyncWrite`.
    pub async fn send_copy(&mut self, data: &[u8]) -> io::Result<Sent> {
        let mut sent = Sent::default();
        copy_all(&self.conn, data, &mut sent).await?;
        Ok(sent)
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
        let rx = match self.rx.take() {
            Some(rx) => rx,
            None => ZcRx::new(&self.conn)?,
        };
        let rx = self.rx.insert(rx);
        let conn = &self.conn;
        let loc = std::future::poll_fn(|cx| rx.poll_step(conn, cx)).await?;
        let rx: &ZcRx = rx;
        Ok(loc.map(move |l| rx.chunk(l)))
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
        self.conn.close();
    }
}

impl AsyncRead for ZcStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let dst = buf.initialize_unfilled();
        // Copybuf bytes a `recv_zc` step left come first: they precede the socket's.
        if let Some(rx) = this.rx.as_mut() {
            let n = rx.take_pending(dst);
            if n > 0 {
                buf.advance(n);
                return Poll::Ready(Ok(()));
            }
        }
        let conn = &this.conn;
        let n = std::task::ready!(conn.poll_io(cx, Direction::Read, || conn.recv_copy(dst)))?;
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for ZcStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let conn = &self.conn;
        conn.poll_send_copy(cx, data)
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
    /// Binds `addr` (port 0 for any free port) with `SO_REUSEADDR` and `SO_ZEROCOPY`.
    pub async fn bind(addr: SocketAddr) -> io::Result<ZcListener> {
        Self::bind_with(addr, ZcConfig::new()).await
    }

    /// [`ZcListener::bind`] with options for every accepted stream.
    pub async fn bind_with(addr: SocketAddr, config: ZcConfig) -> io::Result<ZcListener> {
        let sock = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        sock.set_reuseaddr(true)?;
        // Refused only by kernels without SO_ZEROCOPY; each stream then says so itself.
        let _ = set_so_zerocopy(sock.as_fd());
        sock.bind(addr)?;
        Ok(ZcListener {
            listener: sock.listen(1024)?,
            config,
        })
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
