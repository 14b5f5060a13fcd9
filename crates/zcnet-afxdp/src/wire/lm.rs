//! The Lightweight Messages wire format: one 24-byte header for data and control, and the
//! arithmetic of application-level fragmentation (where each fragment's payload and header
//! hole lie on the sender, and where each fragment must land on the receiver).
//!
//! Every LM datagram's UDP payload starts with the same header, big-endian:
//!
//! ```text
//!  0  'L' 'M'  version(1)  kind
//!  4  token       admission token the receiver granted (0 in a request)
//!  8  msg_id      the sender's message number
//! 12  index       DATA: fragment number; REQ: payload bytes per fragment; ACQ_OK: PAD
//!                 frames to send first; ACQ_REJ: reason; ENDME: fragments sent
//! 16  count       fragments in the message
//! 20  total       message length in bytes
//! ```
//!
//! ACQ_OK carries the receiver's MAC address after the header, so the sender can address
//! Ethernet frames without a neighbour lookup. The XDP program (`bpf/lm.c`) reads `token`
//! and `index` at these offsets; change them together. Pure code, tested without sockets.

use std::ops::Range;

use super::udp::{ETH_HLEN, UDP_FRAME_HLEN};

/// LM header length.
pub const LM_HLEN: usize = 24;
/// Ethernet + IPv4 + UDP + LM: the hole in front of each fragment's payload.
pub(crate) const FRAME_HLEN: usize = UDP_FRAME_HLEN + LM_HLEN;
/// Bytes copy-mode AF_XDP leaves in front of a received frame (`XDP_PACKET_HEADROOM`).
pub(crate) const XDP_HEADROOM: u64 = 256;
const MAGIC: [u8; 2] = *b"LM";
const VERSION: u8 = 1;

/// What an LM datagram is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A fragment of a message (goes to the XSK).
    Data = 1,
    /// A frame that only consumes a FILL chunk left over from a lost message.
    Pad = 2,
    /// `LM_REQ`: may I send a message of `total` bytes in `count` fragments?
    Req = 16,
    /// `LM_ACQ_OK`: yes, with this token; send `index` PAD frames first.
    AcqOk = 17,
    /// `LM_ACQ_REJ`: no (reason in `index`).
    AcqRej = 18,
    /// `LM_ENDME`: every fragment has been sent.
    EndMe = 19,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Data,
            2 => Kind::Pad,
            16 => Kind::Req,
            17 => Kind::AcqOk,
            18 => Kind::AcqRej,
            19 => Kind::EndMe,
            _ => return None,
        })
    }
}

/// Why a receiver refused admission (`ACQ_REJ`'s `index`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reject {
    /// Another sender's message is being assembled (the paper's only case).
    Busy = 1,
    /// Longer than the receiver's maximum message.
    TooLong = 2,
    /// Fragments the receiver's frames cannot hold, or a count that does not match.
    BadGeometry = 3,
}

impl Reject {
    /// From the wire; unknown reasons read as `BadGeometry`.
    pub fn from_u32(v: u32) -> Reject {
        match v {
            1 => Reject::Busy,
            2 => Reject::TooLong,
            _ => Reject::BadGeometry,
        }
    }

    /// `busy`, `too_long`, `bad_geometry`.
    pub fn name(self) -> &'static str {
        match self {
            Reject::Busy => "busy",
            Reject::TooLong => "too_long",
            Reject::BadGeometry => "bad_geometry",
        }
    }
}

/// Why bytes are not an LM header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// Shorter than [`LM_HLEN`].
    #[error("shorter than the {LM_HLEN}-byte LM header")]
    Short,
    /// Not `"LM"`.
    #[error("bad magic")]
    BadMagic,
    /// Another version.
    #[error("LM version {0}, this build speaks 1")]
    BadVersion(u8),
    /// A kind byte this version does not define.
    #[error("unknown LM kind {0}")]
    UnknownKind(u8),
}

/// The LM header, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What this is.
    pub kind: Kind,
    /// Admission token.
    pub token: u32,
    /// Message number.
    pub msg_id: u32,
    /// Kind-specific word (see the module docs).
    pub index: u32,
    /// Fragments in the message.
    pub count: u32,
    /// Message length.
    pub total: u32,
}

impl Header {
    /// Writes the header into the first [`LM_HLEN`] bytes of `buf` (which must hold them).
    pub fn write(&self, buf: &mut [u8]) {
        let b = &mut buf[..LM_HLEN];
        b[0..2].copy_from_slice(&MAGIC);
        b[2] = VERSION;
        b[3] = self.kind as u8;
        b[4..8].copy_from_slice(&self.token.to_be_bytes());
        b[8..12].copy_from_slice(&self.msg_id.to_be_bytes());
        b[12..16].copy_from_slice(&self.index.to_be_bytes());
        b[16..20].copy_from_slice(&self.count.to_be_bytes());
        b[20..24].copy_from_slice(&self.total.to_be_bytes());
    }

