//! The fragment header every message datagram starts with, and the layout of a message cut
//! into datagrams. Pure code.
//!
//! ```text
//!  0      2    3    4          6          8            12           16                24          28
//!  +------+----+----+----------+----------+------------+------------+-----------------+-----------+
//!  |magic |ver |flg | checksum | frag len |  session   | total len  |   message id    | frag off  |
//!  |"zm"  | 1  | 0  | RFC 1071 |   u16    |    u32     |    u32     |      u64        |   u32     |
//!  +------+----+----+----------+----------+------------+------------+-----------------+-----------+
//! ```
//!
//! All fields big-endian. `frag len` is the payload after the header in this datagram (so a
//! header also says where its datagram must end: a GRO read cut at the wrong size, or a
//! truncated datagram, cannot pass for a good one); `frag off` is where that payload goes in
//! the message; `total len` is in every fragment, so whichever fragment arrives first can
//! size the message. `session` is a random number per sender: ids count from 0 within it, so
//! a restarted sender (same address, new session) starts a fresh sequence instead of being
//! taken for old duplicates. The checksum is the internet checksum of the 28 header bytes with
//! the field zero; UDP's own checksum already covers the datagram on the wire, this one keeps
//! a stranger's datagram that happens to start with the magic from being taken for ours.
//! Lengths and offsets are `u32`, so the format describes messages up to 4 GiB; the
//! configured maximum (`MsgConfig::max_message`) is what a receiver enforces.
//!
//! A sender's *mark* is a header-only datagram with flag `0x01` (the only flag of version 1;
//! total, offset and length 0) whose `message id` says how many messages the session has
//! sent, so a receiver reports a lost tail too (`MsgSender::send_mark`).
//!
//! Why fragment ourselves instead of sending one 1 MiB datagram: a UDP datagram is at most
//! 64 KiB, and above the MTU the kernel would IP-fragment it, losing the whole datagram to any
//! one lost fragment with no way to say which message it was. Application-level fragmentation
//! (Jin, Zhang, Tan, "Lightweight Messages", §3.1) makes every datagram self-describing, and GSO (`UDP_SEGMENT`) still lets
//! one system call hand the kernel up to 64 KiB of them.

use std::ops::Range;

/// Bytes of the header at the start of every datagram.
pub const HEADER_LEN: usize = 28;
/// First two bytes of every datagram: "zm".
pub(crate) const MAGIC: u16 = 0x7A6D;
/// Wire format version.
pub(crate) const VERSION: u8 = 1;
/// Flag of a sender's mark: a header-only datagram (no payload; total, offset and length 0)
/// whose `message id` field says how many messages the session has sent — every id below it
/// has been handed to the kernel ([`Mark`]). The only flag this version defines.
pub(crate) const FLAG_MARK: u8 = 0x01;

/// One fragment's header, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    /// The sender's random session number.
    pub session: u32,
    /// The message's id within the session (0, 1, 2, ... per sender).
    pub id: u64,
    /// The message's total length in bytes.
    pub total: u32,
    /// Where this fragment's payload goes in the message.
    pub offset: u32,
    /// Bytes of payload in this datagram after the header.
    pub len: u16,
}

/// Why a datagram is not a fragment of ours. Nothing in it can be trusted, not even a
/// message id, so it is counted and dropped, never reported as a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum WireError {
    /// Shorter than a header.
    #[error("datagram shorter than the {HEADER_LEN}-byte header")]
    Short,
    /// Does not start with the magic.
    #[error("bad magic")]
    BadMagic,
    /// Another wire format version.
    #[error("unknown version")]
    BadVersion,
    /// Flag bits this version does not define.
    #[error("unknown flags")]
    BadFlags,
    /// The header checksum does not match.
    #[error("bad header checksum")]
    BadChecksum,
    /// The header's fragment length disagrees with the datagram's length.
    #[error("fragment length disagrees with the datagram length")]
    LengthMismatch,
}

/// A header that decodes but describes an impossible fragment. Its id can be trusted (the
/// checksum held), so its message is reported lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum HeaderFault {
    /// `offset + len > total`, or an empty fragment of a non-empty message.
    #[error("fragment range outside the message")]
    BadRange,
    /// `total` is larger than the receiver's maximum message.
    #[error("message larger than the configured maximum")]
    TooLarge,
}

