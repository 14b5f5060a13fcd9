//! The process-wide facts every call consults: the configuration, this host's page costs
//! (on first need: from this boot's cache, else measured), whether any zero-copy send
//! happened, receive detours, and which process this memory belongs to.

use crate::config::Config;
use crate::cost::{load_or_measure, measure_huge, PageCost, Source};
use crate::stats::UdpCounters;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

static CONFIG: OnceLock<Config> = OnceLock::new();
static COST: OnceLock<Option<(PageCost, Source)>> = OnceLock::new();
static HUGE_COST: OnceLock<Option<f64>> = OnceLock::new();
static ZC_EVER: AtomicBool = AtomicBool::new(false);
static DETOURS: AtomicU64 = AtomicU64::new(0);
static UDP: OnceLock<UdpCounters> = OnceLock::new();
/// The process this memory is its own in (0: not asked yet); see [`borrowed_memory`].
static OWN_PID: AtomicU32 = AtomicU32::new(0);
/// This process is a forked child of a process whose protection engine ran: the engine's
/// counters are the parent's.
static ENGINE_INHERITED: AtomicBool = AtomicBool::new(false);

/// Memory the program gave back while zero-copy sends still held some of its pages
/// (`free`, `realloc`, `munmap`, `madvise`, `mremap`): those pages' protection was lifted
/// before anything else could be handed them ([`zcnet::cow::let_go`]).
#[derive(Debug, Default)]
pub struct Freed {
    calls: AtomicU64,
    pages: AtomicU64,
    protected: AtomicU64,
    errors: AtomicU64,
}

/// A snapshot of [`Freed`], as written to the stats line (`freed_in_flight`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct FreedReport {
    /// Calls that gave back memory some send still held.
    pub calls: u64,
    /// Held pages given back: no longer registered nor protected.
    pub pages: u64,
    /// Of those, pages still write-protected then (zapped, or copied for `mremap`).
    pub protected_pages: u64,
    /// System calls that failed while letting go.
    pub errors: u64,
}

static FREED: Freed = Freed {
    calls: AtomicU64::new(0),
    pages: AtomicU64::new(0),
    protected: AtomicU64::new(0),
    errors: AtomicU64::new(0),
};

/// Counts one give-back that let go of held pages (allocates nothing: runs inside `free`).
pub fn count_freed(r: zcnet::cow::LetGo) {
    FREED.calls.fetch_add(1, Relaxed);
    FREED.pages.fetch_add(r.pages, Relaxed);
    FREED.protected.fetch_add(r.protected, Relaxed);
    FREED.errors.fetch_add(r.errors, Relaxed);
    crate::slot::add(zcnet_sys::board::freed(0), 1);
    crate::slot::add(zcnet_sys::board::freed(1), r.pages);
    crate::slot::add(zcnet_sys::board::freed(2), r.protected);
    crate::slot::add(zcnet_sys::board::freed(3), r.errors);
}

/// What was let go so far.
pub fn freed() -> FreedReport {
    FreedReport {
        calls: FREED.calls.load(Relaxed),
        pages: FREED.pages.load(Relaxed),
        protected_pages: FREED.protected.load(Relaxed),
        errors: FREED.errors.load(Relaxed),
    }
}

/// The process's `sendmmsg` counters.
pub fn udp() -> &'static UdpCounters {
    UDP.get_or_init(UdpCounters::default)
}

/// Counts one receive (into any descriptor) detoured through scratch memory.
pub fn count_detour() {
    DETOURS.fetch_add(1, Relaxed);
}

/// Receives detoured through scratch memory so far.
pub fn detours() -> u64 {
    DETOURS.load(Relaxed)
}

/// The configuration, read from the environment on first use.
pub fn config() -> &'static Config {
    CONFIG.get_or_init(Config::from_env)
}

fn cost_and_source() -> Option<(PageCost, Source)> {
    *COST.get_or_init(|| load_or_measure(config().cache_dir.as_deref()))
}

/// This host's page costs (`None`: no protection engine here).
pub fn cost() -> Option<PageCost> {
    cost_and_source().map(|(c, _)| c)
}

/// Protect + unprotect per 4 KiB page of a huge page (measured on first need).
pub fn huge_cost() -> Option<f64> {
    *HUGE_COST.get_or_init(measure_huge)
}

/// The huge-page cost if it was measured.
pub fn huge_cost_if_measured() -> Option<f64> {
    HUGE_COST.get().copied().flatten()
}

/// The costs if this process needed them.
pub fn cost_if_measured() -> Option<PageCost> {
    COST.get().copied().flatten().map(|(c, _)| c)
}

/// Where the costs came from, if this process needed them.
pub fn cost_source() -> Option<Source> {
    COST.get().copied().flatten().map(|(_, s)| s)
}

/// Some socket of this process has sent zero-copy: there may be completions to hide.
pub fn zc_ever() -> bool {
    ZC_EVER.load(Relaxed)
}

/// Records that a zero-copy send happened.
pub fn set_zc_ever() {
    if !ZC_EVER.swap(true, Relaxed) {
        note_own_pid();
    }
}

/// Remembers which process this memory is its own in, once something is due before an
/// `exec` (a stats line, completions to settle): one `getpid`, the only system call it
/// costs, and none in a process that never needs it.
pub fn note_own_pid() {
    if OWN_PID.load(Relaxed) == 0 {
        OWN_PID.store(std::process::id(), Relaxed);
    }
}

/// Whether the calling process runs in memory that is another process's: a child of
/// `vfork` (Python's `subprocess`, `posix_spawn`-like code calling `vfork` and `execve`
/// itself) or of `clone(CLONE_VM)`, about to `exec`. No `fork` hook ran for it, so every
/// counter, socket and board slot it sees is its parent's, which goes on with them: it
/// must neither write its parent's line nor read its parent's completions (vfork(2)).
pub fn borrowed_memory() -> bool {
    let own = OWN_PID.load(Relaxed);
    own != 0 && own != std::process::id()
}

/// In a forked child: what the parent counted is the parent's to report. The child starts
/// from zero — its sockets' counters are reset by [`crate::table::after_fork`] — so its
/// line, if it sends at all, holds only what it did itself.
pub fn after_fork_in_child() {
    if OWN_PID.load(Relaxed) != 0 {
        OWN_PID.store(std::process::id(), Relaxed);
    }
    DETOURS.store(0, Relaxed);
    for c in [&FREED.calls, &FREED.pages, &FREED.protected, &FREED.errors] {
        c.store(0, Relaxed);
    }
    udp().reset();
    crate::rings::after_fork_in_child();
    if zcnet::cow::engine_stats().is_some() {
        ENGINE_INHERITED.store(true, Relaxed);
    }
}

/// Whether the protection engine's counters are this process's own (not a forked child's
/// inherited ones).
pub fn engine_is_own() -> bool {
    !ENGINE_INHERITED.load(Relaxed)
}
