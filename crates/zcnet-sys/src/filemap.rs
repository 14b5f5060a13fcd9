//! Read-only windows onto an ordinary file's page cache (`mmap(MAP_SHARED|MAP_POPULATE)`), so
//! a reader such as a hash sees the cached pages themselves instead of a `pread` copy of them.
//!
//! Why this needs a type: a page of a shared file mapping that lies beyond the file's end
//! raises `SIGBUS` when touched (mmap(2), "Errors": "Attempted access to a page of the buffer
//! that lies beyond the end of the mapped file"). A file truncated by anyone while we read it
//! would then kill the process — which is why mapping ordinary files is `unsafe` elsewhere
//! (memmap2's `Mmap::map`). Here every live [`FileWindow`] is registered in a fixed,
//! lock-free table, and a process-wide `SIGBUS` handler, for a fault at an address inside a
//! registered window, maps a private zero page over the faulting page (`MAP_FIXED`), marks
//! the window, and returns: the faulting read runs again and sees zeros. [`FileWindow::read`]
//! reports a marked window as [`Truncated`], so the caller fails that file clearly instead of
//! presenting zeros, or a short file, as its bytes. A `SIGBUS` anywhere else goes to the
//! action installed before ours (Rust's runtime installs one for stack guards), or gets the
//! default action (a core dump), exactly as without us.
//!
//! What a window does not protect against, as `pread` does not either: another writer
//! changing bytes while they are read. The bytes read are then some mix of old and new —
//! never memory outside the window, since the mapping lives as long as the borrow.
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// How many windows may be live at once in the process; [`FileWindow::map`] returns an error
/// (`EBUSY`) beyond it and the caller reads the bytes by copy instead.
pub const MAX_WINDOWS: usize = 64;

/// A file's bytes went away under the window (the file was truncated while mapped): the
/// pages beyond its new end read as zeros and must not be taken for its content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the file was truncated while it was read through a mapping")]
pub struct Truncated;

/// One registered window: its address range and whether a page of it faulted.
struct Slot {
    start: AtomicUsize,
    end: AtomicUsize,
    hit: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    hit: AtomicBool::new(false),
};
static SLOTS: [Slot; MAX_WINDOWS] = [FREE; MAX_WINDOWS];
static PAGE: AtomicUsize = AtomicUsize::new(4096);
static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();

struct SigAction(libc::sigaction);
// SAFETY: a sigaction is plain data (handler address, mask, flags), written once before the
// handler that reads it is installed.
unsafe impl Sync for SigAction {}
// SAFETY: as above.
unsafe impl Send for SigAction {}
static OLD_BUS: OnceLock<SigAction> = OnceLock::new();

/// A read-only shared mapping of `len` bytes of a file from a page-aligned offset, registered
/// with the `SIGBUS` handler for as long as it lives (see the module docs).
#[derive(Debug)]
pub struct FileWindow {
    ptr: NonNull<u8>,
    len: usize,
    map_len: usize,
    slot: usize,
}

// SAFETY: the window owns its mapping; reading it from another thread is as sound as from this
// one (the hit flag is an atomic).
unsafe impl Send for FileWindow {}

impl FileWindow {
    /// Maps bytes `offset..offset + len` of `file` (`offset` a multiple of the page size,
    /// `len` > 0), populated up front so reading it takes no page faults for pages in cache.
    pub fn map(file: &File, offset: u64, len: usize) -> io::Result<FileWindow> {
        Self::map_with(file, offset, len, libc::MAP_POPULATE)
    }

    /// [`FileWindow::map`] without populating (pages come in by faults, with fault-around).
    pub fn map_lazy(file: &File, offset: u64, len: usize) -> io::Result<FileWindow> {
        Self::map_with(file, offset, len, 0)
    }

