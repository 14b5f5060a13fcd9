//! io_uring zero-copy receive ("zcrx", Linux 6.15; kernel `Documentation/networking/
//! iou-zcrx.rst`, liburing `examples/zcrx.c`): the NIC writes payloads straight into an area
//! of user memory, and the application gets offsets into it.
//!
//! The uAPI, carried here because neither Debian's headers nor every `io-uring` release have
//! it (`include/uapi/linux/io_uring.h` as of 6.15–6.18):
//!
//! * the ring must be created with `IORING_SETUP_DEFER_TASKRUN` (hence `SINGLE_ISSUER`) and
//!   `IORING_SETUP_CQE32`, else registration is `EINVAL`;
//! * `IORING_REGISTER_ZCRX_IFQ` (32) takes a [`ZcrxIfqReg`] naming an interface and one of its
//!   hardware receive queues, an [`ZcrxAreaReg`] (the memory the NIC fills) and a
//!   [`RegionDesc`] (the memory of the *refill ring*); it needs `CAP_NET_ADMIN`, a device in
//!   the caller's network namespace (`ENODEV` otherwise) whose driver has queue-management
//!   ops and header/data split (`EOPNOTSUPP` otherwise — loopback, veth, virtio: docs/measurements/kernel-findings.md §3).
//!   The admin also steers the flow to that queue (`ethtool -N … action Q`) and keeps other
//!   flows off it (RSS); nothing here can do that.
//! * `IORING_OP_RECV_ZC` (multishot) then posts 32-byte CQEs: `res` bytes at
//!   [`ZcrxCqe::off`] (area id in bits 48+, offset below) — no copy, no buffer id;
//! * the application hands each piece back through the refill ring ([`ZcrxRqe`]: the offset
//!   with the area token in the high bits, and the length), publishing the tail with a
//!   release store; the kernel consumes from the head.
//!
//! Memory: the kernel pins the area's and the refill ring's pages at registration and only
//! reaches them through those pins (page pool `net_iov`s for DMA, `kmap` for its copy
//! fallback, a `vmap` of the ring), never through our virtual addresses. Still, `Drop`
//! cancels the receive and waits, bounded, for its end before unmapping, and leaks the memory
//! when it cannot tell.

use crate::mem::{page_size, round_to_pages, PageBuf};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::collections::VecDeque;
use std::io;
use std::mem::ManuallyDrop;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// `IORING_REGISTER_ZCRX_IFQ`.
pub const IORING_REGISTER_ZCRX_IFQ: u32 = 32;
/// Bits of a CQE/RQE offset from which the area id is encoded.
pub const IORING_ZCRX_AREA_SHIFT: u32 = 48;
/// The area-id bits of an offset.
pub const IORING_ZCRX_AREA_MASK: u64 = !((1u64 << IORING_ZCRX_AREA_SHIFT) - 1);
/// `IORING_MEM_REGION_TYPE_USER`: the region's memory is ours (`user_addr`), not the kernel's.
pub const IORING_MEM_REGION_TYPE_USER: u32 = 1;

/// `struct io_uring_zcrx_offsets`: where the refill ring's parts lie in its region.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ZcrxOffsets {
    /// Offset of the kernel-written head (`u32`).
    pub head: u32,
    /// Offset of the user-written tail (`u32`).
    pub tail: u32,
    /// Offset of the [`ZcrxRqe`] array.
    pub rqes: u32,
    /// Reserved.
    pub resv2: u32,
    /// Reserved.
    pub resv: [u64; 2],
}

/// `struct io_uring_zcrx_area_reg`: the memory the NIC writes payloads into.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ZcrxAreaReg {
    /// Start address (page-aligned), or dmabuf offset with `IORING_ZCRX_AREA_DMABUF`.
    pub addr: u64,
    /// Length (whole pages).
    pub len: u64,
    /// Out: the token to put in the high bits of refill offsets.
    pub rq_area_token: u64,
    /// `IORING_ZCRX_AREA_DMABUF` or 0.
    pub flags: u32,
    /// dmabuf fd with `IORING_ZCRX_AREA_DMABUF`.
    pub dmabuf_fd: u32,
    /// Reserved.
    pub resv2: [u64; 2],
}

