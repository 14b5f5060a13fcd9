//! [`Receiver`]: a TCP socket that receives, with its receive path chosen by [`ReceiverConfig`].

use super::local_ip;
use crate::auto::rx_choice::AutoRxChoice;
use crate::auto::ProfileSource;
use crate::error::{Error, Result};
use crate::file::recv::FileRx;
use crate::path::FallbackReason;
use crate::path::{FileRxMode, RxPath};
use crate::rx::auto::{Alt, AutoRx};
use crate::rx::mmap::AutoDemotion;
use crate::rx::{copy::CopyRx, mmap::MmapRx, Receive, RxChunk};
use crate::stats::Stats;
use socket2::{Domain, SockAddr, Socket, Type};
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;
use zcnet_sys::raw::socket;
use zcnet_sys::raw::zcrecv::SocketMap;

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
    /// `SO_RCVLOWAT`: fewer, larger zero-copy calls (docs/measurements/kernel-findings.md §2: 4 MiB halves receiver CPU
    /// with an 8 MiB map). Leave unset for request/response traffic.
    pub rcvlowat: Option<usize>,
    /// Advertise a page-multiple MSS on the listener (mmap path) so payloads land in whole
    /// pages; derived from the MTU of the bound interface.
    pub page_multiple_mss: bool,
    /// `SO_RCVBUF`, if set.
    pub rcvbuf: Option<usize>,
    /// Bound on every call — each `recv`/`recv_into`/`read`/`recv_to_file` as a whole, on
    /// every path. `None` (the default) waits as long as it takes — an idle connection is
    /// not an error — unless [`Receiver::from_stream`] finds `SO_RCVTIMEO` set on the
    /// socket, which then serves as this. A call that runs out is [`Error::Timeout`] saying
    /// how long it ran.
    pub timeout: Option<Duration>,
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
    /// Bytes per window of the `auto` path's run-time cost check (16 MiB by default,
    /// [`crate::auto::cost::WINDOW_BYTES`]): smaller windows react sooner and measure
    /// noisier.
    pub cost_window: u64,
    /// Whether an `auto` receive trial (without a profile) uses what earlier trials in this
    /// process measured on the same route and sender op size, and adds its own
    /// (`crate::auto::memory`): a candidate two trials in a row dropped as a clear loser
    /// is skipped for ten minutes, and once two trials have measured the route, three
    /// connections in four run no trial and take the path the pooled rounds found cheapest.
    /// Off by default: it is state shared by every receiver of the process, which a library
    /// keeps only when asked (the `zcnet` CLI turns it on). It keys on the sender's clock
    /// card, so it works only with [`ReceiverConfig::peer_clock`] on.
    pub trial_memory: bool,
    /// Whether an `auto` receive trial looks for its sender's clock card in the host-shared
    /// directory `/dev/shm/zcnet-$EUID/` (`peer_card`; docs/guide.md, "What zcnet touches") and counts the sender's CPU
    /// with its own. Off by default (a library touches files other processes share only
    /// when asked); the sender's half is [`crate::SenderConfig::peer_clock`].
    pub peer_clock: bool,
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
            timeout: None,
            stats: None,
            zcrx_queue: 0,
            file_rx: FileRxMode::Splice,
            file_preallocate: true,
            profile: ProfileSource::NoProfile,
            touch: true,
            op_size: 256 * 1024,
            cost_window: crate::auto::cost::WINDOW_BYTES,
            trial_memory: false,
            peer_clock: false,
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

