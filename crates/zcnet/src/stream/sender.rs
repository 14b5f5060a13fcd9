//! [`Sender`]: a TCP socket that sends, with its transmit path chosen by [`SenderConfig`].

use super::local_ip;
use crate::auto::ProfileSource;
use crate::buf::{Pool, TxBuf};
use crate::error::{Error, Result};
use crate::file::send::FileTx;
use crate::lend::Lend;
use crate::path::{FileTxMode, TxPath};
use crate::policy::Policy;
use crate::stats::{Stats, StatsSnapshot};
use crate::tx::auto::{AutoSetup, AutoTx};
use crate::tx::{copy::CopyTx, cow::CowTx, uring::UringTx, zerocopy::ZerocopyTx, Transmit};
use socket2::{Domain, SockAddr, Socket, Type};
use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcnet_sys::raw::zerocopy as zc;

/// How a [`Sender`] is set up.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SenderConfig {
    /// Transmit path. [`Sender::send_slice`] copies on every path but `cow`, which sends
    /// the slice zero-copy under write protection.
    pub path: TxPath,
    /// When zero-copy is worth it.
    pub policy: Policy,
    /// Buffers in the pool (ignored when `pool` is given).
    pub pool_buffers: usize,
    /// Bytes per buffer (ignored when `pool` is given).
    pub buf_bytes: usize,
    /// A pool to share with other senders.
    pub pool: Option<Pool>,
    /// Counters to share with others (a fresh set otherwise).
    pub stats: Option<Arc<Stats>>,
    /// Bound on every call — connect, each `send*`/`write` as a whole (every syscall and
    /// wait in it), waiting for a buffer, flushing. `None` (the default) blocks as long as
    /// it takes, as `std::net::TcpStream` does — unless [`Sender::from_stream`] finds
    /// `SO_SNDTIMEO` set on the socket, which then serves as this. A call that runs out is
    /// [`Error::Timeout`] saying how long it ran and how many of its bytes went out (or
    /// [`Error::PoolExhausted`] while waiting for a buffer the kernel still holds).
    pub timeout: Option<Duration>,
    /// `SO_SNDBUF`, if set.
    pub sndbuf: Option<usize>,
    /// `TCP_NODELAY`.
    pub nodelay: bool,
    /// How [`Sender::send_file`] moves file bytes (`sendfile` by default).
    pub file_tx: FileTxMode,
    /// When the `cow` path write-protects a `send_slice` (Solaris's working-set threshold).
    pub cow: crate::cow::CowPolicy,
    /// Where the `auto` path finds this host's profile.
    pub profile: ProfileSource,
    /// Whether the application writes the data it sends (true for most; a benchmark that
    /// sends untouched buffers says false): `auto` uses the profile's matching variant.
    pub touch: bool,
    /// Whether this sender publishes its sending thread's clock card in the host-shared
    /// directory `/dev/shm/zcnet-$EUID/` (`peer_card`; docs/guide.md, "What zcnet touches"), for a receiver's `auto`
    /// trial on the same host to count the sender's CPU too. Off by default: it is a file
    /// other processes see, which a library writes only when asked. The one switch for all
    /// that zcnet shares between processes; the receiver's half is
    /// [`crate::ReceiverConfig::peer_clock`]. The `zcnet` CLI turns it on.
    pub peer_clock: bool,
}

impl Default for SenderConfig {
    fn default() -> Self {
        SenderConfig {
            path: TxPath::Auto,
            policy: Policy::default(),
            pool_buffers: 16,
            buf_bytes: 256 * 1024,
            pool: None,
            stats: None,
            timeout: None,
            sndbuf: None,
            nodelay: false,
            file_tx: FileTxMode::Sendfile,
            cow: crate::cow::CowPolicy::default(),
            profile: ProfileSource::NoProfile,
            touch: true,
            peer_clock: false,
        }
    }
}

impl SenderConfig {
    /// Defaults with transmit path `path`.
    pub fn new(path: TxPath) -> Self {
        SenderConfig {
            path,
            ..Default::default()
        }
    }
}

