//! The client side of one run: negotiate over the control connection, drive the data
//! connections, collect the server's measurements, and put both sides into one [`Run`].
//! Byte counts of the two ends must agree, or the run fails (UDP message runs: every message
//! received whole or counted lost, `check_agreement`).

use super::control::{assemble, check_bytes, server_log};
use super::control::{
    connect_control, merge, report_failure, Cancel, WorkerOut, CONTROL_TIMEOUT, DATA_TIMEOUT,
};
use super::spec::{BenchError, Progress, RunSpec};
use super::workers;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use zcnet::stream::Listener;
use zcnet_bench::cpu::SystemCpu;
use zcnet_bench::protocol::{self, Limit, Message, Params};
use zcnet_bench::report::{Mode, Run, SideReport, SystemCpuTimes};

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
    let p = &spec.params;
    // `--tx file`: the file is written (or dropped from the cache, `--cold`) before the
    // server waits for data connections and before the run's clock starts.
    let src = (super::files::file_tx_mode(&p.tx).is_some() && p.mode == Mode::Stream)
        .then(|| super::files::source(p.size))
        .transpose()?;
    let src = src.as_deref();
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
                s.spawn(move || {
                    super::pin::sender()?;
                    match p.mode {
                        Mode::Stream => workers::stream_send(data, p, q, deadline, progress, src),
                        Mode::Rr => workers::rr_client(data, p, q, deadline, progress),
                    }
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
    let client = merge(ok);
    protocol::write_message(
        &mut c,
        &Message::Done {
            report: client.clone(),
        },
    )?;
    // The server answers when its receivers have seen the end of every stream.
    c.set_read_timeout(Some(DATA_TIMEOUT + CONTROL_TIMEOUT))
        .map_err(io("control socket"))?;
    let server = match protocol::read_message(&mut c)? {
        Message::Result { report } => report,
        other => return Err(protocol::ProtocolError::unexpected("result", other).into()),
    };
    let wall = start.elapsed().as_secs_f64();
    let system = SystemCpuTimes::since(sys0).unwrap_or_default();
    assemble(spec, &client, &server, system, wall)
}

/// The server of one TCP run, after its hello: open a data listener on the control
/// connection's own address, receive (or echo) on `streams` connections, and send this
/// side's measurements back — or an `error` naming what went wrong.
pub(crate) fn serve(
    mut c: TcpStream,
    peer: SocketAddr,
    params: Params,
    log: bool,
    cancel: &Cancel,
) -> Result<(), BenchError> {
    let io = |ctx: &'static str| move |e| BenchError::io(ctx, e);
    let fail = |c: &mut TcpStream, e: BenchError| -> BenchError {
        let _ = protocol::write_message(
            c,
            &Message::Error {
                reason: e.to_string(),
            },
        );
        e
    };
    let listener = match workers::receiver_config(&params).and_then(|cfg| {
        let ip = c.local_addr().map_err(io("getsockname (control)"))?.ip();
        Listener::bind(SocketAddr::new(ip, 0), &cfg).map_err(|source| BenchError::Zcnet {
            context: "binding the data listener",
            source,
        })
    }) {
        Ok(l) => l,
        Err(e) => return Err(fail(&mut c, e)),
    };
    cancel.watch(std::os::fd::AsFd::as_fd(&listener));
    let port = match listener.local_addr() {
        Ok(a) => a.port(),
        Err(source) => {
            return Err(fail(
                &mut c,
                BenchError::Zcnet {
                    context: "getsockname (data listener)",
                    source,
                },
            ))
        }
    };
    protocol::write_message(&mut c, &Message::Accept { data_port: port })?;
    server_log(
        log,
        format_args!(
            "run from {peer}: {} {}→{} size {} streams {}",
            params.mode.name(),
            params.tx,
            params.rx,
            params.size,
            params.streams
        ),
    );
    let progress = Progress::default();
    let sys0 = SystemCpu::now();
    let outs = receive_all(&listener, &params, &progress, cancel);
    let system = zcnet_bench::report::SystemCpuTimes::since(sys0);
    let report = match outs {
        Ok(outs) => SideReport {
            system,
            ..merge(outs)
        },
        Err(e) => return Err(fail(&mut c, e)),
    };
    c.set_read_timeout(Some(DATA_TIMEOUT))
        .map_err(io("control socket"))?;
    match protocol::read_message(&mut c)? {
        Message::Done { report: client } => {
            if let Err(e) = check_bytes(&client, &report) {
                server_log(true, format_args!("run from {peer}: {e}"));
            }
        }
        other => return Err(protocol::ProtocolError::unexpected("done", other).into()),
    }
    protocol::write_message(&mut c, &Message::Result { report })?;
    Ok(())
}

fn receive_all(
    listener: &Listener,
    p: &Params,
    progress: &Progress,
    cancel: &Cancel,
) -> Result<Vec<WorkerOut>, BenchError> {
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for _ in 0..p.streams {
            let spawned = std::thread::Builder::new()
                .name("bench receiver".into())
                .spawn_scoped(s, || {
                    super::pin::receiver()?;
                    match p.mode {
                        Mode::Stream => workers::stream_receive(listener, p, progress, cancel),
                        Mode::Rr => workers::rr_server(listener, p, progress, cancel),
                    }
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // No thread for a stream: this run fails (its receivers started so far
                    // are woken and end), the server goes on.
                    cancel.cancel();
                    for h in handles {
                        let _ = h.join();
                    }
                    return Err(BenchError::io("starting a receiver thread", e));
                }
            }
        }
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(BenchError::Failed("a receiver thread panicked".into()))
                })
            })
            .collect()
    })
}
