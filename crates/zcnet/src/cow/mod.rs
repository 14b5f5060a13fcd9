//! Copy-on-write for zero-copy transmit that keeps copy semantics: the engine behind the
//! `cow` transmit path (`crate::tx::cow`), after Solaris's transmit side (Chu, "Zero-Copy TCP in Solaris",
//! §3.2.4, §4.4.1, table 6).
//!
//! [`crate::Sender::send_slice`] on the `cow` path sends the page-aligned middle of the
//! caller's slice with `MSG_ZEROCOPY` and write-protects those pages until the kernel's
//! completion says it no longer reads them. A write to such a page gives the writer a private
//! copy — the kernel keeps sending the original — so the caller may reuse the slice as soon
//! as `send_slice` returns, exactly as with a copying send.
//!
//! One engine per process, shared by every `cow` sender: the protection mechanism and the
//! table of protected pages ([`zcnet_sys::cow::CowSpace`]) and, for the userfaultfd backend,
//! one fault-handling thread (`zcnet-cow`). It starts on first use.
//!
//! # Backends
//!
//! * `userfaultfd` (default): write-protect with `UFFD_USER_MODE_ONLY` userfaultfd, which
//!   works unprivileged (docs/measurements/kernel-findings.md §6).
//! * `mprotect`: where userfaultfd is unavailable; `SIGSEGV` handler chained to the previous
//!   one. See [`zcnet_sys::cow`] for its limits.
//!
//! [`use_backend`] (or [`use_backend_named`], which also takes `none`) forces a choice before
//! the engine starts (for tests and measurements); `none` disables the engine, so every
//! `cow` send copies and counts [`crate::FallbackReason::Unsupported`]. The library reads no
//! environment variable for it; the `zcnet` CLI maps `ZCNET_COW_BACKEND` onto
//! [`use_backend_named`].
//!
//! # Which memory is protected
//!
//! Found by trying (see `docs/ARCHITECTURE.md`, "cow"): only resident, private, anonymous
//! pages — heap (`brk` or `mmap`), anonymous `mmap`, [`crate::TxBuf`] storage — and not the
//! calling thread's stack. File-backed and shared mappings (`MAP_SHARED`, memfd, shmem)
//! are refused even though userfaultfd would register some of them: another mapping could
//! change the bytes behind the protection. Refused spans are copied and counted as
//! [`crate::FallbackReason::Unprotectable`].
//!
//! # Kernel writes into memory in flight
//!
//! With `UFFD_USER_MODE_ONLY`, the kernel cannot write into a protected page: `read(2)` or
//! `recv(2)` into a buffer whose earlier contents are still in flight fails with `EFAULT`.
//! [`crate::Receiver::recv_into`] checks the table first and, for a protected buffer,
//! receives into a scratch buffer and copies (a user write, resolved by copy-on-write). Any
//! other kernel write (the application's own `read`, another library's) fails until the
//! send completes; [`is_protected`] tells whether a buffer is affected, and
//! [`crate::Sender::flush`] waits until nothing is.
//!
//! # Process events
//!
//! * `fork`: the child's memory is not protected (the kernel drops userfaultfd registrations
//!   in the child) and its writes are ordinary copy-on-write, so the parent's sends are
//!   safe. In the child the engine refuses to protect (it would act on the parent), and its
//!   `cow` senders copy.
//! * `munmap` of a buffer in flight (a `Vec` dropped after `send_slice`): fine; the kernel
//!   holds its own page references, and releasing the protection later skips the hole.
//!   Memory freed *without* an unmap (a heap chunk malloc hands out again) stays protected
//!   until the send completes, unless whoever frees it calls [`let_go`] first — as the
//!   preload library does for every `free`, `realloc`, `munmap`, `madvise` and `mremap` it
//!   sees, so that no kernel write into the reused memory fails.
//! * `mremap` (`realloc` of a large buffer) in flight: handled by userfaultfd's remap event
//!   (every still-protected moved page gets its private copy at once).
//! * exit: the handler thread dies with the process; nothing persists.

pub(crate) mod gate;

pub use gate::WorkingSetRule;
pub use zcnet_sys::cow::{BackendKind, GiveBack, Ineligible, LetGo};

use crate::error::Result;
use serde::Serialize;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Barrier, OnceLock};
use std::time::Duration;
use zcnet_sys::cow::registry::Released;
use zcnet_sys::cow::{CowSpace, FaultReport, Protected};

