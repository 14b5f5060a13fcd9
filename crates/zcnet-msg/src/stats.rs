//! Message-level counters of a [`crate::MsgSender`] or [`crate::MsgReceiver`]: messages and
//! datagrams, every loss by reason, every datagram that was not ours by kind, and the GSO/GRO
//! fallbacks. Byte-level transmit counters (copy vs `MSG_ZEROCOPY`, bytes the kernel copied
//! anyway, `ENOBUFS` fallbacks) stay in zcnet's [`zcnet::Stats`], which the sender keeps
//! beside these, so `tx_zerocopy_fraction()` means the same for messages as for streams.
//!
//! Relaxed atomics, as in [`zcnet::stats`]: the data path pays an uncontended add, and a
//! snapshot can be taken from another thread.

use super::wire::WireError;
use super::LossReason;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// `counter_set!(Live, Snapshot, "doc of Live" { /// doc \n field, ... })` defines `Live`
/// (`AtomicU64` per field, `Default`), `Snapshot` (`u64` per field, documented,
/// `Serialize`), `Live::snapshot()` and `Live::<field>(n)` adders (crate-visible): the
/// counters, their snapshot and their adders from one list, so a counter cannot be added to
/// one and forgotten in another.
macro_rules! counter_set {
    ($live:ident, $snap:ident, $doc:literal {
        $($(#[doc = $fdoc:literal])* $field:ident),* $(,)?
    }) => {
        #[doc = $doc]
        #[derive(Debug, Default)]
        pub struct $live {
            $($field: AtomicU64,)*
        }

        #[doc = concat!("A point-in-time copy of [`", stringify!($live), "`].")]
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
        #[non_exhaustive]
        pub struct $snap {
            $($(#[doc = $fdoc])* pub $field: u64,)*
        }

        impl $live {
            /// Reads every counter.
            pub fn snapshot(&self) -> $snap {
                $snap {
                    $($field: self.$field.load(Relaxed),)*
                }
            }
        }

        /// Adders, one per counter (an `add(field, n)` would lose the names).
        #[allow(missing_docs, dead_code)]
        impl $live {
            $(pub(crate) fn $field(&self, n: u64) { self.$field.fetch_add(n, Relaxed); })*
        }
    };
}

counter_set!(MsgStats, MsgStatsSnapshot, "Live message counters (see the module docs)." {
    /// Messages handed to the kernel completely (every datagram sent).
    messages_sent,
    /// Payload bytes of those messages (headers not counted).
    bytes_sent,
    /// Datagrams of those messages (one header each).
    datagrams_sent,
    /// `sendmsg` calls.
    send_calls,
    /// Of those, calls that carried several datagrams as one GSO packet (`UDP_SEGMENT`).
    gso_calls,
    /// Messages sent with `MSG_ZEROCOPY` (loaned [`super::MsgBuf`]s).
    zerocopy_messages,
    /// Messages sent by copying: `send(&[u8])`, or a loan the policy or a fallback copied.
    copied_messages,
    /// Times a GSO send was refused (`EINVAL`, `EMSGSIZE`, `EIO`: too many segments for
    /// this kernel, segment above the path MTU, no checksum offload) and the batch was
    /// halved; at one datagram per call GSO is switched off (`gso_disabled`).
    gso_fallbacks,
    /// 1 when GSO was switched off for this sender after refusals.
    gso_disabled,
    /// errno of the last GSO refusal.
    gso_errno,
    /// Messages delivered whole.
    messages_received,
    /// Payload bytes of those messages.
    bytes_received,
    /// Messages reported lost, all reasons (a gap of n ids counts n).
    messages_lost,
    /// Lost: fragments missing when the reassembly timeout ran out.
    lost_timeout,
    /// Lost: evicted from the reassembly table to stay within its limits.
    lost_evicted,
    /// Lost: a datagram was longer than the receive buffer (`MSG_TRUNC`).
    lost_truncated,
    /// Lost: fragments disagreed (total length, overlapping ranges) or one was impossible.
    lost_inconsistent,
    /// Lost: larger than the receiver's maximum message.
    lost_too_large,
    /// Lost: no fragment ever arrived, seen from later ids of the same sender.
    lost_gap,
    /// Datagrams read (after splitting GRO reads).
    datagrams_received,
    /// `recvmsg` calls that returned data.
    reads,
    /// Of those, reads that held several datagrams coalesced by `UDP_GRO`.
    gro_reads,
    /// 1 when `UDP_GRO` was refused and the receiver reads datagram by datagram.
    gro_refused,
    /// errno of that refusal.
    gro_errno,
    /// Not ours: shorter than a header.
    garbage_short,
    /// Not ours: bad magic, version or flags.
    garbage_magic,
    /// Not ours: header checksum mismatch.
    garbage_checksum,
    /// Not ours: fragment length disagrees with the datagram length.
    garbage_length,
    /// A checksummed header describing an impossible fragment (range outside its
    /// message): counted here and its message reported lost as inconsistent.
    garbage_range,
    /// Fragments that repeated bytes already received (network duplicates); dropped.
    fragments_duplicate,
    /// Fragments of messages already delivered or reported lost; dropped.
    fragments_stale,
    /// Reads longer than the receive buffer (`MSG_TRUNC`).
    truncated_reads,
    /// Senders (address + session) whose sequence state was evicted to stay within
    /// `max_senders`.
    senders_evicted,
    /// Marks sent (header-only datagrams, [`wire`](super::wire): how many ids the session
    /// has sent).
    marks_sent,
    /// Marks received.
    marks_received,
    /// Most messages in reassembly at once.
    reassembly_peak_messages,
    /// Most bytes reserved for reassembly at once.
    reassembly_peak_bytes,
});

impl MsgStats {
    /// Fresh zeroed counters.
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn lost(&self, reason: LossReason, n: u64) {
        self.messages_lost(n);
        match reason {
            LossReason::Timeout => self.lost_timeout(n),
            LossReason::Evicted => self.lost_evicted(n),
            LossReason::Truncated => self.lost_truncated(n),
            LossReason::Inconsistent => self.lost_inconsistent(n),
            LossReason::TooLarge => self.lost_too_large(n),
            LossReason::Gap => self.lost_gap(n),
        }
    }

    pub(crate) fn garbage(&self, e: WireError) {
        match e {
            WireError::Short => self.garbage_short(1),
            WireError::BadMagic | WireError::BadVersion | WireError::BadFlags => {
                self.garbage_magic(1)
            }
            WireError::BadChecksum => self.garbage_checksum(1),
            WireError::LengthMismatch => self.garbage_length(1),
        }
    }

    pub(crate) fn peak(&self, messages: usize, bytes: usize) {
        self.reassembly_peak_messages
            .fetch_max(messages as u64, Relaxed);
        self.reassembly_peak_bytes.fetch_max(bytes as u64, Relaxed);
    }

    pub(crate) fn set_gso_errno(&self, errno: i32) {
        self.gso_errno.store(errno.max(0) as u64, Relaxed);
    }

    pub(crate) fn set_gso_disabled(&self) {
        self.gso_disabled.store(1, Relaxed);
    }

    pub(crate) fn set_gro_refused(&self, errno: i32) {
        self.gro_refused.store(1, Relaxed);
        self.gro_errno.store(errno.max(0) as u64, Relaxed);
    }
}

impl MsgStatsSnapshot {
    /// Datagrams that were not ours, all kinds.
    pub fn garbage(&self) -> u64 {
        self.garbage_short
            + self.garbage_magic
            + self.garbage_checksum
            + self.garbage_length
            + self.garbage_range
    }

    /// Messages lost for `reason`.
    pub fn lost(&self, reason: LossReason) -> u64 {
        match reason {
            LossReason::Timeout => self.lost_timeout,
            LossReason::Evicted => self.lost_evicted,
            LossReason::Truncated => self.lost_truncated,
            LossReason::Inconsistent => self.lost_inconsistent,
            LossReason::TooLarge => self.lost_too_large,
            LossReason::Gap => self.lost_gap,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn losses_add_up_by_reason() {
        let s = MsgStats::new();
        s.lost(LossReason::Gap, 5);
        s.lost(LossReason::Timeout, 1);
        s.garbage(WireError::BadVersion);
        s.garbage_range(1);
        s.peak(3, 100);
        s.peak(2, 50);
        let snap = s.snapshot();
        assert_eq!(snap.messages_lost, 6);
        assert_eq!(snap.lost(LossReason::Gap), 5);
        assert_eq!(snap.garbage(), 2);
        assert_eq!(
            (snap.reassembly_peak_messages, snap.reassembly_peak_bytes),
            (3, 100)
        );
    }
}
