//! Solaris's threshold: write-protect only when copy-on-write faults will be rare. Pure code.
//!
//! Chu's Solaris zero-copy (Chu, "Zero-Copy TCP in Solaris", §3.2.4 and §6.4) did not enable page remapping + COW
//! "unless the total size of working write buffers exceeds certain threshold": an
//! application that cycles through more buffer bytes than the transport can hold
//! (socket send buffer + window, 128 KB there) blocks in `write` before it can touch a busy
//! buffer, so it never faults; one that rewrites a single 8 KB buffer faults on every send,
//! and lowering the threshold to 8 KB nearly halved FTP throughput.
//!
//! We cannot see the application's buffers, only where its sends start, so the working set
//! is measured as the *reuse distance*: how many bytes the sender sent between two sends
//! from the same address. A ring of N buffers of size B shows N·B; one reused buffer shows
//! its own size. Reuse distances are smoothed (one odd send does not flip the decision), and
//! an address never seen before counts as an unbounded working set.

use std::collections::HashMap;

/// When [`crate::Sender::send_slice`] on the `cow` path may write-protect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum WorkingSetRule {
    /// Protect whatever is eligible (for tests that want faults, and for measuring them).
    Off,
    /// Protect when the working set is at least the socket's send buffer (`SO_SNDBUF` as the
    /// kernel reports it, read every `SNDBUF_REFRESH` sends, since TCP autotunes it): the
    /// bytes the kernel can hold, Solaris's "send buffer plus window".
    #[default]
    Auto,
    /// Protect when the working set is at least this many bytes.
    AtLeast(usize),
}

/// Sends between reads of `SO_SNDBUF` under [`WorkingSetRule::Auto`].
pub(crate) const SNDBUF_REFRESH: u32 = 32;

/// Send addresses remembered; beyond this the table starts over (a working set that large
/// is far above any threshold).
const REMEMBERED: usize = 4096;

/// The reuse-distance estimate of one sender.
#[derive(Debug, Default)]
pub(crate) struct WorkingSet {
    last_seen: HashMap<usize, u64>,
    /// Smoothed reuse distance in bytes; `None` until some address was sent twice.
    estimate: Option<u64>,
}

impl WorkingSet {
    /// Records a send of the page-aligned span starting at `addr` when `stream_pos` bytes
    /// had been sent before it; returns the reuse distance if `addr` was sent before.
    pub(crate) fn observe(&mut self, addr: usize, stream_pos: u64) -> Option<u64> {
        if self.last_seen.len() >= REMEMBERED && !self.last_seen.contains_key(&addr) {
            self.last_seen.clear();
        }
        let prev = self.last_seen.insert(addr, stream_pos)?;
        let d = stream_pos.saturating_sub(prev);
        // EWMA with weight 1/4: a ring shows the same distance every time; a single reuse in
        // a long stream of fresh buffers moves the estimate only partly.
        self.estimate = Some(match self.estimate {
            None => d,
            Some(e) => e - e / 4 + d / 4,
        });
        Some(d)
    }

    /// The working set in bytes (`u64::MAX` while no address has been reused).
    pub(crate) fn estimate(&self) -> u64 {
        self.estimate.unwrap_or(u64::MAX)
    }

    /// Whether to protect under `rule`, given the socket's send buffer size.
    pub(crate) fn allows(&self, rule: WorkingSetRule, sndbuf: usize) -> bool {
        match rule {
            WorkingSetRule::Off => true,
            WorkingSetRule::Auto => self.estimate() >= sndbuf as u64,
            WorkingSetRule::AtLeast(n) => self.estimate() >= n as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_shows_its_size_and_a_single_buffer_its_own() {
        let mut ring = WorkingSet::default();
        let mut pos = 0u64;
        for i in 0..40usize {
            ring.observe(0x10_0000 + (i % 9) * 16384, pos);
            pos += 16384;
        }
        assert_eq!(ring.estimate(), 9 * 16384);
        assert!(ring.allows(WorkingSetRule::AtLeast(128 * 1024), 0));
        assert!(!ring.allows(WorkingSetRule::AtLeast(256 * 1024), 0));

        let mut one = WorkingSet::default();
        for i in 0..10u64 {
            one.observe(0x20_0000, i * 8192);
        }
        assert_eq!(one.estimate(), 8192);
        assert!(!one.allows(WorkingSetRule::Auto, 64 * 1024));
        assert!(one.allows(WorkingSetRule::Off, 64 * 1024));
    }

    #[test]
    fn fresh_addresses_are_an_unbounded_working_set() {
        let mut w = WorkingSet::default();
        for i in 0..100usize {
            assert_eq!(w.observe(i * 4096, i as u64 * 4096), None);
        }
        assert!(w.allows(WorkingSetRule::Auto, usize::MAX));
    }

    #[test]
    fn smoothing_needs_repeated_evidence() {
        let mut w = WorkingSet::default();
        w.observe(1, 0);
        w.observe(1, 1 << 20); // 1 MiB ring
        for k in 2..4u64 {
            w.observe(2, k << 20);
        }
        // One short reuse (1 MiB → 1 MiB) keeps it large; a run of tiny ones brings it down.
        assert!(w.estimate() >= 1 << 19);
        let mut pos = 4u64 << 20;
        for _ in 0..30 {
            w.observe(3, pos);
            pos += 4096;
        }
        assert!(w.estimate() < 16384, "{}", w.estimate());
    }
}
