//! The io_uring receive paths.
//!
//! * `uring` — a multishot `recv` (`IORING_RECV_MULTISHOT`) into a ring of provided buffers
//!   (`IORING_REGISTER_PBUF_RING`): one request keeps receiving, each CQE names the buffer the
//!   kernel filled. The kernel still copies (socket → provided buffer), as `recv` does; what
//!   it saves is the per-read syscall and buffer choice — the NEC paper's kernel pool mapped
//!   to the user, and the FreeBSD proposal's "receive into user-posted buffers".
//! * `zcrx` — io_uring zero-copy receive: the NIC's header split puts payloads straight into
//!   a registered area ([`zcnet_sys::uring::zcrx`]). Registration is tried when the connection is
//!   accepted; loopback, veth and virtio refuse it (`EOPNOTSUPP`; docs/measurements/kernel-findings.md §3), and the
//!   receiver then takes the `uring` path (or `copy` without io_uring), counting
//!   [`FallbackReason::Unsupported`], `rx_zcrx_refusals` and the errno (`rx_zcrx_errno`).
//!
//! Ownership: [`RxChunk`] borrows the receiver, so the buffer behind the previous chunk is
//! free again when `recv` is next called; it goes back to the kernel then (one tail update
//! per buffer). Ring sizes come from [`crate::ReceiverConfig`]: `buf_bytes` per provided buffer,
//! `map_bytes / buf_bytes` buffers (a power of two); the zcrx area is `map_bytes`.
//!
//! When the buffer ring runs dry the multishot request ends with `-ENOBUFS` (no
//! `IORING_CQE_F_MORE`); by the time that CQE is read every earlier buffer has been handed
//! back, so the request is simply armed again (`rx_uring_enobufs`, `rx_uring_rearms`). A
//! final CQE with `res == 0` is end of stream; other errors are classified like `recv`'s
//! (`ECONNRESET` → [`crate::Error::Reset`]). Every wait is bounded by the receiver's timeout.

use super::{copy::CopyRx, Receive, RxChunk};
use crate::error::{Error, Result};
use crate::path::FallbackReason;
use crate::path::RxPath;
use crate::stats::Stats;
use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;
use zcnet_sys::mem::{page_size, round_to_pages};
use zcnet_sys::uring::zcrx::{self, ZcLent, ZcrxEvent, ZcrxQueue};
use zcnet_sys::uring::{BufRingRecv, Lent, RecvEvent};

/// How long one wait inside a receive lasts before the deadline is checked again.
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// One step of a lending ring's stream.
#[derive(Debug)]
pub(crate) enum Step<L> {
    Data(L),
    End(i32),
}

/// What the two io_uring receive mechanisms have in common: a multishot request that lends
/// pieces of memory the kernel filled.
pub(crate) trait LendingRing: Send {
    type Lent: Send;
    /// The `-errno` of a final CQE that only asks for the request to be armed again.
    const REARM_ERRNO: i32;
    /// Whether the bytes arrived without a CPU copy.
    const ZERO_COPY: bool;
    /// Operation name for errors.
    const OP: &'static str;
    fn arm(&mut self, fd: BorrowedFd<'_>) -> io::Result<()>;
    fn needs_arm(&self) -> bool;
    fn next_step(&mut self, timeout: Duration) -> io::Result<Option<Step<Self::Lent>>>;
    fn bytes<'a>(&'a self, lent: &Self::Lent) -> &'a [u8];
    fn lent_len(lent: &Self::Lent) -> usize;
    fn give_back(&mut self, lent: Self::Lent);
}

impl LendingRing for BufRingRecv {
    type Lent = Lent;
    const REARM_ERRNO: i32 = libc::ENOBUFS;
    const ZERO_COPY: bool = false;
    const OP: &'static str = "recv (io_uring multishot)";
    fn arm(&mut self, fd: BorrowedFd<'_>) -> io::Result<()> {
        BufRingRecv::arm(self, fd)
    }
    fn needs_arm(&self) -> bool {
        BufRingRecv::needs_arm(self)
    }
    fn next_step(&mut self, timeout: Duration) -> io::Result<Option<Step<Lent>>> {
        Ok(self.next(timeout)?.map(|e| match e {
            RecvEvent::Data { buf, .. } => Step::Data(buf),
            RecvEvent::End { res } => Step::End(res),
        }))
    }
    fn bytes<'a>(&'a self, lent: &Lent) -> &'a [u8] {
        self.data(lent)
    }
    fn lent_len(lent: &Lent) -> usize {
        lent.len()
    }
    fn give_back(&mut self, lent: Lent) {
        self.recycle(lent)
    }
}

