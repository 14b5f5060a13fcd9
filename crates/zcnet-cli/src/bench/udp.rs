//! `--proto udp`: whole messages over UDP through `zcnet_msg` — the client's
//! [`MsgSender`] (GSO batches, `MSG_ZEROCOPY` loans with `--tx zerocopy`), the server's
//! [`MsgReceiver`] (`UDP_GRO` with `--rx gro`, one datagram per read with `--rx copy`).
//!
//! * **stream**: the client sends `size`-byte messages back to back for the run's time or
//!   bytes; the server receives, verifies and counts them.
//! * **rr**: NetPIPE's ping-pong with messages — the client sends one request and waits for
//!   its reply; the server answers each request with one reply of the same size. Both ends
//!   use both paths (the request socket is connected to the server's data port, replies go
//!   to a socket of their own whose port travels in the hello).
//! * **sink** (`--topology sink --proto udp`): the client's `MsgSender` into the dropping
//!   device, transmit only, so the message layer's own sender cost is what is measured.
//!
//! **Every byte is verified.** A message's bytes are a fixed pseudo-random reference
//! ([`Pattern`], `zcnet_bench::protocol::MessagePattern`: both ends must agree on it) with
//! the message id stamped over the first 8 bytes of every KiB — so each
//! datagram carries its message's id in its payload, and a fragment placed in the wrong
//! message, at the wrong offset, or a stale buffer sent again, differs. Replies are keyed by
//! the request's id with the top bit set: a server that echoes the request does not pass.
//! The sender writes the reference into each loaned buffer once (outside the measured
//! window, when the application prepares its ring) and then only the stamps per message;
//! `--touch` writes every byte of every message instead. The receiver compares every byte
//! (one `memcmp` per KiB) inside its measured CPU: checking what arrived is part of
//! receiving it here.
//!
//! **Losses are counted, never hidden.** The receiver keeps the ids it delivered and the
//! ids `zcnet_msg` reported lost as range sets ([`Ledger`]): a message delivered twice,
//! after being reported lost, or with an id the client never sent fails the run. At the end
//! the client's count of messages sent (in its `done`) decides: every id below it that was
//! not delivered is lost — reported with a reason, or vanished at the very end where nothing
//! can reveal it (`lost_tail`).
//!
//! **Flow control.** UDP has none; a sender that outruns the receiver measures drops. The
//! server acknowledges resolved messages (delivered or reported lost) on the control
//! connection every quarter window, and the client keeps at most a window of
//! `clamp(4 MiB / size, 2, 1024)` messages unacknowledged. A window that gets no ack for the
//! reorder window + 1 s (a whole message lost at its end, which only a later id reveals)
//! sends one more message anyway, counted in `window_stalls`.

use super::control::{
    connect_control, count_of, cpu_now, deadline_of, done, finish_client, log_count_mismatch,
    merge, ping_pong, poll_done, readable, report_failure, respond, side_cpu, sink_report, Reply,
    Trips, WorkerOut, CONTROL_EVERY, DATA_TIMEOUT,
};
use super::ledger::Ledger;
use super::spec::{BenchError, Progress, RunSpec};
use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use zcnet::Policy;
use zcnet_bench::cpu::SystemCpu;
use zcnet_bench::histogram::LatencyHistogram;
use zcnet_bench::protocol::{
    self, Message, MessagePattern as Pattern, Params, ProtocolError, RunRequest, UdpParams,
    REPLY_KEY as REPLY,
};
use zcnet_bench::report::{Mode, Run, SideReport, SideStats, SystemCpuTimes};
use zcnet_msg::{MsgBuf, MsgConfig, MsgError, MsgEvent, MsgReceiver, MsgSender, MsgTx};
use zcnet_testbed::netns::{Side, VethPair};

/// Payload the client keeps unacknowledged: well within the 8 MiB socket receive buffer
/// `MsgConfig` asks for, with room for the per-packet overhead the kernel charges.
const WINDOW_BYTES: u64 = 4 << 20;
/// Fewest and most messages in the window.
const WINDOW_MESSAGES: (u64, u64) = (2, 1024);
/// The discard port: nothing listens behind the sink.
const DISCARD_PORT: u16 = 9;

fn merr(context: &'static str) -> impl Fn(MsgError) -> BenchError {
    move |e| BenchError::Failed(format!("{context}: {e}"))
}

fn io(context: &'static str) -> impl Fn(std::io::Error) -> BenchError {
    move |e| BenchError::io(context, e)
}

