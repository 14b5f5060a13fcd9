//! `--proto udp --tx lm --rx lm`: whole messages as Lightweight Messages over AF_XDP
//! (`zcnet_afxdp`), both ends an [`LmSocket`] on the interface their control connection uses.
//!
//! * **stream**: the client sends `size`-byte messages back to back; each waits for its
//!   admission, which the server grants only once the previous message is delivered — LM's
//!   admission control is the flow control, so there is no window of acknowledgements.
//! * **rr**: one request, one reply of the same size from the server's own `LmSocket`: both
//!   ends send and receive with the same socket (one XSK per interface queue).
//!
//! Bytes are the same [`Pattern`] as the other UDP transports (the reference with the
//! message key stamped into every KiB), written into the loaned transmit region: the
//! reference once (the region is the same for every message), the stamps every message,
//! every byte with `--touch`. The server checks every byte of every message in place in its
//! UMEM. Message numbers start at 1 on a fresh socket; the ledger counts from 0.
//!
//! Where AF_XDP cannot be used (no XDP on the interface, the queue taken) the sockets fall
//! back to the kernel's UDP path by themselves; the run goes on and its stats say so
//! (`xsk_unavailable`, `sent_kernel`, `received_kernel`), as they say `xsk_copy_mode` on veth.

use super::control::{
    connect_control, count_of, cpu_now, deadline_of, done, finish_client, log_count_mismatch,
    merge, ping_pong, poll_done, report_failure, respond, side_cpu, Reply, Trips, WorkerOut,
    CONTROL_EVERY, DATA_TIMEOUT,
};
use super::ledger::Ledger;
use super::spec::{BenchError, Progress, RunSpec, Transport};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, SocketAddrV4, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use zcnet_afxdp::{LmConfig, LmError, LmEvent, LmSocket};
use zcnet_bench::cpu::SystemCpu;
use zcnet_bench::histogram::LatencyHistogram;
use zcnet_bench::protocol::{
    self, Message, MessagePattern as Pattern, Params, RunRequest, UdpParams, REPLY_KEY as REPLY,
};
use zcnet_bench::report::{Mode, Run, SideReport, SideStats, SystemCpuTimes};

fn lerr(context: &'static str) -> impl Fn(LmError) -> BenchError {
    move |e| BenchError::Failed(format!("{context}: {e}"))
}

fn v4(ip: IpAddr, what: &str) -> Result<std::net::Ipv4Addr, BenchError> {
    match ip {
        IpAddr::V4(a) => Ok(a),
        IpAddr::V6(_) => Err(BenchError::Usage(format!(
            "lm runs over IPv4 (Ethernet/IPv4/UDP frames): the {what} address is {ip}"
        ))),
    }
}

/// An `LmSocket` at `ip` (any port) for messages of `size` bytes.
fn open(ip: std::net::Ipv4Addr, size: u64) -> Result<LmSocket, BenchError> {
    let mut cfg = LmConfig::new(SocketAddrV4::new(ip, 0));
    cfg.max_message =
        usize::try_from(size.max(1)).map_err(|_| BenchError::Usage("size too large".into()))?;
    cfg.admission_timeout = DATA_TIMEOUT;
    LmSocket::open(cfg).map_err(lerr("opening the LM socket"))
}

/// `zcnet_afxdp`'s counters by name, the bench's `msg` map, with how each end was set up.
fn lm_stats(s: &LmSocket) -> SideStats {
    let mut st = SideStats::from(&s.io_stats().snapshot());
    st.msg = match serde_json::to_value(s.stats()) {
        Ok(serde_json::Value::Object(m)) => m
            .into_iter()
            .filter_map(|(k, v)| Some((k, v.as_u64()?)))
            .collect(),
        _ => BTreeMap::new(),
    };
    st.msg
        .insert("xsk_tx".into(), u64::from(s.transmits_via_xsk()));
    st.msg
        .insert("xsk_rx_in_place".into(), u64::from(s.receives_in_place()));
    st.msg.insert(
        "xsk_zero_copy".into(),
        u64::from(s.binding().is_some_and(|b| b.zero_copy)),
    );
    if let Ok(Some(p)) = s.xdp_progress() {
        st.msg.insert("xdp_foreign".into(), u64::from(p.foreign));
        st.msg.insert("xdp_order".into(), u64::from(p.order));
        st.msg.insert("xdp_pads".into(), u64::from(p.pads));
    }
    st
}

