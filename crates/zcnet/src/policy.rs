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
//!
//! A demoted socket whose caller counts its sends ([`CopiedDemotion::count_send`]) asks again
//! after a back-off: a route that copied keeps copying (the copy is the kernel's local
//! delivery, not a passing state), so one short retry ([`Policy::retry_bytes`], a few
//! notifications) settles it, and the back-off doubles after each retry that comes back
//! COPIED — retrying stays a fraction of a percent of the bytes of a long transfer, while a
//! socket demoted by a passing burst (a packet tap cloning skbs) gets zero-copy back. And
//! where delivery is certainly local ([`delivery_is_local`]) the kernel always copies, so a
//! caller that knows the route can start demoted ([`CopiedDemotion::local`]) and never ask.

use crate::path::FallbackReason;
use std::net::IpAddr;

/// Per-operation decision rules for the zero-copy transmit path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Policy {
    /// Sends smaller than this are copied (16 KiB by default).
    pub min_zerocopy_bytes: usize,
    /// Copy sends whose start is not page-aligned.
    pub require_page_aligned: bool,
    /// Stop asking for zero-copy after this many consecutive COPIED notifications (64 by
    /// default); `None` keeps asking (needed, for example, to feed a mapping receiver on
    /// loopback).
    pub demote_after_copied: Option<u32>,
    /// Stop asking for zero-copy after this many consecutive bytes were reported COPIED
    /// (whichever of the two limits comes first); `None` counts notifications only.
    ///
    /// 4 MiB by default: what a COPIED demotion costs is this plus the bytes sent before the
    /// first notification is read — measured 2.9–4.7 MiB for a tokio stream across a veth
    /// pair and on loopback (docs/tokio.md) — so the default costs at most about twice the
    /// unavoidable, while a brief copied burst (a packet tap cloning a few skbs) does not
    /// demote a socket whose device takes the pages.
    pub demote_after_copied_bytes: Option<u64>,
    /// Bytes a demoted socket copies before it retries zero-copy (256 MiB by default; the
    /// back-off doubles after each retry that comes back COPIED, up to 64 GiB); `None` stays
    /// demoted for good. Only callers that count their sends ([`CopiedDemotion::count_send`]:
    /// zcnet-tokio's sockets, the `zerocopy` path) retry. With the defaults a retry is under
    /// 0.4 % of the bytes, and less after every doubling.
    pub retry_after_bytes: Option<u64>,
    /// Bytes one retry sends zero-copy before it copies again to wait for their
    /// notifications (a whole send goes, so at least one send). 256 KiB by default: four
    /// 64 KiB sends, a few notifications — a route that copied keeps copying, so a retry
    /// only has to see that it still does.
    pub retry_bytes: u64,
}

/// The default of [`Policy::demote_after_copied_bytes`] (why 4 MiB: there). It is a whole
/// send buffer of COPIED bytes in a row; `bench_tokio --modes first-copied` measures the lag.
pub(crate) const DEMOTE_AFTER_COPIED_BYTES: u64 = 4 << 20;
/// The default of [`Policy::retry_after_bytes`]: 256 MiB of copy before the first retry.
pub(crate) const RETRY_AFTER_BYTES: u64 = 256 << 20;
/// Cap on the retry back-off: 64 GiB.
pub(crate) const MAX_RETRY_AFTER_BYTES: u64 = 64 << 30;
/// The default of [`Policy::retry_bytes`]: four 64 KiB sends.
pub(crate) const RETRY_BYTES: u64 = 256 << 10;

impl Default for Policy {
    fn default() -> Self {
        Policy {
            min_zerocopy_bytes: 16 * 1024,
            require_page_aligned: false,
            demote_after_copied: Some(64),
            demote_after_copied_bytes: Some(DEMOTE_AFTER_COPIED_BYTES),
            retry_after_bytes: Some(RETRY_AFTER_BYTES),
            retry_bytes: RETRY_BYTES,
        }
    }
}