/// RFC 1071 internet checksum of a header. Fixed-size, so the 14 words are summed
/// without bounds checks or a loop: it runs once per datagram on both ends (45 times per
/// 64 KiB message), where a generic slice loop took 4-5 % of a zero-copy sender's CPU.
fn internet_checksum(h: &[u8; HEADER_LEN]) -> u16 {
    let mut sum: u32 = 0;
    for w in h.chunks_exact(2) {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    // 14 words of at most 0xFFFF: two folds always suffice.
    sum = (sum & 0xFFFF) + (sum >> 16);
    sum = (sum & 0xFFFF) + (sum >> 16);
    !(sum as u16)
}

impl Header {
    /// Writes the header into the first [`HEADER_LEN`] bytes of `out` (panics if shorter).
    pub fn encode_into(&self, out: &mut [u8]) {
        self.encode_flagged(out, 0);
    }

    fn encode_flagged(&self, out: &mut [u8], flags: u8) {
        let h: &mut [u8; HEADER_LEN] = (&mut out[..HEADER_LEN])
            .try_into()
            .expect("sliced to length");
        h[0..2].copy_from_slice(&MAGIC.to_be_bytes());
        h[2] = VERSION;
        h[3] = flags;
        h[4..6].copy_from_slice(&[0, 0]);
        h[6..8].copy_from_slice(&self.len.to_be_bytes());
        h[8..12].copy_from_slice(&self.session.to_be_bytes());
        h[12..16].copy_from_slice(&self.total.to_be_bytes());
        h[16..24].copy_from_slice(&self.id.to_be_bytes());
        h[24..28].copy_from_slice(&self.offset.to_be_bytes());
        let sum = internet_checksum(h);
        h[4..6].copy_from_slice(&sum.to_be_bytes());
    }

    /// The header as bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        self.encode_into(&mut b);
        b
    }

    /// Decodes the header at the start of `b` without checking that the datagram is as long
    /// as the header says (for a datagram known to be truncated). A mark is not a fragment:
    /// [`WireError::BadFlags`] here (a receiver's reassembly reads marks).
    pub fn decode_prefix(b: &[u8]) -> Result<Header, WireError> {
        Header::decode_flagged(b, false).map(|(_, h)| h)
    }

    /// The header and its flags (0, or [`FLAG_MARK`] where `mark` allows it).
    fn decode_flagged(b: &[u8], mark: bool) -> Result<(u8, Header), WireError> {
        let h: &[u8; HEADER_LEN] = b
            .get(..HEADER_LEN)
            .and_then(|h| h.try_into().ok())
            .ok_or(WireError::Short)?;
        if u16::from_be_bytes([h[0], h[1]]) != MAGIC {
            return Err(WireError::BadMagic);
        }
        if h[2] != VERSION {
            return Err(WireError::BadVersion);
        }
        let flags = h[3];
        if flags != 0 && !(mark && flags == FLAG_MARK) {
            return Err(WireError::BadFlags);
        }
        let mut zeroed = *h;
        zeroed[4] = 0;
        zeroed[5] = 0;
        if internet_checksum(&zeroed).to_be_bytes() != [h[4], h[5]] {
            return Err(WireError::BadChecksum);
        }
        let u32_at = |o: usize| u32::from_be_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
        Ok((
            flags,
            Header {
                len: u16::from_be_bytes([h[6], h[7]]),
                session: u32_at(8),
                total: u32_at(12),
                id: u64::from_be_bytes(h[16..24].try_into().expect("8 bytes")),
                offset: u32_at(24),
            },
        ))
    }

    /// Decodes a whole datagram: the header, and a payload exactly as long as it says.
    pub fn decode(datagram: &[u8]) -> Result<(Header, &[u8]), WireError> {
        let h = Header::decode_prefix(datagram)?;
        let payload = &datagram[HEADER_LEN..];
        if payload.len() != usize::from(h.len) {
            return Err(WireError::LengthMismatch);
        }
        Ok((h, payload))
    }

    /// Checks that the fragment fits its message and the message the receiver's maximum.
    pub fn check(&self, max_message: usize) -> Result<(), HeaderFault> {
        if self.total as usize > max_message {
            return Err(HeaderFault::TooLarge);
        }
        let end = u64::from(self.offset) + u64::from(self.len);
        if end > u64::from(self.total) || (self.len == 0 && (self.total != 0 || self.offset != 0)) {
            return Err(HeaderFault::BadRange);
        }
        Ok(())
    }

    /// The payload's range in the message.
    pub fn range(&self) -> Range<usize> {
        self.offset as usize..self.offset as usize + usize::from(self.len)
    }
}