/// How the `cow` path decides per [`crate::Sender::send_slice`] (beyond
/// [`crate::Policy`]'s size threshold and COPIED demotion, which it shares with `zerocopy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct CowPolicy {
    /// Solaris's working-set threshold (see `gate`).
    pub working_set: WorkingSetRule,
}

impl CowPolicy {
    /// Protect every eligible span, however small the working set: for tests and for
    /// measuring fault costs.
    pub fn always() -> Self {
        CowPolicy {
            working_set: WorkingSetRule::Off,
        }
    }

    /// Sets the working-set rule.
    pub fn with_working_set(mut self, rule: WorkingSetRule) -> Self {
        self.working_set = rule;
        self
    }
}

/// Process-wide counters of the engine (all senders together; per-sender numbers are in
/// each sender's [`crate::Stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct EngineStats {
    /// The protection mechanism.
    pub backend: BackendKind,
    /// userfaultfd messages read.
    pub messages: u64,
    /// Write faults resolved by a private copy.
    pub faults: u64,
    /// Pages copied (faults + pages moved by `mremap` while protected).
    pub copies: u64,
    /// Time spent resolving write faults (ns).
    pub fault_ns: u64,
    /// Faults on pages whose protection was lifted meanwhile (woken, not copied).
    pub stale: u64,
    /// Missing pages filled with zeros (pages the application zapped while in flight).
    pub zero_fills: u64,
    /// `mremap`s of protected memory handled.
    pub remaps: u64,
    /// Failures while resolving.
    pub errors: u64,
    /// `Receiver::recv_into` calls that received into scratch because the buffer was
    /// protected.
    pub kernel_write_detours: u64,
    /// Pages protected right now.
    pub protected_pages: u64,
}

#[derive(Debug, Default)]
struct Counters {
    /// Set by the fault handler once its start-up is done ([`spawn_handler`]).
    handler_started: AtomicBool,
    messages: AtomicU64,
    faults: AtomicU64,
    copies: AtomicU64,
    fault_ns: AtomicU64,
    stale: AtomicU64,
    zero_fills: AtomicU64,
    remaps: AtomicU64,
    errors: AtomicU64,
    detours: AtomicU64,
}

impl Counters {
    fn add(&self, r: &FaultReport) {
        self.messages.fetch_add(r.messages, Relaxed);
        self.faults.fetch_add(r.faults, Relaxed);
        self.copies.fetch_add(r.copies, Relaxed);
        self.fault_ns.fetch_add(r.fault_ns, Relaxed);
        self.stale.fetch_add(r.stale, Relaxed);
        self.zero_fills.fetch_add(r.zero_fills, Relaxed);
        self.remaps.fetch_add(r.remaps, Relaxed);
        self.errors.fetch_add(r.errors, Relaxed);
    }
}

/// The process's copy-on-write engine.
#[derive(Debug)]
pub(crate) struct Engine {
    space: &'static CowSpace,
    counters: &'static Counters,
}

/// Why the copy-on-write engine cannot run in this process: disabled (`none`), an unknown
/// backend name, every backend refused (one `kind: reason` each), or another backend
/// already running; the message says which. Kept for the process's life: a backend that
/// failed once is not retried (as quinn-udp lowers a capability for good).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(transparent)]
pub struct CowUnavailable(#[from] Why);

/// The reasons behind a [`CowUnavailable`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum Why {
    /// [`use_backend_named`] was given `none` (or `off`).
    #[error("copy-on-write disabled (backend `none`)")]
    Disabled,
    /// [`use_backend_named`] was given a name that is no backend.
    #[error("unknown copy-on-write backend {0:?} (known: auto, userfaultfd, mprotect, none)")]
    UnknownBackend(String),
    /// Every backend tried was refused; one `kind: reason` per backend.
    #[error("no copy-on-write backend could start: {0}")]
    Refused(String),
    /// [`use_backend`] asked for one backend after the engine had started with another.
    #[error("the engine already runs with {0:?}")]
    AlreadyRunning(BackendKind),
}

static ENGINE: OnceLock<std::result::Result<Engine, CowUnavailable>> = OnceLock::new();

/// The automatic choice: userfaultfd, else mprotect.
const AUTO: &[BackendKind] = &[BackendKind::Userfaultfd, BackendKind::Mprotect];

fn start() -> std::result::Result<Engine, CowUnavailable> {
    start_with(AUTO)
}

