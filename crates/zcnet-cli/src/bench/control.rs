//! What every transport's run shares around its data phase: the control connection (connect,
//! report a failure, the final exchange), the accounting of a side's work ([`WorkerOut`],
//! CPU readings, [`merge`]), count and deadline limits, the `rr` client's round trips
//! ([`ping_pong`], over a transport's [`Trips`]) and their reply bookkeeping, the agreement
//! check between both ends' counts, and assembling the [`Run`].

use super::spec::{BenchError, Progress, RunSpec};
use std::collections::VecDeque;
use std::io::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use zcnet_bench::cpu::{thread_rusage, CpuSeconds, SystemCpu};
use zcnet_bench::histogram::LatencyHistogram;
use zcnet_bench::protocol::{
    self, Limit, Message, MessagePattern as Pattern, Params, Proto, ProtocolError,
    REPLY_KEY as REPLY,
};
use zcnet_bench::report::{
    check_message_counts, Cpu, Derived, Fallbacks, Latency, Mode, Run, SideCpu, SideReport,
    SideStats, SystemCpuTimes,
};

/// Replies late by more than this many round trips are not recognised (counted corrupt).
pub(crate) const LATE_REPLIES: usize = 64;

fn io(context: &'static str) -> impl Fn(std::io::Error) -> BenchError {
    move |e| BenchError::io(context, e)
}

/// Bound on control-connection steps other than waiting for the run's end.
pub(crate) const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens the control connection to `ctrl`, with the control timeouts and `TCP_NODELAY`.
pub(crate) fn connect_control(ctrl: SocketAddr) -> Result<TcpStream, BenchError> {
    let c = TcpStream::connect_timeout(&ctrl, CONTROL_TIMEOUT).map_err(|e| {
        BenchError::io_owned(format!("connecting to the bench server at {ctrl}"), e)
    })?;
    c.set_read_timeout(Some(CONTROL_TIMEOUT))
        .map_err(io("control socket"))?;
    c.set_write_timeout(Some(CONTROL_TIMEOUT))
        .map_err(io("control socket"))?;
    c.set_nodelay(true).map_err(io("control socket"))?;
    Ok(c)
}

/// Tells the server that this side failed with `e`; its own error, if it has one, says
/// more (an `ack` still queued from a UDP run is skipped).
pub(crate) fn report_failure(c: &mut TcpStream, e: BenchError) -> BenchError {
    let _ = protocol::write_message(
        c,
        &Message::Error {
            reason: e.to_string(),
        },
    );
    c.set_read_timeout(Some(Duration::from_secs(2))).ok();
    loop {
        match protocol::read_message(c) {
            Ok(Message::Ack { .. }) => continue,
            Ok(Message::Error { reason }) => {
                return BenchError::Failed(format!("{e} (the server says: {reason})"))
            }
            _ => return e,
        }
    }
}

/// Checks that both ends agree: for TCP the same bytes each way; for UDP messages every
/// message sent was received whole or counted lost, each way ([`check_message_counts`]).
pub(crate) fn check_agreement(
    proto: Proto,
    size: u64,
    client: &SideReport,
    server: &SideReport,
) -> Result<(), BenchError> {
    match proto {
        Proto::Tcp => check_bytes(client, server),
        Proto::Udp => check_message_counts(client, server, size, "client", "server")
            .and_then(|()| {
                if server.messages_sent > 0 || client.messages_received > 0 {
                    check_message_counts(server, client, size, "server", "client")
                } else {
                    Ok(())
                }
            })
            .map_err(|r| BenchError::Mismatch(r.0)),
    }
}

/// Checks that both ends counted the same bytes.
pub(crate) fn check_bytes(client: &SideReport, server: &SideReport) -> Result<(), BenchError> {
    if client.bytes_sent != server.bytes_received {
        return Err(BenchError::Mismatch(format!(
            "the client sent {} bytes but the server received {}",
            client.bytes_sent, server.bytes_received
        )));
    }
    if client.bytes_received != server.bytes_sent {
        return Err(BenchError::Mismatch(format!(
            "the server sent {} bytes but the client received {}",
            server.bytes_sent, client.bytes_received
        )));
    }
    Ok(())
}

