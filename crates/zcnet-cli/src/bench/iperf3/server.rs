//! `zcnet bench -s`: serves iperf3's protocol to any number of clients at once (iperf3's
//! own server runs one test at a time and answers others `ACCESS_DENIED`).
//!
//! One listener takes control and data connections alike, as iperf3's does: every
//! connection opens with a cookie; a cookie some running test is waiting for makes it that
//! test's data connection, any other starts a new test. Accepts are numbered as they
//! happen, so a test gets its data connections in the client's connection order (stream
//! ids and directions follow that order) even though each cookie is read on its own
//! thread — a slow or silent connection never holds up the others.

use super::opts::{Format, Out, ServerOpts, CONTROL_TIMEOUT};
use super::report::{self, Measured, Probe, Reporter};
use super::streams::{self, Control, DataCfg, StreamSpec};
use super::wire;
use crate::bench::spec::BenchError;
use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zcnet_bench::iperf3::output::{self, Role};
use zcnet_bench::iperf3::results::stream_id;
use zcnet_bench::iperf3::{Cookie, Direction, Iperf3Error, Results, State, TestParams};
use zcnet_bench::report::SystemCpuTimes;

type Arrivals = mpsc::Sender<(u64, TcpStream)>;

struct Shared {
    opts: ServerOpts,
    out: Arc<Out>,
    /// Tests waiting for data connections, by cookie.
    pending: Mutex<HashMap<Cookie, Arrivals>>,
    /// Tests begun and tests ended.
    begun: AtomicUsize,
    ended: AtomicUsize,
    failed: AtomicBool,
}

fn log(msg: std::fmt::Arguments<'_>) {
    eprintln!("zcnet bench -s: {msg}");
}

/// Serves until `stop` is set, or after one test with `-1`.
pub(crate) fn serve(
    opts: ServerOpts,
    listener: TcpListener,
    stop: &AtomicBool,
) -> Result<(), BenchError> {
    let out = Arc::new(
        Out::open(opts.common.logfile.as_deref())
            .map_err(|e| BenchError::io("opening --logfile", e))?,
    );
    let shared = Arc::new(Shared {
        opts,
        out,
        pending: Mutex::new(HashMap::new()),
        begun: AtomicUsize::new(0),
        ended: AtomicUsize::new(0),
        failed: AtomicBool::new(false),
    });
    let seq = AtomicU64::new(0);
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        if shared.opts.once && shared.ended.load(Ordering::Acquire) > 0 {
            return if shared.failed.load(Ordering::Relaxed) {
                Err(BenchError::Failed("the test failed (see above)".into()))
            } else {
                Ok(())
            };
        }
        let ready = zcnet_sys::raw::socket::poll(
            listener.as_fd(),
            zcnet_sys::raw::socket::PollFlags::IN,
            Some(Duration::from_millis(100)),
        )
        .map(|ev| !ev.is_empty())
        .unwrap_or(false);
        if !ready {
            continue;
        }
        let (conn, _) = match listener.accept() {
            Ok(c) => c,
            Err(e) => {
                log(format_args!("accept: {e}"));
                continue;
            }
        };
        let n = seq.fetch_add(1, Ordering::Relaxed);
        let sh = shared.clone();
        std::thread::Builder::new()
            .name("iperf3-conn".into())
            .spawn(move || route(conn, n, &sh))
            .map_err(|e| BenchError::io("spawning a connection thread", e))?;
    }
}

/// Reads a new connection's cookie and hands it to its test, or starts a test.
fn route(mut conn: TcpStream, n: u64, sh: &Shared) {
    let _ = conn.set_read_timeout(Some(CONTROL_TIMEOUT));
    let cookie = match wire::read_cookie(&mut conn) {
        Ok(c) => c,
        Err(e) => {
            let who = conn.peer_addr().map_or("?".into(), |a| a.to_string());
            log(format_args!(
                "{who}: {e} (a zcnet bench --client speaks zcnet's own protocol: use --server for it)"
            ));
            return;
        }
    };
    let waiting = sh
        .pending
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&cookie)
        .cloned();
    if let Some(tx) = waiting {
        let _ = tx.send((n, conn));
        return;
    }
    if sh.opts.once && sh.begun.fetch_add(1, Ordering::AcqRel) > 0 {
        // `-1`: one test only; others are told the server is busy, as iperf3 tells them.
        let _ = wire::write_state(&mut conn, State::AccessDenied);
        return;
    }
    let peer = conn.peer_addr().map_or("?".into(), |a| a.to_string());
    if let Err(e) = test(conn, cookie, sh) {
        log(format_args!("test from {peer}: {e}"));
        sh.failed.store(true, Ordering::Relaxed);
    }
    sh.ended.fetch_add(1, Ordering::Release);
}

fn perr(e: Iperf3Error) -> BenchError {
    BenchError::Failed(e.to_string())
}

