//! Counters of one [`super::LmSocket`], both directions: messages, fragments, the admission
//! exchange, every loss by reason, and the data path each message took. Byte-level fallback
//! counters (`xsk_copy_mode`, `xsk_unavailable`) go to the crate's [`crate::Stats`] beside
//! these, as for every other path.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::LossReason;

crate::counters::counter_set!(LmStats, LmStatsSnapshot, "Live LM counters (see the module docs)." {
    /// Messages whose every fragment was handed to the kernel, and `ENDME` sent.
    messages_sent,
    /// Payload bytes of those messages.
    bytes_sent,
    /// DATA frames sent.
    fragments_sent,
    /// PAD frames sent (one per FILL chunk an earlier lost message left behind).
    pads_sent,
    /// Of the messages sent, those that went out through the XSK TX ring.
    sent_xsk,
    /// Of the messages sent, those that went through the kernel's UDP socket (fallback).
    sent_kernel,
    /// `LM_REQ`s sent, retries included.
    requests_sent,
    /// `LM_ACQ_REJ` answers received because the receiver was busy with another sender.
    rejected_busy,
    /// `LM_ACQ_REJ` answers for a message the receiver cannot take (too long, bad geometry).
    rejected_refused,
    /// `LM_REQ`s re-sent because no answer came in time.
    request_retries,
    /// `sendto` kicks of the TX ring.
    tx_kicks,
    /// Messages delivered whole.
    messages_received,
    /// Payload bytes of those messages.
    bytes_received,
    /// Of those, messages assembled in place in the UMEM (driver-level defragmentation).
    received_in_place,
    /// Of those, messages assembled from the kernel's UDP socket (fallback, one copy).
    received_kernel,
    /// DATA frames placed by the XSK.
    fragments_placed,
    /// PAD frames placed by the XSK.
    pads_placed,
    /// Senders admitted (`LM_ACQ_OK` for a new message).
    admitted,
    /// `LM_ACQ_REJ` sent because another sender's message was being assembled.
    refused_busy,
    /// `LM_ACQ_REJ` sent for a message too long or with fragments our frames cannot hold.
    refused_geometry,
    /// Duplicate `LM_REQ`s answered again (the sender retried before our answer arrived).
    duplicate_requests,
    /// Messages reported lost, all reasons.
    messages_lost,
    /// Lost: not every fragment arrived within the assembly timeout.
    lost_timeout,
    /// Lost: the sender said `ENDME` and the XDP program had dropped fragments of it
    /// (out of order, or fault injection).
    lost_dropped,
    /// Lost: a frame landed where another fragment belonged (a frame lost after the XDP
    /// program let it through, e.g. a full RX ring).
    lost_misplaced,
    /// Control datagrams that were not LM, not for us, or out of place.
    control_ignored,
    /// Kernel-path DATA datagrams from senders not admitted, or not matching the admission.
    foreign_dropped,
});

impl LmStats {
    pub(crate) fn lost(&self, reason: LossReason) {
        self.messages_lost(1);
        match reason {
            LossReason::Timeout => self.lost_timeout(1),
            LossReason::Dropped => self.lost_dropped(1),
            LossReason::Misplaced => self.lost_misplaced(1),
        }
    }
}
