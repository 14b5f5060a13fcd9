//! When zero-copy can pay, decided per operation. Pure code.
//!
//! The CMU stack chose its single-copy path per write by size (crossover 8–16 KB) and Solaris
//! by size and alignment; Linux's MSG_ZEROCOPY documentation puts the break-even near 10 KB,
//! since pinning pages and reading a notification cost more than copying a few pages. And a
//! socket whose completions keep saying the kernel copied anyway (loopback, veth into a
//! namespace) gains nothing from asking: after `demote_after_copied` consecutive COPIED
//! completions, or `demote_after_copied_bytes` consecutive bytes reported COPIED, it stops
//! asking, as the kernel documentation suggests. Bytes matter because notifications merge:
//! the kernel reports a run of calls in one range, so a fast sender whose calls complete
//! in batches of hundreds may see few notifications per gigabyte, and a count of
//! notifications alone would let it pay for zero-copy over the whole transfer.

use crate::path::FallbackReason;

/// Per-operation decision rules for the zero-copy transmit path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Policy {
    /// Sends smaller than this are copied.
    pub min_zerocopy_bytes: usize,
    /// Copy sends whose start is not page-aligned.
    pub require_page_aligned: bool,
    /// Stop asking for zero-copy after this many consecutive COPIED notifications; `None`
    /// keeps asking (needed, for example, to feed a mapping receiver on loopback).
    pub demote_after_copied: Option<u32>,
    /// Stop asking for zero-copy after this many consecutive bytes were reported COPIED
    /// (whichever of the two limits comes first); `None` counts notifications only.
    pub demote_after_copied_bytes: Option<u64>,
}

/// The default of [`Policy::demote_after_copied_bytes`]: 16 MiB, a few milliseconds of a
/// loopback stream, long enough that one copied burst (a packet tap cloning skbs) does not
/// demote a socket whose device takes the pages.
pub const DEMOTE_AFTER_COPIED_BYTES: u64 = 16 << 20;

impl Default for Policy {
    fn default() -> Self {
        Policy {
            min_zerocopy_bytes: 16 * 1024,
            require_page_aligned: false,
            demote_after_copied: Some(64),
            demote_after_copied_bytes: Some(DEMOTE_AFTER_COPIED_BYTES),
        }
    }
}

/// The path one send takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxDecision {
    /// Send with `MSG_ZEROCOPY`.
    ZeroCopy,
    /// Send with plain `send`, for this reason.
    Copy(FallbackReason),
}

impl Policy {
    /// Always zero-copy when possible: threshold 1 byte, no alignment rule, no demotion.
    pub fn always() -> Self {
        Policy {
            min_zerocopy_bytes: 1,
            require_page_aligned: false,
            demote_after_copied: None,
            demote_after_copied_bytes: None,
        }
    }

    /// Sets the size threshold.
    pub fn with_min_zerocopy_bytes(mut self, n: usize) -> Self {
        self.min_zerocopy_bytes = n;
        self
    }

    /// Sets the alignment rule.
    pub fn with_page_aligned(mut self, required: bool) -> Self {
        self.require_page_aligned = required;
        self
    }

    /// Sets the demotion rule in notifications; `None` turns demotion off altogether
    /// (bytes too).
    pub fn with_demotion(mut self, after_copied: Option<u32>) -> Self {
        self.demote_after_copied = after_copied;
        if after_copied.is_none() {
            self.demote_after_copied_bytes = None;
        }
        self
    }

    /// Sets the demotion rule in consecutive COPIED bytes.
    pub fn with_demotion_bytes(mut self, after_copied_bytes: Option<u64>) -> Self {
        self.demote_after_copied_bytes = after_copied_bytes;
        self
    }

    /// Whether this policy ever stops asking for zero-copy on a socket.
    pub fn demotes(&self) -> bool {
        self.demote_after_copied.is_some() || self.demote_after_copied_bytes.is_some()
    }

    /// Decides one send of `len` bytes starting at address `addr`.
    pub fn decide(&self, len: usize, addr: usize, page: usize, demoted: bool) -> TxDecision {
        if demoted {
            TxDecision::Copy(FallbackReason::DemotedCopied)
        } else if len < self.min_zerocopy_bytes {
            TxDecision::Copy(FallbackReason::TooSmall)
        } else if self.require_page_aligned && !addr.is_multiple_of(page) {
            TxDecision::Copy(FallbackReason::Unaligned)
        } else {
            TxDecision::ZeroCopy
        }
    }
}

/// Tracks consecutive COPIED notifications of one socket, and the bytes they covered.
#[derive(Debug, Clone, Default)]
pub struct CopiedDemotion {
    streak: u32,
    streak_bytes: u64,
    demoted: bool,
}

impl CopiedDemotion {
    /// Feeds one notification; returns true exactly when this one demotes the socket.
    pub fn observe(&mut self, copied: bool, limit: Option<u32>) -> bool {
        if self.demoted {
            return false;
        }
        self.streak = if copied { self.streak + 1 } else { 0 };
        if limit.is_some_and(|l| self.streak >= l) {
            self.demoted = true;
            return true;
        }
        false
    }

