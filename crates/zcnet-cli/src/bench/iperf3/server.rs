//! `zcnet bench -s`: serves iperf3's protocol to any number of clients at once (iperf3's
//! own server runs one test at a time and answers others `ACCESS_DENIED`).
//!
//! One listener takes control and data connections alike, as iperf3's does: every
//! connection opens with a cookie; a cookie some running test is waiting for makes it that
//! test's data connection, any other starts a new test. Accepts are numbered as they
//! happen, so a test gets its data connections in the client's connection order (stream
//! ids and directions follow that order) even though each cookie is read on its own
//! thread — a slow or silent connection never holds up the others.
//!
//! The server bounds itself, since many clients share it: every test's buffers come out of
//! one memory budget (`--max-memory`, [`zcnet_bench::iperf3::budget`]): a test that does
//! not fit now is told `ACCESS_DENIED` (iperf3's "busy, try again later"), one that could
//! never fit gets iperf3's own error for the number too large (`-P` or `-l`). An `accept`
//! that fails for want of descriptors backs off rather than spins ([`AcceptBackoff`]), and
//! a thread that cannot be started turns away that client only.

use super::opts::{Format, Out, ServerOpts, CONTROL_TIMEOUT};
use super::report::{self, Measured, Probe, Reporter};
use super::start::Conn;
use super::streams::{self, Control, DataCfg, StreamSpec};
use super::udp;
use super::wire;
use crate::bench::backoff::{AcceptBackoff, LogLimit};
use crate::bench::spec::BenchError;
use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zcnet_bench::iperf3::budget::{Admit, Budget, Need};
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
    /// The memory every running test's buffers hold, against `--max-memory`.
    budget: Mutex<Budget>,
    /// Failed tests and refused clients: a line a second at most, however many come.
    refusals: Mutex<LogLimit>,
    /// Held while a UDP test connects its streams: a connect datagram carries no cookie,
    /// so only one test may be waiting for them at a time.
    udp_setup: Mutex<()>,
}

impl Shared {
    /// Logs a test's failure or a client's refusal, within the once-a-second limit.
    fn log_refusal(&self, msg: std::fmt::Arguments<'_>) {
        let line = self
            .refusals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .line(Instant::now(), msg);
        if let Some(l) = line {
            log(format_args!("{l}"));
        }
    }

    /// Reserves a test's buffers, or says why not (the guard gives them back).
    fn admit(&self, need: &Need) -> Result<Reserved<'_>, Admit> {
        let mut b = self.budget.lock().unwrap_or_else(|e| e.into_inner());
        match b.admit(need) {
            Admit::Granted { ring, bytes } => Ok(Reserved {
                sh: self,
                ring,
                bytes,
            }),
            refused => Err(refused),
        }
    }
}

/// A test's share of the memory budget, given back when the test ends however it ends.
struct Reserved<'a> {
    sh: &'a Shared,
    ring: u32,
    bytes: u64,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        self.sh
            .budget
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .release(self.bytes);
    }
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
    let budget = Mutex::new(Budget::new(opts.max_memory));
    let shared = Arc::new(Shared {
        budget,
        refusals: Mutex::new(LogLimit::default()),
        udp_setup: Mutex::new(()),
        opts,
        out,
        pending: Mutex::new(HashMap::new()),
        begun: AtomicUsize::new(0),
        ended: AtomicUsize::new(0),
        failed: AtomicBool::new(false),
    });
    let seq = AtomicU64::new(0);
    let mut backoff = AcceptBackoff::default();
    let mut spawn_log = LogLimit::default();
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
        let (conn, peer) = match listener.accept() {
            Ok(c) => {
                backoff.succeeded();
                c
            }
            Err(e) => {
                let (wait, line) = backoff.failed(&e, Instant::now());
                if let Some(l) = line {
                    log(format_args!("{l}"));
                }
                sleep_unless_stopped(wait, stop);
                continue;
            }
        };
        let n = seq.fetch_add(1, Ordering::Relaxed);
        let sh = shared.clone();
        // The connection goes to the thread, or comes back to be turned away here.
        let cell = Arc::new(Mutex::new(Some(conn)));
        let c = cell.clone();
        let spawned = std::thread::Builder::new()
            .name("iperf3-conn".into())
            .spawn(move || {
                let conn = c.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(conn) = conn {
                    route(conn, n, &sh);
                }
            });
        if let Err(e) = spawned {
            // Out of threads (or memory for a stack): this client only is refused, with
            // iperf3's "busy, try again later"; the server goes on.
            let conn = cell.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(mut conn) = conn {
                let _ = conn.set_nonblocking(true);
                let _ = wire::write_state(&mut conn, State::AccessDenied);
            }
            if let Some(l) = spawn_log.line(
                Instant::now(),
                format_args!("{peer}: refused: cannot start a thread for it: {e}"),
            ) {
                log(format_args!("{l}"));
            }
        }
    }
}

