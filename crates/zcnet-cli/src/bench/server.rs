//! `zcnet bench --server`: answers one client run at a time (as iperf3 does, so runs do not
//! disturb each other's measurements). For each control connection: read the hello, reject
//! what this build cannot run (with the reason, logged here and sent there), open a data
//! listener on the control connection's own address, receive (or echo) on `streams`
//! connections, and send this side's measurements back. A UDP message run (`hello_udp`) is
//! served by [`super::udp::serve`].
//!
//! One client cannot deny the server to others: each client's hello is read on its own
//! short-lived thread, whole within [`HELLO_DEADLINE`] (not merely a byte per read timeout);
//! only a valid hello takes the one run slot, and a client that comes while a run holds it
//! gets `Reject` with "busy" and who holds it (its hello read and answered, so it never runs
//! later as a ghost); and a client whose control connection closes (FIN seen with
//! `POLLRDHUP`) releases the slot at once and stops its run: the run's sockets are shut
//! down ([`Cancel`]), so its thread ends and frees its buffers within one wait, and no
//! abandoned run ever makes the server answer others "busy".
//!
//! An `accept` that fails for want of descriptors backs off instead of spinning, and logs a
//! line a second at most ([`AcceptBackoff`]); a thread that cannot be started turns that
//! client away, not the server.

use super::backoff::{AcceptBackoff, LogLimit};
use super::control::{server_log, Cancel, CONTROL_TIMEOUT};
use super::spec::{BenchError, Transport};
use super::{lm, tcp, udp};
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
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

/// Time a client has to send its whole hello.
pub(crate) const HELLO_DEADLINE: Duration = Duration::from_secs(3);
/// Clients in their hello at once (each a short-lived thread); more are closed at once.
const MAX_GREETING: usize = 16;
/// How long a client whose hello is in waits for a run that is ending before "busy".
const BUSY_WAIT: Duration = Duration::from_secs(2);

/// The run holding the slot: its id, its client, a second handle on its control connection
/// (watched for the client's FIN), and what stops it when the client goes.
type Current = Option<(u64, SocketAddr, TcpStream, Arc<Cancel>)>;

/// The one run in progress, shared by the greeting threads and the accept loop.
#[derive(Default)]
struct RunSlot {
    current: std::sync::Mutex<Current>,
    /// Signalled when the slot frees.
    freed: std::sync::Condvar,
    next_id: AtomicUsize,
    /// Greeting threads alive.
    greeting: AtomicUsize,
}

impl RunSlot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the slot for a client whose hello is in, or says who has it. A run that is
    /// just ending (its result sent, its thread not yet back) is waited for up to
    /// [`BUSY_WAIT`], so back-to-back runs of one client (`tune`, suites) are not turned away.
    fn claim(&self, peer: SocketAddr, c: &TcpStream, cancel: &Arc<Cancel>) -> Result<u64, String> {
        let until = Instant::now() + BUSY_WAIT;
        let mut cur = self.lock();
        while cur.is_some() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            cur = self
                .freed
                .wait_timeout(cur, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        if let Some((_, other, _, _)) = &*cur {
            return Err(format!(
                "busy: the server is running another client's test (from {other}); try again when it ends"
            ));
        }
        let ctrl = c.try_clone().map_err(|e| format!("busy: {e}"))?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) as u64;
        *cur = Some((id, peer, ctrl, cancel.clone()));
        Ok(id)
    }

    /// The run `id` ended: frees the slot, unless its client's departure already did.
    fn release(&self, id: u64) {
        let mut cur = self.lock();
        if cur.as_ref().is_some_and(|(i, _, _, _)| *i == id) {
            *cur = None;
            self.freed.notify_all();
        }
    }

    /// Releases and stops the run whose client closed its control connection.
    fn release_vanished(&self, log: bool) {
        use zcnet_sys::raw::socket::{poll, PollFlags};
        let mut cur = self.lock();
        let gone = cur.as_ref().is_some_and(|(_, _, ctrl, _)| {
            matches!(
                poll(ctrl.as_fd(), PollFlags::RDHUP, Some(Duration::ZERO)),
                Ok(ev) if ev.intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR)
            )
        });
        if gone {
            if let Some((_, peer, _, cancel)) = cur.take() {
                cancel.cancel();
                self.freed.notify_all();
                server_log(
                    log,
                    format_args!("client {peer} went away; its run is stopped and released"),
                );
            }
        }
    }
}

