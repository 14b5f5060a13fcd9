//! `zcnet bench -c HOST`: drives a test against an iperf3 server (`iperf3 -s`, or
//! `zcnet bench -s`) with iperf3's protocol, moving the data through zcnet's paths.

use super::opts::{ClientOpts, Format, Out, CONTROL_TIMEOUT};
use super::report::{self, Measured, Probe, Reporter};
use super::streams::{self, Control, DataCfg, StreamSpec};
use super::wire;
use crate::bench::spec::BenchError;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcnet_bench::iperf3::output::{self, Role};
use zcnet_bench::iperf3::results::stream_id;
use zcnet_bench::iperf3::{Direction, Iperf3Error, Results, State};
use zcnet_bench::report::SystemCpuTimes;

fn perr(e: Iperf3Error) -> BenchError {
    BenchError::Failed(e.to_string())
}

/// Reads the next state; the server's refusals become errors that say what it said.
fn expect(ctrl: &mut TcpStream, want: State, during: &'static str) -> Result<(), BenchError> {
    match wire::read_state(ctrl).map_err(perr)? {
        s if s == want => Ok(()),
        State::AccessDenied => Err(BenchError::Rejected(
            "the server is busy running a test (ACCESS_DENIED)".into(),
        )),
        State::ServerError => Err(perr(wire::read_server_error(ctrl))),
        State::ServerTerminate => Err(BenchError::Failed("the server terminated the test".into())),
        s => Err(perr(Iperf3Error::Unexpected {
            got: format!("{s:?}"),
            during,
        })),
    }
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr, BenchError> {
    (host, port)
        .to_socket_addrs()
        .map_err(|e| BenchError::io_owned(format!("resolving {host}"), e))?
        .next()
        .ok_or_else(|| BenchError::Usage(format!("{host}: no address")))
}

/// Runs one test; the report goes to stdout or `--logfile`.
pub(crate) fn run(opts: &ClientOpts) -> Result<(), BenchError> {
    let out = Arc::new(
        Out::open(opts.common.logfile.as_deref())
            .map_err(|e| BenchError::io("opening --logfile", e))?,
    );
    let result = run_inner(opts, &out);
    if let Err(e) = &result {
        // iperf3 -J puts a failure into the document as `error`.
        match opts.common.format {
            Format::Json => out.write(
                &(serde_json::to_string_pretty(&output::document(
                    serde_json::json!({}),
                    vec![],
                    serde_json::json!({}),
                    Some(&e.to_string()),
                ))
                .unwrap_or_default()
                    + "\n"),
            ),
            Format::JsonStream => {
                out.write(&(output::event("error", &serde_json::json!(e.to_string())) + "\n"))
            }
            Format::Text => {}
        }
    }
    result
}

fn run_inner(opts: &ClientOpts, out: &Arc<Out>) -> Result<(), BenchError> {
    let c = &opts.common;
    let mut params = opts.params.clone();
    let addr = resolve(&opts.host, opts.port)?;
    let mut ctrl = TcpStream::connect_timeout(&addr, CONTROL_TIMEOUT)
        .map_err(|e| BenchError::io_owned(format!("connecting to {addr}"), e))?;
    ctrl.set_nodelay(true)
        .map_err(|e| BenchError::io("TCP_NODELAY (control)", e))?;
    ctrl.set_read_timeout(Some(CONTROL_TIMEOUT))
        .map_err(|e| BenchError::io("SO_RCVTIMEO (control)", e))?;
    if opts.udp_len_from_mss {
        // iperf3's client: a UDP block of the control connection's MSS unless -l says.
        if let Ok(t) = zcnet_sys::raw::socket::tcp_info(ctrl.as_fd()) {
            let mss = u64::from(t.snd_mss);
            if mss > 0 {
                params.len = mss.min(zcnet_bench::iperf3::udp::MAX_UDP_BLOCKSIZE);
            }
        }
    }
    let params = &params;
    let cookie = wire::new_cookie().map_err(|e| BenchError::io("/dev/urandom", e))?;
    wire::write_cookie(&mut ctrl, &cookie).map_err(perr)?;
    expect(
        &mut ctrl,
        State::ParamExchange,
        "waiting for PARAM_EXCHANGE",
    )?;
    wire::write_json(&mut ctrl, &params.to_json()).map_err(perr)?;
    expect(
        &mut ctrl,
        State::CreateStreams,
        "waiting for CREATE_STREAMS",
    )?;
    // The client's view: forward = it sends; -R = it receives; --bidir = its sending
    // connections first, then its receiving ones (iperf3's iperf_create_streams order).
    let p = params.parallel as usize;
    let mut specs = Vec::new();
    let mut udp_specs = Vec::new();
    if params.udp {
        // iperf3's UDP "connect": one datagram and its reply per stream, in order.
        for i in 0..p {
            udp_specs.push(super::udp::UdpSpec {
                id: stream_id(i),
                sender: params.direction == Direction::Forward,
                socket: super::udp::connect(addr, params.len)?,
            });
        }
    }
    for i in 0..if params.udp {
        0
    } else {
        params.connections() as usize
    } {
        let mut s = TcpStream::connect_timeout(&addr, CONTROL_TIMEOUT)
            .map_err(|e| BenchError::io_owned(format!("connecting a data stream to {addr}"), e))?;
        wire::write_cookie(&mut s, &cookie).map_err(perr)?;
        let (sender, main) = match params.direction {
            Direction::Forward => (true, true),
            Direction::Reverse => (false, true),
            Direction::Bidir => (i < p, i < p),
        };
        specs.push(StreamSpec {
            id: stream_id(i),
            sender,
            main,
            stream: s,
        });
    }
    expect(&mut ctrl, State::TestStart, "waiting for TEST_START")?;
    expect(&mut ctrl, State::TestRunning, "waiting for TEST_RUNNING")?;
    let data = DataCfg {
        tx: c.tx,
        rx: c.rx,
        len: params.len as usize,
        nodelay: params.nodelay,
        file: if c.file && params.direction.client_sends() {
            Some(crate::bench::files::source(params.len)?)
        } else {
            None
        },
        rx_file: c.rx_file,
        drain_before_end: true,
        ring: zcnet_bench::iperf3::budget::desired_ring(params.len),
    };
    let (tx_name, rx_name) = if params.udp {
        ("gso", "gro")
    } else if data.file.is_some() {
        ("file", c.rx_name())
    } else {
        (c.tx.name(), c.rx_name())
    };
    let refs: Vec<super::start::Conn<'_>> = specs
        .iter()
        .map(|s| super::start::Conn::tcp(&s.stream))
        .chain(udp_specs.iter().map(|s| super::start::Conn::udp(&s.socket)))
        .collect();
    let (start_json, start_text) = super::start::start(
        Role::Client {
            host: opts.host.clone(),
            port: opts.port,
        },
        &cookie,
        params,
        &ctrl,
        &refs,
        serde_json::json!({"tx_path": tx_name, "rx_path": rx_name}),
        c.format,
    );
    match c.format {
        Format::Text => out.write(&start_text),
        Format::JsonStream => out.write(&(output::event("start", &start_json) + "\n")),
        Format::Json => {}
    }
    let ctl = Arc::new(Control {
        quota: (params.bytes > 0 && params.direction.client_sends()).then_some(params.bytes),
        ..Control::default()
    });
    let sys0 = zcnet_bench::cpu::SystemCpu::now();
    let t0 = Instant::now();
    let started = if params.udp {
        let cfg = super::udp::UdpCfg {
            len: params.len,
            rate: params.bandwidth,
            wide: params.udp_counters_64bit,
            quota: ctl.quota,
        };
        super::udp::start(udp_specs, cfg, &ctl, t0)
    } else {
        streams::start(specs, &data, &ctl, t0)
    };
    let mut running = match started {
        Ok(r) => r,
        Err(e) => {
            let _ = wire::write_state(&mut ctrl, State::ClientTerminate);
            return Err(e);
        }
    };
    let reporter = Reporter::spawn(
        t0,
        running.iter().map(Probe::of).collect(),
        c.interval,
        params.direction != Direction::Reverse,
        c.format,
        out.clone(),
    );
    let ran = run_until_done(&mut ctrl, opts, &running, t0);
    ctl.stop.store(true, Ordering::Relaxed);
    let sent = streams::join_senders(&mut running);
    let intervals = reporter.finish();
    if let Err(e) = ran {
        ctl.abort.store(true, Ordering::Relaxed);
        let _ = streams::join_receivers(running, &ctl);
        return Err(e);
    }
    let sent = match sent {
        Ok(s) => s,
        Err(e) => {
            let _ = wire::write_state(&mut ctrl, State::ClientTerminate);
            ctl.abort.store(true, Ordering::Relaxed);
            let _ = streams::join_receivers(running, &ctl);
            return Err(e);
        }
    };
    wire::write_state(&mut ctrl, State::TestEnd).map_err(perr)?;
    expect(
        &mut ctrl,
        State::ExchangeResults,
        "waiting for EXCHANGE_RESULTS",
    )?;
    // The server stopped sending and closed its sending connections at TEST_END: the
    // receiving streams read to end of stream, so every byte it sent is counted here.
    let mut all = sent;
    let received = streams::join_receivers(running, &ctl)?;
    for o in received.iter().filter(|o| !o.eof) {
        eprintln!(
            "zcnet bench -c: stream {}: the server did not close it within {:?} of TEST_END; {} bytes counted",
            o.id,
            super::opts::DRAIN_TIMEOUT,
            o.bytes
        );
    }
    all.extend(received);
    all.sort_by_key(|o| o.id);
    let measured = Measured {
        wall: all.iter().map(|o| o.seconds).fold(0.0, f64::max),
        outs: all,
        machine: SystemCpuTimes::since(sys0),
    };
    let mut local = measured.zcnet("client", c.tx, c.rx);
    local["tx_path"] = serde_json::json!(tx_name);
    local["rx_path"] = serde_json::json!(rx_name);
    wire::write_json(&mut ctrl, &measured.results(local.clone()).to_json()).map_err(perr)?;
    let peer = wire::read_json(&mut ctrl)
        .and_then(|v| Results::from_json(&v))
        .map_err(perr)?;
    expect(
        &mut ctrl,
        State::DisplayResults,
        "waiting for DISPLAY_RESULTS",
    )?;
    wire::write_state(&mut ctrl, State::IperfDone).map_err(perr)?;
    let end = report::end(&measured, &peer, local);
    match c.format {
        Format::Json => {
            let mut doc = output::document(start_json, intervals, end, None);
            if let Some(s) = &peer.server_output_json {
                doc["server_output_json"] = s.clone();
            }
            out.write(&(serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n"));
        }
        Format::JsonStream => out.write(&(output::event("end", &end) + "\n")),
        Format::Text => out.write(&(report::end_text(&end) + "\niperf Done.\n")),
    }
    Ok(())
}

/// Runs until the test's end condition — `-t` elapsed, or `-n` bytes sent (all sending
/// streams done) or received — watching the control connection for the server's refusals.
fn run_until_done(
    ctrl: &mut TcpStream,
    opts: &ClientOpts,
    running: &[streams::Running],
    t0: Instant,
) -> Result<(), BenchError> {
    let p = &opts.params;
    loop {
        let readable = zcnet_sys::raw::socket::poll(
            ctrl.as_fd(),
            zcnet_sys::raw::socket::PollFlags::IN,
            Some(Duration::from_millis(10)),
        )
        .map(|ev| !ev.is_empty())
        .unwrap_or(false);
        if readable {
            // Anything now is the server stopping the test.
            return Err(match wire::read_state(ctrl) {
                Ok(State::ServerError) => perr(wire::read_server_error(ctrl)),
                Ok(State::ServerTerminate) => {
                    BenchError::Failed("the server terminated the test".into())
                }
                Ok(s) => perr(Iperf3Error::Unexpected {
                    got: format!("{s:?}"),
                    during: "the test ran",
                }),
                Err(e) => perr(e),
            });
        }
        if p.bytes > 0 {
            let senders: Vec<_> = running.iter().filter(|r| r.sender).collect();
            let sent_all = !senders.is_empty() && senders.iter().all(|r| r.is_finished());
            let received: u64 = running
                .iter()
                .filter(|r| !r.sender)
                .map(|r| r.live.bytes.load(Ordering::Relaxed))
                .sum();
            if sent_all || received >= p.bytes {
                return Ok(());
            }
        } else if t0.elapsed() >= Duration::from_secs(u64::from(p.time)) {
            return Ok(());
        }
        if running.iter().any(|r| r.sender && r.is_finished()) && p.bytes == 0 {
            // A sender ended before its time: it failed; its error comes from the join.
            return Ok(());
        }
    }
}