    /// Feeds one notification that completed calls carrying `bytes`, against both of
    /// `policy`'s limits; returns true exactly when this one demotes the socket.
    pub fn observe_bytes(&mut self, copied: bool, bytes: u64, policy: &Policy) -> bool {
        if self.demoted {
            return false;
        }
        self.streak_bytes = if copied {
            self.streak_bytes.saturating_add(bytes)
        } else {
            0
        };
        if self.observe(copied, policy.demote_after_copied) {
            return true;
        }
        if policy
            .demote_after_copied_bytes
            .is_some_and(|l| self.streak_bytes >= l)
        {
            self.demoted = true;
            return true;
        }
        false
    }

    /// Whether the socket has stopped asking for zero-copy.
    pub fn is_demoted(&self) -> bool {
        self.demoted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_alignment_and_demotion_decide() {
        let p = Policy::default().with_page_aligned(true);
        assert_eq!(
            p.decide(100, 0, 4096, false),
            TxDecision::Copy(FallbackReason::TooSmall)
        );
        assert_eq!(
            p.decide(1 << 20, 1, 4096, false),
            TxDecision::Copy(FallbackReason::Unaligned)
        );
        assert_eq!(p.decide(1 << 20, 8192, 4096, false), TxDecision::ZeroCopy);
        assert_eq!(
            p.decide(1 << 20, 8192, 4096, true),
            TxDecision::Copy(FallbackReason::DemotedCopied)
        );
        assert_eq!(
            Policy::always().decide(1, 3, 4096, false),
            TxDecision::ZeroCopy
        );
    }

    #[test]
    fn demotion_needs_a_consecutive_streak() {
        let mut d = CopiedDemotion::default();
        assert!(!d.observe(true, Some(3)));
        assert!(!d.observe(true, Some(3)));
        assert!(!d.observe(false, Some(3)));
        assert!(!d.observe(true, Some(3)));
        assert!(!d.observe(true, Some(3)));
        assert!(d.observe(true, Some(3)));
        assert!(d.is_demoted());
        assert!(!d.observe(true, Some(3)), "demotes once");
        let mut never = CopiedDemotion::default();
        for _ in 0..1000 {
            assert!(!never.observe(true, None));
        }
    }

    #[test]
    fn merged_notifications_demote_by_the_bytes_they_cover() {
        // Two notifications of 10 MiB each: far under 64 notifications, over 16 MiB.
        let p = Policy::default();
        let mut d = CopiedDemotion::default();
        assert!(!d.observe_bytes(true, 10 << 20, &p));
        assert!(d.observe_bytes(true, 10 << 20, &p));
        assert!(d.is_demoted());
        // A notification that was not copied breaks the byte streak too.
        let mut d = CopiedDemotion::default();
        assert!(!d.observe_bytes(true, 10 << 20, &p));
        assert!(!d.observe_bytes(false, 1 << 20, &p));
        assert!(!d.observe_bytes(true, 10 << 20, &p));
        assert!(!d.is_demoted());
        // The notification limit still applies on its own (small merged ranges).
        let p = Policy::default().with_demotion(Some(3));
        let mut d = CopiedDemotion::default();
        assert!(!d.observe_bytes(true, 1, &p));
        assert!(!d.observe_bytes(true, 1, &p));
        assert!(d.observe_bytes(true, 1, &p));
        // `with_demotion(None)` and `always()` never demote, whatever the bytes.
        for p in [Policy::default().with_demotion(None), Policy::always()] {
            assert!(!p.demotes());
            let mut d = CopiedDemotion::default();
            assert!(!d.observe_bytes(true, u64::MAX, &p));
            assert!(!d.observe_bytes(true, u64::MAX, &p));
        }
        assert!(Policy::default().demotes());
    }
}

/// The `TCP_MAXSEG` that makes every segment's payload a whole number of pages on a link of
/// `mtu` bytes, so `TCP_ZEROCOPY_RECEIVE` can map every page (docs/measurements/kernel-findings.md §2: 4096·k + 12 with
/// timestamps maps 100%). `None` when not even one page fits (MTU 1500): then the default
/// MSS is better, since veth forwards GSO skbs whole and ~94% still maps.
///
/// The kernel refuses `TCP_MAXSEG` above `MAX_TCP_WINDOW` (32767) with `EINVAL`, so on
/// loopback (MTU 65536) the answer is 7 pages + options, not 15.
pub fn page_multiple_mss(mtu: u32, ipv6: bool, timestamps: bool, page: u32) -> Option<u32> {
    const MAX_TCP_MAXSEG: u32 = 32767;
    let headers = if ipv6 { 60 } else { 40 };
    let opts = if timestamps { 12 } else { 0 };
    let room = mtu.checked_sub(headers + opts)?.min(MAX_TCP_MAXSEG - opts);
    let k = room / page;
    (k > 0).then(|| k * page + opts)
}

#[cfg(test)]
mod mss_tests {
    use super::page_multiple_mss;

    #[test]
    fn mss_is_a_page_multiple_plus_options() {
        assert_eq!(
            page_multiple_mss(65536, false, true, 4096),
            Some(7 * 4096 + 12)
        );
        assert_eq!(page_multiple_mss(9000, false, true, 4096), Some(8204));
        assert_eq!(page_multiple_mss(9000, false, false, 4096), Some(8192));
        assert_eq!(page_multiple_mss(4148, false, true, 4096), Some(4108));
        assert_eq!(page_multiple_mss(1500, false, true, 4096), None);
        assert_eq!(page_multiple_mss(20, true, true, 4096), None);
    }
}
