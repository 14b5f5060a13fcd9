//! AF_XDP sockets: the receive and transmit ground under Lightweight Messages
//! (`docs/lm-afxdp.md`).
//!
//! The Lightweight Messages paper (Jin, Zhang, Tan, "Lightweight Messages", §3.2) had to patch a NIC driver so that the
//! fragments of one message land back to back in one buffer mapped into the application.
//! AF_XDP (kernel `Documentation/networking/af_xdp.rst`) gives user space that driver level:
//! the application owns a memory area (the UMEM), says where each received frame may go by
//! posting chunk addresses on the FILL ring — with unaligned chunks, *any* address — and
//! reads frames in place from the RX ring. Transmit is the mirror: frames built in the UMEM,
//! posted on the TX ring, handed back on the COMPLETION ring.
//!
//! This module is the safe layer over [`zcnet_sys::xsk`], which owns the memory and keeps
//! the ledger of what the kernel holds (so no slice here can alias a kernel write):
//!
//! * [`XskSocket`] — one socket with its own UMEM of `frame_count` frames; [`XskSocket::bind`]
//!   to an interface queue in [`BindMode::Copy`], [`BindMode::ZeroCopy`] or
//!   [`BindMode::PreferZeroCopy`] (zero-copy refused → copy, with the errno kept in the
//!   [`Binding`]); frames are either ours (free), on the FILL ring, received, or on the TX
//!   ring.
//! * [`RxFrame`] — a received frame, borrowed in place from the UMEM; dropping it posts its
//!   chunk back on the FILL ring.
//! * [`TxFrame`] — a free frame to write a packet into, then [`TxFrame::send`].
//! * [`crate::RedirectProgram`] — the XDP program that steers frames to the socket.
//! * [`crate::wire::udp`] — Ethernet/IPv4/UDP header parsing for what arrives.
//!
//! Where it runs: a socket, its bind and the program's attach act in the network namespace
//! of the thread that calls them (`VethPair::run_in_b` in the tests).

use std::fmt;
use std::io;
use std::time::{Duration, Instant};

use rustix::net::xdp::SocketAddrXdpFlags;

use zcnet_sys::xsk::{self as sys, AccessError, Geometry, RingSizes, Xsk};

/// How a socket is configured: its UMEM and its rings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct XskConfig {
    /// Bytes per UMEM frame (chunk): a power of two from 2048 to the page size unless
    /// `unaligned`. A received frame gets `frame_size - headroom - 256` bytes.
    pub frame_size: u32,
    /// Frames in the UMEM; its size is `frame_size * frame_count`.
    pub frame_count: u32,
    /// Bytes the kernel leaves unused at the start of each frame (room to prepend headers).
    pub headroom: u32,
    /// Register the UMEM with `XDP_UMEM_UNALIGNED_CHUNK_FLAG`: FILL and TX addresses may be
    /// anywhere, which is what driver-level defragmentation needs.
    pub unaligned: bool,
    /// FILL ring entries (power of two).
    pub fill_ring: u32,
    /// COMPLETION ring entries (power of two).
    pub completion_ring: u32,
    /// RX ring entries (power of two).
    pub rx_ring: u32,
    /// TX ring entries (power of two).
    pub tx_ring: u32,
}

impl Default for XskConfig {
    /// 1024 frames of 4 KiB (4 MiB of UMEM), aligned, rings of 512: half the frames can sit
    /// on the FILL ring while the other half transmit.
    fn default() -> XskConfig {
        XskConfig {
            frame_size: 4096,
            frame_count: 1024,
            headroom: 0,
            unaligned: false,
            fill_ring: 512,
            completion_ring: 512,
            rx_ring: 512,
            tx_ring: 512,
        }
    }
}

impl XskConfig {
    /// The same configuration with unaligned chunks.
    pub fn with_unaligned(mut self, unaligned: bool) -> XskConfig {
        self.unaligned = unaligned;
        self
    }

    /// The same configuration with `count` frames of `size` bytes.
    pub fn with_frames(mut self, size: u32, count: u32) -> XskConfig {
        self.frame_size = size;
        self.frame_count = count;
        self
    }

