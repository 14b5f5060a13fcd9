//! `MSG_ZEROCOPY`: the socket option, the send flag, and the completion notifications the
//! kernel queues on the socket's error queue (Documentation/networking/msg_zerocopy.rst).
//!
//! Every successful `send(MSG_ZEROCOPY)` call gets the next value of a per-socket 32-bit
//! counter. When the kernel no longer needs the pages of a range of calls it queues one
//! `sock_extended_err` with `ee_origin = SO_EE_ORIGIN_ZEROCOPY` and the inclusive range
//! `[ee_info, ee_data]`; `ee_code` carries `SO_EE_CODE_ZEROCOPY_COPIED` when it had to copy
//! the data after all (loopback, veth into a namespace, no scatter-gather).

use super::socket::{self, SendFlags};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `SO_ZEROCOPY` (asm-generic/socket.h). Without it the kernel silently ignores the flag.
pub const SO_ZEROCOPY: i32 = 60;
/// `MSG_ZEROCOPY` (linux/socket.h).
pub const MSG_ZEROCOPY: i32 = 0x0400_0000;
/// `SO_EE_ORIGIN_ZEROCOPY` (linux/errqueue.h).
pub const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
/// `SO_EE_CODE_ZEROCOPY_COPIED`: the kernel copied the data of this range after all.
pub const SO_EE_CODE_ZEROCOPY_COPIED: u8 = 1;
const IP_RECVERR: i32 = 11;
const IPV6_RECVERR: i32 = 25;

/// Enables `SO_ZEROCOPY`. Set it before `connect`/`listen`: some kernels refuse it (`EBUSY`)
/// on an established socket, and accepted sockets inherit it from the listener.
pub fn set_so_zerocopy(fd: BorrowedFd<'_>) -> io::Result<()> {
    socket::set_int(fd, libc::SOL_SOCKET, SO_ZEROCOPY, 1)
}

/// Reads `SO_ZEROCOPY` back.
pub fn so_zerocopy(fd: BorrowedFd<'_>) -> io::Result<bool> {
    socket::get_int(fd, libc::SOL_SOCKET, SO_ZEROCOPY).map(|v| v != 0)
}

/// `send(buf, MSG_ZEROCOPY | flags)`. The kernel pins `buf`'s pages and may read them after
/// this returns, until the completion covering this call arrives: the caller must keep the
/// bytes unchanged until then (that is what loaned `TxBuf`s guarantee).
pub fn send_zerocopy(fd: BorrowedFd<'_>, buf: &[u8], flags: SendFlags) -> io::Result<usize> {
    // rustix names no MSG_ZEROCOPY; its flag types keep bits they do not name.
    socket::send(
        fd,
        buf,
        flags | SendFlags::from_bits_retain(MSG_ZEROCOPY as u32),
    )
}

/// `struct sock_extended_err` (linux/errqueue.h), decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtendedErr {
    /// `ee_errno`.
    pub errno: u32,
    /// `ee_origin`.
    pub origin: u8,
    /// `ee_type`.
    pub kind: u8,
    /// `ee_code`.
    pub code: u8,
    /// `ee_info`.
    pub info: u32,
    /// `ee_data`.
    pub data: u32,
}

impl ExtendedErr {
    const SIZE: usize = 16;

    /// Decodes the 16-byte kernel struct; `None` if `b` is too short.
    pub fn decode(b: &[u8]) -> Option<ExtendedErr> {
        if b.len() < Self::SIZE {
            return None;
        }
        let u32_at = |o: usize| u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        Some(ExtendedErr {
            errno: u32_at(0),
            origin: b[4],
            kind: b[5],
            code: b[6],
            info: u32_at(8),
            data: u32_at(12),
        })
    }
}

/// One message read from the error queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrqueueEntry {
    /// Calls `lo..=hi` (32-bit counter values, may wrap) no longer need their pages.
    Zerocopy {
        /// First call covered.
        lo: u32,
        /// Last call covered (inclusive).
        hi: u32,
        /// The kernel copied the data of these calls (`SO_EE_CODE_ZEROCOPY_COPIED`).
        copied: bool,
    },
    /// Anything else (ICMP errors, timestamps): reported, not interpreted.
    Other(ExtendedErr),
}

/// Walks a control-message buffer as filled by `recvmsg` (the `CMSG_FIRSTHDR`/`CMSG_NXTHDR`
/// walk, done on bytes so it needs no `unsafe`) and decodes every IP/IPv6 `RECVERR` entry.
pub fn parse_control(control: &[u8], out: &mut Vec<ErrqueueEntry>) {
    for (level, kind, data) in super::cmsg::messages(control) {
        let is_recverr = (level == libc::SOL_IP && kind == IP_RECVERR)
            || (level == libc::SOL_IPV6 && kind == IPV6_RECVERR);
        if !is_recverr {
            continue;
        }
        if let Some(e) = ExtendedErr::decode(data) {
            if e.origin == SO_EE_ORIGIN_ZEROCOPY && e.errno == 0 {
                out.push(ErrqueueEntry::Zerocopy {
                    lo: e.info,
                    hi: e.data,
                    copied: e.code & SO_EE_CODE_ZEROCOPY_COPIED != 0,
                });
            } else {
                out.push(ErrqueueEntry::Other(e));
            }
        }
    }
}

/// Drains the socket's error queue without blocking (`recvmsg(MSG_ERRQUEUE|MSG_DONTWAIT)`
/// until `EAGAIN`), appending decoded entries to `out`. Returns the number of messages read.
pub fn read_errqueue(fd: BorrowedFd<'_>, out: &mut Vec<ErrqueueEntry>) -> io::Result<usize> {
    read_errqueue_until(fd, out, |_| false)
}