/// Reads with one deadline for the whole message, not one per `read`.
struct Deadline<'a> {
    s: &'a TcpStream,
    until: Instant,
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no whole hello within {} s", HELLO_DEADLINE.as_secs()),
            ));
        }
        self.s.set_read_timeout(Some(left))?;
        (&mut &*self.s).read(buf)
    }
}

/// Serves runs on `listener` until `stop` is set (checked every 100 ms) or, with `once`,
/// after one run.
pub(crate) fn serve(
    listener: &TcpListener,
    stop: &AtomicBool,
    opts: ServeOptions,
) -> Result<(), BenchError> {
    let slot = Arc::new(RunSlot::default());
    let mut backoff = AcceptBackoff::default();
    let mut spawn_log = LogLimit::default();
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        slot.release_vanished(opts.log);
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
            Ok(x) => {
                backoff.succeeded();
                x
            }
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            // EMFILE, ECONNABORTED, ENOBUFS…: that client is lost, the server is not; out of
            // descriptors it waits (the listener stays readable: no spinning on it).
            Err(e) if !opts.once => {
                let (wait, line) = backoff.failed(&e, Instant::now());
                if let Some(l) = line {
                    server_log(opts.log, format_args!("{l} (control)"));
                }
                std::thread::sleep(wait);
                continue;
            }
            Err(e) => return Err(BenchError::io("accept (control)", e)),
        };
        if opts.once {
            let result = handle(conn, peer, opts, &slot);
            if let Err(e) = &result {
                server_log(opts.log, format_args!("run from {peer} failed: {e}"));
            }
            return result;
        }
        if slot.greeting.load(Ordering::Relaxed) >= MAX_GREETING {
            continue; // closed: too many clients in their hello at once
        }
        slot.greeting.fetch_add(1, Ordering::Relaxed);
        let s = slot.clone();
        let spawned = std::thread::Builder::new()
            .name("bench client".into())
            .spawn(move || {
                if let Err(e) = handle(conn, peer, opts, &s) {
                    server_log(opts.log, format_args!("run from {peer} failed: {e}"));
                }
            });
        if let Err(e) = spawned {
            slot.greeting.fetch_sub(1, Ordering::Relaxed);
            if let Some(l) = spawn_log.line(
                Instant::now(),
                format_args!("cannot serve {peer}: no thread for it: {e}"),
            ) {
                server_log(opts.log, format_args!("{l}"));
            }
        }
    }
}

fn names<T: Copy>(all: &[T], name: fn(T) -> &'static str) -> Vec<&'static str> {
    all.iter().map(|&p| name(p)).collect()
}

/// One client: its hello (within [`HELLO_DEADLINE`]), then its run if the slot is free, or
/// `Reject` with "busy".
fn handle(
    mut c: TcpStream,
    peer: SocketAddr,
    opts: ServeOptions,
    slot: &RunSlot,
) -> Result<(), BenchError> {
    let io = |ctx: &'static str| move |e| BenchError::io(ctx, e);
    let cancel = Arc::new(Cancel::default());
    cancel.watch(c.as_fd());
    let greeted = (|| {
        c.set_write_timeout(Some(CONTROL_TIMEOUT))
            .map_err(io("control socket"))?;
        c.set_nodelay(true).map_err(io("control socket"))?;
        let tx_names = names(&TxPath::ALL, TxPath::name);
        let mut rx_names = names(&RxPath::ALL, RxPath::name);
        rx_names.push(super::files::FILE);
        let hello = protocol::read_message(&mut Deadline {
            s: &c,
            until: Instant::now() + HELLO_DEADLINE,
        });
        c.set_read_timeout(Some(CONTROL_TIMEOUT))
            .map_err(io("control socket"))?;
        let refused = match protocol::answer_hello(hello, &tx_names, &rx_names) {
            Ok(req) => match slot.claim(peer, &c, &cancel) {
                Ok(id) => return Ok((req, id)),
                Err(busy) => busy,
            },
            Err(reason) => reason.0,
        };
        let _ = protocol::write_message(
            &mut c,
            &Message::Reject {
                reason: refused.clone(),
            },
        );
        Err(BenchError::Rejected(refused))
    })();
    slot.greeting.fetch_sub(1, Ordering::Relaxed);
    let (req, id) = greeted?;
    let proto = if req.udp.is_some() {
        Proto::Udp
    } else {
        Proto::Tcp
    };
    let result = match Transport::of(proto, &req.params) {
        Transport::Tcp => tcp::serve(c, peer, req.params, opts.log, &cancel),
        Transport::Udp => udp::serve(c, peer, req, opts.log),
        Transport::Lm => lm::serve(c, peer, req, opts.log),
    };
    slot.release(id);
    result
}
