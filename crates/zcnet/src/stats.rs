//! Where the bytes went: by path, what the kernel copied anyway, and every fallback with its
//! reason. Counters are relaxed atomics so the data path pays one uncontended add per
//! operation, and a [`StatsSnapshot`] is a plain value to print, diff or serialise.

use crate::auto::AutoStats;
use crate::path::FallbackReason;
use serde::Serialize;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

const NREASONS: usize = FallbackReason::ALL.len();

/// Live counters of one sender, receiver, or several sharing an `Arc<Stats>`.
#[derive(Debug, Default)]
pub struct Stats {
    tx_bytes_copy: AtomicU64,
    tx_bytes_zerocopy: AtomicU64,
    tx_bytes_zc_copied: AtomicU64,
    tx_calls_copy: AtomicU64,
    tx_calls_zerocopy: AtomicU64,
    tx_notifications: AtomicU64,
    tx_completed_calls: AtomicU64,
    tx_demotions: AtomicU64,
    tx_enobufs: AtomicU64,
    pool_waits: AtomicU64,
    pool_timeouts: AtomicU64,
    rx_bytes_mapped: AtomicU64,
    rx_bytes_copied: AtomicU64,
    rx_zc_calls: AtomicU64,
    rx_zc_empty_calls: AtomicU64,
    rx_release_calls: AtomicU64,
    rx_bytes_released: AtomicU64,
    tx_bytes_file: AtomicU64,
    tx_calls_file: AtomicU64,
    rx_bytes_file: AtomicU64,
    rx_calls_file: AtomicU64,
    tx_uring_fixed_calls: AtomicU64,
    tx_uring_register_failures: AtomicU64,
    tx_uring_refused: AtomicU64,
    tx_uring_submits: AtomicU64,
    tx_short_sends: AtomicU64,
    rx_uring_cqes: AtomicU64,
    rx_uring_rearms: AtomicU64,
    rx_uring_enobufs: AtomicU64,
    rx_zcrx_refusals: AtomicU64,
    rx_zcrx_errno: AtomicU64,
    tx_cow_protections: AtomicU64,
    tx_cow_pages_protected: AtomicU64,
    tx_cow_bytes_protected: AtomicU64,
    tx_cow_faults: AtomicU64,
    tx_cow_fault_ns: AtomicU64,
    tx_cow_copies: AtomicU64,
    fallback_ops: [AtomicU64; NREASONS],
    fallback_bytes: [AtomicU64; NREASONS],
    auto_tx: [AtomicU64; AutoStats::LEN],
    auto_rx: [AtomicU64; AutoStats::LEN],
}

/// Adds the non-zero counters of `delta` (an operation touches two or three of them).
fn add_auto(into: &[AtomicU64; AutoStats::LEN], delta: &AutoStats) {
    for (a, v) in into.iter().zip(delta.to_array()) {
        if v > 0 {
            a.fetch_add(v, Relaxed);
        }
    }
}

fn read_auto(from: &[AtomicU64; AutoStats::LEN]) -> AutoStats {
    AutoStats::from_array(std::array::from_fn(|i| from[i].load(Relaxed)))
}

