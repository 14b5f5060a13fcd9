//! AF_XDP sockets: the UMEM, its four rings, and who may touch which bytes when
//! (kernel `Documentation/networking/af_xdp.rst`, `include/uapi/linux/if_xdp.h`).
//!
//! The typed socket calls (`socket(AF_XDP)`, `XDP_UMEM_REG`, ring sizes, `XDP_MMAP_OFFSETS`,
//! `bind` with `sockaddr_xdp`, `XDP_STATISTICS`, `XDP_OPTIONS`) are rustix's
//! (`rustix::net::xdp`, `rustix::net::sockopt`). What is here is what rustix leaves to its
//! caller: the memory. The UMEM is one anonymous mapping that the kernel writes into (copy
//! mode: `memcpy` from the skb/xdp_buff; zero-copy: the NIC's DMA) whenever a chunk of it
//! sits on the FILL ring, and reads from while a descriptor naming it sits on the TX ring.
//! The four rings are shared single-producer/single-consumer queues mapped from the socket.
//!
//! Soundness rests on one rule, kept by [`Xsk`] itself so that every caller gets it: **no
//! slice of the UMEM is handed out while any byte of it may be in the kernel's hands.** [`Xsk`]
//! owns the mapping and a ledger of the byte ranges the kernel holds:
//!
//! * a FILL entry at chunk base `b` holds `[b, b + chunk_size)` (the kernel may write any of
//!   it) until an RX descriptor names `b` — or forever, if the kernel keeps the buffer (copy
//!   mode recycles a buffer whose packet it dropped to its own free list);
//! * a TX descriptor holds `[addr, addr + len)` until the COMPLETION ring returns `addr`.
//!
//! [`Xsk::read`] and [`Xsk::write`] refuse ranges that overlap the ledger, and every method
//! that adds to the ledger takes `&mut self`, so it cannot run while a slice from `read`
//! (`&self`) or `write` (`&mut self`) is alive. Ranges in the kernel's hands may overlap each
//! other: Lightweight Messages' driver-level defragmentation posts overlapping unaligned
//! chunks on purpose (each fragment's payload overwrites the previous one's headers).
//!
//! Ring protocol (af_xdp.rst "Rings", kernel `net/xdp/xsk_queue.h`): a producer writes the
//! descriptor, then publishes the producer index with release order; a consumer reads the
//! producer index with acquire order, reads descriptors, then publishes its consumer index
//! with release order. Indices are free-running `u32`s; slot = index & (size - 1).

use crate::raw::socket::{PollFlags, SendFlags};
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rustix::mm::{MapFlags, ProtFlags};
use rustix::net::xdp::{
    SocketAddrXdp, SocketAddrXdpFlags, XdpDesc, XdpDescOptions, XdpOptionsFlags, XdpRingFlags,
    XdpRingOffset, XdpStatistics, XdpUmemReg, XdpUmemRegFlags, XDP_PGOFF_RX_RING,
    XDP_PGOFF_TX_RING, XDP_UMEM_PGOFF_COMPLETION_RING, XDP_UMEM_PGOFF_FILL_RING,
};
use rustix::net::{sockopt, AddressFamily, SocketFlags, SocketType};

/// Space the kernel keeps in front of received data in every chunk (`XDP_PACKET_HEADROOM`,
/// include/linux/bpf.h), on top of the UMEM's own `headroom`.
pub const XDP_PACKET_HEADROOM: u32 = 256;
/// The smallest chunk the kernel accepts (`XDP_UMEM_MIN_CHUNK_SIZE`, net/xdp/xdp_umem.c).
pub const MIN_CHUNK_SIZE: u32 = 2048;
/// Unaligned-chunk descriptors carry an offset in their top 16 bits
/// (`XSK_UNALIGNED_BUF_OFFSET_SHIFT`, if_xdp.h).
pub const UNALIGNED_OFFSET_SHIFT: u32 = 48;
/// The address part of an unaligned-chunk descriptor (`XSK_UNALIGNED_BUF_ADDR_MASK`).
pub const UNALIGNED_ADDR_MASK: u64 = (1 << UNALIGNED_OFFSET_SHIFT) - 1;