    /// The header at the start of `buf`; `None` for anything that is not an LM datagram of
    /// this version (short, wrong magic, unknown kind). Never panics.
    pub fn parse(buf: &[u8]) -> Option<Header> {
        Self::decode(buf).ok()
    }

    /// [`Header::parse`] with the reason for a rejection.
    pub fn decode(buf: &[u8]) -> Result<Header, HeaderError> {
        let b = buf.get(..LM_HLEN).ok_or(HeaderError::Short)?;
        if b[0..2] != MAGIC {
            return Err(HeaderError::BadMagic);
        }
        if b[2] != VERSION {
            return Err(HeaderError::BadVersion(b[2]));
        }
        let word = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Ok(Header {
            kind: Kind::from_u8(b[3]).ok_or(HeaderError::UnknownKind(b[3]))?,
            token: word(4),
            msg_id: word(8),
            index: word(12),
            count: word(16),
            total: word(20),
        })
    }

    /// A control datagram: the header, then `mac` for `ACQ_OK`.
    pub fn control(&self, mac: Option<[u8; 6]>) -> Vec<u8> {
        let mut v = vec![0; LM_HLEN + mac.map_or(0, |_| 6)];
        self.write(&mut v);
        if let Some(m) = mac {
            v[LM_HLEN..].copy_from_slice(&m);
        }
        v
    }

    /// The MAC address an `ACQ_OK` datagram carries after its header.
    pub fn trailer_mac(buf: &[u8]) -> Option<[u8; 6]> {
        buf.get(LM_HLEN..LM_HLEN + 6)?.try_into().ok()
    }
}

/// How a message of `total` bytes is cut into fragments of `payload` bytes, and where each
/// piece lies — on the sender, in a region laid out with header holes (application-level
/// fragmentation, Jin, Zhang, Tan, "Lightweight Messages", §3.1); on the receiver, in a region where each fragment lands so
/// that the payloads end up back to back (driver-level defragmentation, §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Message length.
    pub total: usize,
    /// Payload bytes per fragment (all but the last are full).
    pub payload: usize,
}

impl Layout {
    /// The layout, or `None` for a zero payload size.
    pub fn new(total: usize, payload: usize) -> Option<Layout> {
        (payload > 0).then_some(Layout { total, payload })
    }

    /// Fragments: at least one (an empty message is one empty fragment).
    pub fn count(&self) -> usize {
        self.total.div_ceil(self.payload).max(1)
    }

    /// Message bytes fragment `k` carries.
    pub fn range(&self, k: usize) -> Range<usize> {
        let start = (k * self.payload).min(self.total);
        start..(start + self.payload).min(self.total)
    }

    /// Sender: bytes per frame slot in the transmit region (header hole + full payload).
    pub(crate) fn tx_stride(&self) -> usize {
        FRAME_HLEN + self.payload
    }

    /// Sender: offset of fragment `k`'s frame (its Ethernet header) in the region.
    pub(crate) fn tx_frame(&self, k: usize) -> usize {
        k * self.tx_stride()
    }

    /// Sender: offset of fragment `k`'s payload in the region.
    pub(crate) fn tx_payload(&self, k: usize) -> usize {
        self.tx_frame(k) + FRAME_HLEN
    }

    /// Sender: bytes of transmit region the message needs.
    pub(crate) fn tx_len(&self) -> usize {
        self.tx_frame(self.count() - 1) + FRAME_HLEN + self.range(self.count() - 1).len()
    }

    /// Receiver: where fragment `k`'s FILL chunk starts, relative to the region. Chunk `k`
    /// puts the frame at `chunk + XDP_HEADROOM`, so its payload at
    /// `k * payload + XDP_HEADROOM + FRAME_HLEN`: right after fragment `k - 1`'s, whose
    /// frame arrives later and overwrites `k`'s headers.
    pub(crate) fn rx_chunk(&self, k: usize) -> u64 {
        (k * self.payload) as u64
    }

    /// Receiver: offset of the assembled message in the region.
    pub(crate) fn rx_message(&self) -> u64 {
        XDP_HEADROOM + FRAME_HLEN as u64
    }

