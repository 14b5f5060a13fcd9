//! Ethernet II / IPv4 / UDP headers of AF_XDP frames: parse what arrives, write what leaves.
//!
//! An XSK hands over whole Ethernet frames, so the headers the kernel would have stripped
//! are ours to check. Parsing never panics and never trusts a length field beyond the bytes
//! present: a malformed or foreign frame is a [`WireError`], not a short or overlong slice.
//! Pure code (RFC 791, RFC 768), tested without sockets.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::ops::Range;

/// Ethernet II header length (no VLAN tag).
pub(crate) const ETH_HLEN: usize = 14;
/// IPv4 header length without options.
pub(crate) const IPV4_HLEN: usize = 20;
/// UDP header length.
pub(crate) const UDP_HLEN: usize = 8;
/// Ethernet + IPv4 (no options) + UDP: the header room one frame needs in front of its
/// payload.
pub const UDP_FRAME_HLEN: usize = ETH_HLEN + IPV4_HLEN + UDP_HLEN;

const ETHERTYPE_IPV4: u16 = 0x0800;
const IPPROTO_UDP: u8 = 17;

/// Why a frame is not a well-formed IPv4 UDP datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer bytes than the headers claim.
    #[error("frame truncated: {need} bytes needed, {have} present")]
    Truncated {
        /// Bytes the headers require.
        need: usize,
        /// Bytes in the frame.
        have: usize,
    },
    /// Not EtherType 0x0800.
    #[error("not IPv4 (EtherType {0:#06x})")]
    NotIpv4(u16),
    /// IPv4 version field is not 4, or the header length is below 20.
    #[error("bad IPv4 header (version/IHL byte {0:#04x})")]
    BadIpHeader(u8),
    /// Not protocol 17.
    #[error("not UDP (IP protocol {0})")]
    NotUdp(u8),
    /// A fragment of a larger IP datagram (MF set or offset non-zero).
    #[error("IP fragment")]
    Fragment,
    /// The IPv4 or UDP length field disagrees with the bytes present.
    #[error("{what} length {claimed} does not fit the {have} bytes present")]
    BadLength {
        /// Which length field.
        what: &'static str,
        /// What it says.
        claimed: usize,
        /// What is there.
        have: usize,
    },
    /// The IPv4 header checksum does not verify.
    #[error("IPv4 header checksum mismatch")]
    BadChecksum,
    /// The payload does not fit in the buffer or a UDP datagram.
    #[error("payload of {0} bytes does not fit")]
    TooLong(usize),
}

/// A parsed IPv4 UDP frame: addresses and where the payload lies in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpFrame {
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// Source address and port.
    pub src: SocketAddrV4,
    /// Destination address and port.
    pub dst: SocketAddrV4,
    /// The payload's byte range within the frame.
    pub payload: Range<usize>,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// RFC 1071 ones' complement sum over `bytes`, folded.
fn checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Parses an Ethernet II frame carrying one unfragmented IPv4 UDP datagram. Trailing bytes
/// after the IP datagram (Ethernet padding of short frames) are ignored; the payload range
/// is what the UDP length says.
pub fn parse_udp(frame: &[u8]) -> Result<UdpFrame, WireError> {
    let need = |need: usize| {
        if frame.len() < need {
            Err(WireError::Truncated {
                need,
                have: frame.len(),
            })
        } else {
            Ok(())
        }
    };
    need(ETH_HLEN + IPV4_HLEN)?;
    let ethertype = be16(frame, 12);
    if ethertype != ETHERTYPE_IPV4 {
        return Err(WireError::NotIpv4(ethertype));
    }
    let ip = ETH_HLEN;
    let vihl = frame[ip];
    let ihl = usize::from(vihl & 0x0f) * 4;
    if vihl >> 4 != 4 || ihl < IPV4_HLEN {
        return Err(WireError::BadIpHeader(vihl));
    }
    need(ip + ihl)?;
    if checksum(&frame[ip..ip + ihl]) != 0 {
        return Err(WireError::BadChecksum);
    }
    let total = usize::from(be16(frame, ip + 2));
    if total < ihl + UDP_HLEN || ip + total > frame.len() {
        return Err(WireError::BadLength {
            what: "IPv4 total",
            claimed: total,
            have: frame.len() - ip,
        });
    }
    if be16(frame, ip + 6) & 0x3fff != 0 {
        return Err(WireError::Fragment);
    }
    if frame[ip + 9] != IPPROTO_UDP {
        return Err(WireError::NotUdp(frame[ip + 9]));
    }
    let udp = ip + ihl;
    let udp_len = usize::from(be16(frame, udp + 4));
    if udp_len < UDP_HLEN || udp_len > total - ihl {
        return Err(WireError::BadLength {
            what: "UDP",
            claimed: udp_len,
            have: total - ihl,
        });
    }
    let addr = |at: usize| Ipv4Addr::new(frame[at], frame[at + 1], frame[at + 2], frame[at + 3]);
    let mac = |at: usize| -> [u8; 6] { frame[at..at + 6].try_into().expect("6 bytes") };
    Ok(UdpFrame {
        dst_mac: mac(0),
        src_mac: mac(6),
        src: SocketAddrV4::new(addr(ip + 12), be16(frame, udp)),
        dst: SocketAddrV4::new(addr(ip + 16), be16(frame, udp + 2)),
        payload: udp + UDP_HLEN..udp + udp_len,
    })
}