/// The UMEM's shape, as registered with `XDP_UMEM_REG`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes per chunk. Aligned mode: a power of two in `MIN_CHUNK_SIZE..=page size`.
    pub chunk_size: u32,
    /// Number of chunks; the UMEM is `chunk_size * chunk_count` bytes.
    pub chunk_count: u32,
    /// Bytes the kernel leaves free at the start of each chunk, before its own
    /// [`XDP_PACKET_HEADROOM`].
    pub headroom: u32,
    /// `XDP_UMEM_UNALIGNED_CHUNK_FLAG`: FILL and TX addresses may point anywhere (a chunk
    /// then starts at the address given, not at a multiple of `chunk_size`).
    pub unaligned: bool,
}

impl Geometry {
    /// UMEM length in bytes.
    pub fn len(&self) -> u64 {
        u64::from(self.chunk_size) * u64::from(self.chunk_count)
    }

    /// Always false for a geometry that passed [`Geometry::check`].
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Why the kernel would refuse this geometry, checked before any syscall so that a bad
    /// configuration is a clear message instead of `EINVAL`.
    pub fn check(&self) -> Result<(), &'static str> {
        if self.chunk_size < MIN_CHUNK_SIZE {
            return Err("chunk size below the kernel's minimum of 2048 bytes");
        }
        if !self.unaligned && !self.chunk_size.is_power_of_two() {
            return Err("chunk size must be a power of two unless chunks are unaligned");
        }
        if self.chunk_count == 0 {
            return Err("a UMEM needs at least one chunk");
        }
        if u64::from(self.headroom) + u64::from(XDP_PACKET_HEADROOM) >= u64::from(self.chunk_size) {
            return Err("headroom leaves no room for packet data in a chunk");
        }
        if self.len() > UNALIGNED_ADDR_MASK || usize::try_from(self.len()).is_err() {
            return Err("UMEM larger than descriptors can address");
        }
        Ok(())
    }

    /// Largest frame the kernel can place in one chunk on receive.
    pub fn rx_frame_room(&self) -> u32 {
        self.chunk_size - self.headroom - XDP_PACKET_HEADROOM
    }
}

/// Entries per ring (each a power of two).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingSizes {
    /// FILL: chunks offered to the kernel for receive.
    pub fill: u32,
    /// COMPLETION: transmitted chunks handed back.
    pub completion: u32,
    /// RX: received frames.
    pub rx: u32,
    /// TX: frames to transmit.
    pub tx: u32,
}

impl RingSizes {
    /// Why the kernel would refuse these sizes (`XDP_*_RING` wants a non-zero power of two).
    pub fn check(&self) -> Result<(), &'static str> {
        for n in [self.fill, self.completion, self.rx, self.tx] {
            if n == 0 || !n.is_power_of_two() {
                return Err("ring sizes must be non-zero powers of two");
            }
        }
        Ok(())
    }
}

/// A setup step that failed, and the kernel's answer.
#[derive(Debug, thiserror::Error)]
#[error("{op}: {source}")]
pub struct SetupError {
    /// The step (`socket(AF_XDP)`, `XDP_UMEM_REG`, `mmap RX ring`, ...).
    pub op: &'static str,
    /// What the kernel said.
    #[source]
    pub source: io::Error,
}

fn step<T>(op: &'static str, r: io::Result<T>) -> Result<T, SetupError> {
    r.map_err(|source| SetupError { op, source })
}

fn step_rustix<T>(op: &'static str, r: rustix::io::Result<T>) -> Result<T, SetupError> {
    step(op, r.map_err(io::Error::from))
}

/// Why a UMEM range or address was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// The range does not lie inside the UMEM.
    #[error("range {addr:#x}+{len} lies outside the UMEM ({umem_len} bytes)")]
    OutOfBounds {
        /// Start of the range.
        addr: u64,
        /// Its length.
        len: u64,
        /// UMEM length.
        umem_len: u64,
    },
    /// Part of the range is on the FILL or TX ring: the kernel may write or read it now.
    #[error("range {addr:#x}+{len} is in the kernel's hands (FILL or TX ring)")]
    InKernel {
        /// Start of the range.
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// A transmit descriptor the kernel would drop as invalid (empty, longer than a chunk,
    /// or, with aligned chunks, crossing a chunk boundary).
    #[error("invalid TX descriptor {addr:#x}+{len}: {why}")]
    InvalidTx {
        /// Descriptor address.
        addr: u64,
        /// Descriptor length.
        len: u32,
        /// The kernel rule it breaks.
        why: &'static str,
    },
    /// The ring has no free slot.
    #[error("the ring is full")]
    RingFull,
}

