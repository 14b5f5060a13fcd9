//! Page-aligned anonymous memory for transmit buffers.
//!
//! Zero-copy transmit pins the user pages a send names, so buffers are whole pages from their
//! own `mmap` (page-aligned by construction) and pre-faulted with `MAP_POPULATE`: the first
//! send then pays no page faults, the cost the papers amortised by keeping buffers pinned and
//! mapped (Solaris's kernel-mapping cache, CMU's pinned buffers).

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

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
    /// The mapping this buffer was carved from ([`PageBuf::carve_huge`]), unmapped with
    /// the last buffer carved from it; `None`: the buffer is its own mapping.
    region: Option<Arc<Region>>,
}

/// One mapping shared by the buffers carved from it.
#[derive(Debug)]
struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Region is only an owner: nothing reads or writes through it, it unmaps once.
unsafe impl Send for Region {}
// SAFETY: see Send; `&Region` gives access to nothing.
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe exactly the mapping made by `map_huge`, unmapped once
        // here, after every PageBuf carved from it is gone (each holds an Arc).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// Whether transparent huge pages may back a `MADV_HUGEPAGE` mapping here (`always` or
/// `madvise` in /sys/kernel/mm/transparent_hugepage/enabled), read once.
pub fn thp_available() -> bool {
    use std::sync::OnceLock;
    static THP: OnceLock<bool> = OnceLock::new();
    *THP.get_or_init(|| {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|s| s.contains("[always]") || s.contains("[madvise]"))
    })
}

/// A private anonymous read-write mapping of `len` bytes (`extra` added to its flags), owned
/// by the caller, who unmaps it.
fn map_anon(len: usize, extra: libc::c_int) -> io::Result<NonNull<u8>> {
    // SAFETY: an anonymous private mapping with a null hint has no preconditions; the
    // result is checked against MAP_FAILED before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))
}

/// `len` bytes rounded up to whole 2 MiB blocks, aligned to 2 MiB, advised `MADV_HUGEPAGE`
/// and touched page by page (see [`PageBuf::new_huge`]).
fn map_huge(len: usize) -> io::Result<(NonNull<u8>, usize)> {
    const HUGE: usize = 2 << 20;
    let len = len.max(1).next_multiple_of(HUGE);
    let whole = len + HUGE;
    let p: *mut libc::c_void = map_anon(whole, 0)?.as_ptr().cast();
    let base = p as usize;
    let start = base.next_multiple_of(HUGE);
    // SAFETY: the head and tail trimmed lie inside the mapping just made, which nothing
    // else refers to; what stays is `start..start+len`, returned to the caller to own.
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
    let page = page_size();
    for off in (0..len).step_by(page) {
        // SAFETY: `start + off` lies inside the mapping owned here, readable and writable;
        // a volatile write of one byte faults the page in (zero-filled, so 0 changes nothing).
        unsafe { std::ptr::write_volatile(ptr.as_ptr().add(off), 0) };
    }
    Ok((ptr, len))
}

// SAFETY: PageBuf uniquely owns its range of memory (its own mapping, or a disjoint slice
// of a shared one whose unmapping waits for every slice), like a Box<[u8]>; moving it between threads or
// sharing `&PageBuf` (read-only slices) is as safe as for Box<[u8]>.
unsafe impl Send for PageBuf {}
// SAFETY: see Send; `&PageBuf` only hands out shared slices.
unsafe impl Sync for PageBuf {}

impl PageBuf {
    /// Maps `len` bytes rounded up to whole pages, zero-filled and pre-faulted.
    pub fn new(len: usize) -> io::Result<PageBuf> {
        let len = round_to_pages(len);
        let ptr = map_anon(len, libc::MAP_POPULATE)?;
        Ok(PageBuf {
            ptr,
            len,
            region: None,
        })
    }

    /// Maps `len` bytes rounded up to whole 2 MiB blocks, aligned to 2 MiB and advised
    /// `MADV_HUGEPAGE`, then touched page by page so that, where transparent huge pages are
    /// enabled (`always` or `madvise`) and free, each block is one huge page — one page-table
    /// entry (a PMD) instead of 512. Whether it got them is for the caller to read
    /// (`AnonHugePages` in /proc/self/smaps); without them it is an ordinary buffer.
    pub fn new_huge(len: usize) -> io::Result<PageBuf> {
        let (ptr, len) = map_huge(len)?;
        Ok(PageBuf {
            ptr,
            len,
            region: None,
        })
    }

