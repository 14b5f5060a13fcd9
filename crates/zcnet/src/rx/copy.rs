//! The copy receive path: `recv(2)`.

use super::place::PlacedBuf;
use super::{Receive, RxChunk};
use crate::error::{Error, Result};
use crate::stats::Stats;
use std::os::fd::BorrowedFd;
use std::time::Duration;
use zcnet_sys::raw::socket::{PollFlags, RecvFlags};

/// `recv` into `buf`, retrying `EINTR`, within the running call's deadline (`timeout` from
/// now outside a call; `crate::call`): with a bound the `recv` is `MSG_DONTWAIT` and the
/// wait is ours; a non-blocking socket gives [`Error::WouldBlock`].
pub(crate) fn recv_some(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    stats: &Stats,
    timeout: Duration,
) -> Result<usize> {
    if buf.is_empty() {
        return Ok(0);
    }
    let d = crate::call::deadline(timeout);
    let flags = if d.dontwait() {
        RecvFlags::DONTWAIT
    } else {
        RecvFlags::empty()
    };
    loop {
        match crate::fault::recv(fd, buf, flags) {
            Ok(n) => {
                stats.add_rx_copied_bytes(n as u64);
                return Ok(n);
            }
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                if d.expired() {
                    return Err(d.timed_out("recv", 0));
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                d.wait_fd(fd, PollFlags::IN, "recv", 0)?
            }
            Err(e) => return Err(Error::io("recv", e)),
        }
    }
}

/// The copy path: one owned buffer, refilled by each `recv` at the page offset that follows
/// the stream (`super::place`).
#[derive(Debug)]
pub(crate) struct CopyRx {
    buf: PlacedBuf,
    timeout: Duration,
}

impl CopyRx {
    pub(crate) fn new(buf_bytes: usize, timeout: Duration) -> Self {
        CopyRx {
            buf: PlacedBuf::new(buf_bytes),
            timeout,
        }
    }
}

impl Receive for CopyRx {
    fn recv<'a>(&'a mut self, fd: BorrowedFd<'_>, stats: &Stats) -> Result<Option<RxChunk<'a>>> {
        let timeout = self.timeout;
        let r = self
            .buf
            .read(usize::MAX, |space| recv_some(fd, space, stats, timeout))?;
        Ok((!r.is_empty()).then(|| RxChunk::new(self.buf.bytes(r), false)))
    }

    fn recv_into(&mut self, fd: BorrowedFd<'_>, buf: &mut [u8], stats: &Stats) -> Result<usize> {
        let n = recv_some(fd, buf, stats, self.timeout)?;
        self.buf.advance(n as u64);
        Ok(n)
    }

    /// Bytes taken past this path (spliced, or read by another path of `auto`) still move
    /// the stream offset the next read is placed by.
    fn socket_bytes_taken(&mut self, n: u64) {
        self.buf.advance(n);
    }

    /// Every `recv` hands out all it read, so nothing is ever held: the socket is free.
    fn socket_handover_ok(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rx::place::SKEW;
    use std::io::Write;
    use std::os::fd::AsFd;

    /// Over a real TCP connection: every chunk the copy path hands out starts at the page
    /// offset `SKEW` ahead of its stream offset, bytes read into a caller's buffer move that
    /// offset too, and every byte arrives in order.
    #[test]
    fn copy_reads_are_placed_by_the_stream_offset_and_lose_nothing() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 253) as u8).collect();
        let sent = data.clone();
        let w = std::thread::spawn(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            for c in sent.chunks(10_007) {
                s.write_all(c).unwrap();
            }
        });
        let (s, _) = l.accept().unwrap();
        let stats = Stats::default();
        let mut rx = CopyRx::new(64 << 10, Duration::from_secs(10));
        let page = zcnet_sys::mem::page_size();
        let mut got: Vec<u8> = Vec::with_capacity(data.len());
        let mut k = 0;
        loop {
            k += 1;
            if k % 5 == 0 {
                let mut b = [0u8; 777];
                let n = rx.recv_into(s.as_fd(), &mut b, &stats).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&b[..n]);
                continue;
            }
            let Some(c) = rx.recv(s.as_fd(), &stats).unwrap() else {
                break;
            };
            assert_eq!(
                c.as_ptr() as usize % page,
                (got.len() + SKEW) % page,
                "read {k} at stream offset {}",
                got.len()
            );
            got.extend_from_slice(&c);
        }
        w.join().unwrap();
        assert_eq!(got.len(), data.len());
        assert!(got == data, "bytes differ");
    }
}
