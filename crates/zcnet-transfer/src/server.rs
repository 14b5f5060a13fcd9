//! An exposed receiver: accepts senders on a listening socket and runs their sessions, with
//! every resource a peer can take bounded.
//!
//! One thread runs an `epoll(7)` loop that accepts and drives every handshake without
//! blocking ([`ReceiverHandshake`]: a few hundred bytes per connection, reading nothing past
//! the handshake frames). Only a peer that completed its handshake (and proved the token,
//! when one is set) gets a thread of its own for the file data. So:
//!
//! * connections in their handshake are capped in all ([`ServerConfig::max_pending`]; when
//!   full, the oldest is dropped, so a flood cannot starve a sender that answers at once) and
//!   per address ([`ServerConfig::max_pending_per_addr`]), and each has
//!   [`ServerConfig::handshake_timeout`];
//! * sessions are capped in all and per address ([`ServerConfig::max_sessions`],
//!   [`ServerConfig::max_sessions_per_addr`]); a peer over any cap is told
//!   `Refuse{Busy}` with the reason, never left hanging;
//! * a session has an idle timeout per read and an overall deadline
//!   ([`ServerConfig::session_deadline`]), enforced by shutting its socket down;
//! * failed authentications are limited per address ([`AuthLimiter`]);
//! * `accept` failing with `EMFILE`/`ENFILE` (a spare descriptor is given up to accept and
//!   refuse that one peer), `ENOBUFS`, `ENOMEM`, `ECONNABORTED`, and a failed thread spawn
//!   refuse one peer and the loop goes on: nothing a peer does ends the process;
//! * `stop` set (SIGTERM/SIGINT in the CLI): no more accepting, handshakes dropped, sessions
//!   in flight get [`ServerConfig::grace`] to finish, then their sockets are shut down (their
//!   partial files stay, their reservations released);
//! * a session thread that does not end once its socket is shut down — stuck in a system
//!   call that does not look at the socket, or hashing a large file — is not waited for:
//!   [`SETTLE`] after its deadline it no longer counts against its address, and [`SETTLE`]
//!   after the grace `serve` returns without it ([`Event::Abandoned`]; the CLI then exits,
//!   and the thread with it). Nothing it left is final: a file gets its name only by the
//!   rename after its checks, so an abandoned session leaves partial files at most.
//!
//! A session of several streams (protocol version 5) is one `Open` connection and up to
//! `streams - 1` connections that `Join` it with the id the `Open` was answered with. Each
//! stream has its own thread and its own [`Store`] over the same directory with the same
//! rules; `--max-bytes` is one [`Quota`] keyed by the sender (address, and token), so the
//! cap holds for the streams together. A join counts like a session against
//! [`ServerConfig::max_sessions`] and [`ServerConfig::max_sessions_per_addr`] (checked once
//! the handshake has said `Open` or `Join`; a refused join uses up its place in the session,
//! and its sender carries that stream's files on the others); it must come from the
//! opener's address and within [`ServerConfig::handshake_timeout`] of the `Open`, and an
//! unknown, full or expired id is refused (`Refuse{NoSession}`) before anything is opened. With [`ServerConfig::once`] the receiver serves the one
//! session's streams and returns their reports together.

use super::descriptors::{DescriptorBudget, Held, PER_CONNECTION};
use super::handshake::{Accepted, HandshakeError, ReceiverHandshake, StreamRequest};
use super::limits::{AddrCount, AuthLimiter};
use super::ranges::RangedFiles;
use super::session::{
    note_carrier, receive_files_over, session_id, Carrier, Progress, RecvSecurity, SessionReport,
    TransferError,
};
use super::store::{Quota, SenderId, Store, StoreOptions};
use super::tls::ktls::{hand_over, HandOver};
use super::tls::{TlsError, TlsLink, BINDING_LEN, EXPORTER_LABEL};
use super::wire::{tls_preamble, Code, Frame, SESSION_ID_LEN};
use rustix::event::epoll;
use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zcnet::stats::StatsSnapshot;
use zcnet::{ReceiverConfig, RxPath};

/// Limits and options of a receiver.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// Require senders to prove this token.
    pub token: Option<Vec<u8>>,
    /// File rules (overwrite, resume, byte cap, special bits).
    pub store: StoreOptions,
    /// Sessions at once (past their handshake).
    pub max_sessions: usize,
    /// Connections past their handshake at once from one address, a session's further
    /// streams (`Join`s) included, so one sender (without a token, anyone who can say
    /// `Hello`) cannot take every slot.
    pub max_sessions_per_addr: usize,
    /// Descriptors one session may hold: [`PER_CONNECTION`] per stream, and each file
    /// arriving by ranges one (two with `--resume`) until its last range has landed.
    pub max_fds_per_session: usize,
    /// Descriptors the sessions of one address may hold together, counted the same way.
    pub max_fds_per_addr: usize,
    /// Connections in their handshake at once, all addresses.
    pub max_pending: usize,
    /// Connections in their handshake at once from one address.
    pub max_pending_per_addr: usize,
    /// Time a connection has to complete its handshake.
    pub handshake_timeout: Duration,
    /// Longest wait for the next byte of a session.
    pub idle_timeout: Duration,
    /// Longest a session may last in all.
    pub session_deadline: Duration,
    /// After `stop`: how long sessions in flight may go on.
    pub grace: Duration,
    /// Failed authentications allowed per address per minute.
    pub auth_failures_per_minute: usize,
    /// Serve the first peer that completes a handshake, then return its result.
    pub once: bool,
    /// Whether sessions run inside TLS, and with which identity (the library's default is
    /// plaintext: see [`RecvSecurity`]).
    pub security: RecvSecurity,
}

