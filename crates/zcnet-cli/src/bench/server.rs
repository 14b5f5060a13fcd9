//! `zcnet bench --server`: answers one client run at a time (as iperf3 does, so runs do not
//! disturb each other's measurements). For each control connection: read the hello, reject
//! what this build cannot run (with the reason, logged here and sent there), open a data
//! listener on the control connection's own address, receive (or echo) on `streams`
//! connections, and send this side's measurements back. A UDP message run (`hello_udp`) is
//! served by [`super::udp::serve`].

use super::workers::{self, WorkerOut};
use super::{BenchError, Progress};
use std::io::Write as _;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use zcnet::stream::Listener;
use zcnet::{RxPath, TxPath};
use zcnet_bench::cpu::SystemCpu;
use zcnet_bench::protocol::{self, Message, Params};
use zcnet_bench::report::{Mode, SideReport};

/// How the server reports.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServeOptions {
    /// Log accepted and rejected runs to stderr (the standalone server); the in-process
    /// server of the all-in-one mode leaves reporting to its client.
    pub log: bool,
    /// Return after one run, with its outcome.
    pub once: bool,
}

fn log(on: bool, msg: std::fmt::Arguments<'_>) {
    if on {
        let _ = writeln!(std::io::stderr(), "zcnet bench server: {msg}");
    }
}

/// Serves runs on `listener` until `stop` is set (checked every 100 ms) or, with `once`,
/// after one run.
pub(crate) fn serve(
    listener: &TcpListener,
    stop: &AtomicBool,
    opts: ServeOptions,
) -> Result<(), BenchError> {
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        match zcnet_sys::raw::socket::poll(
            listener.as_fd(),
            zcnet_sys::raw::socket::PollFlags::IN,
            Some(Duration::from_millis(100)),
        ) {
            Ok(ev) if ev.is_empty() => continue,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(BenchError::io("poll (control listener)", e)),
        }
        let (conn, peer) = match listener.accept() {
            Ok(x) => x,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(BenchError::io("accept (control)", e)),
        };
        let result = handle(conn, peer, opts);
        if let Err(e) = &result {
            log(opts.log, format_args!("run from {peer} failed: {e}"));
        }
        if opts.once {
            return result;
        }
    }
}

fn names<T: Copy>(all: &[T], name: fn(T) -> &'static str) -> Vec<&'static str> {
    all.iter().map(|&p| name(p)).collect()
}

/// One run, from hello to result.
fn handle(mut c: TcpStream, peer: SocketAddr, opts: ServeOptions) -> Result<(), BenchError> {
    let io = |ctx: &'static str| move |e| BenchError::io(ctx, e);
    c.set_read_timeout(Some(super::client::CONTROL_TIMEOUT))
        .map_err(io("control socket"))?;
    c.set_write_timeout(Some(super::client::CONTROL_TIMEOUT))
        .map_err(io("control socket"))?;
    c.set_nodelay(true).map_err(io("control socket"))?;
    let tx_names = names(&TxPath::ALL, TxPath::name);
    let rx_names = names(&RxPath::ALL, RxPath::name);
    let params = match protocol::answer_hello(protocol::read_message(&mut c), &tx_names, &rx_names)
    {
        Ok(req) if req.udp.is_some() => return super::udp::serve(c, peer, req, opts.log),
        Ok(req) => req.params,
        Err(reason) => {
            let _ = protocol::write_message(
                &mut c,
                &Message::Reject {
                    reason: reason.clone(),
                },
            );
            return Err(BenchError::Rejected(reason));
        }
    };
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
    log(
        opts.log,
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
    let outs = receive_all(&listener, &params, &progress);
    let system = zcnet_bench::report::SystemCpuTimes::since(sys0);
    let report = match outs {
        Ok(outs) => SideReport {
            system,
            ..workers::merge(outs)
        },
        Err(e) => return Err(fail(&mut c, e)),
    };
    c.set_read_timeout(Some(workers::DATA_TIMEOUT))
        .map_err(io("control socket"))?;
    match protocol::read_message(&mut c)? {
        Message::Done { report: client } => {
            if let Err(e) = super::client::check_bytes(&client, &report) {
                log(true, format_args!("run from {peer}: {e}"));
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
) -> Result<Vec<WorkerOut>, BenchError> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..p.streams)
            .map(|_| {
                s.spawn(|| match p.mode {
                    Mode::Stream => workers::stream_receive(listener, p, progress),
                    Mode::Rr => workers::rr_server(listener, p, progress),
                })
            })
            .collect();
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
