//! What this host can do, found by trying: every check opens real sockets, rings or
//! userfaultfds and reports what the kernel did — never what a version number suggests.
//!
//! Each check runs on its own thread under a deadline ([`CHECK_LIMIT`], every blocking step
//! inside it bounded by [`STEP_TIMEOUT`]), so a kernel that stalls or a check that panics is
//! reported as [`Status::No`] with the reason instead of hanging or killing the caller.
//! Statuses mean: [`Status::Yes`] — works as intended; [`Status::Partial`] — works, with a
//! caveat the detail names (for example local delivery copies anyway, docs/measurements/kernel-findings.md §1);
//! [`Status::No`] — refused or broken, with the errno or the reason.
//!
//! Traffic goes over 127.0.0.1 of the calling thread's network namespace, so run the probe
//! in the namespace you care about (a fresh namespace has its loopback down).

use serde::Serialize;
use std::fmt;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use zcnet::stats::StatsSnapshot;
use zcnet::stream::Listener;
use zcnet::Error;
use zcnet::RxPath;
use zcnet::TxPath;
use zcnet::{Policy, ReceiverConfig, Sender, SenderConfig};
use zcnet_sys::cow::uffd::{self, RegisterMode, Userfaultfd};
use zcnet_sys::mem::{page_size, PageBuf};
use zcnet_sys::raw::socket;
use zcnet_sys::raw::splice;
use zcnet_sys::raw::udp;
use zcnet_sys::raw::zcrecv::SocketMap;
use zcnet_sys::raw::zerocopy as zc;

/// Bound on each blocking step of a check (accept, one send, one receive, one flush).
pub const STEP_TIMEOUT: Duration = Duration::from_millis(2000);
/// Bound on a whole check; past it the check is reported as [`Status::No`].
pub const CHECK_LIMIT: Duration = Duration::from_millis(3000);

/// Every check, in the order [`run`] reports them.
pub const CHECKS: [&str; 27] = [
    "so_zerocopy_tcp",
    "so_zerocopy_udp",
    "msg_zerocopy_tcp_loopback",
    "tcp_zerocopy_receive",
    "sendfile",
    "splice",
    "io_uring",
    "io_uring_send_zc",
    "io_uring_sendmsg_zc",
    "io_uring_recv_zc",
    "io_uring_fixed_buffers",
    "io_uring_buf_ring",
    "io_uring_zcrx",
    "userfaultfd_wp",
    "udp_gso",
    "udp_gro",
    "optmem_max",
    "rlimit_memlock",
    "ktls",
    "af_xdp_socket",
    "af_xdp_umem_aligned",
    "af_xdp_umem_unaligned",
    "af_xdp_bind_zerocopy",
    "af_xdp_bind_copy",
    "xdp_attach_native",
    "xdp_attach_generic",
    "lm_xdp_program",
];

/// What the host supports.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Report {
    /// `uname -r`, from `/proc/sys/kernel/osrelease`.
    pub kernel: String,
    /// One entry per name in [`CHECKS`], in that order.
    pub checks: Vec<Check>,
}

/// The outcome of one check.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Stable snake_case name (one of [`CHECKS`]).
    pub name: &'static str,
    /// Yes, no or partial.
    pub status: Status,
    /// What was tried and what the kernel answered (errno, fractions, sizes).
    pub detail: String,
}

/// Whether a feature works here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Works as intended.
    Yes,
    /// Refused or broken (the detail has the errno or reason).
    No,
    /// Works, with a caveat the detail names (e.g. local delivery copies).
    Partial,
}

impl Status {
    /// The name used in the table and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Status::Yes => "yes",
            Status::No => "no",
            Status::Partial => "partial",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Check {
    fn new(name: &'static str, status: Status, detail: impl Into<String>) -> Check {
        Check {
            name,
            status,
            detail: detail.into(),
        }
    }

    fn yes(name: &'static str, detail: impl Into<String>) -> Check {
        Check::new(name, Status::Yes, detail)
    }

    fn no(name: &'static str, detail: impl Into<String>) -> Check {
        Check::new(name, Status::No, detail)
    }
}

#[cfg(test)]
impl Report {
    /// The check called `name`.
    pub fn get(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }
}

/// The human table: a kernel line, then aligned `check  result  detail` columns.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "kernel {}", self.kernel)?;
        writeln!(f)?;
        let w_name = self
            .checks
            .iter()
            .map(|c| c.name.len())
            .chain([5])
            .max()
            .unwrap_or(5);
        let w_res = self
            .checks
            .iter()
            .map(|c| c.status.name().len())
            .chain([6])
            .max()
            .unwrap_or(6);
        writeln!(f, "{:<w_name$}  {:<w_res$}  detail", "check", "result")?;
        for c in &self.checks {
            writeln!(
                f,
                "{:<w_name$}  {:<w_res$}  {}",
                c.name,
                c.status.name(),
                c.detail
            )?;
        }
        Ok(())
    }
}

/// Runs every check (sequentially, each under [`CHECK_LIMIT`]) and reports them in the order
/// of [`CHECKS`]. Never panics and never blocks much longer than the sum of the limits.
pub fn run() -> Report {
    let mut checks = Vec::with_capacity(CHECKS.len());
    checks.push(bounded(&["so_zerocopy_tcp"], || {
        vec![so_zerocopy("so_zerocopy_tcp", socket2::Type::STREAM)]
    }));
    checks.push(bounded(&["so_zerocopy_udp"], || {
        vec![so_zerocopy("so_zerocopy_udp", socket2::Type::DGRAM)]
    }));
    checks.push(bounded(&["msg_zerocopy_tcp_loopback"], || {
        vec![msg_zerocopy_tcp_loopback()]
    }));
    checks.push(bounded(&["tcp_zerocopy_receive"], || {
        vec![tcp_zerocopy_receive()]
    }));
    checks.push(bounded(&["sendfile"], || vec![sendfile_check()]));
    checks.push(bounded(&["splice"], || vec![splice_check()]));
    checks.push(bounded(&IO_URING_CHECKS, io_uring_checks));
    checks.push(bounded(&["io_uring_fixed_buffers"], || {
        vec![io_uring_fixed_buffers()]
    }));
    checks.push(bounded(
        &["io_uring_buf_ring"],
        || vec![io_uring_buf_ring()],
    ));
    checks.push(bounded(&["io_uring_zcrx"], || vec![io_uring_zcrx()]));
    checks.push(bounded(&["userfaultfd_wp"], || vec![userfaultfd_wp()]));
    checks.push(bounded(&["udp_gso"], || vec![udp_gso()]));
    checks.push(bounded(&["udp_gro"], || vec![udp_gro()]));
    checks.push(bounded(&["optmem_max"], || vec![optmem_max()]));
    checks.push(bounded(&["rlimit_memlock"], || vec![rlimit_memlock()]));
    checks.push(bounded(&["ktls"], || vec![ktls_check()]));
    checks.push(bounded(&XSK_CHECKS, xsk_checks));
    checks.push(bounded(&XSK_VETH_CHECKS, xsk_veth_checks));
    checks.push(bounded(&["lm_xdp_program"], || vec![lm_program_check()]));
    Report {
        kernel: match std::fs::read_to_string("/proc/sys/kernel/osrelease") {
            Ok(s) => s.trim().to_string(),
            Err(e) => format!("unknown ({})", os_err("/proc/sys/kernel/osrelease", &e)),
        },
        checks: checks.into_iter().flatten().collect(),
    }
}

