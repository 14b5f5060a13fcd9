//! iperf3's UDP streams (`-u`) on zcnet's end: connecting them as iperf3 does (the
//! connect datagram and its reply, [`zcnet_bench::iperf3::udp`]), then one thread per
//! stream sending paced datagrams or counting received ones.
//!
//! zcnet's paths where they fit the wire format: a sender writes each datagram's header
//! (send time, packet number) into a batch of `-l`-byte segments and sends the batch in one
//! `sendmsg` with UDP GSO (`UDP_SEGMENT`), so the kernel cuts it into datagrams; a receiver
//! turns on UDP GRO and splits what one `recvmsg` returns at the segment size the kernel
//! reports. Where the kernel refuses GSO for a socket (a block over the path MTU, an old
//! kernel) the sender falls back to one datagram per `send` for good, and says so in
//! `end.zcnet.local.udp`; both ends count datagrams and system calls there.
//! `MSG_ZEROCOPY` is not used: on the datagram sizes iperf3 sends, and on loopback where
//! the kernel copies anyway, it costs more than the copy it would save.

use super::streams::{Control, Live, LiveUdp, Running, StreamOut, UdpOut};
use crate::bench::spec::BenchError;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use zcnet_bench::cpu::CpuSeconds;
use zcnet_bench::iperf3::udp::{self as wire, Header, RecvCounters};

/// How long one blocking receive waits before the thread looks at [`Control`] again.
const RECV_SLICE: Duration = Duration::from_millis(50);
/// After the test's end, a receiver stops once nothing has arrived for this long.
const QUIET_END: Duration = Duration::from_millis(100);
/// Receive buffer asked for on zcnet's receiving sockets: room for a burst of a fast
/// sender without loss the network did not cause.
const RCVBUF: usize = 8 << 20;
/// Most segments in one GSO send (the kernel's `UDP_MAX_SEGMENTS` is 64 on older kernels).
const MAX_SEGMENTS: u64 = 64;

fn io(ctx: &'static str) -> impl Fn(std::io::Error) -> BenchError {
    move |e| BenchError::io(ctx, e)
}

/// A UDP socket bound to `addr` with `SO_REUSEADDR`, so the server's per-stream sockets
/// (each connected to its client) and the next stream's unconnected one share the port.
pub(crate) fn bind_reuse(addr: SocketAddr) -> Result<UdpSocket, BenchError> {
    use rustix::net::{AddressFamily, SocketType};
    let family = if addr.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let fd: OwnedFd = rustix::net::socket(family, SocketType::DGRAM, None)
        .map_err(|e| BenchError::io("socket (UDP)", e.into()))?;
    rustix::net::sockopt::set_socket_reuseaddr(&fd, true)
        .map_err(|e| BenchError::io("SO_REUSEADDR (UDP)", e.into()))?;
    rustix::net::bind(&fd, &addr)
        .map_err(|e| BenchError::io_owned(format!("binding UDP {addr}"), e.into()))?;
    Ok(UdpSocket::from(fd))
}

/// The server's half of connecting `n` streams (`iperf_udp_accept`): on `listener` (bound
/// to the control connection's local address before `CREATE_STREAMS` went out), each
/// client's connect datagram; that socket is connected to the client, a fresh one bound for
/// the next, and the reply sent. Within `deadline`.
pub(crate) fn accept(
    mut listener: UdpSocket,
    addr: SocketAddr,
    n: u32,
    deadline: Instant,
) -> Result<Vec<UdpSocket>, BenchError> {
    let mut out = Vec::with_capacity(n as usize);
    let mut buf = [0u8; 64];
    for i in 0..n {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(BenchError::Failed(format!(
                "{i} of {n} UDP streams connected in time"
            )));
        }
        listener
            .set_read_timeout(Some(left))
            .map_err(io("SO_RCVTIMEO (UDP)"))?;
        let (_, peer) = listener
            .recv_from(&mut buf)
            .map_err(io("waiting for a UDP stream's connect datagram"))?;
        listener.connect(peer).map_err(io("connect (UDP stream)"))?;
        let next = if i + 1 < n {
            Some(bind_reuse(addr)?)
        } else {
            None
        };
        listener
            .send(&wire::word_bytes(wire::CONNECT_REPLY))
            .map_err(io("sending a UDP stream's connect reply"))?;
        out.push(listener);
        match next {
            Some(s) => listener = s,
            None => break,
        }
    }
    Ok(out)
}