/// Writes Ethernet, IPv4 (no options, DF set, TTL 64) and UDP headers for a payload of
/// `payload_len` bytes into `buf[..UDP_FRAME_HLEN]`; the payload itself is expected at
/// `buf[UDP_FRAME_HLEN..]` already (the point of header room: it is written once, in place).
/// The UDP checksum is left 0 ("no checksum", allowed over IPv4 by RFC 768). Returns the
/// frame length.
pub fn write_udp_headers(
    buf: &mut [u8],
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: SocketAddrV4,
    dst: SocketAddrV4,
    payload_len: usize,
) -> Result<usize, WireError> {
    let frame_len = UDP_FRAME_HLEN + payload_len;
    let ip_total = IPV4_HLEN + UDP_HLEN + payload_len;
    if frame_len > buf.len() || ip_total > usize::from(u16::MAX) {
        return Err(WireError::TooLong(payload_len));
    }
    buf[0..6].copy_from_slice(&dst_mac);
    buf[6..12].copy_from_slice(&src_mac);
    buf[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    let ip = &mut buf[ETH_HLEN..ETH_HLEN + IPV4_HLEN];
    ip[0] = 0x45;
    ip[1] = 0;
    ip[2..4].copy_from_slice(&(ip_total as u16).to_be_bytes());
    ip[4..6].copy_from_slice(&[0, 0]);
    ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = IPPROTO_UDP;
    ip[10..12].copy_from_slice(&[0, 0]);
    ip[12..16].copy_from_slice(&src.ip().octets());
    ip[16..20].copy_from_slice(&dst.ip().octets());
    let sum = checksum(ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let udp = &mut buf[ETH_HLEN + IPV4_HLEN..UDP_FRAME_HLEN];
    udp[0..2].copy_from_slice(&src.port().to_be_bytes());
    udp[2..4].copy_from_slice(&dst.port().to_be_bytes());
    udp[4..6].copy_from_slice(&((UDP_HLEN + payload_len) as u16).to_be_bytes());
    udp[6..8].copy_from_slice(&[0, 0]);
    Ok(frame_len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const A: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 2];

    fn frame(payload: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; UDP_FRAME_HLEN + payload.len()];
        buf[UDP_FRAME_HLEN..].copy_from_slice(payload);
        let src = SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 1), 4000);
        let dst = SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 2), 5000);
        let n = write_udp_headers(&mut buf, A, B, src, dst, payload.len()).unwrap();
        assert_eq!(n, buf.len());
        buf
    }

    #[test]
    fn written_headers_parse_back() {
        let f = frame(b"hello");
        let p = parse_udp(&f).unwrap();
        assert_eq!(&f[p.payload.clone()], b"hello");
        assert_eq!((p.src.port(), p.dst.port()), (4000, 5000));
        assert_eq!(*p.dst.ip(), Ipv4Addr::new(10, 77, 0, 2));
        assert_eq!((p.src_mac, p.dst_mac), (A, B));
    }

    #[test]
    fn padding_after_the_datagram_is_not_payload() {
        let mut f = frame(b"x");
        f.resize(60, 0xee); // minimum Ethernet frame, padded
        assert_eq!(parse_udp(&f).unwrap().payload.len(), 1);
    }

    #[test]
    fn malformed_frames_are_errors() {
        let f = frame(&[7u8; 100]);
        assert!(matches!(
            parse_udp(&f[..30]),
            Err(WireError::Truncated { .. })
        ));
        let mut g = f.clone();
        g[12] = 0x86;
        g[13] = 0xdd;
        assert_eq!(parse_udp(&g), Err(WireError::NotIpv4(0x86dd)));
        let mut g = f.clone();
        g[ETH_HLEN + 8] = 63; // TTL changed without fixing the checksum
        assert_eq!(parse_udp(&g), Err(WireError::BadChecksum));
        // UDP length larger than the datagram.
        let mut g = f.clone();
        g[ETH_HLEN + IPV4_HLEN + 4..ETH_HLEN + IPV4_HLEN + 6]
            .copy_from_slice(&500u16.to_be_bytes());
        assert!(matches!(
            parse_udp(&g),
            Err(WireError::BadLength { what: "UDP", .. })
        ));
        // IPv4 total length beyond the frame.
        assert!(matches!(
            parse_udp(&f[..f.len() - 1]),
            Err(WireError::BadLength {
                what: "IPv4 total",
                ..
            })
        ));
        let mut buf = [0u8; 50];
        let src = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1);
        assert_eq!(
            write_udp_headers(&mut buf, A, B, src, src, 9),
            Err(WireError::TooLong(9))
        );
    }

    proptest! {
        #[test]
        fn parsing_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(p) = parse_udp(&bytes) {
                prop_assert!(p.payload.end <= bytes.len());
            }
        }

        #[test]
        fn any_payload_round_trips(payload in proptest::collection::vec(any::<u8>(), 0..3000)) {
            let f = frame(&payload);
            let p = parse_udp(&f).unwrap();
            prop_assert_eq!(&f[p.payload], &payload[..]);
        }
    }
}