    fn map_with(file: &File, offset: u64, len: usize, extra: i32) -> io::Result<FileWindow> {
        install()?;
        let page = PAGE.load(Ordering::Relaxed);
        if len == 0 || !offset.is_multiple_of(page as u64) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let map_len = len.div_ceil(page) * page;
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: a fresh mapping at an address of the kernel's choice; it aliases no Rust
        // memory. The descriptor is live for the call.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ,
                libc::MAP_SHARED | extra,
                file.as_raw_fd(),
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let start = p as usize;
        let Some(slot) = claim(start, start + map_len) else {
            // SAFETY: the mapping was made just above and nothing refers to it.
            unsafe { libc::munmap(p, map_len) };
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        };
        Ok(FileWindow {
            ptr: NonNull::new(p.cast::<u8>()).expect("mmap succeeded, so not null"),
            len,
            map_len,
            slot,
        })
    }

    /// Length of the window in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window is empty (never: `map` refuses a zero length).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Runs `f` on the window's bytes. [`Truncated`] if any page of the window lay beyond
    /// the file's end when it was touched (now or by an earlier `read`): what `f` saw there
    /// were zeros standing in for bytes that no longer exist.
    pub fn read<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Result<R, Truncated> {
        // SAFETY: the mapping is `len` readable bytes (rounded up to pages) for as long as
        // `self` lives, which outlives the borrow. A page can only change under the slice
        // by another writer of the file (then the bytes are a mix of old and new, as with
        // `pread`; `u8` has no invalid values) or by the `SIGBUS` handler replacing a page
        // beyond the end with zeros (reported below); it is never unmapped while borrowed.
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) };
        let r = f(bytes);
        // The handler runs on this thread, synchronously with the faulting read.
        compiler_fence(Ordering::SeqCst);
        if SLOTS[self.slot].hit.load(Ordering::SeqCst) {
            return Err(Truncated);
        }
        Ok(r)
    }
}

impl Drop for FileWindow {
    fn drop(&mut self) {
        let s = &SLOTS[self.slot];
        // Unregistered before unmapping: the range is never both free in the table and
        // still ours, and a later window at the same address starts unmarked.
        s.end.store(0, Ordering::SeqCst);
        s.hit.store(false, Ordering::SeqCst);
        s.start.store(0, Ordering::SeqCst);
        // SAFETY: our own mapping (and any zero pages mapped over parts of it), no longer
        // borrowed: `read` holds `&self`, and we have `&mut self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.map_len) };
    }
}

/// Takes a free slot for `start..end`.
fn claim(start: usize, end: usize) -> Option<usize> {
    for (i, s) in SLOTS.iter().enumerate() {
        if s.start
            .compare_exchange(0, start, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            s.hit.store(false, Ordering::SeqCst);
            s.end.store(end, Ordering::SeqCst);
            return Some(i);
        }
    }
    None
}

/// Installs the `SIGBUS` handler once per process, keeping the previous action to chain to.
fn install() -> io::Result<()> {
    let installed = *INSTALLED.get_or_init(|| {
        // SAFETY: sysconf reads a constant.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            PAGE.store(page as usize, Ordering::Relaxed);
        }
        // SAFETY: sigaction structs are plain old data; all-zero is valid (SIG_DFL).
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: querying the current action writes only `old`, a live local.
        if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) } != 0 {
            return Err(io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO));
        }
        let _ = OLD_BUS.set(SigAction(old));
        // SAFETY: as above.
        let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
        new.sa_sigaction = on_sigbus as *const () as usize;
        new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: sa_mask is a live field; sigemptyset initialises it.
        unsafe { libc::sigemptyset(&mut new.sa_mask) };
        // SAFETY: `new` is fully initialised and `on_sigbus` is an extern "C" handler
        // with the SA_SIGINFO signature.
        if unsafe { libc::sigaction(libc::SIGBUS, &new, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO));
        }
        Ok(())
    });
    installed.map_err(io::Error::from_raw_os_error)
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in SLOTS.iter() {
        let start = s.start.load(Ordering::SeqCst);
        let end = s.end.load(Ordering::SeqCst);
        if start != 0 && start <= addr && addr < end {
            let page = addr & !(PAGE.load(Ordering::Relaxed) - 1);
            // SAFETY: the page lies inside a window this process mapped and still owns (it
            // is registered until just before its unmap, and only its own thread reads it);
            // a private zero page replaces it, read-only like the window. mmap is a plain
            // system call, safe to make in a handler.
            let p = unsafe {
                libc::mmap(
                    page as *mut libc::c_void,
                    PAGE.load(Ordering::Relaxed),
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                s.hit.store(true, Ordering::SeqCst);
                return;
            }
            break;
        }
    }
    chain(sig, info, ctx);
}

