//! `TCP_ZEROCOPY_RECEIVE`: map received pages into a read-only mapping of the socket instead
//! of copying them (tcp(7); include/uapi/linux/tcp.h; tools/testing/selftests/net/tcp_mmap.c).
//!
//! The kernel picks the behaviour from the `optlen` we pass (an `offsetofend` switch), so we
//! carry the full 6.x struct ourselves and always pass all 64 bytes. A page is mapped only
//! when the frag under the read position is exactly one order-0 page at offset 0 with no
//! page-cache owner; everything else comes back as `recv_skip_hint` (must be read with
//! `recv`) or is copied into `copybuf`. See docs/measurements/kernel-findings.md §2.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

/// `TCP_ZEROCOPY_RECEIVE` (linux/tcp.h).
pub const TCP_ZEROCOPY_RECEIVE: i32 = 35;
/// `TCP_RECEIVE_ZEROCOPY_FLAG_TLB_CLEAN_HINT`: the range is already zapped, skip the zap.
pub const TLB_CLEAN_HINT: u32 = 0x1;

/// `struct tcp_zerocopy_receive` as of Linux 5.11+ (64 bytes).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct TcpZerocopyReceive {
    /// in: address of the mapping.
    pub address: u64,
    /// in/out: bytes to map / bytes mapped.
    pub length: u32,
    /// out: bytes that must be read with `recv` before the next mappable data.
    pub recv_skip_hint: u32,
    /// out: bytes in the receive queue.
    pub inq: u32,
    /// out: pending socket error (cleared by the call).
    pub err: i32,
    /// in: copybuf address (small or unaligned data is copied here).
    pub copybuf_address: u64,
    /// in/out: copybuf size / bytes copied, or a negative errno.
    pub copybuf_len: i32,
    /// in: `TLB_CLEAN_HINT`.
    pub flags: u32,
    /// in: ancillary data buffer.
    pub msg_control: u64,
    /// in/out: ancillary data length.
    pub msg_controllen: u64,
    /// out: `MSG_CTRUNC` etc.
    pub msg_flags: u32,
    /// must be zero.
    pub reserved: u32,
}

const _: () = assert!(std::mem::size_of::<TcpZerocopyReceive>() == 64);

/// What one `TCP_ZEROCOPY_RECEIVE` call did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZcOutcome {
    /// Bytes newly mapped at the mapping's previous end.
    pub mapped: usize,
    /// Bytes copied into copybuf (they follow the mapped bytes in the stream).
    pub copied: usize,
    /// Bytes after those that must be read with `recv` (not skipped: they are data).
    pub skip_hint: usize,
    /// Bytes still queued.
    pub inq: usize,
    /// Pending socket error the kernel reported, as the kernel stores it: a *negative*
    /// errno (`sock_error()`), 0 if none.
    pub err: i32,
}

/// A read-only `mmap` of a TCP socket (`mmap(PROT_READ, MAP_SHARED, sockfd)`) into which
/// `TCP_ZEROCOPY_RECEIVE` inserts received pages.
///
/// Pages are mapped sequentially from offset 0 up to `mapped_end`; only that prefix holds
/// pages (touching an empty part of a socket mapping raises `SIGBUS`), so slices are handed
/// out only below it. [`SocketMap::release_all`] zaps the whole prefix in one `madvise`
/// (the batched release: one call per window instead of one per chunk) and needs `&mut self`,
/// so no slice can outlive the pages it points at.
#[derive(Debug)]
pub struct SocketMap {
    ptr: NonNull<u8>,
    len: usize,
    mapped_end: usize,
}

// SAFETY: the mapping is owned by this value (like Box<[u8]>); slices are read-only.
unsafe impl Send for SocketMap {}
// SAFETY: through `&SocketMap` one can only read lengths and the mapped prefix's bytes;
// the prefix changes (receive, release_all) only through `&mut self`, like a Box<[u8]>.
unsafe impl Sync for SocketMap {}