/// A sender's mark: session `session` has sent every id below `sent`. A receiver reports
/// each of those ids that never arrives as lost ([`super::LossReason::Gap`]) once its
/// reorder window has passed — including the last ones, which no later message would
/// reveal. Idempotent: a mark may be sent any number of times (it is one datagram, and can
/// be lost like any other).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Mark {
    /// The sender's session.
    pub(crate) session: u32,
    /// How many messages the session has sent: ids `0..sent`.
    pub(crate) sent: u64,
}

impl Mark {
    /// The mark's datagram: a header with [`FLAG_MARK`] and nothing after it.
    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        let h = Header {
            session: self.session,
            id: self.sent,
            total: 0,
            offset: 0,
            len: 0,
        };
        h.encode_flagged(&mut b, FLAG_MARK);
        b
    }
}

/// One datagram of ours: a message's fragment, or a sender's mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Datagram<'a> {
    /// A fragment: its header and its payload.
    Fragment(Header, &'a [u8]),
    /// A mark.
    Mark(Mark),
}

/// Decodes a whole datagram: a fragment ([`Header::decode`]) or a mark (a header-only
/// datagram with [`FLAG_MARK`], every length field 0).
pub(crate) fn decode_datagram(datagram: &[u8]) -> Result<Datagram<'_>, WireError> {
    let (flags, h) = Header::decode_flagged(datagram, true)?;
    let payload = &datagram[HEADER_LEN..];
    if payload.len() != usize::from(h.len) {
        return Err(WireError::LengthMismatch);
    }
    if flags == FLAG_MARK {
        if h.len != 0 || h.total != 0 || h.offset != 0 {
            return Err(WireError::BadFlags);
        }
        return Ok(Datagram::Mark(Mark {
            session: h.session,
            sent: h.id,
        }));
    }
    Ok(Datagram::Fragment(h, payload))
}

/// How a message is cut into datagrams of (at most) `segment` bytes, header included: every
/// fragment but the last carries `segment - HEADER_LEN` payload bytes. The same layout
/// describes the message on the wire, where fragment `i` occupies bytes
/// `i * segment .. i * segment + HEADER_LEN + len_i` — header holes between payload blocks,
/// as in the Lightweight Messages send buffer (Jin, Zhang, Tan, "Lightweight Messages", Fig. 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    segment: usize,
}

/// A segment size the wire format cannot use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("segment size {0} is outside {min}..={max} bytes", min = HEADER_LEN + 1, max = u16::MAX)]
pub struct BadSegment(pub usize);

impl Layout {
    /// A layout of datagrams of `segment` bytes (header included).
    pub fn new(segment: usize) -> Result<Layout, BadSegment> {
        if segment <= HEADER_LEN || segment > usize::from(u16::MAX) {
            return Err(BadSegment(segment));
        }
        Ok(Layout { segment })
    }

    /// Datagram size, header included (the GSO segment size).
    #[inline]
    pub fn segment(&self) -> usize {
        self.segment
    }

    /// Payload bytes in a full datagram.
    #[inline]
    pub fn payload_per_datagram(&self) -> usize {
        self.segment - HEADER_LEN
    }

    /// Fragments of a message of `len` bytes (an empty message is one header-only datagram).
    #[inline]
    pub fn fragments(&self, len: usize) -> usize {
        len.div_ceil(self.payload_per_datagram()).max(1)
    }

    /// Bytes of a message of `len` bytes on the wire: payload plus one header per fragment.
    pub fn wire_len(&self, len: usize) -> usize {
        len + self.fragments(len) * HEADER_LEN
    }

    /// Fragment `i` of a message of `len` bytes: its payload's range in the message.
    #[inline]
    pub fn fragment(&self, len: usize, i: usize) -> Range<usize> {
        let p = self.payload_per_datagram();
        let start = (i * p).min(len);
        start..(start + p).min(len)
    }