/// Writes message `key` into a loan and sends it; returns its number.
struct Writer {
    pattern: Pattern,
    filled: bool,
    touch: bool,
}

impl Writer {
    fn send(
        &mut self,
        sock: &mut LmSocket,
        to: SocketAddrV4,
        key: impl FnOnce(u32) -> u64,
        hist: &mut LatencyHistogram,
    ) -> Result<u32, BenchError> {
        let key = key(sock.next_id());
        let mut buf = sock
            .loan(self.pattern.len())
            .map_err(lerr("loaning the transmit region"))?;
        if !self.filled || self.touch {
            buf.copy_from(self.pattern.reference());
            self.filled = true;
        }
        for (o, stamp, n) in self.pattern.stamps(key) {
            buf.write_at(o, &stamp[..n]);
        }
        let t = Instant::now();
        let id = buf.send(to).map_err(lerr("send (LM message)"))?;
        hist.record(t.elapsed());
        Ok(id)
    }
}

/// The client of an LM run against the server whose control port is `ctrl`, on a thread in
/// the client's namespace.
pub(crate) fn run(
    ctrl: SocketAddr,
    spec: &RunSpec,
    progress: &Progress,
) -> Result<Run, BenchError> {
    let p = &spec.params;
    let mut c = connect_control(ctrl)?;
    let local = v4(
        c.local_addr()
            .map_err(|e| BenchError::io("getsockname (control)", e))?
            .ip(),
        "client",
    )?;
    let server_ip = v4(ctrl.ip(), "server")?;
    let mut sock = open(local, p.size)?;
    protocol::write_message(
        &mut c,
        &Message::HelloUdp {
            params: p.clone(),
            udp: UdpParams {
                reply_port: Some(sock.local_addr().port()),
            },
        },
    )?;
    let data_port = protocol::read_accept(protocol::read_message(&mut c))?;
    let to = SocketAddrV4::new(server_ip, data_port);
    let mut writer = Writer {
        pattern: Pattern::new(p.size as usize),
        filled: false,
        touch: p.touch,
    };
    let sys0 = SystemCpu::now();
    let start = Instant::now();
    let out = match p.mode {
        Mode::Stream => stream(&mut sock, to, &mut writer, p, progress),
        Mode::Rr => rr(&mut sock, to, &mut writer, p, progress),
    };
    let client = match out {
        Ok(r) => r,
        Err(e) => return Err(report_failure(&mut c, e)),
    };
    finish_client(&mut c, spec, client, sys0, start)
}

fn stream(
    sock: &mut LmSocket,
    to: SocketAddrV4,
    writer: &mut Writer,
    p: &Params,
    progress: &Progress,
) -> Result<SideReport, BenchError> {
    let count = count_of(p);
    let mut out = WorkerOut::default();
    let mut sent = 0u64;
    let t0 = cpu_now()?;
    let start = Instant::now();
    let deadline = deadline_of(p, start);
    out.started = Some(start);
    while !done(count, deadline, sent) {
        writer.send(sock, to, u64::from, &mut out.send)?;
        sent += 1;
        progress.bytes.fetch_add(p.size, Ordering::Relaxed);
    }
    out.ended = Some(Instant::now());
    out.cpu = side_cpu(t0, cpu_now()?);
    out.bytes_sent = sent * p.size;
    out.stats = lm_stats(sock);
    Ok(SideReport {
        messages_sent: sent,
        ..merge(vec![out])
    })
}

