//! `--topology sink`: UDP transmit into a veth whose peer is down. The device drops what it
//! is given, as a NIC's driver releases what it has sent, so zero-copy pages are never
//! copied for local delivery and `MSG_ZEROCOPY` completions come back *without*
//! `SO_EE_CODE_ZEROCOPY_COPIED` — the transmit-side saving as real hardware would see it
//! (kernel-probe docs/measurements/kernel-findings.md §1: about half the sender CPU per GiB from a cold ring).
//!
//! Each send is one GSO super-datagram of `size` bytes (`UDP_SEGMENT` = MTU − 28, so no IP
//! fragmentation, which would force a copy), from a ring of `ring` pooled buffers. On the
//! zero-copy path a buffer is lent to the same [`Completions`] bookkeeping the TCP path
//! uses and returns to the ring when the kernel's completion covers its call.

use super::control::{merge, sink_report, WorkerOut, DATA_TIMEOUT};
use super::spec::{BenchError, Progress, RunSpec};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use zcnet::zc::Completions;
use zcnet::{FallbackReason, Pool, Stats, TxBuf};
use zcnet_bench::cpu::{thread_rusage, CpuSeconds, SystemCpu};
use zcnet_bench::histogram::LatencyHistogram;
use zcnet_bench::protocol::Limit;
use zcnet_bench::report::{Run, SideCpu, SideStats, SystemCpuTimes};
use zcnet_bench::touch;
use zcnet_sys::raw::socket;
use zcnet_sys::raw::udp_send;
use zcnet_sys::raw::zerocopy as zc;
use zcnet_testbed::netns::{Side, VethPair};

/// IPv4 + UDP headers.
const UDP4_HEADERS: u32 = 28;
/// Largest UDP payload (65535 − 8 − 20).
pub(crate) const MAX_UDP_PAYLOAD: u64 = 65507;
/// Segments one GSO send may carry (`UDP_MAX_SEGMENTS`, 64 on older kernels).
const MAX_SEGMENTS: u64 = 64;
/// The discard port: nothing listens (nothing could: the peer is down).
const DISCARD_PORT: u16 = 9;
/// Tries of a zero-copy send after `ENOBUFS`, each after reaping completions.
const ENOBUFS_RETRIES: u32 = 3;

/// Transmit paths the sink knows: copy and zero-copy UDP.
pub(crate) const SINK_TX: [&str; 2] = ["copy", "zerocopy"];

/// Checks a size against UDP's and GSO's limits for link MTU `mtu`.
pub(crate) fn check_size(size: u64, mtu: u32) -> Result<(), String> {
    let seg = u64::from(mtu.saturating_sub(UDP4_HEADERS)).max(1);
    if size > MAX_UDP_PAYLOAD {
        return Err(format!(
            "the sink sends UDP: {size} bytes per send exceeds the {MAX_UDP_PAYLOAD}-byte UDP payload limit"
        ));
    }
    if size.div_ceil(seg) > MAX_SEGMENTS {
        return Err(format!(
            "{size} bytes per send would be {} segments of {seg} at MTU {mtu}; GSO allows {MAX_SEGMENTS}",
            size.div_ceil(seg)
        ));
    }
    Ok(())
}

struct ZcState {
    completions: Completions<TxBuf>,
    entries: Vec<zc::ErrqueueEntry>,
}

impl ZcState {
    fn reap(&mut self, fd: BorrowedFd<'_>, stats: &Stats) -> Result<usize, BenchError> {
        self.entries.clear();
        zc::read_errqueue(fd, &mut self.entries)
            .map_err(|e| BenchError::io("recvmsg(MSG_ERRQUEUE)", e))?;
        let mut back = 0;
        for e in &self.entries {
            if let zc::ErrqueueEntry::Zerocopy { lo, hi, copied } = *e {
                stats.add_tx_notifications(1);
                let done = self
                    .completions
                    .complete(lo, hi)
                    .map_err(|e| BenchError::Failed(format!("zero-copy completion: {e}")))?;
                stats.add_tx_completed_calls(done.calls);
                if copied {
                    stats.add_tx_zc_copied_bytes(done.bytes);
                }
                back += done.released.len();
            }
        }
        Ok(back)
    }