/// `struct io_uring_zcrx_ifq_reg`: the argument of [`IORING_REGISTER_ZCRX_IFQ`].
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ZcrxIfqReg {
    /// Interface index (in the caller's network namespace).
    pub if_idx: u32,
    /// Hardware receive queue.
    pub if_rxq: u32,
    /// Refill ring entries (in: wanted; out: rounded to a power of two).
    pub rq_entries: u32,
    /// Flags (0).
    pub flags: u32,
    /// Address of a [`ZcrxAreaReg`].
    pub area_ptr: u64,
    /// Address of a [`RegionDesc`] for the refill ring.
    pub region_ptr: u64,
    /// Out: the refill ring layout.
    pub offsets: ZcrxOffsets,
    /// Out: the id `IORING_OP_RECV_ZC` names (`zcrx_ifq_idx`).
    pub zcrx_id: u32,
    /// Reserved.
    pub resv2: u32,
    /// Reserved.
    pub resv: [u64; 3],
}

/// `struct io_uring_region_desc`: memory for a kernel-shared region.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RegionDesc {
    /// Our memory ([`IORING_MEM_REGION_TYPE_USER`]).
    pub user_addr: u64,
    /// Bytes.
    pub size: u64,
    /// [`IORING_MEM_REGION_TYPE_USER`] or 0 (kernel-allocated, then mmap at `mmap_offset`).
    pub flags: u32,
    /// Region id.
    pub id: u32,
    /// Out: where to mmap a kernel-allocated region.
    pub mmap_offset: u64,
    /// Reserved.
    pub resv: [u64; 4],
}

/// `struct io_uring_zcrx_rqe`: one piece handed back to the kernel.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ZcrxRqe {
    /// Area token | offset in the area.
    pub off: u64,
    /// Bytes.
    pub len: u32,
    /// Padding.
    pub pad: u32,
}

/// `struct io_uring_zcrx_cqe`: the second half of a RECV_ZC CQE32.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ZcrxCqe {
    /// Area id (bits 48+) | offset of the received bytes in the area.
    pub off: u64,
    /// Padding.
    pub pad: u64,
}

const _: () = {
    assert!(std::mem::size_of::<ZcrxOffsets>() == 32);
    assert!(std::mem::size_of::<ZcrxAreaReg>() == 48);
    assert!(std::mem::size_of::<ZcrxIfqReg>() == 96);
    assert!(std::mem::size_of::<RegionDesc>() == 64);
    assert!(std::mem::size_of::<ZcrxRqe>() == 16);
    assert!(std::mem::size_of::<ZcrxCqe>() == 16);
};

/// The offset within the area of a CQE's `off` (the area id stripped).
pub fn area_offset(cqe_off: u64) -> u64 {
    cqe_off & !IORING_ZCRX_AREA_MASK
}

/// The refill entry for `len` bytes at CQE offset `cqe_off` of the area with `token`.
pub fn refill_entry(cqe_off: u64, len: u32, token: u64) -> ZcrxRqe {
    ZcrxRqe {
        off: area_offset(cqe_off) | token,
        len,
        pad: 0,
    }
}

/// Bytes for a refill ring of `entries`: the entries plus a page for head and tail, in
/// whole pages (as liburing's example sizes it).
pub fn refill_ring_bytes(entries: u32, page: usize) -> usize {
    let raw = entries as usize * std::mem::size_of::<ZcrxRqe>() + page;
    raw.div_ceil(page) * page
}

/// Whether `[off, off + len)` lies in an area of `area_len` bytes.
pub fn in_area(off: u64, len: u64, area_len: u64) -> bool {
    off.checked_add(len).is_some_and(|end| end <= area_len)
}

/// Index of the interface `name` in the calling thread's network namespace
/// (`if_nametoindex(3)`); `ENODEV` if there is none.
pub fn ifindex(name: &str) -> io::Result<u32> {
    let c = std::ffi::CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name with NUL"))?;
    // SAFETY: c is a NUL-terminated string living across the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        Err(io::Error::from_raw_os_error(libc::ENODEV))
    } else {
        Ok(i)
    }
}