/// One received frame as the RX ring described it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxDesc {
    /// UMEM offset of the first byte of the frame (the Ethernet header).
    pub addr: u64,
    /// Frame length.
    pub len: u32,
    /// The chunk the kernel took from the FILL ring for it (what to post again).
    pub chunk: u64,
    /// `XDP_PKT_CONTD`: the packet continues in the next descriptor (multi-buffer only).
    pub continues: bool,
}

/// Ranges of the UMEM the kernel may be writing (FILL) or reading (TX), with multiplicity.
#[derive(Debug, Default)]
struct Ledger {
    ranges: BTreeMap<(u64, u64), u32>,
    /// No range is longer than this (the chunk size), which bounds the overlap search.
    max_len: u64,
}

impl Ledger {
    fn new(max_len: u64) -> Ledger {
        Ledger {
            ranges: BTreeMap::new(),
            max_len,
        }
    }

    fn add(&mut self, start: u64, end: u64) {
        debug_assert!(end > start && end - start <= self.max_len);
        *self.ranges.entry((start, end)).or_insert(0) += 1;
    }

    /// Removes one occurrence; false if the range was not held.
    fn remove(&mut self, start: u64, end: u64) -> bool {
        match self.ranges.get_mut(&(start, end)) {
            Some(n) if *n > 1 => {
                *n -= 1;
                true
            }
            Some(_) => {
                self.ranges.remove(&(start, end));
                true
            }
            None => false,
        }
    }

    /// Does any held range share a byte with `[start, end)`?
    fn overlaps(&self, start: u64, end: u64) -> bool {
        let from = start.saturating_sub(self.max_len);
        self.ranges
            .range((from, 0)..(end, 0))
            .any(|(&(s, e), _)| s < end && e > start)
    }

    fn held(&self) -> usize {
        self.ranges.values().map(|&n| n as usize).sum()
    }
}

/// One ring mapped from the socket: `producer`, `consumer`, `flags` words and the
/// descriptor array, at the offsets `XDP_MMAP_OFFSETS` gave.
struct Ring<T> {
    map: NonNull<u8>,
    map_len: usize,
    producer: NonNull<AtomicU32>,
    consumer: NonNull<AtomicU32>,
    flags: Option<NonNull<AtomicU32>>,
    descs: NonNull<T>,
    size: u32,
    /// Our side's index: the next slot we produce into or consume from. The other side's
    /// index is always read fresh.
    local: u32,
    _t: PhantomData<T>,
}