impl LendingRing for ZcrxQueue {
    type Lent = ZcLent;
    const REARM_ERRNO: i32 = libc::ENOSPC;
    const ZERO_COPY: bool = true;
    const OP: &'static str = "recv (io_uring zcrx)";
    fn arm(&mut self, fd: BorrowedFd<'_>) -> io::Result<()> {
        ZcrxQueue::arm(self, fd)
    }
    fn needs_arm(&self) -> bool {
        ZcrxQueue::needs_arm(self)
    }
    fn next_step(&mut self, timeout: Duration) -> io::Result<Option<Step<ZcLent>>> {
        Ok(self.next(timeout)?.map(|e| match e {
            ZcrxEvent::Data { buf, .. } => Step::Data(buf),
            ZcrxEvent::End { res } => Step::End(res),
        }))
    }
    fn bytes<'a>(&'a self, lent: &ZcLent) -> &'a [u8] {
        self.data(lent)
    }
    fn lent_len(lent: &ZcLent) -> usize {
        lent.len()
    }
    fn give_back(&mut self, lent: ZcLent) {
        self.recycle(lent)
    }
}

/// A receive path over a [`LendingRing`]: holds at most one lent piece (the one behind the
/// last chunk, or the rest of one `recv_into` cut short).
pub(crate) struct RingRx<R: LendingRing> {
    ring: R,
    /// The piece being consumed and how many of its bytes are consumed.
    cur: Option<(R::Lent, usize)>,
    armed_once: bool,
    eof: bool,
    /// Parked by `auto` ([`RingRx::park`]): hand out what was received, never arm again.
    parked: bool,
    /// A request `park` cancelled has not shown its end yet. Its `ECANCELED` may come after
    /// `unpark` — queued behind data it had received, or late when the cancel outlived its
    /// bound — and is the end of that request, not an error of the stream.
    cancel_pending: bool,
    timeout: Duration,
}

impl<R: LendingRing> std::fmt::Debug for RingRx<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingRx")
            .field("op", &R::OP)
            .field("holding", &self.cur.is_some())
            .field("eof", &self.eof)
            .finish()
    }
}

impl<R: LendingRing> RingRx<R> {
    fn new(ring: R, timeout: Duration) -> Self {
        RingRx {
            ring,
            cur: None,
            armed_once: false,
            eof: false,
            parked: false,
            cancel_pending: false,
            timeout,
        }
    }

    /// Bytes of the held piece not yet handed out.
    fn remaining(&self) -> usize {
        self.cur.as_ref().map_or(0, |(l, off)| R::lent_len(l) - off)
    }

    /// Gives the held piece back if it is used up.
    fn release_spent(&mut self) {
        if self.remaining() == 0 {
            if let Some((l, _)) = self.cur.take() {
                self.ring.give_back(l);
            }
        }
    }