/// A point-in-time copy of [`Stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct StatsSnapshot {
    /// Bytes sent by plain `send` (copy semantics, policy, or fallback).
    pub tx_bytes_copy: u64,
    /// Bytes sent with `MSG_ZEROCOPY`.
    pub tx_bytes_zerocopy: u64,
    /// Of those, bytes whose completion said the kernel copied them anyway.
    pub tx_bytes_zc_copied: u64,
    /// `send` calls on the copy path.
    pub tx_calls_copy: u64,
    /// Successful `MSG_ZEROCOPY` calls (each takes one notification id).
    pub tx_calls_zerocopy: u64,
    /// Notifications read from the error queue.
    pub tx_notifications: u64,
    /// Zero-copy calls those notifications completed.
    pub tx_completed_calls: u64,
    /// Times a socket stopped asking for zero-copy because completions kept saying COPIED.
    pub tx_demotions: u64,
    /// `ENOBUFS` returns seen (each followed by a reap and a retry or a fallback).
    pub tx_enobufs: u64,
    /// Times a sender waited for a buffer to come back to its pool.
    pub pool_waits: u64,
    /// Waits that ran out of time.
    pub pool_timeouts: u64,
    /// Bytes received without a copy: pages mapped by `TCP_ZEROCOPY_RECEIVE`, or placed in
    /// the zcrx area by the NIC (io_uring zero-copy receive).
    pub rx_bytes_mapped: u64,
    /// Bytes received by copying (`recv`, or the kernel's copybuf).
    pub rx_bytes_copied: u64,
    /// `TCP_ZEROCOPY_RECEIVE` calls.
    pub rx_zc_calls: u64,
    /// Of those, calls that mapped nothing.
    pub rx_zc_empty_calls: u64,
    /// Batched page releases (`madvise(MADV_DONTNEED)` calls).
    pub rx_release_calls: u64,
    /// Bytes of mapped pages released.
    pub rx_bytes_released: u64,
    /// Bytes sent from a file by `sendfile` or `splice` (page-cache pages handed to the
    /// socket, never in user memory). A file's fallback bytes count in `tx_bytes_copy`.
    pub tx_bytes_file: u64,
    /// `sendfile` / `splice`-to-socket calls that moved bytes.
    pub tx_calls_file: u64,
    /// Bytes received straight into a file by `splice` (socket → pipe → file, never in user
    /// memory). Bytes written with `pwrite` count where they were received (copied/mapped).
    pub rx_bytes_file: u64,
    /// `splice` calls from the socket that moved bytes.
    pub rx_calls_file: u64,
    /// io_uring `SEND_ZC` requests that named a registered (fixed) buffer, so the kernel
    /// skipped looking up and pinning its pages (`IORING_RECVSEND_FIXED_BUF`).
    pub tx_uring_fixed_calls: u64,
    /// Pools an io_uring sender could not register as fixed buffers (`RLIMIT_MEMLOCK`, too
    /// many buffers): it then sent with plain `SEND_ZC`, pinning per request.
    pub tx_uring_register_failures: u64,
    /// Messages an io_uring sender (`zcnet_msg::MsgTx::Uring`) could not queue — every slot
    /// held, or the ring refused the request — and sent by `MSG_ZEROCOPY` instead.
    pub tx_uring_refused: u64,
    /// `io_uring_enter` calls a message sender's ring made to submit `SEND_ZC` requests:
    /// `tx_calls_zerocopy / tx_uring_submits` is the requests per system call
    /// (`zcnet-tokio`'s `ZcUdpSocket` submits several messages' requests in one).
    pub tx_uring_submits: u64,
    /// Zero-copy sends the kernel took only in part (io_uring `SEND_ZC` result short of the
    /// request); the rest went in a further request, never lost.
    pub tx_short_sends: u64,
    /// Completions of the io_uring multishot receive that carried data.
    pub rx_uring_cqes: u64,
    /// Times the multishot receive had ended (its buffer ring ran dry, or the kernel ended
    /// it) and was armed again.
    pub rx_uring_rearms: u64,
    /// Times the provided-buffer ring ran dry (`-ENOBUFS` ended the multishot receive).
    pub rx_uring_enobufs: u64,
    /// zcrx registrations (`IORING_REGISTER_ZCRX_IFQ`) the kernel refused; the receiver fell
    /// back, counted as [`FallbackReason::Unsupported`].
    pub rx_zcrx_refusals: u64,
    /// The errno of the last zcrx refusal (0: none), e.g. `EOPNOTSUPP` (95) for a device
    /// without header split and queue management.
    pub rx_zcrx_errno: u64,
    /// `cow`: spans write-protected for a zero-copy send (one protect call each).
    pub tx_cow_protections: u64,
    /// `cow`: pages those spans covered.
    pub tx_cow_pages_protected: u64,
    /// `cow`: bytes sent with `MSG_ZEROCOPY` from write-protected application memory.
    pub tx_cow_bytes_protected: u64,
    /// `cow`: writes to pages still in flight, each resolved by giving the writer a private
    /// copy (counted when the pages' last send completes).
    pub tx_cow_faults: u64,
    /// `cow`: time the fault handler spent resolving those faults (ns).
    pub tx_cow_fault_ns: u64,
    /// `cow`: pages copied (faults, plus protected pages moved by `mremap`).
    pub tx_cow_copies: u64,
    /// Fallbacks by reason: (reason, operations, bytes). Reasons with no count are left out.
    pub fallbacks: Vec<(FallbackReason, u64, u64)>,
    /// The `auto` transmit path's decisions and diversions, each by reason.
    pub auto_tx: AutoStats,
    /// The `auto` receive path's decisions and demotions.
    pub auto_rx: AutoStats,
}