/// The backends a name asks for, in order (`""`/`auto`: the automatic choice), or why none.
fn backends_named(name: &str) -> std::result::Result<&'static [BackendKind], CowUnavailable> {
    match name.trim() {
        "" | "auto" => Ok(AUTO),
        "userfaultfd" | "uffd" => Ok(&[BackendKind::Userfaultfd]),
        "mprotect" => Ok(&[BackendKind::Mprotect]),
        "none" | "off" => Err(Why::Disabled.into()),
        other => Err(Why::UnknownBackend(other.to_string()).into()),
    }
}

/// Starts the engine with the backend `name` says — `auto`, `userfaultfd`, `mprotect`, or
/// `none` (the engine stays off for the whole process: every `cow` send copies) — before
/// any `cow` sender does: what a program maps a setting of its own onto (the `zcnet` CLI:
/// `ZCNET_COW_BACKEND`). `none` and an unknown name leave the engine off, and return why.
pub fn use_backend_named(name: &str) -> std::result::Result<(), CowUnavailable> {
    let kinds = backends_named(name);
    let want = kinds.clone();
    match ENGINE.get_or_init(|| want.and_then(start_with)) {
        Ok(e) => match kinds {
            Ok(k) if k.contains(&e.space.kind()) => Ok(()),
            _ => Err(Why::AlreadyRunning(e.space.kind()).into()),
        },
        Err(why) => Err(why.clone()),
    }
}

fn start_with(kinds: &[BackendKind]) -> std::result::Result<Engine, CowUnavailable> {
    let mut why = Vec::new();
    for &kind in kinds {
        match CowSpace::open(kind) {
            Ok(space) => {
                let space: &'static CowSpace = Box::leak(Box::new(space));
                let counters: &'static Counters = Box::leak(Box::default());
                match kind {
                    BackendKind::Userfaultfd => spawn_handler(space, counters)
                        .map_err(|e| Why::Refused(format!("spawning the fault handler: {e}")))?,
                    BackendKind::Mprotect => CowSpace::install_signal_handler(space)
                        .map_err(|e| Why::Refused(format!("sigaction(SIGSEGV): {e}")))?,
                }
                return Ok(Engine { space, counters });
            }
            Err(e) => why.push(format!("{kind:?}: {e}")),
        }
    }
    Err(Why::Refused(why.join("; ")).into())
}

/// The fault-handling thread: waits on the userfaultfd and resolves every message. Its
/// loop allocates nothing (an application thread may sleep on a fault while holding the
/// allocator's lock).
///
/// Returns only once the thread is past its start-up. A thread's start-up allocates and
/// frees through the program's allocator (the C library's list of thread-exit functions,
/// std's spawn hooks); done after the first pages were protected, an allocator that shares
/// its arenas between threads (jemalloc) may hand it memory in a protected page — a page
/// whose write fault only this thread could resolve. Seen: redis under `zcnet run --tx
/// zerocopy`, its main thread and this one both asleep in `handle_userfault`, this one in
/// `calloc` from `__cxa_thread_atexit_impl`.
fn spawn_handler(space: &'static CowSpace, counters: &'static Counters) -> std::io::Result<()> {
    // Leaked, not shared by `Arc`: the last owner frees, and the handler must never free.
    let started: &'static Barrier = Box::leak(Box::new(Barrier::new(2)));
    std::thread::Builder::new()
        .name("zcnet-cow".into())
        .spawn(move || {
            // Every C call of this thread is zcnet's own: an interposer (the preload
            // library) passes it straight to the C library. Its `pread` of
            // /proc/self/pagemap under the engine's lock would otherwise reach the
            // interposer's receive check, which takes that same lock.
            zcnet_sys::reentry::own_thread();
            counters.handler_started.store(true, Relaxed);
            started.wait();
            handle_for_ever(space, counters)
        })?;
    started.wait();
    Ok(())
}