impl<T: Copy> Ring<T> {
    /// Maps the ring of `size` entries at page offset `pgoff` of `fd`.
    fn map(
        fd: BorrowedFd<'_>,
        off: &XdpRingOffset,
        size: u32,
        pgoff: u64,
        we_produce: bool,
        what: &'static str,
    ) -> Result<Ring<T>, SetupError> {
        let entries = usize::try_from(size).expect("u32 fits usize");
        let map_len = usize::try_from(off.desc)
            .ok()
            .and_then(|d| d.checked_add(entries.checked_mul(size_of::<T>())?))
            .ok_or_else(|| SetupError {
                op: what,
                source: io::Error::new(io::ErrorKind::InvalidInput, "ring too large"),
            })?;
        // SAFETY: a fresh shared mapping of the socket's ring at the offset the kernel
        // defines for it (af_xdp.rst "Rings"); no existing memory is affected (null hint,
        // no MAP_FIXED). The result is checked before use and unmapped exactly once in Drop.
        let p = step_rustix(what, unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                map_len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED | MapFlags::POPULATE,
                fd,
                pgoff,
            )
        })?;
        let map = NonNull::new(p.cast::<u8>()).ok_or_else(|| SetupError {
            op: what,
            source: io::Error::other("mmap returned null"),
        })?;
        let at = |o: u64, n: usize| -> Result<NonNull<u8>, SetupError> {
            match usize::try_from(o)
                .ok()
                .filter(|&o| o.checked_add(n).is_some_and(|e| e <= map_len))
            {
                // SAFETY: o + n <= map_len, so the pointer stays inside the mapping.
                Some(o) => Ok(unsafe { map.add(o) }),
                None => Err(SetupError {
                    op: what,
                    source: io::Error::other("kernel ring offset outside the mapping"),
                }),
            }
        };
        let producer = at(off.producer, 4)?.cast::<AtomicU32>();
        let consumer = at(off.consumer, 4)?.cast::<AtomicU32>();
        let flags = match off.flags {
            Some(f) => Some(at(f, 4)?.cast::<AtomicU32>()),
            None => None,
        };
        let descs = at(off.desc, entries * size_of::<T>())?.cast::<T>();
        let mut ring = Ring {
            map,
            map_len,
            producer,
            consumer,
            flags,
            descs,
            size,
            local: 0,
            _t: PhantomData,
        };
        // A fresh ring starts at 0 on both sides; start from the kernel's view all the same.
        ring.local = if we_produce {
            ring.producer().load(Ordering::Relaxed)
        } else {
            ring.consumer().load(Ordering::Relaxed)
        };
        Ok(ring)
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: the pointer lies inside our live mapping, is 4-aligned (kernel ring
        // layout: struct xdp_ring starts with u32 producer, consumer on their own cache
        // lines), and the word is only ever accessed atomically by us and the kernel.
        unsafe { self.producer.as_ref() }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as for `producer`.
        unsafe { self.consumer.as_ref() }
    }

    fn needs_wakeup(&self) -> bool {
        self.flags.is_some_and(|f| {
            // SAFETY: as for `producer`.
            let f = unsafe { f.as_ref() };
            f.load(Ordering::Acquire) & XdpRingFlags::XDP_RING_NEED_WAKEUP.bits() != 0
        })
    }

    fn slot(&self, index: u32) -> *mut T {
        let i = usize::try_from(index & (self.size - 1)).expect("u32 fits usize");
        // SAFETY: i < size, and the mapping holds `size` descriptors from `descs`.
        unsafe { self.descs.as_ptr().add(i) }
    }

    // Producer side (FILL, TX): we own `producer`.

    fn free(&self) -> u32 {
        let consumer = self.consumer().load(Ordering::Acquire);
        self.size - self.local.wrapping_sub(consumer)
    }

    /// Writes `v` into the next slot without publishing it; false if the ring is full.
    fn push(&mut self, v: T) -> bool {
        if self.free() == 0 {
            return false;
        }
        // SAFETY: the slot lies inside the mapping, and the kernel does not read it until
        // `publish` releases the producer index past it (it is ahead of the kernel's view).
        unsafe { self.slot(self.local).write(v) };
        self.local = self.local.wrapping_add(1);
        true
    }

    fn publish(&self) {
        self.producer().store(self.local, Ordering::Release);
    }

    // Consumer side (RX, COMPLETION): we own `consumer`.

    fn available(&self) -> u32 {
        self.producer()
            .load(Ordering::Acquire)
            .wrapping_sub(self.local)
    }

    /// The next entry, if the kernel has produced one; not yet released.
    fn peek(&self) -> Option<T> {
        if self.available() == 0 {
            return None;
        }
        // SAFETY: the acquire load in `available` saw the kernel's release of this slot, and
        // the kernel will not overwrite it until we release our consumer index past it.
        Some(unsafe { self.slot(self.local).read() })
    }

    fn release_one(&mut self) {
        self.local = self.local.wrapping_add(1);
        self.consumer().store(self.local, Ordering::Release);
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        // SAFETY: map/map_len describe exactly the mapping created in `Ring::map`; nothing
        // of it is borrowed past `&mut self`.
        let _ = unsafe { rustix::mm::munmap(self.map.as_ptr().cast(), self.map_len) };
    }
}