/// Builder methods, one per field: the struct is `#[non_exhaustive]`, so code outside the
/// crate cannot write `SenderConfig { nodelay: true, ..Default::default() }`; it writes
/// `SenderConfig::new(TxPath::Zerocopy).nodelay(true)` instead.
impl SenderConfig {
    crate::builder::setters! {
        /// Sets [`SenderConfig::policy`].
        policy: Policy,
        /// Sets [`SenderConfig::pool_buffers`].
        pool_buffers: usize,
        /// Sets [`SenderConfig::buf_bytes`].
        buf_bytes: usize,
        /// Sets [`SenderConfig::nodelay`].
        nodelay: bool,
        /// Sets [`SenderConfig::file_tx`].
        file_tx: FileTxMode,
        /// Sets [`SenderConfig::cow`].
        cow: crate::cow::CowPolicy,
        /// Sets [`SenderConfig::profile`].
        profile: ProfileSource,
        /// Sets [`SenderConfig::touch`].
        touch: bool,
        /// Sets [`SenderConfig::peer_clock`].
        peer_clock: bool,
    }
    crate::builder::option_setters! {
        /// Shares `pool` with other senders ([`SenderConfig::pool`]).
        pool: Pool,
        /// Shares `stats` with others ([`SenderConfig::stats`]).
        stats: Arc<Stats>,
        /// Sets `SO_SNDBUF` ([`SenderConfig::sndbuf`]).
        sndbuf: usize,
        /// Bounds every blocking step ([`SenderConfig::timeout`]).
        timeout: Duration,
    }
}

/// The sending end of a TCP connection.
///
/// ```no_run
/// # fn main() -> Result<(), zcnet::Error> {
/// use zcnet::{Sender, SenderConfig, TxPath};
/// let mut tx = Sender::connect("127.0.0.1:9000".parse().unwrap(), &SenderConfig::new(TxPath::Zerocopy))?;
/// let mut buf = tx.buffer()?;            // a pooled, page-aligned buffer
/// buf.fill_at(0, b"hello");              // write the payload once
/// tx.send(buf)?;                         // moved in; back to the pool on completion
/// tx.send_slice(b"copy semantics")?;     // always safe; copies (zero-copy on `cow`)
/// let stats = tx.finish()?;
/// # Ok(()) }
/// ```
pub struct Sender {
    sock: Socket,
    tx: Box<dyn Transmit>,
    path: TxPath,
    pool: Pool,
    stats: Arc<Stats>,
    timeout: Duration,
    file: FileTx,
    file_tx: FileTxMode,
    /// On the `auto` path with a profile that measured file sends: which mode
    /// [`Sender::send_file`] takes at each size ([`crate::auto::file`]).
    file_auto: Option<crate::auto::Chooser<FileTxMode>>,
    profile_note: Option<String>,
    /// The card naming the sending thread, for an `auto` receiver on this host to read its
    /// CPU clock (`peer_card`; docs/guide.md, "What zcnet touches"); `None` where it could not be written.
    card: Option<crate::peer_card::ClockCard>,
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("path", &self.path)
            .field("pool", &self.pool)
            .finish()
    }
}

impl Sender {
    /// Connects to `addr`. `SO_ZEROCOPY` is set before `connect` for the zero-copy path; if
    /// the kernel refuses it, the sender copies and counts every send as
    /// [`FallbackReason::Unsupported`](crate::FallbackReason::Unsupported).
    pub fn connect(addr: SocketAddr, cfg: &SenderConfig) -> Result<Sender> {
        let sock = Socket::new(Domain::for_address(addr), Type::STREAM, None)
            .map_err(|e| Error::io("socket", e))?;
        let zc_ok = !matches!(cfg.path, TxPath::Zerocopy | TxPath::Cow | TxPath::Auto)
            || zc::set_so_zerocopy(sock.as_fd()).is_ok();
        if let Some(n) = cfg.sndbuf {
            sock.set_send_buffer_size(n)
                .map_err(|e| Error::io("setsockopt(SO_SNDBUF)", e))?;
        }
        match cfg.timeout {
            Some(t) => sock.connect_timeout(&SockAddr::from(addr), t),
            None => sock.connect(&SockAddr::from(addr)),
        }
        .map_err(|e| Error::io("connect", e))?;
        Self::finish_setup(sock, cfg, zc_ok)
    }