/// Runs `f` on its own thread and waits at most [`CHECK_LIMIT`]. Returns exactly one check
/// per name in `names`: what `f` reported, or `No` with why it did not (deadline, panic).
/// A thread past its deadline is left to finish on its own; its steps are bounded too.
fn bounded(names: &[&'static str], f: impl FnOnce() -> Vec<Check> + Send + 'static) -> Vec<Check> {
    bounded_by(CHECK_LIMIT, names, f)
}

/// [`bounded`] with the deadline as a parameter, so its test can tell a panic from a
/// deadline without racing one against the other: a panicking check's report comes after
/// the panic hook has run, and with `RUST_BACKTRACE` set that hook symbolises a backtrace
/// from the binary's debug information, which took more than 3 s on a loaded machine.
fn bounded_by(
    limit: Duration,
    names: &[&'static str],
    f: impl FnOnce() -> Vec<Check> + Send + 'static,
) -> Vec<Check> {
    let fail_all = |why: String| names.iter().map(|&n| Check::no(n, why.clone())).collect();
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name(format!(
            "zcnet-probe-{}",
            names.first().copied().unwrap_or("?")
        ))
        .spawn(move || {
            let _ = tx.send(f());
        });
    let handle = match spawned {
        Ok(h) => h,
        Err(e) => {
            return fail_all(format!(
                "could not start the check: {}",
                os_err("spawn", &e)
            ))
        }
    };
    let got = match rx.recv_timeout(limit) {
        Ok(checks) => {
            let _ = handle.join();
            checks
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            return fail_all(format!("no answer within {} ms", limit.as_millis()))
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            let why = match handle.join() {
                Err(p) => p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into()),
                Ok(()) => "ended without a result".into(),
            };
            return fail_all(format!("the check panicked: {why}"));
        }
    };
    names
        .iter()
        .map(|&n| {
            got.iter()
                .find(|c| c.name == n)
                .cloned()
                .unwrap_or_else(|| Check::no(n, "the check did not report this item"))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Formatting and decisions (pure).

/// The symbolic name of an errno this probe may meet.
pub fn errno_name(code: i32) -> Option<&'static str> {
    const NAMES: &[(i32, &str)] = &[
        (libc::EPERM, "EPERM"),
        (libc::ENOENT, "ENOENT"),
        (libc::EINTR, "EINTR"),
        (libc::EIO, "EIO"),
        (libc::EBADF, "EBADF"),
        (libc::EAGAIN, "EAGAIN"),
        (libc::ENOMEM, "ENOMEM"),
        (libc::EACCES, "EACCES"),
        (libc::EFAULT, "EFAULT"),
        (libc::EBUSY, "EBUSY"),
        (libc::EEXIST, "EEXIST"),
        (libc::ENODEV, "ENODEV"),
        (libc::EINVAL, "EINVAL"),
        (libc::ENFILE, "ENFILE"),
        (libc::EMFILE, "EMFILE"),
        (libc::ENOSPC, "ENOSPC"),
        (libc::EPIPE, "EPIPE"),
        (libc::ERANGE, "ERANGE"),
        (libc::ENOSYS, "ENOSYS"),
        (libc::ENOTSOCK, "ENOTSOCK"),
        (libc::EMSGSIZE, "EMSGSIZE"),
        (libc::ENOPROTOOPT, "ENOPROTOOPT"),
        (libc::EPROTONOSUPPORT, "EPROTONOSUPPORT"),
        (libc::EOPNOTSUPP, "EOPNOTSUPP"),
        (libc::EAFNOSUPPORT, "EAFNOSUPPORT"),
        (libc::EADDRINUSE, "EADDRINUSE"),
        (libc::EADDRNOTAVAIL, "EADDRNOTAVAIL"),
        (libc::ENETDOWN, "ENETDOWN"),
        (libc::ENETUNREACH, "ENETUNREACH"),
        (libc::ECONNABORTED, "ECONNABORTED"),
        (libc::ECONNRESET, "ECONNRESET"),
        (libc::ENOBUFS, "ENOBUFS"),
        (libc::ENOTCONN, "ENOTCONN"),
        (libc::ETIMEDOUT, "ETIMEDOUT"),
        (libc::ECONNREFUSED, "ECONNREFUSED"),
        (libc::EHOSTUNREACH, "EHOSTUNREACH"),
    ];
    NAMES.iter().find(|(c, _)| *c == code).map(|(_, n)| *n)
}

/// `"op: ENAME (errno N)"`, or the error's text when it carries no errno.
pub fn os_err(op: &str, e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(code) => match errno_name(code) {
            Some(name) => format!("{op}: {name} (errno {code})"),
            None => format!("{op}: errno {code} ({e})"),
        },
        None => format!("{op}: {e}"),
    }
}

/// A library error as a detail: OS errors with their errno name.
fn err_detail(e: &Error) -> String {
    match e {
        Error::Io { op, source } => os_err(op, source),
        other => other.to_string(),
    }
}

/// A fraction as a percentage with one decimal, without it for exactly 0% and 100%.
pub fn fmt_pct(f: f64) -> String {
    let p = (f * 1000.0).round() / 10.0;
    if p == 0.0 || p == 100.0 {
        format!("{p:.0}%")
    } else {
        format!("{p:.1}%")
    }
}

fn fallbacks_text(s: &StatsSnapshot) -> String {
    if s.fallbacks.is_empty() {
        return "no fallbacks".into();
    }
    let parts: Vec<String> = s
        .fallbacks
        .iter()
        .map(|(r, ops, bytes)| {
            format!(
                "{}: {ops} ops, {}",
                r.name(),
                zcnet::stats::fmt_bytes(*bytes)
            )
        })
        .collect();
    format!("fallbacks {}", parts.join("; "))
}

/// Status of a `MSG_ZEROCOPY` transfer from the sender's counters.
fn judge_zc_send(s: &StatsSnapshot) -> (Status, String) {
    if s.tx_bytes_zerocopy == 0 {
        return (
            Status::No,
            format!("no send went out with MSG_ZEROCOPY ({})", fallbacks_text(s)),
        );
    }
    if s.tx_completed_calls == 0 {
        return (
            Status::No,
            format!(
                "{} MSG_ZEROCOPY sends, but no completion arrived on the error queue",
                s.tx_calls_zerocopy
            ),
        );
    }
    let base = format!(
        "{}/{} sends completed in {} notification(s), {} sent",
        s.tx_completed_calls,
        s.tx_calls_zerocopy,
        s.tx_notifications,
        zcnet::stats::fmt_bytes(s.tx_bytes_zerocopy)
    );
    let copied = s.tx_bytes_zc_copied as f64 / s.tx_bytes_zerocopy as f64;
    if s.tx_bytes_zc_copied == 0 {
        (
            Status::Yes,
            format!("completions without COPIED: pages went out uncopied; {base}"),
        )
    } else if s.tx_bytes_zc_copied >= s.tx_bytes_zerocopy {
        (
            Status::Partial,
            format!("local delivery copies (SO_EE_CODE_ZEROCOPY_COPIED on 100% of bytes); {base}"),
        )
    } else {
        (
            Status::Partial,
            format!(
                "kernel copied {} of bytes anyway (SO_EE_CODE_ZEROCOPY_COPIED); {base}",
                fmt_pct(copied)
            ),
        )
    }
}

/// Status of a `TCP_ZEROCOPY_RECEIVE` transfer from the share of bytes mapped.
fn judge_mapped(mapped: u64, total: u64) -> Status {
    if total == 0 || mapped == 0 {
        Status::No
    } else if mapped * 2 > total {
        Status::Yes
    } else {
        Status::Partial
    }
}

/// What a sequence of reads looked like: `1 read of 4000 B (gso_size 1000)`,
/// `4 reads of 1000 B (no UDP_GRO cmsg)`; runs of equal reads are grouped.
fn describe_reads(reads: &[(usize, Option<u16>)]) -> String {
    if reads.is_empty() {
        return "nothing arrived".into();
    }
    let mut groups: Vec<(usize, (usize, Option<u16>))> = Vec::new();
    for &r in reads {
        match groups.last_mut() {
            Some((n, last)) if *last == r => *n += 1,
            _ => groups.push((1, r)),
        }
    }
    groups
        .iter()
        .map(|(n, (len, gso))| {
            let reads = if *n == 1 { "read" } else { "reads" };
            let cmsg = match gso {
                Some(g) => format!("gso_size {g}"),
                None => "no UDP_GRO cmsg".into(),
            };
            format!("{n} {reads} of {len} B ({cmsg})")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// GSO works when one send of `total` bytes with segment size `seg` arrives as datagrams of
/// `seg` bytes (the last one shorter).
fn judge_gso(sizes: &[usize], seg: usize, total: usize) -> Status {
    let expected: Vec<usize> = (0..total.div_ceil(seg))
        .map(|i| seg.min(total - i * seg))
        .collect();
    if sizes == expected.as_slice() {
        Status::Yes
    } else {
        Status::No
    }
}

/// GRO works when some read carried the `UDP_GRO` cmsg and more than one segment; it is
/// partial when the option was accepted but every datagram came separately.
fn judge_gro(reads: &[(usize, Option<u16>)], total: usize) -> Status {
    let got: usize = reads.iter().map(|r| r.0).sum();
    if reads
        .iter()
        .any(|&(len, g)| g.is_some_and(|g| len > usize::from(g)))
    {
        Status::Yes
    } else if got == total {
        Status::Partial
    } else {
        Status::No
    }
}

/// Test data: byte `i` of a stream is `i % 251`, so a misplaced page (4096 ≢ 0 mod 251) or a
/// lost chunk is caught. Slices come from one precomputed table.
struct Pattern {
    table: Vec<u8>,
    max: usize,
}

const PERIOD: usize = 251;

impl Pattern {
    fn new(max: usize) -> Pattern {
        Pattern {
            table: (0..max + PERIOD).map(|i| (i % PERIOD) as u8).collect(),
            max,
        }
    }

    /// Stream bytes `off..off+len`; `len` at most `max`.
    fn slice(&self, off: u64, len: usize) -> &[u8] {
        let s = (off % PERIOD as u64) as usize;
        &self.table[s..s + len.min(self.max)]
    }

    /// Stream offset of the first byte of `data` (at stream offset `off`) that is wrong.
    fn first_mismatch(&self, off: u64, data: &[u8]) -> Option<u64> {
        let mut at = 0usize;
        for piece in data.chunks(self.max.max(1)) {
            let want = self.slice(off + at as u64, piece.len());
            if piece != want {
                let i = piece
                    .iter()
                    .zip(want)
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                return Some(off + (at + i) as u64);
            }
            at += piece.len();
        }
        None
    }
}

// ---------------------------------------------------------------------------------------
// The checks.

fn so_zerocopy(name: &'static str, ty: socket2::Type) -> Check {
    let sock = match socket2::Socket::new(socket2::Domain::IPV4, ty, None) {
        Ok(s) => s,
        Err(e) => return Check::no(name, os_err("socket", &e)),
    };
    if let Err(e) = zc::set_so_zerocopy(sock.as_fd()) {
        return Check::no(name, os_err("setsockopt(SO_ZEROCOPY, 1)", &e));
    }
    match zc::so_zerocopy(sock.as_fd()) {
        Ok(true) => Check::yes(
            name,
            "setsockopt(SO_ZEROCOPY, 1) accepted on a fresh socket, reads back 1",
        ),
        Ok(false) => Check::no(
            name,
            "setsockopt(SO_ZEROCOPY, 1) accepted but the option reads back 0",
        ),
        Err(e) => Check::yes(
            name,
            format!(
                "setsockopt(SO_ZEROCOPY, 1) accepted; {}",
                os_err("reading it back", &e)
            ),
        ),
    }
}

/// What the receiving side of a transfer saw.
struct RxOutcome {
    received: u64,
    mismatch: Option<u64>,
    stats: StatsSnapshot,
    path: RxPath,
    /// Why the mmap path was not used, when it was asked for and the receiver copied.
    mmap_refused: Option<String>,
}

/// Prefix of a receiver error that happened before any connection was accepted.
const NOT_ACCEPTED: &str = "(not accepted) ";

/// What a whole transfer saw.
struct Transfer {
    tx: StatsSnapshot,
    rx: StatsSnapshot,
    rx_path: RxPath,
    mss: Option<u32>,
}

/// Sends `total` patterned bytes over 127.0.0.1 from a `MSG_ZEROCOPY` sender (policy
/// always, `buffers` loaned buffers of `chunk` bytes) to a receiver on `rx_path`, and
/// verifies every byte. `Err` carries the reason for a `No`.
fn transfer(
    rx_path: RxPath,
    total: usize,
    chunk: usize,
    buffers: usize,
) -> Result<Transfer, String> {
    let mut rcfg = ReceiverConfig::new(rx_path);
    rcfg.timeout = Some(STEP_TIMEOUT);
    let listener =
        Listener::bind(SocketAddr::from(([127, 0, 0, 1], 0)), &rcfg).map_err(|e| err_detail(&e))?;
    let addr = listener.local_addr().map_err(|e| err_detail(&e))?;
    let mss = listener.mss();
    let reader = std::thread::Builder::new()
        .name("zcnet-probe-rx".into())
        .spawn(move || -> Result<RxOutcome, String> {
            let pattern = Pattern::new(64 * 1024);
            // A failed accept is marked, so it is not blamed when the sender never connected.
            let mut rx = listener
                .accept()
                .map_err(|e| format!("{NOT_ACCEPTED}{}", err_detail(&e)))?;
            let mmap_refused =
                (rx_path == RxPath::Mmap && rx.path() != RxPath::Mmap).then(
                    || match SocketMap::new(rx.socket(), 16 * page_size()) {
                        Err(e) => os_err("mmap of the socket", &e),
                        Ok(_) => "the receiver fell back to copying".to_string(),
                    },
                );
            let (mut off, mut mismatch) = (0u64, None);
            loop {
                match rx.recv() {
                    Ok(Some(chunk)) => {
                        if mismatch.is_none() {
                            mismatch = pattern.first_mismatch(off, &chunk);
                        }
                        off += chunk.len() as u64;
                    }
                    Ok(None) => break,
                    Err(e) => return Err(err_detail(&e)),
                }
            }
            Ok(RxOutcome {
                received: off,
                mismatch,
                stats: rx.stats().snapshot(),
                path: rx.path(),
                mmap_refused,
            })
        })
        .map_err(|e| os_err("spawn (receiver)", &e))?;

    let sent = send_pattern(addr, total, chunk, buffers);
    let received = reader
        .join()
        .unwrap_or_else(|_| Err("the receiving thread panicked".into()));
    let (tx, rx) = match (sent, received) {
        (Ok(tx), Ok(rx)) => (tx, rx),
        (Err(s), Ok(_)) => return Err(format!("send: {s}")),
        (Ok(_), Err(r)) => return Err(format!("receive: {}", r.trim_start_matches(NOT_ACCEPTED))),
        (Err(s), Err(r)) if r.starts_with(NOT_ACCEPTED) => return Err(format!("send: {s}")),
        (Err(s), Err(r)) => return Err(format!("send: {s}; receive: {r}")),
    };
    if let Some(why) = rx.mmap_refused {
        return Err(why);
    }
    if let Some(at) = rx.mismatch {
        return Err(format!(
            "data corrupted: byte {at} of {} differs",
            zcnet::stats::fmt_bytes(total as u64)
        ));
    }
    if rx.received != total as u64 {
        return Err(format!("received {} of {} bytes", rx.received, total));
    }
    Ok(Transfer {
        tx,
        rx: rx.stats,
        rx_path: rx.path,
        mss,
    })
}

/// A failed loopback check; `ENETUNREACH` on 127.0.0.1 nearly always means the namespace's
/// loopback is down (as in a fresh network namespace), so say so.
fn loopback_no(name: &'static str, why: String) -> Check {
    if why.contains("ENETUNREACH") {
        Check::no(
            name,
            format!("{why}; is loopback up in this network namespace?"),
        )
    } else {
        Check::no(name, why)
    }
}

fn send_pattern(
    addr: SocketAddr,
    total: usize,
    chunk: usize,
    buffers: usize,
) -> Result<StatsSnapshot, String> {
    let pattern = Pattern::new(chunk);
    let mut cfg = SenderConfig::new(TxPath::Zerocopy);
    cfg.policy = Policy::always();
    cfg.pool_buffers = buffers;
    cfg.buf_bytes = chunk;
    cfg.timeout = Some(STEP_TIMEOUT);
    let mut tx = Sender::connect(addr, &cfg).map_err(|e| err_detail(&e))?;
    let mut off = 0usize;
    while off < total {
        let n = chunk.min(total - off);
        let mut buf = tx.buffer().map_err(|e| err_detail(&e))?;
        buf.fill_at(0, pattern.slice(off as u64, n));
        tx.send(buf).map_err(|e| err_detail(&e))?;
        off += n;
    }
    tx.finish().map_err(|e| err_detail(&e))
}

fn msg_zerocopy_tcp_loopback() -> Check {
    const NAME: &str = "msg_zerocopy_tcp_loopback";
    const SENDS: usize = 16;
    const CHUNK: usize = 64 * 1024;
    match transfer(RxPath::Copy, SENDS * CHUNK, CHUNK, 8) {
        Err(why) => loopback_no(NAME, why),
        Ok(t) => {
            let (status, detail) = judge_zc_send(&t.tx);
            Check::new(NAME, status, format!("{detail}; received bytes verified"))
        }
    }
}

fn tcp_zerocopy_receive() -> Check {
    const NAME: &str = "tcp_zerocopy_receive";
    const TOTAL: usize = 8 << 20;
    match transfer(RxPath::Mmap, TOTAL, 256 * 1024, 16) {
        Err(why) => loopback_no(NAME, why),
        Ok(t) if t.rx_path != RxPath::Mmap => Check::no(NAME, "the receiver fell back to copying"),
        Ok(t) => {
            let s = &t.rx;
            let status = judge_mapped(s.rx_bytes_mapped, s.rx_bytes());
            let mss = match t.mss {
                Some(m) => format!("MSS {m}"),
                None => "the default MSS (no page-multiple MSS for this MTU)".into(),
            };
            let how = format!(
                "{} TCP_ZEROCOPY_RECEIVE calls ({} mapped nothing), {} by recv, {} via copybuf; every byte verified",
                s.rx_zc_calls,
                s.rx_zc_empty_calls,
                zcnet::stats::fmt_bytes(s.fallback_bytes(zcnet::FallbackReason::Unmappable)),
                zcnet::stats::fmt_bytes(s.fallback_bytes(zcnet::FallbackReason::Copybuf)),
            );
            let lead = if s.rx_bytes_mapped == 0 {
                "the call works but mapped nothing: the frags were not whole order-0 pages"
                    .to_string()
            } else {
                format!(
                    "mapped {} of {} with {mss}",
                    fmt_pct(s.rx_mapped_fraction()),
                    zcnet::stats::fmt_bytes(s.rx_bytes())
                )
            };
            let sender = if t.tx.tx_bytes_zc_copied > 0 {
                " (pages come from the loopback copy of a MSG_ZEROCOPY sender)"
            } else {
                ""
            };
            Check::new(NAME, status, format!("{lead}{sender}; {how}"))
        }
    }
}

const IO_URING_CHECKS: [&str; 4] = [
    "io_uring",
    "io_uring_send_zc",
    "io_uring_sendmsg_zc",
    "io_uring_recv_zc",
];

fn io_uring_checks() -> Vec<Check> {
    use io_uring::opcode;
    let [ring_name, send_zc, sendmsg_zc, recv_zc] = IO_URING_CHECKS;
    let ring = match io_uring::IoUring::new(8) {
        Ok(r) => r,
        Err(e) => {
            let mut why = os_err("io_uring_setup(8 entries)", &e);
            if let Ok(v) = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled") {
                if v.trim() != "0" {
                    why.push_str(&format!(" with kernel.io_uring_disabled = {}", v.trim()));
                }
            }
            let mut out = vec![Check::no(ring_name, why.clone())];
            out.extend(
                [send_zc, sendmsg_zc, recv_zc].map(|n| Check::no(n, format!("no ring: {why}"))),
            );
            return out;
        }
    };
    let mut probe = io_uring::Probe::new();
    if let Err(e) = ring.submitter().register_probe(&mut probe) {
        let why = os_err("IORING_REGISTER_PROBE", &e);
        let mut out = vec![Check::yes(
            ring_name,
            format!("ring of 8 entries created; {why}"),
        )];
        out.extend(
            [send_zc, sendmsg_zc, recv_zc].map(|n| Check::no(n, format!("cannot tell: {why}"))),
        );
        return out;
    }
    let supported: Vec<u8> = (0..=u8::MAX).filter(|&op| probe.is_supported(op)).collect();
    let opcode_check = |name: &'static str, code: u8, label: &str, note: &str| {
        if probe.is_supported(code) {
            Check::yes(
                name,
                format!("{label} (opcode {code}) supported per IORING_REGISTER_PROBE{note}"),
            )
        } else {
            Check::no(
                name,
                format!("{label} (opcode {code}) not supported per IORING_REGISTER_PROBE"),
            )
        }
    };
    vec![
        Check::yes(
            ring_name,
            format!(
                "ring of 8 entries created; the kernel supports {} opcodes, highest {}",
                supported.len(),
                supported.last().copied().unwrap_or(0)
            ),
        ),
        opcode_check(send_zc, opcode::SendZc::CODE, "IORING_OP_SEND_ZC", ""),
        opcode_check(sendmsg_zc, opcode::SendMsgZc::CODE, "IORING_OP_SENDMSG_ZC", ""),
        opcode_check(
            recv_zc,
            opcode::RecvZc::CODE,
            "IORING_OP_RECV_ZC",
            "; using it also needs a NIC queue with header split (IORING_REGISTER_ZCRX_IFQ): see io_uring_zcrx",
        ),
    ]
}

/// Sends `total` patterned bytes over 127.0.0.1 in `chunk`-byte loaned buffers from a
/// `tx`-path sender to a receiver configured by `rcfg`, verifying every byte. Returns both
/// sides' stats and the receive path in effect.
fn uring_transfer(
    tx: TxPath,
    mut rcfg: ReceiverConfig,
    total: usize,
    chunk: usize,
) -> Result<(StatsSnapshot, StatsSnapshot, RxPath), String> {
    rcfg.timeout = Some(STEP_TIMEOUT);
    let listener =
        Listener::bind(SocketAddr::from(([127, 0, 0, 1], 0)), &rcfg).map_err(|e| err_detail(&e))?;
    let addr = listener.local_addr().map_err(|e| err_detail(&e))?;
    let reader = std::thread::spawn(move || -> Result<(u64, StatsSnapshot, RxPath), String> {
        let pattern = Pattern::new(64 * 1024);
        let mut rx = listener.accept().map_err(|e| err_detail(&e))?;
        let mut off = 0u64;
        while let Some(c) = rx.recv().map_err(|e| err_detail(&e))? {
            if let Some(at) = pattern.first_mismatch(off, &c) {
                return Err(format!("data corrupted: byte {at} differs"));
            }
            off += c.len() as u64;
        }
        Ok((off, rx.stats().snapshot(), rx.path()))
    });
    let sent = (|| -> Result<StatsSnapshot, String> {
        let mut cfg = SenderConfig::new(tx);
        cfg.policy = Policy::always();
        cfg.timeout = Some(STEP_TIMEOUT);
        cfg.pool_buffers = 8;
        cfg.buf_bytes = chunk;
        let mut s = Sender::connect(addr, &cfg).map_err(|e| err_detail(&e))?;
        let pattern = Pattern::new(chunk);
        let mut off = 0;
        while off < total {
            let mut b = s.buffer().map_err(|e| err_detail(&e))?;
            let n = chunk.min(total - off);
            b.fill_at(0, pattern.slice(off as u64, n));
            s.send(b).map_err(|e| err_detail(&e))?;
            off += n;
        }
        s.finish().map_err(|e| err_detail(&e))
    })();
    let received = reader
        .join()
        .unwrap_or_else(|_| Err("the receiving thread panicked".into()));
    let (tx, (n, rx, path)) = match (sent, received) {
        (Ok(t), Ok(r)) => (t, r),
        (Err(e), _) => return Err(format!("send: {e}")),
        (_, Err(e)) => return Err(format!("receive: {e}")),
    };
    if n != total as u64 {
        return Err(format!("received {n} of {total} bytes"));
    }
    Ok((tx, rx, path))
}

/// Registers a sender's pool as io_uring fixed buffers and sends from them with `SEND_ZC`
/// (`IORING_RECVSEND_FIXED_BUF`), asking for usage reports: whether registration is allowed
/// (`RLIMIT_MEMLOCK`), whether every request gets its notification, and whether the kernel
/// copied anyway (always, over loopback: docs/measurements/kernel-findings.md §3).
fn io_uring_fixed_buffers() -> Check {
    const NAME: &str = "io_uring_fixed_buffers";
    const CHUNK: usize = 64 * 1024;
    const TOTAL: usize = 4 << 20;
    let (tx, _, _) = match uring_transfer(
        TxPath::Uring,
        ReceiverConfig::new(RxPath::Copy),
        TOTAL,
        CHUNK,
    ) {
        Ok(t) => t,
        Err(why) => return loopback_no(NAME, why),
    };
    if tx.fallback_ops(zcnet::FallbackReason::Unsupported) > 0 {
        return Check::no(
            NAME,
            "io_uring or IORING_OP_SEND_ZC unavailable: every send was copied",
        );
    }
    if tx.tx_uring_register_failures > 0 {
        let why = match zcnet::Pool::new(8, CHUNK).and_then(|p| {
            zcnet_sys::uring::SendZcRing::<Vec<u8>>::new(8, 8)?.register_buffers(p.regions())
        }) {
            Err(e) => os_err("IORING_REGISTER_BUFFERS of 8 × 64 KiB", &e),
            Ok(()) => "IORING_REGISTER_BUFFERS refused once, then accepted".into(),
        };
        return Check::no(
            NAME,
            format!("{why} (RLIMIT_MEMLOCK without CAP_IPC_LOCK?); sends went unregistered"),
        );
    }
    let base = format!(
        "{} SEND_ZC requests from registered buffers, {} notification CQEs, {} sent",
        tx.tx_uring_fixed_calls,
        tx.tx_notifications,
        zcnet::stats::fmt_bytes(tx.tx_bytes_zerocopy)
    );
    if tx.tx_uring_fixed_calls == 0 || tx.tx_notifications < tx.tx_calls_zerocopy {
        return Check::no(NAME, format!("requests or notifications missing: {base}"));
    }
    if tx.tx_bytes_zc_copied == 0 {
        Check::yes(NAME, format!("pages went out uncopied; {base}"))
    } else {
        Check::new(
            NAME,
            Status::Partial,
            format!(
                "works, but local delivery copies (IORING_NOTIF_USAGE_ZC_COPIED on {} of bytes); {base}",
                fmt_pct(tx.tx_bytes_zc_copied as f64 / tx.tx_bytes_zerocopy as f64)
            ),
        )
    }
}

/// Receives through a multishot `recv` into a deliberately small provided-buffer ring
/// (`IORING_REGISTER_PBUF_RING`, 4 × 16 KiB), so it runs dry and must be re-armed.
fn io_uring_buf_ring() -> Check {
    const NAME: &str = "io_uring_buf_ring";
    const TOTAL: usize = 4 << 20;
    let mut rcfg = ReceiverConfig::new(RxPath::Uring);
    rcfg.buf_bytes = 16 * 1024;
    rcfg.map_bytes = 64 * 1024;
    let (_, rx, path) = match uring_transfer(TxPath::Copy, rcfg, TOTAL, 256 * 1024) {
        Ok(t) => t,
        Err(why) => return loopback_no(NAME, why),
    };
    if path != RxPath::Uring {
        let why = match zcnet_sys::uring::BufRingRecv::new(4, 16 * 1024) {
            Err(e) => os_err("IORING_REGISTER_PBUF_RING", &e),
            Ok(_) => "the receiver fell back to copying".into(),
        };
        return Check::no(NAME, why);
    }
    Check::yes(
        NAME,
        format!(
            "{} received in {} multishot CQEs from 4 × 16 KiB provided buffers; ran dry {} times (-ENOBUFS), re-armed {} times; the kernel still copies into the buffers",
            zcnet::stats::fmt_bytes(rx.rx_bytes_copied),
            rx.rx_uring_cqes,
            rx.rx_uring_enobufs,
            rx.rx_uring_rearms
        ),
    )
}

/// Tries io_uring zero-copy receive registration (`IORING_REGISTER_ZCRX_IFQ`) on loopback
/// queue 0 with the ring flags the uAPI requires, and on an ordinary ring, and reports what
/// the kernel said.
fn io_uring_zcrx() -> Check {
    use zcnet_sys::uring::zcrx;
    const NAME: &str = "io_uring_zcrx";
    let lo = match zcrx::ifindex("lo") {
        Ok(i) => i,
        Err(e) => return Check::no(NAME, os_err("if_nametoindex(lo)", &e)),
    };
    let plain = match zcrx::try_register_on_plain_ring(lo, 0) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            "; an ordinary ring gets EINVAL (DEFER_TASKRUN|CQE32 required), as documented".into()
        }
        Err(e) => format!("; an ordinary ring: {}", os_err("register", &e)),
        Ok(()) => "; an ordinary ring was accepted (unexpected)".into(),
    };
    match zcrx::ZcrxQueue::register(lo, 0, 1 << 20, 256) {
        Ok(_) => Check::yes(NAME, format!("registered lo rx queue 0{plain}")),
        Err(e) => {
            let reason = match e.raw_os_error() {
                Some(libc::EOPNOTSUPP) => "no header split/queue API (zcrx needs a NIC driver with queue management and header/data split)",
                Some(libc::EPERM) => "needs CAP_NET_ADMIN",
                Some(libc::EINVAL) => "ring flags or queue refused",
                Some(libc::ENODEV) => "no such device",
                _ => "refused",
            };
            let errno = os_err("", &e);
            Check::no(
                NAME,
                format!("{} on lo: {reason}{plain}", errno.trim_start_matches(": ")),
            )
        }
    }
}

fn userfaultfd_wp() -> Check {
    const NAME: &str = "userfaultfd_wp";
    const PAGES: usize = 16;
    let uffd = match Userfaultfd::user_mode_only() {
        Ok(u) => u,
        Err(e) => {
            return Check::no(
                NAME,
                os_err("userfaultfd(UFFD_USER_MODE_ONLY|O_NONBLOCK|O_CLOEXEC)", &e),
            )
        }
    };
    let api = match uffd.api(0) {
        Ok(a) => a,
        Err(e) => return Check::no(NAME, os_err("UFFDIO_API", &e)),
    };
    let yn = |b: bool| if b { "yes" } else { "no" };
    let features = format!(
        "features {:#x} (PAGEFAULT_FLAG_WP {}, WP_UNPOPULATED {})",
        api.features,
        yn(api.has(uffd::UFFD_FEATURE_PAGEFAULT_FLAG_WP)),
        yn(api.has(uffd::UFFD_FEATURE_WP_UNPOPULATED)),
    );
    let mut buf = match PageBuf::new(PAGES * page_size()) {
        Ok(b) => b,
        Err(e) => return Check::no(NAME, format!("{}; {features}", os_err("mmap", &e))),
    };
    let ioctls = match uffd.register(buf.as_slice(), RegisterMode::WP) {
        Ok(i) => i,
        Err(e) => {
            return Check::no(
                NAME,
                format!(
                    "{}; {features}",
                    os_err(
                        "UFFDIO_REGISTER(MODE_WP) of 16 populated anonymous pages",
                        &e
                    )
                ),
            )
        }
    };
    if ioctls & uffd::IOCTL_BIT_WRITEPROTECT == 0 {
        return Check::no(
            NAME,
            format!("registered, but UFFDIO_WRITEPROTECT is not offered on the range (ioctls {ioctls:#x}); {features}"),
        );
    }
    if let Err(e) = uffd.write_protect(buf.as_slice(), true) {
        return Check::no(
            NAME,
            format!("{}; {features}", os_err("UFFDIO_WRITEPROTECT(MODE_WP)", &e)),
        );
    }
    // With USER_MODE_ONLY a kernel write into a protected page fails with EFAULT rather than
    // waiting for a handler, so this read cannot block; it shows the protection is in force.
    let kernel_write = {
        use std::io::Read;
        let page = page_size();
        std::fs::File::open("/dev/zero").and_then(|mut f| f.read(&mut buf.as_mut_slice()[..page]))
    };
    if let Err(e) = uffd.write_protect(buf.as_slice(), false) {
        return Check::no(
            NAME,
            format!(
                "{}; {features}",
                os_err("UFFDIO_WRITEPROTECT(unprotect)", &e)
            ),
        );
    }
    if let Err(e) = uffd.unregister(buf.as_slice()) {
        return Check::no(
            NAME,
            format!("{}; {features}", os_err("UFFDIO_UNREGISTER", &e)),
        );
    }
    let done = "USER_MODE_ONLY fd; 16 populated anonymous pages registered MODE_WP, protected, unprotected, unregistered";
    match kernel_write {
        Err(e) if e.raw_os_error() == Some(libc::EFAULT) => Check::yes(
            NAME,
            format!("{done}; a kernel write into them while protected got EFAULT, as USER_MODE_ONLY promises; {features}"),
        ),
        Err(e) => Check::yes(
            NAME,
            format!("{done}; the kernel-write test could not run ({}); {features}", os_err("read /dev/zero", &e)),
        ),
        Ok(n) => Check::new(
            NAME,
            Status::Partial,
            format!("{done}; but a kernel write of {n} B into a protected page went through; {features}"),
        ),
    }
}

const GSO_SEG: usize = 1000;
const GSO_TOTAL: usize = 4000;

/// A loopback UDP socket bound to an ephemeral port, reads bounded by [`STEP_TIMEOUT`].
fn udp_socket() -> Result<UdpSocket, String> {
    let s = UdpSocket::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .map_err(|e| os_err("bind 127.0.0.1:0", &e))?;
    s.set_read_timeout(Some(STEP_TIMEOUT))
        .map_err(|e| os_err("setsockopt(SO_RCVTIMEO)", &e))?;
    Ok(s)
}

fn gso_sender(dst: SocketAddr) -> Result<(), String> {
    let tx = udp_socket()?;
    udp::set_udp_segment(tx.as_fd(), GSO_SEG as u16)
        .map_err(|e| os_err("setsockopt(UDP_SEGMENT, 1000)", &e))?;
    let data = Pattern::new(GSO_TOTAL);
    match tx.send_to(data.slice(0, GSO_TOTAL), dst) {
        Ok(GSO_TOTAL) => Ok(()),
        Ok(n) => Err(format!(
            "sendto of a 4000 B datagram with UDP_SEGMENT 1000 sent {n} B"
        )),
        Err(e) => Err(os_err(
            "sendto of a 4000 B datagram with UDP_SEGMENT 1000",
            &e,
        )),
    }
}

/// Reads datagrams until `total` bytes arrived or a read times out, with the `UDP_GRO`
/// cmsg of each; checks the payload against the pattern.
fn read_datagrams(rx: &UdpSocket, total: usize) -> Result<Vec<(usize, Option<u16>)>, String> {
    let pattern = Pattern::new(65536);
    let mut buf = vec![0u8; 65536];
    let (mut reads, mut got) = (Vec::new(), 0usize);
    let deadline = Instant::now() + STEP_TIMEOUT;
    while got < total && Instant::now() < deadline {
        match udp::recv_gro(
            rx.as_fd(),
            &mut buf,
            zcnet_sys::raw::socket::RecvFlags::empty(),
        ) {
            Ok(r) => {
                if let Some(at) = pattern.first_mismatch(got as u64, &buf[..r.len]) {
                    return Err(format!("datagram payload corrupted at byte {at}"));
                }
                got += r.len;
                reads.push((r.len, r.gso_size));
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::ETIMEDOUT)) => {
                break
            }
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => return Err(os_err("recvmsg", &e)),
        }
    }
    Ok(reads)
}