/// The UMEM: an anonymous, pre-faulted mapping, registered with the kernel, which pins it.
struct Area {
    ptr: NonNull<u8>,
    len: usize,
}

impl Area {
    fn new(len: usize) -> Result<Area, SetupError> {
        // SAFETY: a fresh anonymous private mapping with a null hint affects no existing
        // memory; the result is checked before use and unmapped once in Drop.
        let p = step_rustix("mmap UMEM", unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::POPULATE,
            )
        })?;
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| SetupError {
            op: "mmap UMEM",
            source: io::Error::other("mmap returned null"),
        })?;
        Ok(Area { ptr, len })
    }
}

impl Drop for Area {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe exactly the mapping made in `Area::new`. The kernel pins
        // the pages while a socket still uses them (xdp_umem_pin_pages), so unmapping our view
        // cannot leave it writing into memory that is reused for something else.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// An AF_XDP socket with its own UMEM and all four rings, bound or not.
///
/// Fields drop in order: rings, then the socket (the kernel releases the UMEM's pins after
/// the last socket closes), then our view of the UMEM.
pub struct Xsk {
    fill: Ring<u64>,
    completion: Ring<u64>,
    rx: Ring<XdpDesc>,
    tx: Ring<XdpDesc>,
    fd: OwnedFd,
    area: Area,
    geometry: Geometry,
    ledger: Ledger,
    /// TX descriptors in flight, oldest first, to find a completion's length.
    tx_inflight: VecDeque<(u64, u32)>,
}

// SAFETY: Xsk uniquely owns its mappings and socket; moving it to another thread moves all
// access with it. The raw pointers are only dereferenced through `&self`/`&mut self`.
unsafe impl Send for Xsk {}

impl std::fmt::Debug for Xsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Xsk")
            .field("fd", &self.fd)
            .field("geometry", &self.geometry)
            .field("held_by_kernel", &self.ledger.held())
            .finish_non_exhaustive()
    }
}

impl Xsk {
    /// `socket(AF_XDP)`, a UMEM of `geometry` registered with `XDP_UMEM_REG`, four rings
    /// sized and mapped. Not bound: no traffic flows until [`Xsk::bind`].
    pub fn new(geometry: Geometry, rings: RingSizes) -> Result<Xsk, SetupError> {
        let invalid = |op, why| SetupError {
            op,
            source: io::Error::new(io::ErrorKind::InvalidInput, why),
        };
        geometry
            .check()
            .map_err(|why| invalid("UMEM geometry", why))?;
        rings.check().map_err(|why| invalid("ring sizes", why))?;
        let fd = step_rustix(
            "socket(AF_XDP)",
            rustix::net::socket_with(
                AddressFamily::XDP,
                SocketType::RAW,
                SocketFlags::CLOEXEC,
                None,
            ),
        )?;
        let len = usize::try_from(geometry.len()).expect("checked by Geometry::check");
        let area = Area::new(len)?;
        // Registering hands the kernel this memory for as long as the socket lives; `area`
        // is owned by the Xsk together with the socket, and every access to it goes through
        // the ledger (module docs).
        let reg = XdpUmemReg {
            addr: area.ptr.as_ptr() as u64,
            len: geometry.len(),
            chunk_size: geometry.chunk_size,
            headroom: geometry.headroom,
            flags: if geometry.unaligned {
                XdpUmemRegFlags::XDP_UMEM_UNALIGNED_CHUNK_FLAG
            } else {
                XdpUmemRegFlags::empty()
            },
            tx_metadata_len: 0,
        };
        step_rustix("XDP_UMEM_REG", sockopt::set_xdp_umem_reg(&fd, reg))?;
        step_rustix(
            "XDP_UMEM_FILL_RING",
            sockopt::set_xdp_umem_fill_ring_size(&fd, rings.fill),
        )?;
        step_rustix(
            "XDP_UMEM_COMPLETION_RING",
            sockopt::set_xdp_umem_completion_ring_size(&fd, rings.completion),
        )?;
        step_rustix("XDP_RX_RING", sockopt::set_xdp_rx_ring_size(&fd, rings.rx))?;
        step_rustix("XDP_TX_RING", sockopt::set_xdp_tx_ring_size(&fd, rings.tx))?;
        let off = step_rustix("XDP_MMAP_OFFSETS", sockopt::xdp_mmap_offsets(&fd))?;
        let fill = Ring::map(
            fd.as_fd(),
            &off.fr,
            rings.fill,
            XDP_UMEM_PGOFF_FILL_RING,
            true,
            "mmap FILL ring",
        )?;
        let completion = Ring::map(
            fd.as_fd(),
            &off.cr,
            rings.completion,
            XDP_UMEM_PGOFF_COMPLETION_RING,
            false,
            "mmap COMPLETION ring",
        )?;
        let rx = Ring::map(
            fd.as_fd(),
            &off.rx,
            rings.rx,
            XDP_PGOFF_RX_RING,
            false,
            "mmap RX ring",
        )?;
        let tx = Ring::map(
            fd.as_fd(),
            &off.tx,
            rings.tx,
            XDP_PGOFF_TX_RING,
            true,
            "mmap TX ring",
        )?;
        Ok(Xsk {
            fill,
            completion,
            rx,
            tx,
            fd,
            area,
            geometry,
            ledger: Ledger::new(u64::from(geometry.chunk_size)),
            tx_inflight: VecDeque::new(),
        })
    }