    /// Wraps an already connected stream (for example, an accepted one). `SO_ZEROCOPY` is
    /// set now; Linux 6.x accepts it on established sockets.
    ///
    /// The socket is taken as it is: one the caller made non-blocking (`O_NONBLOCK`) gives
    /// [`Error::WouldBlock`] from any call that would wait, with the bytes it queued first;
    /// one with `SO_SNDTIMEO` set, and no [`SenderConfig::timeout`], is bounded by that
    /// timeout per call. Anything but a TCP socket — a `UnixStream` or a UDP socket turned
    /// into a `TcpStream` through its descriptor — is refused with
    /// [`Error::UnsuitableSocket`].
    pub fn from_stream(stream: TcpStream, cfg: &SenderConfig) -> Result<Sender> {
        let sock = Socket::from(OwnedFd::from(stream));
        let timeout = super::adopt(&sock, cfg.timeout, true)?;
        let adopted;
        let cfg = if timeout == cfg.timeout {
            cfg
        } else {
            adopted = cfg.clone().timeout(timeout.unwrap_or(super::FOREVER));
            &adopted
        };
        let zc_ok = !matches!(cfg.path, TxPath::Zerocopy | TxPath::Cow | TxPath::Auto)
            || zc::set_so_zerocopy(sock.as_fd()).is_ok();
        if let Some(n) = cfg.sndbuf {
            sock.set_send_buffer_size(n)
                .map_err(|e| Error::io("setsockopt(SO_SNDBUF)", e))?;
        }
        Self::finish_setup(sock, cfg, zc_ok)
    }

    fn finish_setup(sock: Socket, cfg: &SenderConfig, zc_ok: bool) -> Result<Sender> {
        // Socket timeouts only when asked for: by default a send blocks as long as it takes,
        // as a plain TcpStream's does.
        if let Some(t) = cfg.timeout {
            sock.set_write_timeout(Some(t))
                .map_err(|e| Error::io("setsockopt(SO_SNDTIMEO)", e))?;
            sock.set_read_timeout(Some(t))
                .map_err(|e| Error::io("setsockopt(SO_RCVTIMEO)", e))?;
        }
        let timeout = super::bound(cfg.timeout);
        if cfg.nodelay {
            sock.set_tcp_nodelay(true)
                .map_err(|e| Error::io("setsockopt(TCP_NODELAY)", e))?;
        }
        let pool = match &cfg.pool {
            Some(p) => p.clone(),
            None => Pool::new(cfg.pool_buffers.max(1), cfg.buf_bytes)
                .map_err(|e| Error::io("mmap (buffer pool)", e))?,
        };
        let stats: Arc<Stats> = cfg.stats.clone().unwrap_or_default();
        let mut profile_note = None;
        let mut file_auto = None;
        let tx: Box<dyn Transmit> = match cfg.path {
            TxPath::Auto => {
                let local = local_ip(&sock);
                let loaded = crate::profile::load::load(&cfg.profile, local);
                profile_note = loaded.note;
                file_auto = loaded
                    .profile
                    .as_deref()
                    .and_then(|p| crate::auto::file::chooser(&p.file, &p.pairs, cfg.touch));
                Box::new(AutoTx::new(
                    sock.as_fd(),
                    AutoSetup {
                        profile: loaded.profile.as_deref(),
                        touch: cfg.touch,
                        pool: &pool,
                        cow: cfg.cow,
                        timeout,
                        zc_ok,
                        stats: &stats,
                    },
                ))
            }
            TxPath::Copy => Box::new(CopyTx { timeout }),
            TxPath::Zerocopy => Box::new(ZerocopyTx::new(cfg.policy, timeout, !zc_ok)),
            TxPath::Uring => Box::new(UringTx::new(&pool, cfg.policy, timeout, &stats)),
            TxPath::Cow => Box::new(CowTx::new(
                sock.as_fd(),
                cfg.policy,
                cfg.cow,
                timeout,
                !zc_ok,
            )),
        };
        let card = if cfg.peer_clock {
            Self::publish_card(&sock, cfg.path)
        } else {
            None
        };
        Ok(Sender {
            card,
            sock,
            tx,
            path: cfg.path,
            pool,
            stats,
            timeout,
            file: FileTx::default(),
            file_tx: cfg.file_tx,
            file_auto,
            profile_note,
        })
    }

    /// The sending thread's card (`peer_card`; docs/guide.md, "What zcnet touches"), when [`SenderConfig::peer_clock`]
    /// asks for it: best effort, for every path (the receiver's trial needs the sender's
    /// clock whatever the sender does).
    fn publish_card(sock: &Socket, path: TxPath) -> Option<crate::peer_card::ClockCard> {
        use crate::peer_card as peer;
        let local = sock.local_addr().ok()?.as_socket()?;
        let remote = sock.peer_addr().ok()?.as_socket()?;
        peer::ClockCard::publish(&peer::default_dir()?, local, remote, peer::path_code(path))
    }

