//! [`ZcUdpSocket`]: zcnet's whole messages over UDP (`zcnet_msg`, `docs/msg.md`) on
//! tokio's reactor — out as GSO batches (`UDP_SEGMENT`) with `MSG_ZEROCOPY` loans, in with
//! `UDP_GRO`, every lost message reported by id. Same wire format as the blocking
//! `MsgSender`/`MsgReceiver`, and the same sender state machine ([`zcnet_msg::Framer`]):
//! only the waiting differs.
//!
//! The socket sits in its own epoll instance, as a [`crate::ZcStream`] does
//! (`readiness.rs`): completions raise `EPOLLERR`, which tokio would read as a closed write
//! side and spin on.

use crate::choice::Go;
use crate::conn::Conn;
use crate::driver;
use crate::loan::{Loan, Waiting};
use crate::readiness::Direction;
use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{oneshot, Notify};
use zcnet::{Error, FallbackReason, Pool, Stats};
use zcnet_msg::wire::Layout;
use zcnet_msg::{
    Framer, MsgBuf, MsgConfig, MsgError, MsgEvent, MsgRing, MsgStats, MsgTx, Outgoing, Reassembly,
};
use zcnet_sys::raw::socket::RecvFlags;
use zcnet_sys::raw::udp_msg::{self, MAX_UDP_PAYLOAD_V4, MAX_UDP_PAYLOAD_V6, UDP_MAX_SEGMENTS};
use zcnet_sys::raw::zerocopy as zc;

/// Zero-copy attempts after `ENOBUFS` (each after draining completions and yielding)
/// before the rest of the message is copied.
const ENOBUFS_RETRIES: u32 = 3;

/// `SEND_ZC` requests [`ZcUdpSocket::send_lent`] leaves in the ring's submission queue
/// before it submits them itself (eight 64 KiB messages); fewer wait for the sending task
/// to yield, when the ring's flusher submits them ([`UdpRing`]).
const SUBMIT_AT: usize = 16;

/// How one message went out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MsgSent {
    /// The message's id (what a receiver's [`zcnet_msg::Lost`] names).
    pub id: u64,
    /// Wire bytes (headers included) sent zero-copy (`MSG_ZEROCOPY`, or `SEND_ZC` with
    /// [`MsgTx::Uring`]).
    pub zerocopy: usize,
    /// Wire bytes sent by copy (the policy's choice or a fallback).
    pub copied: usize,
    /// Whether the completion said the kernel copied the zero-copy bytes anyway
    /// (`SO_EE_CODE_ZEROCOPY_COPIED`: loopback, a veth into a namespace). `None` when the
    /// send returned before its completion ([`ZcUdpSocket::send_lent`]).
    pub copied_anyway: Option<bool>,
    /// Why bytes were copied, if they were.
    pub fallback: Option<FallbackReason>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn msg_err(e: MsgError) -> io::Error {
    match e {
        MsgError::Io(e) => e.into(),
        e => io::Error::new(io::ErrorKind::InvalidInput, e),
    }
}

/// [`MsgTx::Uring`]'s ring and tokio's watch on it: the ring's eventfd, signalled only
/// while a task waits for completions ([`MsgRing::arm`]), so a busy sender's completions
/// wake nobody. Made with the pool.
///
/// Submissions are batched: [`ZcUdpSocket::send_lent`] queues a message's requests and
/// returns; they are submitted, several messages in one `io_uring_enter`, when
/// [`SUBMIT_AT`] requests wait or half the pool is in the ring, before anything waits for a
/// completion or sends by another path, and otherwise by the flusher task ([`flusher`]),
/// which the first queued request wakes and tokio runs as soon as the sending task yields.
/// Into the sink bench's veth, `io_uring_enter` per message was a fifth of the sender's
/// CPU (docs/tokio.md, round 14). The price is latency while a task keeps the
/// thread: a message queued by a task that then computes for a millisecond without an
/// `.await` leaves a millisecond later — as tokio's own rules for tasks already expect.
#[derive(Debug)]
struct UdpRing {
    state: Mutex<RingState>,
    ready: AsyncFd<OwnedFd>,
    /// Wakes the flusher.
    flush: Notify,
}

#[derive(Debug)]
struct RingState {
    ring: MsgRing,
    /// Tasks in [`UdpRing::reap_until`]: the eventfd is armed while there are any.
    waiters: usize,
    /// The flusher was woken and has not run since: no need to wake it again.
    flush_asked: bool,
}

impl UdpRing {
    fn new(sock: &UdpSocket, pool: &Pool, gso: Option<u16>, stats: &Stats) -> io::Result<Self> {
        let mut ring = MsgRing::new(sock.as_fd(), pool, gso, true, stats)?;
        let watch = ring
            .take_watch()
            .ok_or_else(|| io::Error::other("a polled ring without its eventfd"))?;
        Ok(UdpRing {
            ready: zcnet_sys::reactor::register_owned(watch, Interest::READABLE)?,
            state: Mutex::new(RingState {
                ring,
                waiters: 0,
                flush_asked: false,
            }),
            flush: Notify::new(),
        })
    }

