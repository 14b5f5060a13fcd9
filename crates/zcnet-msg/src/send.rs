//! [`MsgSender`]: messages out over a connected UDP socket, many datagrams per call (GSO),
//! with `MSG_ZEROCOPY` from loaned [`MsgBuf`]s.
//!
//! * Segment size: `IP_MTU`/`IPV6_MTU` of the connected socket minus the IP and UDP headers
//!   (1500 → 1472), or [`MsgConfig::segment`]. Every datagram is one header plus up to
//!   `segment − 28` payload bytes.
//! * Batches: one `sendmsg` carries `min(UDP_MAX_SEGMENTS, 65 507 / segment)` datagrams with
//!   a `UDP_SEGMENT` control message (44 at MTU 1500; on loopback's MTU 65536 a datagram is
//!   already 64 KiB and each call carries one). `EINVAL`/`EMSGSIZE`/`EIO` on a multi-datagram
//!   call halves the batch and retries, counted (`gso_fallbacks`); at one datagram per call
//!   GSO is switched off for the sender (`gso_disabled`), as quinn-udp lowers its
//!   `max_gso_segments` for good.
//! * [`MsgSender::send`] (copy semantics) builds an iovec `header, payload, header, payload,
//!   …` over the caller's slice: the kernel copies once, user space never.
//! * [`MsgSender::send`] sends a loaned [`MsgBuf`], whose storage already has a hole for
//!   each header (Jin, Zhang, Tan, "Lightweight Messages", §3.1, Fig. 1): headers are written into the holes and every batch
//!   is one contiguous range, which is what `MSG_ZEROCOPY` needs — the kernel maps a
//!   zero-copy send into at most 17 page fragments, and an interleaved iovec exhausts them
//!   after 7 datagrams (`sys::udp_msg` pins this). The buffer is lent to the completion
//!   bookkeeping ([`zcnet::zc`]) for the calls that named it and returns to the pool
//!   when they are all complete; the headers live in the same storage, so they too stay
//!   unchanged until then.
//! * `ENOBUFS` (option memory) queues nothing: reap, wait 2/4/8 ms, retry, then copy the rest,
//!   counted as [`FallbackReason::Enobufs`] — as the stream path does.

use super::framer::Framer;
use super::msgbuf::MsgBuf;
use super::stats::MsgStats;
use super::uring::MsgRing;
use super::wire::Layout;
use super::{MsgConfig, MsgError, MsgTx};
use std::io::{self, IoSlice};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcnet::policy::CopiedDemotion;
use zcnet::zc::{reap_each, Completions};
use zcnet::Error;
use zcnet::FallbackReason;
use zcnet::Stats;
use zcnet::{Pool, TxBuf};
use zcnet_sys::mem::page_size;
use zcnet_sys::raw::socket;
use zcnet_sys::raw::udp_msg::{self, MAX_UDP_PAYLOAD_V4, MAX_UDP_PAYLOAD_V6, UDP_MAX_SEGMENTS};
use zcnet_sys::raw::zerocopy as zc;

/// Zero-copy attempts after `ENOBUFS` (each after reaping) before the rest is copied.
const ENOBUFS_RETRIES: u32 = 3;
/// How long `Drop` waits for outstanding completions before retiring the buffers.
const DROP_WAIT: Duration = Duration::from_secs(1);

/// Sends whole messages to the peer of a connected UDP socket (see the module docs).
#[derive(Debug)]
pub struct MsgSender {
    sock: UdpSocket,
    peer: SocketAddr,
    cfg: MsgConfig,
    layout: Layout,
    max_gso_bytes: usize,
    framer: Framer,
    zerocopy_ok: bool,
    completions: Completions<TxBuf>,
    demotion: CopiedDemotion,
    entries: Vec<zc::ErrqueueEntry>,
    pool: Option<Pool>,
    /// [`MsgTx::Uring`]'s ring, made with the pool; `None` without one (then
    /// `MSG_ZEROCOPY`).
    ring: Option<MsgRing>,
    headers: Vec<u8>,
    stats: Arc<Stats>,
}

