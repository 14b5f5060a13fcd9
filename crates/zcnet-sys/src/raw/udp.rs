//! UDP segmentation offload (`UDP_SEGMENT`, "GSO") and receive coalescing (`UDP_GRO`), per
//! udp(7) and the 4.18/5.0 uapi (linux/udp.h).
//!
//! * `UDP_SEGMENT = n` on a socket makes every larger datagram it sends one GSO packet that
//!   is cut into `n`-byte datagrams as late as possible (by the NIC, or by the stack just
//!   before delivery) — one syscall and one stack traversal for many datagrams.
//! * `UDP_GRO = 1` on a receiving socket lets the kernel hand over several datagrams of one
//!   flow in one read; the segment size arrives as a `SOL_UDP`/`UDP_GRO` control message
//!   (an `int`), which is the only way to find the datagram boundaries again.

use super::socket::{self, RecvFlags};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `SOL_UDP` (= `IPPROTO_UDP`).
pub const SOL_UDP: i32 = 17;
/// `UDP_SEGMENT`: GSO segment size for sends on this socket (Linux 4.18).
pub const UDP_SEGMENT: i32 = 103;
/// `UDP_GRO`: accept coalesced datagrams (Linux 5.0); also the control-message type that
/// carries their segment size.
pub const UDP_GRO: i32 = 104;

/// `setsockopt(SOL_UDP, UDP_SEGMENT, gso_size)`; 0 turns segmentation off.
pub fn set_udp_segment(fd: BorrowedFd<'_>, gso_size: u16) -> io::Result<()> {
    socket::set_int(fd, SOL_UDP, UDP_SEGMENT, i32::from(gso_size))
}

/// Reads `UDP_SEGMENT` back.
pub fn udp_segment(fd: BorrowedFd<'_>) -> io::Result<u16> {
    socket::get_int(fd, SOL_UDP, UDP_SEGMENT).map(|v| v.clamp(0, i32::from(u16::MAX)) as u16)
}

/// `setsockopt(SOL_UDP, UDP_GRO, on)`.
pub fn set_udp_gro(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    socket::set_int(fd, SOL_UDP, UDP_GRO, i32::from(on))
}

/// Reads `UDP_GRO` back.
pub fn udp_gro(fd: BorrowedFd<'_>) -> io::Result<bool> {
    socket::get_int(fd, SOL_UDP, UDP_GRO).map(|v| v != 0)
}

/// One read from a socket with `UDP_GRO` enabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroRecv {
    /// Bytes written into the buffer.
    pub len: usize,
    /// Segment size from the `UDP_GRO` control message: present when the read holds a
    /// coalesced (or unsegmented GSO) packet, each datagram `gso_size` bytes but the last.
    pub gso_size: Option<u16>,
    /// `MSG_TRUNC`: the packet was larger than the buffer.
    pub truncated: bool,
}

/// `recvmsg(buf, flags)` with room for the `UDP_GRO` control message.
pub fn recv_gro(fd: BorrowedFd<'_>, buf: &mut [u8], flags: RecvFlags) -> io::Result<GroRecv> {
    // u64 storage keeps the control buffer aligned for cmsghdr.
    let mut control = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain old data; all-zero (no name, no iov, no control) is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: msg points at one iovec describing `buf` (live and writable for its length)
    // and at a live control buffer of msg_controllen bytes; the kernel writes within them.
    let r = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, flags.bits() as i32) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let used = msg.msg_controllen.min(std::mem::size_of_val(&control));
    let bytes: Vec<u8> = control
        .iter()
        .flat_map(|w| w.to_ne_bytes())
        .take(used)
        .collect();
    Ok(GroRecv {
        len: r as usize,
        gso_size: parse_gro_control(&bytes),
        truncated: msg.msg_flags & libc::MSG_TRUNC != 0,
    })
}

/// Finds the `SOL_UDP`/`UDP_GRO` control message in a buffer filled by `recvmsg` (the
/// `CMSG_FIRSTHDR`/`CMSG_NXTHDR` walk, done on bytes) and returns its segment size.
pub fn parse_gro_control(control: &[u8]) -> Option<u16> {
    super::cmsg::messages(control)
        .find(|&(level, kind, data)| level == SOL_UDP && kind == UDP_GRO && data.len() >= 4)
        .and_then(|(_, _, data)| u16::try_from(i32::from_ne_bytes(data[..4].try_into().ok()?)).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsFd;
    use std::time::Duration;

    use crate::raw::cmsg::encode as cmsg;

    #[test]
    fn finds_the_gro_message_among_others() {
        let mut buf = cmsg(libc::SOL_SOCKET, libc::SO_TIMESTAMP, &[0; 16]);
        buf.extend(cmsg(SOL_UDP, UDP_GRO, &1000i32.to_ne_bytes()));
        assert_eq!(parse_gro_control(&buf), Some(1000));
        assert_eq!(
            parse_gro_control(&cmsg(SOL_UDP, UDP_SEGMENT, &7i32.to_ne_bytes())),
            None
        );
        assert_eq!(parse_gro_control(&[]), None);
        let mut bad = cmsg(SOL_UDP, UDP_GRO, &1000i32.to_ne_bytes());
        bad[0] = 200; // length beyond the buffer
        assert_eq!(parse_gro_control(&bad), None);
        assert_eq!(
            parse_gro_control(&cmsg(SOL_UDP, UDP_GRO, &(-1i32).to_ne_bytes())),
            None
        );
    }

    #[test]
    fn options_round_trip_and_gso_send_arrives_coalesced_with_gro() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        set_udp_gro(rx.as_fd(), true).unwrap();
        assert!(udp_gro(rx.as_fd()).unwrap());
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        set_udp_segment(tx.as_fd(), 1000).unwrap();
        assert_eq!(udp_segment(tx.as_fd()).unwrap(), 1000);
        let data: Vec<u8> = (0..4000u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(tx.send_to(&data, rx.local_addr().unwrap()).unwrap(), 4000);
        let mut buf = vec![0u8; 65536];
        let got = recv_gro(rx.as_fd(), &mut buf, RecvFlags::empty()).unwrap();
        // Loopback hands a GRO-enabled socket the GSO packet unsegmented (6.18).
        assert_eq!(
            got,
            GroRecv {
                len: 4000,
                gso_size: Some(1000),
                truncated: false
            }
        );
        assert_eq!(&buf[..4000], &data[..]);
    }
}
