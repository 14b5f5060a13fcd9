//! Shared by the integration tests: connected pairs on a topology, checked byte patterns.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::{TcpListener, TcpStream};
use zcnet_testbed::pattern::{pattern, Verifier};
use zcnet_testbed::topo::Topo;
use zcnet_tokio::{ZcConfig, ZcStream};

/// `len` bytes of the checked pattern starting at stream offset `pos`.
pub fn pattern_vec(pos: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut off = 0;
    while off < len {
        let n = (len - off).min(4 << 20);
        v.extend_from_slice(pattern(pos + off as u64, n));
        off += n;
    }
    v
}

/// Reads `r` to its end, checking every byte against the pattern; returns the count.
pub async fn read_verified(r: impl AsyncRead + Unpin) -> std::io::Result<u64> {
    read_verified_counting(r, &Progress::default()).await
}

/// [`read_verified`], adding each read's bytes to `progress` (for [`bounded_by_progress`]).
pub async fn read_verified_counting(
    mut r: impl AsyncRead + Unpin,
    progress: &Progress,
) -> std::io::Result<u64> {
    let mut v = Verifier::default();
    let mut buf = vec![0u8; 256 << 10];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok(v.pos);
        }
        v.check(&buf[..n]);
        progress.add(n as u64);
    }
}

/// A count of steps a transfer took (bytes read, sends returned), shared with the task that
/// makes them, for [`bounded_by_progress`].
#[derive(Debug, Clone, Default)]
pub struct Progress(Arc<AtomicU64>);

impl Progress {
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// How long [`bounded_by_progress`] lets its counts stand still before it calls it a hang.
pub const STILL_FOR: Duration = Duration::from_secs(20);

/// Awaits `fut`, failing the test if none of `progress` moves for [`STILL_FOR`]: a wait that
/// would never end (a lost wake-up, a completion that never comes) stops every count, and
/// fails where it hangs, with `what` and the host's TCP sockets printed. Unlike [`bounded`],
/// it cannot fire for a transfer that is merely slow (a loaded host): any step restarts
/// the clock.
pub async fn bounded_by_progress<F: std::future::Future>(
    what: impl std::fmt::Display,
    progress: &[&Progress],
    fut: F,
) -> F::Output {
    tokio::pin!(fut);
    let count = || progress.iter().map(|p| p.get()).sum::<u64>();
    let mut last = count();
    let mut since = Instant::now();
    loop {
        tokio::select! {
            v = &mut fut => return v,
            _ = tokio::time::sleep(Duration::from_millis(250)) => {
                let now = count();
                if now != last {
                    last = now;
                    since = Instant::now();
                } else if since.elapsed() >= STILL_FOR {
                    let _ = std::process::Command::new("ss").arg("-tnie").status();
                    panic!("no progress for {} s (at step {now}): {what}", STILL_FOR.as_secs());
                }
            }
        }
    }
}

/// A listener on the topology's receiving side (namespace `b`, or loopback).
pub fn listener(topo: Topo<'_>) -> TcpListener {
    let l = topo.on_receiver(|| std::net::TcpListener::bind(topo.receiver_addr(0)).unwrap());
    l.set_nonblocking(true).unwrap();
    TcpListener::from_std(l).unwrap()
}

/// A connection from the topology's sending side to `addr`, as a plain tokio stream.
pub fn connect_plain(topo: Topo<'_>, addr: SocketAddr) -> TcpStream {
    let s = topo.on_sender(|| std::net::TcpStream::connect(addr).unwrap());
    s.set_nonblocking(true).unwrap();
    TcpStream::from_std(s).unwrap()
}

/// A `ZcStream` sending from the topology's sending side, and the receiving end.
pub async fn pair(topo: Topo<'_>, config: ZcConfig) -> (ZcStream, TcpStream) {
    let l = listener(topo);
    let addr = l.local_addr().unwrap();
    let s = connect_plain(topo, addr);
    let (r, _) = l.accept().await.unwrap();
    (ZcStream::from_tokio(s, config).unwrap(), r)
}

/// A buffer whose drop is observable: it records how many zero-copy calls the kernel had
/// completed on its stream at the moment it was dropped.
pub struct Watched {
    data: Vec<u8>,
    stats: std::sync::Arc<zcnet::Stats>,
    log: std::sync::Arc<std::sync::Mutex<Option<u64>>>,
}

/// What a [`Watched`] saw when it was dropped: `None` while it is alive.
pub type DropLog = std::sync::Arc<std::sync::Mutex<Option<u64>>>;

impl Watched {
    pub fn new(data: Vec<u8>, stats: std::sync::Arc<zcnet::Stats>) -> (Watched, DropLog) {
        let log = DropLog::default();
        (
            Watched {
                data,
                stats,
                log: log.clone(),
            },
            log,
        )
    }
}

impl zcnet::Lend for Watched {
    fn bytes(&self) -> &[u8] {
        &self.data
    }
}

impl AsRef<[u8]> for Watched {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        *self.log.lock().unwrap() = Some(self.stats.snapshot().tx_completed_calls);
    }
}

/// A pair whose receiving end keeps tiny buffers, so a sender stalls (and its zero-copy
/// pages stay in flight) for as long as the receiver does not read.
pub async fn stalled_pair(config: ZcConfig) -> (ZcStream, TcpStream) {
    let l = tokio::net::TcpSocket::new_v4().unwrap();
    l.set_recv_buffer_size(16 << 10).unwrap();
    l.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let l = l.listen(8).unwrap();
    let addr = l.local_addr().unwrap();
    let c = tokio::net::TcpSocket::new_v4().unwrap();
    c.set_send_buffer_size(64 << 10).unwrap();
    let (s, r) = tokio::join!(c.connect(addr), l.accept());
    (
        ZcStream::from_tokio(s.unwrap(), config).unwrap(),
        r.unwrap().0,
    )
}

/// Awaits `fut`, failing the test if it takes more than 20 s: a wait that would never end
/// (a lost wake-up, a completion that never comes) fails where it hangs, with `what` and
/// the host's TCP sockets (`ss -tnie`: queues, windows, timers) printed, instead of
/// stalling the whole run.
pub async fn bounded<F: std::future::Future>(what: impl std::fmt::Display, fut: F) -> F::Output {
    match tokio::time::timeout(std::time::Duration::from_secs(20), fut).await {
        Ok(v) => v,
        Err(_) => {
            let _ = std::process::Command::new("ss").arg("-tnie").status();
            panic!("hung for 20 s: {what}");
        }
    }
}