    /// Fragment `i`'s range in the wire layout (header and payload).
    #[inline]
    pub fn wire_range(&self, len: usize, i: usize) -> Range<usize> {
        let start = i * self.segment;
        start..start + HEADER_LEN + self.fragment(len, i).len()
    }

    /// The fragments of a message of `len` bytes, grouped into batches of at most
    /// `per_batch` fragments (one GSO send each).
    pub fn batches(&self, len: usize, per_batch: usize) -> impl Iterator<Item = Range<usize>> {
        let n = self.fragments(len);
        let per = per_batch.max(1);
        (0..n.div_ceil(per)).map(move |b| b * per..((b + 1) * per).min(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header() -> Header {
        Header {
            session: 0xDEAD_BEEF,
            id: 0x0102_0304_0506_0708,
            total: 100_000,
            offset: 1448,
            len: 1448,
        }
    }

    #[test]
    fn layout_is_big_endian_at_fixed_offsets() {
        let b = header().encode();
        assert_eq!(&b[0..4], &[0x7A, 0x6D, 1, 0]);
        assert_eq!(&b[6..8], &1448u16.to_be_bytes());
        assert_eq!(&b[8..12], &[0xDE, 0xAD, 0xBE, 0xEF]);
        assert_eq!(&b[12..16], &100_000u32.to_be_bytes());
        assert_eq!(&b[16..24], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[24..28], &1448u32.to_be_bytes());
        // The checksum makes the header sum to 0xFFFF (RFC 1071).
        assert_eq!(internet_checksum(&b), 0);
    }

    #[test]
    fn every_kind_of_garbage_is_named() {
        let good = header().encode();
        let mut d = good.to_vec();
        d.extend(vec![0u8; 1448]);
        assert_eq!(Header::decode(&d).unwrap().0, header());
        assert_eq!(Header::decode(&d[..27]).unwrap_err(), WireError::Short);
        assert_eq!(Header::decode(&[]).unwrap_err(), WireError::Short);
        let mut bad = d.clone();
        bad[0] = b'x';
        assert_eq!(Header::decode(&bad).unwrap_err(), WireError::BadMagic);
        let mut bad = d.clone();
        bad[2] = 2;
        assert_eq!(Header::decode(&bad).unwrap_err(), WireError::BadVersion);
        let mut bad = d.clone();
        bad[3] = 1;
        assert_eq!(Header::decode(&bad).unwrap_err(), WireError::BadFlags);
        let mut bad = d.clone();
        bad[20] ^= 1;
        assert_eq!(Header::decode(&bad).unwrap_err(), WireError::BadChecksum);
        assert_eq!(
            Header::decode(&d[..d.len() - 1]).unwrap_err(),
            WireError::LengthMismatch
        );
        assert_eq!(Header::decode_prefix(&d[..40]).unwrap(), header());
    }

    #[test]
    fn a_mark_is_a_header_only_datagram_that_only_decode_datagram_reads() {
        let m = Mark {
            session: 7,
            sent: 10_000,
        };
        let b = m.encode();
        assert_eq!(b[3], FLAG_MARK);
        assert_eq!(internet_checksum(&b), 0);
        assert_eq!(decode_datagram(&b).unwrap(), Datagram::Mark(m));
        // Not a fragment: a receiver that knows no marks counts it as garbage.
        assert_eq!(Header::decode(&b).unwrap_err(), WireError::BadFlags);
        // A mark with a payload, or lengths, is not one.
        let mut long = b.to_vec();
        long.push(0);
        assert_eq!(
            decode_datagram(&long).unwrap_err(),
            WireError::LengthMismatch
        );
        let mut h = header();
        h.len = 0;
        let mut bad = [0u8; HEADER_LEN];
        h.encode_flagged(&mut bad, FLAG_MARK);
        assert_eq!(decode_datagram(&bad).unwrap_err(), WireError::BadFlags);
        // A fragment decodes as one.
        let mut d = header().encode().to_vec();
        d.extend(vec![0u8; 1448]);
        assert!(
            matches!(decode_datagram(&d), Ok(Datagram::Fragment(h, p)) if h == header() && p.len() == 1448)
        );
    }

    #[test]
    fn impossible_fragments_are_faults() {
        let h = header();
        assert_eq!(h.check(1 << 20), Ok(()));
        assert_eq!(h.check(99_999), Err(HeaderFault::TooLarge));
        let past_end = Header {
            offset: 99_000,
            ..h
        };
        assert_eq!(past_end.check(1 << 20), Err(HeaderFault::BadRange));
        let overflow = Header {
            offset: u32::MAX,
            total: u32::MAX,
            ..h
        };
        assert_eq!(overflow.check(usize::MAX), Err(HeaderFault::BadRange));
        let empty = Header { len: 0, ..h };
        assert_eq!(empty.check(1 << 20), Err(HeaderFault::BadRange));
        let empty_msg = Header {
            len: 0,
            total: 0,
            offset: 0,
            ..h
        };
        assert_eq!(empty_msg.check(1 << 20), Ok(()));
    }

    #[test]
    fn layout_for_a_1500_byte_mtu() {
        let l = Layout::new(1472).unwrap();
        assert_eq!(l.payload_per_datagram(), 1444);
        assert_eq!(l.fragments(0), 1);
        assert_eq!(l.fragments(1444), 1);
        assert_eq!(l.fragments(1445), 2);
        assert_eq!(l.wire_len(1445), 1445 + 56);
        assert_eq!(l.fragment(1445, 1), 1444..1445);
        assert_eq!(l.wire_range(1445, 1), 1472..1472 + 29);
        let b: Vec<_> = l.batches(1 << 20, 44).collect();
        assert_eq!(b.len(), (1usize << 20).div_ceil(1444).div_ceil(44));
        assert_eq!(b[0], 0..44);
        assert_eq!(b.last().unwrap().end, l.fragments(1 << 20));
        assert!(Layout::new(28).is_err());
        assert!(Layout::new(65536).is_err());
    }

    proptest! {
        #[test]
        fn round_trip(session in any::<u32>(), id in any::<u64>(), total in any::<u32>(),
                      offset in any::<u32>(), payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            let h = Header { session, id, total, offset, len: payload.len() as u16 };
            let mut d = h.encode().to_vec();
            d.extend_from_slice(&payload);
            let (back, p) = Header::decode(&d).unwrap();
            prop_assert_eq!(back, h);
            prop_assert_eq!(p, &payload[..]);
        }

        #[test]
        fn any_single_bit_flip_in_the_header_is_caught(bit in 0usize..HEADER_LEN * 8,
                                                      id in any::<u64>()) {
            let h = Header { session: 7, id, total: 5000, offset: 1000, len: 10 };
            let mut d = h.encode().to_vec();
            d.extend_from_slice(&[0; 10]);
            d[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(Header::decode(&d).is_err());
        }

        #[test]
        fn the_header_checksum_is_rfc_1071(h in any::<[u8; HEADER_LEN]>()) {
            // The plain definition: one's complement of the one's-complement sum of the
            // big-endian 16-bit words, folded until it fits.
            let mut sum: u64 = h.chunks(2).map(|w| u64::from(u16::from_be_bytes([w[0], w[1]]))).sum();
            while sum > 0xFFFF {
                sum = (sum & 0xFFFF) + (sum >> 16);
            }
            prop_assert_eq!(internet_checksum(&h), !(sum as u16));
        }

        #[test]
        fn garbage_never_panics(d in proptest::collection::vec(any::<u8>(), 0..100)) {
            if let Ok((h, p)) = Header::decode(&d) {
                prop_assert_eq!(p.len(), usize::from(h.len));
                let _ = h.check(1 << 20);
            }
        }

        #[test]
        fn fragments_tile_the_message(segment in 29usize..9000, len in 0usize..200_000) {
            let l = Layout::new(segment).unwrap();
            let n = l.fragments(len);
            let mut next = 0;
            let mut wire = 0;
            for i in 0..n {
                let r = l.fragment(len, i);
                prop_assert_eq!(r.start, next);
                prop_assert!(!r.is_empty() || len == 0);
                next = r.end;
                let w = l.wire_range(len, i);
                prop_assert!(w.len() <= segment);
                prop_assert_eq!(w.len(), HEADER_LEN + r.len());
                wire = w.end;
            }
            prop_assert_eq!(next, len);
            prop_assert_eq!(wire, l.wire_len(len));
        }
    }
}
