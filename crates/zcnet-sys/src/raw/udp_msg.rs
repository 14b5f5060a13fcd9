//! The socket calls of the message layer (`zcnet_msg`): a vectored UDP send with a
//! per-call `UDP_SEGMENT` size and optional `MSG_ZEROCOPY`, a receive that also returns the
//! sender's address, the datagram's real length (`MSG_TRUNC`) and the `UDP_GRO` segment size,
//! and the path MTU of a connected socket (`IP_MTU`/`IPV6_MTU`, ip(7)/ipv6(7)).
//!
//! Kernel limits these calls run into (6.18, measured here with a probe program):
//!
//! * one GSO send carries at most [`UDP_MAX_SEGMENTS`] segments (`EINVAL` beyond) and at most
//!   65 507 bytes of UDP payload over IPv4 (`EMSGSIZE` beyond: the super-packet is still one
//!   IP datagram of at most 64 KiB);
//! * a zero-copy send maps the user pages into at most `MAX_SKB_FRAGS` (17 here) page
//!   fragments, merging only neighbouring bytes of one page: an iovec that alternates small
//!   headers and payload slices runs out after 7 segments of 1472 bytes (`EMSGSIZE`), while
//!   one contiguous 64 KiB range always fits. That is why the message layer lays zero-copy
//!   messages out with holes for the headers (application-level fragmentation, Jin, Zhang, Tan, "Lightweight Messages",
//!   §3.1) and sends each batch as one contiguous range;
//! * an iovec array holds at most `UIO_MAXIOV` (1024) entries.

use super::socket::RecvFlags;
use super::udp::{parse_gro_control, SOL_UDP, UDP_SEGMENT};
use super::zerocopy::MSG_ZEROCOPY;
use std::io::{self, IoSlice};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd};

/// `UDP_MAX_SEGMENTS` of this kernel (include/linux/udp.h: 128 since 6.x, 64 before): more
/// segments in one GSO send is `EINVAL`. Older kernels are met by halving on `EINVAL`.
pub const UDP_MAX_SEGMENTS: usize = 128;
/// `UIO_MAXIOV`: the most iovec entries one `sendmsg` takes.
pub const UIO_MAXIOV: usize = 1024;
/// Largest UDP payload of one IPv4 datagram, and so of one GSO send (65535 − 20 − 8).
pub const MAX_UDP_PAYLOAD_V4: usize = 65_507;
/// Largest UDP payload we send over IPv6 (65535 − 40 − 8; the kernel allows a little more,
/// this keeps one limit for both header sizes).
pub const MAX_UDP_PAYLOAD_V6: usize = 65_487;

/// Space for one `cmsghdr` carrying a `u16` (`CMSG_SPACE(2)`), in aligned words.
const SEND_CONTROL_WORDS: usize = 4;

/// `sendmsg(iov)` on a connected UDP socket: the slices are concatenated into one datagram,
/// or, with `gso_size`, into one GSO packet the kernel cuts into datagrams of that size (the
/// last may be shorter). With `zerocopy` the call carries `MSG_ZEROCOPY` (the socket needs
/// `SO_ZEROCOPY`) and takes the next completion id if it succeeds.
///
/// With `zerocopy` the kernel may still read the slices' pages after this returns, until the
/// completion covering this call arrives: the caller keeps those bytes unchanged until then
/// (the message layer lends the buffer to its completion bookkeeping). Memory safety does not
/// depend on it — the kernel holds its own page references — only the bytes on the wire do.
/// `iov.len()` above [`UIO_MAXIOV`] is `EMSGSIZE` from the kernel.
pub fn send_vectored_gso(
    fd: BorrowedFd<'_>,
    iov: &[IoSlice<'_>],
    zerocopy: bool,
    gso_size: Option<u16>,
) -> io::Result<usize> {
    let mut control = [0u64; SEND_CONTROL_WORDS];
    // SAFETY: msghdr is plain old data; all-zero (no name, no iov, no control) is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSlice is guaranteed ABI-compatible with `struct iovec` on Unix (std docs); the kernel
    // only reads through msg_iov, so the const-to-mut cast is never written through.
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len();
    if let Some(seg) = gso_size {
        // SAFETY: CMSG_SPACE/CMSG_LEN are pure arithmetic on a length.
        let (space, len) = unsafe {
            (
                libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) as usize,
                libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as usize,
            )
        };
        debug_assert!(space <= std::mem::size_of_val(&control));
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: msg_control points at `control`, aligned for cmsghdr and at least
        // CMSG_SPACE(2) bytes long, so CMSG_FIRSTHDR is non-null and the header and its
        // 2-byte payload written through CMSG_DATA lie inside `control`.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = SOL_UDP;
            (*c).cmsg_type = UDP_SEGMENT;
            (*c).cmsg_len = len;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), seg);
        }
    }
    let flags = libc::MSG_NOSIGNAL | if zerocopy { MSG_ZEROCOPY } else { 0 };
    // SAFETY: msg names `iov.len()` iovecs, each describing a live readable slice borrowed
    // for the call, and a control buffer that lives across the call; the kernel only reads
    // them.
    let n = unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, flags) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// One `recvmsg` on a UDP socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatagramRecv {
    /// Bytes written into the buffer (at most its length).
    pub len: usize,
    /// The packet's real length (`MSG_TRUNC` in the flags makes the kernel return it); more
    /// than `len` when the packet did not fit.
    pub full_len: usize,
    /// `MSG_TRUNC` in the returned flags: the packet was longer than the buffer.
    pub truncated: bool,
    /// Segment size from the `UDP_GRO` control message: the read holds several datagrams,
    /// each `gso_size` bytes but the last.
    pub gso_size: Option<u16>,
    /// The sender's address, if the kernel gave one of a family we know.
    pub from: Option<SocketAddr>,
}