/// Messages the client keeps unacknowledged at `size` bytes each.
pub(crate) fn window(size: u64) -> u64 {
    (WINDOW_BYTES / size.max(1)).clamp(WINDOW_MESSAGES.0, WINDOW_MESSAGES.1)
}

/// The server acknowledges every this many resolved messages (a quarter window).
pub(crate) fn ack_every(size: u64) -> u64 {
    (window(size) / 4).max(1)
}

/// The message configuration of a run: the bench measures paths as themselves
/// (`Policy::always()`: every loan goes zero-copy with `--tx zerocopy`), messages of exactly
/// `size` bytes, a pool of `ring` loaned buffers, GRO as `rx` says.
pub(crate) fn msg_config(p: &Params) -> Result<MsgConfig, BenchError> {
    let tx = match p.tx.as_str() {
        "copy" | "plain" => MsgTx::Copy,
        "zerocopy" => MsgTx::Zerocopy,
        "uring" => MsgTx::Uring,
        other => {
            return Err(BenchError::Usage(format!(
                "transmit path {other:?} is not a UDP message path (UDP knows: {})",
                protocol::UDP_TX.join(", ")
            )))
        }
    };
    let size = usize::try_from(p.size).map_err(|_| BenchError::Usage("size too large".into()))?;
    let mut cfg = MsgConfig::new(tx);
    cfg.policy = Policy::always();
    cfg.max_message = size;
    // Room for a window of the largest messages in reassembly at once.
    cfg.reassembly.max_bytes = cfg.reassembly.max_bytes.max(size.saturating_mul(4));
    cfg.gro = p.rx != "copy";
    // The baseline: every datagram its own sendmsg, as a sender without GSO does.
    cfg.gso = p.tx != "plain";
    cfg.pool_buffers = p.ring as usize;
    cfg.timeout = DATA_TIMEOUT;
    cfg.validate().map_err(merr("message configuration"))?;
    Ok(cfg)
}

/// How long a full window waits for an acknowledgement before sending one more message.
fn stall_wait(cfg: &MsgConfig) -> Duration {
    cfg.reassembly.timeout + Duration::from_secs(1)
}

/// How long an `rr` request waits for its reply: longer than the receiver's reorder window,
/// so a reply lost in part is reported lost before the trip is given up.
fn reply_wait(cfg: &MsgConfig) -> Duration {
    cfg.reassembly.timeout + Duration::from_millis(1500)
}

/// How long the server waits after the client's `done` for messages still unresolved
/// before it counts them lost: the reorder window, and a margin.
fn drain_wait(cfg: &MsgConfig) -> Duration {
    cfg.reassembly.timeout + Duration::from_millis(500)
}

/// Writes messages into loaned buffers: the reference once per buffer of the pool (found by
/// the address of its storage, which the pool keeps for the sender's life), the stamps
/// every time; or every byte every time with `touch`. Into the sink, where nothing receives
/// and nothing is verified, the stamps are left out (`stamp` false): the sender then touches
/// no payload per message, as the raw sink's sender does not.
#[derive(Debug)]
struct Filler {
    pattern: Pattern,
    filled: HashSet<usize>,
    touch: bool,
    stamp: bool,
}

impl Filler {
    fn new(size: usize, touch: bool) -> Filler {
        Filler {
            pattern: Pattern::new(size),
            filled: HashSet::new(),
            touch,
            stamp: true,
        }
    }

    fn write(&mut self, buf: &mut MsgBuf, key: u64) {
        let addr = buf
            .payload_mut()
            .next()
            .map_or(0, |(_, s)| s.as_ptr() as usize);
        let whole = self.filled.insert(addr) || self.touch;
        if whole {
            buf.copy_from(self.pattern.reference());
        }
        if self.stamp {
            for (o, stamp, n) in self.pattern.stamps(key) {
                buf.write_at(o, &stamp[..n]);
            }
        }
    }

    /// The application prepares its ring before the clock starts: every buffer of the pool
    /// gets the reference once (and the pool is mapped).
    fn prepare(&mut self, sender: &mut MsgSender, ring: usize) -> Result<(), BenchError> {
        let mut held = Vec::with_capacity(ring);
        for _ in 0..ring {
            let mut b = sender
                .buffer(self.pattern.len())
                .map_err(merr("preparing the message ring"))?;
            self.write(&mut b, 0);
            held.push(b);
        }
        Ok(())
    }

