//! [`MsgReceiver`]: datagrams in, whole messages or losses out.
//!
//! The socket asks for `UDP_GRO` (udp(7)): the kernel then hands over up to 64 KiB of one
//! flow's datagrams per `recvmsg`, with the segment size in a `SOL_UDP`/`UDP_GRO` control
//! message — on loopback and veth a GSO send even arrives unsegmented. The read is cut at
//! that size back into datagrams, each header is checked, and each payload is copied to its
//! place in the message's buffer by the [`Reassembly`] table. A refused `UDP_GRO` means one
//! datagram per read, counted (`gro_refused`). `MSG_TRUNC` is passed so the kernel says how
//! long the packet really was: datagrams past the end of the buffer are reported lost
//! ([`LossReason::Truncated`](super::LossReason::Truncated)) when their header survived, or
//! time out.

use super::reassembly::{InFlight, Reassembly};
use super::stats::MsgStats;
use super::{Message, MsgConfig, MsgError, MsgEvent};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcnet::Error;
use zcnet::Stats;
use zcnet_sys::raw::socket;
use zcnet_sys::raw::udp;
use zcnet_sys::raw::udp_msg;

/// Receives whole messages on a bound UDP socket (see the module docs).
#[derive(Debug)]
pub struct MsgReceiver {
    sock: UdpSocket,
    gro: bool,
    buf: Vec<u8>,
    table: Reassembly,
    stats: Arc<MsgStats>,
    io: Arc<Stats>,
    rcvbuf: usize,
}

impl MsgReceiver {
    /// Binds `addr` (port 0 picks one) in the calling thread's network namespace.
    pub fn bind(addr: SocketAddr, cfg: &MsgConfig) -> Result<MsgReceiver, MsgError> {
        cfg.validate()?;
        let sock = UdpSocket::bind(addr).map_err(|e| Error::io("bind(UDP)", e))?;
        Self::from_socket(sock, cfg)
    }

    /// Takes over a bound UDP socket (connected or not).
    pub fn from_socket(sock: UdpSocket, cfg: &MsgConfig) -> Result<MsgReceiver, MsgError> {
        cfg.validate()?;
        let stats = Arc::new(MsgStats::new());
        let (gro, rcvbuf) = cfg.prepare_receive_socket(sock.as_fd(), &stats)?;
        Ok(MsgReceiver {
            sock,
            gro,
            buf: vec![0u8; cfg.datagram_buffer],
            table: Reassembly::new(cfg.reassembly, cfg.max_message),
            stats,
            io: Arc::new(Stats::new()),
            rcvbuf,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// Whether `UDP_GRO` is on.
    pub fn gro_enabled(&self) -> bool {
        self.gro
    }

    /// The socket's receive buffer as the kernel reports it (twice the usable bytes).
    pub fn rcvbuf(&self) -> usize {
        self.rcvbuf
    }

    /// Message counters.
    pub fn stats(&self) -> &Arc<MsgStats> {
        &self.stats
    }

    /// Socket-level byte counters (`rx_bytes_copied`: every byte read, headers included).
    pub fn io_stats(&self) -> &Arc<Stats> {
        &self.io
    }

    /// Messages and bytes being reassembled now.
    pub fn in_flight(&self) -> InFlight {
        self.table.in_flight()
    }

    /// The reassembly table (read-only: limits, senders tracked).
    pub fn reassembly(&self) -> &Reassembly {
        &self.table
    }

    /// Gives a delivered message's buffer back for reuse by a later one.
    pub fn recycle(&mut self, msg: Message) {
        self.table.recycle(msg.data);
    }

    /// The next event — a whole message, or messages lost — waiting up to `timeout`;
    /// `None` when nothing happened in that time. Losses are found while waiting too, so a
    /// caller that only ever calls `recv` sees every one.
    pub fn recv(&mut self, timeout: Duration) -> Result<Option<MsgEvent>, MsgError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.table.expire(Instant::now(), &self.stats);
            if let Some(ev) = self.table.pop_event() {
                return Ok(Some(ev));
            }
            if self.read_one()? {
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let wake = self
                .table
                .next_deadline()
                .map_or(deadline, |t| t.min(deadline));
            let wait = wake
                .saturating_duration_since(now)
                .max(Duration::from_millis(1));
            match socket::poll(
                self.sock.as_fd(),
                zcnet_sys::raw::socket::PollFlags::IN,
                Some(wait),
            ) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(Error::io("poll", e).into()),
            }
        }
    }

    /// One non-blocking read, fed to the table; false when nothing was queued.
    fn read_one(&mut self) -> Result<bool, MsgError> {
        let r = match udp_msg::recv_datagram(
            self.sock.as_fd(),
            &mut self.buf,
            zcnet_sys::raw::socket::RecvFlags::DONTWAIT,
        ) {
            Ok(r) => r,
            Err(e) => {
                return match e.raw_os_error() {
                    Some(libc::EAGAIN) => Ok(false),
                    Some(libc::EINTR) => Ok(true),
                    _ => Err(Error::io("recvmsg(UDP)", e).into()),
                }
            }
        };
        self.table.feed(&self.buf, &r, Instant::now(), &self.stats);
        self.io.add_rx_copied_bytes(r.len as u64);
        Ok(true)
    }
}

impl Reassembly {
    /// Cuts one read `r` of `buf` (a `UDP_GRO` read holds several datagrams of `r.gso_size`
    /// bytes) back into datagrams and takes each in; a datagram cut by `MSG_TRUNC` is
    /// reported truncated when its header survived. Counts the read. Shared by
    /// [`MsgReceiver`] and zcnet-tokio's `ZcUdpSocket`, so both take the same wire apart the
    /// same way.
    pub fn feed(&mut self, buf: &[u8], r: &udp_msg::DatagramRecv, now: Instant, stats: &MsgStats) {
        let from = r
            .from
            .unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)));
        stats.reads(1);
        if r.truncated {
            stats.truncated_reads(1);
        }
        let seg = match r.gso_size {
            Some(g) if usize::from(g) < r.full_len => {
                stats.gro_reads(1);
                usize::from(g)
            }
            _ => r.full_len.max(1),
        };
        let mut start = 0;
        while start < r.full_len.max(1) {
            let end = (start + seg).min(r.full_len);
            if end <= r.len {
                self.datagram(from, &buf[start..end], now, stats);
            } else if start < r.len {
                self.truncated(from, &buf[start..r.len], now, stats);
            } else {
                // Never reached the buffer: nothing to attribute; their messages time out.
                break;
            }
            start += seg;
        }
    }
}

impl MsgConfig {
    /// Asks for `UDP_GRO` on a receiving `sock` and grows its receive buffer as this
    /// configuration says, counting a refused GRO in `stats`; returns whether GRO is on and the
    /// receive buffer's size. What [`MsgReceiver`] does to its socket, for zcnet-tokio's
    /// `ZcUdpSocket` to do the same.
    pub fn prepare_receive_socket(
        &self,
        sock: std::os::fd::BorrowedFd<'_>,
        stats: &MsgStats,
    ) -> Result<(bool, usize), MsgError> {
        let mut gro = false;
        if self.gro {
            match udp::set_udp_gro(sock, true) {
                Ok(()) => gro = true,
                Err(e) => stats.set_gro_refused(e.raw_os_error().unwrap_or(0)),
            }
        }
        let rcvbuf = udp_msg::grow_rcvbuf(sock, self.recv_buffer)
            .map_err(|e| Error::io("setsockopt(SO_RCVBUF)", e))?;
        Ok((gro, rcvbuf))
    }
}