/// `recvmsg(buf, flags | MSG_TRUNC)` with room for the sender's address and the `UDP_GRO`
/// control message. `EAGAIN`/`EINTR` go back to the caller.
pub fn recv_datagram(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: RecvFlags,
) -> io::Result<DatagramRecv> {
    // u64 storage keeps both buffers aligned (cmsghdr; sockaddr_storage is 8-aligned).
    let mut control = [0u64; 8];
    let mut name = [0u64; 16]; // 128 bytes = sizeof(struct sockaddr_storage)
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain old data; all-zero (no name, no iov, no control) is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = name.as_mut_ptr().cast();
    msg.msg_namelen = std::mem::size_of_val(&name) as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: msg points at one iovec describing `buf` (live and writable for its length),
    // a live 128-byte name buffer of msg_namelen bytes and a live control buffer of
    // msg_controllen bytes; the kernel writes within them.
    let r = unsafe {
        libc::recvmsg(
            fd.as_raw_fd(),
            &mut msg,
            (flags | RecvFlags::TRUNC).bits() as i32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let full_len = r as usize;
    let bytes_of = |words: &[u64], used: usize| -> Vec<u8> {
        words
            .iter()
            .flat_map(|w| w.to_ne_bytes())
            .take(used)
            .collect()
    };
    let control_bytes = bytes_of(
        &control,
        msg.msg_controllen.min(std::mem::size_of_val(&control)),
    );
    let name_bytes = bytes_of(
        &name,
        (msg.msg_namelen as usize).min(std::mem::size_of_val(&name)),
    );
    Ok(DatagramRecv {
        len: full_len.min(buf.len()),
        full_len,
        truncated: msg.msg_flags & libc::MSG_TRUNC != 0 || full_len > buf.len(),
        gso_size: parse_gro_control(&control_bytes).filter(|&g| g > 0),
        from: decode_sockaddr(&name_bytes),
    })
}

/// Decodes a `sockaddr_in`/`sockaddr_in6` as the kernel wrote it (family in host order,
/// port and address in network order), on bytes so it needs no `unsafe`.
pub fn decode_sockaddr(b: &[u8]) -> Option<SocketAddr> {
    let family = i32::from(u16::from_ne_bytes(b.get(0..2)?.try_into().ok()?));
    let port = u16::from_be_bytes(b.get(2..4)?.try_into().ok()?);
    match family {
        libc::AF_INET => {
            let a: [u8; 4] = b.get(4..8)?.try_into().ok()?;
            Some(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(a), port)))
        }
        libc::AF_INET6 => {
            let flow = u32::from_be_bytes(b.get(4..8)?.try_into().ok()?);
            let a: [u8; 16] = b.get(8..24)?.try_into().ok()?;
            let scope = u32::from_ne_bytes(b.get(24..28)?.try_into().ok()?);
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a),
                port,
                flow,
                scope,
            )))
        }
        _ => None,
    }
}

/// `IP_MTU` (ip(7)) / `IPV6_MTU` (ipv6(7)): the path MTU the kernel knows for a *connected*
/// socket's destination, from its route in the socket's own network namespace (`ENOTCONN`
/// before `connect`).
pub fn path_mtu(fd: BorrowedFd<'_>, peer: IpAddr) -> io::Result<u32> {
    let v = match peer {
        IpAddr::V4(_) => super::socket::get_int(fd, libc::IPPROTO_IP, libc::IP_MTU)?,
        IpAddr::V6(_) => super::socket::get_int(fd, libc::IPPROTO_IPV6, libc::IPV6_MTU)?,
    };
    Ok(v.max(0) as u32)
}