    /// `bind(2)` to queue `queue` of interface `ifindex` (looked up in the socket's network
    /// namespace) with `flags` (`XDP_COPY`, `XDP_ZEROCOPY`, `XDP_USE_NEED_WAKEUP`).
    /// `XDP_ZEROCOPY` fails with `EOPNOTSUPP` where the driver has no XSK zero-copy.
    pub fn bind(&self, ifindex: u32, queue: u32, flags: SocketAddrXdpFlags) -> io::Result<()> {
        rustix::net::bind(&self.fd, &SocketAddrXdp::new(flags, ifindex, queue))
            .map_err(io::Error::from)
    }

    /// `XDP_OPTIONS`: true if the bound socket runs in zero-copy mode.
    pub fn is_zero_copy(&self) -> io::Result<bool> {
        let o = sockopt::xdp_options(&self.fd).map_err(io::Error::from)?;
        Ok(o.contains(XdpOptionsFlags::XDP_OPTIONS_ZEROCOPY))
    }

    /// `XDP_STATISTICS`: the kernel's drop counters for this socket.
    pub fn statistics(&self) -> io::Result<XdpStatistics> {
        sockopt::xdp_statistics(&self.fd).map_err(io::Error::from)
    }

    /// The UMEM's shape.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// How many FILL and TX ranges the kernel holds now.
    pub fn held_by_kernel(&self) -> usize {
        self.ledger.held()
    }

    fn bounds(&self, addr: u64, len: u64) -> Result<(), AccessError> {
        let umem_len = self.geometry.len();
        match addr.checked_add(len) {
            Some(end) if end <= umem_len => Ok(()),
            _ => Err(AccessError::OutOfBounds {
                addr,
                len,
                umem_len,
            }),
        }
    }

    /// The chunk the kernel will use for FILL address `addr` (aligned mode masks the low
    /// bits, af_xdp.rst "UMEM Fill Ring").
    pub fn chunk_of(&self, addr: u64) -> u64 {
        if self.geometry.unaligned {
            addr & UNALIGNED_ADDR_MASK
        } else {
            addr & !(u64::from(self.geometry.chunk_size) - 1)
        }
    }

    /// Puts the chunk at `addr` on the FILL ring (not yet published: see
    /// [`Xsk::publish_fill`]). From now on the kernel may write all of
    /// `[chunk, chunk + chunk_size)`.
    pub fn fill(&mut self, addr: u64) -> Result<(), AccessError> {
        let chunk = self.chunk_of(addr);
        let size = u64::from(self.geometry.chunk_size);
        self.bounds(chunk, size)?;
        if !self.fill.push(chunk) {
            return Err(AccessError::RingFull);
        }
        self.ledger.add(chunk, chunk + size);
        Ok(())
    }

    /// Makes the FILL entries pushed so far visible to the kernel.
    pub fn publish_fill(&self) {
        self.fill.publish();
    }

