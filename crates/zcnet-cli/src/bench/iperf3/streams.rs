//! The data connections of one iperf3 test, each on its own thread, through zcnet's
//! `Sender` (on this end's `--tx` path) or `Receiver` (`--rx`). Each thread counts its
//! bytes live (for interval reports) and measures its own CPU (`getrusage(RUSAGE_THREAD)`)
//! around the transfer.
//!
//! Ends: a sending stream stops when the test's [`Control::stop`] is set (the client's
//! timer or `-n` quota, or the client's `TEST_END` on the server), then waits until the
//! peer's TCP has acknowledged everything (`SIOCOUTQ` = 0, bounded) and sends FIN, so a
//! receiver that reads to the end counts every byte. A receiving stream stops at end of
//! stream, or when it has the bytes the sender reported in the results exchange
//! ([`Live::target`]), or when the test gives up waiting ([`Control::abort`]).

use super::opts::DRAIN_TIMEOUT;
use crate::bench::files::{self, Cursor, SinkFile, SourceFile};
use crate::bench::spec::BenchError;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use zcnet::{ReceiverConfig, RxPath, Sender, SenderConfig, TxPath};
use zcnet_bench::cpu::CpuSeconds;
use zcnet_bench::iperf3::output::TcpFigures;
use zcnet_bench::report::SideStats;

/// How long one blocking receive waits before the thread looks at [`Control`] again.
const RECV_SLICE: Duration = Duration::from_millis(100);

/// How long one blocking send (or wait for a buffer) lasts before the thread looks at
/// [`Control`] again. A peer may stop reading at any time once it has decided the test is
/// over (iperf3's client stops reading its `--bidir` receiving streams at `TEST_END`), so a
/// sender must never sit in one send until the peer reads again.
const SEND_SLICE: Duration = Duration::from_millis(200);

/// A sender that has moved nothing for this long while the test runs fails.
const STALL_LIMIT: Duration = Duration::from_secs(20);

/// The test's shared switches.
#[derive(Debug, Default)]
pub(crate) struct Control {
    /// Senders stop.
    pub stop: AtomicBool,
    /// Receivers stop now, whatever they have.
    pub abort: AtomicBool,
    /// `-n` on the client: bytes over all of this side's sending streams.
    pub quota: Option<u64>,
    /// Bytes of the quota taken so far.
    pub reserved: AtomicU64,
}

/// One stream's live counters.
#[derive(Debug)]
pub(crate) struct Live {
    /// Bytes moved so far.
    pub bytes: AtomicU64,
    /// A receiving stream stops once it has this many bytes (`u64::MAX`: not known yet;
    /// UDP: this packet number).
    pub target: AtomicU64,
    /// A UDP stream: its live datagram counts, for interval reports.
    pub udp: Option<LiveUdp>,
}

/// A UDP stream's counts as they grow.
#[derive(Debug, Default)]
pub(crate) struct LiveUdp {
    /// Datagrams sent, or the highest packet number received.
    pub packets: AtomicU64,
    /// Datagrams lost so far (receiving).
    pub lost: AtomicU64,
    /// Smoothed jitter, seconds, as `f64` bits (receiving).
    pub jitter_bits: AtomicU64,
}

impl Default for Live {
    fn default() -> Self {
        Live {
            bytes: AtomicU64::new(0),
            target: AtomicU64::new(u64::MAX),
            udp: None,
        }
    }
}

/// How this end moves data.
#[derive(Debug, Clone)]
pub(crate) struct DataCfg {
    pub tx: TxPath,
    pub rx: RxPath,
    /// `-l`.
    pub len: usize,
    /// `-N`.
    pub nodelay: bool,
    /// `--tx file` / `-Z`: send from this page-cache file with `Sender::send_file`
    /// (`--cold`, `--file-dir`: the bench's [`crate::bench::files`]).
    pub file: Option<Arc<SourceFile>>,
    /// `--rx file`: receiving streams splice what arrives into a file with
    /// `Receiver::recv_to_file` (`rx` is then unused).
    pub rx_file: bool,
    /// After the last send, wait (bounded) until the peer's TCP has acknowledged every
    /// byte before reporting the stream done: the client does, so that a receiver that
    /// stops reading at `TEST_END` — iperf3's server closes its streams then — has them.
    pub drain_before_end: bool,
    /// Blocks each sending stream rotates through: the server's share of its memory
    /// budget (`budget::desired_ring` when it fits), the client's desired ring.
    pub ring: u32,
}