fn udp_gso() -> Check {
    const NAME: &str = "udp_gso";
    let run = || -> Result<Check, String> {
        let rx = udp_socket()?;
        let dst = rx.local_addr().map_err(|e| os_err("getsockname", &e))?;
        gso_sender(dst)?;
        let reads = read_datagrams(&rx, GSO_TOTAL)?;
        let sizes: Vec<usize> = reads.iter().map(|r| r.0).collect();
        let seen = describe_reads(&reads);
        Ok(match judge_gso(&sizes, GSO_SEG, GSO_TOTAL) {
            Status::Yes => Check::yes(
                NAME,
                format!("one 4000 B send with UDP_SEGMENT 1000 arrived as {seen}, payload verified"),
            ),
            _ => Check::no(NAME, format!("one 4000 B send with UDP_SEGMENT 1000: expected 4 datagrams of 1000 B, saw {seen}")),
        })
    };
    run().unwrap_or_else(|why| loopback_no(NAME, why))
}

fn udp_gro() -> Check {
    const NAME: &str = "udp_gro";
    let run = || -> Result<Check, String> {
        let rx = udp_socket()?;
        udp::set_udp_gro(rx.as_fd(), true).map_err(|e| os_err("setsockopt(UDP_GRO, 1)", &e))?;
        let dst = rx.local_addr().map_err(|e| os_err("getsockname", &e))?;
        // A GSO packet: loopback can hand it to a GRO socket whole, with the cmsg.
        let (gso_status, gso_text) = match gso_sender(dst) {
            Ok(()) => {
                let reads = read_datagrams(&rx, GSO_TOTAL)?;
                (
                    judge_gro(&reads, GSO_TOTAL),
                    format!(
                        "a 4000 B send with UDP_SEGMENT 1000 arrived as {}",
                        describe_reads(&reads)
                    ),
                )
            }
            Err(why) => (Status::No, format!("no GSO send ({why})")),
        };
        let (sep_status, sep_text) = separate_sends(&rx, dst)?;
        let status = [gso_status, sep_status]
            .into_iter()
            .max_by_key(|s| match s {
                Status::Yes => 2,
                Status::Partial => 1,
                Status::No => 0,
            })
            .unwrap_or(Status::No);
        let lead = match status {
            Status::Yes => "UDP_GRO on the receiver",
            Status::Partial => "UDP_GRO accepted, but nothing was coalesced",
            Status::No => "UDP_GRO accepted, but the datagrams did not all arrive",
        };
        Ok(Check::new(
            NAME,
            status,
            format!("{lead}: {gso_text}; {sep_text}"),
        ))
    };
    run().unwrap_or_else(|why| loopback_no(NAME, why))
}

