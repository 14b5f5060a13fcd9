//! [`LmSocket`]: one LM endpoint, sender and receiver at once, over one XSK and one UDP
//! control socket. See the crate docs for the protocol.
//!
//! Single-threaded by design: everything happens inside `send` and `recv`, which both run the
//! same pump (control datagrams, the XSK RX ring, timers). So a socket that is sending still
//! answers admission requests, and one that is receiving still hears its own admission
//! answers; nothing runs while the application holds a borrowed message, which is what keeps
//! the UMEM region under it untouched.

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use zcnet::{FallbackReason, Stats};

use super::program::{Admission, LmProgram, Progress};
use super::stats::LmStats;
use super::{LmConfig, LmError, LmEvent, LmLost, LmMessage, LossReason};
use crate::wire::lm::{
    self as wire, Header, Kind, Layout, Reject, FRAME_HLEN, LM_HLEN, XDP_HEADROOM,
};
use crate::wire::udp::{write_udp_headers, UDP_FRAME_HLEN};
use crate::xsk::{Binding, Placed, XskConfig, XskSocket};

/// UMEM chunk size: the largest copy mode allows here (a frame up to 3774 + 66 bytes).
const CHUNK: u32 = 4096;
/// An unanswered `LM_REQ` is sent again after this.
const REQUEST_RETRY: Duration = Duration::from_millis(20);
/// After a busy rejection, the first back-off; it doubles up to `BACKOFF_MAX`.
const BACKOFF_MIN: Duration = Duration::from_micros(200);
const BACKOFF_MAX: Duration = Duration::from_millis(10);
/// How long a receiver waits for stragglers after `LM_ENDME` before calling the message lost.
const ENDME_GRACE: Duration = Duration::from_millis(50);
/// How long a bind keeps trying while the queue is still held by a socket being torn down.
const BIND_BUSY: Duration = Duration::from_millis(500);
/// Messages remembered as finished, to ignore late duplicate requests for them.
const RECENT: usize = 64;

fn io_err(op: &'static str) -> impl Fn(io::Error) -> LmError {
    move |source| LmError::Io { op, source }
}

/// What a chunk on the FILL ring is for, in ring order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Left over from a lost message: a PAD frame will take it.
    Stale,
    /// Fragment `k` of the active message.
    Fragment(usize),
}

#[derive(Debug)]
struct Active {
    from: SocketAddrV4,
    id: u32,
    token: u32,
    pad: u32,
    layout: Layout,
    /// Assembled in the UMEM (XSK receive), or in `kernel_rx` (fallback).
    in_place: bool,
    /// Fragments in place.
    arrived: usize,
    /// Fallback: which fragments arrived.
    got: Vec<bool>,
    admitted_at: Instant,
    endme_at: Option<Instant>,
}

#[derive(Debug)]
enum Assembly {
    Idle,
    Active(Active),
    Ready(Active),
}

/// The receiver's answer to our pending request.
#[derive(Debug, Clone, Copy)]
enum Answer {
    Ok { token: u32, pad: u32, mac: [u8; 6] },
    Rejected(Reject),
}

/// One LM endpoint; see the module docs.
#[derive(Debug)]
pub struct LmSocket {
    cfg: LmConfig,
    ifname: String,
    ctl: UdpSocket,
    xsk: Option<XskSocket>,
    program: Option<LmProgram>,
    notes: Vec<String>,
    mac: [u8; 6],
    mtu: u32,
    /// Payload bytes per fragment of our messages.
    payload: usize,
    /// Most fragments a message may have, either direction.
    max_count: usize,
    tx_base: u64,
    pad_addr: u64,
    /// The transmit region when there is no XSK.
    kernel_tx: Vec<u8>,
    /// The assembly buffer of the fallback receive path.
    kernel_rx: Vec<u8>,
    fill_queue: VecDeque<(u64, Slot)>,
    assembly: Assembly,
    queued: Option<(SocketAddrV4, Header)>,
    recent: VecDeque<(SocketAddrV4, u32)>,
    lost: VecDeque<LmLost>,
    waiting_for: Option<(SocketAddrV4, u32)>,
    answer: Option<Answer>,
    next_id: u32,
    next_token: u32,
    scratch: Vec<u8>,
    stats: LmStats,
    io_stats: Stats,
}