    /// Waits (bounded) for the error queue to signal, then reaps.
    fn wait(
        &mut self,
        fd: BorrowedFd<'_>,
        stats: &Stats,
        d: Duration,
    ) -> Result<usize, BenchError> {
        let n = self.reap(fd, stats)?;
        if n > 0 || self.completions.is_idle() {
            return Ok(n);
        }
        match socket::poll(fd, zcnet_sys::raw::socket::PollFlags::empty(), Some(d)) {
            Ok(_) => self.reap(fd, stats),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => Ok(0),
            Err(e) => Err(BenchError::io("poll (error queue)", e)),
        }
    }
}

/// One sending socket.
fn stream(
    p: &zcnet_bench::protocol::Params,
    dst: SocketAddr,
    src: SocketAddr,
    gso: u16,
    quota: Option<u64>,
    deadline: Option<Instant>,
    progress: &Progress,
) -> Result<WorkerOut, BenchError> {
    let io = |ctx: &'static str| move |e| BenchError::io(ctx, e);
    let sock = UdpSocket::bind(src).map_err(io("bind (udp)"))?;
    sock.connect(dst).map_err(io("connect (udp)"))?;
    let fd = sock.as_fd();
    let stats = Stats::new();
    let want_zc = p.tx == "zerocopy";
    let zc_ok = want_zc && zc::set_so_zerocopy(fd).is_ok();
    let pool = Pool::new(p.ring as usize, p.size as usize).map_err(io("mmap (ring)"))?;
    let mut st = ZcState {
        completions: Completions::new(),
        entries: Vec::new(),
    };
    let mut hist = LatencyHistogram::new();
    let t0 = thread_rusage().map_err(io("getrusage"))?;
    let started = Instant::now();
    let mut sent = 0u64;
    let mut seq = 0u64;
    loop {
        let n = match (quota, deadline) {
            (Some(q), _) if sent >= q => break,
            (Some(q), _) => p.size.min(q - sent) as usize,
            (None, Some(d)) if Instant::now() >= d => break,
            _ => p.size as usize,
        };
        let mut b = match pool.try_take() {
            Some(b) => b,
            None => {
                stats.add_pool_waits(1);
                let until = Instant::now() + DATA_TIMEOUT;
                loop {
                    st.wait(fd, &stats, Duration::from_millis(10))?;
                    if let Some(b) = pool.try_take() {
                        break b;
                    }
                    if Instant::now() >= until {
                        return Err(BenchError::Failed(format!(
                            "no ring buffer came back within {DATA_TIMEOUT:?}: the kernel holds all {}",
                            p.ring
                        )));
                    }
                }
            }
        };
        seq += 1;
        if p.touch {
            touch::write_words(&mut b.storage_mut()[..n], seq);
        }
        b.set_len(n);
        let seg = (n > usize::from(gso)).then_some(gso);
        let t = Instant::now();
        let mut zc_now = zc_ok;
        let mut enobufs = 0;
        loop {
            match udp_send::send_gso(fd, &b, zc_now, seg) {
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) && zc_now => {
                    stats.add_tx_enobufs(1);
                    enobufs += 1;
                    if enobufs > ENOBUFS_RETRIES {
                        stats.fallback(FallbackReason::Enobufs, n as u64);
                        zc_now = false;
                    } else {
                        st.wait(fd, &stats, Duration::from_millis(1 << enobufs))?;
                    }
                }
                Err(e) => return Err(BenchError::io("sendmsg (udp)", e)),
            }
        }
        hist.record(t.elapsed());
        if zc_now {
            stats.add_tx_zerocopy_bytes(n as u64);
            stats.add_tx_zerocopy_calls(1);
            let id = st.completions.record_call(n);
            drop(st.completions.lend(b, id, id));
            // Reap lazily: only when the ring runs low. Completions of consecutive sends
            // merge into one error-queue entry while unread, so a deep ring costs one
            // recvmsg per many sends instead of one per send (a per-send reap would add
            // ~1 µs to every 60K send, a sixth of its cost).
            if pool.available() * 4 < p.ring as usize {
                st.reap(fd, &stats)?;
            }
        } else {
            if want_zc && !zc_ok {
                stats.fallback(FallbackReason::Unsupported, n as u64);
            }
            stats.add_tx_copy_bytes(n as u64);
            stats.add_tx_copy_calls(1);
            drop(b);
        }
        sent += n as u64;
        progress.bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
    // Every buffer back before the clock stops: completion handling is part of the cost.
    let until = Instant::now() + DATA_TIMEOUT;
    while !st.completions.is_idle() {
        if Instant::now() >= until {
            let held = st.completions.abandon().len();
            return Err(BenchError::Failed(format!(
                "{held} zero-copy sends were never completed by the kernel"
            )));
        }
        st.wait(fd, &stats, Duration::from_millis(10))?;
    }
    let ended = Instant::now();
    let c = CpuSeconds::between(t0, thread_rusage().map_err(io("getrusage"))?);
    Ok(WorkerOut {
        bytes_sent: sent,
        cpu: SideCpu {
            user: c.user,
            sys: c.sys,
        },
        stats: SideStats::from(&stats.snapshot()),
        send: hist,
        started: Some(started),
        ended: Some(ended),
        ..Default::default()
    })
}