    fn geometry(&self) -> Geometry {
        Geometry {
            chunk_size: self.frame_size,
            chunk_count: self.frame_count,
            headroom: self.headroom,
            unaligned: self.unaligned,
        }
    }

    fn rings(&self) -> RingSizes {
        RingSizes {
            fill: self.fill_ring,
            completion: self.completion_ring,
            rx: self.rx_ring,
            tx: self.tx_ring,
        }
    }
}

/// Which data path `bind` asks for (af_xdp.rst "XDP_COPY and XDP_ZEROCOPY bind flags").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BindMode {
    /// `XDP_COPY`: the kernel copies each frame between the driver's buffer and the UMEM.
    /// Works on any interface (veth, generic XDP).
    Copy,
    /// `XDP_ZEROCOPY`: the NIC DMAs straight into the UMEM, or the bind fails (`EOPNOTSUPP`
    /// without driver support, as on veth).
    ZeroCopy,
    /// Zero-copy where the driver has it, copy otherwise; the refusal is kept in the
    /// [`Binding`] so the caller can count the fallback.
    PreferZeroCopy,
}

impl BindMode {
    /// `copy`, `zerocopy` or `prefer-zerocopy`.
    pub fn name(self) -> &'static str {
        match self {
            BindMode::Copy => "copy",
            BindMode::ZeroCopy => "zerocopy",
            BindMode::PreferZeroCopy => "prefer-zerocopy",
        }
    }
}

impl fmt::Display for BindMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a successful [`XskSocket::bind`] got.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Binding {
    /// The interface index bound to.
    pub ifindex: u32,
    /// The queue bound to.
    pub queue: u32,
    /// `XDP_OPTIONS_ZEROCOPY` after the bind: the kernel's word on the data path.
    pub zero_copy: bool,
    /// With [`BindMode::PreferZeroCopy`]: the errno of the refused zero-copy bind.
    pub zero_copy_refused: Option<i32>,
}

