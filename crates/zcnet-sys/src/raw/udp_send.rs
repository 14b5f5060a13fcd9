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

use std::io;
use std::os::fd::BorrowedFd;

/// `sendmsg(buf)` on a connected UDP socket, with `MSG_ZEROCOPY` when `zerocopy` (the
/// socket needs `SO_ZEROCOPY`) and a `UDP_SEGMENT` control message when `gso_size` is
/// given, so the kernel cuts `buf` into datagrams of that size (the last may be shorter).
///
/// With `zerocopy` the kernel may read `buf`'s pages after this returns, until the
/// completion covering this call arrives: the caller keeps the bytes unchanged until then
/// (a loaned `zcnet::TxBuf` guarantees it). Memory safety does not depend on it — the
/// kernel holds its own page references — only the bytes on the wire do.
pub fn send_gso(
    fd: BorrowedFd<'_>,
    buf: &[u8],
    zerocopy: bool,
    gso_size: Option<u16>,
) -> io::Result<usize> {
    // One iovec: the message layer's vectored send is the one place that builds the
    // `UDP_SEGMENT` control message.
    super::udp_msg::send_vectored_gso(fd, &[std::io::IoSlice::new(buf)], zerocopy, gso_size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raw::socket::RecvFlags;
    use crate::raw::udp::{recv_gro, set_udp_gro};
    use crate::raw::zerocopy::{read_errqueue, set_so_zerocopy, ErrqueueEntry};
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
        let got = recv_gro(rx.as_fd(), &mut buf, RecvFlags::empty()).unwrap();
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
        let got = recv_gro(rx.as_fd(), &mut buf, RecvFlags::empty()).unwrap();
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
