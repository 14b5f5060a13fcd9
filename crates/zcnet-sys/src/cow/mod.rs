//! Copy-on-write protection of application pages that a `MSG_ZEROCOPY` send may still read:
//! Solaris's transmit COW (Chu, "Zero-Copy TCP in Solaris", §3.2.4, §4.4.1) rebuilt from userfaultfd.
//!
//! A page in flight is write-protected. When the application writes to it, the writing
//! thread sleeps on the fault; the handler copies the page, zaps it and maps the copy in its
//! place, then wakes the writer. The kernel keeps its reference to the *original* page, so the
//! bytes on the wire are the bytes at the time of the send, and the writer never notices
//! (docs/measurements/kernel-findings.md §6: 13–29 µs per fault). When the send's completion arrives the pages are
//! unregistered, which also lifts the protection.
//!
//! # Mechanism (userfaultfd backend)
//!
//! * One `userfaultfd(UFFD_USER_MODE_ONLY | O_NONBLOCK)` per process; API features
//!   `PAGEFAULT_FLAG_WP` and `EVENT_REMAP`.
//! * Protect: `UFFDIO_REGISTER` of exactly the span in mode `MISSING | WP`, then
//!   `UFFDIO_WRITEPROTECT`. `MISSING` is needed because the copy-on-write below zaps the page
//!   before refilling it: with `MISSING` registered, another thread touching the page in that
//!   window sleeps on a missing fault instead of being handed a zero page.
//! * Copy-on-write of page P (all under the table lock): `process_vm_readv` P into a staging
//!   page (a *kernel-mode* read: if the application unmapped P meanwhile this fails with
//!   `EFAULT` instead of faulting the handler itself), `madvise(MADV_DONTNEED)` P, then
//!   `UFFDIO_COPY` staging → P, which maps a fresh page and wakes the writer. This keeps the
//!   VMA whole, unlike the mremap variant (docs/measurements/kernel-findings.md §6: 3 VMAs per copied page).
//! * `mremap` of a registered range (glibc `realloc` of a large buffer does this) would
//!   otherwise drop the registration and the protection, and the next write would land in
//!   the page the kernel is sending. With `EVENT_REMAP` the kernel keeps both, queues an
//!   event and holds the `mremap` caller until the handler reads it; the handler then copies
//!   every still-protected page of the moved range and unregisters it.
//!
//! # What the protection cannot cover (`UFFD_USER_MODE_ONLY`)
//!
//! Kernel-mode writes into a protected page (`read(2)`/`recv(2)` into a buffer still in
//! flight) fail with `EFAULT` and never reach the handler (docs/measurements/kernel-findings.md §6). zcnet's own
//! `Receiver::recv_into` receives into a scratch buffer and copies in that case (a user
//! write, which the handler resolves); anything else must wait for the send's completion or
//! use loaned buffers. While a span is registered `MISSING`, a kernel-mode *read* of a page
//! of it that is not mapped also fails with `EFAULT`: only possible for a page the
//! application zapped itself (`MADV_DONTNEED`) or during the few microseconds of a copy.
//!
//! # Memory given back while in flight
//!
//! A page in flight that the program frees (a heap chunk malloc hands to its next caller),
//! zaps (`MADV_DONTNEED`) or moves (`mremap`) must not stay protected or registered: the
//! next owner's kernel writes would fail. [`CowSpace::let_go`] (called by whoever sees the
//! memory given back — the preload library's `free`, `realloc`, `munmap`, `madvise`,
//! `mremap`) zaps freed protected pages (the kernel keeps the originals it sends; the next
//! access maps a fresh page), copies moved ones, and unregisters them; their holds stay,
//! marked *gone*, until the sends complete.
//!
//! # mprotect backend
//!
//! Where userfaultfd is missing or forbidden: `mprotect(PROT_READ)` and a `SIGSEGV` handler
//! that copies the page into a fresh mapping and `mremap`s it over the faulting one (findings
//! §6: 13–15 µs). The previous `SIGSEGV` action (Rust's stack-overflow handler, or the
//! application's) is called for every fault that is not ours. Because signals are
//! process-wide and the table can hold stale entries (a buffer unmapped while in flight, its
//! address reused — by a thread stack's guard page, for instance), the handler decides from
//! the mapping itself, read from /proc/self/maps without allocating: it copies only a
//! read-only private anonymous page that the table says is protected, retries a write to a
//! page that has become writable meanwhile, and chains everything else. Releases likewise
//! restore read-write only where the mapping is still `r--p` anonymous.
//!
//! Its costs and limits: it splits VMAs (every copied page becomes its own mapping); a
//! buffer moved by `mremap` while in flight keeps `PROT_READ` at its new address, where
//! writes are taken for the application's own faults (no remap event without userfaultfd);
//! and new read-only anonymous memory mapped exactly where a freed in-flight buffer was
//! would be made writable by a write fault. Use it only where userfaultfd is unavailable.
//!
//! # Soundness
//!
//! The only operations here that can change bytes Rust code may see are the zap + refill
//! of a copy-on-write, and they preserve every byte: they run under the table lock, only on
//! a page this space write-protected and still records (or, for a page moved by `mremap`,
//! that `/proc/self/pagemap` shows write-protected by a userfaultfd, which in this process
//! can only be ours), while it is protected — no user-mode write can land, kernel-mode
//! writes fail, and every other access sleeps until the refill. The application can break
//! this only by unmapping and re-mapping the memory *while* a fault on it is being handled,
//! which safe Rust cannot do (the faulting writer holds the borrow).

pub mod refused;
pub mod registry;
pub mod uffd;
pub mod vma;

use self::vma::{
    maps_covering, vma_at, vmas_private_anon, PageRegion, PmScanArg, MADV_POPULATE_READ,
    PAGEMAP_SCAN, PAGE_IS_FILE, PAGE_IS_PRESENT, PAGE_IS_WRITTEN,
};

use self::refused::Refused;
use self::registry::{PageState, Registry, Released};
use self::uffd::{RegisterMode, UffdEvent, Userfaultfd, EVENT_BATCH, UFFD_PAGEFAULT_FLAG_WP};
use crate::mem::{page_size, PageBuf};
use crate::raw::socket::PollFlags;
use std::cell::Cell;
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// Which mechanism write-protects pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// userfaultfd write-protect (`UFFD_USER_MODE_ONLY`), faults resolved by a handler thread.
    Userfaultfd,
    /// `mprotect(PROT_READ)` and a chained `SIGSEGV` handler, faults resolved in the faulting
    /// thread.
    Mprotect,
}

/// Why a span cannot be protected (the send then copies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Ineligible {
    /// This is a `fork`ed child of the process that set up the protection: the userfaultfd
    /// belongs to the parent's address space.
    #[error("the copy-on-write engine belongs to the parent process (fork)")]
    Forked,
    /// The span is not page-aligned.
    #[error("span not page-aligned")]
    Misaligned,
    /// Part of the span is the calling thread's stack: signal frames and syscall results
    /// are written there by the kernel, which would fail on a protected page.
    #[error("span lies on the thread's stack")]
    Stack,
    /// A page is file-backed or shared (page cache or shmem): another mapping could change it
    /// behind the protection.
    #[error("memory is file-backed or shared")]
    NotAnonymous,
    /// A page is not resident (never touched, or swapped out).
    #[error("memory not resident")]
    NotResident,
    /// The kernel refused to register or protect the range (e.g. another userfaultfd owns
    /// it: `EBUSY`; not anonymous memory: `EINVAL`).
    #[error("the kernel refused to protect the range (errno {0})")]
    Refused(i32),
    /// No copy-on-write engine runs in this process (see `zcnet::cow::backend`).
    #[error("no copy-on-write engine in this process")]
    Unavailable,
}

/// A protected span: one hold on each of its pages, given back with [`CowSpace::release`].
/// Deliberately not `Clone`: each protect is released once.
#[derive(Debug, PartialEq, Eq)]
pub struct Protected {
    first: usize,
    pages: usize,
}