/// Default of [`ServerConfig::max_fds_per_session`]: a session of 16 streams (128) with 64
/// files by ranges unfinished at once and their records (128). A sender splits at most one
/// file per stream (only a file larger than a stream's share of the tree is split), so 16
/// at once is the most a `zcnet send` session needs.
pub const DEFAULT_FDS_PER_SESSION: usize = 256;

/// Default of [`ServerConfig::max_fds_per_addr`]: two full sessions, so the four sessions
/// an address may have cannot all fill up. In all, what is counted stays under
/// `max_sessions` × [`DEFAULT_FDS_PER_SESSION`] (4096 with the default 16 sessions), well
/// below common limits of open files once [`raise_fd_limit`] has raised them; what is not
/// counted is bounded per connection (its directory cache, its window of small files).
pub const DEFAULT_FDS_PER_ADDR: usize = 512;

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            token: None,
            store: StoreOptions::default(),
            max_sessions: 16,
            max_sessions_per_addr: 4,
            max_fds_per_session: DEFAULT_FDS_PER_SESSION,
            max_fds_per_addr: DEFAULT_FDS_PER_ADDR,
            max_pending: 1024,
            max_pending_per_addr: 8,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            session_deadline: Duration::from_secs(24 * 3600),
            grace: Duration::from_secs(30),
            auth_failures_per_minute: 10,
            once: false,
            security: RecvSecurity::Plaintext,
        }
    }
}

/// What the server tells its owner (the CLI logs these).
#[derive(Debug)]
#[non_exhaustive]
pub enum Event<'a> {
    /// A peer was turned away before or at its handshake.
    Refused {
        /// Who.
        peer: SocketAddr,
        /// Why (also sent to the peer, when it could be).
        reason: &'a str,
    },
    /// A handshake failed (malformed, wrong token, timeout).
    HandshakeFailed {
        /// Who.
        peer: SocketAddr,
        /// Why.
        error: &'a HandshakeError,
    },
    /// A session starts.
    SessionStarted {
        /// Who.
        peer: SocketAddr,
    },
    /// A session ended.
    SessionEnded {
        /// Who.
        peer: SocketAddr,
        /// How.
        result: &'a Result<SessionReport, TransferError>,
        /// Its connection's counters.
        stats: &'a StatsSnapshot,
        /// How long it took.
        elapsed: Duration,
    },
    /// Something went wrong with the listener or a resource; serving goes on.
    Trouble {
        /// What.
        what: &'a str,
    },
    /// `stop` was seen: no more accepting; `sessions` still in flight.
    Stopping {
        /// Sessions in flight.
        sessions: usize,
    },
    /// The grace (or, with [`ServerConfig::once`], the session's deadline) is over and
    /// `sessions` did not end within [`SETTLE`] of their sockets being shut down (stuck in
    /// a system call): `serve` returns without them.
    Abandoned {
        /// Sessions left running.
        sessions: usize,
    },
}