/// Asks for a receive buffer of `bytes`: `SO_RCVBUF` (capped by `net.core.rmem_max`), then,
/// if the kernel granted less and we may (`CAP_NET_ADMIN`), `SO_RCVBUFFORCE`. Returns what
/// the socket has afterwards (the kernel reports twice the request, for its bookkeeping).
pub fn grow_rcvbuf(fd: BorrowedFd<'_>, bytes: usize) -> io::Result<usize> {
    let want = bytes.min(i32::MAX as usize / 2) as i32;
    super::socket::set_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, want)?;
    let got = super::socket::get_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF)?;
    if (got as i64) < 2 * want as i64 {
        // EPERM without CAP_NET_ADMIN: keep what SO_RCVBUF gave.
        let _ = super::socket::set_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, want);
    }
    Ok(super::socket::get_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF)?.max(0) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raw::udp::set_udp_gro;
    use crate::raw::zerocopy::set_so_zerocopy;
    use std::net::UdpSocket;
    use std::os::fd::AsFd;
    use std::time::Duration;

    fn pair() -> (UdpSocket, UdpSocket) {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.connect(rx.local_addr().unwrap()).unwrap();
        (tx, rx)
    }

    #[test]
    fn vectored_gso_send_arrives_as_segments_with_sender_address() {
        let (tx, rx) = pair();
        set_udp_gro(rx.as_fd(), true).unwrap();
        let a = [1u8; 700];
        let b = [2u8; 800];
        let c = [3u8; 100];
        let iov = [IoSlice::new(&a), IoSlice::new(&b), IoSlice::new(&c)];
        assert_eq!(
            send_vectored_gso(tx.as_fd(), &iov, false, Some(1000)).unwrap(),
            1600
        );
        let mut buf = vec![0u8; 65536];
        let got = recv_datagram(rx.as_fd(), &mut buf, RecvFlags::empty()).unwrap();
        assert_eq!((got.len, got.full_len, got.truncated), (1600, 1600, false));
        assert_eq!(got.gso_size, Some(1000));
        assert_eq!(got.from, Some(tx.local_addr().unwrap()));
        assert_eq!(&buf[..700], &a[..]);
        assert_eq!(&buf[700..1500], &b[..]);
        assert_eq!(&buf[1500..1600], &c[..]);
    }

    #[test]
    fn short_buffer_reports_real_length_and_truncation() {
        let (tx, rx) = pair();
        let data = [7u8; 3000];
        send_vectored_gso(tx.as_fd(), &[IoSlice::new(&data)], false, None).unwrap();
        let mut buf = vec![0u8; 1000];
        let got = recv_datagram(rx.as_fd(), &mut buf, RecvFlags::empty()).unwrap();
        assert_eq!((got.len, got.full_len, got.truncated), (1000, 3000, true));
        assert_eq!(got.gso_size, None);
    }

    #[test]
    fn interleaved_zerocopy_iovec_runs_out_of_page_fragments_but_contiguous_does_not() {
        // Pins the kernel limit the message layer's hole layout exists for.
        let (tx, _rx) = pair();
        set_so_zerocopy(tx.as_fd()).unwrap();
        let seg = 1472usize;
        let segs = 44usize;
        let payload = vec![5u8; segs * seg];
        let headers = vec![6u8; segs * 28];
        let mut iov = Vec::new();
        for i in 0..segs {
            iov.push(IoSlice::new(&headers[i * 28..(i + 1) * 28]));
            iov.push(IoSlice::new(&payload[i * (seg - 28)..(i + 1) * (seg - 28)]));
        }
        let e = send_vectored_gso(tx.as_fd(), &iov, true, Some(seg as u16)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EMSGSIZE));
        let whole = send_vectored_gso(
            tx.as_fd(),
            &[IoSlice::new(&payload)],
            true,
            Some(seg as u16),
        )
        .unwrap();
        assert_eq!(whole, segs * seg);
        // And the GSO size limits: too many segments, too many bytes.
        let e = send_vectored_gso(
            tx.as_fd(),
            &[IoSlice::new(&vec![0u8; 100 * (UDP_MAX_SEGMENTS + 1)])],
            false,
            Some(100),
        )
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        let e = send_vectored_gso(
            tx.as_fd(),
            &[IoSlice::new(&vec![0u8; MAX_UDP_PAYLOAD_V4 + 1])],
            false,
            Some(1472),
        )
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EMSGSIZE));
    }

    #[test]
    fn path_mtu_of_loopback_and_sockaddr_decoding() {
        let (tx, _rx) = pair();
        // Loopback's MTU is 65536; the route reports it capped at IP_MAX_MTU.
        assert_eq!(
            path_mtu(tx.as_fd(), IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap(),
            65535
        );
        assert_eq!(decode_sockaddr(&[]), None);
        assert_eq!(decode_sockaddr(&[0u8; 16]), None); // AF_UNSPEC
        let mut v4 = vec![0u8; 16];
        v4[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        v4[2..4].copy_from_slice(&4242u16.to_be_bytes());
        v4[4..8].copy_from_slice(&[10, 0, 0, 1]);
        assert_eq!(decode_sockaddr(&v4), Some("10.0.0.1:4242".parse().unwrap()));
        assert_eq!(decode_sockaddr(&v4[..6]), None);
    }

    #[test]
    fn rcvbuf_grows() {
        let (_tx, rx) = pair();
        assert!(grow_rcvbuf(rx.as_fd(), 1 << 20).unwrap() >= 1 << 20);
    }
}