    /// Sends message `key` (its id, or a reply's key) from a loaned buffer; returns the id.
    fn send(
        &mut self,
        sender: &mut MsgSender,
        key: impl FnOnce(u64) -> u64,
        hist: &mut LatencyHistogram,
    ) -> Result<u64, BenchError> {
        let id = sender.next_id();
        let mut b = sender
            .buffer(self.pattern.len())
            .map_err(merr("waiting for a message buffer"))?;
        self.write(&mut b, key(id));
        let t = Instant::now();
        let sent = sender.send(b).map_err(merr("send (message)"))?;
        hist.record(t.elapsed());
        debug_assert_eq!(sent, id);
        Ok(sent)
    }
}

/// `zcnet_msg`'s counters by name, for [`SideStats::msg`].
fn msg_counters(s: &zcnet_msg::MsgStatsSnapshot) -> BTreeMap<String, u64> {
    match serde_json::to_value(s) {
        Ok(serde_json::Value::Object(m)) => m
            .into_iter()
            .filter_map(|(k, v)| Some((k, v.as_u64()?)))
            .collect(),
        _ => BTreeMap::new(),
    }
}

fn sender_stats(sender: &MsgSender) -> SideStats {
    let mut s = SideStats::from(&sender.io_stats().snapshot());
    s.msg = msg_counters(&sender.stats().snapshot());
    s
}

fn receiver_stats(rx: &MsgReceiver) -> SideStats {
    let mut s = SideStats::from(&rx.io_stats().snapshot());
    s.msg = msg_counters(&rx.stats().snapshot());
    s
}

/// Reads the acknowledgements that arrive within `wait` (all that are queued); the highest,
/// or `None` when none came.
fn read_acks(c: &mut TcpStream, wait: Duration) -> Result<Option<u64>, BenchError> {
    let mut best = None;
    let mut wait = wait;
    while readable(c, wait)? {
        match protocol::read_message(c)? {
            Message::Ack { resolved } => best = Some(best.unwrap_or(0).max(resolved)),
            other => return Err(ProtocolError::unexpected("ack", other).into()),
        }
        wait = Duration::ZERO;
    }
    Ok(best)
}

