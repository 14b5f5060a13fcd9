//! The client side of one run: negotiate over the control connection, drive the data
//! connections, collect the server's measurements, and put both sides into one [`Run`].
//! Byte counts of the two ends must agree, or the run fails (UDP message runs: every message
//! received whole or counted lost, [`check_agreement`]).

use super::workers::{self, WorkerOut};
use super::{BenchError, Progress, RunSpec};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use zcnet_bench::cpu::SystemCpu;
use zcnet_bench::protocol::{self, Limit, Message, Params, Proto};
use zcnet_bench::report::{
    check_message_counts, Cpu, Derived, Fallbacks, Latency, Mode, Run, SideReport, SystemCpuTimes,
};

/// Bound on control-connection steps other than waiting for the run's end.
pub(crate) const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

fn io(context: &'static str) -> impl Fn(std::io::Error) -> BenchError {
    move |e| BenchError::io(context, e)
}

/// How each stream's share of the run ends: its byte quota or round trips, or the shared
/// deadline.
fn stream_limits(p: &Params, start: Instant) -> (Vec<Option<u64>>, Option<Instant>) {
    let n = u64::from(p.streams);
    match p.limit {
        Limit::Bytes(total) => {
            let quotas = (0..n)
                .map(|i| {
                    let share = total / n + u64::from(i < total % n);
                    Some(match p.mode {
                        Mode::Stream => share,
                        // Round trips of `size` bytes each; at least one.
                        Mode::Rr => (share / p.size).max(1),
                    })
                })
                .collect();
            (quotas, None)
        }
        Limit::Seconds(s) => (
            vec![None; n as usize],
            Some(start + Duration::from_secs_f64(s)),
        ),
    }
}

/// Runs `spec` against the server whose control port is `ctrl`. Must be called from a
/// thread in the client's network namespace.
pub(crate) fn run(
    ctrl: SocketAddr,
    spec: &RunSpec,
    progress: &Progress,
) -> Result<Run, BenchError> {
    if spec.topology.proto == Proto::Udp {
        return super::udp::run(ctrl, spec, progress);
    }
    let p = &spec.params;
    let mut c = connect_control(ctrl)?;
    protocol::write_message(&mut c, &Message::Hello { params: p.clone() })?;
    let data_port = protocol::read_accept(protocol::read_message(&mut c))?;
    let data = SocketAddr::new(ctrl.ip(), data_port);

    let sys0 = SystemCpu::now();
    let start = Instant::now();
    let (quotas, deadline) = stream_limits(p, start);
    let outs: Vec<Result<WorkerOut, BenchError>> = std::thread::scope(|s| {
        let handles: Vec<_> = quotas
            .iter()
            .map(|&q| {
                s.spawn(move || match p.mode {
                    Mode::Stream => workers::stream_send(data, p, q, deadline, progress),
                    Mode::Rr => workers::rr_client(data, p, q, deadline, progress),
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(BenchError::Failed("a sender thread panicked".into())))
            })
            .collect()
    });
    let mut ok = Vec::new();
    let mut first_err = None;
    for o in outs {
        match o {
            Ok(o) => ok.push(o),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_err {
        return Err(report_failure(&mut c, e));
    }
    let client = workers::merge(ok);
    protocol::write_message(
        &mut c,
        &Message::Done {
            report: client.clone(),
        },
    )?;
    // The server answers when its receivers have seen the end of every stream.
    c.set_read_timeout(Some(workers::DATA_TIMEOUT + CONTROL_TIMEOUT))
        .map_err(io("control socket"))?;
    let server = match protocol::read_message(&mut c)? {
        Message::Result { report } => report,
        other => return Err(protocol::ProtocolError::unexpected("result", other).into()),
    };
    let wall = start.elapsed().as_secs_f64();
    let system = SystemCpuTimes::since(sys0).unwrap_or_default();
    assemble(spec, &client, &server, system, wall)
}

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
            .map_err(BenchError::Mismatch),
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