    fn ring(&self) -> MutexGuard<'_, RingState> {
        lock(&self.state)
    }

    /// Submits what waits in the submission queue (no system call when nothing does).
    fn submit(&self, stats: &Stats) {
        self.ring().ring.submit(stats);
    }

    /// Reaps until `done` says so, waiting on tokio's reactor for the eventfd in between.
    /// Cancel-safe: dropping the future disarms what it armed.
    async fn reap_until(
        &self,
        stats: &Stats,
        mut done: impl FnMut(&mut MsgRing) -> bool,
    ) -> io::Result<()> {
        {
            let mut st = self.ring();
            st.waiters += 1;
            st.ring.arm(true);
            // Nothing queued can complete before it is submitted.
            st.ring.submit(stats);
        }
        let _armed = Armed(self);
        loop {
            {
                // Armed before the first look: a completion posted after it signals the
                // eventfd, one posted before it is found here.
                let mut st = self.ring();
                st.ring.reap(stats);
                if done(&mut st.ring) {
                    return Ok(());
                }
            }
            let mut ready = self.ready.readable().await?;
            self.ring().ring.clear_watch();
            // tokio keeps the readiness if the eventfd signalled again after this guard
            // was made.
            ready.clear_ready();
        }
    }
}

/// The ring's flusher: one task per ring, woken when `send_lent` leaves requests queued,
/// submits them. It holds the connection, so the socket the requests name stays open until
/// it has submitted the last of them (the kernel resolves the descriptor at submission);
/// it ends once the socket is dropped (the connection closed).
///
/// On an unregistered ring (the pool's registration refused: `RLIMIT_MEMLOCK` without
/// `CAP_IPC_LOCK`) it also stays until every submitted request's result is in, and sends by
/// copy each batch the kernel refused past that limit — a refusal that can come long after
/// the submission, once the request found socket room (`zcnet_msg::MsgRing`). So a refused
/// batch leaves at once, whether or not the application calls again, and is never lost to
/// the receiver's reassembly timeout.
async fn flusher(ring: Arc<UdpRing>, conn: Arc<Conn<UdpSocket>>) {
    loop {
        ring.flush.notified().await;
        loop {
            let (due, refused) = {
                let mut st = ring.ring();
                st.flush_asked = false;
                st.ring.submit(&conn.stats);
                if st.ring.awaits_results() {
                    st.ring.reap(&conn.stats);
                }
                (st.ring.results_due(), st.ring.has_refused())
            };
            // A batch that cannot be sent now stays queued for the next call to report.
            if refused && send_refused(&ring, &conn).await.is_err() {
                break;
            }
            if due == 0 {
                break;
            }
            // Until a result comes, or requests were queued since (they count as due but
            // cannot complete before they are submitted).
            let waited = ring
                .reap_until(&conn.stats, |r| {
                    r.results_due() == 0 || r.unsubmitted() > 0 || r.has_refused()
                })
                .await;
            if waited.is_err() {
                break;
            }
        }
        if conn.is_closed() {
            return;
        }
    }
}

/// Sends by copy, in order, the batches the ring's kernel refused for want of pinnable
/// memory (`zcnet_msg::MsgRing::take_refused`), each counted as a fallback with its
/// reason. Cancel-safe: a batch not yet sent goes back to the ring, first in line.
async fn send_refused(r: &UdpRing, conn: &Conn<UdpSocket>) -> io::Result<()> {
    loop {
        let Some(batch) = r.ring().ring.take_refused() else {
            return Ok(());
        };
        let mut held = RefusedHeld(r, Some(batch));
        let b = held.1.as_ref().expect("held");
        let iov = [IoSlice::new(&b.wire)];
        poll_fn(|cx| conn.poll_io(cx, Direction::Write, || conn.send_gso(&iov, false, b.gso)))
            .await?;
        // `send_gso` counted the copied bytes and call; the reason here.
        if let Some(b) = held.1.take() {
            conn.stats.fallback(b.reason, b.wire.len() as u64);
        }
    }
}

/// A refused batch on its way out by copy: back to the ring's queue, first, if its send is
/// cancelled or fails.
struct RefusedHeld<'a>(&'a UdpRing, Option<zcnet_msg::Refused>);

impl Drop for RefusedHeld<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.1.take() {
            self.0.ring().ring.put_back_refused(b);
        }
    }
}

/// One waiter of [`UdpRing::reap_until`]; the last one out disarms the eventfd.
struct Armed<'a>(&'a UdpRing);

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        let mut st = self.0.ring();
        st.waiters -= 1;
        if st.waiters == 0 {
            st.ring.arm(false);
        }
    }
}

/// The receiving half's state, used by one `recv` at a time.
#[derive(Debug)]
struct RxState {
    buf: Vec<u8>,
    table: Reassembly,
}