    /// Counts `n` bytes sent on the card (an atomic add), the card naming the thread that
    /// sent them (a thread-local read when it already does).
    fn sent(&mut self, n: u64) {
        if let Some(c) = self.card.as_mut() {
            c.follow();
            c.sent(n);
        }
    }

    /// On the `auto` path: why no profile is in force (none written yet, or one refused as
    /// foreign or of another schema), for the caller to show; `None` when one is in force
    /// or the path is not `auto`.
    pub fn profile_note(&self) -> Option<&str> {
        self.profile_note.as_deref()
    }

    /// The path loaned buffers take.
    pub fn path(&self) -> TxPath {
        self.path
    }

    /// The buffer pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Live counters.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// The socket, for options zcnet does not set.
    pub fn socket(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// Takes a free buffer from the pool, reaping completions while none is free. Gives up
    /// with [`Error::PoolExhausted`] after the configured timeout — the receiver stopped
    /// reading, so the kernel still holds every buffer — rather than hang; on a
    /// non-blocking socket, at once with [`Error::WouldBlock`].
    ///
    /// The buffer comes with [`TxBuf::capacity`] bytes of room and nothing selected
    /// (`len() == 0`, like a fresh `Vec`): fill it with [`TxBuf::append`] (or a read into
    /// [`TxBuf::spare_mut`] and [`TxBuf::commit`]) until [`TxBuf::is_full`], or in place
    /// with [`TxBuf::fill_at`]; what is selected is what [`Sender::send`] sends.
    pub fn buffer(&mut self) -> Result<TxBuf> {
        if let Some(b) = self.pool.try_take() {
            return Ok(b);
        }
        self.stats.add_pool_waits(1);
        let _call = crate::call::begin(self.timeout);
        let d = crate::call::deadline(self.timeout);
        loop {
            self.tx.reap(self.sock.as_fd(), &self.stats)?;
            if let Some(b) = self.pool.try_take() {
                return Ok(b);
            }
            if crate::call::nonblocking(self.sock.as_fd()) {
                return Err(Error::WouldBlock {
                    op: "waiting for a free buffer",
                    queued: 0,
                });
            }
            if d.expired() {
                self.stats.add_pool_timeouts(1);
                return Err(Error::PoolExhausted(d.elapsed()));
            }
            let slice = d.slice(Duration::from_millis(10));
            if self.tx.buffers_in_flight() > 0 {
                self.tx.wait(self.sock.as_fd(), &self.stats, slice)?;
            } else if let Some(b) = self.pool.take_timeout(slice) {
                return Ok(b);
            }
        }
    }

    /// Sends `buf`'s selected bytes. The buffer is moved in: it returns to its pool when the
    /// kernel's completion covers it (zero-copy) or when the bytes are queued (copy).
    ///
    /// Touching the buffer after handing it over does not compile:
    ///
    /// ```compile_fail
    /// # fn f(tx: &mut zcnet::Sender) -> Result<(), zcnet::Error> {
    /// let mut buf = tx.buffer()?;
    /// buf.fill_at(0, b"payload");
    /// tx.send(buf)?;
    /// buf[0] = b'X'; // error[E0382]: borrow of moved value: `buf`
    /// # Ok(()) }
    /// ```
    pub fn send(&mut self, buf: TxBuf) -> Result<()> {
        let _call = crate::call::begin(self.timeout);
        let n = buf.len() as u64;
        let before = crate::stats::tx_handed_by_this_thread();
        self.tx
            .send_buf(self.sock.as_fd(), buf, &self.stats)
            .map_err(|e| Self::queued_since(before, e))?;
        self.sent(n);
        Ok(())
    }

    /// `e` saying how many bytes of the failed call went out before it failed.
    fn queued_since(before: u64, e: Error) -> Error {
        e.with_queued(crate::stats::tx_handed_by_this_thread().wrapping_sub(before))
    }

    /// Lends the caller's own memory — a `Vec<u8>`, `Box<[u8]>`, `Arc<[u8]>`, `bytes::Bytes`
    /// (feature `bytes`), anything [`Lend`] — for a zero-copy send without first copying it
    /// into a pool buffer. `buf` is kept until the kernel's completion says its pages are
    /// free, then dropped: an `Arc` clone lets one immutable buffer go to many senders at
    /// once, and comes back to sole ownership once they have all flushed. On the
    /// `zerocopy` path (and `auto` where it picks `zerocopy`) the bytes are lent; `copy`
    /// copies them; `uring` and `cow`, which send from memory of their own, copy them and
    /// count [`FallbackReason::Unsupported`](crate::FallbackReason::Unsupported).
    pub fn send_lent<B: Lend>(&mut self, buf: B) -> Result<()> {
        let _call = crate::call::begin(self.timeout);
        let n = buf.bytes().len() as u64;
        let before = crate::stats::tx_handed_by_this_thread();
        self.tx
            .send_lent(self.sock.as_fd(), Box::new(buf), &self.stats, self.timeout)
            .map_err(|e| Self::queued_since(before, e))?;
        self.sent(n);
        Ok(())
    }

    /// Sends `data` with copy semantics: `data` may be reused as soon as this returns. On
    /// the `cow` path its page-aligned middle goes zero-copy while write-protected
    /// ([`crate::cow`]); elsewhere it is copied.
    pub fn send_slice(&mut self, data: &[u8]) -> Result<()> {
        let _call = crate::call::begin(self.timeout);
        let before = crate::stats::tx_handed_by_this_thread();
        self.tx
            .send_slice(self.sock.as_fd(), data, &self.stats, self.timeout)
            .map_err(|e| Self::queued_since(before, e))?;
        self.sent(data.len() as u64);
        self.tx.reap(self.sock.as_fd(), &self.stats)?;
        Ok(())
    }

    /// Sends everything `src` reads, to its end, and returns the byte count: reads fill
    /// whole pool buffers ([`Sender::buffer`], in place, no intermediate copy) and each goes
    /// out by [`Sender::send`] — zero-copy where the path and the policy allow. This is the
    /// way to pour a reader into a sender: `io::copy` writes 8 KiB at a time, each
    /// [`io::Write::write`] a copied `send_slice` too small for zero-copy. For a file, use
    /// [`Sender::send_file`] (`sendfile`: no read at all).
    ///
    /// An error from `src` is [`Error::Io`] naming the read; one from the socket says, as
    /// [`Sender::send`]'s do, how much of the buffer in hand went out.
    pub fn send_reader<R: io::Read + ?Sized>(&mut self, src: &mut R) -> Result<u64> {
        let mut total = 0u64;
        loop {
            let mut buf = self.buffer()?;
            let mut eof = false;
            while !buf.is_full() {
                match src.read(buf.spare_mut()) {
                    Ok(0) => {
                        eof = true;
                        break;
                    }
                    Ok(n) => buf.commit(n),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(Error::io("read (send_reader's source)", e)),
                }
            }
            let n = buf.len() as u64;
            if n > 0 {
                self.send(buf)?;
                total += n;
            }
            if eof {
                return Ok(total);
            }
        }
    }

    /// Sends `len` bytes of `file` starting at `offset` (the file position does not move)
    /// with the configured [`FileTxMode`] — `sendfile(2)` by default — and returns `len`.
    ///
    /// The bytes go from the page cache to the socket without a user-space copy; where the
    /// file refuses (`EINVAL`/`ENOSYS`/`EOPNOTSUPP`, e.g. most /proc files) the rest goes by
    /// `pread` + `send`, counted as [`FallbackReason::FileUnsupported`](crate::FallbackReason::FileUnsupported). A range past the end
    /// of a regular file is [`Error::RangeBeyondEof`] before anything is sent; a file that
    /// ends early anyway (truncated under us, or a /proc file reporting size 0) is
    /// [`Error::Truncated`] with the bytes that did go out. Each blocking call is bounded by
    /// the socket timeout ([`Error::Timeout`]).
    ///
    /// On the `auto` path, where the host's profile measured file sends, the mode is the
    /// profile's choice for `len` (sendfile, or `pread` + `send` where copying measured
    /// cheaper), counted in `auto_tx` like every decision; otherwise the configured one.
    pub fn send_file(&mut self, file: &std::fs::File, offset: u64, len: u64) -> Result<u64> {
        let mode = match &self.file_auto {
            Some(c) => {
                let choice = c.choose(len, true);
                let mut delta = crate::auto::AutoStats::default();
                delta.record_choice(&choice);
                self.stats.add_auto_tx(&delta);
                choice.path
            }
            None => self.file_tx,
        };
        self.send_file_with(file, offset, len, mode)
    }

    /// [`Sender::send_file`] with an explicit mode.
    pub fn send_file_with(
        &mut self,
        file: &std::fs::File,
        offset: u64,
        len: u64,
        mode: FileTxMode,
    ) -> Result<u64> {
        let _call = crate::call::begin(self.timeout);
        let before = crate::stats::tx_handed_by_this_thread();
        let n = self
            .file
            .send(
                self.sock.as_fd(),
                file,
                offset,
                len,
                mode,
                &self.stats,
                self.timeout,
            )
            .map_err(|e| Self::queued_since(before, e))?;
        self.sent(n);
        self.tx.reap(self.sock.as_fd(), &self.stats)?;
        Ok(n)
    }

    /// Waits until the kernel has returned every loaned buffer (bounded by the timeout).
    /// Waits for completions whatever the socket's `O_NONBLOCK`: they come from the peer's
    /// acknowledgements, not from room in the socket.
    pub fn flush(&mut self) -> Result<()> {
        let _call = crate::call::begin(self.timeout);
        let d = crate::call::deadline(self.timeout);
        while self.tx.buffers_in_flight() > 0 {
            if d.expired() {
                return Err(d.timed_out("waiting for zero-copy completions", 0));
            }
            self.tx.wait(
                self.sock.as_fd(),
                &self.stats,
                d.slice(Duration::from_millis(50)),
            )?;
        }
        Ok(())
    }

    /// Gives the socket back once the kernel has returned every loaned buffer (waits as
    /// [`Sender::flush`] does), so no page the stream ever lent is still referenced.
    /// `SO_ZEROCOPY` stays set on the socket; it does nothing to plain sends.
    pub fn into_inner(mut self) -> Result<TcpStream> {
        self.flush()?;
        // `send_file` lowers SO_SNDTIMEO to what is left of a call: give the socket back
        // with the timeout it had.
        if self.timeout < super::FOREVER {
            self.sock
                .set_write_timeout(Some(self.timeout))
                .map_err(|e| Error::io("setsockopt(SO_SNDTIMEO)", e))?;
        }
        // A second descriptor of the same socket: dropping `self` closes only its own.
        let sock = self.sock.try_clone().map_err(|e| Error::io("dup", e))?;
        drop(self);
        Ok(TcpStream::from(OwnedFd::from(sock)))
    }

    /// Ends the stream (FIN), waits for every buffer to come back, and returns the stats.
    pub fn finish(mut self) -> Result<StatsSnapshot> {
        self.sock
            .shutdown(Shutdown::Write)
            .map_err(|e| Error::io("shutdown", e))?;
        self.flush()?;
        Ok(self.stats.snapshot())
    }
}

/// Dropping a sender does not wait for the kernel: the buffers it still holds are unmapped
/// rather than returned to the pool (the kernel keeps its own page references, so the bytes
/// still go out, and the memory is never reused while it may be read). Call
/// [`Sender::finish`] or [`Sender::flush`] to wait. The exception is `cow`, whose pages in
/// flight are the application's own: it waits up to 2 s (or the configured timeout, if
/// shorter) for their completions, then aborts the connection so the kernel lets go of them.
impl Drop for Sender {
    fn drop(&mut self) {
        if self.tx.buffers_in_flight() > 0 {
            let grace = if self.path == TxPath::Cow {
                self.timeout.min(Duration::from_secs(2))
            } else {
                Duration::ZERO
            };
            let deadline = Instant::now() + grace;
            while self.tx.buffers_in_flight() > 0 && Instant::now() < deadline {
                if self
                    .tx
                    .wait(self.sock.as_fd(), &self.stats, Duration::from_millis(20))
                    .is_err()
                {
                    break;
                }
            }
            self.tx.abandon();
        }
    }
}

impl AsFd for Sender {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

impl AsRawFd for Sender {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

/// Copy semantics, so a `Sender` drops in wherever a writer is expected (`io::copy`,
/// `BufWriter`, `write!`): `write` sends the whole slice as [`Sender::send_slice`] does
/// (zero-copy under write protection on the `cow` path) and returns its length; `flush`
/// waits for every zero-copy completion. Each `write` is one copied send: `io::copy`'s
/// 8 KiB pieces never go zero-copy — pour a reader with [`Sender::send_reader`] (whole
/// pool buffers) and a file with [`Sender::send_file`] (`sendfile`).
impl io::Write for Sender {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.send_slice(buf) {
            Ok(()) => Ok(buf.len()),
            // io::Write's contract: bytes that went out are reported, never sent twice.
            Err(Error::WouldBlock { queued, .. } | Error::Timeout { queued, .. }) if queued > 0 => {
                Ok(queued as usize)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(Sender::flush(self)?)
    }
}