/// Makes `cookie`'s data connections come to this test: before `CREATE_STREAMS` is sent,
/// or the first might arrive before anyone waits for it.
fn expect_streams(cookie: Cookie, sh: &Shared) -> mpsc::Receiver<(u64, TcpStream)> {
    let (tx, rx) = mpsc::channel();
    sh.pending
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(cookie, tx);
    rx
}

/// Collects `n` data connections for `cookie` (in accept order), within the control bound.
fn collect_streams(
    cookie: Cookie,
    rx: mpsc::Receiver<(u64, TcpStream)>,
    n: u32,
    sh: &Shared,
) -> Result<Vec<TcpStream>, BenchError> {
    let deadline = Instant::now() + CONTROL_TIMEOUT;
    let mut got = Vec::new();
    while got.len() < n as usize {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(c) => got.push(c),
            Err(_) => break,
        }
    }
    sh.pending
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&cookie);
    if got.len() < n as usize {
        return Err(BenchError::Failed(format!(
            "{} of {n} data connections arrived within {CONTROL_TIMEOUT:?}",
            got.len()
        )));
    }
    got.sort_by_key(|(seq, _)| *seq);
    Ok(got.into_iter().map(|(_, s)| s).collect())
}

/// One test, on the thread that read its control connection's cookie.
fn test(mut ctrl: TcpStream, cookie: Cookie, sh: &Shared) -> Result<(), BenchError> {
    let opts = &sh.opts.common;
    ctrl.set_nodelay(true)
        .map_err(|e| BenchError::io("TCP_NODELAY (control)", e))?;
    ctrl.set_read_timeout(Some(CONTROL_TIMEOUT))
        .map_err(|e| BenchError::io("SO_RCVTIMEO (control)", e))?;
    let peer = ctrl
        .peer_addr()
        .map_err(|e| BenchError::io("getpeername (control)", e))?;
    wire::write_state(&mut ctrl, State::ParamExchange).map_err(perr)?;
    let params = match wire::read_json(&mut ctrl).and_then(|v| TestParams::from_json(&v)) {
        Ok(p) => p,
        Err(e) => {
            let code = match e {
                Iperf3Error::Unsupported(_) => wire::IE_UNIMP,
                _ => wire::IE_RECV_PARAMS,
            };
            wire::write_server_error(&mut ctrl, code, 0);
            return Err(perr(e));
        }
    };
    let arrivals = expect_streams(cookie, sh);
    if let Err(e) = wire::write_state(&mut ctrl, State::CreateStreams) {
        sh.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&cookie);
        return Err(perr(e));
    }
    let conns = match collect_streams(cookie, arrivals, params.connections(), sh) {
        Ok(c) => c,
        Err(e) => {
            wire::write_server_error(&mut ctrl, wire::IE_STREAM_CONNECT, 0);
            return Err(e);
        }
    };
    // The server's view: forward = it receives; -R = it sends; --bidir = the client's
    // sending connections (first) are received here, the rest sent.
    let p = params.parallel as usize;
    let specs: Vec<StreamSpec> = conns
        .into_iter()
        .enumerate()
        .map(|(i, stream)| {
            let (sender, main) = match params.direction {
                Direction::Forward => (false, true),
                Direction::Reverse => (true, true),
                Direction::Bidir => (i >= p, i < p),
            };
            StreamSpec {
                id: stream_id(i),
                sender,
                main,
                stream,
            }
        })
        .collect();
    let data = DataCfg {
        tx: opts.tx,
        rx: opts.rx,
        len: params.len as usize,
        nodelay: params.nodelay,
        file: if opts.file && params.direction.server_sends() {
            Some(crate::bench::files::source(params.len)?)
        } else {
            None
        },
        rx_file: opts.rx_file,
        drain_before_end: false,
    };
    let zstart = serde_json::json!({
        "tx_path": if data.file.is_some() { "file" } else { opts.tx.name() },
        "rx_path": opts.rx_name(),
    });
    let refs: Vec<&TcpStream> = specs.iter().map(|s| &s.stream).collect();
    let (start_json, start_text) = super::start::start(
        Role::Server {
            host: peer.ip().to_string(),
            port: peer.port(),
        },
        &cookie,
        &params,
        &ctrl,
        &refs,
        zstart,
        opts.format,
    );
    match opts.format {
        Format::Text => sh.out.write(&start_text),
        Format::JsonStream => sh.out.write(&(output::event("start", &start_json) + "\n")),
        Format::Json => {}
    }
    let ctl = Arc::new(Control::default());
    let sys0 = zcnet_bench::cpu::SystemCpu::now();
    wire::write_state(&mut ctrl, State::TestStart).map_err(perr)?;
    let t0 = Instant::now();
    let mut running = streams::start(specs, &data, &ctl, t0);
    let reporter = Reporter::spawn(
        t0,
        running.iter().map(Probe::of).collect(),
        opts.interval,
        params.direction == Direction::Reverse,
        opts.format,
        sh.out.clone(),
    );
    let result = wire::write_state(&mut ctrl, State::TestRunning)
        .map_err(perr)
        .and_then(|()| run_to_end(&mut ctrl, &params));
    ctl.stop.store(true, Ordering::Relaxed);
    let intervals = reporter.finish();
    let sent = streams::join_senders(&mut running);
    let peer_results = match result.and_then(|()| exchange(&mut ctrl, &running)) {
        Ok(r) => r,
        Err(e) => {
            ctl.abort.store(true, Ordering::Relaxed);
            let _ = streams::join_receivers(running, &ctl);
            return Err(e);
        }
    };
    let received = streams::join_receivers(running, &ctl);
    let mut all = match (sent, received) {
        (Ok(mut s), Ok(r)) => {
            s.extend(r);
            s
        }
        (Err(e), _) | (_, Err(e)) => {
            wire::write_server_error(&mut ctrl, wire::IE_STREAM_WRITE, 0);
            return Err(e);
        }
    };
    all.sort_by_key(|o| o.id);
    let measured = Measured {
        wall: all.iter().map(|o| o.seconds).fold(0.0, f64::max),
        outs: all,
        machine: SystemCpuTimes::since(sys0),
    };
    let tx_name = if data.file.is_some() {
        "file".to_string()
    } else {
        opts.tx.name().to_string()
    };
    let mut local = measured.zcnet("server", opts.tx, opts.rx);
    local["tx_path"] = serde_json::json!(tx_name);
    local["rx_path"] = serde_json::json!(opts.rx_name());
    let end = report::end(&measured, &peer_results, local.clone());
    let doc = output::document(start_json, intervals, end.clone(), None);
    let mut ours: Results = measured.results(local);
    if params.get_server_output {
        ours.server_output_json = Some(doc.clone());
    }
    wire::write_json(&mut ctrl, &ours.to_json()).map_err(perr)?;
    wire::write_state(&mut ctrl, State::DisplayResults).map_err(perr)?;
    match wire::read_state(&mut ctrl) {
        Ok(State::IperfDone) => {}
        Ok(s) => log(format_args!(
            "{peer}: ended with {s:?} instead of IPERF_DONE"
        )),
        Err(e) => log(format_args!("{peer}: after DISPLAY_RESULTS: {e}")),
    }
    for o in measured.outs.iter().filter(|o| !o.sender) {
        let sent = peer_results.stream(o.id).map_or(0, |s| s.bytes);
        if sent != o.bytes {
            log(format_args!(
                "{peer}: stream {}: the client reports {sent} bytes sent, {} arrived here",
                o.id, o.bytes
            ));
        }
    }
    match opts.format {
        Format::Json => sh
            .out
            .write(&(serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n")),
        Format::JsonStream => sh.out.write(&(output::event("end", &end) + "\n")),
        Format::Text => sh.out.write(&report::end_text(&end)),
    }
    Ok(())
}

/// Waits for the client's `TEST_END` (or its going away).
fn run_to_end(ctrl: &mut TcpStream, params: &TestParams) -> Result<(), BenchError> {
    // A timed test ends within its time and a little; a byte-count test may take long.
    let bound = if params.bytes == 0 {
        Duration::from_secs(u64::from(params.time) + 30)
    } else {
        Duration::from_secs(3600)
    };
    ctrl.set_read_timeout(Some(bound))
        .map_err(|e| BenchError::io("SO_RCVTIMEO (control)", e))?;
    match wire::read_state(ctrl).map_err(perr)? {
        State::TestEnd => Ok(()),
        State::ClientTerminate => Err(BenchError::Failed("the client terminated the test".into())),
        s => Err(perr(Iperf3Error::Unexpected {
            got: format!("{s:?}"),
            during: "waiting for TEST_END",
        })),
    }
}

/// `EXCHANGE_RESULTS`: the client's results first; its per-stream byte counts become the
/// receiving streams' targets, so they drain everything the client sent.
fn exchange(ctrl: &mut TcpStream, receivers: &[streams::Running]) -> Result<Results, BenchError> {
    ctrl.set_read_timeout(Some(CONTROL_TIMEOUT))
        .map_err(|e| BenchError::io("SO_RCVTIMEO (control)", e))?;
    wire::write_state(ctrl, State::ExchangeResults).map_err(perr)?;
    let peer = wire::read_json(ctrl)
        .and_then(|v| Results::from_json(&v))
        .map_err(perr)?;
    for r in receivers {
        if let Some(s) = peer.stream(r.id) {
            r.live.target.store(s.bytes, Ordering::Relaxed);
        }
    }
    Ok(peer)
}