impl StatsSnapshot {
    /// Operations that fell back for `reason`.
    pub fn fallback_ops(&self, reason: FallbackReason) -> u64 {
        self.fallbacks
            .iter()
            .find(|f| f.0 == reason)
            .map_or(0, |f| f.1)
    }

    /// Bytes that fell back for `reason`.
    pub fn fallback_bytes(&self, reason: FallbackReason) -> u64 {
        self.fallbacks
            .iter()
            .find(|f| f.0 == reason)
            .map_or(0, |f| f.2)
    }

    /// All bytes sent.
    pub fn tx_bytes(&self) -> u64 {
        self.tx_bytes_copy + self.tx_bytes_zerocopy + self.tx_bytes_file
    }

    /// All bytes received.
    pub fn rx_bytes(&self) -> u64 {
        self.rx_bytes_mapped + self.rx_bytes_copied + self.rx_bytes_file
    }

    /// Fraction of sent bytes that really went without a copy (sent zero-copy and not
    /// reported COPIED, or sent from the page cache by `sendfile`/`splice`). Bytes whose
    /// completion is still outstanding count as not copied.
    pub fn tx_zerocopy_fraction(&self) -> f64 {
        let total = self.tx_bytes();
        if total == 0 {
            return 0.0;
        }
        (self
            .tx_bytes_zerocopy
            .saturating_sub(self.tx_bytes_zc_copied)
            + self.tx_bytes_file) as f64
            / total as f64
    }

    /// Fraction of received bytes that were mapped rather than copied.
    pub fn rx_mapped_fraction(&self) -> f64 {
        let total = self.rx_bytes();
        if total == 0 {
            return 0.0;
        }
        self.rx_bytes_mapped as f64 / total as f64
    }
}

/// A short human summary: what was sent and received, by which path, how much of it the
/// kernel really did not copy, and every fallback with its reason. Sides that moved nothing
/// are left out.
///
/// ```text
/// sent 1 GiB: 1 GiB zero-copy (96.0% not copied), 64 KiB copied; received nothing; fallbacks: too_small 3 ops, 192 B
/// ```
impl std::fmt::Display for StatsSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        let mut side = |what: &str, total: u64, pieces: &[(&str, u64)]| {
            if total == 0 {
                parts.push(format!("{what} nothing"));
                return;
            }
            let by: Vec<String> = pieces
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|(name, n)| format!("{} {name}", fmt_bytes(*n)))
                .collect();
            parts.push(format!("{what} {}: {}", fmt_bytes(total), by.join(", ")));
        };
        let zc = if self.tx_bytes_zerocopy > 0 {
            let kept = self
                .tx_bytes_zerocopy
                .saturating_sub(self.tx_bytes_zc_copied);
            format!(
                "zero-copy ({:.1}% not copied)",
                100.0 * kept as f64 / self.tx_bytes_zerocopy as f64
            )
        } else {
            "zero-copy".into()
        };
        side(
            "sent",
            self.tx_bytes(),
            &[
                (zc.as_str(), self.tx_bytes_zerocopy),
                ("from files", self.tx_bytes_file),
                ("copied", self.tx_bytes_copy),
            ],
        );
        side(
            "received",
            self.rx_bytes(),
            &[
                ("mapped", self.rx_bytes_mapped),
                ("into files", self.rx_bytes_file),
                ("copied", self.rx_bytes_copied),
            ],
        );
        write!(f, "{}", parts.join("; "))?;
        if !self.fallbacks.is_empty() {
            let fb: Vec<String> = self
                .fallbacks
                .iter()
                .map(|(r, ops, bytes)| format!("{} {ops} ops, {}", r.name(), fmt_bytes(*bytes)))
                .collect();
            write!(f, "; fallbacks: {}", fb.join(", "))?;
        }
        Ok(())
    }
}