/// AF_XDP failures. Setup steps carry the step and the kernel's errno.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum XskError {
    /// A configuration the kernel would refuse, caught before any syscall.
    #[error("invalid AF_XDP configuration: {0}")]
    Config(&'static str),
    /// Socket, UMEM or ring setup failed.
    #[error("AF_XDP setup: {0}")]
    Setup(#[from] sys::SetupError),
    /// `bind(2)` refused.
    #[error("AF_XDP bind to {ifname} queue {queue} in {mode} mode: {source}")]
    Bind {
        /// Interface name.
        ifname: String,
        /// Queue id.
        queue: u32,
        /// The mode asked for.
        mode: BindMode,
        /// The kernel's answer (zero-copy on veth: `EOPNOTSUPP`).
        #[source]
        source: io::Error,
    },
    /// The socket is already bound; AF_XDP sockets bind once.
    #[error("the AF_XDP socket is already bound")]
    AlreadyBound,
    /// The operation needs a bound socket.
    #[error("the AF_XDP socket is not bound")]
    NotBound,
    /// A UMEM range or ring operation was refused.
    #[error("UMEM: {0}")]
    Access(#[from] AccessError),
    /// A syscall on a set-up socket failed.
    #[error("{op}: {source}")]
    Io {
        /// What was called.
        op: &'static str,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// The XDP program could not be loaded, attached or given the socket.
    #[error("XDP program: {op}: {source}")]
    Program {
        /// The step.
        op: &'static str,
        /// What the loader said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl XskError {
    /// The errno underneath, if the kernel refused something.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            XskError::Setup(e) => e.source.raw_os_error(),
            XskError::Bind { source, .. } | XskError::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// An AF_XDP socket with its own UMEM; see the module docs.
#[derive(Debug)]
pub struct XskSocket {
    xsk: Xsk,
    config: XskConfig,
    /// Frames that are ours: not on any ring and not lent out.
    free: Vec<u64>,
    binding: Option<Binding>,
    /// Set by [`XskSocket::manage_by_address`]: the caller places frames itself and no
    /// frame goes back on the free list.
    by_address: bool,
}

impl XskSocket {
    /// Creates the socket, maps and registers its UMEM (`XDP_UMEM_REG`) and its four rings.
    /// Every frame starts free.
    pub fn new(config: XskConfig) -> Result<XskSocket, XskError> {
        config.geometry().check().map_err(XskError::Config)?;
        config.rings().check().map_err(XskError::Config)?;
        let xsk = Xsk::new(config.geometry(), config.rings())?;
        let size = u64::from(config.frame_size);
        let free = (0..u64::from(config.frame_count))
            .rev()
            .map(|i| i * size)
            .collect();
        Ok(XskSocket {
            xsk,
            config,
            free,
            binding: None,
            by_address: false,
        })
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &XskConfig {
        &self.config
    }

    /// Binds to `queue` of interface `ifname` (resolved in the calling thread's network
    /// namespace, which must be the socket's). For [`BindMode::PreferZeroCopy`] a refused
    /// zero-copy bind is followed by a copy bind of the same socket, and the errno is
    /// reported in the [`Binding`]. A socket whose bind failed stays unbound and may be
    /// bound again (tests/xsk.rs checks that it then receives).
    pub fn bind(&mut self, ifname: &str, queue: u32, mode: BindMode) -> Result<Binding, XskError> {
        if self.binding.is_some() {
            return Err(XskError::AlreadyBound);
        }
        let ifindex = zcnet_sys::uring::zcrx::ifindex(ifname).map_err(|source| XskError::Bind {
            ifname: ifname.to_string(),
            queue,
            mode,
            source,
        })?;
        let bind = |xsk: &Xsk, flags: SocketAddrXdpFlags, mode: BindMode| {
            xsk.bind(ifindex, queue, flags)
                .map_err(|source| XskError::Bind {
                    ifname: ifname.to_string(),
                    queue,
                    mode,
                    source,
                })
        };
        let mut refused = None;
        match mode {
            BindMode::Copy => bind(&self.xsk, SocketAddrXdpFlags::XDP_COPY, mode)?,
            BindMode::ZeroCopy => bind(&self.xsk, SocketAddrXdpFlags::XDP_ZEROCOPY, mode)?,
            BindMode::PreferZeroCopy => {
                if let Err(e) = bind(&self.xsk, SocketAddrXdpFlags::XDP_ZEROCOPY, mode) {
                    refused = Some(e.raw_os_error().unwrap_or(0));
                    bind(&self.xsk, SocketAddrXdpFlags::XDP_COPY, mode)?;
                }
            }
        }
        let zero_copy = self.xsk.is_zero_copy().map_err(|source| XskError::Io {
            op: "getsockopt(XDP_OPTIONS)",
            source,
        })?;
        let binding = Binding {
            ifindex,
            queue,
            zero_copy,
            zero_copy_refused: refused,
        };
        self.binding = Some(binding.clone());
        Ok(binding)
    }

    /// The binding, once bound.
    pub fn binding(&self) -> Option<&Binding> {
        self.binding.as_ref()
    }

    /// Frames that are ours (not on a ring, not lent out).
    pub fn free_frames(&self) -> usize {
        self.free.len()
    }

    /// Posts free frames on the FILL ring until it or the free list runs out, keeping
    /// `keep` frames back (for transmit); returns how many were posted.
    pub fn fill(&mut self, keep: usize) -> Result<usize, XskError> {
        self.require_bound()?;
        let mut posted = 0;
        while self.free.len() > keep {
            let addr = *self.free.last().expect("len > keep >= 0");
            match self.xsk.fill(addr) {
                Ok(()) => {
                    self.free.pop();
                    posted += 1;
                }
                Err(AccessError::RingFull) => break,
                Err(e) => return Err(e.into()),
            }
        }
        self.xsk.publish_fill();
        Ok(posted)
    }

    /// Posts the chunk at UMEM offset `addr` on the FILL ring. With unaligned chunks this is
    /// how a receiver decides where a frame lands; the chunk `[addr, addr + frame_size)`
    /// is the kernel's until a received frame names it. The caller keeps track of which
    /// bytes it has given away: `addr` need not be a free frame, but it may not overlap
    /// anything lent out (the borrow checker) and is refused outside the UMEM.
    pub fn fill_at(&mut self, addr: u64) -> Result<(), XskError> {
        self.require_bound()?;
        self.xsk.fill(addr)?;
        self.xsk.publish_fill();
        Ok(())
    }

    /// The next received frame, waiting up to `timeout` for one; `None` on timeout.
    /// Dropping the frame posts its chunk back on the FILL ring. A frame whose bytes are
    /// still covered by another posted chunk (overlapping [`XskSocket::fill_at`] posts) is
    /// refused with [`AccessError::InKernel`] and kept out of circulation: take such frames
    /// with [`XskSocket::recv_placed`].
    pub fn recv(&mut self, timeout: Duration) -> Result<Option<RxFrame<'_>>, XskError> {
        let Some(desc) = self.wait_rx(timeout)? else {
            return Ok(None);
        };
        // The chunk is ours now; check once that the bytes are readable, so that `Deref`
        // cannot fail later (nothing can post while the frame borrows the socket).
        self.xsk.read(desc.addr, desc.len)?;
        Ok(Some(RxFrame {
            sock: self,
            desc,
            refill: true,
        }))
    }

    /// The next received frame's placement only — where it landed and how long it is —
    /// waiting up to `timeout`. Its chunk leaves circulation, as with [`RxFrame::keep`].
    /// For receivers that post overlapping chunks (driver-level defragmentation): a frame's
    /// headers may be overwritten by the next fragment at any moment, so its bytes are read
    /// later, as part of the whole region, with [`XskSocket::umem`].
    pub fn recv_placed(&mut self, timeout: Duration) -> Result<Option<Placed>, XskError> {
        Ok(self.wait_rx(timeout)?.map(|d| Placed {
            addr: d.addr,
            len: d.len,
            chunk: d.chunk,
        }))
    }

    fn wait_rx(&mut self, timeout: Duration) -> Result<Option<sys::RxDesc>, XskError> {
        self.require_bound()?;
        let deadline = Instant::now() + timeout;
        while self.xsk.rx_available() == 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            match self.xsk.poll(
                zcnet_sys::raw::socket::PollFlags::IN,
                left.min(Duration::from_millis(100)),
            ) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => return Err(XskError::Io { op: "poll", source }),
            }
        }
        Ok(self.xsk.rx())
    }

    /// A free frame to build a packet in, after taking back whatever transmits completed;
    /// `None` if every frame is busy.
    pub fn tx_frame(&mut self) -> Result<Option<TxFrame<'_>>, XskError> {
        self.require_bound()?;
        self.reap_completions();
        // With unaligned chunks a FILL post may cover a free frame's bytes; skip those.
        let size = self.config.frame_size;
        let usable = self
            .free
            .iter()
            .rposition(|&addr| self.xsk.read(addr, size).is_ok());
        match usable.map(|i| self.free.swap_remove(i)) {
            Some(addr) => Ok(Some(TxFrame {
                sock: self,
                addr,
                posted: false,
            })),
            None => Ok(None),
        }
    }

    /// Takes completed transmits back into the free list; returns how many. (After
    /// [`XskSocket::manage_by_address`] the ranges are simply the caller's again.)
    pub fn reap_completions(&mut self) -> usize {
        let mut n = 0;
        while let Some(addr) = self.xsk.complete() {
            if !self.by_address {
                self.free.push(self.xsk.chunk_of(addr));
            }
            n += 1;
        }
        n
    }

    /// Gives up the frame-by-frame bookkeeping: the free list is emptied and from now on
    /// the caller lays out the UMEM itself, by address — [`XskSocket::umem_mut`] to write,
    /// [`XskSocket::tx_at`] to transmit any range, [`XskSocket::fill_at`] to say where a
    /// frame may land. The ledger still refuses every access to bytes the kernel holds.
    /// Lightweight Messages ([`crate::LmSocket`]) works this way: a message is one region with
    /// header holes, not a set of frames.
    pub fn manage_by_address(&mut self) {
        self.free.clear();
        self.by_address = true;
    }

    /// `len` bytes of the UMEM from `addr`, writable in place — refused if any of them is on
    /// the FILL or TX ring.
    pub fn umem_mut(&mut self, addr: u64, len: u32) -> Result<&mut [u8], XskError> {
        Ok(self.xsk.write(addr, len)?)
    }

    /// Puts `[addr, addr + len)` on the TX ring without kicking; [`XskSocket::flush_tx`]
    /// publishes and transmits. `Access(RingFull)` when the ring is full.
    pub fn tx_at(&mut self, addr: u64, len: u32) -> Result<(), XskError> {
        self.require_bound()?;
        Ok(self.xsk.tx(addr, len)?)
    }

    /// Free TX ring slots.
    pub fn tx_free(&self) -> u32 {
        self.xsk.tx_free()
    }

    /// Free FILL ring slots.
    pub fn fill_free(&self) -> u32 {
        self.xsk.fill_free()
    }

    /// Publishes what [`XskSocket::tx_at`] queued and kicks the kernel once. Copy mode sends
    /// at most 32 frames per kick (`TX_BATCH_SIZE`), so callers loop while frames remain;
    /// `EAGAIN`/`EBUSY`/`ENOBUFS` are transient and reported as `Ok(false)`.
    pub fn flush_tx(&mut self) -> Result<bool, XskError> {
        self.require_bound()?;
        self.xsk.publish_tx();
        match self.xsk.kick_tx() {
            Ok(()) => Ok(true),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS)
                ) =>
            {
                Ok(false)
            }
            Err(source) => Err(XskError::Io {
                op: "sendto(AF_XDP)",
                source,
            }),
        }
    }

    /// Descriptors the kernel has not yet taken off the TX ring.
    pub fn tx_queued(&self) -> u32 {
        self.config.tx_ring - self.xsk.tx_free()
    }

    /// RX descriptors waiting to be taken.
    pub fn rx_available(&self) -> u32 {
        self.xsk.rx_available()
    }

    /// Transmits still waiting for their completion.
    pub fn tx_in_flight(&self) -> usize {
        self.xsk.tx_in_flight()
    }

    /// `XDP_STATISTICS`: frames the kernel dropped for this socket (RX ring full, FILL ring
    /// empty, invalid descriptors).
    pub fn statistics(&self) -> Result<XskStatistics, XskError> {
        let s = self.xsk.statistics().map_err(|source| XskError::Io {
            op: "getsockopt(XDP_STATISTICS)",
            source,
        })?;
        Ok(XskStatistics {
            rx_dropped: s.rx_dropped,
            rx_invalid_descs: s.rx_invalid_descs,
            tx_invalid_descs: s.tx_invalid_descs,
            rx_ring_full: s.rx_ring_full.unwrap_or(0),
            rx_fill_ring_empty: s.rx_fill_ring_empty_descs.unwrap_or(0),
            tx_ring_empty: s.tx_ring_empty_descs.unwrap_or(0),
        })
    }

    /// `len` bytes of the UMEM from offset `addr`, borrowed in place — refused if any of
    /// them is on the FILL or TX ring. This is how a message whose frames were placed back
    /// to back by [`XskSocket::fill_at`] is read as one slice once every frame of it has
    /// been received (and kept with [`RxFrame::keep`]).
    pub fn umem(&self, addr: u64, len: u32) -> Result<&[u8], XskError> {
        Ok(self.xsk.read(addr, len)?)
    }

    /// How many FILL and TX ranges the kernel holds now.
    pub fn held_by_kernel(&self) -> usize {
        self.xsk.held_by_kernel()
    }

    fn require_bound(&self) -> Result<(), XskError> {
        match self.binding {
            Some(_) => Ok(()),
            None => Err(XskError::NotBound),
        }
    }
}