    /// Makes sure a piece with unconsumed bytes is held; false at end of stream.
    fn fill(&mut self, fd: BorrowedFd<'_>, stats: &Stats) -> Result<bool> {
        if self.remaining() > 0 {
            return Ok(true);
        }
        self.release_spent();
        let d = crate::call::deadline(self.timeout);
        // Read once, and only here, where the ring may have nothing: a non-blocking
        // socket looks at the ring without waiting.
        let mut nonblocking = None;
        loop {
            if self.eof {
                return Ok(false);
            }
            if self.parked && self.ring.needs_arm() {
                // Parked and nothing queued: drained (not the end of the stream; see
                // `parked_drained`).
                return Ok(false);
            }
            if self.ring.needs_arm() {
                self.ring
                    .arm(fd)
                    .map_err(|e| Error::io("io_uring (arm receive)", e))?;
                if self.armed_once {
                    stats.add_rx_uring_rearms(1);
                }
                self.armed_once = true;
            }
            if d.expired() {
                return Err(d.timed_out(R::OP, 0));
            }
            let nb = *nonblocking.get_or_insert_with(|| crate::call::nonblocking(fd));
            let wait = if nb {
                Duration::ZERO
            } else {
                d.slice(WAIT_SLICE)
            };
            let step = self.ring.next_step(wait).map_err(|e| Error::io(R::OP, e))?;
            match step {
                // The armed multishot request stays armed: what arrives later is the next
                // call's.
                None if nb => {
                    return Err(Error::WouldBlock {
                        op: R::OP,
                        queued: 0,
                    })
                }
                None => {}
                Some(Step::Data(l)) => {
                    let n = R::lent_len(&l) as u64;
                    stats.add_rx_uring_cqes(1);
                    if R::ZERO_COPY {
                        stats.add_rx_mapped_bytes(n);
                    } else {
                        stats.add_rx_copied_bytes(n);
                    }
                    self.cur = Some((l, 0));
                    return Ok(true);
                }
                Some(Step::End(0)) => {
                    self.eof = true;
                    return Ok(false);
                }
                Some(Step::End(e)) if e == -R::REARM_ERRNO && e == -libc::ENOBUFS => {
                    stats.add_rx_uring_enobufs(1);
                }
                Some(Step::End(e)) if e == -R::REARM_ERRNO => {}
                // The end of a request `park` cancelled (parked still, or unparked since).
                Some(Step::End(e)) if self.cancel_pending && e == -libc::ECANCELED => {
                    self.cancel_pending = false;
                }
                Some(Step::End(e)) => {
                    return Err(Error::io(R::OP, io::Error::from_raw_os_error(-e)));
                }
            }
        }
    }

    /// Hands out up to `max` held bytes to `f` and marks them consumed.
    fn lend<T>(&mut self, max: usize, f: impl FnOnce(&[u8]) -> T) -> Option<T> {
        let (l, off) = self.cur.as_mut()?;
        let bytes = self.ring.bytes(l);
        let n = (bytes.len() - *off).min(max);
        let out = f(&bytes[*off..*off + n]);
        *off += n;
        Some(out)
    }
}

impl<R: LendingRing> Receive for RingRx<R> {
    fn recv<'a>(&'a mut self, fd: BorrowedFd<'_>, stats: &Stats) -> Result<Option<RxChunk<'a>>> {
        if !self.fill(fd, stats)? {
            return Ok(None);
        }
        let (l, off) = self.cur.as_mut().expect("filled");
        let start = *off;
        *off = R::lent_len(l);
        let (l, _) = self.cur.as_ref().expect("filled");
        Ok(Some(RxChunk::new(
            &self.ring.bytes(l)[start..],
            R::ZERO_COPY,
        )))
    }

    fn recv_into(&mut self, fd: BorrowedFd<'_>, buf: &mut [u8], stats: &Stats) -> Result<usize> {
        if buf.is_empty() || !self.fill(fd, stats)? {
            return Ok(0);
        }
        let n = self
            .lend(buf.len(), |b| {
                buf[..b.len()].copy_from_slice(b);
                b.len()
            })
            .unwrap_or(0);
        self.release_spent();
        Ok(n)
    }