/// Index of the interface that holds `addr` in the calling thread's network namespace
/// (`getifaddrs(3)`), `None` if no interface has it.
pub fn ifindex_for_addr(addr: IpAddr) -> io::Result<Option<u32>> {
    Ok(crate::raw::socket::find_interface(|a| a == addr)?.and_then(|n| ifindex(&n).ok()))
}

fn register_ifq(ring_fd: i32, reg: &mut ZcrxIfqReg) -> io::Result<()> {
    // SAFETY: reg is a live, properly laid-out io_uring_zcrx_ifq_reg (size checked above)
    // whose area_ptr/region_ptr point at live structs of the caller's; the kernel reads
    // them and writes back into the three structs only.
    let r = unsafe {
        libc::syscall(
            libc::SYS_io_uring_register,
            ring_fd,
            IORING_REGISTER_ZCRX_IFQ,
            (reg as *mut ZcrxIfqReg).cast::<libc::c_void>(),
            1u32,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The memory a registration needs: area, refill ring, and their descriptors.
struct ZcrxMemory {
    area: PageBuf,
    rq: PageBuf,
    area_reg: ZcrxAreaReg,
    region: RegionDesc,
    reg: ZcrxIfqReg,
}

impl ZcrxMemory {
    fn new(ifindex: u32, rxq: u32, area_bytes: usize, rq_entries: u32) -> io::Result<Self> {
        let rq_entries = rq_entries.clamp(1, 1 << 15).next_power_of_two();
        let area = PageBuf::new(round_to_pages(area_bytes))?;
        let rq = PageBuf::new(refill_ring_bytes(rq_entries, page_size()))?;
        let area_reg = ZcrxAreaReg {
            addr: area.as_ptr() as u64,
            len: area.len() as u64,
            ..Default::default()
        };
        let region = RegionDesc {
            user_addr: rq.as_ptr() as u64,
            size: rq.len() as u64,
            flags: IORING_MEM_REGION_TYPE_USER,
            ..Default::default()
        };
        let reg = ZcrxIfqReg {
            if_idx: ifindex,
            if_rxq: rxq,
            rq_entries,
            ..Default::default()
        };
        Ok(ZcrxMemory {
            area,
            rq,
            area_reg,
            region,
            reg,
        })
    }

    /// Registers with the ring `ring_fd`. The structs live in `self` (heap-free but pinned
    /// for the call's duration by `&mut`).
    fn register(&mut self, ring_fd: i32) -> io::Result<()> {
        self.reg.area_ptr = (&mut self.area_reg as *mut ZcrxAreaReg) as u64;
        self.reg.region_ptr = (&mut self.region as *mut RegionDesc) as u64;
        register_ifq(ring_fd, &mut self.reg)
    }
}

/// Tries `IORING_REGISTER_ZCRX_IFQ` on an ordinary ring (no `DEFER_TASKRUN`, 16-byte CQEs)
/// and returns the kernel's answer: `EINVAL` on kernels with zcrx, as the uAPI requires
/// those ring flags. For probes and tests of the refusal path; a success would be a kernel
/// that ignores the rule (the registration is torn down with the ring).
pub fn try_register_on_plain_ring(ifindex: u32, rxq: u32) -> io::Result<()> {
    let ring = IoUring::new(8)?;
    let mut mem = ZcrxMemory::new(ifindex, rxq, 64 * 1024, 64)?;
    let r = mem.register(ring.as_raw_fd());
    // The ring goes first; the kernel reached the memory only through its own page pins.
    drop(ring);
    drop(mem);
    r
}

static NEXT_QUEUE_ID: AtomicU64 = AtomicU64::new(1);

/// A piece of the area handed to the application by a RECV_ZC CQE; the kernel will not reuse
/// it until [`ZcrxQueue::recycle`] hands it back.
#[derive(Debug, PartialEq, Eq)]
pub struct ZcLent {
    queue: u64,
    /// Offset in the area.
    off: u64,
    len: u32,
}

impl ZcLent {
    /// Bytes.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// One completion of the zero-copy receive.
#[derive(Debug, PartialEq, Eq)]
pub enum ZcrxEvent {
    /// Bytes placed in the area; without `more` the request ended and must be armed again.
    Data {
        /// Where, lent until recycled.
        buf: ZcLent,
        /// `IORING_CQE_F_MORE`.
        more: bool,
    },
    /// The request ended: `res` 0 is end of stream, `-ENOSPC` asks for a new request, any
    /// other negative value is `-errno`.
    End {
        /// The final CQE's result.
        res: i32,
    },
}

/// A zcrx interface queue registered with its own ring, and at most one RECV_ZC armed.
///
/// The ring is created disabled (`IORING_SETUP_R_DISABLED`) and enabled by the first thread
/// that arms or waits on it: with `SINGLE_ISSUER` that thread becomes the only one allowed
/// to submit, so a receiver built on one thread can be used on another.
pub struct ZcrxQueue {
    ring: ManuallyDrop<IoUring<squeue::Entry, cqueue::Entry32>>,
    mem: ManuallyDrop<ZcrxMemory>,
    id: u64,
    enabled: bool,
    rq_entries: u32,
    rq_tail: u32,
    area_token: u64,
    zcrx_id: u32,
    offsets: ZcrxOffsets,
    armed: Option<u64>,
    arm_seq: u64,
    events: VecDeque<ZcrxEvent>,
    backlog: VecDeque<ZcrxRqe>,
}

impl std::fmt::Debug for ZcrxQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZcrxQueue")
            .field("zcrx_id", &self.zcrx_id)
            .field("area_bytes", &self.mem.area.len())
            .field("rq_entries", &self.rq_entries)
            .field("armed", &self.armed.is_some())
            .finish()
    }
}

impl ZcrxQueue {
    /// Creates a ring with `DEFER_TASKRUN | SINGLE_ISSUER | CQE32` and registers hardware
    /// queue `rxq` of interface `ifindex` with an area of `area_bytes` and a refill ring of
    /// `rq_entries`. Errors are the kernel's: `EPERM` (no `CAP_NET_ADMIN`), `ENODEV` (no such
    /// interface here), `EOPNOTSUPP` (no queue API / header split), `EINVAL` (bad queue),
    /// `EBUSY` (queue taken).
    pub fn register(
        ifindex: u32,
        rxq: u32,
        area_bytes: usize,
        rq_entries: u32,
    ) -> io::Result<ZcrxQueue> {
        let ring = IoUring::<squeue::Entry, cqueue::Entry32>::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_r_disabled()
            .setup_cqsize(4096)
            .build(64)?;
        let mut mem = ZcrxMemory::new(ifindex, rxq, area_bytes, rq_entries)?;
        mem.register(ring.as_raw_fd())?;
        let reg = mem.reg;
        let rq_len = mem.rq.len() as u64;
        let fits = |o: u32, n: u64| in_area(u64::from(o), n, rq_len);
        let entries = reg.rq_entries;
        if !entries.is_power_of_two()
            || !fits(reg.offsets.head, 4)
            || !fits(reg.offsets.tail, 4)
            || !fits(reg.offsets.rqes, u64::from(entries) * 16)
            || reg.offsets.head % 4 != 0
            || reg.offsets.tail % 4 != 0
            || reg.offsets.rqes % 8 != 0
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "kernel returned a refill ring layout outside its region",
            ));
        }
        Ok(ZcrxQueue {
            ring: ManuallyDrop::new(ring),
            id: NEXT_QUEUE_ID.fetch_add(1, Ordering::Relaxed),
            enabled: false,
            rq_entries: entries,
            rq_tail: 0,
            area_token: mem.area_reg.rq_area_token,
            zcrx_id: reg.zcrx_id,
            offsets: reg.offsets,
            mem: ManuallyDrop::new(mem),
            armed: None,
            arm_seq: 0,
            events: VecDeque::new(),
            backlog: VecDeque::new(),
        })
    }

    fn enable(&mut self) -> io::Result<()> {
        if !self.enabled {
            self.ring.submitter().register_enable_rings()?;
            self.enabled = true;
        }
        Ok(())
    }

    fn rq_u32(&self, off: u32) -> &AtomicU32 {
        // SAFETY: `off` was checked at registration to lie, 4-aligned, inside the refill
        // region we own; the word is shared with the kernel and only accessed atomically.
        unsafe {
            AtomicU32::from_ptr(
                self.mem
                    .rq
                    .as_ptr()
                    .cast_mut()
                    .add(off as usize)
                    .cast::<u32>(),
            )
        }
    }

    /// Whether the receive must be armed (again): nothing armed and every completion of
    /// the last request taken.
    pub fn needs_arm(&self) -> bool {
        self.armed.is_none() && self.events.is_empty()
    }

    /// Arms a multishot RECV_ZC on `fd` (unlimited length) and submits it.
    pub fn arm(&mut self, fd: BorrowedFd<'_>) -> io::Result<()> {
        if self.armed.is_some() {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        self.enable()?;
        self.arm_seq += 1;
        let entry = opcode::RecvZc::new(types::Fd(fd.as_raw_fd()), 0)
            .ifq(self.zcrx_id)
            .build()
            .user_data(self.arm_seq);
        if self.ring.submission().is_full() {
            self.ring.submit()?;
        }
        // SAFETY: RECV_ZC writes only into the registered area (through the kernel's own page
        // pins) and names pieces of it in CQEs; it references no other memory of ours.
        unsafe { self.ring.submission().push(&entry) }
            .map_err(|_| io::Error::new(io::ErrorKind::WouldBlock, "submission queue full"))?;
        self.ring.submit()?;
        self.armed = Some(self.arm_seq);
        Ok(())
    }

    fn drain(&mut self) -> io::Result<()> {
        let cqes: Vec<cqueue::Entry32> = self.ring.completion().collect();
        let area_len = self.mem.area.len() as u64;
        for cqe in cqes {
            if Some(cqe.user_data()) != self.armed {
                continue;
            }
            let more = cqueue::more(cqe.flags());
            if !more {
                self.armed = None;
            }
            let res = cqe.result();
            if res > 0 {
                let off = area_offset(cqe.big_cqe()[0]);
                if !in_area(off, res as u64, area_len) {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("zcrx CQE names {res} bytes at {off}, outside the area"),
                    ));
                }
                let buf = ZcLent {
                    queue: self.id,
                    off,
                    len: res as u32,
                };
                self.events.push_back(ZcrxEvent::Data { buf, more });
            } else if !more {
                self.events.push_back(ZcrxEvent::End { res });
            }
        }
        Ok(())
    }

    /// The next completion, waiting up to `timeout`; `None` if none came in time.
    pub fn next(&mut self, timeout: Duration) -> io::Result<Option<ZcrxEvent>> {
        self.enable()?;
        self.flush_backlog();
        self.drain()?;
        if self.events.is_empty() && self.armed.is_some() {
            // DEFER_TASKRUN: completions are only produced inside io_uring_enter(GETEVENTS).
            enter32(&self.ring, 1, timeout)?;
            self.drain()?;
        }
        Ok(self.events.pop_front())
    }

    /// The bytes of a lent piece. Panics if it came from another queue.
    pub fn data(&self, lent: &ZcLent) -> &[u8] {
        assert_eq!(lent.queue, self.id, "piece lent by another zcrx queue");
        // SAFETY: the kernel handed `[off, off+len)` over in a CQE (checked to lie in the
        // area) and does not reuse it until `recycle` consumes the unique `ZcLent`.
        unsafe {
            std::slice::from_raw_parts(
                self.mem.area.as_ptr().add(lent.off as usize),
                lent.len as usize,
            )
        }
    }

    /// Hands a piece back through the refill ring (queued locally if the ring is full).
    pub fn recycle(&mut self, lent: ZcLent) {
        assert_eq!(lent.queue, self.id, "piece lent by another zcrx queue");
        self.backlog
            .push_back(refill_entry(lent.off, lent.len, self.area_token));
        self.flush_backlog();
    }

    fn flush_backlog(&mut self) {
        if self.backlog.is_empty() {
            return;
        }
        let head = self.rq_u32(self.offsets.head).load(Ordering::Acquire);
        let mut pushed = false;
        while self.rq_tail.wrapping_sub(head) < self.rq_entries {
            let Some(rqe) = self.backlog.pop_front() else {
                break;
            };
            let idx = (self.rq_tail & (self.rq_entries - 1)) as usize;
            // SAFETY: entry idx < rq_entries lies in the rqes array checked at registration;
            // it is past the tail, so the kernel (which reads head..tail) does not read it now.
            unsafe {
                let p = self
                    .mem
                    .rq
                    .as_ptr()
                    .cast_mut()
                    .add(self.offsets.rqes as usize)
                    .cast::<ZcrxRqe>()
                    .add(idx);
                std::ptr::write_volatile(p, rqe);
            }
            self.rq_tail = self.rq_tail.wrapping_add(1);
            pushed = true;
        }
        if pushed {
            self.rq_u32(self.offsets.tail)
                .store(self.rq_tail, Ordering::Release);
        }
    }

    /// Cancels the armed request and waits up to `bound` for its end; true if it is over.
    pub fn disarm(&mut self, bound: Duration) -> bool {
        let Some(ud) = self.armed else {
            return true;
        };
        if self.enable().is_err() {
            return false;
        }
        let deadline = Instant::now() + bound;
        let _ = self
            .ring
            .submitter()
            .register_sync_cancel(Some(bound.into()), types::CancelBuilder::user_data(ud));
        loop {
            if self.drain().is_err() {
                return false;
            }
            if self.armed.is_none() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            if enter32(
                &self.ring,
                1,
                (deadline - now).min(Duration::from_millis(20)),
            )
            .is_err()
            {
                return false;
            }
        }
    }
}