impl Protected {
    /// Pages in the span.
    pub fn pages(&self) -> usize {
        self.pages
    }
}

/// How the program gives memory back ([`CowSpace::let_go`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveBack {
    /// `free`, `madvise(MADV_DONTNEED | MADV_FREE | MADV_REMOVE)`: the mapping stays and
    /// its bytes no longer matter.
    Freed,
    /// `munmap`: the mapping goes.
    Unmapped,
    /// `mremap`: the bytes move (or the tail goes) and stay the program's.
    Moved,
}

/// What [`CowSpace::let_go`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LetGo {
    /// Pages some send still held that were given back: no longer protected nor
    /// registered.
    pub pages: u64,
    /// Of those, pages that were still write-protected (zapped, or copied for `mremap`).
    pub protected: u64,
    /// System calls that failed meanwhile.
    pub errors: u64,
}

/// What one round of the fault handler did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultReport {
    /// Messages read.
    pub messages: u64,
    /// Write faults resolved by a private copy.
    pub faults: u64,
    /// Pages copied (faults + pages moved by `mremap` while protected).
    pub copies: u64,
    /// Nanoseconds spent resolving write faults.
    pub fault_ns: u64,
    /// Write faults on pages no longer protected (lifted meanwhile): woken only.
    pub stale: u64,
    /// Missing-page faults filled with the zero page (pages the application zapped).
    pub zero_fills: u64,
    /// `mremap`s of protected memory handled.
    pub remaps: u64,
    /// Failures (the writer was woken; it faults again or the page was gone).
    pub errors: u64,
}

impl FaultReport {
    fn add(&mut self, o: &FaultReport) {
        self.messages += o.messages;
        self.faults += o.faults;
        self.copies += o.copies;
        self.fault_ns += o.fault_ns;
        self.stale += o.stale;
        self.zero_fills += o.zero_fills;
        self.remaps += o.remaps;
        self.errors += o.errors;
    }
}

enum Backend {
    Uffd(Userfaultfd),
    Mprotect,
}

/// `mremap` events waiting to be handled (read while a copy waited for them).
const REMAP_QUEUE: usize = 256;

struct Inner {
    registry: Registry,
    staging: PageBuf,
    remaps: Vec<(usize, usize, usize)>,
}

/// The space's locks, held across a `fork` ([`CowSpace::hold_for_fork`]); the table's is
/// given back first.
pub struct ForkHold<'a> {
    _table: Locked<'a>,
    _lift: MutexGuard<'a, ()>,
}

impl std::fmt::Debug for ForkHold<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ForkHold")
    }
}

thread_local! {
    /// This thread holds the table lock (the SIGSEGV handler must not wait for it then).
    static HOLDING: Cell<bool> = const { Cell::new(false) };
}

struct Locked<'a> {
    g: MutexGuard<'a, Inner>,
    held: &'a AtomicUsize,
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // What `CowSpace::holds_pages` and `pages_held_anywhere` read without the lock
        // (still held here: the guard is dropped after this).
        let now = self.g.registry.len();
        let before = self.held.swap(now, Ordering::Relaxed);
        if now > before {
            HELD_ANYWHERE.fetch_add(now - before, Ordering::Relaxed);
        } else if now < before {
            HELD_ANYWHERE.fetch_sub(before - now, Ordering::Relaxed);
        }
        HOLDING.with(|h| h.set(false));
    }
}

/// Pages held by every space of this process: the sum of their tables' lengths.
static HELD_ANYWHERE: AtomicUsize = AtomicUsize::new(0);

/// Whether any space of this process may hold a page a send still reads: one atomic load,
/// the first thing an interposed `free` (`realloc`, `munmap`, `madvise`, `mremap`) asks.
/// A forked child inherits the parent's answer (its spaces let go of nothing).
#[inline]
pub fn pages_held_anywhere() -> bool {
    HELD_ANYWHERE.load(Ordering::Relaxed) > 0
}

impl std::ops::Deref for Locked<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.g
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        &mut self.g
    }
}

/// The process's copy-on-write machinery: the protection mechanism, the table of pages in
/// flight, and the fault handling. One per process (see [`crate::cow`]).
pub struct CowSpace {
    backend: Backend,
    inner: Mutex<Inner>,
    /// Serialises protect and lift for the mprotect backend, whose lift reads
    /// /proc/self/maps (allocates) and so must not run under `inner`.
    lift_lock: Mutex<()>,
    /// Mappings found unprotectable ([`refused`]): their spans are refused without asking.
    refused: Mutex<Refused>,
    /// Whether `refused` holds anything: the common case never takes its lock.
    any_refused: AtomicBool,
    pagemap: File,
    scan: bool,
    pid: u32,
    page: usize,
    /// Pages some send holds (the table's length when it was last unlocked): read on every
    /// `free` the preload library sees, without the lock.
    held: AtomicUsize,
}

impl std::fmt::Debug for CowSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CowSpace")
            .field("backend", &self.kind())
            .field("pagemap_scan", &self.scan)
            .finish()
    }
}