/// One data connection before its thread starts.
pub(crate) struct StreamSpec {
    /// iperf3's stream id (1, 3, 4, …).
    pub id: u32,
    /// Whether this end sends on it.
    pub sender: bool,
    /// Whether it carries the test's main direction.
    pub main: bool,
    pub stream: TcpStream,
}

/// What a stream's thread measured.
#[derive(Debug, Clone, Default)]
pub(crate) struct StreamOut {
    pub id: u32,
    pub socket: i32,
    pub sender: bool,
    pub main: bool,
    pub bytes: u64,
    /// From the test's start to this stream's last byte.
    pub seconds: f64,
    pub cpu: CpuSeconds,
    pub stats: SideStats,
    /// Bytes `send_file` / `recv_to_file` moved.
    pub file_bytes: u64,
    /// On a sending stream: `tcpi_total_retrans`.
    pub retransmits: Option<i64>,
    pub congestion: Option<String>,
    /// The path in effect (what `auto` resolved to, where it did).
    pub path: String,
    /// A receiving stream saw end of stream.
    pub eof: bool,
    /// A UDP stream's datagram counts ([`super::udp`]).
    pub udp: Option<UdpOut>,
}

/// What a UDP stream's thread counted.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct UdpOut {
    /// Sending: datagrams sent. Receiving: the highest packet number seen (iperf3's
    /// `packet_count` either way).
    pub packets: u64,
    /// Receiving: datagrams lost (gaps, less late arrivals).
    pub lost: u64,
    /// Receiving: datagrams out of order.
    pub out_of_order: u64,
    /// Receiving: smoothed jitter, seconds.
    pub jitter: f64,
    /// Datagrams moved.
    pub datagrams: u64,
    /// `sendmsg`/`send` or `recvmsg` calls made.
    pub calls: u64,
    /// Sending: GSO was in use to the end.
    pub gso: bool,
    /// Receiving: GRO was on.
    pub gro: bool,
}

/// A stream running on its thread.
pub(crate) struct Running {
    pub id: u32,
    pub socket: i32,
    pub sender: bool,
    pub main: bool,
    pub live: Arc<Live>,
    /// A second descriptor of the socket, for `TCP_INFO` while the thread owns the first.
    pub probe: Option<TcpStream>,
    handle: JoinHandle<Result<StreamOut, BenchError>>,
}