/// How long a request waits for its reply: the server's admission of the reply may wait for
/// our request's assembly, which has its own timeout.
const REPLY_WAIT: Duration = Duration::from_secs(3);

fn rr(
    sock: &mut LmSocket,
    to: SocketAddrV4,
    writer: &mut Writer,
    p: &Params,
    progress: &Progress,
) -> Result<SideReport, BenchError> {
    let pattern = writer.pattern.clone();
    ping_pong(
        &mut LmTrips { sock, to, writer },
        p,
        &pattern,
        REPLY_WAIT,
        progress,
    )
}

/// The LM client's end of a ping-pong: requests to `to`, replies only from there.
struct LmTrips<'a> {
    sock: &'a mut LmSocket,
    to: SocketAddrV4,
    writer: &'a mut Writer,
}

impl Trips for LmTrips<'_> {
    fn request(&mut self, hist: &mut LatencyHistogram) -> Result<u64, BenchError> {
        Ok(u64::from(self.writer.send(
            self.sock,
            self.to,
            u64::from,
            hist,
        )?))
    }

    fn next(
        &mut self,
        wait: Duration,
        classify: impl FnOnce(&[u8]) -> Result<bool, BenchError>,
    ) -> Result<Reply, BenchError> {
        let t_recv = Instant::now();
        match self.sock.recv(wait).map_err(lerr("recv (reply)"))? {
            None => Ok(Reply::Nothing),
            Some(LmEvent::Lost(l)) => {
                check_from(l.from, self.to, "loss report")?;
                Ok(Reply::Lost)
            }
            Some(LmEvent::Message(m)) => {
                check_from(m.from, self.to, "reply")?;
                Ok(Reply::Message {
                    took: t_recv.elapsed(),
                    bytes: m.data.len() as u64,
                    awaited: classify(m.data)?,
                })
            }
        }
    }

    fn stats(&self) -> SideStats {
        lm_stats(self.sock)
    }

    fn rx_path(&self) -> String {
        rx_path(self.sock).into()
    }
}

/// The receive path in effect: `lm` in place, or the kernel-socket fallback.
fn rx_path(sock: &LmSocket) -> &'static str {
    if sock.receives_in_place() {
        Transport::LM
    } else {
        "lm-kernel"
    }
}

fn check_from(from: SocketAddrV4, want: SocketAddrV4, what: &str) -> Result<(), BenchError> {
    if from == want {
        Ok(())
    } else {
        Err(BenchError::Failed(format!(
            "a {what} from {from} where this run's peer is {want}"
        )))
    }
}

/// The server of one LM run: answers the hello, receives (and in `rr` replies), and sends
/// its measurements — or an `error` naming what went wrong.
pub(crate) fn serve(
    mut c: TcpStream,
    peer: SocketAddr,
    req: RunRequest,
    log: bool,
) -> Result<(), BenchError> {
    let udp = req.udp.clone().unwrap_or_default();
    let result = serve_inner(&mut c, peer, &req.params, &udp, log);
    respond(&mut c, result)
}