    /// `count` buffers of `each` bytes (rounded up to whole pages), carved back to back
    /// from one mapping made as [`PageBuf::new_huge`] makes its own — so that a pool's
    /// buffers sit in 2 MiB huge pages where the kernel has them. The mapping is unmapped
    /// when the last of them is dropped.
    ///
    /// Why: a `MSG_ZEROCOPY` send pins the pages it names (`get_user_pages_fast`), one
    /// reference and one page-table entry per 4 KiB page, but one per huge page. Sending
    /// 64 KiB messages from a pool in huge pages, that pinning (`gup_fast_fallback`) fell
    /// from 11.5 % of the sender's samples to 3.7 % (docs/msg.md).
    pub fn carve_huge(count: usize, each: usize) -> io::Result<Vec<PageBuf>> {
        let each = round_to_pages(each);
        let total = each
            .checked_mul(count.max(1))
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pool too large"))?;
        let (ptr, len) = map_huge(total)?;
        let region = Arc::new(Region { ptr, len });
        (0..count)
            .map(|i| {
                // Inside the region (i * each + each <= total <= len); distinct i give
                // disjoint ranges.
                let at = NonNull::new(ptr.as_ptr().wrapping_add(i * each))
                    .ok_or_else(|| io::Error::other("carved buffer at null"))?;
                Ok(PageBuf {
                    ptr: at,
                    len: each,
                    region: Some(region.clone()),
                })
            })
            .collect()
    }

    /// Whether this buffer shares its mapping with others ([`PageBuf::carve_huge`]).
    pub fn is_carved(&self) -> bool {
        self.region.is_some()
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

/// The first page of a file, mapped shared and read-write, used as 64-bit atomic words: how
/// one process publishes counters another reads with `pread` — a zcnet sender's thread id
/// and bytes sent for a receiver on the same host (`zcnet::peer_card`) — at the cost of an
/// atomic add, where rewriting a file would cost system calls per send.
///
/// Any process that may write the file may also change the words under us (harmless: they
/// are only ever accessed atomically) or truncate it, which makes the next access raise
/// `SIGBUS`. Map only a file in a directory that no other user can write.
pub struct SharedWords {
    ptr: NonNull<AtomicU64>,
    words: usize,
    len: usize,
}

// SAFETY: the mapping is shared memory accessed only through `AtomicU64`s; it is owned by
// this value and unmapped once, in `drop`.
unsafe impl Send for SharedWords {}
// SAFETY: as above: every access is atomic, so shared references from threads are fine.
unsafe impl Sync for SharedWords {}

impl SharedWords {
    /// Grows `file` to a page (it must be open for reading and writing) and maps it: `words`
    /// 64-bit words (at most a page's worth), all zero in a new file.
    pub fn map(file: &std::fs::File, words: usize) -> io::Result<SharedWords> {
        let len = page_size();
        if words == 0 || words * 8 > len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{words} words do not fit a page"),
            ));
        }
        if file.metadata()?.len() < len as u64 {
            file.set_len(len as u64)?;
        }
        // SAFETY: a fresh mapping (null hint) of `len` bytes of an open file that is at
        // least that long; the kernel checks the descriptor and the protection against its
        // open mode. Nothing else in this process refers to the new range.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                file,
                0,
            )
        }?;
        let ptr = NonNull::new(p.cast::<AtomicU64>())
            .ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(SharedWords { ptr, words, len })
    }

    /// Word `i` (panics past the words mapped).
    pub fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < self.words, "word {i} of {}", self.words);
        // SAFETY: the mapping is page-aligned, at least `words` × 8 bytes long and lives as
        // long as `self`; `AtomicU64` has the alignment and size of `u64`, and every access
        // to the page goes through atomics (other processes' included, by this type's
        // contract), so no non-atomic access races with it.
        unsafe { &*self.ptr.as_ptr().add(i) }
    }
}