/// Sleeps `wait`, in slices short enough to notice `stop`.
fn sleep_unless_stopped(wait: Duration, stop: &AtomicBool) {
    let until = Instant::now() + wait;
    while !stop.load(Ordering::Relaxed) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

/// Reads a new connection's cookie and hands it to its test, or starts a test.
fn route(mut conn: TcpStream, n: u64, sh: &Shared) {
    let _ = conn.set_read_timeout(Some(CONTROL_TIMEOUT));
    let cookie = match wire::read_cookie(&mut conn) {
        Ok(c) => c,
        Err(e) => {
            let who = conn.peer_addr().map_or("?".into(), |a| a.to_string());
            sh.log_refusal(format_args!(
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
        sh.log_refusal(format_args!("test from {peer}: {e}"));
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

/// One test, on the thread that read its control connection's cookie: its parameters,
/// its share of the memory budget, then its streams (UDP's or TCP's) run to the end.
fn test(mut ctrl: TcpStream, cookie: Cookie, sh: &Shared) -> Result<(), BenchError> {
    ctrl.set_nodelay(true)
        .map_err(|e| BenchError::io("TCP_NODELAY (control)", e))?;
    ctrl.set_read_timeout(Some(CONTROL_TIMEOUT))
        .map_err(|e| BenchError::io("SO_RCVTIMEO (control)", e))?;
    let peer = ctrl
        .peer_addr()
        .map_err(|e| BenchError::io("getpeername (control)", e))?;
    let params = exchange_params(&mut ctrl)?;
    let reserved = reserve(&mut ctrl, &params, sh)?;
    if params.udp {
        return udp_test(ctrl, cookie, params, peer, reserved, sh);
    }
    tcp_test(ctrl, cookie, params, peer, reserved, sh)
}

/// `PARAM_EXCHANGE` and the client's parameters; a client past a limit gets iperf3's own
/// error for it, so it prints its own message.
fn exchange_params(ctrl: &mut TcpStream) -> Result<TestParams, BenchError> {
    wire::write_state(ctrl, State::ParamExchange).map_err(perr)?;
    match wire::read_json(ctrl).and_then(|v| TestParams::from_json(&v)) {
        Ok(p) => Ok(p),
        Err(e) => {
            let code = match e {
                Iperf3Error::Unsupported(_) => wire::IE_UNIMP,
                Iperf3Error::BadField {
                    field: "parallel", ..
                } => wire::IE_NUM_STREAMS,
                Iperf3Error::BadField { field: "len", .. } => wire::IE_BLOCK_SIZE,
                Iperf3Error::BadField { field: "time", .. } => wire::IE_DURATION,
                _ => wire::IE_RECV_PARAMS,
            };
            wire::write_server_error(ctrl, code, 0);
            Err(perr(e))
        }
    }
}

/// The buffers a test of `params` holds at this server.
fn need_of(params: &TestParams, sh: &Shared) -> Need {
    let opts = &sh.opts.common;
    let p = params.parallel;
    let (senders, receivers) = match params.direction {
        Direction::Forward => (0, p),
        Direction::Reverse => (p, 0),
        Direction::Bidir => (p, p),
    };
    // A UDP stream holds one batch (≤ 64 KiB) or one GRO read (128 KiB): two blocks of
    // 128 KiB at most, whatever -l.
    if params.udp {
        Need {
            senders,
            receivers,
            len: 128 << 10,
            fixed_two_blocks: true,
        }
    } else {
        Need {
            senders,
            receivers,
            len: params.len,
            fixed_two_blocks: opts.tx.name() == "cow" && !opts.file,
        }
    }
}

/// Reserves the test's buffers from the memory budget; a test that could never fit gets
/// iperf3's error for the number too large, one that does not fit now `ACCESS_DENIED`.
fn reserve<'s>(
    ctrl: &mut TcpStream,
    params: &TestParams,
    sh: &'s Shared,
) -> Result<Reserved<'s>, BenchError> {
    let need = need_of(params, sh);
    match sh.admit(&need) {
        Ok(r) => Ok(r),
        Err(Admit::NeverFits {
            fewer_streams_would,
        }) => {
            let code = if fewer_streams_would {
                wire::IE_NUM_STREAMS
            } else {
                wire::IE_BLOCK_SIZE
            };
            wire::write_server_error(ctrl, code, 0);
            Err(BenchError::Rejected(format!(
                "{} streams of -l {} need at least {} MiB, over --max-memory ({} MiB)",
                params.connections(),
                params.len,
                need.minimum() >> 20,
                sh.opts.max_memory >> 20
            )))
        }
        Err(_) => {
            let _ = wire::write_state(ctrl, State::AccessDenied);
            Err(BenchError::Rejected(format!(
                "busy: {} streams of -l {} need {} MiB; the tests running hold more of --max-memory ({} MiB) than leaves",
                params.connections(),
                params.len,
                need.minimum() >> 20,
                sh.opts.max_memory >> 20
            )))
        }
    }
}

/// `CREATE_STREAMS`, then the test's TCP data connections, each with its role: forward =
/// this server receives; -R = it sends; --bidir = the client's sending connections
/// (first) are received here, the rest sent.
fn tcp_streams(
    ctrl: &mut TcpStream,
    cookie: Cookie,
    params: &TestParams,
    sh: &Shared,
) -> Result<Vec<StreamSpec>, BenchError> {
    let arrivals = expect_streams(cookie, sh);
    if let Err(e) = wire::write_state(ctrl, State::CreateStreams) {
        sh.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&cookie);
        return Err(perr(e));
    }
    let conns = match collect_streams(cookie, arrivals, params.connections(), sh) {
        Ok(c) => c,
        Err(e) => {
            wire::write_server_error(ctrl, wire::IE_STREAM_CONNECT, 0);
            return Err(e);
        }
    };
    let p = params.parallel as usize;
    Ok(conns
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
        .collect())
}

/// A TCP test after its parameters: its streams connected, the start message, then run
/// until the client ends it ([`finish`]).
fn tcp_test(
    mut ctrl: TcpStream,
    cookie: Cookie,
    params: TestParams,
    peer: std::net::SocketAddr,
    reserved: Reserved<'_>,
    sh: &Shared,
) -> Result<(), BenchError> {
    let opts = &sh.opts.common;
    let specs = tcp_streams(&mut ctrl, cookie, &params, sh)?;
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
        ring: reserved.ring,
    };
    let zstart = serde_json::json!({
        "tx_path": if data.file.is_some() { "file" } else { opts.tx.name() },
        "rx_path": opts.rx_name(),
    });
    let refs: Vec<Conn<'_>> = specs.iter().map(|s| Conn::tcp(&s.stream)).collect();
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
    let running = match streams::start(specs, &data, &ctl, t0) {
        Ok(r) => r,
        Err(e) => {
            wire::write_server_error(&mut ctrl, wire::IE_CREATE_STREAM, libc::EAGAIN);
            return Err(e);
        }
    };
    let tx_name = if data.file.is_some() {
        "file".to_string()
    } else {
        opts.tx.name().to_string()
    };
    finish(
        Run {
            ctrl,
            params,
            peer,
            start_json,
            running,
            ctl,
            t0,
            sys0,
            tx_name,
        },
        sh,
    )
}

/// A UDP test (`-u`) after its parameters: its streams connected as iperf3 connects them
/// ([`super::udp::accept`]; one test at a time in this step, since nothing in a connect
/// datagram says which test it is for), then run like a TCP test.
fn udp_test(
    mut ctrl: TcpStream,
    cookie: Cookie,
    params: TestParams,
    peer: std::net::SocketAddr,
    _reserved: Reserved<'_>,
    sh: &Shared,
) -> Result<(), BenchError> {
    let opts = &sh.opts.common;
    let sockets = {
        // Another UDP test still connecting its streams (a client that never sends its
        // connect datagrams holds this for UDP_CONNECT_WAIT at most): busy after a while,
        // as iperf3's server is busy.
        let waited = Instant::now();
        let _one_at_a_time = loop {
            match sh.udp_setup.try_lock() {
                Ok(g) => break g,
                Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) if waited.elapsed() < UDP_SETUP_WAIT => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(std::sync::TryLockError::WouldBlock) => {
                    let _ = wire::write_state(&mut ctrl, State::AccessDenied);
                    return Err(BenchError::Rejected(
                        "busy: another UDP test is connecting its streams".into(),
                    ));
                }
            }
        };
        let connected = ctrl
            .local_addr()
            .map_err(|e| BenchError::io("getsockname (control)", e))
            .and_then(|addr| {
                let listener = udp::bind_reuse(addr)?;
                wire::write_state(&mut ctrl, State::CreateStreams).map_err(perr)?;
                udp::accept(
                    listener,
                    addr,
                    params.parallel,
                    Instant::now() + UDP_CONNECT_WAIT,
                )
            });
        match connected {
            Ok(s) => s,
            Err(e) => {
                wire::write_server_error(&mut ctrl, wire::IE_STREAM_CONNECT, 0);
                return Err(e);
            }
        }
    };
    let sender = params.direction == Direction::Reverse;
    let specs: Vec<udp::UdpSpec> = sockets
        .into_iter()
        .enumerate()
        .map(|(i, socket)| udp::UdpSpec {
            id: stream_id(i),
            sender,
            socket,
        })
        .collect();
    let refs: Vec<Conn<'_>> = specs.iter().map(|s| Conn::udp(&s.socket)).collect();
    let (start_json, start_text) = super::start::start(
        Role::Server {
            host: peer.ip().to_string(),
            port: peer.port(),
        },
        &cookie,
        &params,
        &ctrl,
        &refs,
        serde_json::json!({"tx_path": "gso", "rx_path": "gro"}),
        opts.format,
    );
    match opts.format {
        Format::Text => sh.out.write(&start_text),
        Format::JsonStream => sh.out.write(
            &(output::event("start", &start_json)
                + "
"),
        ),
        Format::Json => {}
    }
    let ctl = Arc::new(Control::default());
    let sys0 = zcnet_bench::cpu::SystemCpu::now();
    wire::write_state(&mut ctrl, State::TestStart).map_err(perr)?;
    let t0 = Instant::now();
    let cfg = udp::UdpCfg {
        len: params.len,
        rate: params.bandwidth,
        wide: params.udp_counters_64bit,
        quota: None,
    };
    let running = match udp::start(specs, cfg, &ctl, t0) {
        Ok(r) => r,
        Err(e) => {
            wire::write_server_error(&mut ctrl, wire::IE_CREATE_STREAM, libc::EAGAIN);
            return Err(e);
        }
    };
    finish(
        Run {
            ctrl,
            params,
            peer,
            start_json,
            running,
            ctl,
            t0,
            sys0,
            tx_name: "gso".into(),
        },
        sh,
    )
}

/// How long a UDP test's client has to send all its connect datagrams.
const UDP_CONNECT_WAIT: Duration = Duration::from_secs(10);
/// How long a UDP test waits for another one to finish connecting before it is busy.
const UDP_SETUP_WAIT: Duration = Duration::from_secs(5);

/// A test whose streams are running.
struct Run {
    ctrl: TcpStream,
    params: TestParams,
    peer: std::net::SocketAddr,
    start_json: serde_json::Value,
    running: Vec<streams::Running>,
    ctl: Arc<Control>,
    t0: Instant,
    sys0: Option<zcnet_bench::cpu::SystemCpu>,
    tx_name: String,
}

/// From `TEST_RUNNING` to `IPERF_DONE`: the client's `TEST_END`, the results exchange,
/// this side's report.
fn finish(run: Run, sh: &Shared) -> Result<(), BenchError> {
    let opts = &sh.opts.common;
    let Run {
        mut ctrl,
        params,
        peer,
        start_json,
        mut running,
        ctl,
        t0,
        sys0,
        tx_name,
    } = run;
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
    let peer_results = match result.and_then(|()| exchange(&mut ctrl, &running, params.udp)) {
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
    let mut local = measured.zcnet("server", opts.tx, opts.rx);
    local["tx_path"] = serde_json::json!(tx_name);
    local["rx_path"] = serde_json::json!(if params.udp { "gro" } else { opts.rx_name() });
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
    for o in measured
        .outs
        .iter()
        .filter(|o| !o.sender && o.udp.is_none())
    {
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
fn exchange(
    ctrl: &mut TcpStream,
    receivers: &[streams::Running],
    udp: bool,
) -> Result<Results, BenchError> {
    ctrl.set_read_timeout(Some(CONTROL_TIMEOUT))
        .map_err(|e| BenchError::io("SO_RCVTIMEO (control)", e))?;
    wire::write_state(ctrl, State::ExchangeResults).map_err(perr)?;
    let peer = wire::read_json(ctrl)
        .and_then(|v| Results::from_json(&v))
        .map_err(perr)?;
    for r in receivers {
        if let Some(s) = peer.stream(r.id) {
            // UDP: the receiver stops at the sender's last packet number.
            r.live
                .target
                .store(if udp { s.packets } else { s.bytes }, Ordering::Relaxed);
        }
    }
    Ok(peer)
}