/// The server of one LM run (after the hello): receives, verifies, replies in `rr`.
fn serve_inner(
    c: &mut TcpStream,
    peer: SocketAddr,
    p: &Params,
    udp_params: &UdpParams,
    log: bool,
) -> Result<SideReport, BenchError> {
    let ip = v4(
        c.local_addr()
            .map_err(|e| BenchError::io("getsockname (control)", e))?
            .ip(),
        "server",
    )?;
    let client_port = udp_params
        .reply_port
        .ok_or_else(|| BenchError::Failed("an lm run needs the client's LM port".into()))?;
    let client_addr = SocketAddrV4::new(v4(peer.ip(), "client")?, client_port);
    let mut sock = open(ip, p.size)?;
    protocol::write_message(
        c,
        &Message::Accept {
            data_port: sock.local_addr().port(),
        },
    )?;
    if log {
        let _ = std::io::Write::write_fmt(
            &mut std::io::stderr(),
            format_args!(
                "zcnet bench server: run from {peer}: udp {} lm→lm size {} ({})\n",
                p.mode.name(),
                p.size,
                if sock.notes().is_empty() {
                    "AF_XDP zero-copy".to_string()
                } else {
                    sock.notes().join("; ")
                }
            ),
        );
    }
    let pattern = Pattern::new(p.size as usize);
    let mut writer = Writer {
        pattern: pattern.clone(),
        filled: false,
        touch: p.touch,
    };
    let mut ledger = Ledger::default();
    let mut out = WorkerOut {
        rx_path: Some(rx_path(&sock).into()),
        ..Default::default()
    };
    let (mut sent, mut client_report) = (None::<u64>, None::<SideReport>);
    let mut replied = 0u64;
    let drain = Duration::from_secs(2);
    let sys0 = SystemCpu::now();
    let t0 = cpu_now()?;
    let mut last_progress = Instant::now();
    let mut last_control = Instant::now();
    loop {
        let t = Instant::now();
        let ev = sock.recv(CONTROL_EVERY).map_err(lerr("recv (message)"))?;
        let now = Instant::now();
        let idle = ev.is_none();
        let mut reply_to = None;
        match ev {
            None => {}
            Some(LmEvent::Message(m)) => {
                check_from(m.from, client_addr, "message")?;
                out.recv.record(t.elapsed());
                let id = u64::from(m.id);
                pattern.check(m.data, id).map_err(|why| {
                    BenchError::Failed(format!(
                        "message {id} from the client is not what was sent: {why}"
                    ))
                })?;
                ledger
                    .deliver(id.wrapping_sub(1))
                    .map_err(BenchError::Failed)?;
                out.started.get_or_insert(now);
                out.ended = Some(now);
                last_progress = now;
                out.bytes_received += m.data.len() as u64;
                if p.mode == Mode::Rr {
                    reply_to = Some(id);
                }
            }
            Some(LmEvent::Lost(l)) => {
                check_from(l.from, client_addr, "loss report")?;
                let id = u64::from(l.id).wrapping_sub(1);
                ledger.lose(id..id + 1).map_err(BenchError::Failed)?;
                out.ended = Some(now);
                last_progress = now;
            }
        }
        if let Some(req) = reply_to {
            writer.send(&mut sock, client_addr, |_| req | REPLY, &mut out.send)?;
            replied += 1;
            out.bytes_sent += p.size;
        }
        if sent.is_none() && (idle || now - last_control >= CONTROL_EVERY) {
            last_control = now;
            if let Some(report) = poll_done(c)? {
                sent = Some(report.messages_sent);
                client_report = Some(report);
                last_progress = Instant::now();
            }
        }
        let resolved = ledger.resolved();
        match sent {
            Some(n) if resolved >= n || now - last_progress >= drain => break,
            None if now - last_progress >= DATA_TIMEOUT => {
                return Err(BenchError::Failed(format!(
                    "nothing from the client for {DATA_TIMEOUT:?}"
                )))
            }
            _ => {}
        }
    }
    out.cpu = side_cpu(t0, cpu_now()?);
    let system = SystemCpuTimes::since(sys0);
    let account = ledger
        .finish(sent.unwrap_or(0))
        .map_err(BenchError::Failed)?;
    out.stats = lm_stats(&sock);
    out.stats.msg.insert("lost_tail".into(), account.tail);
    let report = SideReport {
        system,
        messages_received: account.received,
        messages_lost: account.lost,
        messages_sent: replied,
        ..merge(vec![out])
    };
    log_count_mismatch(client_report.as_ref(), &report, p.size, peer);
    Ok(report)
}