/// The owner's side: logging, and progress per session.
pub trait Observer: Send + Sync {
    /// Something happened.
    fn event(&self, e: Event<'_>);
    /// Progress sink for a session from `peer`.
    fn progress(&self, peer: SocketAddr) -> Box<dyn FnMut(Progress<'_>) + Send>;
}

/// Why serving could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// Setting up the loop failed.
    #[error("{what}: {source}")]
    Setup {
        /// What.
        what: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
}

fn setup(what: &'static str) -> impl FnOnce(io::Error) -> ServeError {
    move |source| ServeError::Setup { what, source }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (stalled peers cost a descriptor each);
/// returns the soft limit in force.
pub fn raise_fd_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let lim = getrlimit(Resource::Nofile);
    if lim.current != lim.maximum {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: lim.maximum,
                maximum: lim.maximum,
            },
        );
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// A session open for more streams (version 5): who opened it, how many may still join, and
/// until when.
struct Group {
    ip: std::net::IpAddr,
    left: u16,
    expires: Instant,
    /// The files its streams receive by ranges (version 6), shared by all of them.
    ranged: Arc<RangedFiles>,
}

/// A connection past its handshake that may start: the session it joins (if it joins
/// one), the files its session's streams receive by ranges, and its own descriptors,
/// charged to its session and address until it ends.
struct Admitted {
    joining: Option<SessionId>,
    ranged: Arc<RangedFiles>,
    connection_fds: Option<Held>,
}

/// A connection in its handshake.
struct Pending {
    stream: TcpStream,
    peer: SocketAddr,
    hs: ReceiverHandshake,
    deadline: Instant,
    /// Its TLS connection, when the receiver encrypts: the TLS handshake runs first, then the
    /// transfer handshake inside it. `None` again once the kernel took its records.
    tls: Option<rustls::ServerConnection>,
    /// Who makes its TLS records, decided when its TLS handshake completed.
    carrier: Option<Carrier>,
}

/// Sends `bytes` on a connection: through its TLS connection if it has one whose handshake
/// is done, else as they are (a refusal before TLS is plaintext, as the preamble is).
/// Nothing is sent on a connection in the middle of its TLS handshake.
fn send_on(
    stream: &TcpStream,
    tls: Option<&mut rustls::ServerConnection>,
    bytes: &[u8],
) -> io::Result<()> {
    match tls {
        None => (&*stream).write_all(bytes),
        Some(c) if c.is_handshaking() => Ok(()),
        Some(c) => {
            c.writer().write_all(bytes)?;
            while c.wants_write() {
                c.write_tls(&mut &*stream)?;
            }
            Ok(())
        }
    }
}

/// A session in flight, as the loop sees it.
struct Running {
    /// A second handle on its socket, to shut it down at the deadline or the end of grace.
    sock: TcpStream,
    /// The sender's address (sessions per address are capped).
    ip: std::net::IpAddr,
    deadline: Instant,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Still running [`SETTLE`] past its deadline, its socket long shut down: its thread is
    /// stuck, and its address may start others.
    stuck: bool,
}

type SessionResult = Result<SessionReport, TransferError>;

struct Shared {
    /// The TLS configuration, made once, when the receiver encrypts.
    tls: Option<Arc<rustls::ServerConfig>>,
    dir: PathBuf,
    cfg: ServerConfig,
    quota: Option<Arc<Quota>>,
    observer: Arc<dyn Observer>,
    running: Mutex<HashMap<u64, Running>>,
    /// Descriptors held per session and per address (connections, files arriving by ranges).
    descriptors: Arc<DescriptorBudget>,
    /// Threads of sessions that have ended, to join.
    finished: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

type SessionId = [u8; SESSION_ID_LEN];

const LISTENER: u64 = 0;
const TICK: Duration = Duration::from_millis(100);
/// How long a session's thread has to end once its socket is shut down (at its deadline or
/// at the end of the grace) before it counts as stuck. A thread reading or writing its
/// socket ends within a few milliseconds; one that does not is in a call that will not
/// look at the socket.
pub const SETTLE: Duration = Duration::from_secs(1);
/// Accepts per wakeup, so a flood cannot keep the loop from handshakes and deadlines.
const ACCEPT_BURST: usize = 256;

/// Best-effort refusal on a fresh socket (a few dozen bytes: they fit the send buffer),
/// through its TLS connection once it has one.
fn refuse(stream: &mut TcpStream, tls: Option<&mut rustls::ServerConnection>, reason: &str) {
    let _ = stream.set_nonblocking(true);
    let f = Frame::Refuse {
        code: Code::Busy,
        message: reason.into(),
    }
    .to_bytes();
    let _ = send_on(stream, tls, &f);
}

/// Serves senders on `listener` into `dir` until `stop` is set (or, with
/// [`ServerConfig::once`], until the first session ends: its result is returned).
pub fn serve(
    listener: TcpListener,
    dir: &Path,
    cfg: ServerConfig,
    stop: &AtomicBool,
    observer: Arc<dyn Observer>,
) -> Result<Option<SessionResult>, ServeError> {
    let listener_port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    listener
        .set_nonblocking(true)
        .map_err(setup("making the listener non-blocking"))?;
    let ep =
        epoll::create(epoll::CreateFlags::CLOEXEC).map_err(|e| setup("epoll_create")(e.into()))?;
    epoll::add(
        &ep,
        &listener,
        epoll::EventData::new_u64(LISTENER),
        epoll::EventFlags::IN,
    )
    .map_err(|e| setup("epoll_ctl (listener)")(e.into()))?;
    let tls = match &cfg.security {
        RecvSecurity::Tls(identity) => Some(
            super::tls::server_config(identity)
                .map_err(|e| setup("the TLS configuration")(io::Error::other(e)))?,
        ),
        RecvSecurity::Plaintext => None,
    };
    let shared = Arc::new(Shared {
        tls,
        dir: dir.to_path_buf(),
        quota: cfg.store.max_bytes.map(Quota::new),
        descriptors: DescriptorBudget::new(cfg.max_fds_per_session, cfg.max_fds_per_addr),
        cfg,
        observer,
        running: Mutex::new(HashMap::new()),
        finished: Mutex::new(Vec::new()),
    });
    let (once_tx, once_rx) = mpsc::channel();
    let mut lp = Loop {
        ep,
        listener: Some(listener),
        spare: std::fs::File::open("/dev/null").ok(),
        pending: HashMap::new(),
        order: VecDeque::new(),
        per_addr: AddrCount::default(),
        auth: AuthLimiter::new(shared.cfg.auth_failures_per_minute, Duration::from_secs(60)),
        next_id: 1,
        port: listener_port,
        shared,
        once_tx,
        once_result: once_rx,
        once_started: false,
        once_group: None,
        once_expect: 0,
        once_got: Vec::new(),
        groups: HashMap::new(),
    };
    lp.run(stop)
}

struct Loop {
    ep: std::os::fd::OwnedFd,
    listener: Option<TcpListener>,
    spare: Option<std::fs::File>,
    pending: HashMap<u64, Pending>,
    /// Pending ids in arrival order (ids already gone are skipped).
    order: VecDeque<u64>,
    per_addr: AddrCount,
    auth: AuthLimiter,
    next_id: u64,
    /// The listening port, in session thread names (`zcrecv PORT`).
    port: u16,
    shared: Arc<Shared>,
    once_tx: mpsc::Sender<SessionResult>,
    once_result: mpsc::Receiver<SessionResult>,
    once_started: bool,
    /// With `once`: the session whose further streams may still join.
    once_group: Option<SessionId>,
    /// With `once`: streams started, and the results of those that ended.
    once_expect: usize,
    once_got: Vec<SessionResult>,
    /// Sessions open for more streams.
    groups: HashMap<SessionId, Group>,
}

impl Loop {
    fn trouble(&self, what: String) {
        self.shared.observer.event(Event::Trouble { what: &what });
    }

    fn refused(&self, peer: SocketAddr, stream: &mut TcpStream, reason: &str) {
        refuse(stream, None, reason);
        self.shared.observer.event(Event::Refused { peer, reason });
    }

    /// [`Self::refused`] for a connection that may be past its TLS handshake.
    fn refused_pending(&self, p: &mut Pending, reason: &str) {
        refuse(&mut p.stream, p.tls.as_mut(), reason);
        self.shared.observer.event(Event::Refused {
            peer: p.peer,
            reason,
        });
    }

    fn sessions_of(&self, ip: std::net::IpAddr) -> usize {
        self.shared
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|r| r.ip == ip && !r.stuck)
            .count()
    }

    fn sessions(&self) -> usize {
        self.shared
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Sessions still running [`SETTLE`] past their deadline.
    fn stuck(&self) -> usize {
        self.shared
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|r| r.stuck)
            .count()
    }

    fn run(&mut self, stop: &AtomicBool) -> Result<Option<SessionResult>, ServeError> {
        let mut events: Vec<epoll::Event> = Vec::with_capacity(512);
        loop {
            if stop.load(Ordering::Relaxed) {
                return Ok(self.drain());
            }
            if self.once_started && self.once_group.is_none() {
                // With `once`, a stream stuck past its deadline will not report: the one
                // session is over without it.
                let stuck = self.stuck();
                if stuck > 0 && self.once_got.len() + stuck >= self.once_expect {
                    self.stop_accepting();
                    self.shared
                        .observer
                        .event(Event::Abandoned { sessions: stuck });
                    self.reap();
                    let mut got = std::mem::take(&mut self.once_got);
                    got.push(Err(TransferError::Io {
                        what: "the session".into(),
                        source: io::Error::other(
                            "still running past its deadline (stuck in a system call); abandoned",
                        ),
                    }));
                    return Ok(Some(merge(got)));
                }
            }
            if self.once_started
                && self.once_group.is_none()
                && self.once_got.len() >= self.once_expect
            {
                // Every stream of the one session has ended (and no more may join).
                self.reap();
                return Ok(Some(merge(std::mem::take(&mut self.once_got))));
            }
            if self.once_started {
                let rx = &self.once_result;
                // With no handshake left to drive (the listener is closed once the one
                // session has all its streams) the loop waits on the session itself, so
                // `--once` exits as soon as it ends instead of at the next tick.
                let idle = self.pending.is_empty() && self.listener.is_none();
                let got = if idle {
                    rx.recv_timeout(TICK).map_err(|e| match e {
                        mpsc::RecvTimeoutError::Timeout => mpsc::TryRecvError::Empty,
                        mpsc::RecvTimeoutError::Disconnected => mpsc::TryRecvError::Disconnected,
                    })
                } else {
                    rx.try_recv()
                };
                match got {
                    Ok(r) => {
                        self.once_got.push(r);
                        continue;
                    }
                    Err(mpsc::TryRecvError::Disconnected) => {
                        self.reap();
                        return Ok(Some(Err(TransferError::Io {
                            what: "the session".into(),
                            source: io::Error::other("its thread ended without a result"),
                        })));
                    }
                    Err(mpsc::TryRecvError::Empty) if idle => {
                        self.expire();
                        self.reap();
                        continue;
                    }
                    Err(mpsc::TryRecvError::Empty) => {}
                }
            }
            let t = rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: TICK.as_nanos() as _,
            };
            events.clear();
            match epoll::wait(
                &self.ep,
                rustix::buffer::spare_capacity(&mut events),
                Some(&t),
            ) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    self.trouble(format!("epoll_wait: {e}"));
                    std::thread::sleep(TICK);
                }
            }
            for ev in events.drain(..) {
                let id = ev.data.u64();
                if id == LISTENER {
                    self.accept_burst();
                } else {
                    self.drive(id);
                }
            }
            self.expire();
            self.reap();
        }
    }

    fn accept_burst(&mut self) {
        for _ in 0..ACCEPT_BURST {
            let Some(l) = &self.listener else { return };
            match l.accept() {
                Ok((s, peer)) => self.admit(s, peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE)) => {
                    // Out of descriptors: give up the spare one to accept this peer, tell it
                    // why, close it, and take the spare back (the libev/nginx idiom).
                    self.spare = None;
                    if let Some(l) = &self.listener {
                        if let Ok((mut s, peer)) = l.accept() {
                            self.refused(
                                peer,
                                &mut s,
                                "the receiver is out of file descriptors; try again later",
                            );
                        }
                    }
                    self.spare = std::fs::File::open("/dev/null").ok();
                    self.trouble(format!("accept: {e}"));
                    return;
                }
                Err(e) => {
                    // ECONNABORTED, ENOBUFS, ENOMEM, EPERM (firewall), EPROTO…: this peer is
                    // lost, the listener is not.
                    self.trouble(format!("accept: {e}"));
                    return;
                }
            }
        }
    }

    fn admit(&mut self, mut s: TcpStream, peer: SocketAddr) {
        let ip = peer.ip();
        let shared = self.shared.clone();
        let cfg = &shared.cfg;
        // With `once`, only the one session's further streams may still come (their
        // handshake says whether they are that; anyone else is refused then).
        if self.once_started && self.once_group.is_none() {
            return self.refused(peer, &mut s, "the receiver serves one sender and has it");
        }
        if let Some(wait) = self.auth.blocked(ip, Instant::now()) {
            return self.refused(
                peer,
                &mut s,
                &format!(
                    "too many failed authentications from {ip}; try again in {} s",
                    wait.as_secs() + 1
                ),
            );
        }
        let sessions = self.sessions();
        if sessions >= cfg.max_sessions {
            return self.refused(
                peer,
                &mut s,
                &format!("the receiver is busy ({sessions} sessions, its limit); try again later"),
            );
        }
        // The limit per address is checked once the connection has said whether it opens a
        // session or joins one (`start_session`); until then its handshake slots bound it.
        if self.per_addr.get(ip) >= cfg.max_pending_per_addr {
            return self.refused(
                peer,
                &mut s,
                &format!(
                    "too many connections from {ip} still in their handshake (limit {})",
                    cfg.max_pending_per_addr
                ),
            );
        }
        while self.pending.len() >= cfg.max_pending.max(1) {
            // Full: the oldest handshake has had the longest; it goes.
            match self.order.pop_front() {
                Some(old) => {
                    if let Some(mut p) = self.remove(old) {
                        self.refused_pending(&mut p, "too many connections in their handshake");
                    }
                }
                None => break,
            }
        }
        let hs = match ReceiverHandshake::new(cfg.token.clone()) {
            Ok(h) => h,
            Err(e) => return self.trouble(format!("random bytes: {e}")),
        };
        let _ = s.set_nodelay(true);
        // An encrypting receiver's first bytes are the preamble (its `Hello` goes inside
        // TLS); a plaintext one's, its `Hello`.
        let (first, tls) = match &shared.tls {
            Some(c) => match rustls::ServerConnection::new(c.clone()) {
                Ok(conn) => (tls_preamble(), Some(conn)),
                Err(e) => return self.trouble(format!("a TLS connection: {e}")),
            },
            None => (hs.greeting(), None),
        };
        if s.set_nonblocking(true).is_err() || s.write(&first).ok() != Some(first.len()) {
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        if let Err(e) = epoll::add(
            &self.ep,
            &s,
            epoll::EventData::new_u64(id),
            epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
        ) {
            return self.trouble(format!("epoll_ctl: {e}"));
        }
        self.per_addr.add(ip);
        self.order.push_back(id);
        self.pending.insert(
            id,
            Pending {
                stream: s,
                peer,
                hs,
                deadline: Instant::now() + cfg.handshake_timeout,
                tls,
                carrier: None,
            },
        );
    }

    fn remove(&mut self, id: u64) -> Option<Pending> {
        let p = self.pending.remove(&id)?;
        let _ = epoll::delete(&self.ep, &p.stream);
        self.per_addr.remove(p.peer.ip());
        Some(p)
    }

    /// Reads what a pending connection has sent, as far as its handshake asks.
    fn drive(&mut self, id: u64) {
        let Some(p) = self.pending.get_mut(&id) else {
            return;
        };
        let outcome = match p.tls.is_some() {
            true => match drive_tls(p) {
                Some(o) => o,
                None => return,
            },
            false => loop {
                let want = p.hs.want();
                match p.stream.read(want) {
                    Ok(0) => break Err(None),
                    Ok(n) => match p.hs.advance(n) {
                        Ok(Some(a)) => break Ok(a),
                        Ok(None) => continue,
                        Err(e) => break Err(Some(e)),
                    },
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => break Err(None),
                }
            },
        };
        let Some(mut p) = self.remove(id) else { return };
        match outcome {
            Ok(accepted) => self.start_session(p, accepted),
            Err(None) => {}
            Err(Some(e)) => {
                if e == HandshakeError::AuthFailed {
                    self.auth.failed(p.peer.ip(), Instant::now());
                }
                if let Some(f) = e.refusal() {
                    let _ = send_on(&p.stream, p.tls.as_mut(), &f.to_bytes());
                }
                self.shared.observer.event(Event::HandshakeFailed {
                    peer: p.peer,
                    error: &e,
                });
            }
        }
    }

    /// Starts the session of a connection whose handshake is done: admitted (or refused
    /// and told why), told what the handshake still owes it, then run on a thread of its own.
    fn start_session(&mut self, mut p: Pending, accepted: Accepted) {
        let Some(admitted) = self.admit_session(&mut p, &accepted) else {
            return;
        };
        let (stream, mut tls, carrier) = (p.stream, p.tls, p.carrier);
        let Some(opened) = self.open_stream(&stream, tls.as_mut(), &accepted, admitted.joining)
        else {
            return;
        };
        self.spawn_session(stream, tls, carrier, p.peer, &accepted, admitted, opened);
    }

    /// Places a connection past its handshake in its session — a new one, or (version 5)
    /// the one it joins — and charges it against the limits; `None` when it was refused
    /// (and told why).
    fn admit_session(&mut self, p: &mut Pending, accepted: &Accepted) -> Option<Admitted> {
        let mut connection_fds = None;
        let mut ranged = None;
        let joining = match accepted.stream {
            StreamRequest::Join(id) => match self.join(&id, p.peer.ip()) {
                Ok(shared) => {
                    ranged = Some(shared);
                    Some(id)
                }
                Err(reason) => {
                    // Like a wrong token: a peer guessing ids is limited the same way.
                    self.auth.failed(p.peer.ip(), Instant::now());
                    let _ = p.stream.set_nonblocking(true);
                    let _ = send_on(
                        &p.stream,
                        p.tls.as_mut(),
                        &Frame::Refuse {
                            code: Code::NoSession,
                            message: reason.clone(),
                        }
                        .to_bytes(),
                    );
                    let peer = p.peer;
                    self.shared.observer.event(Event::Refused {
                        peer,
                        reason: &reason,
                    });
                    return None;
                }
            },
            _ => None,
        };
        let ranged = ranged.unwrap_or_else(|| {
            Arc::new(RangedFiles::new(
                self.shared.descriptors.session(p.peer.ip()),
            ))
        });
        let over = self
            .over_limits(p.peer.ip(), joining.is_some())
            .or_else(|| {
                // The connection's own descriptors, charged to its session and address (the
                // session's ranged files are charged as they begin).
                match ranged.descriptors().take(PER_CONNECTION, "a connection") {
                    Ok(held) => {
                        connection_fds = Some(held);
                        None
                    }
                    Err(r) => Some(r.message),
                }
            });
        if let Some(reason) = over {
            if let Some(gid) = joining {
                // The sender takes no more streams after a refused one (it carries their
                // files on those it has): the session is closed to joins, so `once` need
                // not wait for streams that will not come.
                if self.groups.remove(&gid).is_some() {
                    self.group_closed(&gid);
                }
            }
            self.refused_pending(p, &reason);
            return None;
        }
        Some(Admitted {
            joining,
            ranged,
            connection_fds,
        })
    }

    /// Makes an admitted connection blocking and sends what the handshake still owes it:
    /// the receiver's proof, and from version 5 the session's id — a new one to the opener
    /// (who hands it to its other streams), back to each stream that joined. `None` when
    /// the connection failed meanwhile, else the session it opened (id and streams), if any.
    fn open_stream(
        &self,
        stream: &TcpStream,
        mut tls: Option<&mut rustls::ServerConnection>,
        accepted: &Accepted,
        joining: Option<SessionId>,
    ) -> Option<Option<(SessionId, u16)>> {
        if stream.set_nonblocking(false).is_err() {
            return None;
        }
        let _ = stream.set_write_timeout(Some(self.shared.cfg.idle_timeout));
        if let Some(r) = &accepted.reply {
            if send_on(stream, tls.as_deref_mut(), r).is_err() {
                return None;
            }
        }
        let opened = match (accepted.stream, joining) {
            (StreamRequest::Open(n), _) => {
                let Ok(id) = session_id() else {
                    self.trouble("reading random bytes for a session id".into());
                    return None;
                };
                Some((id, n))
            }
            _ => None,
        };
        if let Some(id) = opened.map(|(id, _)| id).or(joining) {
            if send_on(stream, tls, &Frame::Session { id }.to_bytes()).is_err() {
                return None;
            }
        }
        Some(opened)
    }

    /// Runs an admitted session on a thread of its own, registered among the running ones
    /// before it starts (so the thread's own removal cannot come first).
    #[allow(clippy::too_many_arguments)]
    fn spawn_session(
        &mut self,
        stream: TcpStream,
        tls: Option<rustls::ServerConnection>,
        carrier: Option<Carrier>,
        peer: SocketAddr,
        accepted: &Accepted,
        admitted: Admitted,
        opened: Option<(SessionId, u16)>,
    ) {
        let Ok(handle) = stream.try_clone() else {
            return self.trouble("dup: out of descriptors for a session".into());
        };
        let cfg = &self.shared.cfg;
        let id = self.next_id;
        self.next_id += 1;
        let sender = SenderId {
            address: Some(peer.ip()),
            token: if accepted.authenticated {
                cfg.token.clone()
            } else {
                None
            },
        };
        let version = accepted.version;
        let tx = self.once_tx.clone();
        let once = cfg.once;
        let shared = self.shared.clone();
        let Admitted {
            ranged,
            connection_fds,
            ..
        } = admitted;
        // The thread takes the TLS connection; if it cannot start, the refusal goes
        // through it.
        let tls = Arc::new(Mutex::new(tls));
        let tls_left = tls.clone();
        let group_ranged = ranged.clone();
        self.shared
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                id,
                Running {
                    sock: handle,
                    ip: peer.ip(),
                    deadline: Instant::now() + cfg.session_deadline,
                    thread: None,
                    stuck: false,
                },
            );
        let spawned = std::thread::Builder::new()
            .name(format!("zcrecv {}", self.port))
            .spawn(move || {
                let t0 = Instant::now();
                let tls = tls.lock().unwrap_or_else(|e| e.into_inner()).take();
                let (result, stats) = run_session(
                    &shared, stream, tls, carrier, peer, &sender, version, &ranged,
                );
                drop(connection_fds);
                // The slot is free before anyone hears the session ended.
                let own = shared
                    .running
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id)
                    .and_then(|r| r.thread);
                if let Some(h) = own {
                    shared
                        .finished
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(h);
                }
                shared.observer.event(Event::SessionEnded {
                    peer,
                    result: &result,
                    stats: &stats,
                    elapsed: t0.elapsed(),
                });
                if once {
                    let _ = tx.send(result);
                }
            });
        let tls = move || tls_left.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.session_spawned(spawned, id, peer, opened, group_ranged, &tls);
    }

    /// Keeps a session thread's handle (or, when it could not start, refuses its sender)
    /// and, for a session that opened more streams, waits for them to join.
    fn session_spawned(
        &mut self,
        spawned: std::io::Result<std::thread::JoinHandle<()>>,
        id: u64,
        peer: SocketAddr,
        opened: Option<(SessionId, u16)>,
        group_ranged: Arc<RangedFiles>,
        tls: &dyn Fn() -> Option<rustls::ServerConnection>,
    ) {
        let once = self.shared.cfg.once;
        let mut running = self
            .shared
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match spawned {
            Ok(h) => {
                match running.get_mut(&id) {
                    Some(r) => r.thread = Some(h),
                    // Already over: join it with the others.
                    None => self
                        .shared
                        .finished
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(h),
                }
                drop(running);
                if let Some((gid, n)) = opened.filter(|&(_, n)| n > 1) {
                    self.groups.insert(
                        gid,
                        Group {
                            ip: peer.ip(),
                            left: n - 1,
                            expires: Instant::now() + self.shared.cfg.handshake_timeout,
                            ranged: group_ranged,
                        },
                    );
                    if once {
                        self.once_group = Some(gid);
                    }
                }
                if once {
                    self.once_started = true;
                    self.once_expect += 1;
                    if self.once_group.is_none() {
                        self.stop_accepting();
                    }
                }
            }
            Err(e) => {
                // The closure (and the stream in it) is gone; the clone can still refuse.
                if let Some(mut r) = running.remove(&id) {
                    drop(running);
                    let reason = "the receiver cannot start a session now; try again later";
                    refuse(&mut r.sock, tls().as_mut(), reason);
                    self.shared.observer.event(Event::Refused { peer, reason });
                }
                self.trouble(format!("starting a session thread: {e}"));
            }
        }
    }

    /// Why a connection from `ip` that completed its handshake (a further stream of a session
    /// when `joining`) may not start now, if it may not: the limit of sessions at once, and
    /// the limit per address, which counts every connection of the address — a join as much
    /// as an `Open` (each has its own thread, buffers and files).
    fn over_limits(&self, ip: std::net::IpAddr, joining: bool) -> Option<String> {
        let cfg = &self.shared.cfg;
        let sessions = self.sessions();
        if sessions >= cfg.max_sessions || (self.once_started && !joining) {
            return Some(format!(
                "the receiver is busy ({sessions} sessions, its limit); try again later"
            ));
        }
        let of_addr = self.sessions_of(ip);
        if of_addr >= cfg.max_sessions_per_addr {
            let what = if joining {
                "a further stream"
            } else {
                "a session"
            };
            return Some(format!(
                "{ip} already has {of_addr} connections (sessions and their streams; the limit per address), so {what} is refused; try again later"
            ));
        }
        None
    }

    /// Takes one place in session `id` for a stream from `ip`, or says why not.
    fn join(&mut self, id: &SessionId, ip: std::net::IpAddr) -> Result<Arc<RangedFiles>, String> {
        let g = match self.groups.get_mut(id) {
            Some(g) if g.ip == ip && g.expires > Instant::now() => g,
            _ => {
                return Err(
                    "no session with that id is open for more streams (unknown, ended, or from another address)".into(),
                )
            }
        };
        g.left -= 1;
        let ranged = g.ranged.clone();
        if g.left == 0 {
            self.groups.remove(id);
            self.group_closed(id);
        }
        Ok(ranged)
    }

    /// A session takes no more streams: with `once`, nothing more is accepted.
    fn group_closed(&mut self, id: &SessionId) {
        if self.once_group.as_ref() == Some(id) {
            self.once_group = None;
            self.stop_accepting();
        }
    }

    fn stop_accepting(&mut self) {
        if let Some(l) = self.listener.take() {
            let _ = epoll::delete(&self.ep, &l);
        }
        let ids: Vec<u64> = self.pending.keys().copied().collect();
        for id in ids {
            self.remove(id);
        }
        self.order.clear();
    }

    /// Handshakes past their deadline go; sessions past theirs are shut down.
    fn expire(&mut self) {
        let now = Instant::now();
        let gone: Vec<SessionId> = self
            .groups
            .iter()
            .filter(|(_, g)| g.expires <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.groups.remove(&id);
            self.group_closed(&id);
        }
        while let Some(&id) = self.order.front() {
            match self.pending.get(&id) {
                None => {
                    self.order.pop_front();
                }
                Some(p) if p.deadline <= now => {
                    self.order.pop_front();
                    if let Some(mut p) = self.remove(id) {
                        let reason = format!(
                            "no handshake within {} ms",
                            self.shared.cfg.handshake_timeout.as_millis()
                        );
                        self.refused_pending(&mut p, &reason);
                    }
                }
                Some(_) => break,
            }
        }
        let mut running = self
            .shared
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut stuck = Vec::new();
        for r in running.values_mut() {
            if r.deadline <= now {
                let _ = r.sock.shutdown(Shutdown::Both);
            }
            if !r.stuck && r.deadline + SETTLE <= now {
                r.stuck = true;
                stuck.push(r.ip);
            }
        }
        drop(running);
        for ip in stuck {
            self.trouble(format!(
                "a session from {ip} is still running {} ms past its deadline, its socket shut down (stuck in a system call); it no longer counts against {ip}",
                SETTLE.as_millis()
            ));
        }
    }

    /// Joins session threads that have ended.
    fn reap(&mut self) {
        let done = std::mem::take(
            &mut *self
                .shared
                .finished
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for h in done {
            let _ = h.join();
        }
    }

    /// Graceful stop: no more accepting, grace for sessions in flight, then shut them down.
    fn drain(&mut self) -> Option<SessionResult> {
        self.stop_accepting();
        let sessions = self.sessions();
        self.shared.observer.event(Event::Stopping { sessions });
        let end_of_grace = Instant::now() + self.shared.cfg.grace;
        while self.sessions() > 0 && Instant::now() < end_of_grace {
            std::thread::sleep(TICK.min(Duration::from_millis(20)));
            self.reap();
        }
        for r in self
            .shared
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            let _ = r.sock.shutdown(Shutdown::Both);
        }
        // A thread that ignores its shut-down socket (stuck in a system call) is not waited
        // for: the grace is a promise to whoever stops the receiver.
        let cut = Instant::now();
        while self.sessions() > 0 && cut.elapsed() < SETTLE {
            std::thread::sleep(Duration::from_millis(20));
            self.reap();
        }
        let left = self.sessions();
        if left > 0 {
            self.shared
                .observer
                .event(Event::Abandoned { sessions: left });
        }
        // Every other session has left the table; join the last threads (and let them
        // report).
        self.reap();
        if !self.once_started {
            return None;
        }
        self.once_got.extend(self.once_result.try_iter());
        if left > 0 {
            self.once_got.push(Err(TransferError::Io {
                what: "the session".into(),
                source: io::Error::other(
                    "still running when the grace ended (stuck in a system call); abandoned",
                ),
            }));
        }
        (!self.once_got.is_empty()).then(|| merge(std::mem::take(&mut self.once_got)))
    }
}