/// Sends 4 separate 1000 B datagrams to `dst` and says how `rx` received them: real GRO
/// coalescing needs a NAPI device, which loopback is not.
fn separate_sends(rx: &UdpSocket, dst: SocketAddr) -> Result<(Status, String), String> {
    let tx = udp_socket()?;
    let data = Pattern::new(GSO_TOTAL);
    for i in 0..GSO_TOTAL / GSO_SEG {
        tx.send_to(data.slice((i * GSO_SEG) as u64, GSO_SEG), dst)
            .map_err(|e| os_err("sendto", &e))?;
    }
    let reads = read_datagrams(rx, GSO_TOTAL)?;
    let status = judge_gro(&reads, GSO_TOTAL);
    let tail = if status == Status::Partial {
        ", as loopback does not run GRO on separate datagrams"
    } else {
        ""
    };
    Ok((
        status,
        format!(
            "4 separate 1000 B sends arrived as {}{tail}",
            describe_reads(&reads)
        ),
    ))
}

fn optmem_max() -> Check {
    const NAME: &str = "optmem_max";
    const PATH: &str = "/proc/sys/net/core/optmem_max";
    let text = match std::fs::read_to_string(PATH) {
        Ok(t) => t,
        Err(e) => return Check::no(NAME, os_err(PATH, &e)),
    };
    match text.trim().parse::<u64>() {
        Ok(v) => Check::yes(
            NAME,
            format!(
                "net.core.optmem_max = {v} ({}): per-socket option memory, charged per outstanding MSG_ZEROCOPY skb \
                 (consecutive sends share one); past it a zero-copy send fails with ENOBUFS and the kernel does not \
                 fall back (per network namespace)",
                zcnet::stats::fmt_bytes(v)
            ),
        ),
        Err(_) => Check::no(NAME, format!("{PATH} holds {:?}, not a number", text.trim())),
    }
}