/// Whole messages over one UDP socket, asynchronously: zcnet's messages ([`zcnet_msg`],
/// the same wire format as the blocking `MsgSender`/`MsgReceiver`) on tokio's reactor.
///
/// * Out: each message is cut into datagrams with a 28-byte header each, many per
///   `sendmsg` as one GSO batch (`UDP_SEGMENT`): [`ZcUdpSocket::send_slice`] copies;
///   [`ZcUdpSocket::buffer`] + [`ZcUdpSocket::send_lent`] (or [`ZcUdpSocket::send_zc`])
///   send a pool buffer with `MSG_ZEROCOPY` (or io_uring `SEND_ZC`, [`MsgTx::Uring`]).
/// * In: [`ZcUdpSocket::recv`] reads with `UDP_GRO` and reassembles; it returns a
///   [`MsgEvent`]: a whole message, or ids lost (a missing fragment, a missing message
///   once a later id or the sender's mark came and the reorder window passed).
/// * End: [`ZcUdpSocket::send_mark`] tells the receiver how many messages were sent, so a
///   lost tail is reported too.
///
/// ```no_run
/// use zcnet_tokio::{MsgConfig, MsgEvent, MsgTx, ZcUdpSocket};
/// # async fn f() -> std::io::Result<()> {
/// let cfg = MsgConfig::new(MsgTx::Zerocopy);
/// let rx = ZcUdpSocket::bind("127.0.0.1:0".parse().unwrap(), &cfg)?;
/// let tx = ZcUdpSocket::connect(rx.local_addr()?, &cfg)?;
/// let id = tx.send_slice(&vec![1u8; 64 << 10]).await?;
/// tx.send_mark().await?;
/// match rx.recv().await? {
///     MsgEvent::Message(m) => assert_eq!((m.id, m.len()), (id, 64 << 10)),
///     MsgEvent::Lost(l) => println!("lost ids {:?}: {:?}", l.ids(), l.reason),
/// }
/// # Ok(()) }
/// ```
///
/// Sends need a connected socket ([`ZcUdpSocket::connect`]); receiving works on any bound
/// one ([`ZcUdpSocket::bind`]). Every method takes `&self`: tasks may share it in an `Arc`,
/// each message's datagrams numbered under one lock so concurrent senders never mix ids.
#[derive(Debug)]
pub struct ZcUdpSocket {
    conn: Arc<Conn<UdpSocket>>,
    framer: Mutex<Framer>,
    /// The framer's layout (fixed once made).
    layout: Layout,
    cfg: MsgConfig,
    zerocopy: bool,
    /// Made on first use.
    pool: OnceLock<Pool>,
    /// [`MsgTx::Uring`]: made with the pool; `None` inside when io_uring cannot send here.
    uring: OnceLock<Option<Arc<UdpRing>>>,
    /// Where the ring's flusher is spawned.
    runtime: tokio::runtime::Handle,
    rx: tokio::sync::Mutex<RxState>,
    gro: bool,
}

impl ZcUdpSocket {
    /// A socket bound to `addr` (port 0 picks one) for receiving; `UDP_GRO` on as
    /// [`MsgConfig::gro`] says. Must be called inside a tokio runtime with I/O enabled.
    pub fn bind(addr: SocketAddr, cfg: &MsgConfig) -> io::Result<ZcUdpSocket> {
        cfg.validate().map_err(msg_err)?;
        let sock = UdpSocket::bind(addr)?;
        Self::wrap(sock, cfg, false)
    }

    /// A socket connected to `peer` for sending (and receiving from it), `SO_ZEROCOPY` on
    /// when [`MsgConfig::tx`] asks for it. The datagram size comes from the path MTU
    /// (`IP_MTU`) unless [`MsgConfig::segment`] fixes it.
    pub fn connect(peer: SocketAddr, cfg: &MsgConfig) -> io::Result<ZcUdpSocket> {
        cfg.validate().map_err(msg_err)?;
        let local: SocketAddr = match peer {
            SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
            SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let sock = UdpSocket::bind(local)?;
        let zerocopy = cfg.tx.is_zerocopy() && zc::set_so_zerocopy(sock.as_fd()).is_ok();
        sock.connect(peer)?;
        Self::wrap(sock, cfg, zerocopy)
    }

    /// Takes over a bound (and, for sending, connected) socket — made in another network
    /// namespace, say. `SO_ZEROCOPY` is turned on when [`MsgConfig::tx`] asks for it.
    pub fn from_std(sock: UdpSocket, cfg: &MsgConfig) -> io::Result<ZcUdpSocket> {
        cfg.validate().map_err(msg_err)?;
        let zerocopy = cfg.tx.is_zerocopy()
            && (zc::so_zerocopy(sock.as_fd()).unwrap_or(false)
                || zc::set_so_zerocopy(sock.as_fd()).is_ok());
        Self::wrap(sock, cfg, zerocopy)
    }

    fn wrap(sock: UdpSocket, cfg: &MsgConfig, zerocopy: bool) -> io::Result<ZcUdpSocket> {
        let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        sock.set_nonblocking(true)?;
        let peer = sock.peer_addr().ok();
        let (ip_udp, max_gso) = match sock.local_addr()?.ip() {
            IpAddr::V4(_) => (28, MAX_UDP_PAYLOAD_V4),
            IpAddr::V6(_) => (48, MAX_UDP_PAYLOAD_V6),
        };
        let segment = match (cfg.segment, peer) {
            (Some(s), _) => s,
            (None, Some(p)) => {
                let mtu = udp_msg::path_mtu(sock.as_fd(), p.ip())?;
                (mtu as usize).saturating_sub(ip_udp).min(max_gso)
            }
            // Not connected: nothing is sent, the layout only has to be valid.
            (None, None) => 1500 - ip_udp,
        };
        let layout = Layout::new(segment)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let per_call = (max_gso / segment).clamp(1, UDP_MAX_SEGMENTS);
        let mut session = [0u8; 4];
        getrandom::fill(&mut session).map_err(|e| io::Error::other(e.to_string()))?;
        let framer = Framer::new(
            layout,
            u32::from_ne_bytes(session),
            cfg.max_message,
            per_call,
            cfg.gso,
        );
        let (gro, _) = cfg
            .prepare_receive_socket(sock.as_fd(), framer.stats())
            .map_err(msg_err)?;
        let stats = Arc::new(Stats::new());
        if cfg.tx.is_zerocopy() && !zerocopy && peer.is_some() {
            stats.fallback(FallbackReason::Unsupported, 0);
        }
        // No cost check: a message socket's sends are the Framer's batches, and the
        // policy's size threshold and COPIED demotion decide alone.
        let choice = crate::choice::SendChoice::new(cfg.policy, false);
        // A demoting policy never asks on a local route (the kernel copies there); a test
        // that wants zero-copy in flight on loopback says `Policy::always()`.
        let local = crate::conn::starts_local(&sock, &cfg.policy, false);
        let conn = Arc::new(Conn::new(sock, zerocopy, local, choice, stats)?);
        runtime.spawn(driver::drive(conn.clone()));
        let runtime = runtime.clone();
        Ok(ZcUdpSocket {
            conn,
            layout: framer.layout(),
            framer: Mutex::new(framer),
            cfg: cfg.clone(),
            zerocopy,
            pool: OnceLock::new(),
            uring: OnceLock::new(),
            runtime,
            rx: tokio::sync::Mutex::new(RxState {
                buf: vec![0; cfg.datagram_buffer],
                table: Reassembly::new(cfg.reassembly, cfg.max_message),
            }),
            gro,
        })
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.conn.socket().local_addr()
    }

    /// The connected peer.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.conn.socket().peer_addr()
    }

