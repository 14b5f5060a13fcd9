//! `zcnet bench --server`: answers one client run at a time (as iperf3 does, so runs do not
//! disturb each other's measurements). For each control connection: read the hello, reject
//! what this build cannot run (with the reason, logged here and sent there), open a data
//! listener on the control connection's own address, receive (or echo) on `streams`
//! connections, and send this side's measurements back. A UDP message run (`hello_udp`) is
//! served by [`super::udp::serve`].

use super::control::{server_log, CONTROL_TIMEOUT};
use super::spec::{BenchError, Transport};
use super::{lm, tcp, udp};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use zcnet::{RxPath, TxPath};
use zcnet_bench::protocol::{self, Message, Proto};

/// How the server reports.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServeOptions {
    /// Log accepted and rejected runs to stderr (the standalone server); the in-process
    /// server of the all-in-one mode leaves reporting to its client.
    pub log: bool,
    /// Return after one run, with its outcome.
    pub once: bool,
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
            server_log(opts.log, format_args!("run from {peer} failed: {e}"));
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
    c.set_read_timeout(Some(CONTROL_TIMEOUT))
        .map_err(io("control socket"))?;
    c.set_write_timeout(Some(CONTROL_TIMEOUT))
        .map_err(io("control socket"))?;
    c.set_nodelay(true).map_err(io("control socket"))?;
    let tx_names = names(&TxPath::ALL, TxPath::name);
    let mut rx_names = names(&RxPath::ALL, RxPath::name);
    rx_names.push(super::files::FILE);
    let req = match protocol::answer_hello(protocol::read_message(&mut c), &tx_names, &rx_names) {
        Ok(req) => req,
        Err(reason) => {
            let _ = protocol::write_message(
                &mut c,
                &Message::Reject {
                    reason: reason.0.clone(),
                },
            );
            return Err(BenchError::Rejected(reason.0));
        }
    };
    let proto = if req.udp.is_some() {
        Proto::Udp
    } else {
        Proto::Tcp
    };
    match Transport::of(proto, &req.params) {
        Transport::Tcp => tcp::serve(c, peer, req.params, opts.log),
        Transport::Udp => udp::serve(c, peer, req, opts.log),
        Transport::Lm => lm::serve(c, peer, req, opts.log),
    }
}
