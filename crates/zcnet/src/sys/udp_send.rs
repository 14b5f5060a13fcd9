//! Sending UDP with `MSG_ZEROCOPY` and a per-call GSO segment size, for transmit-only
//! measurements (`zcnet bench --topology sink`).
//!
//! Why UDP: a zero-copy send's pages are only spared a copy when the packets leave the host
//! (kernel `Documentation/networking/msg_zerocopy.rst`, "Loopback"); anything delivered to
//! a local socket is copied by `skb_orphan_frags_rx()`. A veth whose peer is down drops what
//! it is given as a NIC's driver frees what it transmitted, so it shows the transmit-side
//! saving — but TCP cannot even complete a handshake there, so the sink speaks UDP. GSO
//! (`UDP_SEGMENT`, udp(7)) lets one call carry up to 64 KiB as MTU-sized datagrams, the
//! way the Lightweight Messages paper fragments large messages below the application.
//!
//! Completions come back on the error queue exactly as for TCP (ranges of per-socket call
//! ids, `SO_EE_CODE_ZEROCOPY_COPIED` when the kernel copied after all): read them with
//! [`super::zerocopy::read_errqueue`].

use super::udp::{SOL_UDP, UDP_SEGMENT};
use super::zerocopy::MSG_ZEROCOPY;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Space for one `cmsghdr` carrying a `u16`, as `CMSG_SPACE(sizeof(uint16_t))`; kept in
/// `u64`s so it is aligned for `cmsghdr`.
const CONTROL_WORDS: usize = 4;

/// `sendmsg(buf)` on a connected UDP socket, with `MSG_ZEROCOPY` when `zerocopy` (the
/// socket needs `SO_ZEROCOPY`) and a `UDP_SEGMENT` control message when `gso_size` is
/// given, so the kernel cuts `buf` into datagrams of that size (the last may be shorter).
///
/// With `zerocopy` the kernel may read `buf`'s pages after this returns, until the
/// completion covering this call arrives: the caller keeps the bytes unchanged until then
/// (a loaned [`crate::TxBuf`] guarantees it). Memory safety does not depend on it — the
/// kernel holds its own page references — only the bytes on the wire do.
pub fn send_gso(
    fd: BorrowedFd<'_>,
    buf: &[u8],
    zerocopy: bool,
    gso_size: Option<u16>,
) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut control = [0u64; CONTROL_WORDS];
    // SAFETY: msghdr is plain old data; all-zero (no name, no iov, no control) is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
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
    // SAFETY: msg describes one iovec over `buf` (readable for its length; the kernel only
    // reads it) and a control buffer that lives across the call.
    let n = unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, flags) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::udp::{recv_gro, set_udp_gro};
    use crate::sys::zerocopy::{read_errqueue, set_so_zerocopy, ErrqueueEntry};
    use std::net::UdpSocket;
    use std::os::fd::AsFd;
    use std::time::{Duration, Instant};

    #[test]
    fn gso_send_is_cut_into_segments_and_zerocopy_completes() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        set_udp_gro(rx.as_fd(), true).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.connect(rx.local_addr().unwrap()).unwrap();
        set_so_zerocopy(tx.as_fd()).unwrap();
        let data: Vec<u8> = (0..5000u32).map(|i| (i % 253) as u8).collect();
        assert_eq!(send_gso(tx.as_fd(), &data, true, Some(1200)).unwrap(), 5000);
        let mut buf = vec![0u8; 65536];
        let got = recv_gro(rx.as_fd(), &mut buf, 0).unwrap();
        assert_eq!(got.len, 5000);
        assert_eq!(got.gso_size, Some(1200));
        assert_eq!(&buf[..5000], &data[..]);
        // The one zero-copy call completes as id 0; local delivery copied it.
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut out = Vec::new();
        while out.is_empty() && Instant::now() < deadline {
            read_errqueue(tx.as_fd(), &mut out).unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            out,
            vec![ErrqueueEntry::Zerocopy {
                lo: 0,
                hi: 0,
                copied: true
            }]
        );
        // Without GSO or zero-copy it is a plain datagram.
        assert_eq!(
            send_gso(tx.as_fd(), &data[..100], false, None).unwrap(),
            100
        );
        let got = recv_gro(rx.as_fd(), &mut buf, 0).unwrap();
        assert_eq!((got.len, got.gso_size), (100, None));
    }

    #[test]
    fn oversized_gso_is_an_error_not_a_truncation() {
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.connect("127.0.0.1:9").unwrap();
        let data = vec![0u8; 70000];
        assert!(send_gso(tx.as_fd(), &data, false, Some(1200)).is_err());
    }
}