fn err(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

impl CowSpace {
    /// Sets up the `kind` backend. userfaultfd: the fd, the API handshake with
    /// `PAGEFAULT_FLAG_WP | EVENT_REMAP` (refused without `EVENT_REMAP`, see the module
    /// doc), and a check that `process_vm_readv` on ourselves works (seccomp may forbid it).
    /// mprotect: nothing yet — [`CowSpace::install_signal_handler`] arms it.
    pub fn open(kind: BackendKind) -> io::Result<CowSpace> {
        let page = page_size();
        let pagemap = File::open("/proc/self/pagemap")?;
        let mut staging = PageBuf::new(page)?;
        let staging_at = staging.as_ptr() as usize;
        let backend = match kind {
            BackendKind::Userfaultfd => {
                let uffd = Userfaultfd::user_mode_only()?;
                let probe = Userfaultfd::user_mode_only()?;
                let offered = probe.api(0)?.features;
                drop(probe);
                let want = self::uffd::UFFD_FEATURE_PAGEFAULT_FLAG_WP
                    | self::uffd::UFFD_FEATURE_EVENT_REMAP;
                if offered & want != want {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!("userfaultfd lacks PAGEFAULT_FLAG_WP or EVENT_REMAP (features {offered:#x})"),
                    ));
                }
                uffd.api(want)?;
                let src = staging.as_ptr() as usize;
                read_own(staging.as_mut_slice(), src)?;
                Backend::Uffd(uffd)
            }
            BackendKind::Mprotect => Backend::Mprotect,
        };
        let space = CowSpace {
            backend,
            inner: Mutex::new(Inner {
                registry: Registry::with_capacity(1024),
                staging,
                remaps: Vec::with_capacity(REMAP_QUEUE),
            }),
            lift_lock: Mutex::new(()),
            refused: Mutex::new(Refused::new()),
            any_refused: AtomicBool::new(false),
            pagemap,
            scan: false,
            pid: std::process::id(),
            page,
            held: AtomicUsize::new(0),
        };
        let scan = space
            .pagemap_scan(staging_at, staging_at + page, 0, 0, 0)
            .is_ok();
        Ok(CowSpace { scan, ..space })
    }

    /// The backend in use.
    pub fn kind(&self) -> BackendKind {
        match self.backend {
            Backend::Uffd(_) => BackendKind::Userfaultfd,
            Backend::Mprotect => BackendKind::Mprotect,
        }
    }

    /// The fd the fault handler polls (userfaultfd backend).
    pub fn events_fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.backend {
            Backend::Uffd(u) => Some(u.as_fd()),
            Backend::Mprotect => None,
        }
    }

    fn forked(&self) -> bool {
        std::process::id() != self.pid
    }

    /// Takes the space's locks for a `fork` the calling thread is about to make; drop the
    /// hold after it, in parent and child alike. `fork` copies only the calling thread: a
    /// lock the fault handler (or any other thread) held at that instant would stay held
    /// in the child for ever, and the child's first look at the table — a `recv` into a
    /// buffer, a protection given back — would hang (fork(2), "async-signal-safe").
    pub fn hold_for_fork(&self) -> ForkHold<'_> {
        let lift = self
            .lift_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        ForkHold {
            _table: self.lock(),
            _lift: lift,
        }
    }

    fn lock(&self) -> Locked<'_> {
        let g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        HOLDING.with(|h| h.set(true));
        Locked {
            g,
            held: &self.held,
        }
    }

    /// Locks the table with room for `extra` more pages. The table is never grown under the
    /// lock (see [`crate::cow::registry`]): a bigger one is allocated unlocked, swapped in,
    /// and the old storage returned to be freed after unlocking.
    fn lock_with_room(&self, extra: usize) -> (Locked<'_>, Option<HashMap<usize, PageState>>) {
        loop {
            let need = {
                let g = self.lock();
                if g.registry.spare() >= extra {
                    return (g, None);
                }
                (g.registry.len() + extra) * 2
            };
            let fresh = HashMap::with_capacity(need);
            let mut g = self.lock();
            if g.registry.spare() >= extra {
                drop(g);
                drop(fresh);
                continue;
            }
            let old = g.registry.rehome(fresh);
            return (g, Some(old));
        }
    }

    /// Whether `span` may be protected: page-aligned, not the calling thread's stack
    /// (`stack`, from [`vma::thread_stack`]), every page resident anonymous private memory
    /// (`PAGEMAP_SCAN`: present and not `PAGE_IS_FILE`, so shmem, `MAP_SHARED` and
    /// unwritten pages of private file mappings are refused). Without `PAGEMAP_SCAN`
    /// (kernels before 6.7), and always for the mprotect backend, the mapping is looked up
    /// in /proc/self/maps instead. A span overlapping a mapping found unprotectable before
    /// (by the maps, or by `UFFDIO_REGISTER` refusing it) is refused at once ([`refused`]).
    pub fn check(&self, span: &[u8], stack: Option<(usize, usize)>) -> Result<(), Ineligible> {
        if self.forked() {
            return Err(Ineligible::Forked);
        }
        let (start, len) = (span.as_ptr() as usize, span.len());
        if start % self.page != 0 || len % self.page != 0 || len == 0 {
            return Err(Ineligible::Misaligned);
        }
        if let Some((lo, hi)) = stack {
            if start < hi && lo < start + len {
                return Err(Ineligible::Stack);
            }
        }
        if self.known_refused(start, start + len) {
            return Err(Ineligible::NotAnonymous);
        }
        let mprotect = matches!(self.backend, Backend::Mprotect);
        if self.scan && !mprotect {
            // Pages that are not present, or are file/shmem pages, match; none may.
            match self.pagemap_scan(
                start,
                start + len,
                PAGE_IS_PRESENT,
                0,
                PAGE_IS_PRESENT | PAGE_IS_FILE,
            ) {
                Ok(Some(reg)) if reg.categories & PAGE_IS_FILE != 0 => {
                    return Err(Ineligible::NotAnonymous)
                }
                Ok(Some(_)) => return Err(Ineligible::NotResident),
                Ok(None) => return Ok(()),
                Err(_) => {}
            }
        }
        match maps_covering(start, start + len) {
            Ok(vmas) if vmas_private_anon(&vmas, start, start + len, mprotect) => {}
            Ok(vmas) => {
                self.remember_refused(&vmas);
                return Err(Ineligible::NotAnonymous);
            }
            Err(_) => return Err(Ineligible::NotAnonymous),
        }
        if !mprotect {
            // No PAGEMAP_SCAN to see residency: populate (maps the zero page where nothing
            // was written), so the send's page lookup never meets a missing page.
            // SAFETY: MADV_POPULATE_READ only faults pages in for reading; contents unchanged.
            let r = unsafe { libc::madvise(start as *mut libc::c_void, len, MADV_POPULATE_READ) };
            if r != 0 {
                return Err(Ineligible::NotResident);
            }
        }
        Ok(())
    }

    /// Write-protects `span` (page-aligned; [`CowSpace::check`] it first) and takes one hold on
    /// each of its pages. A page already held by another send is protected again (a write
    /// fault may have given it a fresh, unprotected copy since).
    pub fn protect(&self, span: &[u8]) -> Result<Protected, Ineligible> {
        if self.forked() {
            return Err(Ineligible::Forked);
        }
        let (start, len) = (span.as_ptr() as usize, span.len());
        if start % self.page != 0 || len % self.page != 0 || len == 0 {
            return Err(Ineligible::Misaligned);
        }
        let (first, pages) = (start / self.page, len / self.page);
        let _serial = match self.backend {
            Backend::Mprotect => Some(
                self.lift_lock
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner),
            ),
            Backend::Uffd(_) => None,
        };
        let (mut g, garbage) = self.lock_with_room(pages);
        g.registry.hold(first, pages);
        let r = match &self.backend {
            Backend::Uffd(u) => {
                match u.register_range(start, len, RegisterMode::MISSING | RegisterMode::WP) {
                    Err(e) => Err((e, false)),
                    Ok(_) => {
                        let deadline = Instant::now() + Duration::from_secs(2);
                        loop {
                            match u.write_protect_range(start, len, true) {
                                // A pending mremap event (mmap_changing): let the handler read it.
                                Err(e)
                                    if e.raw_os_error() == Some(libc::EAGAIN)
                                        && Instant::now() < deadline =>
                                {
                                    drop(g);
                                    std::thread::sleep(Duration::from_micros(50));
                                    g = self.lock();
                                }
                                r => break r.map_err(|e| (e, true)),
                            }
                        }
                    }
                }
            }
            Backend::Mprotect => {
                // SAFETY: mprotect to read-only changes no byte; a write to the span now
                // raises SIGSEGV, which our handler resolves (install_signal_handler ran at
                // set-up).
                match unsafe { libc::mprotect(start as *mut libc::c_void, len, libc::PROT_READ) } {
                    0 => Ok(()),
                    _ => Err((io::Error::last_os_error(), true)),
                }
            }
        };
        let out = match r {
            Ok(()) => {
                g.registry.mark_protected(first, pages);
                Ok(Protected { first, pages })
            }
            Err((e, touched)) => {
                // Give the holds back without lifting anything yet; then undo what this call
                // did, on the pages nobody else holds.
                g.registry.release([(first, pages)], |_, _| {});
                if touched {
                    match &self.backend {
                        Backend::Uffd(u) => self.lift_uffd_unheld(&g, u, first, pages),
                        Backend::Mprotect => {
                            drop(g);
                            // Reads /proc/self/maps: not under the table lock. The lift lock
                            // (held) keeps other protects of these pages out meanwhile.
                            let _lifting = Lifting::start();
                            self.lift_mprotect(start, len);
                            drop(garbage);
                            return Err(Ineligible::Refused(
                                e.raw_os_error().unwrap_or(libc::EINVAL),
                            ));
                        }
                    }
                }
                Err(Ineligible::Refused(
                    e.raw_os_error().unwrap_or(libc::EINVAL),
                ))
            }
        };
        drop(g);
        drop(garbage);
        if matches!(out, Err(Ineligible::Refused(libc::EINVAL))) {
            // Not a mapping userfaultfd covers (a private file mapping whose written pages
            // passed the page scan as anonymous): remember it, outside the table lock.
            if let Ok(vmas) = maps_covering(start, start + len) {
                self.remember_refused(&vmas);
            }
        }
        out
    }

    /// Whether `start..end` overlaps a mapping found unprotectable (one use of its entry).
    fn known_refused(&self, start: usize, end: usize) -> bool {
        if !self.any_refused.load(Ordering::Relaxed) {
            return false;
        }
        let mut r = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        let covered = r.covers(start, end);
        self.any_refused.store(!r.is_empty(), Ordering::Relaxed);
        covered
    }

    /// Remembers those of `vmas` that are not private anonymous memory.
    fn remember_refused(&self, vmas: &[vma::Vma]) {
        let mut r = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        for v in vmas.iter().filter(|v| !(v.private && v.anonymous)) {
            r.add(v.start, v.end);
        }
        self.any_refused.store(!r.is_empty(), Ordering::Relaxed);
    }

    fn lift_uffd_unheld(&self, g: &Inner, u: &Userfaultfd, first: usize, pages: usize) {
        let mut run: Option<(usize, usize)> = None;
        for p in first..first + pages {
            if g.registry.get(p).is_some() {
                if let Some((f, n)) = run.take() {
                    let _ = u.unregister_range(f * self.page, n * self.page);
                }
            } else {
                run = Some(run.map_or((p, 1), |(f, n)| (f, n + 1)));
            }
        }
        if let Some((f, n)) = run {
            let _ = u.unregister_range(f * self.page, n * self.page);
        }
    }

    /// Gives back the holds of `spans` (emptied; its storage is kept for reuse). Pages whose
    /// last hold goes are unprotected, neighbouring runs coalesced into one call. Returns
    /// the counters of those pages (faults they took, copies, fault time) for the caller's
    /// stats. Nothing is allocated under the lock: sorting happens before it.
    pub fn release(&self, spans: &mut Vec<Protected>) -> Released {
        if spans.is_empty() {
            return Released::default();
        }
        spans.sort_unstable_by_key(|s| s.first);
        let forked = self.forked();
        let out = match &self.backend {
            Backend::Uffd(u) => {
                let mut g = self.lock();
                let page = self.page;
                g.registry
                    .release(spans.iter().map(|s| (s.first, s.pages)), |f, n| {
                        if !forked {
                            // Unregistering also drops the write-protect bits and wakes anyone
                            // still waiting on the range. It fails harmlessly where the
                            // application unmapped the memory meanwhile.
                            let _ = u.unregister_range(f * page, n * page);
                        }
                    })
            }
            Backend::Mprotect => {
                let _serial = self
                    .lift_lock
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                // A write racing with this lift may find its page gone from the table but
                // still read-only: the signal handler waits for LIFTING to drop, then retries.
                let _lifting = Lifting::start();
                // At most one run per page; allocated before the table lock.
                let total: usize = spans.iter().map(|s| s.pages).sum();
                let mut runs: Vec<(usize, usize)> = Vec::with_capacity(total);
                let rel = {
                    let mut g = self.lock();
                    g.registry
                        .release(spans.iter().map(|s| (s.first, s.pages)), |f, n| {
                            if runs.len() < runs.capacity() {
                                runs.push((f, n));
                            }
                        })
                };
                if !forked {
                    for (f, n) in runs {
                        self.lift_mprotect(f * self.page, n * self.page);
                    }
                }
                rel
            }
        };
        spans.clear();
        out
    }

    /// Restores read-write on the parts of `start..start+len` that are still read-only
    /// private anonymous memory (`r--p`, as we left it). The application may have unmapped
    /// the buffer and something else — a thread stack's guard page, say — taken its place;
    /// that is left alone.
    fn lift_mprotect(&self, start: usize, len: usize) {
        let Ok(vmas) = maps_covering(start, start + len) else {
            return;
        };
        for v in vmas {
            let (s, e) = (v.start.max(start), v.end.min(start + len));
            let ours = v.private && v.anonymous && v.readable && !v.writable && !v.executable;
            if ours && s < e {
                // SAFETY: restoring write access to private anonymous memory we made
                // read-only changes no byte.
                unsafe {
                    libc::mprotect(
                        s as *mut libc::c_void,
                        e - s,
                        libc::PROT_READ | libc::PROT_WRITE,
                    );
                }
            }
        }
    }

    /// Whether some send may still hold a page: the cheap check, one atomic load without
    /// the lock, before [`CowSpace::let_go`] (asked on every `free` of the preload
    /// library). A forked child inherits the parent's count: [`CowSpace::let_go`] does
    /// nothing there.
    pub fn holds_pages(&self) -> bool {
        self.held.load(Ordering::Relaxed) > 0
    }

    /// Whether some send holds a page of `start..start + len` that is still protected or
    /// registered here (not given back yet).
    pub fn any_held(&self, start: usize, len: usize) -> bool {
        if len == 0 || !self.holds_pages() || HOLDING.with(|h| h.get()) || self.forked() {
            return false;
        }
        let first = start / self.page;
        let last = (start + len - 1) / self.page;
        self.lock().registry.any_held(first, last - first + 1)
    }

    /// The program gives back `start..start + len` — `how` says in what way — while sends
    /// may still read some of its pages: no page of it stays write-protected or registered
    /// here, so nothing the memory is handed to next (malloc's next caller, a new mapping at
    /// the address, a kernel write into either) meets a protection it never asked for.
    /// The in-flight bytes stay right: the kernel holds its own references to the pages it
    /// sends, and the program's next write lands in another page.
    ///
    /// * [`GiveBack::Freed`] (`free`, `madvise(MADV_DONTNEED)`): the mapping stays, its
    ///   bytes no longer matter. Only the pages wholly inside the range count (a chunk's
    ///   edges share pages with its neighbours). Protected pages are zapped (the next
    ///   access maps a fresh zero page; the kernel keeps sending the original), then the
    ///   range is unregistered (userfaultfd) or made writable again (mprotect).
    /// * [`GiveBack::Unmapped`] (`munmap`): the mapping goes, and its registration and
    ///   protection with it; only the table changes (no system call), before the unmap,
    ///   so that a new mapping at the address never looks protected.
    /// * [`GiveBack::Moved`] (`mremap`): the bytes move and stay the program's. Each
    ///   protected page gets its private copy now (as a write fault would give it), then
    ///   the range is unregistered: what moves is plain memory.
    ///
    /// The pages' holds stay until their sends complete (a new send of the same address
    /// is lifted by its own completion, never by an old one's). Allocates nothing.
    pub fn let_go(&self, start: usize, len: usize, how: GiveBack) -> LetGo {
        // This thread holds the lock: the call is this space's own (the SIGSEGV handler's
        // `mremap` of a copy over a protected page, interposed like the program's).
        if len == 0 || !self.holds_pages() || HOLDING.with(|h| h.get()) {
            return LetGo::default();
        }
        let page = self.page;
        let end = start.saturating_add(len);
        let (first, last) = match how {
            GiveBack::Freed => (start.div_ceil(page), end / page),
            GiveBack::Unmapped | GiveBack::Moved => (start / page, end.div_ceil(page)),
        };
        // A small chunk holds no whole page: no system call (`forked` makes one) for it.
        if last <= first || self.forked() {
            return LetGo::default();
        }
        let mut g = self.lock();
        let mut out = LetGo::default();
        let mut r = FaultReport::default();
        let mut p = first;
        while p < last {
            let Some(s) = g.registry.get(p).filter(|s| !s.gone) else {
                p += 1;
                continue;
            };
            let prot = s.protected;
            let mut q = p + 1;
            while q < last
                && g.registry
                    .get(q)
                    .is_some_and(|s| !s.gone && s.protected == prot)
            {
                q += 1;
            }
            if prot {
                out.protected += (q - p) as u64;
            }
            self.let_go_run(&mut g, p * page, (q - p) * page, prot, how, &mut r);
            p = q;
        }
        if let Backend::Uffd(u) = &self.backend {
            // Remap events read while a copy waited (see `read_while_busy`).
            self.drain_remaps(&mut g, u, &mut r);
        }
        out.pages = g.registry.let_go(first, last - first, |_, _, _| {});
        out.errors = r.errors;
        out
    }

    /// From now on the kernel may write into any of the program's memory through calls no
    /// one here sees (an `io_uring` ring): every page a send still holds is let go of at
    /// once, as for an `mremap` — each still-protected page gets its private copy, so the
    /// program keeps its bytes and the kernel keeps sending the originals — and none stays
    /// protected or registered. Returns what [`CowSpace::let_go`] did, summed.
    pub fn let_go_all(&self) -> LetGo {
        if !self.holds_pages() || HOLDING.with(|h| h.get()) || self.forked() {
            return LetGo::default();
        }
        let runs = self.lock().registry.held_runs();
        let mut out = LetGo::default();
        for (first, count) in runs {
            let r = self.let_go(first * self.page, count * self.page, GiveBack::Moved);
            out.pages += r.pages;
            out.protected += r.protected;
            out.errors += r.errors;
        }
        out
    }

    /// [`CowSpace::let_go`]'s work on one run of held pages, all protected or all not.
    fn let_go_run(
        &self,
        g: &mut Locked<'_>,
        at: usize,
        len: usize,
        protected: bool,
        how: GiveBack,
        r: &mut FaultReport,
    ) {
        let zap = |r: &mut FaultReport| {
            // SAFETY: the program gives these pages back (`free`, `madvise`): their bytes no
            // longer matter to it, and zapping changes no byte any live reference may read.
            // The kernel keeps its own references to the pages it still sends.
            if unsafe { libc::madvise(at as *mut libc::c_void, len, libc::MADV_DONTNEED) } != 0 {
                r.errors += 1;
            }
        };
        match (&self.backend, how) {
            (_, GiveBack::Unmapped) => {}
            (Backend::Uffd(u), GiveBack::Freed) => {
                if protected {
                    zap(r);
                }
                // Also wakes anyone who touched a zapped page meanwhile: a fresh page then.
                let _ = u.unregister_range(at, len);
            }
            (Backend::Uffd(u), GiveBack::Moved) => {
                if protected {
                    for a in (at..at + len).step_by(self.page) {
                        if self.copy_on_write(g, u, a, r).is_err() {
                            r.errors += 1;
                        }
                    }
                }
                let _ = u.unregister_range(at, len);
            }
            (Backend::Mprotect, GiveBack::Freed) if protected => {
                zap(r);
                let rw = libc::PROT_READ | libc::PROT_WRITE;
                // SAFETY: the run is memory this space made read-only and the program still
                // has mapped (it is freeing it now); writable again changes no byte.
                if unsafe { libc::mprotect(at as *mut libc::c_void, len, rw) } != 0 {
                    r.errors += 1;
                }
            }
            (Backend::Mprotect, GiveBack::Moved) if protected => {
                for a in (at..at + len).step_by(self.page) {
                    if !self.copy_over(a) {
                        r.errors += 1;
                    }
                }
            }
            // Copied pages of the mprotect backend are writable mappings of their own.
            (Backend::Mprotect, _) => {}
        }
    }

    /// The mprotect backend's copy-on-write of the read-only page at `page_addr` (ours,
    /// protected; the caller holds the table lock): a fresh writable page with the same
    /// bytes is moved over it, and the kernel keeps its reference to the original.
    fn copy_over(&self, page_addr: usize) -> bool {
        // SAFETY: a fresh anonymous page, checked against MAP_FAILED.
        let fresh = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                self.page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if fresh == libc::MAP_FAILED {
            return false;
        }
        // SAFETY: page_addr is a readable page this space made read-only (the table says it
        // is protected, under the lock the caller holds) and `fresh` a writable page of the
        // same size; they do not overlap. Its bytes cannot change while it is read-only.
        unsafe {
            std::ptr::copy_nonoverlapping(page_addr as *const u8, fresh.cast::<u8>(), self.page)
        };
        // SAFETY: moves the copy over the protected page atomically (MREMAP_FIXED replaces
        // the old mapping); the kernel keeps its reference to the original page.
        let moved = unsafe {
            libc::mremap(
                fresh,
                self.page,
                self.page,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                page_addr as *mut libc::c_void,
            )
        };
        if moved == libc::MAP_FAILED {
            // SAFETY: unmapping the page we mapped above.
            unsafe { libc::munmap(fresh, self.page) };
            return false;
        }
        true
    }

    /// Whether any page of `buf` is write-protected now (a kernel write into it would fail).
    pub fn any_protected(&self, buf: &[u8]) -> bool {
        if buf.is_empty() {
            return false;
        }
        let start = buf.as_ptr() as usize;
        let first = start / self.page;
        let last = (start + buf.len() - 1) / self.page;
        let g = self.lock();
        g.registry.any_protected(first, last - first + 1)
    }

    /// Pages write-protected right now.
    pub fn protected_pages(&self) -> usize {
        self.lock().registry.protected_pages()
    }

    /// Waits up to `timeout` for userfaultfd messages (`poll`); true if some are pending.
    pub fn wait_events(&self, timeout: Duration) -> io::Result<bool> {
        let Some(fd) = self.events_fd() else {
            std::thread::sleep(timeout);
            return Ok(false);
        };
        match crate::raw::socket::poll(fd, PollFlags::IN, Some(timeout)) {
            Ok(ev) => Ok(ev.contains(PollFlags::IN)),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Reads and resolves every pending userfaultfd message; the fault handler thread's
    /// loop body. Allocates nothing (see [`crate::cow::registry`]).
    pub fn handle_events(&self, report: &mut FaultReport) -> io::Result<()> {
        let Backend::Uffd(u) = &self.backend else {
            return Ok(());
        };
        loop {
            let mut evs = [None; EVENT_BATCH];
            let n = u.read_events(&mut evs)?;
            if n == 0 {
                return Ok(());
            }
            let mut r = FaultReport {
                messages: n as u64,
                ..Default::default()
            };
            let mut g = self.lock();
            for ev in evs[..n].iter().flatten() {
                match *ev {
                    UffdEvent::Pagefault { flags, address } => {
                        self.resolve(&mut g, u, flags, address as usize, &mut r)
                    }
                    UffdEvent::Remap { from, to, len } => {
                        queue_remap(&mut g, from as usize, to as usize, len as usize, &mut r)
                    }
                    UffdEvent::Other(_) => {}
                }
            }
            self.drain_remaps(&mut g, u, &mut r);
            drop(g);
            report.add(&r);
        }
    }

    fn resolve(
        &self,
        g: &mut Locked<'_>,
        u: &Userfaultfd,
        flags: u64,
        addr: usize,
        r: &mut FaultReport,
    ) {
        let page_addr = addr & !(self.page - 1);
        let pno = page_addr / self.page;
        if flags & UFFD_PAGEFAULT_FLAG_WP == 0 {
            // A missing page in a registered span: the application zapped it (MADV_DONTNEED
            // / MADV_FREE) while in flight. Anonymous memory reads back as zeros. (A page
            // zapped by our own copy is refilled before the lock is released.)
            match u.zeropage(page_addr, self.page) {
                Ok(()) => r.zero_fills += 1,
                Err(_) => {
                    let _ = u.wake(page_addr, self.page);
                }
            }
            return;
        }
        let t0 = Instant::now();
        let ours = match g.registry.get(pno) {
            Some(s) if !s.gone => s.protected,
            // Not in the table: a page mremap moved before its event was handled, or a stale
            // message; or given back ([`CowSpace::let_go`]) by an `munmap` that then failed.
            // Only our fd sets uffd-wp bits, so if the bit is set it is ours.
            _ => self.is_uffd_wp(page_addr),
        };
        if !ours {
            r.stale += 1;
            let _ = u.wake(page_addr, self.page);
            return;
        }
        match self.copy_on_write(g, u, page_addr, r) {
            Ok(()) => {
                let ns = t0.elapsed().as_nanos() as u64;
                g.registry.note_copy(pno, true, ns);
                r.faults += 1;
                r.copies += 1;
                r.fault_ns += ns;
            }
            Err(_) => {
                g.registry.note_unprotected(pno);
                r.errors += 1;
                let _ = u.wake(page_addr, self.page);
            }
        }
    }

    /// Replaces the protected page at `page_addr` by an unprotected private copy; the kernel
    /// keeps the original. See the module doc for why every byte is preserved.
    fn copy_on_write(
        &self,
        g: &mut Locked<'_>,
        u: &Userfaultfd,
        page_addr: usize,
        r: &mut FaultReport,
    ) -> io::Result<()> {
        read_own(g.staging.as_mut_slice(), page_addr)?;
        // SAFETY: the page is write-protected by us and we hold the lock, so its bytes are
        // those now in `staging`; every user access sleeps on the missing fault until the
        // refill below puts them back (module doc, Soundness).
        if unsafe {
            libc::madvise(
                page_addr as *mut libc::c_void,
                self.page,
                libc::MADV_DONTNEED,
            )
        } != 0
        {
            return Err(io::Error::last_os_error());
        }
        let mut tries = 0;
        loop {
            // SAFETY: `staging` holds exactly the bytes of the page just zapped.
            match unsafe { u.copy_page(page_addr, g.staging.as_slice()) } {
                Ok(()) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && tries < 10_000 => {
                    // An mremap is waiting for us to read its event (mmap_changing).
                    tries += 1;
                    self.read_while_busy(g, u, r);
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOMEM) && tries < 100 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_micros(100));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads messages while a copy waits: remap events are queued (reading them lets the
    /// `mremap` finish), faults are woken to fault again later — a missing fault on the
    /// page being copied must not get the zero page.
    fn read_while_busy(&self, g: &mut Locked<'_>, u: &Userfaultfd, r: &mut FaultReport) {
        let mut evs = [None; EVENT_BATCH];
        let n = u.read_events(&mut evs).unwrap_or(0);
        if n == 0 {
            std::thread::yield_now();
        }
        r.messages += n as u64;
        for ev in evs[..n].iter().flatten() {
            match *ev {
                UffdEvent::Pagefault { address, .. } => {
                    let _ = u.wake(address as usize & !(self.page - 1), self.page);
                }
                UffdEvent::Remap { from, to, len } => {
                    queue_remap(g, from as usize, to as usize, len as usize, r)
                }
                UffdEvent::Other(_) => {}
            }
        }
    }

    /// Handles queued `mremap` events: every page of the moved range that is still
    /// protected gets its private copy now (its original stays with the kernel), the moved
    /// range is unregistered, and the old addresses are no longer counted as protected.
    fn drain_remaps(&self, g: &mut Locked<'_>, u: &Userfaultfd, r: &mut FaultReport) {
        while let Some((from, to, len)) = g.remaps.pop() {
            r.remaps += 1;
            let end = to + len;
            let mut at = to;
            while at < end {
                // The next run of present, uffd-write-protected pages (PAGEMAP_SCAN), or
                // page by page through /proc/self/pagemap on older kernels.
                let (lo, hi) = if self.scan {
                    match self.pagemap_scan(
                        at,
                        end,
                        PAGE_IS_WRITTEN,
                        PAGE_IS_PRESENT | PAGE_IS_WRITTEN,
                        0,
                    ) {
                        Ok(Some(reg)) => (reg.start as usize, reg.end as usize),
                        Ok(None) => break,
                        Err(_) => (at, at + self.page),
                    }
                } else if self.is_uffd_wp(at) {
                    (at, at + self.page)
                } else {
                    at += self.page;
                    continue;
                };
                let mut p = lo.max(at);
                while p < hi.min(end) {
                    if self.is_uffd_wp(p) {
                        match self.copy_on_write(g, u, p, r) {
                            Ok(()) => {
                                r.copies += 1;
                                g.registry
                                    .note_copy((from + (p - to)) / self.page, false, 0);
                            }
                            Err(_) => r.errors += 1,
                        }
                    }
                    p += self.page;
                }
                at = hi.max(at + self.page);
            }
            let _ = u.unregister_range(to, len);
            for p in from / self.page..(from + len) / self.page {
                g.registry.note_unprotected(p);
            }
        }
    }

    /// Whether the page at `addr` is present and write-protected by a userfaultfd
    /// (/proc/self/pagemap bit 57, `PM_UFFD_WP`).
    fn is_uffd_wp(&self, addr: usize) -> bool {
        let mut e = [0u8; 8];
        let off = (addr / self.page) as u64 * 8;
        // rustix's own system call, never the C library's `pread`, which an interposer may
        // define (and the caller holds the engine's lock).
        match rustix::io::pread(&self.pagemap, &mut e, off) {
            Ok(8) => {
                let v = u64::from_ne_bytes(e);
                v & (1 << 63) != 0 && v & (1 << 57) != 0
            }
            Ok(_) | Err(_) => false,
        }
    }

    /// `PAGEMAP_SCAN` (linux/fs.h, 6.7+) of `start..end`: the first region of pages
    /// (with their categories) matching `(cat ^ inverted) & mask == mask` and, if `anyof` is non-zero,
    /// `(cat ^ inverted) & anyof != 0`; `None` if no page matches.
    fn pagemap_scan(
        &self,
        start: usize,
        end: usize,
        inverted: u64,
        mask: u64,
        anyof: u64,
    ) -> io::Result<Option<PageRegion>> {
        let mut region = PageRegion::default();
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            flags: 0,
            start: start as u64,
            end: end as u64,
            walk_end: 0,
            vec: &mut region as *mut PageRegion as u64,
            vec_len: 1,
            max_pages: 0,
            category_inverted: inverted,
            category_mask: mask,
            category_anyof_mask: anyof,
            return_mask: PAGE_IS_PRESENT | PAGE_IS_FILE | PAGE_IS_WRITTEN,
        };
        // SAFETY: PAGEMAP_SCAN reads one pm_scan_arg (a live local) and writes at most
        // vec_len = 1 page_region into `region`, a live local; it only reads page tables.
        let r = unsafe {
            libc::ioctl(
                self.pagemap.as_raw_fd(),
                PAGEMAP_SCAN as libc::Ioctl,
                &mut arg as *mut PmScanArg,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((r > 0).then_some(region))
    }

    /// Arms the mprotect backend: installs the `SIGSEGV` handler for `space`, keeping the
    /// previous action to chain to. Call once, with the process-lifetime space.
    pub fn install_signal_handler(space: &'static CowSpace) -> io::Result<()> {
        if !matches!(space.backend, Backend::Mprotect) {
            return Ok(());
        }
        // SAFETY: sigaction structs are plain old data; all-zero is valid (SIG_DFL).
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: querying the current action writes only `old`, a live local.
        if unsafe { libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut old) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let _ = OLD_SEGV.set(SigAction(old));
        SPACE.store(space as *const CowSpace as *mut CowSpace, Ordering::Release);
        // SAFETY: as above.
        let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
        new.sa_sigaction = on_sigsegv as *const () as usize;
        new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: sa_mask is a live field; sigemptyset initialises it.
        unsafe { libc::sigemptyset(&mut new.sa_mask) };
        // SAFETY: `new` is fully initialised and `on_sigsegv` is an extern "C" handler with
        // the SA_SIGINFO signature.
        if unsafe { libc::sigaction(libc::SIGSEGV, &new, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The mprotect backend's copy-on-write, run inside the SIGSEGV handler of the thread
    /// that wrote to `addr`. True if the fault was ours — resolved now, or resolved/lifted
    /// meanwhile so the write can simply be retried — false to chain to the previous handler.
    ///
    /// The table alone cannot decide: an entry may be stale (the application unmapped the
    /// buffer while in flight and the address now holds something else, such as a thread
    /// stack's guard page). So the mapping itself is looked up ([`vma_at`], allocation-free):
    /// only a read-only private anonymous page the table says is protected is copied; a
    /// fault on a page that is writable by now is retried; anything else is not ours.
    fn cow_on_signal(&self, addr: usize) -> bool {
        if HOLDING.with(|h| h.get()) {
            return false; // a genuine fault inside our own locked code
        }
        let t0 = Instant::now();
        let page_addr = addr & !(self.page - 1);
        let pno = page_addr / self.page;
        let mut g = self.lock();
        let protected = g.registry.get(pno).is_some_and(|s| s.protected);
        // Read under the table lock: no copy can change the mapping meanwhile (lifts can; see
        // below). Reading /proc/self/maps takes mmap_lock, which nobody holds while waiting
        // for our lock.
        let vma = vma_at(page_addr);
        let read_only_anon = vma.is_some_and(|v| {
            v.private && v.anonymous && v.readable && !v.writable && !v.executable
        });
        if !(protected && read_only_anon) {
            drop(g);
            if vma.is_some_and(|v| v.writable) {
                return true; // copied or lifted since the write faulted: retry it
            }
            if LIFTING.load(Ordering::Acquire) > 0 {
                // Its release removed the page from the table but has not made it writable
                // yet: wait for that, then retry (a foreign fault comes back and is chained).
                while LIFTING.load(Ordering::Acquire) > 0 {
                    std::thread::yield_now();
                }
                return true;
            }
            return false;
        }
        // A read-only private anonymous page we protected, under the lock: its bytes cannot
        // change while we copy them.
        if !self.copy_over(page_addr) {
            return false;
        }
        let ns = t0.elapsed().as_nanos() as u64;
        g.registry.note_copy(pno, true, ns);
        SIGNAL_FAULTS.fetch_add(1, Ordering::Relaxed);
        SIGNAL_FAULT_NS.fetch_add(ns, Ordering::Relaxed);
        true
    }
}

/// Releases of the mprotect backend in progress (between taking pages out of the table and
/// making them writable again).
static LIFTING: AtomicUsize = AtomicUsize::new(0);

struct Lifting;

impl Lifting {
    fn start() -> Lifting {
        LIFTING.fetch_add(1, Ordering::AcqRel);
        Lifting
    }
}

impl Drop for Lifting {
    fn drop(&mut self) {
        LIFTING.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Write faults resolved by the mprotect backend's signal handler, and their time.
pub fn signal_fault_totals() -> (u64, u64) {
    (
        SIGNAL_FAULTS.load(Ordering::Relaxed),
        SIGNAL_FAULT_NS.load(Ordering::Relaxed),
    )
}

static SIGNAL_FAULTS: AtomicU64 = AtomicU64::new(0);
static SIGNAL_FAULT_NS: AtomicU64 = AtomicU64::new(0);
static SPACE: AtomicPtr<CowSpace> = AtomicPtr::new(std::ptr::null_mut());

struct SigAction(libc::sigaction);
// SAFETY: a sigaction is plain data (handler address, mask, flags), written once before the
// handler that reads it is installed.
unsafe impl Sync for SigAction {}
// SAFETY: as above.
unsafe impl Send for SigAction {}
static OLD_SEGV: OnceLock<SigAction> = OnceLock::new();

extern "C" fn on_sigsegv(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    const SEGV_ACCERR: i32 = 2;
    if code == SEGV_ACCERR {
        let p = SPACE.load(Ordering::Acquire);
        // SAFETY: SPACE is only ever set to a &'static CowSpace.
        if !p.is_null() && unsafe { &*p }.cow_on_signal(addr) {
            return;
        }
    }
    chain_sigsegv(sig, info, ctx);
}

/// Passes a fault that is not ours to the action installed before us; with none (or
/// `SIG_IGN`), restores `SIG_DFL` so the faulting instruction, run again, gets the default.
fn chain_sigsegv(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    match OLD_SEGV.get() {
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
            unsafe { libc::sigaction(libc::SIGSEGV, &dfl, std::ptr::null_mut()) };
        }
    }
}

fn queue_remap(g: &mut Locked<'_>, from: usize, to: usize, len: usize, r: &mut FaultReport) {
    if g.remaps.len() < g.remaps.capacity() {
        g.remaps.push((from, to, len));
    } else {
        // Never grow under the lock. The moved pages stay protected and registered: writes
        // to them are still copied (their uffd-wp bit is found in pagemap), only the
        // registration outlives the send.
        r.errors += 1;
    }
}

/// Reads `dst.len()` bytes of our own memory at `src` with `process_vm_readv(2)`: a
/// kernel-mode read, which fails with `EFAULT` where nothing is mapped instead of faulting
/// the caller (the fault handler must never fault on application memory itself).
fn read_own(dst: &mut [u8], src: usize) -> io::Result<()> {
    let local = libc::iovec {
        iov_base: dst.as_mut_ptr().cast(),
        iov_len: dst.len(),
    };
    let remote = libc::iovec {
        iov_base: src as *mut libc::c_void,
        iov_len: dst.len(),
    };
    // SAFETY: `local` describes `dst`, live and writable for its length; the remote range is
    // only read, by the kernel, which checks it.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != dst.len() {
        return Err(err(libc::EFAULT));
    }
    Ok(())
}

/// Aborts a TCP connection in place (`connect(AF_UNSPEC)`, i.e. `tcp_disconnect`): sends a
/// reset and drops the send queue, so the kernel lets go of the pages it still held, while
/// the fd stays open. The cow path uses it for a sender dropped with sends still in flight.
pub fn abort_connection(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: sockaddr is plain data; all-zero with sa_family AF_UNSPEC is the documented
    // "dissolve the association" address.
    let mut sa: libc::sockaddr = unsafe { std::mem::zeroed() };
    sa.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
    // SAFETY: `sa` is a live local of the length passed.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            &sa,
            std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::vma::parse_maps_line;
    use super::*;

    #[test]
    fn pagemap_scan_ioctl_number_matches_the_uapi_header() {
        assert_eq!(std::mem::size_of::<PmScanArg>(), 96);
        assert_eq!(PAGEMAP_SCAN, 0xC060_6610);
    }

    #[test]
    fn maps_lines_are_classified() {
        let anon = parse_maps_line("7f00a000-7f00c000 rw-p 00000000 00:00 0 ").unwrap();
        assert_eq!((anon.start, anon.end), (0x7f00a000, 0x7f00c000));
        assert!(anon.readable && anon.writable && !anon.executable);
        assert!(anon.private && anon.anonymous);
        let heap = parse_maps_line("55d0-56d0 rw-p 00000000 00:00 0   [heap]").unwrap();
        assert!(heap.anonymous);
        let stack = parse_maps_line("7ffd-7ffe rw-p 00000000 00:00 0   [stack]").unwrap();
        assert!(!stack.anonymous);
        let shared =
            parse_maps_line("1000-2000 rw-s 00000000 00:01 1234 /dev/zero (deleted)").unwrap();
        assert!(!shared.private && !shared.anonymous);
        let file = parse_maps_line("1000-2000 r-xp 00000000 08:01 77 /usr/lib/x.so").unwrap();
        assert!(file.readable && !file.writable && file.executable && !file.anonymous);
        let guard = parse_maps_line("3000-4000 ---p 00000000 00:00 0").unwrap();
        assert!(!guard.readable && !guard.writable && guard.anonymous);
        assert!(parse_maps_line("garbage").is_none());
        let v = [anon];
        assert!(vmas_private_anon(&v, 0x7f00a000, 0x7f00c000, true));
        assert!(!vmas_private_anon(&v, 0x7f009000, 0x7f00c000, true));
    }

    #[test]
    fn eligibility_follows_the_memory_kind() {
        let space = CowSpace::open(BackendKind::Userfaultfd).expect("userfaultfd backend");
        let page = page_size();
        let mut anon = PageBuf::new(4 * page).unwrap();
        anon.as_mut_slice().fill(1);
        assert_eq!(space.check(anon.as_slice(), None), Ok(()));
        assert_eq!(
            space.check(&anon.as_slice()[1..page + 1], None),
            Err(Ineligible::Misaligned)
        );
        let lo = anon.as_ptr() as usize;
        assert_eq!(
            space.check(anon.as_slice(), Some((lo + page, lo + 2 * page))),
            Err(Ineligible::Stack)
        );
        // SAFETY: (test) a shared anonymous mapping, unmapped below.
        let shared = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(shared, libc::MAP_FAILED);
        // SAFETY: (test) the mapping is live, writable, page-sized.
        let s = unsafe { std::slice::from_raw_parts_mut(shared.cast::<u8>(), page) };
        s.fill(1);
        assert_eq!(space.check(s, None), Err(Ineligible::NotAnonymous));
        // SAFETY: (test) unmapping our own mapping; `s` is not used after.
        unsafe { libc::munmap(shared, page) };
    }

    /// `getrandom(2)` into `buf`: a kernel write; its errno if it fails.
    fn kernel_write(buf: &mut [u8]) -> Result<usize, i32> {
        // SAFETY: (test) `buf` is a live, writable slice of its length.
        let r = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
        if r < 0 {
            return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        Ok(r as usize)
    }

    /// Memory given back while in flight: a kernel write into a protected page fails
    /// (`UFFD_USER_MODE_ONLY`) until the space lets go of it — freed pages zapped, moved
    /// ones copied with their bytes — and the old hold then lifts nothing.
    #[test]
    fn pages_let_go_take_kernel_writes_and_moved_ones_keep_their_bytes() {
        for kind in [BackendKind::Userfaultfd, BackendKind::Mprotect] {
            let_go_with(kind);
        }
    }

    fn let_go_with(kind: BackendKind) {
        // No fault handler: nothing here writes to a protected page.
        let space = CowSpace::open(kind).expect("backend");
        let page = page_size();
        for how in [GiveBack::Freed, GiveBack::Moved, GiveBack::Unmapped] {
            let mut buf = PageBuf::new(8 * page).unwrap();
            buf.as_mut_slice().fill(3);
            space.check(buf.as_slice(), None).unwrap();
            let p = space.protect(&buf.as_slice()[..4 * page]).unwrap();
            assert!(space.holds_pages());
            assert_eq!(
                kernel_write(&mut buf.as_mut_slice()[page..2 * page]),
                Err(libc::EFAULT),
                "{kind:?} {how:?}: protected"
            );
            // A freed chunk that starts inside the first page: only whole pages count.
            let start = buf.as_ptr() as usize + 16;
            let done = space.let_go(start, 8 * page - 16, how);
            let whole = if how == GiveBack::Freed { 3 } else { 4 };
            assert_eq!(
                (done.pages, done.protected, done.errors),
                (whole, whole, 0),
                "{kind:?} {how:?}"
            );
            assert_eq!(
                space.any_held(buf.as_ptr() as usize, page),
                how == GiveBack::Freed,
                "{kind:?} {how:?}: the first page is held only by a free that left it"
            );
            if how == GiveBack::Unmapped {
                // Only the table changed: the mapping (with its protection) goes next.
                assert!(!space.any_protected(buf.as_slice()));
            } else {
                let b = &mut buf.as_mut_slice()[page..4 * page];
                let want = if how == GiveBack::Moved { 3 } else { 0 };
                assert!(
                    b.iter().all(|&x| x == want),
                    "{kind:?} {how:?}: bytes kept or zeroed"
                );
                assert_eq!(
                    kernel_write(b),
                    Ok(3 * page),
                    "{kind:?} {how:?}: given back"
                );
            }
            let rel = space.release(&mut vec![p]);
            assert_eq!(rel.pages, 4, "{kind:?} {how:?}");
            assert!(!space.any_protected(buf.as_slice()), "{kind:?} {how:?}");
            if how == GiveBack::Freed {
                assert_eq!(kernel_write(&mut buf.as_mut_slice()[..page]), Ok(page));
            }
        }
        assert!(!space.holds_pages());
    }

    /// An `io_uring` ring appears: every held page of two separate spans is let go of at
    /// once, with its bytes, and takes kernel writes; the sends' holds then lift nothing.
    #[test]
    fn letting_go_of_everything_keeps_the_bytes_and_takes_kernel_writes() {
        for kind in [BackendKind::Userfaultfd, BackendKind::Mprotect] {
            let space = CowSpace::open(kind).expect("backend");
            let page = page_size();
            let mut a = PageBuf::new(4 * page).unwrap();
            let mut b = PageBuf::new(2 * page).unwrap();
            a.as_mut_slice().fill(5);
            b.as_mut_slice().fill(6);
            space.check(a.as_slice(), None).unwrap();
            space.check(b.as_slice(), None).unwrap();
            let pa = space.protect(&a.as_slice()[page..]).unwrap();
            let pb = space.protect(b.as_slice()).unwrap();
            assert_eq!(
                kernel_write(&mut b.as_mut_slice()[..page]),
                Err(libc::EFAULT),
                "{kind:?}: protected"
            );
            let done = space.let_go_all();
            assert_eq!(
                (done.pages, done.protected, done.errors),
                (5, 5, 0),
                "{kind:?}"
            );
            assert!(!space.any_protected(a.as_slice()) && !space.any_protected(b.as_slice()));
            assert!(a.as_slice().iter().all(|&x| x == 5), "{kind:?}: bytes kept");
            assert!(b.as_slice().iter().all(|&x| x == 6), "{kind:?}: bytes kept");
            assert_eq!(kernel_write(&mut a.as_mut_slice()[page..]), Ok(3 * page));
            assert_eq!(kernel_write(b.as_mut_slice()), Ok(2 * page));
            assert_eq!(
                space.let_go_all(),
                LetGo::default(),
                "{kind:?}: nothing left"
            );
            let rel = space.release(&mut vec![pa, pb]);
            assert_eq!(rel.pages, 5, "{kind:?}");
            assert!(!space.holds_pages(), "{kind:?}");
        }
    }

    /// iperf3's buffer: a private mapping of a file, written (so its pages are anonymous
    /// copies and the page scan passes them) — userfaultfd refuses it, and the refusal is
    /// remembered so the next sends are refused without the scan, the holds and the ioctl.
    #[test]
    fn a_private_file_mapping_refused_once_is_refused_at_once_after() {
        let space = CowSpace::open(BackendKind::Userfaultfd).expect("userfaultfd backend");
        let page = page_size();
        let mut file = crate::testing::Mapping::file_copy_writable(&vec![0; 4 * page]).unwrap();
        let s = file.as_mut_slice();
        s.fill(7);
        let first = space.check(s, None).and_then(|()| space.protect(s));
        assert!(
            matches!(
                first,
                Err(Ineligible::Refused(libc::EINVAL)) | Err(Ineligible::NotAnonymous)
            ),
            "{first:?}"
        );
        assert!(space.any_refused.load(Ordering::Relaxed), "remembered");
        for _ in 0..refused::USES {
            assert_eq!(
                space.check(&s[page..2 * page], None),
                Err(Ineligible::NotAnonymous)
            );
        }
        // The entry has answered its uses: the mapping is looked at afresh, and refused
        // again by whichever check sees it.
        assert!(
            !space.any_refused.load(Ordering::Relaxed),
            "forgotten after its uses"
        );
        let again = space.check(s, None).and_then(|()| space.protect(s));
        assert!(again.is_err(), "{again:?}");
        assert!(
            space.any_refused.load(Ordering::Relaxed),
            "remembered again"
        );
        // Anonymous memory elsewhere is untouched by the refusal.
        let mut anon = PageBuf::new(2 * page).unwrap();
        anon.as_mut_slice().fill(1);
        assert_eq!(space.check(anon.as_slice(), None), Ok(()));
        assert_eq!(
            s.iter().filter(|&&b| b != 7).count(),
            0,
            "the bytes are unchanged"
        );
        file.unmap().unwrap();
    }
}