/// [`read_errqueue`] that stops early, without the final `EAGAIN` call, once `enough` says
/// so of the entries appended so far (called after each message read). A caller that knows
/// how many calls are outstanding stops when they are all notified: that saves one
/// `recvmsg` per drain — half the error-queue reads of a sender that drains every few
/// sends.
pub fn read_errqueue_until(
    fd: BorrowedFd<'_>,
    out: &mut Vec<ErrqueueEntry>,
    mut enough: impl FnMut(&[ErrqueueEntry]) -> bool,
) -> io::Result<usize> {
    let start = out.len();
    let mut n = 0;
    loop {
        // u64 storage keeps the control buffer aligned for cmsghdr.
        let mut control = [0u64; 16];
        // SAFETY: msghdr is plain old data; all-zero (no name, no iov) is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control);
        // SAFETY: msg points at a live control buffer of msg_controllen bytes and no iov; the
        // kernel writes at most that many bytes.
        let r = unsafe {
            libc::recvmsg(
                fd.as_raw_fd(),
                &mut msg,
                libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) => Ok(n),
                Some(libc::EINTR) => continue,
                _ => Err(e),
            };
        }
        n += 1;
        let used = (msg.msg_controllen).min(std::mem::size_of_val(&control));
        let bytes: Vec<u8> = control
            .iter()
            .flat_map(|w| w.to_ne_bytes())
            .take(used)
            .collect();
        parse_control(&bytes, out);
        if enough(&out[start..]) {
            return Ok(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::raw::cmsg::encode as cmsg;

    fn ee(errno: u32, origin: u8, code: u8, info: u32, data: u32) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&errno.to_ne_bytes());
        v.extend_from_slice(&[origin, 0, code, 0]);
        v.extend_from_slice(&info.to_ne_bytes());
        v.extend_from_slice(&data.to_ne_bytes());
        v
    }

    /// Two ICMP errors queue two error-queue messages (errors are never merged, unlike
    /// zero-copy ranges): a reader told it has enough after the first leaves the second
    /// for the next read, with no extra call.
    #[test]
    fn read_errqueue_until_stops_where_told_and_leaves_the_rest() {
        use std::net::UdpSocket;
        use std::os::fd::AsFd;
        use std::time::Duration;
        let closed = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = closed.local_addr().unwrap();
        drop(closed);
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        crate::raw::socket::set_int(tx.as_fd(), libc::SOL_IP, IP_RECVERR, 1).unwrap();
        tx.connect(to).unwrap();
        let mut out = Vec::new();
        for _ in 0..2 {
            // Port unreachable: the send succeeds, its ICMP error lands in the queue.
            let _ = tx.send(b"x");
            // Wait until this send's error is queued (read nothing meanwhile); the bound
            // only keeps a broken kernel from hanging the test.
            let ev = crate::raw::socket::poll(
                tx.as_fd(),
                crate::raw::socket::PollFlags::empty(),
                Some(Duration::from_secs(10)),
            )
            .unwrap();
            assert!(
                ev.contains(crate::raw::socket::PollFlags::ERR),
                "no ICMP error queued"
            );
            // A connected UDP socket also records the error as its pending `SO_ERROR`,
            // which a later send would report: clear it, the queued message stays.
            let _ = tx.take_error();
        }
        let mut asked = 0;
        let n = read_errqueue_until(tx.as_fd(), &mut out, |read| {
            asked += 1;
            !read.is_empty()
        })
        .unwrap();
        assert_eq!((n, asked, out.len()), (1, 1, 1), "{out:?}");
        assert!(matches!(out[0], ErrqueueEntry::Other(_)), "{out:?}");
        // The second error is still queued; a full drain reads it and then sees EAGAIN.
        out.clear();
        assert_eq!(read_errqueue(tx.as_fd(), &mut out).unwrap(), 1, "{out:?}");
        assert_eq!(read_errqueue(tx.as_fd(), &mut out).unwrap(), 0);
    }

    #[test]
    fn decodes_zerocopy_ranges_and_copied_flag() {
        let mut buf = cmsg(libc::SOL_IP, IP_RECVERR, &ee(0, 5, 1, 7, 19));
        buf.extend(cmsg(
            libc::SOL_IPV6,
            IPV6_RECVERR,
            &ee(0, 5, 0, u32::MAX, 3),
        ));
        let mut out = Vec::new();
        parse_control(&buf, &mut out);
        assert_eq!(
            out,
            vec![
                ErrqueueEntry::Zerocopy {
                    lo: 7,
                    hi: 19,
                    copied: true
                },
                ErrqueueEntry::Zerocopy {
                    lo: u32::MAX,
                    hi: 3,
                    copied: false
                },
            ]
        );
    }

    #[test]
    fn other_errors_are_reported_not_taken_for_completions() {
        let buf = cmsg(libc::SOL_IP, IP_RECVERR, &ee(111, 2, 3, 0, 0));
        let mut out = Vec::new();
        parse_control(&buf, &mut out);
        assert!(matches!(out[0], ErrqueueEntry::Other(e) if e.errno == 111 && e.origin == 2));
    }

    #[test]
    fn truncated_or_foreign_messages_are_ignored() {
        let mut out = Vec::new();
        parse_control(&[1, 2, 3], &mut out);
        let mut bad = cmsg(libc::SOL_IP, IP_RECVERR, &ee(0, 5, 0, 1, 2));
        bad[0] = 200; // length beyond the buffer
        parse_control(&bad, &mut out);
        parse_control(&cmsg(libc::SOL_SOCKET, 1, &[0; 16]), &mut out);
        parse_control(&cmsg(libc::SOL_IP, IP_RECVERR, &[0; 8]), &mut out);
        assert!(out.is_empty());
    }
}