/// The reports of one session's streams as one: every file, or the first failure.
fn merge(results: Vec<SessionResult>) -> SessionResult {
    let mut all = SessionReport::default();
    for r in results {
        let r = r?;
        all.files.extend(r.files);
        all.unlisted_failures += r.unlisted_failures;
        all.ktls = all.ktls.or(r.ktls);
        all.kernel_tls = all.kernel_tls.or(r.kernel_tls);
    }
    Ok(all)
}

#[allow(clippy::too_many_arguments)]
fn run_session(
    shared: &Shared,
    stream: TcpStream,
    tls: Option<rustls::ServerConnection>,
    carrier: Option<Carrier>,
    peer: SocketAddr,
    sender: &SenderId,
    version: u16,
    ranged: &RangedFiles,
) -> (SessionResult, StatsSnapshot) {
    shared.observer.event(Event::SessionStarted { peer });
    // The copy path for control frames: file data goes by splice whatever the path, and no
    // per-connection socket mapping is set up.
    let rcfg = ReceiverConfig::new(RxPath::Copy)
        .timeout(shared.cfg.idle_timeout)
        .buf_bytes(64 * 1024);
    let mut stats = StatsSnapshot::default();
    let result = (|| {
        // Every byte of an encrypted session whose records stayed in user space goes
        // through its one TLS connection, over a second handle on the socket (the
        // `Receiver` keeps the counters and the timeouts); where the kernel took them, the
        // session reads and writes plaintext on the socket as an unencrypted one does.
        let link = match tls {
            Some(conn) => {
                let dup = stream
                    .try_clone()
                    .map_err(|e| zcnet::Error::io("dup of the session's socket", e))?;
                let binding = exporter(&conn)?;
                Some(Arc::new(TlsLink::new(conn.into(), dup, binding, false)))
            }
            None => None,
        };
        let mut rx = zcnet::stream::Receiver::from_stream(stream, &rcfg)?;
        if let Some(Carrier::User(_)) = &carrier {
            rx.stats()
                .fallback(zcnet::FallbackReason::KtlsUnavailable, 0);
        }
        let mut store =
            Store::open_for(&shared.dir, shared.cfg.store, shared.quota.clone(), sender).map_err(
                |e| TransferError::Io {
                    what: format!("opening {}", shared.dir.display()),
                    source: e,
                },
            )?;
        // Work the store does on its own (hashing for `--resume`) stops at the deadline too.
        store.set_deadline(Instant::now() + shared.cfg.session_deadline);
        let mut progress = shared.observer.progress(peer);
        let r = receive_files_over(&mut rx, link, &mut store, version, ranged, &mut *progress);
        stats = rx.stats().snapshot();
        r.map(|mut report| {
            note_carrier(carrier.as_ref(), &mut report);
            report
        })
    })();
    (result, stats)
}