/// The unspecified address of `ip`'s family (the server sends replies to the address the
/// control connection comes from).
fn unspecified(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

/// The client of a UDP message run against the server whose control port is `ctrl`. Must
/// be called from a thread in the client's network namespace; the data phase runs on it.
pub(crate) fn run(
    ctrl: SocketAddr,
    spec: &RunSpec,
    progress: &Progress,
) -> Result<Run, BenchError> {
    let p = &spec.params;
    let cfg = msg_config(p)?;
    let mut c = connect_control(ctrl)?;
    let mut replies = match p.mode {
        Mode::Rr => Some(
            MsgReceiver::bind(SocketAddr::new(unspecified(ctrl.ip()), 0), &cfg)
                .map_err(merr("binding the reply socket"))?,
        ),
        Mode::Stream => None,
    };
    let reply_port = match &replies {
        Some(r) => Some(
            r.local_addr()
                .map_err(io("getsockname (reply socket)"))?
                .port(),
        ),
        None => None,
    };
    protocol::write_message(
        &mut c,
        &Message::HelloUdp {
            params: p.clone(),
            udp: UdpParams { reply_port },
        },
    )?;
    let data_port = protocol::read_accept(protocol::read_message(&mut c))?;
    let data = SocketAddr::new(ctrl.ip(), data_port);
    let mut sys0 = None;
    let mut start = Instant::now();
    let out = (|| {
        let mut sender = MsgSender::connect(data, &cfg).map_err(merr("connect (UDP data)"))?;
        let mut filler = Filler::new(p.size as usize, p.touch);
        if !p.touch {
            filler.prepare(&mut sender, p.ring as usize)?;
        }
        sys0 = SystemCpu::now();
        start = Instant::now();
        match replies.as_mut() {
            None => stream_send(&mut c, &mut sender, &mut filler, p, &cfg, progress),
            Some(rx) => rr_client(&mut sender, rx, &mut filler, p, &cfg, progress),
        }
    })();
    let client = match out {
        Ok(r) => r,
        Err(e) => return Err(report_failure(&mut c, e)),
    };
    finish_client(&mut c, spec, client, sys0, start)
}

/// The client's stream: messages back to back within the window, until the count or the
/// deadline; then every loan back.
fn stream_send(
    c: &mut TcpStream,
    sender: &mut MsgSender,
    filler: &mut Filler,
    p: &Params,
    cfg: &MsgConfig,
    progress: &Progress,
) -> Result<SideReport, BenchError> {
    let count = count_of(p);
    let window = window(p.size);
    let stall = stall_wait(cfg);
    let mut out = WorkerOut::default();
    let (mut sent, mut acked, mut stalls, mut acks) = (0u64, 0u64, 0u64, 0u64);
    let t0 = cpu_now()?;
    let start = Instant::now();
    let deadline = deadline_of(p, start);
    out.started = Some(start);
    while !done(count, deadline, sent) {
        if sent - acked >= window {
            match read_acks(c, stall)? {
                Some(r) => {
                    acks += 1;
                    acked = acked.max(r);
                    if sent - acked >= window {
                        continue;
                    }
                }
                // No ack for the reorder window and more: a whole message at the window's
                // end may be lost, which only a later id reveals. Send one.
                None => stalls += 1,
            }
        }
        filler.send(sender, |id| id, &mut out.send)?;
        sent += 1;
        progress.bytes.fetch_add(p.size, Ordering::Relaxed);
    }
    flush(sender)?;
    out.ended = Some(Instant::now());
    out.cpu = side_cpu(t0, cpu_now()?);
    out.bytes_sent = sent * p.size;
    out.stats = sender_stats(sender);
    out.stats.msg.insert("window_stalls".into(), stalls);
    out.stats.msg.insert("acks_read".into(), acks);
    Ok(SideReport {
        messages_sent: sent,
        ..merge(vec![out])
    })
}

/// Every loan back before the clock stops: completion handling is part of the cost.
fn flush(sender: &mut MsgSender) -> Result<(), BenchError> {
    if !sender
        .flush(DATA_TIMEOUT)
        .map_err(merr("waiting for zero-copy completions"))?
    {
        return Err(BenchError::Failed(format!(
            "{} loaned message buffers were not completed by the kernel within {DATA_TIMEOUT:?}",
            sender.buffers_in_flight()
        )));
    }
    Ok(())
}

/// The client's ping-pong over `zcnet_msg` ([`ping_pong`]): requests through `sender`,
/// replies from `rx`, each trip lost after [`reply_wait`].
fn rr_client(
    sender: &mut MsgSender,
    rx: &mut MsgReceiver,
    filler: &mut Filler,
    p: &Params,
    cfg: &MsgConfig,
    progress: &Progress,
) -> Result<SideReport, BenchError> {
    let pattern = filler.pattern.clone();
    let mut end = MsgTrips {
        sender,
        rx,
        filler,
        session: None,
    };
    ping_pong(&mut end, p, &pattern, reply_wait(cfg), progress)
}

/// The `zcnet_msg` client's end of a ping-pong; every reply from the one peer session.
struct MsgTrips<'a> {
    sender: &'a mut MsgSender,
    rx: &'a mut MsgReceiver,
    filler: &'a mut Filler,
    session: Option<(SocketAddr, u32)>,
}

impl Trips for MsgTrips<'_> {
    fn request(&mut self, hist: &mut LatencyHistogram) -> Result<u64, BenchError> {
        self.filler.send(self.sender, |id| id, hist)
    }

    fn next(
        &mut self,
        wait: Duration,
        classify: impl FnOnce(&[u8]) -> Result<bool, BenchError>,
    ) -> Result<Reply, BenchError> {
        let t_recv = Instant::now();
        match self.rx.recv(wait).map_err(merr("recv (reply)"))? {
            None => Ok(Reply::Nothing),
            Some(MsgEvent::Lost(l)) => {
                check_peer(&mut self.session, l.from, l.session, "reply")?;
                Ok(Reply::Lost)
            }
            Some(MsgEvent::Message(m)) => {
                check_peer(&mut self.session, m.from, m.session, "reply")?;
                let took = t_recv.elapsed();
                let bytes = m.len() as u64;
                let awaited = classify(&m)?;
                self.rx.recycle(m);
                Ok(Reply::Message {
                    took,
                    bytes,
                    awaited,
                })
            }
        }
    }

    fn flush(&mut self) -> Result<(), BenchError> {
        flush(self.sender)
    }

    fn stats(&self) -> SideStats {
        let mut st = sender_stats(self.sender);
        st.merge(&receiver_stats(self.rx));
        st
    }

    fn rx_path(&self) -> String {
        if self.rx.gro_enabled() { "gro" } else { "copy" }.into()
    }
}