impl MsgSender {
    /// A socket bound to the unspecified address of `peer`'s family, `SO_ZEROCOPY` on when
    /// `cfg.tx` asks for it, connected to `peer`. Create it in the network namespace it is to
    /// send from; it can be used from any thread after.
    pub fn connect(peer: SocketAddr, cfg: &MsgConfig) -> Result<MsgSender, MsgError> {
        cfg.validate()?;
        let local: SocketAddr = match peer {
            SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
            SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let sock = UdpSocket::bind(local).map_err(|e| Error::io("bind(UDP)", e))?;
        let zerocopy_ok = cfg.tx.is_zerocopy() && zc::set_so_zerocopy(sock.as_fd()).is_ok();
        sock.connect(peer)
            .map_err(|e| Error::io("connect(UDP)", e))?;
        Self::build(sock, cfg, zerocopy_ok)
    }

    /// Takes over a UDP socket that is already connected.
    pub fn from_socket(sock: UdpSocket, cfg: &MsgConfig) -> Result<MsgSender, MsgError> {
        cfg.validate()?;
        let zerocopy_ok = cfg.tx.is_zerocopy()
            && (zc::so_zerocopy(sock.as_fd()).unwrap_or(false)
                || zc::set_so_zerocopy(sock.as_fd()).is_ok());
        Self::build(sock, cfg, zerocopy_ok)
    }

    fn build(sock: UdpSocket, cfg: &MsgConfig, zerocopy_ok: bool) -> Result<MsgSender, MsgError> {
        let peer = sock
            .peer_addr()
            .map_err(|e| Error::io("getpeername (the UDP socket must be connected)", e))?;
        sock.set_write_timeout(Some(cfg.timeout))
            .map_err(|e| Error::io("setsockopt(SO_SNDTIMEO)", e))?;
        let (ip_udp, max_gso_bytes) = match peer.ip() {
            IpAddr::V4(_) => (28, MAX_UDP_PAYLOAD_V4),
            IpAddr::V6(_) => (48, MAX_UDP_PAYLOAD_V6),
        };
        let segment = match cfg.segment {
            Some(s) => s,
            None => {
                let mtu = udp_msg::path_mtu(sock.as_fd(), peer.ip())
                    .map_err(|e| Error::io("getsockopt(IP_MTU)", e))?;
                (mtu as usize).saturating_sub(ip_udp).min(max_gso_bytes)
            }
        };
        let layout = Layout::new(segment)
            .map_err(|e| MsgError::Config(format!("segment from the path MTU: {e}")))?;
        let per_call = (max_gso_bytes / segment).clamp(1, UDP_MAX_SEGMENTS);
        let mut session = [0u8; 4];
        getrandom::fill(&mut session)
            .map_err(|e| Error::io("getrandom", io::Error::other(e.to_string())))?;
        let stats = Arc::new(Stats::new());
        if cfg.tx.is_zerocopy() && !zerocopy_ok {
            // Counted once here; every loan is then copied and counted as Unsupported too.
            stats.fallback(FallbackReason::Unsupported, 0);
        }
        Ok(MsgSender {
            sock,
            peer,
            cfg: cfg.clone(),
            layout,
            max_gso_bytes,
            framer: Framer::new(
                layout,
                u32::from_ne_bytes(session),
                cfg.max_message,
                per_call,
                cfg.gso,
            ),
            zerocopy_ok,
            completions: Completions::new(),
            demotion: CopiedDemotion::default(),
            entries: Vec::new(),
            pool: None,
            ring: None,
            headers: Vec::new(),
            stats,
        })
    }

    /// The peer messages go to.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The socket's local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// This sender's random session number (in every header).
    pub fn session(&self) -> u32 {
        self.framer.session()
    }

    /// The id the next message will get.
    pub fn next_id(&self) -> u64 {
        self.framer.next_id()
    }

    /// Datagram size, header included (the GSO segment size).
    pub fn segment(&self) -> usize {
        self.layout.segment()
    }

    /// Payload bytes per datagram.
    pub fn payload_per_datagram(&self) -> usize {
        self.layout.payload_per_datagram()
    }

    /// Datagrams per `sendmsg` now (1 once GSO is off).
    pub fn datagrams_per_call(&self) -> usize {
        self.framer.datagrams_per_call()
    }

    /// Largest UDP payload of one GSO send for this socket's family.
    pub fn max_gso_bytes(&self) -> usize {
        self.max_gso_bytes
    }

    /// Whether loans go through io_uring `SEND_ZC` ([`MsgTx::Uring`]): false before the
    /// first [`MsgSender::buffer`] made the pool, and where io_uring cannot send (then
    /// `MSG_ZEROCOPY`, counted as [`FallbackReason::Unsupported`], or
    /// [`FallbackReason::Memlock`] when the rings were refused for want of locked memory).
    pub fn uring_enabled(&self) -> bool {
        self.ring.is_some()
    }

    /// Whether `SO_ZEROCOPY` is on (asked for with [`MsgTx::Zerocopy`] and [`MsgTx::Uring`]).
    pub fn zerocopy_enabled(&self) -> bool {
        self.zerocopy_ok
    }

    /// Message counters.
    pub fn stats(&self) -> &Arc<MsgStats> {
        self.framer.stats()
    }

    /// Socket-level byte counters: copy vs `MSG_ZEROCOPY` bytes (headers included), COPIED
    /// completions, `ENOBUFS`, fallbacks by reason, pool waits.
    pub fn io_stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// Loaned buffers the kernel still holds.
    pub fn buffers_in_flight(&self) -> usize {
        self.completions.loans_in_flight()
    }

    fn check_len(&self, len: usize) -> Result<(), MsgError> {
        self.framer.check_len(len)
    }

    /// Sends `data` as one message, copying (the slice may be reused at once), as
    /// [`zcnet::Sender::send_slice`] does for a stream. Returns its id. If an error
    /// interrupts a message the id is used anyway: the receiver reports it lost.
    pub fn send_slice(&mut self, data: &[u8]) -> Result<u64, MsgError> {
        let mut out = self.framer.begin(data.len())?;
        let mut headers = std::mem::take(&mut self.headers);
        self.framer.headers(&out, &mut headers);
        let result = loop {
            let Some(batch) = self.framer.next_batch(&out) else {
                break Ok(());
            };
            let iov = self
                .framer
                .interleave(&headers, data, batch.fragments.clone());
            let r = udp_msg::send_vectored_gso(self.sock.as_fd(), &iov, false, batch.gso);
            match self.framer.after(&mut out, &batch, r) {
                Ok(Some(bytes)) => {
                    self.stats.add_tx_copy_bytes(bytes as u64);
                    self.stats.add_tx_copy_calls(1);
                }
                Ok(None) => {}
                Err(e) => break Err(send_error(e, self.cfg.timeout)),
            }
        };
        self.headers = headers;
        result?;
        self.framer.finish(&out, false);
        Ok(out.id())
    }

    /// Tells the receiver how many messages this sender has sent (a mark: [`wire`](super::wire)),
    /// so it reports every one that never arrives as lost — the last ones too, which no
    /// later message would reveal. Send it when done (a stream's end) or when pausing;
    /// it is one datagram and can be lost like any other, so send it again (after the
    /// receiver's reorder window, say) where the receiver may have been overrun. Returns
    /// the count the mark carries.
    pub fn send_mark(&mut self) -> Result<u64, MsgError> {
        if let Some(ring) = self.ring.as_mut() {
            // Queued requests leave first: the mark must follow every message it counts,
            // refused batches (sent by copy) too.
            ring.submit(&self.stats);
            if ring.awaits_results() {
                ring.reap(&self.stats);
            }
            ring.send_refused_blocking(self.sock.as_fd(), &self.stats)
                .map_err(|e| send_error(e, self.cfg.timeout))?;
        }
        let mark = self.framer.mark();
        let iov = [std::io::IoSlice::new(&mark)];
        udp_msg::send_vectored_gso(self.sock.as_fd(), &iov, false, None)
            .map_err(|e| send_error(e, self.cfg.timeout))?;
        self.stats.add_tx_copy_bytes(mark.len() as u64);
        self.stats.add_tx_copy_calls(1);
        Ok(self.framer.next_id())
    }

    /// A loaned buffer for a message of `len` bytes, from this sender's pool (made on first
    /// use: [`MsgConfig::pool_buffers`] buffers sized for [`MsgConfig::max_message`]).
    /// Waits, reaping completions, up to [`MsgConfig::timeout`] while the kernel holds every
    /// buffer.
    pub fn buffer(&mut self, len: usize) -> Result<MsgBuf, MsgError> {
        self.check_len(len)?;
        if self.pool.is_none() {
            let size = self.layout.wire_len(self.cfg.max_message);
            let uring = self.cfg.tx == MsgTx::Uring && self.zerocopy_ok;
            // A pool io_uring registers is made of 4 KiB pages: registered from a huge page,
            // a buffer becomes one bvec per 2 MiB folio and each datagram's skb is charged
            // `PAGE_ALIGN(its offset in the folio + len)` (`io_sg_from_iter`), ~1.5 MiB per
            // 64 KiB datagram, to the sender's write memory and a local receiver's buffer
            // (docs/measurements/msg.md).
            let pool = if uring {
                Pool::new(self.cfg.pool_buffers, size)
            } else {
                Pool::new_huge(self.cfg.pool_buffers, size)
            }
            .map_err(|e| Error::io("mmap(message pool)", e))?;
            if uring {
                let gso =
                    (self.framer.datagrams_per_call() > 1).then_some(self.layout.segment() as u16);
                match MsgRing::new(self.sock.as_fd(), &pool, gso, false, &self.stats) {
                    Ok(r) => self.ring = Some(r),
                    // MSG_ZEROCOPY instead, counted.
                    Err(e) => self.stats.fallback(MsgRing::unavailable_reason(&e), 0),
                }
            }
            self.pool = Some(pool);
        }
        let pool = self.pool.clone().expect("pool made above");
        // Read only once the pool turns out empty: most calls never look at the clock (a
        // clock read per message was 3 % of the sink sender's user time).
        let mut deadline = None;
        let mut waited = false;
        loop {
            if let Some(mut buf) = pool.try_take() {
                buf.set_len(self.layout.wire_len(len));
                return Ok(MsgBuf {
                    buf,
                    len,
                    layout: self.layout,
                });
            }
            if !waited {
                waited = true;
                self.stats.add_pool_waits(1);
            }
            let now = Instant::now();
            let deadline = *deadline.get_or_insert(now + self.cfg.timeout);
            if now >= deadline {
                self.stats.add_pool_timeouts(1);
                return Err(Error::PoolExhausted(self.cfg.timeout).into());
            }
            let pause = (deadline - now).min(Duration::from_millis(10));
            let (demotion, policy, stats) = (&mut self.demotion, self.cfg.policy, &self.stats);
            match self.ring.as_mut() {
                Some(ring) if ring.held() > 0 => {
                    ring.wait_observing(pause, stats, |copied, bytes| {
                        demotion.count_notified(copied, bytes, &policy, stats)
                    })
                    .map_err(|e| Error::io("io_uring_enter", e))?;
                }
                _ => {
                    self.wait_completions(pause)?;
                }
            }
        }
    }

    /// Sends a loaned message and returns its id: with `MSG_ZEROCOPY` when
    /// [`MsgConfig::tx`] is [`MsgTx::Zerocopy`], `SO_ZEROCOPY` is on and the policy agrees
    /// (else copied, the reason counted). The buffer returns to its pool when the kernel is
    /// done with it. As with [`zcnet::Sender::send`], `send` lends and
    /// [`MsgSender::send_slice`] copies.
    pub fn send(&mut self, mut msg: MsgBuf) -> Result<u64, MsgError> {
        if !self.pool.as_ref().is_some_and(|p| p.owns(&msg.buf)) || msg.layout != self.layout {
            return Err(Error::ForeignBuffer.into());
        }
        let mut out = self.framer.begin(msg.len)?;
        self.framer.stamp(&out, &mut msg)?;
        let wire_len = msg.wire_len();
        let mut zerocopy = self.cfg.tx.is_zerocopy()
            && match self.refuses(&msg) {
                None => true,
                Some(reason) => {
                    self.stats.fallback(reason, wire_len as u64);
                    false
                }
            };
        if let (true, Some(ring)) = (zerocopy, self.ring.as_mut()) {
            // Batches an earlier reap found refused leave first (by copy).
            ring.send_refused_blocking(self.sock.as_fd(), &self.stats)
                .map_err(|e| send_error(e, self.cfg.timeout))?;
            if let Some(e) = ring.take_failure() {
                return Err(Error::io("io_uring SEND_ZC (an earlier message)", e).into());
            }
            match ring.send(
                self.sock.as_fd(),
                &mut self.framer,
                &mut out,
                msg,
                &self.stats,
            ) {
                Ok(_) => {
                    if ring.awaits_results() {
                        // Unregistered: a request past RLIMIT_MEMLOCK is refused once it is
                        // issued, which may be after it waited for socket room. Its result
                        // is awaited here, as `sendmsg` waits for room, and a refused batch
                        // goes by copy now rather than being lost (`MsgRing`'s docs).
                        let (demotion, policy, stats) =
                            (&mut self.demotion, self.cfg.policy, &self.stats);
                        ring.reap_observing(stats, |copied, bytes| {
                            demotion.count_notified(copied, bytes, &policy, stats)
                        });
                        let mut deadline = None;
                        while ring.results_due() > 0 {
                            let now = Instant::now();
                            let deadline = *deadline.get_or_insert(now + self.cfg.timeout);
                            if now >= deadline {
                                let e = Error::timeout("io_uring SEND_ZC", self.cfg.timeout);
                                return Err(e.into());
                            }
                            ring.wait_observing(
                                (deadline - now).min(Duration::from_millis(10)),
                                stats,
                                |copied, bytes| {
                                    demotion.count_notified(copied, bytes, &policy, stats)
                                },
                            )
                            .map_err(|e| Error::io("io_uring_enter", e))?;
                        }
                        ring.send_refused_blocking(self.sock.as_fd(), &self.stats)
                            .map_err(|e| send_error(e, self.cfg.timeout))?;
                    }
                    if let Some(e) = ring.take_failure() {
                        return Err(Error::io("io_uring SEND_ZC", e).into());
                    }
                    self.framer.finish(&out, true);
                    // Completions in batches, as below; each notification tells the COPIED
                    // demotion whether the kernel copied after all (a local route).
                    if ring.held() * 2 >= self.cfg.pool_buffers.max(1) {
                        let (demotion, policy, stats) =
                            (&mut self.demotion, self.cfg.policy, &self.stats);
                        ring.reap_observing(stats, |copied, bytes| {
                            demotion.count_notified(copied, bytes, &policy, stats)
                        });
                    }
                    return Ok(out.id());
                }
                // Nothing queued: this message goes by `MSG_ZEROCOPY`, counted.
                Err((m, _)) => {
                    self.stats.add_tx_uring_refused(1);
                    msg = m;
                }
            }
        }
        let first_call = self.completions.next_id();
        let mut enobufs = 0;
        let mut result = Ok(());
        let buf = msg.buf;
        while let Some(batch) = self.framer.next_batch(&out) {
            let iov = [IoSlice::new(&buf[batch.wire.clone()])];
            let r = udp_msg::send_vectored_gso(self.sock.as_fd(), &iov, zerocopy, batch.gso);
            match self.framer.after(&mut out, &batch, r) {
                Ok(Some(bytes)) if zerocopy => {
                    self.completions.record_call(bytes);
                    self.stats.add_tx_zerocopy_bytes(bytes as u64);
                    self.stats.add_tx_zerocopy_calls(1);
                    enobufs = 0;
                }
                Ok(Some(bytes)) => {
                    self.stats.add_tx_copy_bytes(bytes as u64);
                    self.stats.add_tx_copy_calls(1);
                }
                Ok(None) => {}
                Err(e) if zerocopy && e.raw_os_error() == Some(libc::ENOBUFS) => {
                    self.stats.add_tx_enobufs(1);
                    if enobufs < ENOBUFS_RETRIES {
                        enobufs += 1;
                        if let Err(e) = self.wait_completions(Duration::from_millis(1 << enobufs)) {
                            result = Err(e);
                            break;
                        }
                    } else {
                        let rest = wire_len - batch.wire.start;
                        self.stats.fallback(FallbackReason::Enobufs, rest as u64);
                        zerocopy = false;
                    }
                }
                Err(e) => {
                    result = Err(send_error(e, self.cfg.timeout));
                    break;
                }
            }
        }
        let last_call = self.completions.next_id();
        let went_zerocopy = last_call > first_call;
        // Lend the buffer even after an error: calls that went out still reference it.
        if went_zerocopy {
            drop(self.completions.lend(buf, first_call, last_call - 1));
        } else {
            drop(buf);
        }
        result?;
        self.framer.finish(&out, went_zerocopy);
        // Completions are read in batches: once half the pool is lent out (and whenever
        // `buffer` finds it empty). One error-queue read then returns a coalesced range
        // covering many messages, where a read per message cost about 8 % of the sender's
        // CPU at 64 KiB (docs/msg.md).
        if self.buffers_in_flight() * 2 >= self.cfg.pool_buffers.max(1) {
            self.reap()?;
        }
        Ok(out.id())
    }

    /// Why `msg` must be copied, if it must.
    fn refuses(&self, msg: &MsgBuf) -> Option<FallbackReason> {
        if !self.zerocopy_ok {
            return Some(FallbackReason::Unsupported);
        }
        self.cfg.policy.refuses(
            msg.wire_len(),
            msg.buf.data_addr(),
            page_size(),
            self.demotion.is_demoted(),
        )
    }

    /// Reads completions without blocking; returns the loans that came back.
    pub fn reap(&mut self) -> Result<usize, MsgError> {
        if self.completions.is_idle() {
            return Ok(0);
        }
        let mut released = 0;
        reap_each(
            self.sock.as_fd(),
            &mut self.entries,
            &mut self.completions,
            &mut self.demotion,
            self.cfg.policy,
            &self.stats,
            |buf, _copied| {
                drop(buf); // back to its pool
                released += 1;
            },
        )?;
        Ok(released)
    }

    /// Reaps, and if nothing came back waits up to `pause` for the error queue to signal
    /// (`POLLERR`) and reaps again. A pending socket error (an ICMP "port unreachable" on a
    /// connected socket) raises `POLLERR` too, so an empty reap sleeps briefly rather than
    /// spin; the next send reports that error.
    fn wait_completions(&mut self, pause: Duration) -> Result<usize, MsgError> {
        let got = self.reap()?;
        if got > 0 || self.completions.is_idle() {
            return Ok(got);
        }
        match socket::poll(
            self.sock.as_fd(),
            zcnet_sys::raw::socket::PollFlags::empty(),
            Some(pause),
        ) {
            Ok(ev) if ev.contains(zcnet_sys::raw::socket::PollFlags::ERR) => {
                let n = self.reap()?;
                if n == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
                Ok(n)
            }
            Ok(_) => Ok(0),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => Ok(0),
            Err(e) => Err(Error::io("poll", e).into()),
        }
    }

    /// Waits up to `timeout` until the kernel has returned every loaned buffer; true when it
    /// has.
    pub fn flush(&mut self, timeout: Duration) -> Result<bool, MsgError> {
        let deadline = Instant::now() + timeout;
        if let Some(ring) = self.ring.as_mut() {
            // Refused batches an earlier reap found (each wait below sends its own).
            ring.send_refused_blocking(self.sock.as_fd(), &self.stats)
                .map_err(|e| send_error(e, self.cfg.timeout))?;
        }
        while let Some(ring) = self.ring.as_mut().filter(|r| r.held() > 0) {
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            let (demotion, policy, stats) = (&mut self.demotion, self.cfg.policy, &self.stats);
            ring.wait_observing(
                (deadline - now).min(Duration::from_millis(10)),
                stats,
                |copied, bytes| demotion.count_notified(copied, bytes, &policy, stats),
            )
            .map_err(|e| Error::io("io_uring_enter", e))?;
            ring.send_refused_blocking(self.sock.as_fd(), &self.stats)
                .map_err(|e| send_error(e, self.cfg.timeout))?;
        }
        while !self.completions.is_idle() {
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            self.wait_completions((deadline - now).min(Duration::from_millis(10)))?;
        }
        Ok(true)
    }
}

impl Drop for MsgSender {
    fn drop(&mut self) {
        if self.flush(DROP_WAIT).unwrap_or(false) {
            return;
        }
        // The kernel may still read these pages: unmap them rather than let the pool hand
        // them out again.
        self.completions
            .abandon()
            .into_iter()
            .for_each(TxBuf::retire);
    }
}

/// Maps a send error to the caller's error: `EAGAIN` is the socket timeout running out.
fn send_error(e: io::Error, timeout: Duration) -> MsgError {
    if e.raw_os_error() == Some(libc::EAGAIN) {
        Error::timeout("sendmsg(UDP)", timeout).into()
    } else {
        Error::io("sendmsg(UDP)", e).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::HEADER_LEN;

    #[test]
    fn msgbuf_writes_land_between_the_header_holes() {
        let cfg = MsgConfig {
            segment: Some(100),
            max_message: 1000,
            ..MsgConfig::default()
        };
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut tx = MsgSender::connect(rx.local_addr().unwrap(), &cfg).unwrap();
        assert_eq!(tx.payload_per_datagram(), 72);
        let mut b = tx.buffer(500).unwrap();
        let data: Vec<u8> = (0..500u32).map(|i| (i * 7) as u8).collect();
        b.write_at(0, &data[..10]);
        b.write_at(10, &data[10..300]);
        b.write_at(300, &data[300..]);
        assert_eq!(b.to_vec(), data);
        let blocks: Vec<_> = b.payload_mut().map(|(o, p)| (o, p.len())).collect();
        assert_eq!(blocks.len(), 7);
        assert_eq!(blocks[0], (0, 72));
        assert_eq!(blocks[6], (432, 68));
        // The holes are untouched by payload writes.
        assert!(b.buf[..HEADER_LEN].iter().all(|&x| x == 0));
        assert!(matches!(
            tx.buffer(1001),
            Err(MsgError::TooLarge { len: 1001, .. })
        ));
        let mut other = MsgSender::connect(rx.local_addr().unwrap(), &cfg).unwrap();
        assert!(matches!(
            other.send(b),
            Err(MsgError::Io(Error::ForeignBuffer))
        ));
    }

    #[test]
    #[should_panic(expected = "outside a message")]
    fn msgbuf_write_past_the_end_panics() {
        let cfg = MsgConfig {
            max_message: 1000,
            ..MsgConfig::default()
        };
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut tx = MsgSender::connect(rx.local_addr().unwrap(), &cfg).unwrap();
        tx.buffer(10).unwrap().write_at(5, &[0; 6]);
    }
}