impl Drop for SharedWords {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe exactly the mapping made in `map`, unmapped once here;
        // no reference from `word` outlives `self`.
        unsafe {
            let _ = rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        if self.region.is_some() {
            // Carved: the region unmaps when its last buffer's Arc goes.
            return;
        }
        // SAFETY: ptr/len describe exactly the mapping created in `new` or `new_huge`,
        // unmapped once here.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of `key` (e.g. `AnonHugePages:`, `VmFlags:`) in the entry of
    /// /proc/self/smaps for the mapping that contains `addr`.
    fn smaps_field(addr: usize, key: &str) -> Option<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) =
                        (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                    {
                        inside = (a..b).contains(&addr);
                        continue;
                    }
                }
            }
            if inside {
                if let Some(v) = line.strip_prefix(key) {
                    return Some(v.trim().to_owned());
                }
            }
        }
        None
    }

    /// Words written through one mapping are in the file for a plain read, and in another
    /// mapping of it; a file too small is grown; too many words are refused.
    #[test]
    fn shared_words_reach_the_file_and_other_mappings() {
        use std::os::unix::fs::FileExt;
        use std::sync::atomic::Ordering;
        let f = tempfile::tempfile().unwrap();
        let w = SharedWords::map(&f, 4).unwrap();
        assert_eq!(f.metadata().unwrap().len(), page_size() as u64);
        w.word(0).store(0x0102_0304_0506_0708, Ordering::Release);
        w.word(3).fetch_add(5, Ordering::Relaxed);
        w.word(3).fetch_add(7, Ordering::Relaxed);
        let mut b = [0u8; 32];
        f.read_exact_at(&mut b, 0).unwrap();
        assert_eq!(
            u64::from_le_bytes(b[0..8].try_into().unwrap()),
            0x0102_0304_0506_0708
        );
        assert_eq!(u64::from_le_bytes(b[24..32].try_into().unwrap()), 12);
        let again = SharedWords::map(&f, 4).unwrap();
        assert_eq!(again.word(3).load(Ordering::Acquire), 12);
        again.word(1).store(9, Ordering::Release);
        assert_eq!(w.word(1).load(Ordering::Acquire), 9);
        assert!(SharedWords::map(&f, 0).is_err());
        assert!(SharedWords::map(&f, page_size() / 8 + 1).is_err());
        // (Word 4 would panic; not tried here: a panic's backtrace holds locks that a test
        // forking in parallel, `testing::fork_and_run`, would then deadlock on in its child.)
    }

    #[test]
    fn carved_buffers_are_disjoint_aligned_and_outlive_each_other() {
        let each = 68 << 10;
        let mut bufs = PageBuf::carve_huge(8, each).unwrap();
        assert_eq!(bufs.len(), 8);
        for (i, b) in bufs.iter_mut().enumerate() {
            assert!(b.is_carved());
            assert_eq!(b.len(), round_to_pages(each));
            assert_eq!(b.as_ptr() as usize % page_size(), 0);
            assert!(b.as_slice().iter().all(|&x| x == 0), "zero-filled");
            b.as_mut_slice().fill(i as u8 + 1);
        }
        // Each buffer kept its own bytes: the ranges do not overlap.
        for (i, b) in bufs.iter().enumerate() {
            assert!(b.as_slice().iter().all(|&x| x == i as u8 + 1), "buffer {i}");
        }
        // Dropped out of order, the rest stay mapped and intact until the last goes.
        let last = bufs.pop().unwrap();
        bufs.swap_remove(0);
        drop(bufs.remove(2));
        for b in &bufs {
            let v = b.as_slice()[0];
            assert!(b.as_slice().iter().all(|&x| x == v));
        }
        assert!(last.as_slice().iter().all(|&x| x == 8));
        drop(bufs);
        assert!(last.as_slice().iter().all(|&x| x == 8), "still mapped");
    }

    /// Where transparent huge pages are on, a carved pool is one the kernel may back with
    /// them: its mapping is 2 MiB aligned, carries the `MADV_HUGEPAGE` advice (`hg` in
    /// `VmFlags`) and is eligible (`THPeligible: 1`), and every buffer keeps its bytes.
    /// That is all the code can promise: whether a free 2 MiB page existed at fault time
    /// is the host's state (fragmented memory gives 4 KiB pages), so `AnonHugePages` is
    /// not asserted.
    #[cfg_attr(
        not(zcnet_has_thp),
        ignore = "needs transparent huge pages on (always or madvise in /sys/kernel/mm/transparent_hugepage/enabled)"
    )]
    #[test]
    fn carved_buffers_are_advised_and_eligible_for_huge_pages() {
        let mut bufs = PageBuf::carve_huge(8, 68 << 10).unwrap();
        for (i, b) in bufs.iter_mut().enumerate() {
            b.as_mut_slice().fill(i as u8 + 1);
        }
        let at = bufs[0].as_ptr() as usize;
        assert_eq!(at % (2 << 20), 0, "the pool starts on a 2 MiB boundary");
        let flags = smaps_field(at, "VmFlags:").expect("the pool's mapping in smaps");
        assert!(
            flags.split_whitespace().any(|f| f == "hg"),
            "MADV_HUGEPAGE advised: {flags}"
        );
        assert_eq!(
            smaps_field(at, "THPeligible:").as_deref(),
            Some("1"),
            "the kernel may back the pool with huge pages"
        );
        for (i, b) in bufs.iter().enumerate() {
            assert!(b.as_slice().iter().all(|&x| x == i as u8 + 1), "buffer {i}");
        }
    }

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