    fn take_buffered(
        &mut self,
        max: usize,
        sink: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<usize> {
        if max == 0 || self.remaining() == 0 {
            return Ok(0);
        }
        let (l, off) = self.cur.as_mut().expect("remaining > 0");
        let bytes = self.ring.bytes(l);
        let n = (bytes.len() - *off).min(max);
        sink(&bytes[*off..*off + n])?;
        *off += n;
        self.release_spent();
        Ok(n)
    }

    fn recv_lend(
        &mut self,
        fd: BorrowedFd<'_>,
        _scratch: &mut [u8],
        max: usize,
        stats: &Stats,
        sink: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<usize> {
        if max == 0 || !self.fill(fd, stats)? {
            return Ok(0);
        }
        self.take_buffered(max, sink)
    }
}

/// How long [`RingRx::park`] waits for the cancelled request's final completion.
const PARK_BOUND: Duration = Duration::from_millis(500);

impl RingRx<BufRingRecv> {
    /// Stops the multishot request so that plain `recv` may read the socket next (`auto`
    /// leaving this path): cancels it and waits for its final completion. What it received
    /// before stays queued and is handed out first; until [`RingRx::unpark`] the request is
    /// not armed again. False if the end of the request was not seen in time — then it may
    /// still take bytes from the socket, and plain `recv` must not run.
    pub(crate) fn park(&mut self) -> bool {
        self.parked = true;
        self.cancel_pending = true;
        self.ring.disarm(PARK_BOUND)
    }

    /// Lets the next receive arm the request again (`auto` coming back to this path).
    pub(crate) fn unpark(&mut self) {
        self.parked = false;
    }

    /// Whether a piece with bytes not yet handed out is held.
    pub(crate) fn has_held(&self) -> bool {
        self.remaining() > 0
    }

    /// Whether [`RingRx::park`] was called (and not undone).
    pub(crate) fn is_parked(&self) -> bool {
        self.parked
    }

    /// Parked, and nothing left to hand out: the socket is plain `recv`'s now. Takes the
    /// next queued piece, if there is one, so the answer is final (a piece taken stays held
    /// for the next receive).
    pub(crate) fn parked_drained(&mut self, fd: BorrowedFd<'_>, stats: &Stats) -> Result<bool> {
        if !self.parked || self.remaining() > 0 {
            return Ok(false);
        }
        Ok(!self.fill(fd, stats)? && !self.eof)
    }
}

/// The `uring` receive path: multishot `recv` into provided buffers.
pub(crate) type UringRx = RingRx<BufRingRecv>;
/// The `zcrx` receive path: io_uring zero-copy receive into a registered area.
pub(crate) type ZcrxRx = RingRx<ZcrxQueue>;

/// Provided-buffer ring geometry from a receiver config: `(entries, buffer bytes)`.
pub(crate) fn ring_geometry(buf_bytes: usize, map_bytes: usize) -> (u16, usize) {
    let size = round_to_pages(buf_bytes);
    let n = (map_bytes / size).clamp(1, 1 << 15);
    // Largest power of two not above n.
    let entries = 1u16 << (usize::BITS - 1 - n.leading_zeros());
    (entries, size)
}

/// What the io_uring receive paths need from the receiver's configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UringRxParams {
    /// `Uring` or `Zcrx`: which to try first.
    pub path: RxPath,
    /// Bytes per provided buffer.
    pub buf_bytes: usize,
    /// Bytes of all provided buffers together (or of the zcrx area).
    pub map_bytes: usize,
    /// The hardware queue a zcrx area is registered on.
    pub zcrx_queue: u32,
    /// How long a receive waits.
    pub timeout: Duration,
}

/// A `uring` receive path for `cfg`.
pub(crate) fn uring_rx(cfg: &UringRxParams) -> io::Result<UringRx> {
    let (entries, size) = ring_geometry(cfg.buf_bytes, cfg.map_bytes);
    Ok(RingRx::new(BufRingRecv::new(entries, size)?, cfg.timeout))
}

/// Registers a zcrx queue for the connection on `fd`: the interface holding the socket's
/// local address (in the calling thread's network namespace), hardware queue
/// `cfg.zcrx_queue`, an area of `cfg.map_bytes`. The error carries the kernel's errno
/// (`ENODEV` when no interface here holds the address).
pub(crate) fn zcrx_rx(fd: BorrowedFd<'_>, cfg: &UringRxParams) -> io::Result<ZcrxRx> {
    let local = socket2::SockRef::from(&fd)
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EAFNOSUPPORT))?;
    let ifindex = zcrx::ifindex_for_addr(local.ip())?
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENODEV))?;
    let area = round_to_pages(cfg.map_bytes);
    let rq_entries = (area / page_size()).clamp(64, 1 << 15) as u32;
    let q = ZcrxQueue::register(ifindex, cfg.zcrx_queue, area, rq_entries)?;
    Ok(RingRx::new(q, cfg.timeout))
}