macro_rules! adders {
    ($($name:ident => $field:ident),* $(,)?) => {
        $(
            #[doc = concat!("Adds to `", stringify!($field), "`.")]
            #[inline]
            pub fn $name(&self, n: u64) {
                self.$field.fetch_add(n, Relaxed);
            }
        )*
    };
}

thread_local! {
    /// Bytes this thread has handed to the kernel for sending, whichever `Stats` counted
    /// them. A `Sender` runs each call on its caller's thread, so the difference across a
    /// call is that call's own bytes even when many senders share one `Stats`.
    static TX_HANDED: Cell<u64> = const { Cell::new(0) };
}

/// Bytes this thread has handed to the kernel so far (see `TX_HANDED`).
pub(crate) fn tx_handed_by_this_thread() -> u64 {
    TX_HANDED.with(Cell::get)
}

impl Stats {
    /// Fresh zeroed counters.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds to `tx_bytes_copy` (bytes the kernel copied from user memory).
    #[inline]
    pub fn add_tx_copy_bytes(&self, n: u64) {
        self.tx_bytes_copy.fetch_add(n, Relaxed);
        TX_HANDED.with(|c| c.set(c.get() + n));
    }

    /// Adds to `tx_bytes_zerocopy` (bytes lent to the kernel).
    #[inline]
    pub fn add_tx_zerocopy_bytes(&self, n: u64) {
        self.tx_bytes_zerocopy.fetch_add(n, Relaxed);
        TX_HANDED.with(|c| c.set(c.get() + n));
    }

    /// Adds to `tx_bytes_file` (bytes sent from the page cache).
    #[inline]
    pub fn add_tx_file_bytes(&self, n: u64) {
        self.tx_bytes_file.fetch_add(n, Relaxed);
        TX_HANDED.with(|c| c.set(c.get() + n));
    }

    adders! {
        add_tx_zc_copied_bytes => tx_bytes_zc_copied,
        add_tx_copy_calls => tx_calls_copy,
        add_tx_zerocopy_calls => tx_calls_zerocopy,
        add_tx_notifications => tx_notifications,
        add_tx_completed_calls => tx_completed_calls,
        add_tx_demotions => tx_demotions,
        add_tx_enobufs => tx_enobufs,
        add_pool_waits => pool_waits,
        add_pool_timeouts => pool_timeouts,
        add_rx_mapped_bytes => rx_bytes_mapped,
        add_rx_copied_bytes => rx_bytes_copied,
        add_rx_zc_calls => rx_zc_calls,
        add_rx_zc_empty_calls => rx_zc_empty_calls,
        add_rx_release_calls => rx_release_calls,
        add_rx_released_bytes => rx_bytes_released,
        add_tx_file_calls => tx_calls_file,
        add_rx_file_bytes => rx_bytes_file,
        add_rx_file_calls => rx_calls_file,
        add_tx_uring_fixed_calls => tx_uring_fixed_calls,
        add_tx_uring_register_failures => tx_uring_register_failures,
        add_tx_uring_refused => tx_uring_refused,
        add_tx_uring_submits => tx_uring_submits,
        add_tx_short_sends => tx_short_sends,
        add_rx_uring_cqes => rx_uring_cqes,
        add_rx_uring_rearms => rx_uring_rearms,
        add_rx_uring_enobufs => rx_uring_enobufs,
        add_rx_zcrx_refusals => rx_zcrx_refusals,
        add_tx_cow_protections => tx_cow_protections,
        add_tx_cow_pages_protected => tx_cow_pages_protected,
        add_tx_cow_bytes_protected => tx_cow_bytes_protected,
        add_tx_cow_faults => tx_cow_faults,
        add_tx_cow_fault_ns => tx_cow_fault_ns,
        add_tx_cow_copies => tx_cow_copies,
    }