    /// Free FILL slots.
    pub fn fill_free(&self) -> u32 {
        self.fill.free()
    }

    /// `XDP_RING_NEED_WAKEUP` on the FILL ring (only with `XDP_USE_NEED_WAKEUP`): the
    /// driver sleeps until a `poll`/`recvfrom` wakes it.
    pub fn fill_needs_wakeup(&self) -> bool {
        self.fill.needs_wakeup()
    }

    /// Takes the next RX descriptor. Its chunk leaves the kernel's hands (the data can then
    /// be [`Xsk::read`]); `None` if the ring is empty.
    pub fn rx(&mut self) -> Option<RxDesc> {
        let d = self.rx.peek()?;
        self.rx.release_one();
        let (chunk, addr) = if self.geometry.unaligned {
            let base = d.addr & UNALIGNED_ADDR_MASK;
            (base, base + (d.addr >> UNALIGNED_OFFSET_SHIFT))
        } else {
            (self.chunk_of(d.addr), d.addr)
        };
        // A chunk we never posted would be a kernel bug; the ledger then stays as it is and
        // `read` keeps refusing whatever overlaps what we did post.
        let size = u64::from(self.geometry.chunk_size);
        self.ledger.remove(chunk, chunk + size);
        Some(RxDesc {
            addr,
            len: d.len,
            chunk,
            continues: d.options.contains(XdpDescOptions::XDP_PKT_CONTD),
        })
    }

    /// RX descriptors waiting.
    pub fn rx_available(&self) -> u32 {
        self.rx.available()
    }

    /// Puts `[addr, addr + len)` on the TX ring (not yet published: [`Xsk::publish_tx`]).
    /// The kernel reads it until the COMPLETION ring returns `addr` ([`Xsk::complete`]).
    pub fn tx(&mut self, addr: u64, len: u32) -> Result<(), AccessError> {
        let invalid = |why| AccessError::InvalidTx { addr, len, why };
        let size = self.geometry.chunk_size;
        if len == 0 {
            return Err(invalid("empty"));
        }
        if len > size {
            return Err(invalid("longer than a chunk"));
        }
        self.bounds(addr, u64::from(len))?;
        let end = addr + u64::from(len);
        if !self.geometry.unaligned && self.chunk_of(addr) != self.chunk_of(end - 1) {
            return Err(invalid("crosses a chunk boundary"));
        }
        let desc = XdpDesc {
            addr,
            len,
            options: XdpDescOptions::empty(),
        };
        if !self.tx.push(desc) {
            return Err(AccessError::RingFull);
        }
        self.ledger.add(addr, end);
        self.tx_inflight.push_back((addr, len));
        Ok(())
    }

    /// Makes the TX descriptors pushed so far visible to the kernel.
    pub fn publish_tx(&self) {
        self.tx.publish();
    }

    /// Free TX slots.
    pub fn tx_free(&self) -> u32 {
        self.tx.free()
    }

    /// TX descriptors not yet completed.
    pub fn tx_in_flight(&self) -> usize {
        self.tx_inflight.len()
    }

    /// `sendto(fd, NULL, 0, MSG_DONTWAIT)`: asks the kernel to transmit what the TX ring
    /// holds (copy mode transmits only inside this call; af_xdp.rst "TX Ring"). `EAGAIN`,
    /// `EBUSY` and `ENOBUFS` mean "try again after completions"; they are returned as is.
    pub fn kick_tx(&self) -> io::Result<()> {
        crate::raw::socket::send(self.fd.as_fd(), &[], SendFlags::DONTWAIT).map(|_| ())
    }

    /// Takes the next COMPLETION entry: that transmit is done and its range is ours again.
    pub fn complete(&mut self) -> Option<u64> {
        let addr = self.completion.peek()?;
        self.completion.release_one();
        if let Some(i) = self.tx_inflight.iter().position(|&(a, _)| a == addr) {
            let (a, len) = self.tx_inflight.remove(i).expect("index from position");
            self.ledger.remove(a, a + u64::from(len));
        }
        Some(addr)
    }

