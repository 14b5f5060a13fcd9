//! The application-facing API: [`Sender`], [`Listener`] and [`Receiver`]. They own the
//! socket and its options, pick the path per operation through the path modules, and never
//! make a syscall themselves beyond set-up.

use crate::auto::ProfileSource;
use crate::buf::{Pool, TxBuf};
use crate::error::{Error, Result};
use crate::policy::{page_multiple_mss, Policy};
use crate::rx::auto::AutoRxChoice;
use crate::rx::file::{FileRx, FileRxMode};
use crate::rx::mmap::AutoDemotion;
use crate::rx::{copy::CopyRx, mmap::MmapRx, Receive, RxChunk, RxPath};
use crate::stats::{FallbackReason, Stats, StatsSnapshot};
use crate::tx::auto::{AutoSetup, AutoTx};
use crate::tx::file::{FileTx, FileTxMode};
use crate::tx::{copy::CopyTx, cow::CowTx, uring::UringTx, zerocopy::ZerocopyTx, Transmit, TxPath};
use socket2::{Domain, SockAddr, Socket, Type};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcnet_sys::mem::page_size;
use zcnet_sys::raw::socket;
use zcnet_sys::raw::zcrecv::SocketMap;
use zcnet_sys::raw::zerocopy as zc;

/// The socket's local address, which names the interface whose profile `auto` uses
/// (unspecified — so loopback's — if the socket cannot say).
fn local_ip(sock: &Socket) -> std::net::IpAddr {
    sock.local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |a| a.ip())
}

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
    pub buf_size: usize,
    /// A pool to share with other senders.
    pub pool: Option<Pool>,
    /// Counters to share with others (a fresh set otherwise).
    pub stats: Option<Arc<Stats>>,
    /// Bound on every blocking step: connect, a send, waiting for a buffer, flushing.
    pub timeout: Duration,
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
}