impl std::os::fd::AsFd for XskSocket {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.xsk.as_fd()
    }
}

/// Where a received frame landed in the UMEM ([`XskSocket::recv_placed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Placed {
    /// UMEM offset of the frame's first byte (its Ethernet header).
    pub addr: u64,
    /// Frame length.
    pub len: u32,
    /// The chunk it was received into (the address given to the FILL ring).
    pub chunk: u64,
}

/// The kernel's per-socket drop counters (`struct xdp_statistics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct XskStatistics {
    /// Dropped for reasons other than invalid descriptors.
    pub rx_dropped: u64,
    /// Dropped for invalid FILL descriptors.
    pub rx_invalid_descs: u64,
    /// TX descriptors the kernel refused as invalid.
    pub tx_invalid_descs: u64,
    /// Dropped because the RX ring was full.
    pub rx_ring_full: u64,
    /// Times the FILL ring was empty when a frame arrived.
    pub rx_fill_ring_empty: u64,
    /// Times the TX ring was empty when the kernel looked.
    pub tx_ring_empty: u64,
}

/// A received frame, read in place from the UMEM. Derefs to the frame's bytes (from the
/// Ethernet header on). Dropping it posts its chunk back on the FILL ring (or keeps it
/// free if the ring is full).
#[derive(Debug)]
pub struct RxFrame<'a> {
    sock: &'a mut XskSocket,
    desc: sys::RxDesc,
    refill: bool,
}