impl Policy {
    /// Always zero-copy when possible: threshold 1 byte, no alignment rule, no demotion.
    pub fn always() -> Self {
        Policy {
            min_zerocopy_bytes: 1,
            require_page_aligned: false,
            demote_after_copied: None,
            demote_after_copied_bytes: None,
            retry_after_bytes: None,
            retry_bytes: RETRY_BYTES,
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

    /// Sets the retry after a demotion: `after` bytes of copy first (`None`: demoted for
    /// good), then `window` bytes of zero-copy.
    pub fn with_retry(mut self, after: Option<u64>, window: u64) -> Self {
        self.retry_after_bytes = after;
        self.retry_bytes = window.max(1);
        self
    }

    /// Whether this policy ever stops asking for zero-copy on a socket.
    pub fn demotes(&self) -> bool {
        self.demote_after_copied.is_some() || self.demote_after_copied_bytes.is_some()
    }

    /// Why one send of `len` bytes starting at address `addr` (pages of `page` bytes; the
    /// socket `demoted` or not) must copy, or `None` when it may go zero-copy — as
    /// [`CopiedDemotion::refuses`] says for the socket alone.
    pub fn refuses(
        &self,
        len: usize,
        addr: usize,
        page: usize,
        demoted: bool,
    ) -> Option<FallbackReason> {
        if demoted {
            Some(FallbackReason::DemotedCopied)
        } else if len < self.min_zerocopy_bytes {
            Some(FallbackReason::TooSmall)
        } else if self.require_page_aligned && !addr.is_multiple_of(page) {
            Some(FallbackReason::Unaligned)
        } else {
            None
        }
    }
}

/// Whether a socket from `local` to `peer` is certainly delivered inside this host, where
/// the kernel copies every `MSG_ZEROCOPY` byte at delivery (`skb_orphan_frags_rx` →
/// `skb_copy_ubufs`, docs/measurements/kernel-findings.md §1; the kernel's msg_zerocopy.rst,
/// "Loopback": data is always copied): the peer is a loopback address (`::ffff:127.0.0.1`
/// too), the unspecified address (which connects to this host), or the socket's own
/// address — an address of the socket's own network namespace, whose route is the local
/// table's. An address of this host other than the socket's source (a socket bound to one
/// of its addresses and connected to another) is not recognised: it costs the COPIED
/// demotion's first streak (the bytes it takes to notice), as any route that copies does.
pub fn delivery_is_local(local: IpAddr, peer: IpAddr) -> bool {
    let (local, peer) = (local.to_canonical(), peer.to_canonical());
    peer.is_loopback() || peer.is_unspecified() || peer == local
}

/// What one notification or send changed in a [`CopiedDemotion`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DemotionChange {
    /// Nothing.
    None,
    /// The socket stopped asking for zero-copy.
    Demoted,
    /// A retry started: the next sends ask for zero-copy again.
    Retry,
    /// A retry's notifications were not COPIED: zero-copy is back.
    Promoted,
    /// A retry came back COPIED: demoted again, the back-off doubled.
    Redemoted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Phase {
    #[default]
    Asking,
    /// Delivery is local ([`delivery_is_local`]): copy for good.
    Local,
    /// Copy for `left` more bytes, then retry (never, without [`CopiedDemotion::sent`]).
    Demoted { left: u64 },
    /// Zero-copy for `zc_left` more bytes, then copy until notifications have covered the
    /// `sent` bytes the retry sent zero-copy; `copied` of them said COPIED so far.
    Retrying {
        zc_left: u64,
        sent: u64,
        copied: u64,
    },
}

/// Tracks consecutive COPIED notifications of one socket, and the bytes they covered; with
/// the socket's sends counted ([`CopiedDemotion::count_send`]), retries after a back-off.
#[derive(Debug, Clone, Default)]
pub struct CopiedDemotion {
    streak: u32,
    streak_bytes: u64,
    phase: Phase,
    /// The current retry back-off in bytes (0 until the first demotion).
    backoff: u64,
}

impl CopiedDemotion {
    /// Demoted from the start and for good: the socket's delivery is local
    /// ([`delivery_is_local`]), where every zero-copy byte would be copied anyway.
    pub fn local() -> Self {
        CopiedDemotion {
            phase: Phase::Local,
            ..Default::default()
        }
    }

    /// Feeds one notification; returns true exactly when this one demotes the socket.
    pub fn observe(&mut self, copied: bool, limit: Option<u32>) -> bool {
        if self.phase != Phase::Asking {
            return false;
        }
        self.streak = if copied { self.streak + 1 } else { 0 };
        if limit.is_some_and(|l| self.streak >= l) {
            self.phase = Phase::Demoted { left: u64::MAX };
            return true;
        }
        false
    }

    /// Feeds one notification that completed calls carrying `bytes`, against both of
    /// `policy`'s limits; returns true exactly when this one demotes the socket (a
    /// retry's re-demotion included).
    pub fn observe_bytes(&mut self, copied: bool, bytes: u64, policy: &Policy) -> bool {
        matches!(
            self.notified(copied, bytes, policy),
            DemotionChange::Demoted | DemotionChange::Redemoted
        )
    }

    /// [`CopiedDemotion::observe_bytes`], saying what changed.
    pub(crate) fn notified(&mut self, copied: bool, bytes: u64, policy: &Policy) -> DemotionChange {
        match self.phase {
            Phase::Local | Phase::Demoted { .. } => DemotionChange::None,
            Phase::Retrying {
                zc_left,
                sent,
                copied: seen,
            } => {
                if !copied {
                    self.phase = Phase::Asking;
                    (self.streak, self.streak_bytes) = (0, 0);
                    self.backoff = policy.retry_after_bytes.unwrap_or(0);
                    return DemotionChange::Promoted;
                }
                self.phase = Phase::Retrying {
                    zc_left,
                    sent,
                    copied: seen.saturating_add(bytes),
                };
                self.settle_retry()
            }
            Phase::Asking => {
                self.streak_bytes = if copied {
                    self.streak_bytes.saturating_add(bytes)
                } else {
                    0
                };
                let by_bytes = policy
                    .demote_after_copied_bytes
                    .is_some_and(|l| copied && self.streak_bytes >= l);
                if !self.observe(copied, policy.demote_after_copied) && !by_bytes {
                    return DemotionChange::None;
                }
                self.backoff = policy.retry_after_bytes.unwrap_or(u64::MAX);
                self.phase = Phase::Demoted { left: self.backoff };
                DemotionChange::Demoted
            }
        }
    }

    /// Counts a send of `bytes` (`zerocopy`: it went with `MSG_ZEROCOPY`; `idle`: no
    /// zero-copy call is still waiting for its notification): runs a demoted socket's
    /// back-off down, and a retry's zero-copy window. Returns
    /// [`DemotionChange::Retry`] when the back-off is over — only once the calls sent
    /// before the demotion are all notified, so their COPIED notifications are never
    /// taken for the retry's. (Outside the crate: [`CopiedDemotion::count_send`], which
    /// counts the change in the sender's stats.)
    pub(crate) fn sent(
        &mut self,
        bytes: u64,
        zerocopy: bool,
        idle: bool,
        policy: &Policy,
    ) -> DemotionChange {
        match &mut self.phase {
            Phase::Demoted { left } if *left != u64::MAX => {
                *left = left.saturating_sub(bytes);
                if *left > 0 || !idle {
                    return DemotionChange::None;
                }
                self.phase = Phase::Retrying {
                    zc_left: policy.retry_bytes.max(1),
                    sent: 0,
                    copied: 0,
                };
                DemotionChange::Retry
            }
            Phase::Retrying { zc_left, sent, .. } if zerocopy => {
                *zc_left = zc_left.saturating_sub(bytes);
                *sent = sent.saturating_add(bytes);
                // Its notifications may have been read before the send was counted.
                self.settle_retry()
            }
            _ => DemotionChange::None,
        }
    }

    /// A retry whose window is sent and whose every byte came back COPIED: demoted
    /// again, the back-off doubled.
    fn settle_retry(&mut self) -> DemotionChange {
        match self.phase {
            Phase::Retrying {
                zc_left: 0,
                sent,
                copied,
            } if copied >= sent => {
                self.backoff = self.backoff.saturating_mul(2).min(MAX_RETRY_AFTER_BYTES);
                self.phase = Phase::Demoted { left: self.backoff };
                DemotionChange::Redemoted
            }
            _ => DemotionChange::None,
        }
    }

    /// Why the next send may not ask for zero-copy, if it may not: demoted (or a retry
    /// waiting for its notifications), or local delivery.
    pub fn refuses(&self) -> Option<FallbackReason> {
        match self.phase {
            Phase::Asking => None,
            Phase::Retrying { zc_left, .. } if zc_left > 0 => None,
            Phase::Local => Some(FallbackReason::LocalDelivery),
            Phase::Demoted { .. } | Phase::Retrying { .. } => Some(FallbackReason::DemotedCopied),
        }
    }

    /// Whether the socket does not ask for zero-copy now.
    pub fn is_demoted(&self) -> bool {
        self.refuses().is_some()
    }

    /// Whether the sends must be counted ([`CopiedDemotion::count_send`]) for a retry to come:
    /// demoted with a back-off, or retrying.
    pub fn counts_sends(&self) -> bool {
        matches!(
            self.phase,
            Phase::Demoted { left } if left != u64::MAX
        ) || matches!(self.phase, Phase::Retrying { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_alignment_and_demotion_decide() {
        let p = Policy::default().with_page_aligned(true);
        assert_eq!(
            p.refuses(100, 0, 4096, false),
            Some(FallbackReason::TooSmall)
        );
        assert_eq!(
            p.refuses(1 << 20, 1, 4096, false),
            Some(FallbackReason::Unaligned)
        );
        assert_eq!(p.refuses(1 << 20, 8192, 4096, false), None);
        assert_eq!(
            p.refuses(1 << 20, 8192, 4096, true),
            Some(FallbackReason::DemotedCopied)
        );
        assert_eq!(Policy::always().refuses(1, 3, 4096, false), None);
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
        // Two notifications of 5/8 of the limit each: far under 64 notifications, over
        // the byte limit together.
        let p = Policy::default();
        let part = DEMOTE_AFTER_COPIED_BYTES * 5 / 8;
        let mut d = CopiedDemotion::default();
        assert!(!d.observe_bytes(true, part, &p));
        assert!(d.observe_bytes(true, part, &p));
        assert!(d.is_demoted());
        // A notification that was not copied breaks the byte streak too.
        let mut d = CopiedDemotion::default();
        assert!(!d.observe_bytes(true, part, &p));
        assert!(!d.observe_bytes(false, 1 << 20, &p));
        assert!(!d.observe_bytes(true, part, &p));
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

    #[test]
    fn local_delivery_is_loopback_unspecified_or_the_sockets_own_address() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let local = |l, p| delivery_is_local(ip(l), ip(p));
        assert!(local("127.0.0.1", "127.0.0.1"));
        assert!(local("127.0.0.1", "127.3.2.1"), "all of 127/8");
        assert!(local("::1", "::1"));
        assert!(local("::ffff:127.0.0.1", "::ffff:127.0.0.1"), "v4-mapped");
        assert!(
            local("10.1.2.3", "0.0.0.0"),
            "the unspecified address is this host"
        );
        assert!(local("10.1.2.3", "10.1.2.3"), "the socket's own address");
        assert!(local("::ffff:10.1.2.3", "10.1.2.3"));
        assert!(!local("10.1.2.3", "10.1.2.4"), "a veth peer, a NIC's");
        assert!(!local("fd00::1", "fd00::2"));
        let mut d = CopiedDemotion::local();
        assert_eq!(d.refuses(), Some(FallbackReason::LocalDelivery));
        // For good: nothing retries it, no notification changes it.
        let p = Policy::default();
        for _ in 0..4 {
            assert_eq!(d.sent(u64::MAX, false, true, &p), DemotionChange::None);
            assert_eq!(d.notified(false, 1 << 20, &p), DemotionChange::None);
        }
        assert_eq!(d.refuses(), Some(FallbackReason::LocalDelivery));
        assert!(!d.counts_sends());
    }

    /// Drives a demotion over `ops` sends of `size` bytes on a route whose notifications
    /// say `copied`, each zero-copy send's notification read `lag` sends later; returns the
    /// bytes that went zero-copy and the changes seen.
    fn route(
        d: &mut CopiedDemotion,
        p: &Policy,
        copied: bool,
        size: u64,
        lag: usize,
        ops: usize,
    ) -> (u64, Vec<DemotionChange>) {
        let mut pending = std::collections::VecDeque::new();
        let (mut zc, mut changes) = (0, Vec::new());
        for _ in 0..ops {
            let go = d.refuses().is_none();
            if go {
                zc += size;
            }
            // A copy send has no notification, but takes its turn in the lag.
            pending.push_back(go.then_some(size));
            let idle = pending.iter().all(Option::is_none);
            changes.push(d.sent(size, go, idle, p));
            if pending.len() > lag {
                if let Some(b) = pending.pop_front().unwrap() {
                    changes.push(d.notified(copied, b, p));
                }
            }
        }
        changes.retain(|c| *c != DemotionChange::None);
        (zc, changes)
    }

    #[test]
    fn a_copying_route_is_retried_briefly_and_ever_more_rarely() {
        use DemotionChange::*;
        const MIB: u64 = 1 << 20;
        let p = Policy::default();
        let mut d = CopiedDemotion::default();
        // 1 MiB sends, notifications 4 sends late: 4 MiB COPIED demote (+ 4 in flight).
        let (zc, changes) = route(&mut d, &p, true, MIB, 4, 64);
        assert_eq!(changes, vec![Demoted]);
        assert_eq!(zc, DEMOTE_AFTER_COPIED_BYTES + 4 * MIB);
        // A long transfer: retries of one send after 256 MiB, 512 MiB, 1 GiB, ...
        let (zc, changes) = route(&mut d, &p, true, MIB, 4, 16 << 10);
        let retries = changes.iter().filter(|c| **c == Retry).count();
        assert_eq!(retries, 6, "{changes:?}");
        assert!(changes.iter().all(|c| matches!(c, Retry | Redemoted)));
        assert_eq!(zc, 6 * MIB, "one 1 MiB send per retry");
        assert!(zc * 1000 < 16 << 30, "retrying under 0.1 % of 16 GiB");
        // The back-off doubles up to its cap, and never past it.
        assert!(d.backoff <= MAX_RETRY_AFTER_BYTES);
    }

    #[test]
    fn a_retry_that_is_not_copied_promotes_and_a_late_notification_still_counts() {
        use DemotionChange::*;
        let p = Policy::default().with_retry(Some(1000), 300);
        let mut d = CopiedDemotion::default();
        assert!(d.observe_bytes(true, 16 << 20, &p));
        assert_eq!(d.refuses(), Some(FallbackReason::DemotedCopied));
        assert!(d.counts_sends());
        assert_eq!(d.sent(999, false, true, &p), None);
        assert_eq!(d.sent(1, false, true, &p), Retry);
        // The retry: 300 bytes zero-copy, then copy while its notifications are awaited.
        assert_eq!(d.refuses(), Option::None);
        assert_eq!(d.sent(200, true, true, &p), None);
        assert_eq!(d.refuses(), Option::None);
        // The first send's notification comes before the second send is counted.
        assert_eq!(d.notified(true, 200, &p), None);
        assert_eq!(d.sent(200, true, true, &p), None);
        assert_eq!(d.refuses(), Some(FallbackReason::DemotedCopied), "waiting");
        assert_eq!(d.notified(true, 200, &p), Redemoted);
        // Back-off doubled: 2000 bytes.
        assert_eq!(d.sent(1999, false, true, &p), None);
        assert_eq!(d.sent(1, false, true, &p), Retry);
        // Read before counted: settles in `sent`.
        assert_eq!(d.notified(true, 300, &p), None);
        assert_eq!(d.sent(300, true, true, &p), Redemoted);
        // Back-off 4000, then a retry that was not copied (the tap went away): promoted.
        assert_eq!(d.sent(4000, false, true, &p), Retry);
        assert_eq!(d.sent(300, true, true, &p), None);
        assert_eq!(d.notified(false, 300, &p), Promoted);
        assert!(!d.is_demoted() && !d.counts_sends());
        // Demoted again later, the back-off starts from the policy's again.
        assert!(d.observe_bytes(true, 16 << 20, &p));
        assert_eq!(d.sent(1000, false, true, &p), Retry);
        // Without retrying (the preload's notification count, or `None`): for good.
        let mut d = CopiedDemotion::default();
        assert!(d.observe(true, Some(1)));
        assert_eq!(d.sent(u64::MAX, false, true, &p), None);
        assert!(d.is_demoted() && !d.counts_sends());
        let q = Policy::default().with_retry(Option::None, 300);
        let mut d = CopiedDemotion::default();
        assert!(d.observe_bytes(true, 16 << 20, &q));
        assert_eq!(d.sent(u64::MAX, false, true, &q), None);
        assert!(d.is_demoted());
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