impl Running {
    /// Runs `work` on a thread of its own as stream `id`.
    pub(crate) fn spawn(
        id: u32,
        socket: i32,
        sender: bool,
        main: bool,
        probe: Option<TcpStream>,
        live: Arc<Live>,
        work: impl FnOnce() -> Result<StreamOut, BenchError> + Send + 'static,
    ) -> std::io::Result<Running> {
        let handle = std::thread::Builder::new()
            .name(format!("iperf3-{id}"))
            .spawn(work)?;
        Ok(Running {
            id,
            socket,
            sender,
            main,
            live,
            probe,
            handle,
        })
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    pub(crate) fn join(self) -> Result<StreamOut, BenchError> {
        self.handle
            .join()
            .unwrap_or_else(|_| Err(BenchError::Failed("a data thread panicked".into())))
    }
}

/// Starts every stream's thread; `t0` is the test's start.
pub(crate) fn start(
    specs: Vec<StreamSpec>,
    cfg: &DataCfg,
    ctl: &Arc<Control>,
    t0: Instant,
) -> Result<Vec<Running>, BenchError> {
    let mut running = Vec::with_capacity(specs.len());
    for s in specs {
        let live = Arc::new(Live::default());
        let (l, c, d) = (live.clone(), ctl.clone(), cfg.clone());
        let (id, sender, main) = (s.id, s.sender, s.main);
        let socket = s.stream.as_raw_fd();
        let probe = s.stream.try_clone().ok();
        let spawned = Running::spawn(id, socket, sender, main, probe, live, move || {
            if sender {
                send_loop(s, &d, &l, &c, t0)
            } else if d.rx_file {
                recv_file_loop(s, &d, &l, &c, t0)
            } else {
                recv_loop(s, &d, &l, &c, t0)
            }
        });
        match spawned {
            Ok(r) => running.push(r),
            Err(e) => {
                // No thread for this stream: the test fails, the streams started stop,
                // and the process goes on (the stream's connection closed with it).
                ctl.stop.store(true, Ordering::Relaxed);
                ctl.abort.store(true, Ordering::Relaxed);
                for r in running {
                    let _ = r.join();
                }
                return Err(BenchError::io("starting a data stream's thread", e));
            }
        }
    }
    Ok(running)
}

/// `TCP_INFO` of a sending stream: retransmits and iperf3's interval figures.
pub(crate) fn tcp_figures(fd: std::os::fd::BorrowedFd<'_>) -> Option<(i64, TcpFigures)> {
    let ti = zcnet_sys::raw::socket::tcp_info(fd).ok()?;
    Some((
        i64::from(ti.total_retrans),
        TcpFigures {
            snd_cwnd: u64::from(ti.snd_cwnd) * u64::from(ti.snd_mss),
            rtt: u64::from(ti.rtt),
            rttvar: u64::from(ti.rttvar),
            pmtu: u64::from(ti.pmtu),
        },
    ))
}

fn zerr(context: &'static str) -> impl Fn(zcnet::Error) -> BenchError {
    move |source| BenchError::Zcnet { context, source }
}

fn thread_cpu() -> Result<zcnet_sys::raw::cpu::Rusage, BenchError> {
    zcnet_sys::raw::cpu::thread().map_err(|e| BenchError::io("getrusage(RUSAGE_THREAD)", e))
}

impl StreamOut {
    /// What every stream reports alike once its loop is over: which stream it is, its
    /// thread's CPU from `c0` to now (so the caller's last call on the socket counts) and
    /// the path's counters in `snap`. The caller sets what its loop measured; the rest
    /// (no retransmits, no end of stream) is the default.
    fn ended(
        id: u32,
        socket: i32,
        main: bool,
        sender: bool,
        c0: zcnet_sys::raw::cpu::Rusage,
        snap: &zcnet::StatsSnapshot,
    ) -> Result<StreamOut, BenchError> {
        Ok(StreamOut {
            id,
            socket,
            sender,
            main,
            cpu: CpuSeconds::between(c0, thread_cpu()?),
            stats: SideStats::from(snap),
            file_bytes: snap.tx_bytes_file + snap.rx_bytes_file,
            ..StreamOut::default()
        })
    }
}

fn send_loop(
    spec: StreamSpec,
    cfg: &DataCfg,
    live: &Live,
    ctl: &Control,
    t0: Instant,
) -> Result<StreamOut, BenchError> {
    let socket = spec.stream.as_raw_fd();
    let len = cfg.len;
    // Enough buffers in rotation to cover sndbuf + window (16 MiB, Solaris §3.2.4's rule),
    // so a loaning path never waits for its own completions.
    let ring = cfg.ring.max(1);
    let scfg = SenderConfig::new(cfg.tx)
        .buf_bytes(len)
        .pool_buffers(if cfg.tx.name() == "cow" {
            1
        } else {
            ring as usize
        })
        .nodelay(cfg.nodelay)
        .touch(false)
        .timeout(SEND_SLICE);
    let scfg = crate::library_opts::sender(scfg);
    let mut tx = Sender::from_stream(spec.stream, &scfg).map_err(zerr("data connection"))?;
    // The cow path keeps copy semantics for the caller's own memory: send from a ring of
    // the application's, as the bench does.
    let app = (cfg.tx.name() == "cow")
        .then(|| zcnet::Pool::new(1, len))
        .transpose()
        .map_err(|e| BenchError::io("mmap (application buffer)", e))?;
    let app_buf = match &app {
        Some(p) => {
            let mut b = p
                .try_take()
                .ok_or_else(|| BenchError::Failed("empty application pool".into()))?;
            b.set_len(len);
            Some(b)
        }
        None => None,
    };
    let c0 = thread_cpu()?;
    let mut cursor = Cursor::default();
    let mut sent = 0u64;
    let mut moved_at = Instant::now();
    loop {
        if ctl.stop.load(Ordering::Relaxed) {
            break;
        }
        let n = match ctl.quota {
            Some(q) => {
                let prev = ctl.reserved.fetch_add(len as u64, Ordering::Relaxed);
                if prev >= q {
                    break;
                }
                (q - prev).min(len as u64) as usize
            }
            None => len,
        };
        let r = if let Some(f) = &cfg.file {
            let at = cursor.next(f, n as u64)?;
            tx.send_file(&f.file, at, n as u64).map(|_| ())
        } else if let Some(b) = &app_buf {
            tx.send_slice(&b[..n])
        } else {
            tx.buffer().and_then(|mut b| {
                b.set_len(n);
                tx.send(b)
            })
        };
        // A send that ran out of its slice still queued part of its bytes: they count.
        let done = match r {
            Ok(()) => n as u64,
            Err(e @ (zcnet::Error::Timeout { .. } | zcnet::Error::PoolExhausted(_))) => {
                let q = e.queued().unwrap_or(0);
                if q == 0 && moved_at.elapsed() > STALL_LIMIT {
                    return Err(zerr("send (the peer stopped reading)")(e));
                }
                q
            }
            Err(e) => return Err(zerr("send")(e)),
        };
        if let (Some(_), true) = (ctl.quota, done < n as u64) {
            // Give back the part of the quota this call did not move.
            ctl.reserved.fetch_sub(n as u64 - done, Ordering::Relaxed);
        }
        if done > 0 {
            moved_at = Instant::now();
        }
        sent += done;
        live.bytes.store(sent, Ordering::Relaxed);
    }
    let seconds = t0.elapsed().as_secs_f64();
    if cfg.drain_before_end {
        // Everything acknowledged by the peer's TCP before TEST_END: a receiver that stops
        // reading then (iperf3's server does) has it queued by then.
        let deadline = Instant::now() + Duration::from_secs(2);
        while zcnet_sys::raw::socket::outq(tx.socket()).unwrap_or(0) > 0
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let tcp = tcp_figures(tx.socket());
    let congestion = rustix::net::sockopt::tcp_congestion(tx.socket()).ok();
    let path = tx.path().name().to_string();
    // FIN, and the loans back where the kernel returns them in time; a peer that stopped
    // reading keeps some, which is its business once the test is over.
    let snap = tx.stats().snapshot();
    let _ = tx.finish();
    Ok(StreamOut {
        bytes: sent,
        seconds,
        retransmits: tcp.map(|t| t.0),
        congestion,
        path,
        ..StreamOut::ended(spec.id, socket, spec.main, true, c0, &snap)?
    })
}

fn recv_loop(
    spec: StreamSpec,
    cfg: &DataCfg,
    live: &Live,
    ctl: &Control,
    t0: Instant,
) -> Result<StreamOut, BenchError> {
    let socket = spec.stream.as_raw_fd();
    let mut rcfg = ReceiverConfig::new(cfg.rx).timeout(RECV_SLICE);
    rcfg.op_size = cfg.len;
    rcfg.touch = false;
    let rcfg = crate::library_opts::receiver(rcfg);
    let mut rx =
        zcnet::Receiver::from_stream(spec.stream, &rcfg).map_err(zerr("data connection"))?;
    let congestion = rustix::net::sockopt::tcp_congestion(rx.socket()).ok();
    let c0 = thread_cpu()?;
    let mut got = 0u64;
    let mut eof = false;
    let mut last = t0;
    loop {
        match rx.recv() {
            Ok(None) => {
                eof = true;
                break;
            }
            Ok(Some(chunk)) => {
                got += chunk.len() as u64;
                last = Instant::now();
                live.bytes.store(got, Ordering::Relaxed);
            }
            Err(zcnet::Error::Timeout { .. } | zcnet::Error::WouldBlock { .. }) => {}
            Err(e) => return Err(zerr("recv")(e)),
        }
        if got >= live.target.load(Ordering::Relaxed) || ctl.abort.load(Ordering::Relaxed) {
            break;
        }
    }
    let path = rx.path().name().to_string();
    let snap = rx.stats().snapshot();
    Ok(StreamOut {
        bytes: got,
        seconds: last.duration_since(t0).as_secs_f64(),
        congestion,
        path,
        eof,
        ..StreamOut::ended(spec.id, socket, spec.main, false, c0, &snap)?
    })
}

/// `--rx file`: splices what arrives into a file (`Receiver::recv_to_file`: socket → pipe
/// → page cache), the file a window reused as a ring like the plain bench's.
///
/// `recv_to_file` moves exactly the bytes it is asked for, and a call that times out part
/// way has written bytes it cannot report. An iperf3 peer stops wherever its timer falls,
/// not on a `-l` boundary, and may keep the connection open after its last byte; so each
/// call asks for what the socket already holds (`FIONREAD`, at most `-l`, at most what the
/// peer said it sent) and waits for more with `poll(2)`, never inside the splice. Readable
/// with nothing queued is end of stream (or an error), which the call then reports.
fn recv_file_loop(
    spec: StreamSpec,
    cfg: &DataCfg,
    live: &Live,
    ctl: &Control,
    t0: Instant,
) -> Result<StreamOut, BenchError> {
    use zcnet_sys::raw::socket::{poll, PollFlags};
    let socket = spec.stream.as_raw_fd();
    let rcfg = ReceiverConfig::new(RxPath::Copy).timeout(RECV_SLICE);
    let mut rx =
        zcnet::Receiver::from_stream(spec.stream, &rcfg).map_err(zerr("data connection"))?;
    let congestion = rustix::net::sockopt::tcp_congestion(rx.socket()).ok();
    let len = cfg.len.max(1) as u64;
    let mut sink = SinkFile::create(len)?;
    let queued = |rx: &zcnet::Receiver| {
        rustix::io::ioctl_fionread(rx.socket())
            .map_err(|e| BenchError::io("ioctl(FIONREAD)", e.into()))
    };
    let c0 = thread_cpu()?;
    let mut got = 0u64;
    let mut eof = false;
    let mut last = t0;
    loop {
        let target = live.target.load(Ordering::Relaxed);
        if got >= target || ctl.abort.load(Ordering::Relaxed) {
            break;
        }
        let mut want = queued(&rx)?;
        if want == 0 {
            let ready = poll(rx.socket(), PollFlags::IN, Some(RECV_SLICE))
                .map_err(|e| BenchError::io("poll (data connection)", e))?;
            if ready.is_empty() {
                continue;
            }
            // Readable with nothing queued: end of stream, which a whole piece reports.
            want = queued(&rx)?.max(1);
        }
        let want = want.min(len).min(target - got);
        let at = sink.next(want);
        let n = match rx.recv_to_file(&sink.file, at, want) {
            Ok(n) => n,
            Err(zcnet::Error::Truncated { got: n, .. }) => {
                eof = true;
                n
            }
            Err(e) => return Err(zerr("splice (receive into a file)")(e)),
        };
        if n > 0 {
            got += n;
            last = Instant::now();
            live.bytes.store(got, Ordering::Relaxed);
        }
        if eof {
            break;
        }
    }
    let snap = rx.stats().snapshot();
    Ok(StreamOut {
        bytes: got,
        seconds: last.duration_since(t0).as_secs_f64(),
        congestion,
        path: files::FILE.to_string(),
        eof,
        ..StreamOut::ended(spec.id, socket, spec.main, false, c0, &snap)?
    })
}

/// Joins the sending streams (after [`Control::stop`]).
pub(crate) fn join_senders(running: &mut Vec<Running>) -> Result<Vec<StreamOut>, BenchError> {
    let (senders, rest): (Vec<_>, Vec<_>) = running.drain(..).partition(|r| r.sender);
    *running = rest;
    senders.into_iter().map(Running::join).collect()
}

/// Waits for the receiving streams to stop by themselves (end of stream, or the targets
/// set from the peer's results) for up to [`DRAIN_TIMEOUT`], then makes them stop.
pub(crate) fn join_receivers(
    running: Vec<Running>,
    ctl: &Control,
) -> Result<Vec<StreamOut>, BenchError> {
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    while running.iter().any(|r| !r.is_finished()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    ctl.abort.store(true, Ordering::Relaxed);
    running.into_iter().map(Running::join).collect()
}
