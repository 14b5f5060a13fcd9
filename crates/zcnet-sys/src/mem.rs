//! Page-aligned anonymous memory for transmit buffers.
//!
//! Zero-copy transmit pins the user pages a send names, so buffers are whole pages from their
//! own `mmap` (page-aligned by construction) and pre-faulted with `MAP_POPULATE`: the first
//! send then pays no page faults, the cost the papers amortised by keeping buffers pinned and
//! mapped (Solaris's kernel-mapping cache, CMU's pinned buffers).

use std::io;
use std::ptr::NonNull;

/// The page size of this machine, read once (`sysconf(_SC_PAGESIZE)`).
pub fn page_size() -> usize {
    use std::sync::OnceLock;
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no memory-safety preconditions.
        let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if v > 0 {
            v as usize
        } else {
            4096
        }
    })
}

/// Rounds `n` up to a whole number of pages (at least one page).
pub fn round_to_pages(n: usize) -> usize {
    let p = page_size();
    n.max(1).div_ceil(p) * p
}

/// An owned, page-aligned, pre-faulted anonymous mapping (`mmap(MAP_PRIVATE|MAP_ANONYMOUS|
/// MAP_POPULATE)`), unmapped on drop.
///
/// The kernel may still hold references to these pages after a `MSG_ZEROCOPY` send returns;
/// that is memory-safe even across `munmap` (pinned pages are refcounted), but the *bytes on
/// the wire* change if the application writes them, which is why loaned buffers are moved
/// into the sender until their completion arrives.
#[derive(Debug)]
pub struct PageBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: PageBuf uniquely owns its mapping, like a Box<[u8]>; moving it between threads or
// sharing `&PageBuf` (read-only slices) is as safe as for Box<[u8]>.
unsafe impl Send for PageBuf {}
// SAFETY: see Send; `&PageBuf` only hands out shared slices.
unsafe impl Sync for PageBuf {}

impl PageBuf {
    /// Maps `len` bytes rounded up to whole pages, zero-filled and pre-faulted.
    pub fn new(len: usize) -> io::Result<PageBuf> {
        let len = round_to_pages(len);
        // SAFETY: an anonymous private mapping with a null hint has no preconditions; the
        // result is checked against MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(PageBuf { ptr, len })
    }

    /// Maps `len` bytes rounded up to whole 2 MiB blocks, aligned to 2 MiB and advised
    /// `MADV_HUGEPAGE`, then touched page by page so that, where transparent huge pages are
    /// enabled (`always` or `madvise`) and free, each block is one huge page — one page-table
    /// entry (a PMD) instead of 512. Whether it got them is for the caller to read
    /// (`AnonHugePages` in /proc/self/smaps); without them it is an ordinary buffer.
    pub fn new_huge(len: usize) -> io::Result<PageBuf> {
        const HUGE: usize = 2 << 20;
        let len = len.max(1).next_multiple_of(HUGE);
        let whole = len + HUGE;
        // SAFETY: an anonymous private mapping with a null hint has no preconditions; the
        // result is checked against MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                whole,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = p as usize;
        let start = base.next_multiple_of(HUGE);
        // SAFETY: the head and tail trimmed lie inside the mapping just made, which nothing
        // else refers to; what stays is `start..start+len`, owned by the PageBuf below.
        unsafe {
            if start > base {
                libc::munmap(p, start - base);
            }
            let end = start + len;
            if base + whole > end {
                libc::munmap(end as *mut libc::c_void, base + whole - end);
            }
            // Advice only: failure (THP compiled out) leaves an ordinary mapping.
            libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        let ptr =
            NonNull::new(start as *mut u8).ok_or_else(|| io::Error::other("mmap returned null"))?;
        let mut b = PageBuf { ptr, len };
        let page = page_size();
        b.as_mut_slice()
            .iter_mut()
            .step_by(page)
            .for_each(|x| *x = 0);
        Ok(b)
    }

    /// Length in bytes (a whole number of pages).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a mapping has at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Start address, for registering the buffer with the kernel (io_uring fixed buffers).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The whole buffer.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is a live mapping owned by self, readable, initialised (zero-
        // filled by the kernel), and no `&mut` to it can coexist with this `&self` borrow.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole buffer, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// Seals a memfd against every change (`F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW |
/// F_SEAL_SEAL`) and maps it read-only.
///
/// Mapping an ordinary file is `unsafe` (memmap2's `Mmap::map`) because another process
/// may truncate it — `SIGBUS` on the next read — or write it under a `&[u8]`. A sealed memfd
/// can do neither, for anyone, for ever: so this mapping is sound without an `unsafe` at the
/// caller. Fails (`EINVAL`/`EPERM`) for a file that is not a memfd made with
/// `MFD_ALLOW_SEALING`, or one with a writable shared mapping still alive.
#[cfg(feature = "memmap2")]
pub fn map_sealed(file: &std::fs::File) -> io::Result<memmap2::Mmap> {
    use rustix::fs::{fcntl_add_seals, SealFlags};
    fcntl_add_seals(
        file,
        SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
    )?;
    // SAFETY: the seals just added forbid any write, truncation or growth of this file by
    // any process, and cannot be removed (F_SEAL_SEAL): the mapped bytes stay valid and
    // unchanged for the mapping's whole life, which is all `Mmap::map` asks of its caller.
    unsafe { memmap2::Mmap::map(file) }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe exactly the mapping created in `new`, unmapped once here.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_buf_is_aligned_zeroed_and_writable() {
        let mut b = PageBuf::new(10_000).unwrap();
        assert_eq!(b.len() % page_size(), 0);
        assert!(b.len() >= 10_000);
        assert_eq!(b.as_ptr() as usize % page_size(), 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        b.as_mut_slice()[4097] = 7;
        assert_eq!(b.as_slice()[4097], 7);
    }
}
