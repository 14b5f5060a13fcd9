//! Counters of one [`super::LmSocket`], both directions: messages, fragments, the admission
//! exchange, every loss by reason, and the data path each message took. Byte-level fallback
//! counters (`xsk_copy_mode`, `xsk_unavailable`) go to zcnet's [`zcnet::Stats`] beside
//! these, as for every other path.
//!
//! Plain numbers: a socket is single-threaded (everything happens inside its `&mut self`
//! calls), so its counters need no atomics, and [`super::LmSocket::stats`] lends them.

use super::LossReason;

/// One [`crate::LmSocket`]'s message counters, both directions.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct LmStats {
    /// Messages whose every fragment was handed to the kernel, and `ENDME` sent.
    pub messages_sent: u64,
    /// Payload bytes of those messages.
    pub bytes_sent: u64,
    /// DATA frames sent.
    pub fragments_sent: u64,
    /// PAD frames sent (one per FILL chunk an earlier lost message left behind).
    pub pads_sent: u64,
    /// Of the messages sent, those that went out through the XSK TX ring.
    pub sent_xsk: u64,
    /// Of the messages sent, those that went through the kernel's UDP socket (fallback).
    pub sent_kernel: u64,
    /// `LM_REQ`s sent, retries included.
    pub requests_sent: u64,
    /// `LM_ACQ_REJ` answers received because the receiver was busy with another sender.
    pub rejected_busy: u64,
    /// `LM_ACQ_REJ` answers for a message the receiver cannot take (too long, bad geometry).
    pub rejected_refused: u64,
    /// `LM_REQ`s re-sent because no answer came in time.
    pub request_retries: u64,
    /// `sendto` kicks of the TX ring.
    pub tx_kicks: u64,
    /// Messages delivered whole.
    pub messages_received: u64,
    /// Payload bytes of those messages.
    pub bytes_received: u64,
    /// Of those, messages assembled in place in the UMEM (driver-level defragmentation).
    pub received_in_place: u64,
    /// Of those, messages assembled from the kernel's UDP socket (fallback, one copy).
    pub received_kernel: u64,
    /// DATA frames placed by the XSK.
    pub fragments_placed: u64,
    /// PAD frames placed by the XSK.
    pub pads_placed: u64,
    /// Senders admitted (`LM_ACQ_OK` for a new message).
    pub admitted: u64,
    /// `LM_ACQ_REJ` sent because another sender's message was being assembled.
    pub refused_busy: u64,
    /// `LM_ACQ_REJ` sent for a message too long or with fragments our frames cannot hold.
    pub refused_geometry: u64,
    /// Duplicate `LM_REQ`s answered again (the sender retried before our answer arrived).
    pub duplicate_requests: u64,
    /// Messages reported lost, all reasons.
    pub messages_lost: u64,
    /// Lost: not every fragment arrived within the assembly timeout.
    pub lost_timeout: u64,
    /// Lost: the sender said `ENDME` and the XDP program had dropped fragments of it
    /// (out of order, or fault injection).
    pub lost_dropped: u64,
    /// Lost: a frame landed where another fragment belonged (a frame lost after the XDP
    /// program let it through, e.g. a full RX ring).
    pub lost_misplaced: u64,
    /// Control datagrams that were not LM, not for us, or out of place.
    pub control_ignored: u64,
    /// Kernel-path DATA datagrams from senders not admitted, or not matching the admission.
    pub foreign_dropped: u64,
}

impl LmStats {
    /// Counts a lost message, in its reason's counter and in `messages_lost`.
    pub(crate) fn lost(&mut self, reason: LossReason) {
        self.messages_lost += 1;
        *match reason {
            LossReason::Timeout => &mut self.lost_timeout,
            LossReason::Dropped => &mut self.lost_dropped,
            LossReason::Misplaced => &mut self.lost_misplaced,
        } += 1;
    }
}