/// The TLS session's exporter value (what the token's proofs are bound to).
fn exporter(conn: &rustls::ServerConnection) -> Result<[u8; BINDING_LEN], TlsError> {
    conn.export_keying_material([0u8; BINDING_LEN], EXPORTER_LABEL, None)
        .map_err(TlsError::Tls)
}

/// Drives a pending connection's TLS handshake and then its transfer handshake inside TLS,
/// as far as the bytes that have arrived allow: `None` to wait for more, else the outcome as
/// [`Loop::drive`] takes it.
fn drive_tls(p: &mut Pending) -> Option<Result<Accepted, Option<HandshakeError>>> {
    p.tls.as_ref()?;
    let fail = |e: String| Some(Err(Some(HandshakeError::Tls(e))));
    loop {
        // Taken anew each time: the kernel may take the records over ([`hand_over`]).
        let conn = p.tls.as_mut()?;
        if !conn.is_handshaking() {
            // Inside TLS: the transfer handshake's bytes, exactly as it asks for them.
            match conn.reader().read(p.hs.want()) {
                Ok(0) => return Some(Err(None)),
                Ok(n) => match p.hs.advance(n) {
                    Ok(Some(a)) => return Some(Ok(a)),
                    Ok(None) => continue,
                    Err(e) => return Some(Err(Some(e))),
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return fail(format!("reading: {e}")),
            }
        }
        match conn.read_tls(&mut p.stream) {
            Ok(0) => {
                return fail(match conn.is_handshaking() {
                    true => super::session::not_encrypted(TlsError::HandshakeEof).to_string(),
                    false => "the sender closed the connection during the handshake".into(),
                })
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return fail(format!("reading: {e}")),
        }
        let was_handshaking = conn.is_handshaking();
        if let Err(e) = conn.process_new_packets() {
            let _ = conn.write_tls(&mut p.stream);
            return fail(TlsError::from_rustls(e).to_string());
        }
        // The handshake's flights are a few KiB: they fit the socket's buffer.
        while conn.wants_write() {
            match conn.write_tls(&mut p.stream) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return fail(format!("sending the TLS handshake: {e}")),
            }
        }
        if was_handshaking && !conn.is_handshaking() {
            // TLS is up: the transfer handshake starts inside it, bound to this session
            // (the exporter value is taken before the keys may leave rustls).
            match exporter(conn) {
                Ok(b) => p.hs.over_tls(b),
                Err(e) => return fail(e.to_string()),
            }
            // Nothing of the sender's can have been read past its `Finished`: it speaks
            // only once it has our `Hello`, which goes out below.
            let conn = p.tls.take().expect("in TLS");
            match hand_over(conn.into(), &p.stream) {
                Ok(HandOver::Kernel(cipher)) => {
                    // From here the connection is driven like a plaintext one; the kernel
                    // makes and checks the records.
                    p.carrier = Some(Carrier::Kernel(cipher));
                    if let Err(e) = send_on(&p.stream, None, &p.hs.greeting()) {
                        return fail(format!("sending our hello: {e}"));
                    }
                    return None;
                }
                Ok(HandOver::User(conn, why)) => {
                    let rustls::Connection::Server(conn) = *conn else {
                        unreachable!("a server connection was handed over")
                    };
                    p.carrier = Some(Carrier::User(why.to_string()));
                    let conn = p.tls.insert(conn);
                    if let Err(e) = send_on(&p.stream, Some(conn), &p.hs.greeting()) {
                        return fail(format!("sending our hello: {e}"));
                    }
                }
                Err(e) => return fail(e.to_string()),
            }
        }
    }
}

/// An observer that reports nothing (tests, embedding).
#[derive(Debug, Default)]
pub struct Quiet;

impl Observer for Quiet {
    fn event(&self, _: Event<'_>) {}
    fn progress(&self, _: SocketAddr) -> Box<dyn FnMut(Progress<'_>) + Send> {
        Box::new(|_| {})
    }
}
