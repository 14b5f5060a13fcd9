//! How much memory one test's buffers hold, and one cap over every test a server runs at
//! once (`zcnet bench -s --max-memory`).
//!
//! A server that runs many tests at once (iperf3's runs one) must bound them together:
//! `-l` is accepted up to 512 MiB and `-P` up to 128, and each sending stream keeps a ring
//! of `-l` blocks in rotation, so one client asking `-R -P 2 -l 128M` would otherwise take
//! the server to 2 GiB resident. The model counts what the data threads hold:
//!
//! * a sending stream: `ring` blocks of `-l` (the pool a loaning path rotates through; the
//!   `cow` path keeps one pool block and one application block instead), plus
//!   [`STREAM_OVERHEAD`];
//! * a receiving stream: one block of `-l` (the receive buffer), plus [`STREAM_OVERHEAD`].
//!
//! The ring a sender would like covers a 16 MiB window ([`desired_ring`], as the bench's
//! default ring); a test may take at most half of what is free (or its minimum, if that is
//! more), so the first of many clients cannot take the whole budget and turn the rest away;
//! within that share the ring is lowered as needed, down to one block — a loaning path then
//! waits for its own completions, which costs speed, not correctness.
//! A test whose one-block minimum exceeds what is free now is turned away as iperf3's
//! server turns a second client away (`ACCESS_DENIED`, "busy, try again later"); one whose
//! minimum exceeds the whole cap can never run and is refused with iperf3's own error for
//! the number that is too large (`-P`, or `-l`).

/// The default cap over all tests at once: 1 GiB, which a laptop survives.
pub const DEFAULT_MAX_MEMORY: u64 = 1 << 30;

/// What a stream holds besides its blocks (the receive path's mapping or ring, socket
/// bookkeeping): counted so that many tiny-`-l` streams are bounded too.
pub const STREAM_OVERHEAD: u64 = 1 << 20;

/// Bytes a sending stream's ring would cover (Solaris §3.2.4's rule: sndbuf + window).
pub const WINDOW: u64 = 16 << 20;

/// The most blocks a sending stream rotates through.
pub const MAX_RING: u64 = 1024;

/// The ring a sending stream would like at block size `len`: 16 MiB of blocks, 8 to 1024.
pub fn desired_ring(len: u64) -> u32 {
    (WINDOW / len.max(1)).clamp(8, MAX_RING) as u32
}

/// What a test's data threads will hold, before they start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    /// Streams this end sends on.
    pub senders: u32,
    /// Streams this end receives on.
    pub receivers: u32,
    /// `-l`.
    pub len: u64,
    /// The sending path keeps one pool block and one application block (`cow`), whatever
    /// the ring.
    pub fixed_two_blocks: bool,
}

/// The verdict on a test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Run it: each sending stream rotates `ring` blocks; `bytes` are reserved until the
    /// test ends.
    Granted {
        /// Blocks per sending stream.
        ring: u32,
        /// Bytes taken from the budget.
        bytes: u64,
    },
    /// Not now: tests running hold too much; it would fit on an idle server.
    Busy,
    /// Never: even one block per stream is over the whole cap.
    NeverFits {
        /// One stream of this `-l` would fit: fewer streams (`-P`) would run; otherwise the
        /// block (`-l`) itself is too large.
        fewer_streams_would: bool,
    },
}

impl Need {
    fn blocks(&self, ring: u64) -> u64 {
        if self.fixed_two_blocks {
            2
        } else {
            ring
        }
    }

    /// Bytes the test holds with `ring` blocks per sending stream (saturating: a garbled
    /// request must not wrap around into a small number).
    pub fn bytes(&self, ring: u64) -> u64 {
        let per_sender = self
            .len
            .saturating_mul(self.blocks(ring))
            .saturating_add(STREAM_OVERHEAD);
        let per_receiver = self.len.saturating_add(STREAM_OVERHEAD);
        per_sender
            .saturating_mul(u64::from(self.senders))
            .saturating_add(per_receiver.saturating_mul(u64::from(self.receivers)))
    }

    /// The least the test can run with: one block per sending stream.
    pub fn minimum(&self) -> u64 {
        self.bytes(1)
    }
}

/// The memory of every test running, against one cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    cap: u64,
    used: u64,
}

impl Budget {
    /// An empty budget of `cap` bytes.
    pub fn new(cap: u64) -> Budget {
        Budget { cap, used: 0 }
    }