/// Kernel TLS: `TCP_ULP "tls"` on a connected loopback pair, then AES-128-GCM keys for
/// TLS 1.3 in both directions (throwaway keys; nothing is sent). Without it an encrypted
/// transfer encrypts in user space (issue 45), with the reason this check names.
fn ktls_check() -> Check {
    const NAME: &str = "ktls";
    use zcnet_sys::raw::ktls::{self, CryptoInfo, Direction};
    let listed = match ktls::available_ulps() {
        Ok(s) if s.is_empty() => "none".to_string(),
        Ok(s) => s,
        Err(e) => os_err(ktls::AVAILABLE_ULP, &e),
    };
    let (listener, addr) = match loopback_listener() {
        Ok(v) => v,
        Err(why) => return loopback_no(NAME, why),
    };
    let client = match connect_stream(addr) {
        Ok(c) => c,
        Err(why) => return loopback_no(NAME, why),
    };
    let _server = match listener.accept() {
        Ok(s) => s,
        Err(e) => return loopback_no(NAME, err_detail(&e)),
    };
    let tried = || {
        ktls::attach_ulp(client.as_fd())?;
        let info = CryptoInfo::aes_gcm_128([0x5a; 16], [0xa5; 12], 0);
        ktls::set_keys(client.as_fd(), Direction::Tx, &info)?;
        ktls::set_keys(client.as_fd(), Direction::Rx, &info)
    };
    match tried() {
        Ok(()) => Check::yes(
            NAME,
            format!("TCP_ULP tls and TLS 1.3 AES-128-GCM keys both ways accepted on a loopback socket (tcp_available_ulp: {listed})"),
        ),
        Err(e @ ktls::KtlsError::NoModule { .. }) => Check::no(NAME, e.to_string()),
        Err(e) => Check::no(NAME, format!("{e} (tcp_available_ulp: {listed})")),
    }
}

fn rlimit_memlock() -> Check {
    const NAME: &str = "rlimit_memlock";
    let limit = |v: Option<u64>| v.map_or_else(|| "unlimited".to_string(), zcnet::stats::fmt_bytes);
    match socket::memlock_limit() {
        Err(e) => Check::no(NAME, os_err("getrlimit(RLIMIT_MEMLOCK)", &e)),
        Ok((soft, hard)) => {
            let who = if socket::is_root() {
                "running as root, which normally has CAP_IPC_LOCK: not enforced for this process"
            } else {
                "enforced for this process unless it has CAP_IPC_LOCK"
            };
            Check::yes(
                NAME,
                format!(
                    "soft {}, hard {}: MSG_ZEROCOPY pins (ENOBUFS past it) and io_uring registered buffers \
                     are charged against it; {who}",
                    limit(soft),
                    limit(hard)
                ),
            )
        }
    }
}

// ---------------------------------------------------------------------------------------
// The file paths: sendfile and splice (docs/measurements/kernel-findings.md §4).

/// Bytes each file check moves: odd, so a lost or doubled page shows.
const FILE_CHECK_BYTES: usize = (1 << 20) + 3;