impl RxFrame<'_> {
    /// UMEM offset of the frame's first byte.
    pub fn addr(&self) -> u64 {
        self.desc.addr
    }

    /// The UMEM chunk the frame arrived in.
    pub fn chunk(&self) -> u64 {
        self.desc.chunk
    }

    /// `XDP_PKT_CONTD`: the packet continues in the next frame (multi-buffer).
    pub fn continues(&self) -> bool {
        self.desc.continues
    }

    /// Takes the chunk out of circulation — neither posted back nor made free — and
    /// returns its address, for a caller that places frames itself ([`XskSocket::fill_at`])
    /// and reads them afterwards as one region ([`XskSocket::umem`]).
    pub fn keep(mut self) -> u64 {
        self.refill = false;
        self.desc.chunk
    }
}

impl std::ops::Deref for RxFrame<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.sock
            .xsk
            .read(self.desc.addr, self.desc.len)
            .expect("checked in recv, and nothing can post while the frame is borrowed")
    }
}

impl Drop for RxFrame<'_> {
    fn drop(&mut self) {
        let chunk = self.desc.chunk;
        if !self.refill {
            return;
        }
        match self.sock.xsk.fill(chunk) {
            Ok(()) => self.sock.xsk.publish_fill(),
            Err(_) => self.sock.free.push(chunk),
        }
    }
}