/// Every event of a run must come from its one peer session: the first seen.
fn check_peer(
    known: &mut Option<(SocketAddr, u32)>,
    from: SocketAddr,
    session: u32,
    what: &str,
) -> Result<(), BenchError> {
    match known {
        None => {
            *known = Some((from, session));
            Ok(())
        }
        Some(k) if *k == (from, session) => Ok(()),
        Some((a, s)) => Err(BenchError::Failed(format!(
            "a {what} from {from} (session {session:#x}) where this run's peer is {a} (session {s:#x})"
        ))),
    }
}

/// The server of one UDP message run: answers the hello, receives (and in `rr` replies),
/// and sends its measurements — or an `error` naming what went wrong.
pub(crate) fn serve(
    mut c: TcpStream,
    peer: SocketAddr,
    req: RunRequest,
    log: bool,
) -> Result<(), BenchError> {
    let p = &req.params;
    let udp = req.udp.clone().unwrap_or_default();
    let result = serve_inner(&mut c, peer, p, &udp, log);
    respond(&mut c, result)
}

fn serve_inner(
    c: &mut TcpStream,
    peer: SocketAddr,
    p: &Params,
    udp: &UdpParams,
    log: bool,
) -> Result<SideReport, BenchError> {
    let cfg = msg_config(p)?;
    let ip = c.local_addr().map_err(io("getsockname (control)"))?.ip();
    let mut rx =
        MsgReceiver::bind(SocketAddr::new(ip, 0), &cfg).map_err(merr("binding the data socket"))?;
    let pattern = Pattern::new(p.size as usize);
    let mut replies = match (p.mode, udp.reply_port) {
        (Mode::Rr, Some(port)) => {
            let mut s = MsgSender::connect(SocketAddr::new(peer.ip(), port), &cfg)
                .map_err(merr("connect (reply socket)"))?;
            let mut f = Filler::new(p.size as usize, p.touch);
            if !p.touch {
                f.prepare(&mut s, p.ring as usize)?;
            }
            Some((s, f))
        }
        (Mode::Rr, None) => {
            return Err(BenchError::Failed(
                "a UDP rr run needs the client's reply port".into(),
            ))
        }
        (Mode::Stream, _) => None,
    };
    let port = rx.local_addr().map_err(io("getsockname (data)"))?.port();
    protocol::write_message(c, &Message::Accept { data_port: port })?;
    if log {
        let _ = std::io::Write::write_fmt(
            &mut std::io::stderr(),
            format_args!(
                "zcnet bench server: run from {peer}: udp {} {}→{} size {}\n",
                p.mode.name(),
                p.tx,
                p.rx,
                p.size
            ),
        );
    }
    let ack_every = ack_every(p.size);
    let drain = drain_wait(&cfg);
    let mut ledger = Ledger::default();
    let mut session = None;
    let mut out = WorkerOut {
        rx_path: Some(if rx.gro_enabled() { "gro" } else { "copy" }.into()),
        ..Default::default()
    };
    let (mut sent, mut client_report) = (None::<u64>, None::<SideReport>);
    let (mut last_ack, mut acks, mut replied) = (0u64, 0u64, 0u64);
    let sys0 = SystemCpu::now();
    let t0 = cpu_now()?;
    let mut last_progress = Instant::now();
    let mut last_control = Instant::now();
    loop {
        let t = Instant::now();
        let ev = rx.recv(CONTROL_EVERY).map_err(merr("recv (message)"))?;
        let now = Instant::now();
        let idle = ev.is_none();
        match ev {
            None => {}
            Some(MsgEvent::Message(m)) => {
                check_peer(&mut session, m.from, m.session, "message")?;
                out.recv.record(t.elapsed());
                ledger.deliver(m.id).map_err(BenchError::Failed)?;
                pattern.check(&m, m.id).map_err(|why| {
                    BenchError::Failed(format!(
                        "message {} from the client is not what was sent: {why}",
                        m.id
                    ))
                })?;
                out.started.get_or_insert(now);
                out.ended = Some(now);
                last_progress = now;
                out.bytes_received += m.len() as u64;
                if let Some((s, f)) = replies.as_mut() {
                    let req = m.id;
                    f.send(s, |_| req | REPLY, &mut out.send)?;
                    replied += 1;
                    out.bytes_sent += p.size;
                }
                rx.recycle(m);
            }
            Some(MsgEvent::Lost(l)) => {
                check_peer(&mut session, l.from, l.session, "loss report")?;
                ledger.lose(l.ids()).map_err(BenchError::Failed)?;
                out.ended = Some(now);
                last_progress = now;
            }
        }
        let resolved = ledger.resolved();
        if p.mode == Mode::Stream
            && resolved > last_ack
            && (resolved - last_ack >= ack_every || idle)
        {
            protocol::write_message(c, &Message::Ack { resolved })?;
            last_ack = resolved;
            acks += 1;
        }
        if sent.is_none() && (idle || now - last_control >= CONTROL_EVERY) {
            last_control = now;
            if let Some(report) = poll_done(c)? {
                sent = Some(report.messages_sent);
                client_report = Some(report);
                last_progress = Instant::now();
            }
        }
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
    if let Some((s, _)) = replies.as_mut() {
        flush(s)?;
    }
    out.cpu = side_cpu(t0, cpu_now()?);
    let system = SystemCpuTimes::since(sys0);
    let sent = sent.unwrap_or(0);
    let account = ledger.finish(sent).map_err(BenchError::Failed)?;
    out.stats = receiver_stats(&rx);
    if let Some((s, _)) = replies.as_ref() {
        out.stats.merge(&sender_stats(s));
    }
    out.stats.msg.insert("lost_tail".into(), account.tail);
    out.stats.msg.insert("acks_sent".into(), acks);
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

/// `--topology sink --proto udp`: the message layer's sender into the dropping device.
/// Called on a thread inside namespace `a`.
pub(crate) fn sink_run(
    pair: &VethPair,
    spec: &RunSpec,
    progress: &Progress,
) -> Result<Run, BenchError> {
    let p = &spec.params;
    let cfg = msg_config(p)?;
    let dst = SocketAddr::new(pair.addr(Side::B).into(), DISCARD_PORT);
    let mut sender = MsgSender::connect(dst, &cfg).map_err(merr("connect (sink)"))?;
    let mut filler = Filler {
        stamp: false,
        ..Filler::new(p.size as usize, p.touch)
    };
    if !p.touch {
        filler.prepare(&mut sender, p.ring as usize)?;
    }
    let count = count_of(p);
    let mut out = WorkerOut::default();
    let sys0 = SystemCpu::now();
    let t0 = cpu_now()?;
    let start = Instant::now();
    let deadline = deadline_of(p, start);
    out.started = Some(start);
    let mut sent = 0u64;
    while !done(count, deadline, sent) {
        filler.send(&mut sender, |id| id, &mut out.send)?;
        sent += 1;
        progress.bytes.fetch_add(p.size, Ordering::Relaxed);
    }
    flush(&mut sender)?;
    out.ended = Some(Instant::now());
    out.cpu = side_cpu(t0, cpu_now()?);
    let system = SystemCpuTimes::since(sys0).unwrap_or_default();
    out.bytes_sent = sent * p.size;
    out.stats = sender_stats(&sender);
    let r = merge(vec![out]);
    // The device took every message (and dropped it): nothing to lose on the way.
    Ok(sink_report(spec, r, start, system, pair.mtu(), Some(sent)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_stay_within_the_socket_buffer() {
        assert_eq!(window(1), 1024);
        assert_eq!(window(64 << 10), 64);
        assert_eq!(window(1 << 20), 4);
        assert_eq!(window(16 << 20), 2);
        assert_eq!(ack_every(1 << 20), 1);
        assert_eq!(ack_every(64 << 10), 16);
        for s in [1u64, 1472, 65536, 1 << 20, 16 << 20] {
            assert!(ack_every(s) <= window(s));
            assert!(window(s) * s <= WINDOW_BYTES.max(2 * s));
        }
    }

    #[test]
    fn loaned_buffers_carry_the_pattern_once_filled() {
        let rx = MsgReceiver::bind("127.0.0.1:0".parse().unwrap(), &MsgConfig::default()).unwrap();
        let mut cfg = MsgConfig::default();
        cfg.max_message = 5000;
        cfg.segment = Some(1472);
        cfg.pool_buffers = 2;
        let mut s = MsgSender::connect(rx.local_addr().unwrap(), &cfg).unwrap();
        let mut f = Filler::new(5000, false);
        f.prepare(&mut s, 2).unwrap();
        assert_eq!(f.filled.len(), 2);
        for key in [3u64, 4, 5 | REPLY] {
            let mut b = s.buffer(5000).unwrap();
            f.write(&mut b, key);
            assert!(f.pattern.matches(&b.to_vec(), key), "{key}");
        }
        assert_eq!(f.filled.len(), 2, "no buffer filled twice");
    }
}