/// Passes a fault that is not ours to the action installed before us; with none (or
/// `SIG_IGN`), restores `SIG_DFL` so the faulting instruction, run again, gets the default.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    match OLD_BUS.get() {
        Some(SigAction(old))
            if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN =>
        {
            if old.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the previous action was installed as an SA_SIGINFO handler with
                // this signature; we pass it the kernel's own arguments.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(old.sa_sigaction) };
                f(sig, info, ctx);
            } else {
                // SAFETY: a plain sa_handler takes the signal number only.
                let f: extern "C" fn(libc::c_int) =
                    unsafe { std::mem::transmute(old.sa_sigaction) };
                f(sig);
            }
        }
        _ => {
            // SAFETY: all-zero sigaction is SIG_DFL with an empty mask.
            let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: sigaction is async-signal-safe; `dfl` is a live local.
            unsafe { libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 131 % 251) as u8).collect()
    }

    #[test]
    fn a_window_reads_the_files_bytes_at_its_offset() {
        let page = PAGE.load(Ordering::Relaxed).max(4096);
        let all = data(5 * page + 123);
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(&all, 0).unwrap();
        let w = FileWindow::map(&f, page as u64, 3 * page + 7).unwrap();
        assert_eq!(w.len(), 3 * page + 7);
        assert!(w.read(|b| b == &all[page..4 * page + 7]).unwrap());
        let tail = FileWindow::map(&f, 5 * page as u64, 123).unwrap();
        assert!(tail.read(|b| b == &all[5 * page..]).unwrap());
    }

    #[test]
    fn unaligned_or_empty_windows_are_refused() {
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(&data(10_000), 0).unwrap();
        assert!(FileWindow::map(&f, 1, 100).is_err());
        assert!(FileWindow::map(&f, 0, 0).is_err());
    }

    #[test]
    fn a_file_truncated_under_its_window_reads_as_truncated_not_as_a_crash() {
        let page = 4096usize.max(PAGE.load(Ordering::Relaxed));
        let all = data(4 * page);
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(&all, 0).unwrap();
        let w = FileWindow::map(&f, 0, 4 * page).unwrap();
        f.set_len(page as u64 + 10).unwrap();
        // Touching the pages beyond the new end raises SIGBUS; the handler maps zeros there.
        let r = w.read(|b| {
            let first_ok = b[..page] == all[..page];
            let sum: u64 = b.iter().map(|&x| x as u64).sum();
            (first_ok, sum, b[3 * page])
        });
        assert_eq!(r, Err(Truncated));
        // Still marked on the next read; a fresh window over the short file is refused
        // where it lies beyond the end, and fine within it.
        assert_eq!(w.read(|b| b[0]), Err(Truncated));
        drop(w);
        let ok = FileWindow::map(&f, 0, page).unwrap();
        assert!(ok.read(|b| b == &all[..page]).unwrap());
        let beyond = FileWindow::map(&f, 2 * page as u64, page).unwrap();
        assert_eq!(beyond.read(|b| b[0]), Err(Truncated));
    }

    #[test]
    fn windows_are_freed_for_reuse() {
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(&data(8192), 0).unwrap();
        for _ in 0..(3 * MAX_WINDOWS) {
            let w = FileWindow::map(&f, 0, 8192).unwrap();
            assert!(w.read(|b| b.len()).unwrap() == 8192);
        }
    }
}