impl LmSocket {
    /// Opens an endpoint at `cfg.local` in the calling thread's network namespace: the
    /// control socket, then — unless `cfg.xsk` is off — an XSK bound to the interface queue
    /// and, for receiving, the XDP program. AF_XDP steps that fail do not fail the open:
    /// the socket falls back to the kernel's UDP path for that direction and says why in
    /// [`LmSocket::notes`] (and counts it per message).
    pub fn open(cfg: LmConfig) -> Result<LmSocket, LmError> {
        if cfg.max_message == 0 || cfg.max_message > (u32::MAX as usize) / 2 {
            return Err(LmError::Config(format!(
                "max_message {} must be between 1 and 2 GiB",
                cfg.max_message
            )));
        }
        let ifname = match &cfg.ifname {
            Some(n) => n.clone(),
            None => {
                let ip = std::net::IpAddr::V4(*cfg.local.ip());
                zcnet_sys::raw::socket::find_interface(|a| a == ip)
                    .map_err(io_err("getifaddrs"))?
                    .ok_or_else(|| {
                        LmError::Config(format!("no interface here has the address {ip}"))
                    })?
            }
        };
        let ctl = UdpSocket::bind(cfg.local).map_err(io_err("bind the LM control socket"))?;
        ctl.set_nonblocking(true)
            .map_err(io_err("set the LM control socket non-blocking"))?;
        // On the fallback receive path a whole message's datagrams may queue here at once
        // (truesize about twice the payload): room for a few of the largest.
        let want_rcvbuf = (4 * cfg.max_message).max(4 << 20);
        let rcvbuf = zcnet_sys::raw::udp_msg::grow_rcvbuf(ctl.as_fd(), want_rcvbuf)
            .map_err(io_err("SO_RCVBUF on the LM control socket"))?;
        let local = match ctl.local_addr().map_err(io_err("getsockname"))? {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(_) => unreachable!("bound to an IPv4 address"),
        };
        let mtu = zcnet_sys::raw::socket::interface_mtu(&ifname).map_err(io_err("SIOCGIFMTU"))?;
        let mac =
            zcnet_sys::raw::socket::interface_mac(&ifname).map_err(io_err("SIOCGIFHWADDR"))?;
        let cfg = LmConfig { local, ..cfg };
        let payload = wire::max_payload(mtu, CHUNK);
        if payload == 0 {
            return Err(LmError::Config(format!(
                "MTU {mtu} of {ifname} leaves no room for LM payload"
            )));
        }

        let max_count = cfg.max_message.div_ceil(payload);
        let tx_layout = Layout::new(cfg.max_message, payload).expect("payload > 0");
        let rx_len = if cfg.receive {
            Layout::rx_region(cfg.max_message, payload, CHUNK)
        } else {
            0
        };
        let tx_base = rx_len.next_multiple_of(64);
        let pad_addr = (tx_base + tx_layout.tx_len() as u64).next_multiple_of(64);
        let umem = (pad_addr + FRAME_HLEN as u64).next_multiple_of(u64::from(CHUNK));

        let mut sock = LmSocket {
            ifname,
            ctl,
            xsk: None,
            program: None,
            notes: Vec::new(),
            mac,
            mtu,
            payload,
            max_count,
            tx_base,
            pad_addr,
            kernel_tx: Vec::new(),
            kernel_rx: Vec::new(),
            fill_queue: VecDeque::new(),
            assembly: Assembly::Idle,
            queued: None,
            recent: VecDeque::new(),
            lost: VecDeque::new(),
            waiting_for: None,
            answer: None,
            next_id: 1,
            next_token: std::process::id().wrapping_mul(2_654_435_761) | 1,
            scratch: vec![0; 65536],
            stats: LmStats::default(),
            io_stats: Stats::new(),
            cfg,
        };
        let loopback = sock.cfg.local.ip().is_loopback() || sock.ifname == "lo";
        if sock.cfg.xsk && loopback {
            // Measured on 6.18: frames an XSK transmits on lo never reach the host's own
            // stack, and lo has no native XDP. LM is for two hosts; here it runs on the
            // kernel's UDP path so that a loopback run still works, and says so.
            sock.notes.push(format!(
                "{}: loopback, where AF_XDP transmit does not reach the host's own stack; the kernel's UDP path is used",
                sock.ifname
            ));
        } else if sock.cfg.xsk {
            let ring = (2 * max_count + 2).next_power_of_two() as u32;
            let xcfg = XskConfig {
                frame_size: CHUNK,
                frame_count: u32::try_from(umem / u64::from(CHUNK))
                    .map_err(|_| LmError::Config("UMEM too large".into()))?,
                headroom: 0,
                unaligned: true,
                fill_ring: ring,
                completion_ring: ring,
                rx_ring: ring,
                tx_ring: ring,
            };
            match sock.open_xsk(xcfg) {
                Ok(()) => {}
                Err(e) => sock.notes.push(format!(
                    "AF_XDP unavailable, the kernel's UDP path is used: {e}"
                )),
            }
        } else {
            sock.notes
                .push("AF_XDP turned off: the kernel's UDP path is used".into());
        }
        if sock.xsk.is_none() {
            sock.kernel_tx = vec![0; tx_layout.tx_len()];
        }
        if sock.program.is_none() && sock.cfg.receive && rcvbuf < want_rcvbuf {
            // Receiving through the socket, a burst beyond its buffer is dropped by the kernel
            // and the message reported lost: say why up front.
            sock.notes.push(format!(
                "receive buffer of the LM control socket is {rcvbuf} bytes, not the {want_rcvbuf} asked for \
                 (raise net.core.rmem_max, or run with CAP_NET_ADMIN): large messages on the kernel path may be lost"
            ));
        }
        Ok(sock)
    }