impl SocketMap {
    /// Maps `len` bytes (rounded to pages) of the socket's receive space.
    pub fn new(fd: BorrowedFd<'_>, len: usize) -> io::Result<SocketMap> {
        let len = crate::mem::round_to_pages(len);
        // SAFETY: mapping a socket fd read-only and shared; the kernel validates the fd and
        // we check MAP_FAILED before using the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(SocketMap {
            ptr,
            len,
            mapped_end: 0,
        })
    }

    /// Size of the mapping.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Bytes still free for mapping before the window must be released.
    pub fn remaining(&self) -> usize {
        self.len - self.mapped_end
    }

    /// End of the mapped prefix.
    pub fn mapped_end(&self) -> usize {
        self.mapped_end
    }

    /// One `getsockopt(TCP_ZEROCOPY_RECEIVE)` mapping up to `want` bytes (whole pages) at the
    /// end of the mapped prefix, with `copybuf` for small tails (keep it under a page: when
    /// the whole queue fits in it the kernel copies instead of mapping anything).
    ///
    /// The kernel's `EIO` ("no progress and the peer's FIN has arrived") is returned as is;
    /// the caller interprets it as end of stream.
    pub fn receive(
        &mut self,
        fd: BorrowedFd<'_>,
        want: usize,
        copybuf: &mut [u8],
    ) -> io::Result<ZcOutcome> {
        let page = crate::mem::page_size();
        let want = want.min(self.remaining()) / page * page;
        let mut zc = TcpZerocopyReceive {
            address: self.ptr.as_ptr() as u64 + self.mapped_end as u64,
            length: want.min(u32::MAX as usize / page * page) as u32,
            copybuf_address: copybuf.as_mut_ptr() as u64,
            copybuf_len: copybuf.len().min(i32::MAX as usize) as i32,
            ..Default::default()
        };
        let mut len = std::mem::size_of::<TcpZerocopyReceive>() as libc::socklen_t;
        // SAFETY: zc is a live, fully initialised 64-byte struct and len says so; the address
        // range [address, address+length) lies inside our socket mapping (want was clamped to
        // remaining()), and copybuf is a live writable slice of copybuf_len bytes that the
        // `&mut` borrow keeps exclusive for the call.
        let r = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::IPPROTO_TCP,
                TCP_ZEROCOPY_RECEIVE,
                (&mut zc as *mut TcpZerocopyReceive).cast(),
                &mut len,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let mapped = (zc.length as usize).min(want);
        self.mapped_end += mapped;
        Ok(ZcOutcome {
            mapped,
            copied: zc.copybuf_len.max(0) as usize,
            skip_hint: zc.recv_skip_hint as usize,
            inq: zc.inq as usize,
            err: zc.err,
        })
    }

    /// The mapped bytes `off..off+len`. Panics if the range is not inside the mapped prefix.
    pub fn slice(&self, off: usize, len: usize) -> &[u8] {
        assert!(
            off.checked_add(len).is_some_and(|e| e <= self.mapped_end),
            "slice {off}+{len} outside the mapped prefix {}",
            self.mapped_end
        );
        // SAFETY: [off, off+len) lies in the prefix where the kernel inserted pages and which
        // is only zapped through `&mut self` (release_all), so the pages stay mapped and
        // readable for the lifetime of this `&self` borrow; nobody writes them.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off), len) }
    }

    /// Releases every mapped page with one `madvise(MADV_DONTNEED)` and starts the window
    /// over. Returns the number of bytes released.
    pub fn release_all(&mut self) -> io::Result<usize> {
        let n = self.mapped_end;
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: the range is inside our own mapping; no slice borrows it (`&mut self`).
        let r = unsafe { libc::madvise(self.ptr.as_ptr().cast(), n, libc::MADV_DONTNEED) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        self.mapped_end = 0;
        Ok(n)
    }
}

impl Drop for SocketMap {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly the mapping created in `new`, unmapped once here; no
        // slice can outlive `self`.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}