    /// Waits up to `timeout` for the socket to become readable (RX descriptors) or, with
    /// `POLLOUT`, writable; returns the `revents`.
    pub fn poll(&self, events: PollFlags, timeout: Duration) -> io::Result<PollFlags> {
        crate::raw::socket::poll(self.fd.as_fd(), events, Some(timeout))
    }

    /// The bytes `[addr, addr + len)`, if none of them is in the kernel's hands.
    pub fn read(&self, addr: u64, len: u32) -> Result<&[u8], AccessError> {
        let start = self.checked_range(addr, len)?;
        // SAFETY: the range lies inside the live mapping (checked_range), and no byte of it
        // is on the FILL or TX ring; nothing can be added to those rings while this shared
        // borrow of `self` lives (every such method takes `&mut self`). So the kernel does
        // not write these bytes while the slice exists, and we hand out no `&mut` to them.
        Ok(unsafe { std::slice::from_raw_parts(self.area.ptr.as_ptr().add(start), len as usize) })
    }

    /// The bytes `[addr, addr + len)`, writable, if none of them is in the kernel's hands.
    pub fn write(&mut self, addr: u64, len: u32) -> Result<&mut [u8], AccessError> {
        let start = self.checked_range(addr, len)?;
        // SAFETY: as in `read`; `&mut self` makes this the only slice into the UMEM.
        Ok(unsafe {
            std::slice::from_raw_parts_mut(self.area.ptr.as_ptr().add(start), len as usize)
        })
    }

    fn checked_range(&self, addr: u64, len: u32) -> Result<usize, AccessError> {
        let len64 = u64::from(len);
        self.bounds(addr, len64)?;
        if len > 0 && self.ledger.overlaps(addr, addr + len64) {
            return Err(AccessError::InKernel { addr, len: len64 });
        }
        Ok(usize::try_from(addr).expect("inside a mapping"))
    }
}

impl AsFd for Xsk {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_finds_overlaps_and_counts_duplicates() {
        let mut l = Ledger::new(4096);
        l.add(4096, 8192);
        l.add(4096, 8192);
        l.add(10_000, 10_100);
        assert!(l.overlaps(8191, 8192));
        assert!(!l.overlaps(8192, 10_000));
        assert!(l.overlaps(0, 4097));
        assert!(!l.overlaps(0, 4096));
        assert!(l.overlaps(10_099, 20_000));
        assert!(l.remove(4096, 8192));
        assert!(l.overlaps(5000, 5001), "one of two posts still held");
        assert!(l.remove(4096, 8192));
        assert!(!l.overlaps(5000, 5001));
        assert!(!l.remove(4096, 8192));
        assert_eq!(l.held(), 1);
    }

    #[test]
    fn overlapping_unaligned_chunks_are_each_held() {
        // Driver-level defragmentation posts chunks that overlap.
        let mut l = Ledger::new(2048);
        l.add(1000, 3048);
        l.add(2500, 4548);
        assert!(l.overlaps(4000, 4001));
        assert!(l.remove(1000, 3048));
        assert!(l.overlaps(2600, 2700));
        assert!(!l.overlaps(0, 2500));
    }

    #[test]
    fn geometry_refuses_what_the_kernel_would() {
        let g = Geometry {
            chunk_size: 4096,
            chunk_count: 16,
            headroom: 0,
            unaligned: false,
        };
        assert!(g.check().is_ok());
        assert_eq!(g.rx_frame_room(), 4096 - 256);
        let bad = |g: Geometry| g.check().unwrap_err();
        assert!(bad(Geometry {
            chunk_size: 1024,
            ..g
        })
        .contains("minimum"));
        assert!(bad(Geometry {
            chunk_size: 3000,
            ..g
        })
        .contains("power of two"));
        assert!(Geometry {
            chunk_size: 3000,
            unaligned: true,
            ..g
        }
        .check()
        .is_ok());
        assert!(bad(Geometry {
            chunk_count: 0,
            ..g
        })
        .contains("at least one"));
        assert!(bad(Geometry {
            headroom: 3840,
            ..g
        })
        .contains("headroom"));
        let rings = RingSizes {
            fill: 8,
            completion: 8,
            rx: 8,
            tx: 6,
        };
        assert!(rings.check().is_err());
    }
}