fn enter32(
    ring: &IoUring<squeue::Entry, cqueue::Entry32>,
    want: usize,
    timeout: Duration,
) -> io::Result<()> {
    let ts = types::Timespec::from(timeout);
    let args = types::SubmitArgs::new().timespec(&ts);
    match ring.submitter().submit_with_args(want, &args) {
        Ok(_) => Ok(()),
        Err(e) => match e.raw_os_error() {
            Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY) => Ok(()),
            _ => Err(e),
        },
    }
}

impl Drop for ZcrxQueue {
    fn drop(&mut self) {
        let over = self.disarm(super::DROP_BOUND);
        // SAFETY: each field is dropped or forgotten exactly once, here, and not used after.
        unsafe {
            ManuallyDrop::drop(&mut self.ring);
            if over {
                ManuallyDrop::drop(&mut self.mem);
            }
            // Otherwise leak the area and refill ring: the request's end was never seen.
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_strip_and_restore_the_area_bits() {
        let off = (3u64 << IORING_ZCRX_AREA_SHIFT) | 0x1234;
        assert_eq!(area_offset(off), 0x1234);
        let token = 7u64 << IORING_ZCRX_AREA_SHIFT;
        let e = refill_entry(off, 100, token);
        assert_eq!(e.off, token | 0x1234);
        assert_eq!(e.len, 100);
        assert!(in_area(0, 4096, 4096));
        assert!(!in_area(1, 4096, 4096));
        assert!(!in_area(u64::MAX, 2, u64::MAX));
        assert_eq!(refill_ring_bytes(64, 4096), 8192);
        assert_eq!(refill_ring_bytes(4096, 4096), 69632);
    }

    #[cfg_attr(
        not(zcnet_root),
        ignore = "needs root (CAP_NET_ADMIN: without it zcrx registration is EPERM, not the interface's reason)"
    )]
    #[test]
    fn loopback_is_refused_and_the_reasons_are_the_kernels() {
        let lo = ifindex("lo").unwrap();
        let e = ZcrxQueue::register(lo, 0, 1 << 20, 256).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}");
        let e = try_register_on_plain_ring(lo, 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
        let e = ZcrxQueue::register(999_999, 0, 1 << 20, 256).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENODEV), "{e}");
        assert_eq!(
            ifindex("no-such-if0").unwrap_err().raw_os_error(),
            Some(libc::ENODEV)
        );
        assert_eq!(
            ifindex_for_addr("127.0.0.1".parse().unwrap()).unwrap(),
            Some(lo)
        );
        assert_eq!(
            ifindex_for_addr("192.0.2.77".parse().unwrap()).unwrap(),
            None
        );
    }
}