/// A free UMEM frame lent for building one packet. Dropped unsent, it goes back to the
/// free list.
#[derive(Debug)]
pub struct TxFrame<'a> {
    sock: &'a mut XskSocket,
    addr: u64,
    posted: bool,
}

impl TxFrame<'_> {
    /// The whole frame, to write the packet into from its first byte.
    pub fn buf_mut(&mut self) -> &mut [u8] {
        let size = self.sock.config.frame_size;
        self.sock
            .xsk
            .write(self.addr, size)
            .expect("tx_frame lends only frames no ring covers, and nothing can post meanwhile")
    }

    /// Transmits the first `len` bytes: posts them on the TX ring and kicks the kernel
    /// (copy mode transmits inside that `sendto`). The frame returns to the free list when
    /// its completion arrives ([`XskSocket::reap_completions`]).
    pub fn send(mut self, len: u32) -> Result<(), XskError> {
        let addr = self.addr;
        let xsk = &mut self.sock.xsk;
        xsk.tx(addr, len)?;
        // Posted: from here the frame is the kernel's until its completion, not ours to drop.
        self.posted = true;
        xsk.publish_tx();
        match xsk.kick_tx() {
            Ok(()) => Ok(()),
            // Transient: the kernel transmits on the next kick.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS)
                ) =>
            {
                Ok(())
            }
            Err(source) => Err(XskError::Io {
                op: "sendto(AF_XDP)",
                source,
            }),
        }
    }
}

impl Drop for TxFrame<'_> {
    fn drop(&mut self) {
        if !self.posted {
            self.sock.free.push(self.addr);
        }
    }
}