    /// The cap.
    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// Bytes reserved by the tests running.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Decides on a test and, when granted, reserves its bytes (give them back with
    /// [`Budget::release`] when it ends): the desired ring if it fits in the test's share
    /// (half of what is free, or its minimum if that is more), else the largest ring that
    /// does, else busy or never.
    pub fn admit(&mut self, need: &Need) -> Admit {
        if need.minimum() > self.cap {
            let one = Need {
                senders: u32::from(need.senders > 0),
                receivers: u32::from(need.senders == 0),
                ..*need
            };
            return Admit::NeverFits {
                fewer_streams_would: one.minimum() <= self.cap,
            };
        }
        let free = self.cap - self.used;
        if need.minimum() > free {
            return Admit::Busy;
        }
        let share = (free / 2).max(need.minimum());
        let desired = u64::from(desired_ring(need.len));
        let ring = if need.bytes(desired) <= share || need.senders == 0 || need.fixed_two_blocks {
            desired
        } else {
            // bytes(r) = base + senders·len·r, so the largest r that fits is
            // (share − base) / (senders·len); bytes(1) ≤ share makes it at least 1.
            let base = need.bytes(0);
            let per = need.len.max(1).saturating_mul(u64::from(need.senders));
            ((share - base) / per).clamp(1, desired)
        };
        let bytes = need.bytes(ring);
        self.used += bytes;
        Admit::Granted {
            ring: ring as u32,
            bytes,
        }
    }

    /// Gives back what a granted test reserved.
    pub fn release(&mut self, bytes: u64) {
        self.used = self.used.saturating_sub(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn need(senders: u32, receivers: u32, len: u64) -> Need {
        Need {
            senders,
            receivers,
            len,
            fixed_two_blocks: false,
        }
    }

    #[test]
    fn a_default_test_gets_its_full_ring() {
        let mut b = Budget::new(DEFAULT_MAX_MEMORY);
        let n = need(1, 0, 128 << 10);
        assert_eq!(desired_ring(128 << 10), 128);
        match b.admit(&n) {
            Admit::Granted { ring, bytes } => {
                assert_eq!(ring, 128);
                assert_eq!(bytes, 16 * MIB + STREAM_OVERHEAD);
                assert_eq!(b.used(), bytes);
                b.release(bytes);
                assert_eq!(b.used(), 0);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn what_the_issue_asked_for_never_fits_and_says_which_number() {
        // -R -P 128 -l 512M: 128 senders of at least one 512 MiB block.
        let mut b = Budget::new(DEFAULT_MAX_MEMORY);
        assert_eq!(
            b.admit(&need(128, 0, 512 * MIB)),
            Admit::NeverFits {
                fewer_streams_would: true
            }
        );
        // A 2 GiB block alone is over a 1 GiB cap: -l is what is too large.
        assert_eq!(
            b.admit(&need(1, 0, 2048 * MIB)),
            Admit::NeverFits {
                fewer_streams_would: false
            }
        );
        assert_eq!(b.used(), 0, "nothing reserved for a refused test");
    }

    #[test]
    fn rings_shrink_to_a_share_then_tests_are_busy_then_room_comes_back() {
        let mut b = Budget::new(64 * MIB);
        let n = need(2, 0, 8 * MIB);
        // -R -P 2 -l 8M would like 8 blocks a stream (2 × 65 MiB); its minimum is 2 × 9 MiB.
        assert_eq!(n.minimum(), 18 * MIB);
        // Half of the 64 MiB free is its share: one block a stream fits, two do not.
        let grant = Admit::Granted {
            ring: 1,
            bytes: 18 * MIB,
        };
        assert_eq!(b.admit(&n), grant);
        // 46 MiB free: a share of 23 MiB, one block a stream again.
        assert_eq!(b.admit(&n), grant);
        // 28 MiB free: half is under the minimum, which it gets.
        assert_eq!(b.admit(&n), grant);
        // 10 MiB free: busy, not never.
        assert_eq!(b.admit(&n), Admit::Busy);
        assert_eq!(b.used(), 54 * MIB);
        // A receiving-only test of one small stream still fits beside them.
        assert!(matches!(
            b.admit(&need(0, 1, 128 << 10)),
            Admit::Granted { .. }
        ));
        assert!(b.used() <= b.cap());
        for _ in 0..3 {
            b.release(18 * MIB);
        }
        b.release(128 * 1024 + STREAM_OVERHEAD);
        assert_eq!(b.used(), 0);
        assert_eq!(b.admit(&n), grant);
    }

    #[test]
    fn the_first_of_many_clients_does_not_take_the_whole_budget() {
        // 32 clients asking -R -P 8 -l 16M under the default 1 GiB: each would like
        // 8 × (8 × 16 + 1) MiB; shares of half what is free let four run, not one.
        let mut b = Budget::new(DEFAULT_MAX_MEMORY);
        let n = need(8, 0, 16 * MIB);
        let granted = (0..32)
            .filter(|_| matches!(b.admit(&n), Admit::Granted { .. }))
            .count();
        assert_eq!(granted, 4);
        assert!(b.used() <= b.cap());
    }

    #[test]
    fn garbled_sizes_saturate_instead_of_wrapping() {
        let n = need(u32::MAX, u32::MAX, u64::MAX);
        assert_eq!(n.minimum(), u64::MAX);
        assert!(matches!(
            Budget::new(DEFAULT_MAX_MEMORY).admit(&n),
            Admit::NeverFits { .. }
        ));
    }

    #[test]
    fn cow_senders_hold_two_blocks_whatever_the_ring() {
        let n = Need {
            fixed_two_blocks: true,
            ..need(1, 0, 4 * MIB)
        };
        assert_eq!(n.bytes(1), n.bytes(100));
        assert_eq!(n.minimum(), 8 * MIB + STREAM_OVERHEAD);
    }
}