    fn open_xsk(&mut self, xcfg: XskConfig) -> Result<(), LmError> {
        let mut xsk = XskSocket::new(xcfg)?;
        // A socket closed just before (the previous run's) still holds the queue for a
        // moment: XSK teardown is asynchronous, and its bind then gives EBUSY.
        let start = Instant::now();
        let binding = loop {
            match xsk.bind(&self.ifname, self.cfg.queue, self.cfg.bind) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && start.elapsed() < BIND_BUSY => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                other => break other?,
            }
        };
        xsk.manage_by_address();
        if let Some(errno) = binding.zero_copy_refused {
            self.notes.push(format!(
                "XSK bound in copy mode: zero-copy bind of {} refused ({})",
                self.ifname,
                io::Error::from_raw_os_error(errno)
            ));
        }
        if self.cfg.receive {
            let attached = LmProgram::load(self.cfg.local.port()).and_then(|mut p| {
                p.attach(&self.ifname, self.cfg.attach)?;
                p.insert(self.cfg.queue, &xsk)?;
                Ok(p)
            });
            match attached {
                Ok(p) => self.program = Some(p),
                Err(e) => self.notes.push(format!(
                    "LM XDP program not attached to {}, receiving through the kernel's UDP path: {e}",
                    self.ifname
                )),
            }
        }
        self.xsk = Some(xsk);
        Ok(())
    }

    /// Our address (the control socket's, and the source of our frames).
    pub fn local_addr(&self) -> SocketAddrV4 {
        self.cfg.local
    }

    /// The interface.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// Its MTU when opened.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// The XSK binding, if AF_XDP is in use (`zero_copy` false: copy mode).
    pub fn binding(&self) -> Option<&Binding> {
        self.xsk.as_ref().and_then(XskSocket::binding)
    }

    /// Transmit goes through the XSK TX ring (else through the kernel's UDP socket).
    pub fn transmits_via_xsk(&self) -> bool {
        self.xsk.is_some()
    }

    /// Receive assembles in place in the UMEM (else by copying from the UDP socket).
    pub fn receives_in_place(&self) -> bool {
        self.program.is_some()
    }

    /// Why a fast path is not in use, one line each (empty when AF_XDP runs zero-copy).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The number the next message sent gets (numbers start at 1 and wrap).
    pub fn next_id(&self) -> u32 {
        self.next_id
    }

    /// Payload bytes per fragment of the messages we send.
    pub fn payload_per_fragment(&self) -> usize {
        self.payload
    }

    /// Message counters.
    pub fn stats(&self) -> &LmStats {
        &self.stats
    }

    /// Byte counters, with the fallbacks by reason.
    pub fn io_stats(&self) -> &Stats {
        &self.io_stats
    }

    /// What the XDP program counted, if it is attached.
    pub fn xdp_progress(&self) -> Result<Option<Progress>, LmError> {
        match &self.program {
            Some(p) => Ok(Some(p.progress()?)),
            None => Ok(None),
        }
    }

    /// Fault injection (netem is not in this kernel): the XDP program drops every
    /// `n`-th DATA frame of admitted senders; 0 stops it. Needs the program attached.
    pub fn inject_drop_every(&mut self, n: u32) -> Result<(), LmError> {
        match &mut self.program {
            Some(p) => Ok(p.drop_every(n)?),
            None => Err(LmError::Config(
                "fault injection needs the LM XDP program attached".into(),
            )),
        }
    }

    /// Lends the transmit region for a message of `len` bytes, laid out with header holes;
    /// waits (bounded) for the previous message's frames to complete first.
    pub fn loan(&mut self, len: usize) -> Result<LmBuf<'_>, LmError> {
        if len > self.cfg.max_message {
            return Err(LmError::TooLong {
                len,
                max: self.cfg.max_message,
            });
        }
        self.wait_tx_idle()?;
        let layout = Layout::new(len, self.payload).expect("payload > 0");
        Ok(LmBuf { sock: self, layout })
    }

    /// Sends a copy of `data` as one message: [`LmSocket::loan`], copy, [`LmBuf::send`].
    /// The lending send is [`LmBuf::send`] on the loan itself (it borrows this socket), so
    /// across zcnet `send` lends and `send_slice` copies.
    pub fn send_slice(&mut self, peer: SocketAddrV4, data: &[u8]) -> Result<u32, LmError> {
        let mut buf = self.loan(data.len())?;
        buf.copy_from(data);
        buf.send(peer)
    }

    fn wait_tx_idle(&mut self) -> Result<(), LmError> {
        let Some(xsk) = &mut self.xsk else {
            return Ok(());
        };
        let start = Instant::now();
        let limit = self.cfg.admission_timeout;
        loop {
            xsk.reap_completions();
            if xsk.tx_in_flight() == 0 {
                return Ok(());
            }
            if start.elapsed() >= limit {
                return Err(LmError::TxStuck(xsk.tx_in_flight(), limit));
            }
            // Copy mode completes inside the kick; a zero-copy driver needs the nudge.
            xsk.flush_tx()?;
            std::thread::yield_now();
        }
    }

    fn region_mut(&mut self, layout: &Layout) -> Result<&mut [u8], LmError> {
        let len = layout.tx_len();
        match &mut self.xsk {
            Some(x) => Ok(x.umem_mut(self.tx_base, len as u32)?),
            None => Ok(&mut self.kernel_tx[..len]),
        }
    }

    /// Admission, headers, frames last-first, `ENDME`.
    fn send_loaned(&mut self, peer: SocketAddrV4, layout: Layout) -> Result<u32, LmError> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let (token, pad, peer_mac) = self.acquire(peer, id, &layout)?;
        let n = layout.count();
        let local = self.cfg.local;
        let src_mac = self.mac;
        let header = |kind, index| Header {
            kind,
            token,
            msg_id: id,
            index,
            count: n as u32,
            total: layout.total as u32,
        };
        // Each slot holds exactly its frame (headers and fragment), and fragments are bounded
        // by the MTU: the writer cannot refuse.
        let udp_headers = |frame: &mut [u8], payload_len| {
            write_udp_headers(frame, src_mac, peer_mac, local, peer, payload_len)
                .expect("frame slots hold their headers and a payload within the MTU");
        };
        let via_xsk = self.xsk.is_some();
        {
            let region = self.region_mut(&layout)?;
            for k in 0..n {
                let len = layout.range(k).len();
                let frame = &mut region[layout.tx_frame(k)..layout.tx_payload(k) + len];
                if via_xsk {
                    udp_headers(frame, LM_HLEN + len);
                }
                header(Kind::Data, k as u32).write(&mut frame[UDP_FRAME_HLEN..]);
            }
        }
        let started = Instant::now();
        if let Some(xsk) = &mut self.xsk {
            let pad_frame = xsk.umem_mut(self.pad_addr, FRAME_HLEN as u32)?;
            udp_headers(pad_frame, LM_HLEN);
            header(Kind::Pad, 0).write(&mut pad_frame[UDP_FRAME_HLEN..]);
            let frames = (0..pad as usize)
                .map(|_| (self.pad_addr, FRAME_HLEN as u32))
                .chain((0..n).rev().map(|k| {
                    (
                        self.tx_base + layout.tx_frame(k) as u64,
                        (FRAME_HLEN + layout.range(k).len()) as u32,
                    )
                }));
            let mut frames = frames.peekable();
            let limit = self.cfg.admission_timeout;
            while frames.peek().is_some() || xsk.tx_queued() > 0 {
                while xsk.tx_free() > 0 {
                    let Some((addr, len)) = frames.next() else {
                        break;
                    };
                    xsk.tx_at(addr, len)?;
                }
                xsk.flush_tx()?;
                self.stats.tx_kicks += 1;
                xsk.reap_completions();
                if started.elapsed() >= limit {
                    return Err(LmError::TxStuck(xsk.tx_in_flight(), limit));
                }
            }
        } else {
            let pad_dgram = header(Kind::Pad, 0).control(None);
            for _ in 0..pad {
                send_dgram(&self.ctl, &pad_dgram, peer)?;
            }
            for k in (0..n).rev() {
                let from = layout.tx_frame(k) + UDP_FRAME_HLEN;
                let to = layout.tx_payload(k) + layout.range(k).len();
                send_dgram(&self.ctl, &self.kernel_tx[from..to], peer)?;
            }
        }
        let endme = header(Kind::EndMe, n as u32).control(None);
        send_dgram(&self.ctl, &endme, peer)?;

        let bytes = layout.total as u64;
        self.stats.messages_sent += 1;
        self.stats.bytes_sent += bytes;
        self.stats.fragments_sent += n as u64;
        self.stats.pads_sent += u64::from(pad);
        match self.binding() {
            Some(b) if b.zero_copy => self.io_stats.add_tx_zerocopy_bytes(bytes),
            Some(_) => {
                self.io_stats.add_tx_copy_bytes(bytes);
                self.io_stats.fallback(FallbackReason::XskCopyMode, bytes);
            }
            None => {
                self.io_stats.add_tx_copy_bytes(bytes);
                self.io_stats
                    .fallback(FallbackReason::XskUnavailable, bytes);
            }
        }
        if via_xsk {
            self.stats.sent_xsk += 1;
        } else {
            self.stats.sent_kernel += 1;
        }
        Ok(id)
    }

    /// `LM_REQ` until `LM_ACQ_OK`, backing off on busy rejections, within the admission
    /// timeout. Serves our own receive side meanwhile.
    fn acquire(
        &mut self,
        peer: SocketAddrV4,
        id: u32,
        layout: &Layout,
    ) -> Result<(u32, u32, [u8; 6]), LmError> {
        let req = Header {
            kind: Kind::Req,
            token: 0,
            msg_id: id,
            index: layout.payload as u32,
            count: layout.count() as u32,
            total: layout.total as u32,
        }
        .control(None);
        let start = Instant::now();
        let deadline = start + self.cfg.admission_timeout;
        let (mut rejections, mut retries) = (0u64, 0u64);
        let mut backoff = BACKOFF_MIN;
        self.waiting_for = Some((peer, id));
        self.answer = None;
        let result = loop {
            send_dgram(&self.ctl, &req, peer)?;
            self.stats.requests_sent += 1;
            let retry_at = (Instant::now() + REQUEST_RETRY).min(deadline);
            self.pump(retry_at, |s| s.answer.is_some())?;
            match self.answer.take() {
                Some(Answer::Ok { token, pad, mac }) => break Ok((token, pad, mac)),
                Some(Answer::Rejected(Reject::Busy)) => {
                    rejections += 1;
                    self.stats.rejected_busy += 1;
                    let until = (Instant::now() + backoff).min(deadline);
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    self.pump(until, |_| false)?;
                }
                Some(Answer::Rejected(r)) => {
                    self.stats.rejected_refused += 1;
                    break Err(LmError::Refused {
                        peer,
                        id,
                        reason: r.name(),
                    });
                }
                None => {
                    retries += 1;
                    self.stats.request_retries += 1;
                }
            }
            if Instant::now() >= deadline {
                break Err(LmError::NotAdmitted {
                    peer,
                    id,
                    waited: start.elapsed(),
                    rejections,
                    retries,
                });
            }
        };
        self.waiting_for = None;
        result
    }

    /// The next message or loss report, waiting up to `timeout`; `None` on timeout. The
    /// message is borrowed in place until the next call on the socket.
    pub fn recv(&mut self, timeout: Duration) -> Result<Option<LmEvent<'_>>, LmError> {
        let deadline = Instant::now() + timeout;
        self.pump(deadline, |s| {
            !s.lost.is_empty() || matches!(s.assembly, Assembly::Ready(_))
        })?;
        if let Some(l) = self.lost.pop_front() {
            return Ok(Some(LmEvent::Lost(l)));
        }
        // Only a whole message is taken; one still being assembled stays as it is.
        if !matches!(self.assembly, Assembly::Ready(_)) {
            return Ok(None);
        }
        let Assembly::Ready(a) = std::mem::replace(&mut self.assembly, Assembly::Idle) else {
            unreachable!("checked Ready above");
        };
        self.remember(a.from, a.id);
        let len = a.layout.total;
        self.stats.messages_received += 1;
        self.stats.bytes_received += len as u64;
        let data = if a.in_place {
            self.stats.received_in_place += 1;
            let xsk = self.xsk.as_ref().expect("in-place assembly needs the XSK");
            if self.binding().is_some_and(|b| b.zero_copy) {
                self.io_stats.add_rx_mapped_bytes(len as u64);
            } else {
                self.io_stats.add_rx_copied_bytes(len as u64);
                self.io_stats
                    .fallback(FallbackReason::XskCopyMode, len as u64);
            }
            xsk.umem(a.layout.rx_message(), len as u32)?
        } else {
            self.stats.received_kernel += 1;
            self.io_stats.add_rx_copied_bytes(len as u64);
            self.io_stats
                .fallback(FallbackReason::XskUnavailable, len as u64);
            &self.kernel_rx[..len]
        };
        Ok(Some(LmEvent::Message(LmMessage {
            from: a.from,
            id: a.id,
            in_place: a.in_place,
            data,
        })))
    }

    fn remember(&mut self, from: SocketAddrV4, id: u32) {
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back((from, id));
    }

    /// Runs the endpoint until `done` or `until`: control datagrams, placed frames, timers.
    fn pump(&mut self, until: Instant, done: impl Fn(&LmSocket) -> bool) -> Result<(), LmError> {
        loop {
            self.read_control()?;
            self.read_placed()?;
            self.timers()?;
            if done(self) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= until {
                return Ok(());
            }
            let mut wake = until;
            if let Assembly::Active(a) = &self.assembly {
                wake = wake.min(a.admitted_at + self.cfg.assembly_timeout);
                if let Some(e) = a.endme_at {
                    wake = wake.min(e + ENDME_GRACE);
                }
            }
            let wait = wake.saturating_duration_since(now);
            let polled = match (&self.xsk, &self.program) {
                (Some(x), Some(_)) => zcnet_sys::raw::socket::poll_all(
                    [
                        (self.ctl.as_fd(), zcnet_sys::raw::socket::PollFlags::IN),
                        (x.as_fd(), zcnet_sys::raw::socket::PollFlags::IN),
                    ],
                    Some(wait),
                )
                .map(|_| ()),
                _ => zcnet_sys::raw::socket::poll_all(
                    [(self.ctl.as_fd(), zcnet_sys::raw::socket::PollFlags::IN)],
                    Some(wait),
                )
                .map(|_| ()),
            };
            match polled {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err("poll")(e)),
            }
        }
    }

    fn read_control(&mut self) -> Result<(), LmError> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let result = loop {
            match self.ctl.recv_from(&mut scratch) {
                Ok((n, SocketAddr::V4(from))) => {
                    if let Err(e) = self.on_datagram(from, &scratch[..n]) {
                        break Err(e);
                    }
                }
                Ok(_) => self.stats.control_ignored += 1,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // A port-unreachable from an earlier datagram: nothing to do with this one.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
                Err(e) => break Err(io_err("recvfrom on the LM control socket")(e)),
            }
        };
        self.scratch = scratch;
        result
    }

    fn on_datagram(&mut self, from: SocketAddrV4, d: &[u8]) -> Result<(), LmError> {
        let Some(h) = Header::parse(d) else {
            self.stats.control_ignored += 1;
            return Ok(());
        };
        match h.kind {
            Kind::Req => self.on_request(from, h)?,
            Kind::AcqOk | Kind::AcqRej if self.waiting_for == Some((from, h.msg_id)) => {
                self.answer = Some(match h.kind {
                    Kind::AcqOk => match Header::trailer_mac(d) {
                        Some(mac) => Answer::Ok {
                            token: h.token,
                            pad: h.index,
                            mac,
                        },
                        None => {
                            self.stats.control_ignored += 1;
                            return Ok(());
                        }
                    },
                    _ => Answer::Rejected(Reject::from_u32(h.index)),
                });
            }
            Kind::EndMe => match &mut self.assembly {
                Assembly::Active(a) if a.from == from && a.token == h.token => {
                    a.endme_at = Some(Instant::now());
                }
                // The usual case: the last fragment came before the ENDME did.
                Assembly::Ready(a) if a.from == from && a.token == h.token => {}
                _ if self.recent.contains(&(from, h.msg_id)) => {}
                _ => self.stats.control_ignored += 1,
            },
            Kind::Data => self.on_kernel_data(from, h, &d[LM_HLEN..])?,
            // PAD through the kernel: we posted no chunk for it, nothing to consume.
            Kind::Pad => {}
            _ => self.stats.control_ignored += 1,
        }
        Ok(())
    }

    fn reply(&self, to: SocketAddrV4, h: Header, mac: Option<[u8; 6]>) -> Result<(), LmError> {
        send_dgram(&self.ctl, &h.control(mac), to)
    }

    fn reject(&mut self, to: SocketAddrV4, req: Header, why: Reject) -> Result<(), LmError> {
        match why {
            Reject::Busy => self.stats.refused_busy += 1,
            _ => self.stats.refused_geometry += 1,
        }
        let h = Header {
            kind: Kind::AcqRej,
            token: 0,
            index: why as u32,
            ..req
        };
        self.reply(to, h, None)
    }

    fn on_request(&mut self, from: SocketAddrV4, h: Header) -> Result<(), LmError> {
        let total = h.total as usize;
        let payload = h.index as usize;
        if !self.cfg.receive {
            return self.reject(from, h, Reject::BadGeometry);
        }
        if total > self.cfg.max_message {
            return self.reject(from, h, Reject::TooLong);
        }
        let Some(layout) = Layout::new(total, payload) else {
            return self.reject(from, h, Reject::BadGeometry);
        };
        if payload > wire::max_payload(self.mtu, CHUNK)
            || layout.count() != h.count as usize
            || layout.count() > self.max_count
        {
            return self.reject(from, h, Reject::BadGeometry);
        }
        match &self.assembly {
            Assembly::Active(a) | Assembly::Ready(a) if a.from == from && a.id == h.msg_id => {
                // The sender asked again before our answer arrived: same answer.
                self.stats.duplicate_requests += 1;
                if let Assembly::Active(a) = &self.assembly {
                    let ok = Header {
                        kind: Kind::AcqOk,
                        token: a.token,
                        index: a.pad,
                        ..h
                    };
                    self.reply(from, ok, Some(self.mac))?;
                }
                Ok(())
            }
            _ if self.recent.contains(&(from, h.msg_id)) => {
                self.stats.duplicate_requests += 1;
                Ok(())
            }
            Assembly::Idle => self.admit(from, h, layout),
            Assembly::Active(a) | Assembly::Ready(a) if a.from == from => {
                // The same sender's next message: admitted as soon as this one is delivered.
                self.queued = Some((from, h));
                Ok(())
            }
            _ => self.reject(from, h, Reject::Busy),
        }
    }

    fn admit(&mut self, from: SocketAddrV4, h: Header, layout: Layout) -> Result<(), LmError> {
        let token = self.next_token;
        self.next_token = self.next_token.wrapping_add(2);
        let count = layout.count();
        let mut pad = 0;
        let in_place = self.program.is_some();
        if let (Some(xsk), Some(program)) = (&mut self.xsk, &mut self.program) {
            // Everything still on the FILL ring is stale (nothing is active); the sender
            // sends one PAD frame for each, ahead of its fragments.
            debug_assert!(self.fill_queue.iter().all(|&(_, s)| s == Slot::Stale));
            pad = self.fill_queue.len() as u32;
            if (xsk.fill_free() as usize) < count {
                return self.reject(from, h, Reject::Busy);
            }
            for k in (0..count).rev() {
                let chunk = layout.rx_chunk(k);
                xsk.fill_at(chunk)?;
                self.fill_queue.push_back((chunk, Slot::Fragment(k)));
            }
            program.admit(Some(Admission {
                sender: from,
                token,
                count: count as u32,
            }))?;
        } else {
            self.kernel_rx.clear();
            self.kernel_rx.resize(layout.total, 0);
        }
        self.assembly = Assembly::Active(Active {
            from,
            id: h.msg_id,
            token,
            pad,
            layout,
            in_place,
            arrived: 0,
            got: if in_place {
                Vec::new()
            } else {
                vec![false; count]
            },
            admitted_at: Instant::now(),
            endme_at: None,
        });
        self.stats.admitted += 1;
        let ok = Header {
            kind: Kind::AcqOk,
            token,
            index: pad,
            ..h
        };
        self.reply(from, ok, Some(self.mac))
    }

    fn read_placed(&mut self) -> Result<(), LmError> {
        if self.program.is_none() {
            return Ok(());
        }
        loop {
            let xsk = self.xsk.as_mut().expect("a program implies an XSK");
            let Some(p) = xsk.recv_placed(Duration::ZERO)? else {
                return Ok(());
            };
            self.on_placed(p)?;
        }
    }

    fn on_placed(&mut self, p: Placed) -> Result<(), LmError> {
        let Some((chunk, slot)) = self.fill_queue.pop_front() else {
            // A chunk we never posted: a kernel bug; nothing of ours is affected.
            return Ok(());
        };
        if chunk != p.chunk {
            // The kernel took a chunk out of ring order: keep the mirror true, and the
            // message that was being placed cannot be trusted.
            if let Some(i) = self.fill_queue.iter().position(|&(c, _)| c == p.chunk) {
                self.fill_queue.remove(i);
                self.fill_queue.push_front((chunk, slot));
            }
            return self.lose(LossReason::Misplaced);
        }
        let Assembly::Active(a) = &mut self.assembly else {
            return Ok(());
        };
        match slot {
            Slot::Stale if p.len as usize == FRAME_HLEN => {
                self.stats.pads_placed += 1;
                Ok(())
            }
            Slot::Stale => self.lose(LossReason::Misplaced),
            Slot::Fragment(k) => {
                let expect_len = FRAME_HLEN + a.layout.range(k).len();
                if k != a.layout.count() - 1 - a.arrived
                    || p.addr != chunk + XDP_HEADROOM
                    || p.len as usize != expect_len
                {
                    return self.lose(LossReason::Misplaced);
                }
                a.arrived += 1;
                self.stats.fragments_placed += 1;
                if a.arrived == a.layout.count() {
                    self.complete()?;
                }
                Ok(())
            }
        }
    }

    fn on_kernel_data(
        &mut self,
        from: SocketAddrV4,
        h: Header,
        payload: &[u8],
    ) -> Result<(), LmError> {
        let Assembly::Active(a) = &mut self.assembly else {
            self.stats.foreign_dropped += 1;
            return Ok(());
        };
        let k = h.index as usize;
        if a.in_place
            || a.from != from
            || a.token != h.token
            || a.id != h.msg_id
            || k >= a.got.len()
            || payload.len() != a.layout.range(k).len()
        {
            self.stats.foreign_dropped += 1;
            return Ok(());
        }
        if !a.got[k] {
            a.got[k] = true;
            a.arrived += 1;
            self.kernel_rx[a.layout.range(k)].copy_from_slice(payload);
        }
        if a.arrived == a.got.len() {
            self.complete()?;
        }
        Ok(())
    }

    /// The active message is whole: close the admission and hold it for `recv`.
    fn complete(&mut self) -> Result<(), LmError> {
        if !matches!(self.assembly, Assembly::Active(_)) {
            return Ok(());
        }
        let Assembly::Active(a) = std::mem::replace(&mut self.assembly, Assembly::Idle) else {
            unreachable!("checked Active above");
        };
        self.assembly = Assembly::Ready(a);
        if let Some(p) = &mut self.program {
            p.admit(None)?;
        }
        Ok(())
    }

    /// The active message will not complete: close the admission, turn its posted chunks
    /// into stale ones (PAD frames of the next sender take them) and report it.
    fn lose(&mut self, reason: LossReason) -> Result<(), LmError> {
        // A message already whole (Ready) is not lost by a later stray frame.
        if !matches!(self.assembly, Assembly::Active(_)) {
            return Ok(());
        }
        let Assembly::Active(a) = std::mem::replace(&mut self.assembly, Assembly::Idle) else {
            unreachable!("checked Active above");
        };
        if let Some(p) = &mut self.program {
            p.admit(None)?;
        }
        for (_, slot) in &mut self.fill_queue {
            *slot = Slot::Stale;
        }
        self.stats.lost(reason);
        self.remember(a.from, a.id);
        self.lost.push_back(LmLost {
            from: a.from,
            id: a.id,
            len: a.layout.total,
            arrived: a.arrived,
            count: a.layout.count(),
            reason,
        });
        Ok(())
    }

    fn timers(&mut self) -> Result<(), LmError> {
        let now = Instant::now();
        if let Assembly::Active(a) = &self.assembly {
            if now >= a.admitted_at + self.cfg.assembly_timeout {
                return self.lose(LossReason::Timeout);
            }
            if let Some(endme) = a.endme_at {
                // The sender is done. If the XDP program dropped fragments of this token and
                // every frame it let through is placed, nothing more can come.
                if let Some(program) = &self.program {
                    let p = program.progress()?;
                    if p.token == a.token && p.broken && a.arrived >= p.received as usize {
                        return self.lose(LossReason::Dropped);
                    }
                }
                if now >= endme + ENDME_GRACE {
                    return self.lose(LossReason::Dropped);
                }
            }
        }
        if matches!(self.assembly, Assembly::Idle) {
            if let Some((from, h)) = self.queued.take() {
                self.on_request(from, h)?;
            }
        }
        Ok(())
    }
}