/// Puts both sides' reports into one [`Run`]. `wall` bounds the data phase from above when a
/// side's own clock saw nothing.
pub(crate) fn assemble(
    spec: &RunSpec,
    client: &SideReport,
    server: &SideReport,
    system: SystemCpuTimes,
    wall: f64,
) -> Result<Run, BenchError> {
    let p = &spec.params;
    let proto = spec.topology.proto;
    check_agreement(proto, p.size, client, server)?;
    let udp = proto == Proto::Udp;
    let rr = p.mode == Mode::Rr;
    // The transfer lasts until the last byte is received: the later of the two ends.
    let mut seconds = client.seconds.max(server.seconds);
    if seconds <= 0.0 {
        seconds = wall;
    }
    let moved = match p.mode {
        Mode::Stream => server.bytes_received,
        Mode::Rr => client.bytes_sent + client.bytes_received,
    };
    let d = Derived {
        bytes: moved,
        seconds,
        sender: client.cpu,
        receiver: server.cpu,
        system,
    };
    let (tx_stats, rx_stats) = (&client.stats, &server.stats);
    Ok(Run {
        label: spec.label.clone(),
        mode: p.mode,
        tx: p.tx.clone(),
        rx: p.rx.clone(),
        topology: spec.topology.name.clone(),
        transport: proto.name().into(),
        mtu: spec.topology.mtu,
        size: p.size,
        streams: p.streams,
        ring: p.ring,
        touch: p.touch,
        read_size: p.read,
        repeat: spec.repeat,
        bytes_sent: client.bytes_sent,
        bytes_received: server.bytes_received,
        seconds,
        gbit_per_s: d.gbit_per_s(),
        cpu: Cpu {
            sender: client.cpu,
            receiver: server.cpu,
            system,
            server_system: server.system,
        },
        cpu_s_per_gib: d.cpu_s_per_gib(),
        sender_cpu_s_per_gib: d.sender_cpu_s_per_gib(),
        receiver_cpu_s_per_gib: d.receiver_cpu_s_per_gib(),
        gbit_per_core: d.gbit_per_core(),
        zc_fraction_tx: tx_stats.tx_zerocopy_fraction(),
        zc_fraction_rx: rx_stats.rx_mapped_fraction(),
        fallbacks: Fallbacks {
            sender: tx_stats.fallbacks.clone(),
            receiver: rx_stats.fallbacks.clone(),
        },
        latency: Latency {
            send: client.send_latency,
            recv: server.recv_latency,
            rtt: client.rtt,
        },
        sender_stats: tx_stats.clone(),
        receiver_stats: rx_stats.clone(),
        rx_in_effect: server.rx_path_in_effect.clone().filter(|eff| eff != &p.rx),
        messages_sent: udp.then_some(client.messages_sent),
        messages_received: udp.then_some(server.messages_received),
        messages_lost: udp.then_some(server.messages_lost),
        replies_sent: (udp && rr).then_some(server.messages_sent),
        replies_received: (udp && rr).then_some(client.messages_received),
        replies_lost: (udp && rr).then_some(client.messages_lost),
    })
}
/// How often the server's loop looks at the control connection while messages flow.
pub(crate) const CONTROL_EVERY: Duration = Duration::from_millis(10);

pub(crate) fn cpu_now() -> Result<zcnet_sys::raw::cpu::Rusage, BenchError> {
    thread_rusage().map_err(io("getrusage(RUSAGE_THREAD)"))
}

pub(crate) fn side_cpu(a: zcnet_sys::raw::cpu::Rusage, b: zcnet_sys::raw::cpu::Rusage) -> SideCpu {
    let c = CpuSeconds::between(a, b);
    SideCpu {
        user: c.user,
        sys: c.sys,
    }
}