/// The client's half (`iperf_udp_connect`): a socket connected to the server's port, the
/// connect datagram, and its reply (with `-R`, data may come first: up to two blocks of
/// it are skipped, as iperf3's client does).
pub(crate) fn connect(server: SocketAddr, len: u64) -> Result<UdpSocket, BenchError> {
    let any: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0".parse().expect("an address")
    } else {
        "[::]:0".parse().expect("an address")
    };
    let s = UdpSocket::bind(any).map_err(io("bind (UDP)"))?;
    s.connect(server).map_err(io("connect (UDP)"))?;
    s.set_read_timeout(Some(super::opts::CONTROL_TIMEOUT))
        .map_err(io("SO_RCVTIMEO (UDP)"))?;
    s.send(&wire::word_bytes(wire::CONNECT_MSG))
        .map_err(io("sending the UDP connect datagram"))?;
    let mut buf = vec![0u8; len.max(4) as usize];
    for _ in 0..3 {
        let k = s
            .recv(&mut buf)
            .map_err(io("waiting for the UDP connect reply"))?;
        if k == 4 && wire::is_reply(&buf[..4]) {
            return Ok(s);
        }
    }
    Err(BenchError::Failed(
        "the server did not answer the UDP connect datagram".into(),
    ))
}

/// How a UDP test moves data on this end.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UdpCfg {
    /// `-l`: bytes per datagram.
    pub len: u64,
    /// `-b`: bits per second per stream, 0 for unlimited.
    pub rate: u64,
    /// `--udp-counters-64bit`.
    pub wide: bool,
    /// `-n` over all sending streams (the client's), if given.
    pub quota: Option<u64>,
}

/// One UDP stream before its thread starts.
pub(crate) struct UdpSpec {
    pub id: u32,
    pub sender: bool,
    pub socket: UdpSocket,
}

/// Starts every stream's thread; `t0` is the test's start.
pub(crate) fn start(
    specs: Vec<UdpSpec>,
    cfg: UdpCfg,
    ctl: &Arc<Control>,
    t0: Instant,
) -> Result<Vec<Running>, BenchError> {
    let mut running = Vec::with_capacity(specs.len());
    for s in specs {
        let live = Arc::new(Live {
            udp: Some(LiveUdp::default()),
            ..Live::default()
        });
        let (l, c) = (live.clone(), ctl.clone());
        let (id, sender) = (s.id, s.sender);
        let socket = s.socket.as_raw_fd();
        let spawned = Running::spawn(id, socket, sender, true, None, live, move || {
            if sender {
                send_loop(s, cfg, &l, &c, t0)
            } else {
                recv_loop(s, cfg, &l, &c, t0)
            }
        });
        match spawned {
            Ok(r) => running.push(r),
            Err(e) => {
                ctl.stop.store(true, Ordering::Relaxed);
                ctl.abort.store(true, Ordering::Relaxed);
                for r in running {
                    let _ = r.join();
                }
                return Err(BenchError::io("starting a UDP stream's thread", e));
            }
        }
    }
    Ok(running)
}

fn thread_cpu() -> Result<zcnet_sys::raw::cpu::Rusage, BenchError> {
    zcnet_sys::raw::cpu::thread().map_err(|e| BenchError::io("getrusage(RUSAGE_THREAD)", e))
}

fn now_stamp() -> (u32, u32, f64) {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs() as u32, d.subsec_micros(), d.as_secs_f64())
}

/// Errors that mean "not now" for a datagram send: the socket's queue is full, or the
/// peer's port answered ICMP unreachable (its socket not there yet, or already gone).
fn transient(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOBUFS | libc::EAGAIN | libc::ECONNREFUSED)
    )
}