    /// Receiver: bytes of region a message of `max_total` needs with chunks of `chunk_size`
    /// (the last chunk must lie wholly inside).
    pub(crate) fn rx_region(max_total: usize, payload: usize, chunk_size: u32) -> u64 {
        let last = max_total.div_ceil(payload).max(1) - 1;
        (last * payload) as u64 + u64::from(chunk_size)
    }
}

/// The largest fragment payload for an interface MTU and a receive chunk size: a frame must
/// fit the MTU (IPv4 + UDP + LM headers inside it) and, with the 256 bytes copy mode leaves
/// in front, one chunk.
pub(crate) fn max_payload(mtu: u32, chunk_size: u32) -> usize {
    let by_mtu = (mtu as usize).saturating_sub(FRAME_HLEN - ETH_HLEN);
    let by_chunk = (chunk_size as usize).saturating_sub(XDP_HEADROOM as usize + FRAME_HLEN);
    by_mtu.min(by_chunk)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn headers_round_trip_and_foreign_bytes_are_not_lm() {
        let h = Header {
            kind: Kind::AcqOk,
            token: 0xdead_beef,
            msg_id: 7,
            index: 3,
            count: 725,
            total: 1 << 20,
        };
        let v = h.control(Some([1, 2, 3, 4, 5, 6]));
        assert_eq!(v.len(), LM_HLEN + 6);
        assert_eq!(Header::parse(&v), Some(h));
        assert_eq!(Header::trailer_mac(&v), Some([1, 2, 3, 4, 5, 6]));
        // The XDP program reads the token at 4 and the index at 12, big-endian.
        assert_eq!(&v[4..8], &0xdead_beefu32.to_be_bytes());
        assert_eq!(&v[12..16], &3u32.to_be_bytes());
        assert_eq!(Header::parse(&v[..LM_HLEN - 1]), None);
        let mut bad = v.clone();
        bad[2] = 2;
        assert_eq!(Header::parse(&bad), None, "another version");
        bad = v.clone();
        bad[3] = 99;
        assert_eq!(Header::parse(&bad), None, "unknown kind");
        bad = v;
        bad[0] = b'X';
        assert_eq!(Header::parse(&bad), None, "not LM");
        assert_eq!(Header::trailer_mac(&bad[..LM_HLEN + 5]), None);
    }

    #[test]
    fn the_paper_example_and_edge_sizes_cut_as_expected() {
        let l = Layout::new(0, 1448).unwrap();
        assert_eq!((l.count(), l.range(0)), (1, 0..0));
        let l = Layout::new(1448, 1448).unwrap();
        assert_eq!((l.count(), l.range(0)), (1, 0..1448));
        let l = Layout::new(1449, 1448).unwrap();
        assert_eq!((l.count(), l.range(1)), (2, 1448..1449));
        let l = Layout::new(1 << 20, 1448).unwrap();
        assert_eq!(l.count(), 725);
        assert_eq!(l.range(724), 724 * 1448..1 << 20);
        assert!(Layout::new(10, 0).is_none());
        // MTU 1500 with 4 KiB chunks: 1500 - 20 - 8 - 24.
        assert_eq!(max_payload(1500, 4096), 1448);
        // Jumbo frames are bounded by the chunk: 4096 - 256 - 66.
        assert_eq!(max_payload(9000, 4096), 3774);
        assert_eq!(max_payload(10, 4096), 0);
    }

    proptest! {
        #[test]
        fn receive_placement_puts_payloads_back_to_back(
            total in 0usize..200_000, payload in 64usize..4000,
        ) {
            let l = Layout::new(total, payload).unwrap();
            let n = l.count();
            let mut covered = 0;
            for k in 0..n {
                let r = l.range(k);
                prop_assert_eq!(r.start, covered);
                covered = r.end;
                // Where the frame's payload lands, relative to the region…
                let lands = l.rx_chunk(k) + XDP_HEADROOM + FRAME_HLEN as u64;
                // …is where byte r.start of the message must be.
                prop_assert_eq!(lands, l.rx_message() + r.start as u64);
                // The chunk stays inside the region of the largest message.
                prop_assert!(l.rx_chunk(k) + 4096 <= Layout::rx_region(total, payload, 4096));
                // Sender frames do not overlap and hold their payload.
                prop_assert_eq!(l.tx_payload(k), l.tx_frame(k) + FRAME_HLEN);
                if k + 1 < n {
                    prop_assert!(l.tx_payload(k) + r.len() <= l.tx_frame(k + 1));
                }
            }
            prop_assert_eq!(covered, total);
            prop_assert_eq!(l.tx_len(), l.tx_payload(n - 1) + l.range(n - 1).len());
        }

        #[test]
        fn parsing_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Header::parse(&bytes);
            let _ = Header::trailer_mac(&bytes);
        }
    }
}