/// A message's transmit region, lent by [`LmSocket::loan`]: payload slots between header
/// holes. Write the payload, then [`LmBuf::send`].
#[derive(Debug)]
pub struct LmBuf<'a> {
    sock: &'a mut LmSocket,
    layout: Layout,
}

impl LmBuf<'_> {
    /// Message length.
    pub fn len(&self) -> usize {
        self.layout.total
    }

    /// True for an empty message.
    pub fn is_empty(&self) -> bool {
        self.layout.total == 0
    }

    /// Fragments the message will have.
    pub fn fragments(&self) -> usize {
        self.layout.count()
    }

    /// Each fragment's payload slot, writable in place, with its offset in the message.
    pub fn fragments_mut(&mut self) -> Result<Vec<(usize, &mut [u8])>, LmError> {
        let layout = self.layout;
        let region = self.sock.region_mut(&layout)?;
        Ok(region
            .chunks_mut(layout.tx_stride())
            .enumerate()
            .map(|(k, c)| (layout.range(k).start, &mut c[FRAME_HLEN..]))
            .collect())
    }

    /// Copies `data` into the message at `offset`, across the holes. Panics if it does not
    /// fit in the message, as slice indexing does.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) {
        assert!(
            offset
                .checked_add(data.len())
                .is_some_and(|e| e <= self.layout.total),
            "write of {} bytes at {offset} outside a message of {} bytes",
            data.len(),
            self.layout.total
        );
        let layout = self.layout;
        let region = self
            .sock
            .region_mut(&layout)
            .expect("the region was checked free when lent, and nothing posts while it is");
        let mut done = 0;
        while done < data.len() {
            let off = offset + done;
            let (k, within) = (off / layout.payload, off % layout.payload);
            let n = (layout.payload - within).min(data.len() - done);
            let at = layout.tx_payload(k) + within;
            region[at..at + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
    }

    /// Copies the whole message from `data` (which must be exactly as long).
    pub fn copy_from(&mut self, data: &[u8]) {
        assert_eq!(
            data.len(),
            self.layout.total,
            "copy_from needs the whole message"
        );
        self.write_at(0, data);
    }

    /// Sends the message to `peer`: admission, frames last-first, `ENDME`. Returns its
    /// message number.
    pub fn send(self, peer: SocketAddrV4) -> Result<u32, LmError> {
        self.sock.send_loaned(peer, self.layout)
    }
}

fn send_dgram(ctl: &UdpSocket, d: &[u8], to: SocketAddrV4) -> Result<(), LmError> {
    loop {
        match ctl.send_to(d, to) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let _ = zcnet_sys::raw::socket::poll(
                    ctl.as_fd(),
                    zcnet_sys::raw::socket::PollFlags::OUT,
                    Some(Duration::from_millis(10)),
                );
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // An ICMP error queued by an earlier datagram: this one is not affected.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
            Err(e) => return Err(io_err("sendto on the LM control socket")(e)),
        }
    }
}