fn handle_for_ever(space: &'static CowSpace, counters: &'static Counters) -> ! {
    loop {
        if space.wait_events(Duration::from_secs(1)).is_err() {
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut r = FaultReport::default();
        if space.handle_events(&mut r).is_err() {
            std::thread::sleep(Duration::from_millis(10));
        }
        counters.add(&r);
    }
}

/// The engine, started on first call; the reason when it cannot run here.
pub(crate) fn engine() -> std::result::Result<&'static Engine, &'static CowUnavailable> {
    ENGINE.get_or_init(start).as_ref()
}

/// The backend this process uses (starting the engine if needed), or why there is none.
pub fn backend() -> std::result::Result<BackendKind, CowUnavailable> {
    engine().map(|e| e.space.kind()).map_err(Clone::clone)
}

/// Starts the engine with `kind` (instead of the automatic choice), before any `cow`
/// sender does. Fails if it cannot run here, or if the engine already runs with another
/// backend (there is one per process).
pub fn use_backend(kind: BackendKind) -> std::result::Result<(), CowUnavailable> {
    match ENGINE.get_or_init(|| start_with(&[kind])) {
        Ok(e) if e.space.kind() == kind => Ok(()),
        Ok(e) => Err(Why::AlreadyRunning(e.space.kind()).into()),
        Err(why) => Err(why.clone()),
    }
}

/// The engine's process-wide counters; `None` before any `cow` sender started it (or when
/// it could not start).
pub fn engine_stats() -> Option<EngineStats> {
    let e = ENGINE.get()?.as_ref().ok()?;
    let c = e.counters;
    let (sig_faults, sig_ns) = zcnet_sys::cow::signal_fault_totals();
    Some(EngineStats {
        backend: e.space.kind(),
        messages: c.messages.load(Relaxed),
        faults: c.faults.load(Relaxed) + sig_faults,
        copies: c.copies.load(Relaxed) + sig_faults,
        fault_ns: c.fault_ns.load(Relaxed) + sig_ns,
        stale: c.stale.load(Relaxed),
        zero_fills: c.zero_fills.load(Relaxed),
        remaps: c.remaps.load(Relaxed),
        errors: c.errors.load(Relaxed),
        kernel_write_detours: c.detours.load(Relaxed),
        protected_pages: e.space.protected_pages() as u64,
    })
}

/// The engine's locks, held by the thread about to `fork` ([`hold_for_fork`]).
#[derive(Debug)]
pub struct ForkHold(#[allow(dead_code)] Option<zcnet_sys::cow::ForkHold<'static>>);

/// Holds the engine's locks for a `fork` the calling thread is about to make (nothing if
/// no engine runs); drop the hold after the fork in both processes, so that the child
/// never inherits a lock another thread held (see [`CowSpace::hold_for_fork`]).
pub fn hold_for_fork() -> ForkHold {
    ForkHold(match ENGINE.get() {
        Some(Ok(e)) => Some(e.space.hold_for_fork()),
        _ => None,
    })
}

/// Whether any page of `buf` is write-protected because a `cow` send may still read it:
/// a kernel write into `buf` (`read`, `recv`) would fail with `EFAULT` now.
pub fn is_protected(buf: &[u8]) -> bool {
    match ENGINE.get() {
        Some(Ok(e)) => e.space.any_protected(buf),
        _ => false,
    }
}

/// Whether some `cow` send may still hold a page of this process (no lock: cheap enough
/// for every `free` an interposer sees).
pub fn holds_pages() -> bool {
    match ENGINE.get() {
        Some(Ok(e)) => e.space.holds_pages(),
        _ => false,
    }
}

/// Whether some `cow` send still holds a page of `start..start + len` that is protected or
/// registered (see [`let_go`]).
pub fn any_held(start: usize, len: usize) -> bool {
    match ENGINE.get() {
        Some(Ok(e)) => e.space.any_held(start, len),
        _ => false,
    }
}

/// The program gives back `start..start + len` (`how`: freed, unmapped, moved) while sends
/// may still read some of its pages: none of them stays write-protected or registered, so
/// whatever the memory is handed to next — a kernel write included — never meets a
/// protection, and the bytes in flight stay those sent (see
/// [`zcnet_sys::cow::CowSpace::let_go`]). Call it before the memory is given back.
pub fn let_go(start: usize, len: usize, how: GiveBack) -> LetGo {
    match ENGINE.get() {
        Some(Ok(e)) => e.space.let_go(start, len, how),
        _ => LetGo::default(),
    }
}

/// The kernel may from now on write into any of this process's memory through calls no one
/// here sees (an `io_uring` ring: its reads complete in the kernel, where a write-protected
/// page fails them with `EFAULT`): every page a `cow` send still holds is unprotected now,
/// after a private copy for the program where the kernel still reads it, so the program's
/// bytes and those in flight both stay as they are (see
/// [`zcnet_sys::cow::CowSpace::let_go_all`]). Protecting more pages afterwards is the
/// caller's choice; the preload library stops protecting in such a process.
pub fn let_go_all() -> LetGo {
    match ENGINE.get() {
        Some(Ok(e)) => e.space.let_go_all(),
        _ => LetGo::default(),
    }
}

/// Runs `recv` — a kernel write into its argument — on `buf`, or, when part of `buf` is
/// protected, on a scratch buffer whose bytes are then copied into `buf` by user-mode
/// writes, which the engine resolves by copy-on-write. Returns what `recv` returned.
pub(crate) fn kernel_write_into(
    buf: &mut [u8],
    recv: impl FnOnce(&mut [u8]) -> Result<usize>,
) -> Result<usize> {
    let e = match ENGINE.get() {
        Some(Ok(e)) if e.space.any_protected(buf) => e,
        _ => return recv(buf),
    };
    e.counters.detours.fetch_add(1, Relaxed);
    let mut scratch = vec![0u8; buf.len().min(1 << 20)];
    let n = recv(&mut scratch)?;
    buf[..n].copy_from_slice(&scratch[..n]);
    Ok(n)
}

/// Write-protection of one page-aligned span of application memory, for zero-copy senders
/// zcnet does not drive itself (UDP `MSG_ZEROCOPY`, io_uring `SEND_ZC` from user memory):
/// until it is dropped, a write to the span gives the writer a private copy and the kernel
/// keeps reading the original bytes. Drop it (or [`Protection::release`]) once the kernel's
/// completion covers every send that named the span.
///
/// Forgetting it is safe but leaves the span protected (and its kernel writes failing with
/// `EFAULT`) for the life of the process.
#[derive(Debug)]
pub struct Protection {
    span: Option<Protected>,
    engine: &'static Engine,
}

impl Protection {
    /// Pages protected.
    pub fn pages(&self) -> usize {
        self.span.as_ref().map_or(0, Protected::pages)
    }

    /// Lifts the protection (if no other protection holds the pages) and returns what the
    /// pages went through while protected.
    pub fn release(mut self) -> Released {
        self.lift()
    }

    fn lift(&mut self) -> Released {
        match self.span.take() {
            Some(p) => self.engine.release(&mut vec![p]),
            None => Released::default(),
        }
    }
}

impl Drop for Protection {
    fn drop(&mut self) {
        self.lift();
    }
}

/// Write-protects `span` (page-aligned start and length; resident private anonymous memory,
/// not the calling thread's stack) until the returned [`Protection`] is dropped. Starts the
/// engine if needed.
pub fn protect(span: &[u8]) -> std::result::Result<Protection, Ineligible> {
    let engine = engine().map_err(|_| Ineligible::Unavailable)?;
    let p = engine.protect(span)?;
    Ok(Protection {
        span: Some(p),
        engine,
    })
}

thread_local! {
    static STACK: Cell<Option<Option<(usize, usize)>>> = const { Cell::new(None) };
}

/// The calling thread's stack, looked up once per thread.
fn this_thread_stack() -> Option<(usize, usize)> {
    STACK.with(|s| {
        if let Some(v) = s.get() {
            return v;
        }
        let v = zcnet_sys::cow::vma::thread_stack();
        s.set(Some(v));
        v
    })
}

impl Engine {
    /// Checks and write-protects `span`.
    pub(crate) fn protect(&self, span: &[u8]) -> std::result::Result<Protected, Ineligible> {
        self.space.check(span, this_thread_stack())?;
        self.space.protect(span)
    }

    /// Lifts the protection of completed spans (`spans` is emptied).
    pub(crate) fn release(&self, spans: &mut Vec<Protected>) -> Released {
        self.space.release(spans)
    }

    /// The protection mechanism.
    pub(crate) fn kind(&self) -> BackendKind {
        self.space.kind()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine is handed out only once its fault handler has finished starting, so
    /// nothing is protected while that thread may still allocate (`spawn_handler`). Without
    /// the wait, the thread has usually not run yet when the spawn returns.
    #[test]
    fn the_engine_starts_only_once_its_fault_handler_is_past_its_start_up() {
        for _ in 0..5 {
            let engine = start_with(&[BackendKind::Userfaultfd])
                .expect("userfaultfd, user-mode only (Linux >= 5.11)");
            assert!(engine.counters.handler_started.load(Relaxed));
        }
    }
}