fn send_loop(
    spec: UdpSpec,
    cfg: UdpCfg,
    live: &Live,
    ctl: &Control,
    t0: Instant,
) -> Result<StreamOut, BenchError> {
    let sock = spec.socket;
    let len = cfg.len as usize;
    let batch_max = (wire::MAX_UDP_BLOCKSIZE / cfg.len.max(1)).clamp(1, MAX_SEGMENTS);
    let mut gso = batch_max > 1;
    let mut buf = vec![0u8; batch_max as usize * len];
    let c0 = thread_cpu()?;
    let mut out = UdpOut {
        gso,
        ..UdpOut::default()
    };
    let mut sent = 0u64;
    let mut last = t0;
    while !ctl.stop.load(Ordering::Relaxed) {
        let elapsed = t0.elapsed().as_secs_f64();
        let max = if gso { batch_max } else { 1 };
        let mut k = wire::datagrams_due(cfg.rate, sent, elapsed, cfg.len, max);
        if k == 0 {
            // Ahead of -b: wait about one datagram's time (at most a millisecond).
            let per = cfg.len as f64 * 8.0 / cfg.rate.max(1) as f64;
            std::thread::sleep(Duration::from_secs_f64(per.clamp(1e-5, 1e-3)));
            continue;
        }
        if let Some(q) = cfg.quota {
            // -n: bytes over all sending streams, reserved before they are sent.
            let want = k * cfg.len;
            let prev = ctl.reserved.fetch_add(want, Ordering::Relaxed);
            if prev >= q {
                ctl.reserved.fetch_sub(want, Ordering::Relaxed);
                break;
            }
            let fits = k.min((q - prev).div_ceil(cfg.len));
            ctl.reserved
                .fetch_sub(want - fits * cfg.len, Ordering::Relaxed);
            k = fits;
        }
        let (sec, usec, _) = now_stamp();
        for j in 0..k {
            Header {
                sec,
                usec,
                pcount: out.packets + 1 + j,
            }
            .write(&mut buf[j as usize * len..], cfg.wide);
        }
        let bytes = &buf[..k as usize * len];
        let r = if k > 1 {
            zcnet_sys::raw::udp_send::send_gso(sock.as_fd(), bytes, false, Some(len as u16))
        } else {
            sock.send(bytes)
        };
        out.calls += 1;
        match r {
            Ok(_) => {
                out.packets += k;
                sent += k * cfg.len;
                last = Instant::now();
                live.bytes.store(sent, Ordering::Relaxed);
                if let Some(u) = &live.udp {
                    u.packets.store(out.packets, Ordering::Relaxed);
                }
            }
            Err(e) if k > 1 && !transient(&e) => {
                // The kernel will not segment for this socket: one datagram a call from now.
                gso = false;
                out.gso = false;
                if cfg.quota.is_some() {
                    ctl.reserved.fetch_sub(k * cfg.len, Ordering::Relaxed);
                }
            }
            Err(e) if transient(&e) => {
                if cfg.quota.is_some() {
                    ctl.reserved.fetch_sub(k * cfg.len, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(e) => return Err(BenchError::io("send (UDP)", e)),
        }
    }
    out.datagrams = out.packets;
    Ok(StreamOut {
        id: spec.id,
        socket: sock.as_raw_fd(),
        sender: true,
        main: true,
        bytes: sent,
        seconds: last.duration_since(t0).as_secs_f64(),
        cpu: CpuSeconds::between(c0, thread_cpu()?),
        path: if out.gso { "gso" } else { "copy" }.into(),
        udp: Some(out),
        ..StreamOut::default()
    })
}

fn recv_loop(
    spec: UdpSpec,
    cfg: UdpCfg,
    live: &Live,
    ctl: &Control,
    t0: Instant,
) -> Result<StreamOut, BenchError> {
    use zcnet_sys::raw::socket::RecvFlags;
    let sock = spec.socket;
    let gro = zcnet_sys::raw::udp::set_udp_gro(sock.as_fd(), true).is_ok();
    let _ = zcnet_sys::raw::udp_msg::grow_rcvbuf(sock.as_fd(), RCVBUF);
    sock.set_read_timeout(Some(RECV_SLICE))
        .map_err(io("SO_RCVTIMEO (UDP)"))?;
    let mut buf = vec![0u8; if gro { 1 << 17 } else { cfg.len as usize + 1 }];
    let c0 = thread_cpu()?;
    let mut counters = RecvCounters::default();
    let mut out = UdpOut {
        gro,
        ..UdpOut::default()
    };
    let mut last_data = Instant::now();
    let mut last = t0;
    loop {
        if ctl.abort.load(Ordering::Relaxed)
            || counters.highest >= live.target.load(Ordering::Relaxed)
            || (ctl.stop.load(Ordering::Relaxed) && last_data.elapsed() >= QUIET_END)
        {
            break;
        }
        let got = zcnet_sys::raw::udp::recv_gro(sock.as_fd(), &mut buf, RecvFlags::empty());
        out.calls += 1;
        let r = match got {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            // The client's socket not there (yet, or any more): nothing to count.
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => continue,
            Err(e) => return Err(BenchError::io("recv (UDP)", e)),
        };
        let (_, _, arrival) = now_stamp();
        last_data = Instant::now();
        let seg = r.gso_size.map_or(r.len, usize::from).max(1);
        for d in buf[..r.len].chunks(seg) {
            // The reply to a connect datagram repeated, or a stray: not a test datagram.
            if let Some(h) = Header::read(d, cfg.wide) {
                counters.on_datagram(&h, d.len(), arrival);
            }
        }
        last = last_data;
        live.bytes.store(counters.bytes, Ordering::Relaxed);
        if let Some(u) = &live.udp {
            u.packets.store(counters.highest, Ordering::Relaxed);
            u.lost.store(counters.lost, Ordering::Relaxed);
            u.jitter_bits
                .store(counters.jitter.to_bits(), Ordering::Relaxed);
        }
    }
    out.packets = counters.highest;
    out.lost = counters.lost;
    out.out_of_order = counters.out_of_order;
    out.jitter = counters.jitter;
    out.datagrams = counters.datagrams;
    Ok(StreamOut {
        id: spec.id,
        socket: sock.as_raw_fd(),
        sender: false,
        main: true,
        bytes: counters.bytes,
        seconds: last.duration_since(t0).as_secs_f64(),
        cpu: CpuSeconds::between(c0, thread_cpu()?),
        path: if gro { "gro" } else { "copy" }.into(),
        eof: true,
        udp: Some(out),
        ..StreamOut::default()
    })
}