    /// Whether `SO_ZEROCOPY` is on.
    pub fn zerocopy_enabled(&self) -> bool {
        self.zerocopy
    }

    /// Whether `UDP_GRO` is on.
    pub fn gro_enabled(&self) -> bool {
        self.gro
    }

    /// Byte counters: copy vs `MSG_ZEROCOPY` (headers included), bytes the kernel copied
    /// anyway, `ENOBUFS`, fallbacks by reason — zcnet's [`Stats`], as for streams.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.conn.stats
    }

    /// Message counters, both directions: messages, datagrams, GSO calls and fallbacks,
    /// losses by reason.
    pub fn msg_stats(&self) -> Arc<MsgStats> {
        lock(&self.framer).stats().clone()
    }

    /// Datagram size, header included.
    pub fn segment(&self) -> usize {
        lock(&self.framer).layout().segment()
    }

    /// Payload bytes per datagram.
    pub fn payload_per_datagram(&self) -> usize {
        lock(&self.framer).layout().payload_per_datagram()
    }

    /// Datagrams per `sendmsg` now.
    pub fn datagrams_per_call(&self) -> usize {
        lock(&self.framer).datagrams_per_call()
    }

    /// Pool buffers free for [`ZcUdpSocket::buffer`] now (none before the pool is made):
    /// a buffer the kernel still reads is not among them.
    pub fn buffers_available(&self) -> usize {
        self.pool.get().map_or(0, Pool::available)
    }

    /// Buffers the kernel may still read.
    pub fn loans_in_flight(&self) -> usize {
        self.conn.loans_in_flight() + self.made_ring().map_or(0, |r| r.ring().ring.held())
    }

    /// Whether messages lent with [`ZcUdpSocket::send_lent`] go through io_uring
    /// (`SEND_ZC`, [`MsgTx::Uring`]): false before the first [`ZcUdpSocket::buffer`] made
    /// the pool, and where io_uring cannot send (then `MSG_ZEROCOPY`, counted as
    /// [`FallbackReason::Unsupported`], or [`FallbackReason::Memlock`] when the rings were
    /// refused for want of locked memory).
    pub fn uring_enabled(&self) -> bool {
        self.made_ring().is_some()
    }

    fn made_ring(&self) -> Option<&UdpRing> {
        self.uring.get().and_then(Option::as_deref)
    }

    /// Submits the ring's queued requests before a message leaves by another path, so that
    /// messages leave in the order they were sent.
    fn submit_queued(&self) {
        if let Some(r) = self.made_ring() {
            r.submit(&self.conn.stats);
        }
    }

    /// [`MsgTx::Uring`]'s ring, made once the pool exists (its buffers are what it
    /// registers); `None` for the other engines, before the pool, or where io_uring cannot
    /// send here (counted once).
    fn ring(&self) -> Option<&UdpRing> {
        if self.cfg.tx != MsgTx::Uring || !self.zerocopy {
            return None;
        }
        let pool = self.pool.get()?;
        self.uring
            .get_or_init(|| {
                let gso = (lock(&self.framer).datagrams_per_call() > 1)
                    .then_some(self.layout.segment() as u16);
                match UdpRing::new(self.conn.socket(), pool, gso, &self.conn.stats) {
                    Ok(r) => {
                        let r = Arc::new(r);
                        self.runtime.spawn(flusher(r.clone(), self.conn.clone()));
                        Some(r)
                    }
                    Err(e) => {
                        let reason = MsgRing::unavailable_reason(&e);
                        self.conn.stats.fallback(reason, 0);
                        None
                    }
                }
            })
            .as_deref()
    }

    /// Sends `data` as one message by copying (the slice may be reused at once): an iovec
    /// interleaves headers and `data`, so the kernel copies once and user space never.
    /// Returns the message's id. A message interrupted by an error (or a cancelled future)
    /// has used its id: the receiver reports it lost.
    pub async fn send_slice(&self, data: &[u8]) -> io::Result<u64> {
        self.submit_queued();
        let mut out = lock(&self.framer).begin(data.len()).map_err(msg_err)?;
        let mut headers = Vec::new();
        lock(&self.framer).headers(&out, &mut headers);
        loop {
            let step = poll_fn(|cx| {
                self.conn.poll_io(cx, Direction::Write, || {
                    let mut f = lock(&self.framer);
                    let Some(batch) = f.next_batch(&out) else {
                        return Ok(true);
                    };
                    let iov = f.interleave(&headers, data, batch.fragments.clone());
                    let r = self.conn.send_gso(&iov, false, batch.gso).map(|(n, _)| n);
                    f.after(&mut out, &batch, r).map(|_| false)
                })
            })
            .await?;
            if step {
                lock(&self.framer).finish(&out, false);
                return Ok(out.id());
            }
        }
    }

    /// Tells the receiver how many messages this socket has sent (a mark,
    /// `zcnet_msg::wire`), so that it reports every one that never arrives as lost
    /// — the last ones too, which no later message would reveal. Call it when done (the
    /// end of a stream) or before a pause. A mark is one datagram and can be lost like any
    /// other: where the receiver may be overrun, send it again after its reorder window
    /// ([`MsgConfig::reassembly`]'s `timeout`). Returns the count the mark carries.
    ///
    /// A message whose send is still running in another task when the mark is numbered is
    /// counted by it; if that send is cancelled half-way, the receiver reports it lost.
    pub async fn send_mark(&self) -> io::Result<u64> {
        self.submit_queued();
        if let Some(r) = self.made_ring() {
            // Refused batches (sent by copy) go before the mark that counts their messages.
            let refused = {
                let mut st = r.ring();
                if st.ring.awaits_results() {
                    st.ring.reap(&self.conn.stats);
                }
                st.ring.has_refused()
            };
            if refused {
                self.send_refused(r).await?;
            }
        }
        let (mark, sent) = {
            let f = lock(&self.framer);
            (f.mark(), f.next_id())
        };
        let iov = [std::io::IoSlice::new(&mark)];
        poll_fn(|cx| {
            self.conn.poll_io(cx, Direction::Write, || {
                self.conn.send_gso(&iov, false, None)
            })
        })
        .await?;
        Ok(sent)
    }

    /// A message buffer of `len` bytes from this socket's pool ([`MsgConfig::pool_buffers`]
    /// buffers of [`MsgConfig::max_message`], page-aligned, made on first use), laid out with
    /// a hole for each datagram's header. Waits, up to [`MsgConfig::timeout`], while every
    /// buffer is out.
    pub async fn buffer(&self, len: usize) -> io::Result<MsgBuf> {
        // Both fixed when the socket was made: no lock on the framer here.
        let layout = self.layout;
        if len > self.cfg.max_message {
            return Err(msg_err(MsgError::TooLarge {
                len,
                max: self.cfg.max_message,
            }));
        }
        let pool = match self.pool.get() {
            Some(p) => p,
            None => {
                let size = layout.wire_len(self.cfg.max_message);
                // Two tasks may both make one; the loser's is unmapped at once.
                // A pool io_uring registers is made of 4 KiB pages: registered from a huge
                // page each datagram is charged its offset in the 2 MiB folio as well
                // (zcnet's `MsgSender::buffer`, docs/measurements/msg.md).
                let pool = if self.cfg.tx == MsgTx::Uring && self.zerocopy {
                    Pool::new(self.cfg.pool_buffers, size)?
                } else {
                    Pool::new_huge(self.cfg.pool_buffers, size)?
                };
                let _ = self.pool.set(pool);
                self.pool.get().expect("set above")
            }
        };
        let ring = self.ring();
        // Read only once the pool turns out empty: most calls never look at the clock.
        let mut deadline = None;
        let mut waited = false;
        loop {
            let mut got = pool.try_take();
            if let (None, Some(r)) = (&got, ring) {
                // Requests still queued hold buffers too: submitted first (one system call,
                // none if nothing is queued). Then the notifications may be in the
                // completion queue already: shared memory, no system call.
                let mut st = r.ring();
                st.ring.submit(&self.conn.stats);
                if st.ring.reap(&self.conn.stats) > 0 {
                    got = pool.try_take();
                }
            }
            if got.is_none() && self.conn.loans_in_flight() > 0 {
                // Completions may be queued already: one non-blocking read, no wait.
                self.conn.drain()?;
                got = pool.try_take();
            }
            if let Some(buf) = got {
                return MsgBuf::new(buf, len, layout)
                    .map_err(|_| io::Error::other("pool buffer smaller than a largest message"));
            }
            if !waited {
                waited = true;
                self.conn.stats.add_pool_waits(1);
            }
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + self.cfg.timeout);
            if Instant::now() >= deadline {
                self.conn.stats.add_pool_timeouts(1);
                return Err(Error::PoolExhausted(self.cfg.timeout).into());
            }
            if let Some(r) = ring.filter(|r| r.ring().ring.held() > 0) {
                // The pool refills when the ring's notifications release a buffer.
                let _ = tokio::time::timeout(
                    Duration::from_millis(10),
                    r.reap_until(&self.conn.stats, |_| pool.available() > 0),
                )
                .await;
            } else if self.conn.loans_in_flight() > 0 {
                // The pool refills when a completion releases a loan.
                let _ = tokio::time::timeout(
                    Duration::from_millis(10),
                    poll_fn(|cx| self.conn.poll_completion_event(cx)),
                )
                .await;
            } else {
                // Every buffer is with the caller: look again shortly.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }

    /// Sends a stamped-in-place message with `MSG_ZEROCOPY` (when [`MsgConfig::tx`] is
    /// [`MsgTx::Zerocopy`], `SO_ZEROCOPY` is on and the policy agrees; otherwise copied, the
    /// reason counted) and resolves — handing `msg` back — only once the kernel's completion
    /// covers every call that named it. On error the buffer comes back too, after those
    /// completions.
    ///
    /// Cancel-safe in the memory sense: dropped at any point, the buffer stays with the
    /// socket until its completion and is dropped there (a pool buffer then goes back to its
    /// pool); it is never freed or reused while the kernel may read it.
    pub async fn send_zc(&self, msg: MsgBuf) -> (io::Result<MsgSent>, MsgBuf) {
        let mut flight = UdpFlight {
            conn: &self.conn,
            buf: Some(msg),
            span: None,
            lend_at: None,
        };
        let result = self.send_flight(&mut flight).await;
        let (buf, span) = flight.finish();
        let buf = buf.expect("send_zc's flight keeps its buffer");
        let Some((first, last)) = span else {
            return (
                result.map(|mut s| {
                    s.copied_anyway = Some(false);
                    s
                }),
                buf,
            );
        };
        let (back, mut returned) = oneshot::channel();
        self.conn
            .lend(Loan::Waiting(Box::new(Waiting { buf, back })), first, last);
        // The driver leaves a busy socket's completions to its senders (`driver.rs`): read
        // them here until this one's has come.
        let returned = loop {
            tokio::select! {
                biased;
                r = &mut returned => break r,
                r = poll_fn(|cx| self.conn.poll_completion_event(cx)) => {
                    if r.is_err() {
                        // The error queue cannot be read here; the driver reads it once
                        // the socket is idle.
                        break (&mut returned).await;
                    }
                }
            }
        };
        match returned {
            Ok((buf, copied)) => (
                result.map(|mut s| {
                    s.copied_anyway = Some(copied);
                    s
                }),
                buf,
            ),
            // The loan was leaked (the runtime is shutting down under the socket): the
            // buffer must not come back, so this future never resolves.
            Err(_) => std::future::pending().await,
        }
    }

    /// Sends a message as [`ZcUdpSocket::send_zc`] does but returns once it is queued; the
    /// socket keeps the buffer until the completion and then drops it (a pool buffer goes
    /// back to its pool, where [`ZcUdpSocket::buffer`] finds it). The fast way to stream
    /// messages: no wait per message, completions read in batches by the socket's driver.
    ///
    /// With [`MsgTx::Uring`] (once the pool exists) the message's batches are queued as
    /// io_uring `SEND_ZC` requests from the registered pool and submitted in one system
    /// call; their completions are read by later calls. A request the kernel fails after
    /// that (`ECONNREFUSED` from an ICMP error, say) is returned — its errno kept — by the
    /// next `send_lent`, which then sends nothing, as a socket's pending error is; the
    /// failed message is one the receiver reports lost.
    pub async fn send_lent(&self, msg: MsgBuf) -> io::Result<MsgSent> {
        let msg = match self.ring() {
            Some(r) if matches!(self.conn.decide(msg.wire()), Go::ZeroCopy) => {
                match self.send_ring(r, msg) {
                    Ok(sent) => return sent,
                    // Every slot held (buffers from outside the pool): by `MSG_ZEROCOPY`,
                    // counted.
                    Err(msg) => {
                        self.conn.stats.add_tx_uring_refused(1);
                        msg
                    }
                }
            }
            _ => msg,
        };
        // Completions are read in batches, as the blocking sender does: once half the pool
        // is lent out, one error-queue read covers many messages.
        let half = self.cfg.pool_buffers.max(1).div_ceil(2);
        let mut flight = UdpFlight {
            conn: &self.conn,
            buf: Some(msg),
            span: None,
            lend_at: Some(half),
        };
        let result = self.send_flight(&mut flight).await;
        let (buf, span) = flight.finish();
        // Lent already unless the message went out copied, or not whole.
        if let (Some(buf), Some((first, last))) = (buf, span) {
            self.conn
                .lend_and_drain_at(Loan::Msg(buf), first, last, half)?;
        }
        result
    }

    /// [`ZcUdpSocket::send_lent`] through the ring: numbered, stamped and queued under one
    /// hold of the framer's lock, every batch submitted in one `io_uring_enter`. Nothing to
    /// wait for: the kernel itself retries a request that finds the socket buffer full.
    /// `Err` gives the message back untouched (no id used) when the ring has no free slot.
    fn send_ring(&self, r: &UdpRing, mut msg: MsgBuf) -> Result<io::Result<MsgSent>, MsgBuf> {
        let wire_len = msg.wire_len();
        let mut f = lock(&self.framer);
        let mut st = r.ring();
        let ring = &mut st.ring;
        if !ring.can_take() {
            return Err(msg);
        }
        if let Some(e) = ring.take_failure() {
            return Ok(Err(e));
        }
        let mut out = match f.begin(msg.len()) {
            Ok(o) => o,
            Err(e) => return Ok(Err(msg_err(e))),
        };
        if let Err(e) = f.stamp(&out, &mut msg) {
            return Ok(Err(msg_err(e)));
        }
        let sock = self.conn.socket().as_fd();
        let zerocopy = match ring.queue(sock, &mut f, &mut out, msg, &self.conn.stats) {
            Ok(n) => n,
            // The ring could not queue it (its submission failed): the message's id is
            // used, the receiver reports it lost, the caller gets the error.
            Err((_, e)) => return Ok(Err(e)),
        };
        if let Some(e) = ring.take_failure() {
            return Ok(Err(e));
        }
        f.finish(&out, true);
        // Notifications are read in batches, as for `MSG_ZEROCOPY`: once half the pool is
        // with the kernel (and whenever `buffer` finds it empty). Submissions too (see
        // `UdpRing`).
        let mut ask_flusher = false;
        // On an unregistered ring the flusher also awaits the results: a request refused past
        // RLIMIT_MEMLOCK is sent by copy (see `flusher`), so it is asked every time.
        let unregistered = ring.awaits_results();
        if ring.held() * 2 >= self.cfg.pool_buffers.max(1) {
            ring.submit(&self.conn.stats);
            ring.reap(&self.conn.stats);
        } else if ring.unsubmitted() >= SUBMIT_AT {
            ring.submit(&self.conn.stats);
        } else {
            ask_flusher = true;
        }
        if unregistered {
            ask_flusher = true;
        }
        if ask_flusher && st.flush_asked {
            ask_flusher = false;
        } else if ask_flusher {
            st.flush_asked = true;
        }
        drop((st, f));
        if ask_flusher {
            r.flush.notify_one();
        }
        self.conn.count_send(wire_len, true);
        Ok(Ok(MsgSent {
            id: out.id(),
            zerocopy,
            copied: 0,
            copied_anyway: None,
            fallback: None,
        }))
    }

    /// Sends by copy what the ring's kernel refused ([`send_refused`]).
    async fn send_refused(&self, r: &UdpRing) -> io::Result<()> {
        send_refused(r, &self.conn).await
    }

    async fn send_flight(&self, flight: &mut UdpFlight<'_>) -> io::Result<MsgSent> {
        self.submit_queued();
        let msg = flight.buf.as_ref().expect("a flight holds its buffer");
        let wire_len = msg.wire_len();
        // Numbered and stamped by the first batch's hold of the framer's lock.
        let mut out: Option<Outgoing> = None;
        let mut sent = MsgSent {
            id: 0,
            zerocopy: 0,
            copied: 0,
            copied_anyway: None,
            fallback: None,
        };
        let mut zerocopy = self.cfg.tx.is_zerocopy()
            && match self.conn.decide(msg.wire()) {
                Go::ZeroCopy => true,
                // Without a cost check there is no copy sample; copied, not a fallback.
                Go::CopySample => false,
                Go::Copy(reason) => {
                    self.conn.stats.fallback(reason, wire_len as u64);
                    sent.fallback = Some(reason);
                    false
                }
            };
        let mut enobufs = 0;
        let mut finished = false;
        while !out.as_ref().is_some_and(Outgoing::is_done) {
            let (buf, span, lend_at) = (&mut flight.buf, &mut flight.span, flight.lend_at);
            let r = poll_fn(|cx| {
                self.conn.poll_io(cx, Direction::Write, || {
                    // Every batch the socket takes now, under one hold of the framer's
                    // lock: one lock per message, not one per batch.
                    let mut f = lock(&self.framer);
                    let msg = buf.as_mut().expect("held");
                    let out = match &mut out {
                        Some(o) => o,
                        None => {
                            let o = f.begin(msg.len()).map_err(msg_err)?;
                            f.stamp(&o, msg).map_err(msg_err)?;
                            sent.id = o.id();
                            out.insert(o)
                        }
                    };
                    let wire = msg.wire();
                    // And the completions' lock, once for all zero-copy batches (always
                    // taken after the framer's, never before).
                    let mut calls = zerocopy.then(|| self.conn.calls());
                    while let Some(batch) = f.next_batch(out) {
                        let iov = [IoSlice::new(&wire[batch.wire.clone()])];
                        let r = match calls.as_deref_mut() {
                            Some(tx) => self.conn.send_gso_zerocopy(tx, &iov, batch.gso),
                            None => self.conn.send_gso(&iov, false, batch.gso),
                        };
                        let (r, id) = match r {
                            Ok((n, id)) => (Ok(n), id),
                            Err(e) => (Err(e), None),
                        };
                        // `None`: try the batch again (interrupted, or GSO refused and the
                        // batch size halved).
                        let Some(n) = f.after(out, &batch, r)? else {
                            continue;
                        };
                        if let Some(id) = id {
                            *span = Some(span.map_or((id, id), |(a, _)| (a, id)));
                            sent.zerocopy += n;
                            enobufs = 0;
                        } else {
                            sent.copied += n;
                        }
                        if out.is_done() {
                            f.finish(out, span.is_some());
                            finished = true;
                        }
                    }
                    // `send_lent`: the whole message is queued, so its buffer is lent under
                    // the hold of the completions' lock its batches took — one lock per
                    // message for sending and lending, as the blocking sender has none.
                    if let (true, Some(at), Some((first, last)), Some(tx)) =
                        (out.is_done(), lend_at, *span, calls.as_deref_mut())
                    {
                        let msg = buf.take().expect("held");
                        self.conn
                            .lend_and_drain_locked(tx, Loan::Msg(msg), first, last, at)?;
                    }
                    Ok(())
                })
            })
            .await;
            match r {
                Ok(()) => {}
                Err(e) if zerocopy && e.raw_os_error() == Some(libc::ENOBUFS) => {
                    // Nothing was queued: free option memory by reading completions, then
                    // retry, or copy the rest of the message (counted).
                    self.conn.stats.add_tx_enobufs(1);
                    if enobufs < ENOBUFS_RETRIES {
                        enobufs += 1;
                        self.conn.drain()?;
                        tokio::task::yield_now().await;
                    } else {
                        let at = out
                            .as_ref()
                            .and_then(|o| lock(&self.framer).next_batch(o))
                            .map_or(wire_len, |b| b.wire.start);
                        self.conn
                            .stats
                            .fallback(FallbackReason::Enobufs, (wire_len - at) as u64);
                        sent.fallback = Some(FallbackReason::Enobufs);
                        zerocopy = false;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        if let (false, Some(out)) = (finished, &out) {
            lock(&self.framer).finish(out, flight.span.is_some());
        }
        // A demoted socket's back-off runs in bytes sent (no lock while it is not demoted).
        self.conn.count_send(wire_len, sent.zerocopy > 0);
        Ok(sent)
    }

    /// Waits until the kernel has returned every loaned buffer.
    pub async fn flush_loans(&self) -> io::Result<()> {
        if let Some(r) = self.made_ring() {
            r.reap_until(&self.conn.stats, |ring| ring.held() == 0)
                .await?;
            self.send_refused(r).await?;
        }
        poll_fn(|cx| self.conn.poll_completions(cx)).await
    }

    /// The next event — a whole message, or messages lost — from any sender. Losses are
    /// found while waiting (the reassembly timeout), so a caller that only ever calls
    /// `recv` sees every one. One `recv` at a time reads; concurrent callers queue.
    pub async fn recv(&self) -> io::Result<MsgEvent> {
        let stats = self.msg_stats();
        let mut rx = self.rx.lock().await;
        let rx = &mut *rx;
        loop {
            rx.table.expire(Instant::now(), &stats);
            if let Some(ev) = rx.table.pop_event() {
                return Ok(ev);
            }
            let read = poll_fn(|cx| {
                self.conn.poll_io(cx, Direction::Read, || {
                    udp_msg::recv_datagram(
                        self.conn.socket().as_fd(),
                        &mut rx.buf,
                        RecvFlags::DONTWAIT,
                    )
                })
            });
            let r = match rx.table.next_deadline() {
                Some(t) => match tokio::time::timeout_at(t.into(), read).await {
                    Ok(r) => r,
                    Err(_) => continue,
                },
                None => read.await,
            };
            let r = r?;
            self.conn.stats.add_rx_copied_bytes(r.len as u64);
            rx.table.feed(&rx.buf, &r, Instant::now(), &stats);
        }
    }

    /// Gives a delivered message's buffer back for reuse by a later one.
    pub async fn recycle(&self, msg: zcnet_msg::Message) {
        self.rx.lock().await.table.recycle(msg.data);
    }
}

/// The socket itself, for options this type does not wrap (`SO_SNDBUF`, `IP_TOS`, ...).
/// Reading or writing through it directly bypasses the message framing.
impl AsFd for ZcUdpSocket {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.conn.socket().as_fd()
    }
}

impl Drop for ZcUdpSocket {
    fn drop(&mut self) {
        // What is queued leaves now, while the socket is surely open.
        self.submit_queued();
        self.conn.close();
        if let Some(r) = self.made_ring() {
            // It sees the connection closed and ends.
            r.flush.notify_one();
        }
    }
}

/// A message on its way out. Dropped before the send finished (a cancelled future), it
/// lends the buffer to the socket's bookkeeping if any zero-copy call named it.
struct UdpFlight<'a> {
    conn: &'a Conn<UdpSocket>,
    /// `None` once lent ([`UdpFlight::lend_at`]).
    buf: Option<MsgBuf>,
    span: Option<(u64, u64)>,
    /// `send_lent`: lend the buffer as soon as its last batch is queued, reading the
    /// completions if this many loans are then out.
    lend_at: Option<usize>,
}

impl UdpFlight<'_> {
    #[inline]
    fn finish(mut self) -> (Option<MsgBuf>, Option<(u64, u64)>) {
        (self.buf.take(), self.span.take())
    }
}

impl Drop for UdpFlight<'_> {
    #[inline]
    fn drop(&mut self) {
        if let (Some(buf), Some((first, last))) = (self.buf.take(), self.span) {
            self.conn.lend(Loan::Msg(buf), first, last);
        }
    }
}