/// A temp file holding `data`, unlinked at once so nothing is left behind even if the check
/// is abandoned.
fn unlinked_temp_file(data: &[u8]) -> Result<(std::fs::File, String), String> {
    use std::io::Write;
    use std::sync::atomic::{AtomicU32, Ordering};
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir();
    let path = dir.join(format!(
        ".zcnet-probe-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| os_err(&format!("creating a temp file in {}", dir.display()), &e))?;
    let _ = std::fs::remove_file(&path);
    f.write_all(data)
        .map_err(|e| os_err("writing the temp file", &e))?;
    Ok((f, dir.display().to_string()))
}

/// A copy-path listener on 127.0.0.1 whose receivers time out after `STEP_TIMEOUT`.
fn loopback_listener() -> Result<(Listener, SocketAddr), String> {
    let mut rcfg = ReceiverConfig::new(RxPath::Copy);
    rcfg.timeout = Some(STEP_TIMEOUT);
    let listener =
        Listener::bind(SocketAddr::from(([127, 0, 0, 1], 0)), &rcfg).map_err(|e| err_detail(&e))?;
    let addr = listener.local_addr().map_err(|e| err_detail(&e))?;
    Ok((listener, addr))
}

fn connect_stream(addr: SocketAddr) -> Result<std::net::TcpStream, String> {
    let s = std::net::TcpStream::connect_timeout(&addr, STEP_TIMEOUT)
        .map_err(|e| os_err("connect", &e))?;
    s.set_write_timeout(Some(STEP_TIMEOUT))
        .map_err(|e| os_err("setsockopt(SO_SNDTIMEO)", &e))?;
    Ok(s)
}

/// Moves exactly `len` bytes from `from` to `to` by splice through `pipe`; `in_off`/`out_off`
/// are file offsets for a file end (`None` for the socket end).
fn splice_through(
    pipe: &splice::Pipe,
    from: std::os::fd::BorrowedFd<'_>,
    in_off: Option<u64>,
    to: std::os::fd::BorrowedFd<'_>,
    out_off: Option<u64>,
    len: usize,
) -> Result<(), String> {
    let (into, outof) = match (in_off, out_off) {
        (Some(_), _) => ("splice (file → pipe)", "splice (pipe → socket)"),
        _ => ("splice (socket → pipe)", "splice (pipe → file)"),
    };
    let mut done = 0usize;
    while done < len {
        let n = match splice::splice(
            from,
            in_off.map(|o| o + done as u64),
            pipe.write_end(),
            None,
            len - done,
            splice::SpliceFlags::MOVE,
        ) {
            Ok(0) => return Err(format!("{into}: input ended after {done} of {len} bytes")),
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(os_err(into, &e)),
        };
        let mut left = n;
        while left > 0 {
            let r = match out_off {
                Some(o) => splice::splice(
                    pipe.read_end(),
                    None,
                    to,
                    Some(o + (done + n - left) as u64),
                    left,
                    splice::SpliceFlags::MOVE,
                ),
                None => {
                    splice::splice_to_socket(pipe.read_end(), to, left, splice::SpliceFlags::MOVE)
                }
            };
            match r {
                Ok(0) => return Err(format!("{outof}: moved nothing")),
                Ok(m) => left -= m,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(os_err(outof, &e)),
            }
        }
        done += n;
    }
    Ok(())
}

/// Reads the stream to its end on `rx` and checks it against the pattern.
fn read_and_verify(rx: &mut zcnet::Receiver, pattern: &Pattern) -> Result<u64, String> {
    let mut off = 0u64;
    loop {
        match rx.recv() {
            Ok(Some(chunk)) => {
                if let Some(at) = pattern.first_mismatch(off, &chunk) {
                    return Err(format!("data corrupted: byte {at} differs"));
                }
                off += chunk.len() as u64;
            }
            Ok(None) => return Ok(off),
            Err(e) => return Err(err_detail(&e)),
        }
    }
}

fn sendfile_check() -> Check {
    const NAME: &str = "sendfile";
    match sendfile_transfer() {
        Ok((calls, dir)) => Check::yes(
            NAME,
            format!(
                "{FILE_CHECK_BYTES} B from a temp file in {dir} to 127.0.0.1 in {calls} sendfile call(s), received bytes verified"
            ),
        ),
        Err(why) => loopback_no(NAME, why),
    }
}

fn sendfile_transfer() -> Result<(u32, String), String> {
    let pattern = Pattern::new(FILE_CHECK_BYTES);
    let (file, dir) = unlinked_temp_file(pattern.slice(0, FILE_CHECK_BYTES))?;
    let (listener, addr) = loopback_listener()?;
    let reader = std::thread::Builder::new()
        .name("zcnet-probe-rx".into())
        .spawn(move || -> Result<u64, String> {
            let mut rx = listener.accept().map_err(|e| err_detail(&e))?;
            read_and_verify(&mut rx, &Pattern::new(64 * 1024))
        })
        .map_err(|e| os_err("spawn (receiver)", &e))?;
    let sent = (|| -> Result<u32, String> {
        let s = connect_stream(addr)?;
        let (mut done, mut calls) = (0usize, 0u32);
        while done < FILE_CHECK_BYTES {
            match splice::sendfile(
                s.as_fd(),
                file.as_fd(),
                done as u64,
                FILE_CHECK_BYTES - done,
            ) {
                Ok(0) => return Err(format!("sendfile: file ended after {done} bytes")),
                Ok(n) => {
                    done += n;
                    calls += 1;
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(os_err("sendfile", &e)),
            }
        }
        s.shutdown(std::net::Shutdown::Write)
            .map_err(|e| os_err("shutdown", &e))?;
        Ok(calls)
    })();
    let received = reader
        .join()
        .unwrap_or_else(|_| Err("the receiving thread panicked".into()));
    let calls = sent?;
    let got = received.map_err(|r| format!("receive: {r}"))?;
    if got != FILE_CHECK_BYTES as u64 {
        return Err(format!("received {got} of {FILE_CHECK_BYTES} bytes"));
    }
    Ok((calls, dir))
}

fn splice_check() -> Check {
    const NAME: &str = "splice";
    match splice_transfer() {
        Ok((pipe, dir)) => Check::yes(
            NAME,
            format!(
                "{} B file → pipe → 127.0.0.1 → pipe → file (temp files in {dir}, pipes of {}), written file verified",
                FILE_CHECK_BYTES,
                zcnet::stats::fmt_bytes(pipe as u64)
            ),
        ),
        Err(why) => loopback_no(NAME, why),
    }
}

fn splice_transfer() -> Result<(usize, String), String> {
    let pattern = Pattern::new(FILE_CHECK_BYTES);
    let (src, dir) = unlinked_temp_file(pattern.slice(0, FILE_CHECK_BYTES))?;
    let (dst, _) = unlinked_temp_file(&[])?;
    let make_pipe = || -> Result<(splice::Pipe, usize), String> {
        let p = splice::Pipe::new().map_err(|e| os_err("pipe2", &e))?;
        if let Some(max) = splice::pipe_max_size() {
            let _ = p.set_size(max.min(1 << 20));
        }
        let size = p.size().map_err(|e| os_err("fcntl(F_GETPIPE_SZ)", &e))?;
        Ok((p, size))
    };
    let (listener, addr) = loopback_listener()?;
    let (rx_pipe, size) = make_pipe()?;
    let reader = std::thread::Builder::new()
        .name("zcnet-probe-rx".into())
        .spawn(move || -> Result<std::fs::File, String> {
            let rx = listener.accept().map_err(|e| err_detail(&e))?;
            splice_through(
                &rx_pipe,
                rx.socket(),
                None,
                dst.as_fd(),
                Some(0),
                FILE_CHECK_BYTES,
            )?;
            Ok(dst)
        })
        .map_err(|e| os_err("spawn (receiver)", &e))?;
    let sent = (|| -> Result<(), String> {
        let (tx_pipe, _) = make_pipe()?;
        let s = connect_stream(addr)?;
        splice_through(
            &tx_pipe,
            src.as_fd(),
            Some(0),
            s.as_fd(),
            None,
            FILE_CHECK_BYTES,
        )
    })();
    let received = reader
        .join()
        .unwrap_or_else(|_| Err("the receiving thread panicked".into()));
    sent.map_err(|s| format!("send: {s}"))?;
    let dst = received.map_err(|r| format!("receive: {r}"))?;
    let mut back = vec![0u8; FILE_CHECK_BYTES];
    {
        use std::os::unix::fs::FileExt;
        dst.read_exact_at(&mut back, 0)
            .map_err(|e| os_err("reading the written file back", &e))?;
    }
    if let Some(at) = pattern.first_mismatch(0, &back) {
        return Err(format!(
            "data corrupted: byte {at} of the written file differs"
        ));
    }
    Ok((size, dir))
}

// ---------------------------------------------------------------------------------------
// AF_XDP (docs/lm-afxdp.md; af_xdp.rst): socket, UMEM registration, bind modes and the XDP
// program, the last two on a veth pair of the probe's own.

const XSK_CHECKS: [&str; 3] = [
    "af_xdp_socket",
    "af_xdp_umem_aligned",
    "af_xdp_umem_unaligned",
];

const XSK_VETH_CHECKS: [&str; 4] = [
    "af_xdp_bind_zerocopy",
    "af_xdp_bind_copy",
    "xdp_attach_native",
    "xdp_attach_generic",
];

/// A small UMEM for the probe: 64 chunks, rings of 64.
fn xsk_probe_config(chunk: u32, unaligned: bool) -> zcnet_afxdp::XskConfig {
    let mut c = zcnet_afxdp::XskConfig::default()
        .with_frames(chunk, 64)
        .with_unaligned(unaligned);
    c.fill_ring = 64;
    c.completion_ring = 64;
    c.rx_ring = 64;
    c.tx_ring = 64;
    c
}

fn xsk_err(e: &zcnet_afxdp::XskError) -> String {
    use zcnet_afxdp::XskError;
    match e {
        XskError::Setup(s) => os_err(s.op, &s.source),
        XskError::Bind { source, .. } => os_err("bind", source),
        XskError::Io { op, source } => os_err(op, source),
        other => other.to_string(),
    }
}

/// The Lightweight Messages program (`bpf/lm.c`): built into this binary, and accepted by
/// this kernel's verifier with its maps (loading needs no interface).
fn lm_program_check() -> Check {
    use zcnet_afxdp::LmProgram;
    const NAME: &str = "lm_xdp_program";
    match LmProgram::load(9) {
        Ok(_) => Check::yes(
            NAME,
            "zcnet's Lightweight Messages program loaded: admission, fragment order and \
             fault-injection maps accepted by the verifier",
        ),
        Err(e) => Check::no(
            NAME,
            format!("{}: LM uses the kernel's UDP path", xsk_err(&e)),
        ),
    }
}

fn xsk_checks() -> Vec<Check> {
    use zcnet_afxdp::{XskError, XskSocket};
    let [socket_name, aligned, unaligned] = XSK_CHECKS;
    let socket = match rustix::net::socket(
        rustix::net::AddressFamily::XDP,
        rustix::net::SocketType::RAW,
        None,
    ) {
        Ok(_) => Check::yes(socket_name, "socket(AF_XDP, SOCK_RAW) created"),
        Err(e) => {
            let why = os_err("socket(AF_XDP, SOCK_RAW)", &e.into());
            return vec![
                Check::no(socket_name, why.clone()),
                Check::no(aligned, format!("no socket: {why}")),
                Check::no(unaligned, format!("no socket: {why}")),
            ];
        }
    };
    let umem = |name: &'static str, chunk: u32, flag: bool, what: &str| match XskSocket::new(
        xsk_probe_config(chunk, flag),
    ) {
        Ok(_) => Check::yes(
            name,
            format!(
                "XDP_UMEM_REG of 64 × {chunk} B chunks{what} accepted; FILL, COMPLETION, \
                     RX and TX rings of 64 mapped"
            ),
        ),
        Err(e @ XskError::Setup(_)) => Check::no(name, xsk_err(&e)),
        Err(e) => Check::no(name, e.to_string()),
    };
    vec![
        socket,
        umem(aligned, 4096, false, ""),
        umem(
            unaligned,
            3000,
            true,
            " with XDP_UMEM_UNALIGNED_CHUNK_FLAG (3000 is not a power of two: chunks may start \
             anywhere)",
        ),
    ]
}

fn xsk_veth_checks() -> Vec<Check> {
    let copy_name = XSK_VETH_CHECKS[1];
    let fail_all = |why: String| {
        XSK_VETH_CHECKS
            .iter()
            .map(|&n| Check::no(n, why.clone()))
            .collect()
    };
    if let Err(why) = zcnet_testbed::netns::available() {
        return fail_all(format!("not tried: {why}"));
    }
    let pair = match zcnet_testbed::netns::VethPair::create(1500) {
        Ok(p) => p,
        Err(e) => return fail_all(format!("not tried: no veth pair: {e}")),
    };
    let run = pair.run_in_b(|| xsk_veth_checks_in_b(&pair));
    let (mut got, bound) = match run {
        Ok(r) => r,
        Err(e) => return fail_all(format!("not tried: {e}")),
    };
    // The copy-mode receive needs a sender in the other namespace.
    if let (Some(i), Some(sock)) = (got.iter().position(|c| c.name == copy_name), bound) {
        got[i] = xsk_copy_receive(&pair, got[i].clone(), sock);
    }
    // `bounded` puts them in XSK_VETH_CHECKS order and names any that is missing.
    got
}

/// In namespace b: attach in both modes, then the two binds. The copy-bound socket is
/// returned for the receive step: closing it and binding the queue again at once would meet
/// `EBUSY`, as socket teardown is asynchronous (docs/measurements/kernel-findings.md §7).
fn xsk_veth_checks_in_b(
    pair: &zcnet_testbed::netns::VethPair,
) -> (Vec<Check>, Option<zcnet_afxdp::XskSocket>) {
    use zcnet_afxdp::{AttachMode, BindMode, RedirectProgram, XskSocket};
    let [zc_name, copy_name, native_name, generic_name] = XSK_VETH_CHECKS;
    let ifname = pair.ifname_b();
    let attach = |name: &'static str, mode: AttachMode, flag: &str| {
        let attached = RedirectProgram::load(None).and_then(|mut p| {
            p.attach(ifname, mode)?;
            Ok(p)
        });
        match attached {
            Ok(_) => Check::yes(
                name,
                format!("zcnet's XSK redirect program attached to veth in {mode} mode ({flag})"),
            ),
            Err(e) => Check::no(name, format!("{mode} attach on veth: {}", xsk_err(&e))),
        }
    };
    let native = attach(native_name, AttachMode::Native, "XDP_FLAGS_DRV_MODE");
    let generic = attach(generic_name, AttachMode::Generic, "XDP_FLAGS_SKB_MODE");
    let bind = |mode: BindMode| {
        let mut s = XskSocket::new(xsk_probe_config(4096, false))?;
        let b = s.bind(ifname, 0, mode)?;
        Ok::<_, zcnet_afxdp::XskError>((b, s))
    };
    let zc = match bind(BindMode::ZeroCopy) {
        Ok((b, _)) => Check::yes(
            zc_name,
            format!(
                "veth queue 0 bound with XDP_ZEROCOPY (XDP_OPTIONS zero-copy {})",
                if b.zero_copy { "on" } else { "off" }
            ),
        ),
        Err(e) => Check::no(
            zc_name,
            format!(
                "{} binding veth queue 0 with XDP_ZEROCOPY: the driver has no XSK zero-copy; \
                 copy mode is the fallback",
                xsk_err(&e).trim_start_matches("bind: ")
            ),
        ),
    };
    let (copy, sock) = match bind(BindMode::Copy) {
        Ok((b, s)) if !b.zero_copy => (
            Check::yes(
                copy_name,
                "veth queue 0 bound with XDP_COPY (XDP_OPTIONS zero-copy off)",
            ),
            Some(s),
        ),
        Ok(_) => (
            Check::new(
                copy_name,
                Status::Partial,
                "bound with XDP_COPY, but XDP_OPTIONS reports zero-copy",
            ),
            None,
        ),
        Err(e) => (
            Check::no(copy_name, format!("XDP_COPY: {}", xsk_err(&e))),
            None,
        ),
    };
    (vec![zc, copy, native, generic], sock)
}

/// Extends a successful copy-bind check with a real frame: one UDP datagram from namespace
/// a through the XDP program into the XSK in b, bytes verified.
fn xsk_copy_receive(
    pair: &zcnet_testbed::netns::VethPair,
    bound: Check,
    mut sock: zcnet_afxdp::XskSocket,
) -> Check {
    use zcnet_afxdp::wire::udp as wire;
    use zcnet_afxdp::{AttachMode, RedirectProgram};
    const PORT: u16 = 7700;
    const LEN: usize = 1000;
    if bound.status != Status::Yes {
        return bound;
    }
    let setup = pair.run_in_b(|| {
        let mut prog = RedirectProgram::load(Some(PORT))?;
        let mode = match prog.attach(pair.ifname_b(), AttachMode::Native) {
            Ok(()) => AttachMode::Native,
            Err(_) => {
                prog = RedirectProgram::load(Some(PORT))?;
                prog.attach(pair.ifname_b(), AttachMode::Generic)?;
                AttachMode::Generic
            }
        };
        prog.insert(0, &sock)?;
        sock.fill(0)?;
        Ok::<_, zcnet_afxdp::XskError>((prog, mode))
    });
    let caveat = |why: String| {
        Check::new(
            bound.name,
            Status::Partial,
            format!("{}; but no frame received: {why}", bound.detail),
        )
    };
    let (_prog, mode) = match setup {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return caveat(xsk_err(&e)),
        Err(e) => return caveat(e.to_string()),
    };
    let payload: Vec<u8> = (0..LEN).map(|i| (i * 7 + 3) as u8).collect();
    let sent = pair.run_in_a(|| {
        let s = UdpSocket::bind((pair.addr_a(), 0))?;
        s.send_to(&payload, (pair.addr_b(), PORT))
    });
    match sent {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return caveat(os_err("send_to", &e)),
        Err(e) => return caveat(e.to_string()),
    }
    let got = match sock.recv(STEP_TIMEOUT / 2) {
        Ok(Some(frame)) => match wire::parse_udp(&frame) {
            Ok(udp) if frame[udp.payload.clone()] == payload[..] => Check::yes(
                bound.name,
                format!(
                    "{}; a {LEN} B UDP datagram from the peer namespace arrived through the XSK \
                     ({mode} XDP), bytes verified",
                    bound.detail
                ),
            ),
            Ok(_) => caveat("the frame's payload differs from what was sent".into()),
            Err(e) => caveat(format!("not the datagram sent: {e}")),
        },
        Ok(None) => caveat(format!(
            "nothing within {} ms",
            (STEP_TIMEOUT / 2).as_millis()
        )),
        Err(e) => caveat(xsk_err(&e)),
    };
    got
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::OnceLock;
    use zcnet::stats::Stats;
    use zcnet::FallbackReason;

    /// The real probe, run once for all tests of this module.
    fn report() -> &'static Report {
        static REPORT: OnceLock<Report> = OnceLock::new();
        REPORT.get_or_init(run)
    }

    fn status(name: &str) -> (Status, &'static str) {
        let c = report()
            .get(name)
            .unwrap_or_else(|| panic!("check {name} missing"));
        (c.status, c.detail.as_str())
    }

    #[test]
    fn errno_details_name_the_errno() {
        let e = io::Error::from_raw_os_error(libc::EOPNOTSUPP);
        assert_eq!(os_err("bind", &e), "bind: EOPNOTSUPP (errno 95)");
        assert_eq!(errno_name(libc::ENOBUFS), Some("ENOBUFS"));
        assert!(os_err("x", &io::Error::from_raw_os_error(4000)).starts_with("x: errno 4000"));
        assert_eq!(os_err("x", &io::Error::other("boom")), "x: boom");
        let lib = Error::io("connect", io::Error::from_raw_os_error(libc::ECONNREFUSED));
        assert_eq!(err_detail(&lib), "connect: ECONNREFUSED (errno 111)");
    }

    #[test]
    fn sizes_and_percentages_read_well() {
        assert_eq!(zcnet::stats::fmt_bytes(4000), "4000 B");
        assert_eq!(zcnet::stats::fmt_bytes(64 * 1024), "64 KiB");
        assert_eq!(zcnet::stats::fmt_bytes(8 << 20), "8 MiB");
        assert_eq!(zcnet::stats::fmt_bytes(3 << 19), "1.5 MiB");
        assert_eq!(zcnet::stats::fmt_bytes(100_000), "97.7 KiB");
        assert_eq!(zcnet::stats::fmt_bytes(0), "0 B");
        assert_eq!(fmt_pct(1.0), "100%");
        assert_eq!(fmt_pct(0.0), "0%");
        assert_eq!(fmt_pct(0.937), "93.7%");
        assert_eq!(fmt_pct(0.99999), "100%");
    }

    fn zc_stats(calls: u64, completed: u64, bytes: u64, copied: u64) -> StatsSnapshot {
        let s = Stats::new();
        s.add_tx_zerocopy_calls(calls);
        s.add_tx_completed_calls(completed);
        s.add_tx_notifications(completed.min(1));
        s.add_tx_zerocopy_bytes(bytes);
        s.add_tx_zc_copied_bytes(copied);
        s.snapshot()
    }

    #[test]
    fn zerocopy_send_status_follows_completions_and_copied_bytes() {
        let (st, d) = judge_zc_send(&zc_stats(16, 16, 1 << 20, 1 << 20));
        assert_eq!(st, Status::Partial);
        assert!(
            d.starts_with("local delivery copies (SO_EE_CODE_ZEROCOPY_COPIED on 100% of bytes)"),
            "{d}"
        );
        assert!(
            d.contains("16/16 sends completed in 1 notification(s), 1 MiB sent"),
            "{d}"
        );
        assert_eq!(judge_zc_send(&zc_stats(16, 16, 1 << 20, 0)).0, Status::Yes);
        let (st, d) = judge_zc_send(&zc_stats(16, 16, 1000, 250));
        assert_eq!(st, Status::Partial);
        assert!(d.contains("copied 25.0% of bytes"), "{d}");
        let (st, d) = judge_zc_send(&zc_stats(16, 0, 1 << 20, 0));
        assert_eq!(st, Status::No);
        assert!(d.contains("no completion arrived"), "{d}");
        let s = Stats::new();
        s.fallback(FallbackReason::Unsupported, 4096);
        let (st, d) = judge_zc_send(&s.snapshot());
        assert_eq!(st, Status::No);
        assert!(d.contains("unsupported: 1 ops, 4 KiB"), "{d}");
    }

    #[test]
    fn mapped_share_decides_the_receive_status() {
        assert_eq!(judge_mapped(100, 100), Status::Yes);
        assert_eq!(judge_mapped(51, 100), Status::Yes);
        assert_eq!(judge_mapped(50, 100), Status::Partial);
        assert_eq!(judge_mapped(1, 100), Status::Partial);
        assert_eq!(judge_mapped(0, 100), Status::No);
        assert_eq!(judge_mapped(0, 0), Status::No);
    }

    #[test]
    fn udp_reads_are_grouped_and_judged() {
        let split = [(1000, None); 4];
        let whole = [(4000, Some(1000))];
        assert_eq!(
            describe_reads(&split),
            "4 reads of 1000 B (no UDP_GRO cmsg)"
        );
        assert_eq!(describe_reads(&whole), "1 read of 4000 B (gso_size 1000)");
        assert_eq!(
            describe_reads(&[(1000, None), (3000, Some(1000))]),
            "1 read of 1000 B (no UDP_GRO cmsg), 1 read of 3000 B (gso_size 1000)"
        );
        assert_eq!(describe_reads(&[]), "nothing arrived");
        assert_eq!(judge_gso(&[1000; 4], 1000, 4000), Status::Yes);
        assert_eq!(judge_gso(&[1000, 1000, 500], 1000, 2500), Status::Yes);
        assert_eq!(judge_gso(&[4000], 1000, 4000), Status::No);
        assert_eq!(judge_gso(&[], 1000, 4000), Status::No);
        assert_eq!(judge_gro(&whole, 4000), Status::Yes);
        assert_eq!(judge_gro(&split, 4000), Status::Partial);
        assert_eq!(judge_gro(&[(1000, Some(1000))], 4000), Status::No);
    }

    #[test]
    fn pattern_catches_misplaced_pages_and_bytes() {
        let p = Pattern::new(4096);
        let stream: Vec<u8> = (0..20_000u64).map(|i| (i % 251) as u8).collect();
        assert_eq!(p.first_mismatch(0, &stream), None);
        assert_eq!(p.first_mismatch(12_345, &stream[12_345..]), None);
        let mut swapped = stream.clone();
        swapped.copy_within(8192..12288, 4096); // page 2 where page 1 belongs
        assert_eq!(p.first_mismatch(0, &swapped), Some(4096));
        let mut flipped = stream;
        flipped[9999] ^= 1;
        assert_eq!(p.first_mismatch(0, &flipped), Some(9999));
    }

    #[test]
    fn table_aligns_columns() {
        let r = Report {
            kernel: "6.18.0-test".into(),
            checks: vec![
                Check::yes("a", "fine"),
                Check::new("longer_name", Status::Partial, "with a caveat"),
            ],
        };
        let text = r.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "kernel 6.18.0-test");
        assert_eq!(lines[2], "check        result   detail");
        assert_eq!(lines[3], "a            yes      fine");
        assert_eq!(lines[4], "longer_name  partial  with a caveat");
        assert_eq!(
            r.get("longer_name").map(|c| c.status),
            Some(Status::Partial)
        );
        assert!(r.get("missing").is_none());
    }

    #[test]
    fn a_panicking_or_stuck_check_is_reported_not_propagated() {
        // A deadline far beyond any panic hook's time: this case is about the panic.
        let got = bounded_by(Duration::from_secs(120), &["p"], || panic!("kaboom"));
        assert_eq!(got[0].status, Status::No);
        assert!(got[0].detail.contains("kaboom"), "{}", got[0].detail);
        // The closure outlives the limit; `bounded` must answer without waiting for it.
        let limit = Duration::from_millis(200);
        let started = std::time::Instant::now();
        let got = bounded_by(limit, &["slow", "other"], || {
            std::thread::sleep(Duration::from_secs(30));
            vec![]
        });
        if started.elapsed() >= Duration::from_secs(30) {
            panic!("hang guard: bounded waited for the closure past its limit");
        }
        assert_eq!(got.len(), 2);
        assert!(got
            .iter()
            .all(|c| c.status == Status::No && c.detail.starts_with("no answer within")));
        let got = bounded(&["x", "y"], || vec![Check::yes("y", "ok")]);
        assert_eq!((got[0].name, got[0].status), ("x", Status::No));
        assert_eq!((got[1].name, got[1].status), ("y", Status::Yes));
    }

    // The real probe on this machine (Linux 6.18, root; docs/measurements/kernel-findings.md §1–§6).

    #[test]
    fn every_check_reports_once_in_order_with_a_detail() {
        let names: Vec<&str> = report().checks.iter().map(|c| c.name).collect();
        assert_eq!(names, CHECKS);
        for c in &report().checks {
            assert!(!c.detail.trim().is_empty(), "{} has no detail", c.name);
        }
        let osrelease = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        assert_eq!(report().kernel, osrelease.trim());
        let table = report().to_string();
        for name in CHECKS {
            assert!(table.contains(name), "{name} missing from the table");
        }
    }

    /// kTLS follows the kernel: where `tcp_available_ulp` does not list `tls` (this
    /// machine's lists only `mptcp`) the check says so with the kernel's reason; where it
    /// does, the keys are taken.
    #[test]
    fn ktls_is_reported_with_the_kernels_answer() {
        let listed = zcnet_sys::raw::ktls::available_ulps().unwrap();
        let (st, detail) = status("ktls");
        if listed.split_whitespace().any(|u| u == "tls") {
            assert_eq!(st, Status::Yes, "{detail}");
        } else {
            assert_eq!(st, Status::No, "{detail}");
            assert!(
                detail.starts_with("kTLS unavailable: the kernel has no `tls` upper-layer protocol (TCP_ULP answered ENOENT"),
                "{detail}"
            );
            assert!(
                detail.contains(&format!("tcp_available_ulp: {listed}")),
                "{detail}"
            );
        }
    }

    #[test]
    fn so_zerocopy_is_accepted_on_tcp_and_udp() {
        assert_eq!(status("so_zerocopy_tcp").0, Status::Yes);
        assert_eq!(status("so_zerocopy_udp").0, Status::Yes);
    }

    #[test]
    fn loopback_msg_zerocopy_completes_but_copies() {
        let (st, d) = status("msg_zerocopy_tcp_loopback");
        assert_eq!(st, Status::Partial, "{d}");
        assert!(
            d.contains("SO_EE_CODE_ZEROCOPY_COPIED on 100% of bytes"),
            "{d}"
        );
        assert!(d.contains("16/16 sends completed"), "{d}");
    }

    #[test]
    fn sendfile_and_splice_move_verified_bytes_on_loopback() {
        for name in ["sendfile", "splice"] {
            let (st, d) = status(name);
            assert_eq!(st, Status::Yes, "{name}: {d}");
            assert!(d.contains("verified"), "{name}: {d}");
        }
    }

    #[test]
    fn loopback_zerocopy_receive_maps_most_pages() {
        let (st, d) = status("tcp_zerocopy_receive");
        assert_eq!(st, Status::Yes, "{d}");
        assert!(
            d.starts_with("mapped ") && d.contains("of 8 MiB with MSS"),
            "{d}"
        );
    }

    #[test]
    fn io_uring_zero_copy_opcodes_are_known() {
        for name in IO_URING_CHECKS {
            let (st, d) = status(name);
            assert_eq!(st, Status::Yes, "{name}: {d}");
        }
        assert!(status("io_uring_recv_zc").1.contains("opcode 58"));
    }

    #[cfg_attr(
        not(zcnet_root),
        ignore = "needs root (CAP_NET_ADMIN: without it zcrx registration is EPERM)"
    )]
    #[test]
    fn io_uring_buffers_are_exercised_and_zcrx_refusal_is_explained() {
        let (st, d) = status("io_uring_fixed_buffers");
        assert_eq!(st, Status::Partial, "{d}");
        assert!(d.contains("ZC_COPIED on 100% of bytes"), "{d}");
        let (st, d) = status("io_uring_buf_ring");
        assert_eq!(st, Status::Yes, "{d}");
        assert!(d.contains("4 MiB received"), "{d}");
        let (st, d) = status("io_uring_zcrx");
        assert_eq!(st, Status::No, "{d}");
        assert!(
            d.starts_with("EOPNOTSUPP (errno 95) on lo: no header split/queue API"),
            "{d}"
        );
        assert!(d.contains("ordinary ring gets EINVAL"), "{d}");
    }

    #[test]
    fn userfaultfd_write_protect_works_and_refuses_kernel_writes() {
        let (st, d) = status("userfaultfd_wp");
        assert_eq!(st, Status::Yes, "{d}");
        assert!(d.contains("got EFAULT"), "{d}");
        assert!(d.contains("PAGEFAULT_FLAG_WP yes"), "{d}");
    }

    #[test]
    fn udp_gso_segments_and_gro_delivers_the_gso_packet_whole() {
        let (st, d) = status("udp_gso");
        assert_eq!(st, Status::Yes, "{d}");
        assert!(d.contains("4 reads of 1000 B"), "{d}");
        let (st, d) = status("udp_gro");
        assert_eq!(st, Status::Yes, "{d}");
        assert!(d.contains("1 read of 4000 B (gso_size 1000)"), "{d}");
    }

    #[test]
    fn limits_are_read_from_the_running_kernel() {
        let optmem = std::fs::read_to_string("/proc/sys/net/core/optmem_max").unwrap();
        let (st, d) = status("optmem_max");
        assert_eq!(st, Status::Yes);
        assert!(d.contains(&format!("= {} (", optmem.trim())), "{d}");
        let (st, d) = status("rlimit_memlock");
        assert_eq!(st, Status::Yes);
        assert!(d.starts_with("soft "), "{d}");
    }

    #[cfg_attr(
        not(zcnet_netns),
        ignore = "needs root and iproute2 (AF_XDP sockets and a veth pair)"
    )]
    #[test]
    fn af_xdp_registers_both_umem_modes_and_binds_veth_in_copy_mode_only() {
        for name in XSK_CHECKS {
            let (st, d) = status(name);
            assert_eq!(st, Status::Yes, "{name}: {d}");
        }
        assert!(status("af_xdp_umem_unaligned").1.contains("3000 B chunks"));
        // veth has no XSK zero-copy (docs/measurements/kernel-findings.md §7): the errno, not a vague "no".
        let (st, d) = status("af_xdp_bind_zerocopy");
        assert_eq!(st, Status::No, "{d}");
        assert!(d.starts_with("EOPNOTSUPP (errno 95)"), "{d}");
        let (st, d) = status("af_xdp_bind_copy");
        assert_eq!(st, Status::Yes, "{d}");
        assert!(
            d.contains("1000 B UDP datagram") && d.contains("bytes verified"),
            "{d}"
        );
        for name in ["xdp_attach_native", "xdp_attach_generic", "lm_xdp_program"] {
            let (st, d) = status(name);
            assert_eq!(st, Status::Yes, "{name}: {d}");
        }
    }
}