    /// Records the errno of a refused zcrx registration (kept: the last one wins).
    pub fn set_rx_zcrx_errno(&self, errno: i32) {
        self.rx_zcrx_errno.store(errno.max(0) as u64, Relaxed);
    }

    /// Counts one operation of `bytes` that fell back to copying for `reason`.
    pub fn fallback(&self, reason: FallbackReason, bytes: u64) {
        self.fallback_ops[reason.index()].fetch_add(1, Relaxed);
        self.fallback_bytes[reason.index()].fetch_add(bytes, Relaxed);
    }

    /// Adds one transmit operation's `auto` decisions (and any demotion) to the totals.
    pub fn add_auto_tx(&self, delta: &AutoStats) {
        add_auto(&self.auto_tx, delta);
    }

    /// Adds one to each of the transmit-side `auto` counters at `at` (indices of
    /// [`AutoStats::to_array`]): a routine decision's two counters, found once per stream
    /// size ([`AutoStats::touched`]) rather than summed over all thirty per operation.
    pub(crate) fn count_auto_tx(&self, at: &[usize]) {
        for &i in at {
            if let Some(a) = self.auto_tx.get(i) {
                a.fetch_add(1, Relaxed);
            }
        }
    }

    /// Adds receive-side `auto` decisions (and any demotion) to the totals.
    pub fn add_auto_rx(&self, delta: &AutoStats) {
        add_auto(&self.auto_rx, delta);
    }

    /// Reads every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        let g = |a: &AtomicU64| a.load(Relaxed);
        StatsSnapshot {
            tx_bytes_copy: g(&self.tx_bytes_copy),
            tx_bytes_zerocopy: g(&self.tx_bytes_zerocopy),
            tx_bytes_zc_copied: g(&self.tx_bytes_zc_copied),
            tx_calls_copy: g(&self.tx_calls_copy),
            tx_calls_zerocopy: g(&self.tx_calls_zerocopy),
            tx_notifications: g(&self.tx_notifications),
            tx_completed_calls: g(&self.tx_completed_calls),
            tx_demotions: g(&self.tx_demotions),
            tx_enobufs: g(&self.tx_enobufs),
            pool_waits: g(&self.pool_waits),
            pool_timeouts: g(&self.pool_timeouts),
            rx_bytes_mapped: g(&self.rx_bytes_mapped),
            rx_bytes_copied: g(&self.rx_bytes_copied),
            rx_zc_calls: g(&self.rx_zc_calls),
            rx_zc_empty_calls: g(&self.rx_zc_empty_calls),
            rx_release_calls: g(&self.rx_release_calls),
            rx_bytes_released: g(&self.rx_bytes_released),
            tx_bytes_file: g(&self.tx_bytes_file),
            tx_calls_file: g(&self.tx_calls_file),
            rx_bytes_file: g(&self.rx_bytes_file),
            rx_calls_file: g(&self.rx_calls_file),
            tx_uring_fixed_calls: g(&self.tx_uring_fixed_calls),
            tx_uring_register_failures: g(&self.tx_uring_register_failures),
            tx_uring_refused: g(&self.tx_uring_refused),
            tx_uring_submits: g(&self.tx_uring_submits),
            tx_short_sends: g(&self.tx_short_sends),
            rx_uring_cqes: g(&self.rx_uring_cqes),
            rx_uring_rearms: g(&self.rx_uring_rearms),
            rx_uring_enobufs: g(&self.rx_uring_enobufs),
            rx_zcrx_refusals: g(&self.rx_zcrx_refusals),
            rx_zcrx_errno: g(&self.rx_zcrx_errno),
            tx_cow_protections: g(&self.tx_cow_protections),
            tx_cow_pages_protected: g(&self.tx_cow_pages_protected),
            tx_cow_bytes_protected: g(&self.tx_cow_bytes_protected),
            tx_cow_faults: g(&self.tx_cow_faults),
            tx_cow_fault_ns: g(&self.tx_cow_fault_ns),
            tx_cow_copies: g(&self.tx_cow_copies),
            fallbacks: FallbackReason::ALL
                .iter()
                .map(|&r| {
                    (
                        r,
                        g(&self.fallback_ops[r.index()]),
                        g(&self.fallback_bytes[r.index()]),
                    )
                })
                .filter(|f| f.1 > 0)
                .collect(),
            auto_tx: read_auto(&self.auto_tx),
            auto_rx: read_auto(&self.auto_rx),
        }
    }
}