/// Waits up to `wait` for the control connection to become readable.
pub(crate) fn readable(c: &TcpStream, wait: Duration) -> Result<bool, BenchError> {
    match zcnet_sys::raw::socket::poll(c.as_fd(), zcnet_sys::raw::socket::PollFlags::IN, Some(wait))
    {
        Ok(ev) if ev.is_empty() => Ok(false),
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EINTR) => Ok(false),
        Err(e) => Err(BenchError::io("poll (control)", e)),
    }
}

/// How many messages (stream) or round trips (rr) a byte limit means: whole messages of
/// `size` bytes, at least one.
pub(crate) fn count_of(p: &Params) -> Option<u64> {
    match p.limit {
        Limit::Bytes(b) => Some(b.div_ceil(p.size).max(1)),
        Limit::Seconds(_) => None,
    }
}

pub(crate) fn deadline_of(p: &Params, start: Instant) -> Option<Instant> {
    match p.limit {
        Limit::Seconds(s) => Some(start + Duration::from_secs_f64(s)),
        Limit::Bytes(_) => None,
    }
}

/// Whether the sender is done: its count, or the deadline once at least one went.
pub(crate) fn done(count: Option<u64>, deadline: Option<Instant>, sent: u64) -> bool {
    match (count, deadline) {
        (Some(n), _) => sent >= n,
        (None, Some(d)) => sent > 0 && Instant::now() >= d,
        (None, None) => true,
    }
}

/// The end of a UDP message run, for every transport: `done` with the client's report, the
/// server's result, the round trips' losses, the run assembled.
pub(crate) fn finish_client(
    c: &mut TcpStream,
    spec: &RunSpec,
    mut client: SideReport,
    sys0: Option<SystemCpu>,
    start: Instant,
) -> Result<Run, BenchError> {
    let p = &spec.params;
    protocol::write_message(
        c,
        &Message::Done {
            report: client.clone(),
        },
    )?;
    c.set_read_timeout(Some(DATA_TIMEOUT + CONTROL_TIMEOUT))
        .map_err(io("control socket"))?;
    let server = loop {
        match protocol::read_message(c)? {
            Message::Ack { .. } => continue,
            Message::Result { report } => break report,
            other => return Err(ProtocolError::unexpected("result", other).into()),
        }
    };
    let wall = start.elapsed().as_secs_f64();
    let system = SystemCpuTimes::since(sys0).unwrap_or_default();
    if p.mode == Mode::Rr {
        // Replies the server sent that never came back: lost on the way to us.
        client.messages_lost = server
            .messages_sent
            .checked_sub(client.messages_received)
            .ok_or_else(|| {
                BenchError::Mismatch(format!(
                    "the client received {} replies but the server says it sent {}",
                    client.messages_received, server.messages_sent
                ))
            })?;
        let tail = client
            .messages_lost
            .saturating_sub(client.stats.msg.get("messages_lost").copied().unwrap_or(0));
        client.stats.msg.insert("lost_tail".into(), tail);
    }
    assemble(spec, &client, &server, system, wall)
}

/// The `rr` client's view of replies: requests given up on (newest last, so a reply that
/// comes late is recognised, not taken for a wrong one), late replies, lost trips.
#[derive(Debug, Default)]
pub(crate) struct Replies {
    overdue: VecDeque<u64>,
    late: u64,
    lost_trips: u64,
}

impl Replies {
    /// A reply to request `id` arrived (`true`), or a late one to an overdue request
    /// (`false`); anything else is not what the server must send, and fails the run.
    pub(crate) fn classify(
        &mut self,
        pattern: &Pattern,
        data: &[u8],
        id: u64,
    ) -> Result<bool, BenchError> {
        if pattern.matches(data, id | REPLY) {
            return Ok(true);
        }
        if let Some(i) = self
            .overdue
            .iter()
            .position(|&o| pattern.matches(data, o | REPLY))
        {
            self.overdue.remove(i);
            self.late += 1;
            return Ok(false);
        }
        let why = pattern
            .check(data, id | REPLY)
            .err()
            .map_or_else(|| "differs".to_string(), |r| r.0);
        Err(BenchError::Failed(format!(
            "the reply to request {id} is not what the server must send: {why}"
        )))
    }