impl Default for SenderConfig {
    fn default() -> Self {
        SenderConfig {
            path: TxPath::Auto,
            policy: Policy::default(),
            pool_buffers: 16,
            buf_size: 256 * 1024,
            pool: None,
            stats: None,
            timeout: Duration::from_secs(30),
            sndbuf: None,
            nodelay: false,
            file_tx: FileTxMode::Sendfile,
            cow: crate::cow::CowPolicy::default(),
            profile: ProfileSource::Default,
            touch: true,
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
    profile_note: Option<String>,
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
    /// [`FallbackReason::Unsupported`].
    pub fn connect(addr: SocketAddr, cfg: &SenderConfig) -> Result<Sender> {
        let sock = Socket::new(Domain::for_address(addr), Type::STREAM, None)
            .map_err(|e| Error::io("socket", e))?;
        let zc_ok = !matches!(cfg.path, TxPath::Zerocopy | TxPath::Cow | TxPath::Auto)
            || zc::set_so_zerocopy(sock.as_fd()).is_ok();
        if let Some(n) = cfg.sndbuf {
            sock.set_send_buffer_size(n)
                .map_err(|e| Error::io("setsockopt(SO_SNDBUF)", e))?;
        }
        sock.connect_timeout(&SockAddr::from(addr), cfg.timeout)
            .map_err(|e| Error::io("connect", e))?;
        Self::finish_setup(sock, cfg, zc_ok)
    }

    /// Wraps an already connected stream (for example, an accepted one). `SO_ZEROCOPY` is
    /// set now; Linux 6.x accepts it on established sockets.
    pub fn from_stream(stream: TcpStream, cfg: &SenderConfig) -> Result<Sender> {
        let sock = Socket::from(OwnedFd::from(stream));
        let zc_ok = !matches!(cfg.path, TxPath::Zerocopy | TxPath::Cow | TxPath::Auto)
            || zc::set_so_zerocopy(sock.as_fd()).is_ok();
        if let Some(n) = cfg.sndbuf {
            sock.set_send_buffer_size(n)
                .map_err(|e| Error::io("setsockopt(SO_SNDBUF)", e))?;
        }
        Self::finish_setup(sock, cfg, zc_ok)
    }

    fn finish_setup(sock: Socket, cfg: &SenderConfig, zc_ok: bool) -> Result<Sender> {
        sock.set_write_timeout(Some(cfg.timeout))
            .map_err(|e| Error::io("setsockopt(SO_SNDTIMEO)", e))?;
        sock.set_read_timeout(Some(cfg.timeout))
            .map_err(|e| Error::io("setsockopt(SO_RCVTIMEO)", e))?;
        if cfg.nodelay {
            sock.set_tcp_nodelay(true)
                .map_err(|e| Error::io("setsockopt(TCP_NODELAY)", e))?;
        }
        let pool = match &cfg.pool {
            Some(p) => p.clone(),
            None => Pool::new(cfg.pool_buffers.max(1), cfg.buf_size)
                .map_err(|e| Error::io("mmap (buffer pool)", e))?,
        };
        let stats: Arc<Stats> = cfg.stats.clone().unwrap_or_default();
        let mut profile_note = None;
        let tx: Box<dyn Transmit> = match cfg.path {
            TxPath::Auto => {
                let local = local_ip(&sock);
                let loaded = crate::auto::load::load(&cfg.profile, local);
                profile_note = loaded.note;
                Box::new(AutoTx::new(
                    sock.as_fd(),
                    AutoSetup {
                        profile: loaded.profile.as_deref(),
                        touch: cfg.touch,
                        pool: &pool,
                        cow: cfg.cow,
                        timeout: cfg.timeout,
                        zc_ok,
                        stats: &stats,
                    },
                ))
            }
            TxPath::Copy => Box::new(CopyTx {
                timeout: cfg.timeout,
            }),
            TxPath::Zerocopy => Box::new(ZerocopyTx::new(cfg.policy, cfg.timeout, !zc_ok)),
            TxPath::Uring => Box::new(UringTx::new(&pool, cfg.policy, cfg.timeout, &stats)),
            TxPath::Cow => Box::new(CowTx::new(
                sock.as_fd(),
                cfg.policy,
                cfg.cow,
                cfg.timeout,
                !zc_ok,
            )),
        };
        Ok(Sender {
            sock,
            tx,
            path: cfg.path,
            pool,
            stats,
            timeout: cfg.timeout,
            file: FileTx::default(),
            file_tx: cfg.file_tx,
            profile_note,
        })
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
    /// reading, so the kernel still holds every buffer — rather than hang.
    pub fn buffer(&mut self) -> Result<TxBuf> {
        if let Some(b) = self.pool.try_take() {
            return Ok(b);
        }
        self.stats.add_pool_waits(1);
        let deadline = Instant::now() + self.timeout;
        loop {
            self.tx.reap(self.sock.as_fd(), &self.stats)?;
            if let Some(b) = self.pool.try_take() {
                return Ok(b);
            }
            let now = Instant::now();
            if now >= deadline {
                self.stats.add_pool_timeouts(1);
                return Err(Error::PoolExhausted(self.timeout));
            }
            let slice = (deadline - now).min(Duration::from_millis(10));
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
        self.tx.send_buf(self.sock.as_fd(), buf, &self.stats)
    }

    /// Sends `data` with copy semantics: `data` may be reused as soon as this returns. On
    /// the `cow` path its page-aligned middle goes zero-copy while write-protected
    /// ([`crate::cow`]); elsewhere it is copied.
    pub fn send_slice(&mut self, data: &[u8]) -> Result<()> {
        self.tx
            .send_slice(self.sock.as_fd(), data, &self.stats, self.timeout)?;
        self.tx.reap(self.sock.as_fd(), &self.stats)?;
        Ok(())
    }

    /// Sends `len` bytes of `file` starting at `offset` (the file position does not move)
    /// with the configured [`FileTxMode`] — `sendfile(2)` by default — and returns `len`.
    ///
    /// The bytes go from the page cache to the socket without a user-space copy; where the
    /// file refuses (`EINVAL`/`ENOSYS`/`EOPNOTSUPP`, e.g. most /proc files) the rest goes by
    /// `pread` + `send`, counted as [`FallbackReason::FileUnsupported`]. A range past the end
    /// of a regular file is [`Error::RangeBeyondEof`] before anything is sent; a file that
    /// ends early anyway (truncated under us, or a /proc file reporting size 0) is
    /// [`Error::Truncated`] with the bytes that did go out. Each blocking call is bounded by
    /// the socket timeout ([`Error::Timeout`]).
    pub fn send_file(&mut self, file: &std::fs::File, offset: u64, len: u64) -> Result<u64> {
        self.send_file_with(file, offset, len, self.file_tx)
    }

    /// [`Sender::send_file`] with an explicit mode.
    pub fn send_file_with(
        &mut self,
        file: &std::fs::File,
        offset: u64,
        len: u64,
        mode: FileTxMode,
    ) -> Result<u64> {
        let n = self.file.send(
            self.sock.as_fd(),
            file,
            offset,
            len,
            mode,
            &self.stats,
            self.timeout,
        )?;
        self.tx.reap(self.sock.as_fd(), &self.stats)?;
        Ok(n)
    }

    /// Waits until the kernel has returned every loaned buffer (bounded by the timeout).
    pub fn flush(&mut self) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        while self.tx.buffers_in_flight() > 0 {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    op: "waiting for zero-copy completions",
                    after: self.timeout,
                });
            }
            self.tx.wait(
                self.sock.as_fd(),
                &self.stats,
                (deadline - now).min(Duration::from_millis(50)),
            )?;
        }
        Ok(())
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

impl Drop for Sender {
    fn drop(&mut self) {
        if self.tx.buffers_in_flight() > 0 {
            // Give the kernel a short, bounded chance to finish; what it still holds after
            // that is unmapped, never recycled while it may still be read.
            let deadline = Instant::now() + self.timeout.min(Duration::from_secs(2));
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

/// How a [`Receiver`] is set up.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReceiverConfig {
    /// Receive path.
    pub path: RxPath,
    /// Size of the socket mapping for the mmap path: released in one batch when used up.
    pub map_bytes: usize,
    /// Size of the copy buffer (copy path) or of the scratch buffer for unmappable bytes.
    pub buf_bytes: usize,
    /// `SO_RCVLOWAT`: fewer, larger zero-copy calls (findings §2: 4 MiB halves receiver CPU
    /// with an 8 MiB map). Leave unset for request/response traffic.
    pub rcvlowat: Option<usize>,
    /// Advertise a page-multiple MSS on the listener (mmap path) so payloads land in whole
    /// pages; derived from the MTU of the bound interface.
    pub page_multiple_mss: bool,
    /// `SO_RCVBUF`, if set.
    pub rcvbuf: Option<usize>,
    /// Bound on every blocking step.
    pub timeout: Duration,
    /// Counters to share with others.
    pub stats: Option<Arc<Stats>>,
    /// Hardware receive queue the `zcrx` path registers (`ethtool -N` must steer the flow
    /// there; see [`zcnet_sys::uring::zcrx`]).
    pub zcrx_queue: u32,
    /// How [`Receiver::recv_to_file`] moves stream bytes into the file (`splice` by default).
    pub file_rx: FileRxMode,
    /// Pre-size the target range with `fallocate(2)` before [`Receiver::recv_to_file`]
    /// writes it (on by default: out-of-space shows at once, and extents come out whole).
    pub file_preallocate: bool,
    /// Where the `auto` path finds this host's profile.
    pub profile: ProfileSource,
    /// Whether the application reads the data it receives (`auto` uses the profile's
    /// matching variant).
    pub touch: bool,
    /// Bytes the application typically takes per receive: the size `auto` looks up in the
    /// profile (256 KiB by default, a bulk stream's read size).
    pub op_size: usize,
}

impl Default for ReceiverConfig {
    fn default() -> Self {
        ReceiverConfig {
            path: RxPath::Auto,
            map_bytes: 4 << 20,
            buf_bytes: 256 * 1024,
            rcvlowat: None,
            page_multiple_mss: true,
            rcvbuf: None,
            timeout: Duration::from_secs(30),
            stats: None,
            zcrx_queue: 0,
            file_rx: FileRxMode::Splice,
            file_preallocate: true,
            profile: ProfileSource::Default,
            touch: true,
            op_size: 256 * 1024,
        }
    }
}

impl ReceiverConfig {
    /// Defaults with receive path `path`.
    pub fn new(path: RxPath) -> Self {
        ReceiverConfig {
            path,
            ..Default::default()
        }
    }
}

/// A listening socket that accepts [`Receiver`]s.
#[derive(Debug)]
pub struct Listener {
    sock: Socket,
    cfg: ReceiverConfig,
    mss: Option<u32>,
    auto: Option<AutoRxChoice>,
}

fn tcp_timestamps_enabled() -> bool {
    // /proc/sys/net resolves to the calling thread's network namespace.
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_timestamps")
        .map(|s| s.trim() != "0")
        .unwrap_or(true)
}

impl Listener {
    /// Binds and listens on `addr`. For the mmap path with `page_multiple_mss`, sets
    /// `TCP_MAXSEG` to the page-multiple MSS of the bound interface's MTU first (the MSS is
    /// advertised in the handshake, so it cannot be changed later).
    pub fn bind(addr: SocketAddr, cfg: &ReceiverConfig) -> Result<Listener> {
        // `auto` decides now: the mapping path's MSS must be set before listen.
        let auto = (cfg.path == RxPath::Auto).then(|| crate::rx::auto::choose(cfg, addr.ip()));
        let cfg = &match &auto {
            Some(a) => ReceiverConfig {
                path: a.path,
                ..cfg.clone()
            },
            None => cfg.clone(),
        };
        let sock = Socket::new(Domain::for_address(addr), Type::STREAM, None)
            .map_err(|e| Error::io("socket", e))?;
        sock.set_reuse_address(true)
            .map_err(|e| Error::io("setsockopt(SO_REUSEADDR)", e))?;
        if let Some(n) = cfg.rcvbuf {
            sock.set_recv_buffer_size(n)
                .map_err(|e| Error::io("setsockopt(SO_RCVBUF)", e))?;
        }
        let mut mss = None;
        if cfg.path == RxPath::Mmap && cfg.page_multiple_mss {
            if let Ok(Some(mtu)) = socket::mtu_for_addr(addr.ip()) {
                mss = page_multiple_mss(
                    mtu,
                    addr.is_ipv6(),
                    tcp_timestamps_enabled(),
                    page_size() as u32,
                );
                if let Some(m) = mss {
                    sock.set_tcp_mss(m)
                        .map_err(|e| Error::io("setsockopt(TCP_MAXSEG)", e))?;
                }
            }
        }
        sock.bind(&SockAddr::from(addr))
            .map_err(|e| Error::io("bind", e))?;
        sock.listen(128).map_err(|e| Error::io("listen", e))?;
        Ok(Listener {
            sock,
            cfg: cfg.clone(),
            mss,
            auto,
        })
    }

    /// The bound address (with the port the kernel chose for port 0).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.sock
            .local_addr()
            .map_err(|e| Error::io("getsockname", e))?
            .as_socket()
            .ok_or_else(|| Error::io("getsockname", std::io::Error::other("not an IP address")))
    }

    /// The MSS advertised for the mmap path, if one was set.
    pub fn mss(&self) -> Option<u32> {
        self.mss
    }

    /// Accepts one connection (bounded by the configured timeout).
    pub fn accept(&self) -> Result<Receiver> {
        let ev = loop {
            match socket::poll(self.sock.as_fd(), libc::POLLIN, Some(self.cfg.timeout)) {
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                r => break r.map_err(|e| Error::io("poll (accept)", e))?,
            }
        };
        if ev == 0 {
            return Err(Error::Timeout {
                op: "accept",
                after: self.cfg.timeout,
            });
        }
        let (sock, _) = loop {
            match self.sock.accept() {
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                r => break r.map_err(|e| Error::io("accept", e))?,
            }
        };
        Receiver::setup(sock, &self.cfg, self.auto.clone())
    }
}

/// The receiving end of a TCP connection.
pub struct Receiver {
    sock: Socket,
    rx: Box<dyn Receive>,
    path: RxPath,
    stats: Arc<Stats>,
    file: FileRx,
    file_rx: FileRxMode,
    file_preallocate: bool,
    timeout: Duration,
    profile_note: Option<String>,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("path", &self.path)
            .finish()
    }
}

impl Receiver {
    /// Wraps an already connected stream.
    pub fn from_stream(stream: TcpStream, cfg: &ReceiverConfig) -> Result<Receiver> {
        let sock = Socket::from(OwnedFd::from(stream));
        if cfg.path != RxPath::Auto {
            return Self::setup(sock, cfg, None);
        }
        let local = local_ip(&sock);
        let auto = crate::rx::auto::choose(cfg, local);
        let cfg = ReceiverConfig {
            path: auto.path,
            ..cfg.clone()
        };
        Self::setup(sock, &cfg, Some(auto))
    }

    /// `cfg.path` is concrete here; `auto` is the decision that chose it, if `auto` did.
    fn setup(sock: Socket, cfg: &ReceiverConfig, auto: Option<AutoRxChoice>) -> Result<Receiver> {
        sock.set_read_timeout(Some(cfg.timeout))
            .map_err(|e| Error::io("setsockopt(SO_RCVTIMEO)", e))?;
        sock.set_write_timeout(Some(cfg.timeout))
            .map_err(|e| Error::io("setsockopt(SO_SNDTIMEO)", e))?;
        if let Some(n) = cfg.rcvlowat {
            socket::set_int(
                sock.as_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                n.min(i32::MAX as usize) as i32,
            )
            .map_err(|e| Error::io("setsockopt(SO_RCVLOWAT)", e))?;
        }
        let stats = cfg.stats.clone().unwrap_or_default();
        if let Some(a) = &auto {
            stats.add_auto_rx(&a.delta);
        }
        let (rx, path): (Box<dyn Receive>, RxPath) = match cfg.path {
            RxPath::Copy | RxPath::Auto => (
                Box::new(CopyRx::new(cfg.buf_bytes, cfg.timeout)),
                RxPath::Copy,
            ),
            RxPath::Mmap => match SocketMap::new(sock.as_fd(), cfg.map_bytes) {
                Ok(map) => {
                    let mut rx = MmapRx::new(map, cfg.buf_bytes, cfg.timeout);
                    if let Some(a) = &auto {
                        rx = rx.with_auto(AutoDemotion::new(a.expect_mapping));
                    }
                    (Box::new(rx), RxPath::Mmap)
                }
                Err(_) => {
                    // A kernel without TCP mmap: every receive copies, and says so.
                    stats.fallback(FallbackReason::Unsupported, 0);
                    (
                        Box::new(CopyRx::new(cfg.buf_bytes, cfg.timeout)),
                        RxPath::Copy,
                    )
                }
            },
            RxPath::Uring | RxPath::Zcrx => crate::rx::uring::setup(sock.as_fd(), cfg, &stats),
        };
        Ok(Receiver {
            sock,
            rx,
            path,
            stats,
            file: FileRx::default(),
            file_rx: cfg.file_rx,
            file_preallocate: cfg.file_preallocate,
            timeout: cfg.timeout,
            profile_note: auto.and_then(|a| a.note),
        })
    }

    /// On the `auto` path: why no profile is in force, for the caller to show (see
    /// [`Sender::profile_note`]).
    pub fn profile_note(&self) -> Option<&str> {
        self.profile_note.as_deref()
    }

    /// The path in effect (copy if the mmap path was asked for but is unsupported).
    pub fn path(&self) -> RxPath {
        self.path
    }

    /// Live counters.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// The socket, for options zcnet does not set.
    pub fn socket(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Result<SocketAddr> {
        self.sock
            .peer_addr()
            .map_err(|e| Error::io("getpeername", e))?
            .as_socket()
            .ok_or_else(|| Error::io("getpeername", std::io::Error::other("not an IP address")))
    }

    /// The next bytes of the stream, lent until the chunk is dropped; `None` at end of
    /// stream.
    pub fn recv(&mut self) -> Result<Option<RxChunk<'_>>> {
        self.rx.recv(self.sock.as_fd(), &self.stats)
    }

    /// Copy semantics: the next bytes into `buf`; 0 at end of stream.
    pub fn recv_into(&mut self, buf: &mut [u8]) -> Result<usize> {
        // A buffer still in flight on a `cow` sender is write-protected, and the kernel's
        // write would fail (EFAULT): receive into scratch and copy instead (crate::cow).
        let (rx, fd, stats) = (&mut self.rx, self.sock.as_fd(), &self.stats);
        crate::cow::kernel_write_into(buf, |b| rx.recv_into(fd, b, stats))
    }

    /// Receives exactly the next `len` bytes of the stream into `file` at `offset` (the file
    /// position does not move) with the configured [`FileRxMode`] — `splice(2)` socket →
    /// pipe → file by default — and returns `len`.
    ///
    /// Bytes an earlier [`Receiver::recv`]/[`Receiver::recv_into`] left in the receiver are
    /// written first, so the file gets the stream in order. The range is pre-sized with
    /// `fallocate` (unless configured off). If the stream ends first, the result is
    /// [`Error::Truncated`] with the bytes that arrived, and a file this call grew is cut back
    /// to them. Where splice is refused, the rest goes by the receiver's own path plus
    /// `pwrite`, counted as [`FallbackReason::FileUnsupported`]. A file opened `O_APPEND` is
    /// [`Error::UnsuitableFile`]. Each blocking step is bounded by the socket timeout.
    pub fn recv_to_file(&mut self, file: &std::fs::File, offset: u64, len: u64) -> Result<u64> {
        self.recv_to_file_with(file, offset, len, self.file_rx)
    }

    /// [`Receiver::recv_to_file`] with an explicit mode.
    pub fn recv_to_file_with(
        &mut self,
        file: &std::fs::File,
        offset: u64,
        len: u64,
        mode: FileRxMode,
    ) -> Result<u64> {
        self.file.recv(
            self.sock.as_fd(),
            self.rx.as_mut(),
            file,
            offset,
            len,
            mode,
            self.file_preallocate,
            &self.stats,
            self.timeout,
        )
    }

    /// Borrow-scoped receive (smoltcp's `RxToken::consume` idiom): runs `f` on the next bytes
    /// and releases them when it returns. `None` at end of stream.
    pub fn recv_with<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>> {
        Ok(self.recv()?.map(|c| f(&c)))
    }
}