/// `4000 B`, `64 KiB`, `1.5 MiB`, `97.7 KiB`: a unit when the value is a whole or tenth
/// multiple of it or at least ten of it, bytes otherwise.
pub fn fmt_bytes(n: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (size, unit) in UNITS {
        if n >= size {
            if n.is_multiple_of(size) {
                return format!("{} {unit}", n / size);
            }
            if n >= 10 * size || (n * 10).is_multiple_of(size) {
                return format!("{:.1} {unit}", n as f64 / size as f64);
            }
        }
    }
    format!("{n} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_and_fallbacks_add_up() {
        let s = Stats::new();
        s.add_tx_copy_bytes(100);
        s.add_tx_zerocopy_bytes(300);
        s.add_tx_zc_copied_bytes(100);
        s.fallback(FallbackReason::TooSmall, 100);
        s.fallback(FallbackReason::TooSmall, 5);
        s.add_rx_mapped_bytes(3);
        s.add_rx_copied_bytes(1);
        let snap = s.snapshot();
        assert_eq!(snap.tx_bytes(), 400);
        assert!((snap.tx_zerocopy_fraction() - 0.5).abs() < 1e-9);
        assert!((snap.rx_mapped_fraction() - 0.75).abs() < 1e-9);
        assert_eq!(snap.fallback_ops(FallbackReason::TooSmall), 2);
        assert_eq!(snap.fallback_bytes(FallbackReason::TooSmall), 105);
        assert_eq!(snap.fallback_ops(FallbackReason::Enobufs), 0);
        assert_eq!(snap.fallbacks.len(), 1);
    }

    #[test]
    fn file_bytes_count_in_the_totals() {
        let s = Stats::new();
        s.add_tx_copy_bytes(100);
        s.add_tx_file_bytes(300);
        s.add_rx_copied_bytes(1);
        s.add_rx_file_bytes(3);
        s.fallback(FallbackReason::FileUnsupported, 100);
        let snap = s.snapshot();
        assert_eq!(snap.tx_bytes(), 400);
        assert!((snap.tx_zerocopy_fraction() - 0.75).abs() < 1e-9);
        assert_eq!(snap.rx_bytes(), 4);
        assert_eq!(snap.fallback_bytes(FallbackReason::FileUnsupported), 100);
        assert_eq!(FallbackReason::FileUnsupported.name(), "file_unsupported");
    }
}