/// The receive path for `cfg.path` `uring` or `zcrx`, with the fallbacks the module doc
/// describes; returns the path in effect.
pub(crate) fn setup(
    fd: BorrowedFd<'_>,
    cfg: &UringRxParams,
    stats: &Stats,
) -> (Box<dyn Receive>, RxPath) {
    if cfg.path == RxPath::Zcrx {
        match zcrx_rx(fd, cfg) {
            Ok(rx) => return (Box::new(rx), RxPath::Zcrx),
            Err(e) => {
                stats.fallback(FallbackReason::Unsupported, 0);
                stats.add_rx_zcrx_refusals(1);
                stats.set_rx_zcrx_errno(e.raw_os_error().unwrap_or(libc::EIO));
            }
        }
    }
    match uring_rx(cfg) {
        Ok(rx) => (Box::new(rx), RxPath::Uring),
        Err(_) => {
            // No io_uring (or no provided-buffer rings): every receive copies, and says so.
            stats.fallback(FallbackReason::Unsupported, 0);
            (
                Box::new(CopyRx::new(cfg.buf_bytes, cfg.timeout)),
                RxPath::Copy,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_geometry_is_a_power_of_two_of_whole_pages() {
        let p = page_size();
        assert_eq!(ring_geometry(256 * 1024, 4 << 20), (16, 256 * 1024));
        let two = round_to_pages(5000);
        assert_eq!(ring_geometry(5000, 3 * two), (2, two));
        assert_eq!(ring_geometry(4096, 1), (1, p));
        assert_eq!(ring_geometry(p, 1 << 40).0, 1 << 15);
        assert_eq!(ring_geometry(p, 7 * p), (4, p));
    }

    /// Reads with `recv_into` until `to` bytes of the stream arrived, checking each against
    /// the pattern from `*pos`.
    fn read_to(
        rx: &mut UringRx,
        fd: BorrowedFd<'_>,
        stats: &Stats,
        pos: &mut u64,
        to: u64,
    ) -> Result<()> {
        let mut buf = vec![0u8; 100_003];
        while *pos < to {
            let n = rx.recv_into(fd, &mut buf, stats)?;
            assert!(n > 0, "stream ended at {pos}");
            assert_eq!(
                &buf[..n],
                zcnet_testbed::pattern::pattern(*pos, n),
                "at {pos}"
            );
            *pos += n as u64;
        }
        Ok(())
    }

    /// `park` cancels the multishot request; its final `ECANCELED` can sit queued behind data
    /// the request received first. `auto` may unpark before that end is read (the cost check
    /// came back to `uring`): the end must then be taken as the old request's, and the ring
    /// armed again — not returned as an error of the stream (seen once under load in CI).
    #[cfg_attr(
        not(zcnet_has_uring),
        ignore = "needs io_uring (Linux 6.0, kernel.io_uring_disabled 0)"
    )]
    #[test]
    fn an_unpark_before_the_cancelled_end_is_read_keeps_the_stream() {
        use std::io::Write;
        use std::os::fd::AsFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut tx = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (sock, _) = l.accept().unwrap();
        let params = UringRxParams {
            path: RxPath::Uring,
            buf_bytes: 64 << 10,
            map_bytes: 4 << 20,
            zcrx_queue: 0,
            timeout: Duration::from_secs(20),
        };
        let mut rx = uring_rx(&params)
            .expect("an io_uring provided-buffer ring, where the build found io_uring");
        let stats = Stats::default();
        let fd = sock.as_fd();
        let send = |tx: &mut std::net::TcpStream, from: u64, len: usize| {
            tx.write_all(zcnet_testbed::pattern::pattern(from, len))
                .unwrap();
        };
        let mut pos = 0u64;
        // Armed, and receiving.
        send(&mut tx, 0, 64 << 10);
        read_to(&mut rx, fd, &stats, &mut pos, 1).unwrap();
        // More bytes complete into the ring before the cancel, so its end queues behind them.
        send(&mut tx, 64 << 10, 256 << 10);
        std::thread::sleep(Duration::from_millis(100));
        assert!(rx.park(), "the cancelled request ended within the bound");
        assert!(!rx.parked_drained(fd, &stats).unwrap(), "data still queued");
        rx.unpark();
        // Read past the queued data and the cancelled end, into bytes a new request takes.
        send(&mut tx, 320 << 10, 1 << 20);
        read_to(&mut rx, fd, &stats, &mut pos, (320 << 10) + (1 << 20)).unwrap();
        drop(tx);
        let mut buf = [0u8; 16];
        assert_eq!(
            rx.recv_into(fd, &mut buf, &stats).unwrap(),
            0,
            "then the end"
        );
    }
}