    /// No reply to request `id` in time: the trip is lost, the reply may still come.
    pub(crate) fn missed(&mut self, id: u64) {
        self.lost_trips += 1;
        self.overdue.push_back(id);
        if self.overdue.len() > LATE_REPLIES {
            self.overdue.pop_front();
        }
    }

    /// `late_replies` and `trips_lost` into the side's counters.
    pub(crate) fn record(&self, stats: &mut SideStats) {
        stats.msg.insert("late_replies".into(), self.late);
        stats.msg.insert("trips_lost".into(), self.lost_trips);
    }
}

/// What the server sent, as one [`Trips::next`] saw it.
pub(crate) enum Reply {
    /// Nothing came in the time given.
    Nothing,
    /// The server reported a reply lost (checked to come from the peer).
    Lost,
    /// A reply, from the peer, whole and what [`Replies::classify`] accepts.
    Message {
        /// The receive call that brought it.
        took: Duration,
        bytes: u64,
        /// It answers the request waiting now, not an overdue one.
        awaited: bool,
    },
}

/// The transport's part of an `rr` client, for [`ping_pong`]: the calls differ by
/// transport (`zcnet_msg`, `zcnet_afxdp`), the round trips' bookkeeping does not.
pub(crate) trait Trips {
    /// Sends the next request, its send call timed into `hist`; returns its id.
    fn request(&mut self, hist: &mut LatencyHistogram) -> Result<u64, BenchError>;

    /// Waits up to `wait` for the server's next event and checks that it comes from the
    /// peer. A reply goes to `classify` before its buffer is given back; its receive call
    /// is timed up to there.
    fn next(
        &mut self,
        wait: Duration,
        classify: impl FnOnce(&[u8]) -> Result<bool, BenchError>,
    ) -> Result<Reply, BenchError>;

    /// After the last trip, before the clock stops: what must be done by then (every loan
    /// back, where the transport loans).
    fn flush(&mut self) -> Result<(), BenchError> {
        Ok(())
    }

    /// This end's counters, once the clock has stopped.
    fn stats(&self) -> SideStats;

    /// The receive path in effect.
    fn rx_path(&self) -> String;
}

/// The client's ping-pong: one request, then its reply (or the trip is lost after `wait`,
/// its reply recognised if it comes later), until the count or the deadline.
pub(crate) fn ping_pong(
    end: &mut impl Trips,
    p: &Params,
    pattern: &Pattern,
    wait: Duration,
    progress: &Progress,
) -> Result<SideReport, BenchError> {
    let count = count_of(p);
    let mut out = WorkerOut::default();
    // Requests whose reply did not come in time, newest last: a late reply is recognised.
    let mut replies = Replies::default();
    let (mut trips, mut received) = (0u64, 0u64);
    let t0 = cpu_now()?;
    let start = Instant::now();
    let deadline = deadline_of(p, start);
    out.started = Some(start);
    while !done(count, deadline, trips) {
        let t = Instant::now();
        let id = end.request(&mut out.send)?;
        trips += 1;
        out.bytes_sent += p.size;
        let until = t + wait;
        let answered = loop {
            let now = Instant::now();
            if now >= until {
                break false;
            }
            match end.next(until - now, |data| replies.classify(pattern, data, id))? {
                Reply::Nothing => break false,
                Reply::Lost => {}
                Reply::Message {
                    took,
                    bytes,
                    awaited,
                } => {
                    out.recv.record(took);
                    received += 1;
                    out.bytes_received += bytes;
                    if awaited {
                        break true;
                    }
                }
            }
        };
        if answered {
            out.rtt.record(t.elapsed());
            progress.bytes.fetch_add(2 * p.size, Ordering::Relaxed);
        } else {
            replies.missed(id);
        }
    }
    end.flush()?;
    out.ended = Some(Instant::now());
    out.cpu = side_cpu(t0, cpu_now()?);
    out.stats = end.stats();
    replies.record(&mut out.stats);
    out.rx_path = Some(end.rx_path());
    Ok(SideReport {
        messages_sent: trips,
        messages_received: received,
        ..merge(vec![out])
    })
}