/// Runs `spec` into the sink. Called on a thread inside namespace `a`.
pub(crate) fn run(pair: &VethPair, spec: &RunSpec, progress: &Progress) -> Result<Run, BenchError> {
    let p = &spec.params;
    if !SINK_TX.contains(&p.tx.as_str()) {
        return Err(BenchError::Usage(format!(
            "the sink topology sends UDP and knows transmit paths {}, not {:?}",
            SINK_TX.join(", "),
            p.tx
        )));
    }
    let mtu = pair.mtu();
    check_size(p.size, mtu).map_err(BenchError::Usage)?;
    let gso = (mtu - UDP4_HEADERS).min(u32::from(u16::MAX)) as u16;
    let dst = SocketAddr::new(pair.addr(Side::B).into(), DISCARD_PORT);
    let src = SocketAddr::new(pair.addr(Side::A).into(), 0);
    let n = u64::from(p.streams);
    let start = Instant::now();
    let (quotas, deadline): (Vec<Option<u64>>, Option<Instant>) = match p.limit {
        Limit::Bytes(total) => (
            (0..n)
                .map(|i| Some(total / n + u64::from(i < total % n)))
                .collect(),
            None,
        ),
        Limit::Seconds(s) => (
            vec![None; n as usize],
            Some(start + Duration::from_secs_f64(s)),
        ),
    };
    let sys0 = SystemCpu::now();
    let outs: Vec<Result<WorkerOut, BenchError>> = std::thread::scope(|s| {
        let hs: Vec<_> = quotas
            .iter()
            .map(|&q| s.spawn(move || stream(p, dst, src, gso, q, deadline, progress)))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(BenchError::Failed("a sender thread panicked".into())))
            })
            .collect()
    });
    let system = SystemCpuTimes::since(sys0).unwrap_or_default();
    let outs = outs.into_iter().collect::<Result<Vec<_>, _>>()?;
    let r = merge(outs);
    Ok(sink_report(spec, r, start, system, mtu, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_that_udp_and_gso_cannot_carry_are_refused() {
        assert!(check_size(1472, 1500).is_ok());
        assert!(check_size(65507, 1500).is_ok());
        assert!(check_size(65508, 1500)
            .unwrap_err()
            .contains("UDP payload limit"));
        assert!(check_size(65507, 600).unwrap_err().contains("GSO allows"));
        assert!(check_size(32768, 9000).is_ok());
    }
}