/// Builder methods, one per field (the struct is `#[non_exhaustive]`):
/// `ReceiverConfig::new(RxPath::Mmap).timeout(d).rcvlowat(1 << 20)`.
impl ReceiverConfig {
    crate::builder::setters! {
        /// Sets [`ReceiverConfig::map_bytes`].
        map_bytes: usize,
        /// Sets [`ReceiverConfig::buf_bytes`].
        buf_bytes: usize,
        /// Sets [`ReceiverConfig::page_multiple_mss`].
        page_multiple_mss: bool,
        /// Sets [`ReceiverConfig::zcrx_queue`].
        zcrx_queue: u32,
        /// Sets [`ReceiverConfig::file_rx`].
        file_rx: FileRxMode,
        /// Sets [`ReceiverConfig::file_preallocate`].
        file_preallocate: bool,
        /// Sets [`ReceiverConfig::profile`].
        profile: ProfileSource,
        /// Sets [`ReceiverConfig::touch`].
        touch: bool,
        /// Sets [`ReceiverConfig::op_size`].
        op_size: usize,
        /// Sets [`ReceiverConfig::cost_window`].
        cost_window: u64,
        /// Sets [`ReceiverConfig::trial_memory`].
        trial_memory: bool,
        /// Sets [`ReceiverConfig::peer_clock`].
        peer_clock: bool,
    }
    crate::builder::option_setters! {
        /// Sets `SO_RCVLOWAT` ([`ReceiverConfig::rcvlowat`]).
        rcvlowat: usize,
        /// Sets `SO_RCVBUF` ([`ReceiverConfig::rcvbuf`]).
        rcvbuf: usize,
        /// Shares `stats` with others ([`ReceiverConfig::stats`]).
        stats: Arc<Stats>,
        /// Bounds every blocking step ([`ReceiverConfig::timeout`]).
        timeout: Duration,
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

/// The `auto` receive path for `choice`: its path (or, without a profile, its trial's
/// candidates) beside copy, under the run-time check.
fn auto_rx(
    sock: &Socket,
    cfg: &ReceiverConfig,
    choice: &AutoRxChoice,
    timeout: std::time::Duration,
    stats: &Stats,
) -> (Box<dyn Receive>, RxPath) {
    let copy = CopyRx::new(cfg.buf_bytes, timeout);
    let trial = !choice.trial.is_empty();
    let wanted = if trial {
        choice.trial.clone()
    } else {
        vec![choice.path]
    };
    let mut alts = Vec::new();
    for path in wanted {
        match path {
            RxPath::Mmap => match SocketMap::new(sock.as_fd(), cfg.map_bytes) {
                Ok(map) => alts.push(Alt::Mmap(Box::new(
                    MmapRx::new(map, cfg.buf_bytes, timeout)
                        // A profile's choice is demoted while the kernel maps nothing,
                        // whatever the profile measured; a trial's pick is judged by its
                        // cost (its loop can beat `recv`'s while mapping nothing).
                        .with_auto(AutoDemotion::new(!trial)),
                ))),
                // A kernel without TCP mmap: a path the profile chose is a counted
                // fallback (every receive copies); a trial simply leaves it out.
                Err(_) if !trial => stats.fallback(FallbackReason::Unsupported, 0),
                Err(_) => {}
            },
            RxPath::Uring => match crate::rx::uring::uring_rx(&crate::rx::uring::UringRxParams {
                path: RxPath::Uring,
                buf_bytes: cfg.buf_bytes,
                map_bytes: cfg.map_bytes,
                zcrx_queue: cfg.zcrx_queue,
                timeout,
            }) {
                Ok(u) => alts.push(Alt::Uring(Box::new(u))),
                // No io_uring here: likewise.
                Err(_) if !trial => stats.fallback(FallbackReason::Unsupported, 0),
                Err(_) => {}
            },
            _ => {}
        }
    }
    let first = match alts.first() {
        Some(Alt::Mmap(_)) => RxPath::Mmap,
        Some(Alt::Uring(_)) => RxPath::Uring,
        None => return (Box::new(copy), RxPath::Copy),
    };
    (
        Box::new(AutoRx::new(
            copy,
            alts,
            choice,
            cfg.cost_window,
            cfg.trial_memory,
            cfg.peer_clock,
        )),
        first,
    )
}

impl Receiver {
    /// Connects to `addr` and receives on the connection: the client end of a download.
    /// For the mmap path the page-multiple MSS is set before the handshake, as
    /// [`crate::Listener::bind`] does for a server.
    pub fn connect(addr: SocketAddr, cfg: &ReceiverConfig) -> Result<Receiver> {
        let sock = Socket::new(Domain::for_address(addr), Type::STREAM, None)
            .map_err(|e| Error::io("socket", e))?;
        if let Some(n) = cfg.rcvbuf {
            sock.set_recv_buffer_size(n)
                .map_err(|e| Error::io("setsockopt(SO_RCVBUF)", e))?;
        }
        let auto = (cfg.path == RxPath::Auto).then(|| {
            let local = crate::stream::local_route_ip(addr);
            let loaded = crate::profile::load::load(&cfg.profile, local);
            crate::auto::rx_choice::choose(&cfg.profile, loaded, cfg.touch, cfg.op_size)
        });
        let cfg = &match &auto {
            Some(a) => ReceiverConfig {
                path: a.path,
                // The page-multiple MSS buys mapping; where the profile measured `mmap`
                // mapping nothing at this size it buys nothing, and its smaller segments
                // cost the sender (and copy, should the cost check fall back to it).
                page_multiple_mss: cfg.page_multiple_mss && a.expect_mapping,
                ..cfg.clone()
            },
            None => cfg.clone(),
        };
        // The MSS we advertise is what the peer segments to; it must be set before connect.
        super::set_page_multiple_mss(&sock, addr.ip(), cfg)?;
        match cfg.timeout {
            Some(t) => sock.connect_timeout(&SockAddr::from(addr), t),
            None => sock.connect(&SockAddr::from(addr)),
        }
        .map_err(|e| Error::io("connect", e))?;
        Self::setup(sock, cfg, auto)
    }

    /// Wraps an already connected stream.
    ///
    /// The socket is taken as it is: one the caller made non-blocking (`O_NONBLOCK`) gives
    /// [`Error::WouldBlock`] from any receive that would wait, on every path (the mapped and
    /// io_uring ones too), and the next call goes on from the next unread byte; one with
    /// `SO_RCVTIMEO` set, and no [`ReceiverConfig::timeout`], is bounded by that timeout per
    /// call. Anything but a TCP socket — a `UnixStream` or a UDP socket turned into a
    /// `TcpStream` through its descriptor — is refused with [`Error::UnsuitableSocket`].
    pub fn from_stream(stream: TcpStream, cfg: &ReceiverConfig) -> Result<Receiver> {
        let sock = Socket::from(OwnedFd::from(stream));
        let timeout = super::adopt(&sock, cfg.timeout, false)?;
        let adopted;
        let cfg = if timeout == cfg.timeout {
            cfg
        } else {
            adopted = cfg.clone().timeout(timeout.unwrap_or(super::FOREVER));
            &adopted
        };
        if cfg.path != RxPath::Auto {
            return Self::setup(sock, cfg, None);
        }
        let local = local_ip(&sock);
        let loaded = crate::profile::load::load(&cfg.profile, local);
        let auto = crate::auto::rx_choice::choose(&cfg.profile, loaded, cfg.touch, cfg.op_size);
        let cfg = ReceiverConfig {
            path: auto.path,
            ..cfg.clone()
        };
        Self::setup(sock, &cfg, Some(auto))
    }

    /// `cfg.path` is concrete here; `auto` is the decision that chose it, if `auto` did.
    pub(super) fn setup(
        sock: Socket,
        cfg: &ReceiverConfig,
        auto: Option<AutoRxChoice>,
    ) -> Result<Receiver> {
        if let Some(t) = cfg.timeout {
            sock.set_read_timeout(Some(t))
                .map_err(|e| Error::io("setsockopt(SO_RCVTIMEO)", e))?;
            sock.set_write_timeout(Some(t))
                .map_err(|e| Error::io("setsockopt(SO_SNDTIMEO)", e))?;
        }
        let timeout = super::bound(cfg.timeout);
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
        let (rx, path): (Box<dyn Receive>, RxPath) = match (cfg.path, &auto) {
            (RxPath::Copy | RxPath::Mmap | RxPath::Uring, Some(a)) => {
                auto_rx(&sock, cfg, a, timeout, &stats)
            }
            _ => Self::concrete(&sock, cfg, timeout, &stats),
        };
        Ok(Receiver {
            sock,
            rx,
            path,
            stats,
            file: FileRx::default(),
            file_rx: cfg.file_rx,
            file_preallocate: cfg.file_preallocate,
            timeout,
            profile_note: auto.and_then(|a| a.note),
        })
    }

    /// The receive path `cfg.path` names, with its fallbacks; returns the path in effect.
    fn concrete(
        sock: &Socket,
        cfg: &ReceiverConfig,
        timeout: std::time::Duration,
        stats: &Stats,
    ) -> (Box<dyn Receive>, RxPath) {
        match cfg.path {
            RxPath::Copy | RxPath::Auto => {
                (Box::new(CopyRx::new(cfg.buf_bytes, timeout)), RxPath::Copy)
            }
            RxPath::Mmap => match SocketMap::new(sock.as_fd(), cfg.map_bytes) {
                Ok(map) => (
                    Box::new(MmapRx::new(map, cfg.buf_bytes, timeout)),
                    RxPath::Mmap,
                ),
                Err(_) => {
                    // A kernel without TCP mmap: every receive copies, and says so.
                    stats.fallback(FallbackReason::Unsupported, 0);
                    (Box::new(CopyRx::new(cfg.buf_bytes, timeout)), RxPath::Copy)
                }
            },
            RxPath::Uring | RxPath::Zcrx => crate::rx::uring::setup(
                sock.as_fd(),
                &crate::rx::uring::UringRxParams {
                    path: cfg.path,
                    buf_bytes: cfg.buf_bytes,
                    map_bytes: cfg.map_bytes,
                    zcrx_queue: cfg.zcrx_queue,
                    timeout,
                },
                stats,
            ),
        }
    }

    /// On the `auto` path: why no profile is in force, for the caller to show (see
    /// [`crate::Sender::profile_note`]).
    pub fn profile_note(&self) -> Option<&str> {
        self.profile_note.as_deref()
    }

    /// The path in effect (copy if the mmap path was asked for but is unsupported).
    pub fn path(&self) -> RxPath {
        self.path
    }

    /// Turns [`ReceiverConfig::file_preallocate`] on or off for the next
    /// [`Receiver::recv_to_file`] calls (a caller that reserved the space itself may want it
    /// only on some file systems).
    pub fn set_file_preallocate(&mut self, on: bool) {
        self.file_preallocate = on;
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
        let _call = crate::call::begin(self.timeout);
        self.rx.recv(self.sock.as_fd(), &self.stats)
    }

    /// Copy semantics: the next bytes into `buf`; 0 at end of stream.
    pub fn recv_into(&mut self, buf: &mut [u8]) -> Result<usize> {
        let _call = crate::call::begin(self.timeout);
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
        let _call = crate::call::begin(self.timeout);
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

    /// Gives the socket back, with the bytes this receiver already took off it but has not
    /// handed out (the rest of a chunk a short `recv_into` cut, the kernel's copy-buffer
    /// tail): they come first in the stream, before whatever the socket still holds. Refused
    /// ([`Error::Io`] with `EBUSY`) on the io_uring paths, whose armed multishot receive may
    /// still complete reads the caller would never see.
    pub fn into_inner(mut self) -> Result<(TcpStream, Vec<u8>)> {
        self.rx.release_socket(self.sock.as_fd(), &self.stats)?;
        if !self.rx.socket_handover_ok() {
            return Err(Error::io(
                "handing the socket back",
                std::io::Error::from_raw_os_error(libc::EBUSY),
            ));
        }
        let mut held = Vec::new();
        while self.rx.take_buffered(usize::MAX, &mut |b| {
            held.extend_from_slice(b);
            Ok(())
        })? > 0
        {}
        // `recv_to_file` lowers SO_RCVTIMEO to what is left of a call: give the socket back
        // with the timeout it had.
        if self.timeout < super::FOREVER {
            self.sock
                .set_read_timeout(Some(self.timeout))
                .map_err(|e| Error::io("setsockopt(SO_RCVTIMEO)", e))?;
        }
        let sock = self.sock.try_clone().map_err(|e| Error::io("dup", e))?;
        drop(self);
        Ok((TcpStream::from(OwnedFd::from(sock)), held))
    }

    /// Borrow-scoped receive (smoltcp's `RxToken::consume` idiom): runs `f` on the next bytes
    /// and releases them when it returns. `None` at end of stream.
    pub fn recv_with<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>> {
        Ok(self.recv()?.map(|c| f(&c)))
    }
}

impl AsFd for Receiver {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

impl AsRawFd for Receiver {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

/// Copy semantics, so a `Receiver` drops in wherever a reader is expected (`read_exact`,
/// `io::copy`, `BufReader`): `read` is [`Receiver::recv_into`]; 0 at end of stream.
impl io::Read for Receiver {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Ok(self.recv_into(buf)?)
    }
}