/// The client's `done`, if it is waiting on the control connection: its report. Anything
/// else there is a protocol error (an `error` names the client's failure).
pub(crate) fn poll_done(c: &mut TcpStream) -> Result<Option<SideReport>, BenchError> {
    if !readable(c, Duration::ZERO)? {
        return Ok(None);
    }
    match protocol::read_message(c)? {
        Message::Done { report } => Ok(Some(report)),
        other => Err(ProtocolError::unexpected("done", other).into()),
    }
}

/// Logs (server side) when the client's counts and ours disagree; the client fails the run
/// on the same check, with both reports in hand.
pub(crate) fn log_count_mismatch(
    client: Option<&SideReport>,
    server: &SideReport,
    size: u64,
    peer: SocketAddr,
) {
    if let Some(client) = client {
        if let Err(e) =
            zcnet_bench::report::check_message_counts(client, server, size, "client", "server")
        {
            let _ = std::io::Write::write_fmt(
                &mut std::io::stderr(),
                format_args!("zcnet bench server: run from {peer}: message counts disagree: {e}\n"),
            );
        }
    }
}
/// The report of one sink run: the sender's side only (the device took and dropped every
/// byte). `messages` for message runs (`--proto udp`): all delivered to the device, none lost
/// on the way.
pub(crate) fn sink_report(
    spec: &RunSpec,
    r: SideReport,
    start: Instant,
    system: SystemCpuTimes,
    mtu: u32,
    messages: Option<u64>,
) -> Run {
    let p = &spec.params;
    let seconds = if r.seconds > 0.0 {
        r.seconds
    } else {
        start.elapsed().as_secs_f64()
    };
    let d = Derived {
        bytes: r.bytes_sent,
        seconds,
        sender: r.cpu,
        receiver: SideCpu::default(),
        system,
    };
    Run {
        label: spec.label.clone(),
        mode: p.mode,
        tx: p.tx.clone(),
        rx: "none".into(),
        topology: spec.topology.name.clone(),
        transport: "udp".into(),
        mtu: Some(mtu),
        size: p.size,
        streams: p.streams,
        ring: p.ring,
        touch: p.touch,
        read_size: p.read,
        repeat: spec.repeat,
        bytes_sent: r.bytes_sent,
        bytes_received: r.bytes_sent,
        seconds,
        gbit_per_s: d.gbit_per_s(),
        cpu: Cpu {
            sender: r.cpu,
            receiver: SideCpu::default(),
            system,
            server_system: None,
        },
        cpu_s_per_gib: d.cpu_s_per_gib(),
        sender_cpu_s_per_gib: d.sender_cpu_s_per_gib(),
        receiver_cpu_s_per_gib: 0.0,
        gbit_per_core: d.gbit_per_core(),
        zc_fraction_tx: r.stats.tx_zerocopy_fraction(),
        zc_fraction_rx: 0.0,
        fallbacks: Fallbacks {
            sender: r.stats.fallbacks.clone(),
            receiver: Default::default(),
        },
        latency: Latency {
            send: r.send_latency,
            recv: None,
            rtt: None,
        },
        sender_stats: r.stats,
        receiver_stats: SideStats::default(),
        rx_in_effect: None,
        messages_sent: messages,
        messages_received: messages,
        messages_lost: messages.map(|_| 0),
        replies_sent: None,
        replies_received: None,
        replies_lost: None,
    }
}
/// Bound on every blocking step of a data connection: a stalled peer fails the run rather
/// than hang it.
pub(crate) const DATA_TIMEOUT: Duration = Duration::from_secs(20);

