//! What the process's own mappings say: the `/proc/self/maps` line covering an address
//! (read without allocating, so the SIGSEGV handler may ask), the calling thread's stack, and
//! the `PAGEMAP_SCAN` ABI (Linux 6.7, `Documentation/admin-guide/mm/pagemap.rst`) that tells
//! which pages still carry a userfaultfd write-protect bit.

use std::io;

/// The mapping containing `addr`, read from /proc/self/maps without allocating (raw
/// `open`/`read` into a small stack buffer): callable from a signal handler running on a
/// small alternate stack.
pub(super) fn vma_at(addr: usize) -> Option<Vma> {
    const PATH: &[u8] = b"/proc/self/maps\0";
    // SAFETY: PATH is NUL-terminated; open has no other preconditions.
    let fd = unsafe { libc::open(PATH.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; 512];
    let mut line = [0u8; 128];
    let mut len = 0;
    let mut found = None;
    'read: loop {
        // SAFETY: buf is a live local of buf.len() bytes.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        for &b in &buf[..n as usize] {
            if b != b'\n' {
                // Only the start of a line matters (range, perms, offset, dev, inode).
                if len < line.len() {
                    line[len] = b;
                    len += 1;
                }
                continue;
            }
            let text = match std::str::from_utf8(&line[..len]) {
                Ok(t) => t,
                Err(e) => std::str::from_utf8(&line[..e.valid_up_to()]).unwrap_or(""),
            };
            if let Some(v) = parse_maps_line(text) {
                if v.start <= addr && addr < v.end {
                    found = Some(v);
                    break 'read;
                }
            }
            len = 0;
        }
    }
    // SAFETY: closing the fd opened above, once.
    unsafe { libc::close(fd) };
    found
}

pub(super) const MADV_POPULATE_READ: i32 = 22;

pub(super) const PAGE_IS_WRITTEN: u64 = 1 << 1;
pub(super) const PAGE_IS_FILE: u64 = 1 << 2;
pub(super) const PAGE_IS_PRESENT: u64 = 1 << 3;

/// `struct page_region` (linux/fs.h).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct PageRegion {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) categories: u64,
}

/// `struct pm_scan_arg` (linux/fs.h).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct PmScanArg {
    pub(super) size: u64,
    pub(super) flags: u64,
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) walk_end: u64,
    pub(super) vec: u64,
    pub(super) vec_len: u64,
    pub(super) max_pages: u64,
    pub(super) category_inverted: u64,
    pub(super) category_mask: u64,
    pub(super) category_anyof_mask: u64,
    pub(super) return_mask: u64,
}

/// `PAGEMAP_SCAN` = `_IOWR('f', 16, struct pm_scan_arg)`.
pub(super) const PAGEMAP_SCAN: u64 =
    (3 << 30) | ((std::mem::size_of::<PmScanArg>() as u64) << 16) | ((b'f' as u64) << 8) | 16;

/// One line of /proc/self/maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vma {
    /// Start address.
    pub start: usize,
    /// End address (exclusive).
    pub end: usize,
    /// `r`.
    pub readable: bool,
    /// `w`.
    pub writable: bool,
    /// `x`.
    pub executable: bool,
    /// `p` (private) rather than `s` (shared).
    pub private: bool,
    /// No backing file (inode 0) and not a kernel special mapping (`[vdso]`, `[stack]` …).
    pub anonymous: bool,
}

/// Parses one /proc/self/maps line.
pub fn parse_maps_line(line: &str) -> Option<Vma> {
    let mut it = line.split_whitespace();
    let (range, perms, _off, _dev, inode) =
        (it.next()?, it.next()?, it.next()?, it.next()?, it.next()?);
    let path = it.next().unwrap_or("");
    let (s, e) = range.split_once('-')?;
    let p = perms.as_bytes();
    if p.len() < 4 {
        return None;
    }
    let special = path.starts_with('[') && path != "[heap]" && !path.starts_with("[anon:");
    Some(Vma {
        start: usize::from_str_radix(s, 16).ok()?,
        end: usize::from_str_radix(e, 16).ok()?,
        readable: p[0] == b'r',
        writable: p[1] == b'w',
        executable: p[2] == b'x',
        private: p[3] == b'p',
        anonymous: inode == "0" && !special,
    })
}

/// The /proc/self/maps lines overlapping `start..end`, in address order.
pub fn maps_covering(start: usize, end: usize) -> io::Result<Vec<Vma>> {
    let text = std::fs::read_to_string("/proc/self/maps")?;
    Ok(text
        .lines()
        .filter_map(parse_maps_line)
        .filter(|v| v.start < end && start < v.end)
        .collect())
}

/// Whether `vmas` cover `start..end` without a hole with private anonymous memory; with
/// `need_rw`, exactly read-write (`rw-p`: the mprotect backend restores exactly that).
pub(super) fn vmas_private_anon(vmas: &[Vma], start: usize, end: usize, need_rw: bool) -> bool {
    let mut at = start;
    for v in vmas {
        let rw = v.readable && v.writable && !v.executable;
        if v.start > at || !v.private || !v.anonymous || (need_rw && !rw) {
            return false;
        }
        at = v.end;
    }
    at >= end
}

/// The calling thread's stack as `(lowest, highest)` address (`pthread_getattr_np`), or
/// `None` where it cannot be told.
pub fn thread_stack() -> Option<(usize, usize)> {
    // SAFETY: pthread_attr_t is plain data; pthread_getattr_np initialises it.
    let mut attr: libc::pthread_attr_t = unsafe { std::mem::zeroed() };
    // SAFETY: `attr` is a live local; pthread_self() is always valid.
    if unsafe { libc::pthread_getattr_np(libc::pthread_self(), &mut attr) } != 0 {
        return None;
    }
    let mut addr: *mut libc::c_void = std::ptr::null_mut();
    let mut size: libc::size_t = 0;
    // SAFETY: `attr` was initialised above; addr/size are live locals.
    let r = unsafe { libc::pthread_attr_getstack(&attr, &mut addr, &mut size) };
    // SAFETY: destroying the attr initialised above, once.
    unsafe { libc::pthread_attr_destroy(&mut attr) };
    (r == 0 && size > 0).then(|| (addr as usize, addr as usize + size))
}
