//! The process-wide facts every call consults: the configuration, this host's page costs
//! (on first need: from this boot's cache, else measured), whether any zero-copy send
//! happened, and receive detours.

use crate::config::Config;
use crate::cost::{load_or_measure, measure_huge, PageCost, Source};
use crate::stats::UdpCounters;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

static CONFIG: OnceLock<Config> = OnceLock::new();
static COST: OnceLock<Option<(PageCost, Source)>> = OnceLock::new();
static HUGE_COST: OnceLock<Option<f64>> = OnceLock::new();
static ZC_EVER: AtomicBool = AtomicBool::new(false);
static DETOURS: AtomicU64 = AtomicU64::new(0);
static UDP: OnceLock<UdpCounters> = OnceLock::new();

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
    ZC_EVER.store(true, Relaxed);
}