/// What one data connection's thread measured.
#[derive(Debug, Default)]
pub(crate) struct WorkerOut {
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub cpu: SideCpu,
    pub stats: SideStats,
    pub send: LatencyHistogram,
    pub recv: LatencyHistogram,
    pub rtt: LatencyHistogram,
    pub rx_path: Option<String>,
    pub started: Option<Instant>,
    pub ended: Option<Instant>,
}

/// Merges the workers of one side into that side's report.
pub(crate) fn merge(outs: Vec<WorkerOut>) -> SideReport {
    let mut r = SideReport::default();
    let (mut send, mut recv, mut rtt) = (
        LatencyHistogram::new(),
        LatencyHistogram::new(),
        LatencyHistogram::new(),
    );
    let start = outs.iter().filter_map(|o| o.started).min();
    let end = outs.iter().filter_map(|o| o.ended).max();
    for o in &outs {
        r.bytes_sent += o.bytes_sent;
        r.bytes_received += o.bytes_received;
        r.cpu = r.cpu.add(&o.cpu);
        r.stats.merge(&o.stats);
        send.merge(&o.send);
        recv.merge(&o.recv);
        rtt.merge(&o.rtt);
        if r.rx_path_in_effect.is_none() {
            r.rx_path_in_effect = o.rx_path.clone();
        }
    }
    if let (Some(s), Some(e)) = (start, end) {
        r.seconds = e.duration_since(s).as_secs_f64();
    }
    let some = |h: LatencyHistogram| (h.count() > 0).then(|| h.summary());
    r.send_latency = some(send);
    r.recv_latency = some(recv);
    r.rtt = some(rtt);
    r
}
/// What must stop when a served run's client goes away: the run's control connection, its
/// data listener and the data connections it accepted, each a second descriptor of the
/// socket. [`Cancel::cancel`] shuts them all down (`shutdown(2)`), which wakes every thread
/// of the run blocked on one of them — an `accept` or a `poll` on a shut-down listener
/// returns at once, a read sees end of stream — so the run ends within one wait instead of
/// at its data timeout, and its buffers are freed then.
#[derive(Debug, Default)]
pub(crate) struct Cancel {
    fds: std::sync::Mutex<Vec<std::os::fd::OwnedFd>>,
    cancelled: std::sync::atomic::AtomicBool,
}

impl Cancel {
    /// Shuts `fd`'s socket down with the run: at once if the run is already cancelled.
    pub(crate) fn watch(&self, fd: std::os::fd::BorrowedFd<'_>) {
        let Ok(own) = fd.try_clone_to_owned() else {
            return; // no descriptor left: the run ends at its own timeout instead
        };
        let mut fds = self.fds.lock().unwrap_or_else(|p| p.into_inner());
        if self.cancelled.load(Ordering::Acquire) {
            let _ = rustix::net::shutdown(&own, rustix::net::Shutdown::Both);
        } else {
            fds.push(own);
        }
    }

    /// Shuts every watched socket down.
    pub(crate) fn cancel(&self) {
        let fds = self.fds.lock().unwrap_or_else(|p| p.into_inner());
        self.cancelled.store(true, Ordering::Release);
        for fd in fds.iter() {
            let _ = rustix::net::shutdown(fd, rustix::net::Shutdown::Both);
        }
    }
}

pub(crate) fn server_log(on: bool, msg: std::fmt::Arguments<'_>) {
    if on {
        let _ = writeln!(std::io::stderr(), "zcnet bench server: {msg}");
    }
}

/// Ends a served run on the control connection: this side's measurements, or an `error`
/// naming what went wrong (and the error returned for the server's log).
pub(crate) fn respond(
    c: &mut TcpStream,
    result: Result<SideReport, BenchError>,
) -> Result<(), BenchError> {
    match result {
        Ok(report) => {
            protocol::write_message(c, &Message::Result { report })?;
            Ok(())
        }
        Err(e) => {
            let _ = protocol::write_message(
                c,
                &Message::Error {
                    reason: e.to_string(),
                },
            );
            Err(e)
        }
    }
}
