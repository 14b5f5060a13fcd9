//! The `auto` transmit path: per operation, the path [`crate::auto`]'s decider answers.
//!
//! Loaned buffers ([`crate::Sender::send`]) choose among `copy`, `zerocopy` and `uring`;
//! `send_slice` callers keep copy semantics, so their choice is between `copy` and `cow`.
//! Each kind has its own `Decider` (the profile's choice by size and alignment, then the
//! connection's cost check); this module only sends where it answers and counts what it
//! decided in [`Stats`].
//!
//! The kernel overrides any profile: the zero-copy sub-paths run with the default
//! [`Policy`]'s `COPIED` demotion (minus its size threshold — the profile decides sizes),
//! so a sub-path whose completions come back `COPIED` copies, counted as
//! `FallbackReason::DemotedCopied`, and retries after a back-off, whatever the profile
//! measured.
//!
//! One socket, several paths: plain `send`, `MSG_ZEROCOPY` and io_uring `SEND_ZC` can be
//! mixed on one TCP socket because each call returns only once its bytes are queued
//! (`uring` waits for the request's result CQE), so the stream keeps the order of the calls.
//! Only one `MSG_ZEROCOPY` user may read the socket's error queue (completion ids are one
//! per-socket sequence), so loaned zero-copy sends go through the `cow` path's state when
//! `cow` may be chosen for slices — it sends loaned buffers exactly as `zerocopy` does.

use super::{copy::CopyTx, cow::CowTx, uring::UringTx, zerocopy::ZerocopyTx, Transmit};
use crate::auto::decide::{Decide, Decider};
use crate::auto::pair;
use crate::auto::{AutoStats, Chooser, Measurement, Profile};
use crate::buf::{Pool, TxBuf};
use crate::cow::CowPolicy;
use crate::error::Result;
use crate::lend::Lend;
use crate::path::FallbackReason;
use crate::path::TxPath;
use crate::policy::Policy;
use crate::stats::Stats;
use std::os::fd::BorrowedFd;
use std::time::Duration;
use zcnet_sys::mem::page_size;

/// What a `Sender` on the auto path needs to set up.
pub(crate) struct AutoSetup<'a> {
    pub profile: Option<&'a Profile>,
    pub touch: bool,
    pub pool: &'a Pool,
    pub cow: CowPolicy,
    pub timeout: Duration,
    /// `SO_ZEROCOPY` was accepted on the socket.
    pub zc_ok: bool,
    pub stats: &'a Stats,
}

/// The zero-copy sub-path that owns the socket's error queue.
enum ZcState {
    Zerocopy(ZerocopyTx),
    Cow(CowTx),
}

impl ZcState {
    fn tx(&mut self) -> &mut dyn Transmit {
        match self {
            ZcState::Zerocopy(t) => t,
            ZcState::Cow(t) => t,
        }
    }
    fn tx_ref(&self) -> &dyn Transmit {
        match self {
            ZcState::Zerocopy(t) => t,
            ZcState::Cow(t) => t,
        }
    }
}

/// A copy-only stream's remembered decision: (size, aligned) and the counters it adds
/// ([`AutoStats::touched`]).
type CopyMemo = Option<((usize, bool), Vec<usize>)>;

/// State of the auto path on one socket.
pub(crate) struct AutoTx {
    copy: CopyTx,
    zc: Option<ZcState>,
    uring: Option<UringTx>,
    zc_ok: bool,
    /// The decider per kind (buf, slice).
    decide: [Decider<TxPath>; 2],
    /// The remembered decisions of a copy-only stream ([`AutoTx::count_copy_only`]).
    copy_memo: [CopyMemo; 2],
}

/// The chooser over the paths `keep` admits: from the profile's pair table where it has one
/// (`pairs`: the sender's half of the cheapest pair, assuming the peer is `auto` on the same
/// profile — a peer that is not costs the check a probe), else from the single-end table,
/// else the built-in default.
fn chooser(
    profile: Option<&Profile>,
    touch: bool,
    pairs: bool,
    keep: impl Fn(TxPath) -> bool,
) -> Chooser<TxPath> {
    match profile {
        Some(p) => {
            let table = if pairs && pair::has_pairs(&p.pairs, touch) {
                pair::tx_rows(&p.pairs, touch)
            } else {
                p.tx.clone()
            };
            let rows: Vec<Measurement<TxPath>> =
                table.into_iter().filter(|m| keep(m.path)).collect();
            Chooser::from_measurements(&rows, touch)
        }
        None => Chooser::defaults(),
    }
}

fn cpu_ns() -> u64 {
    zcnet_sys::raw::cpu::thread_cpu_ns()
}

impl AutoTx {
    pub(crate) fn new(fd: BorrowedFd<'_>, s: AutoSetup<'_>) -> Self {
        let buf = Decider::new(
            chooser(s.profile, s.touch, true, |p| {
                matches!(p, TxPath::Copy | TxPath::Zerocopy | TxPath::Uring)
            }),
            true,
        );
        // `send_slice` keeps copy semantics (copy or cow) and stays on copy where the profile
        // cannot tell (cow's protection costs it cannot take back); `tune` measures cow into
        // a copy receiver only, so its table is the single-end one.
        let slice = Decider::new(
            chooser(s.profile, s.touch, false, |p| {
                matches!(p, TxPath::Copy | TxPath::Cow)
            }),
            false,
        );
        // The profile decides sizes; the kernel's COPIED reports still demote (module doc).
        let policy = Policy::default()
            .with_min_zerocopy_bytes(1)
            .with_page_aligned(false);
        let zc = if slice.may_want(TxPath::Cow) {
            Some(ZcState::Cow(CowTx::new(
                fd, policy, s.cow, s.timeout, !s.zc_ok,
            )))
        } else if buf.may_want(TxPath::Zerocopy) {
            Some(ZcState::Zerocopy(ZerocopyTx::new(
                policy, s.timeout, !s.zc_ok,
            )))
        } else {
            None
        };
        let uring = buf
            .may_want(TxPath::Uring)
            .then(|| UringTx::new(s.pool, policy, s.timeout, s.stats));
        AutoTx {
            copy: CopyTx { timeout: s.timeout },
            zc,
            uring,
            zc_ok: s.zc_ok,
            decide: [buf, slice],
            copy_memo: [None, None],
        }
    }

    /// For a stream with no path but copy set up (no profile, or one that measured copy
    /// cheapest at every size): counts the decision for an operation of `len` bytes at
    /// `addr` as the decider would, without stepping through it — the cost check never acts
    /// on copy, and summing the thirty counters per operation cost a copying sender about
    /// 2 % of its CPU at 16 KiB on loopback (sampled with `perf`). Says whether it was
    /// counted (else the caller decides in full).
    fn count_copy_only(&mut self, len: usize, addr: usize, slice: bool, stats: &Stats) -> bool {
        if self.zc.is_some() || self.uring.is_some() {
            return false;
        }
        let key = (len, addr.is_multiple_of(page_size()));
        let k = usize::from(slice);
        let at = match &self.copy_memo[k] {
            Some((m, at)) if *m == key => at,
            _ => {
                let c = self.decide[k].choice(len as u64, key.1);
                let mut d = AutoStats::default();
                d.record_choice(&c);
                &self.copy_memo[k].insert((key, d.touched())).1
            }
        };
        stats.count_auto_tx(at);
        true
    }

    /// The decider's path for one operation of `len` bytes at `addr`; an operation the
    /// cost check sent to copy is counted as a fallback too.
    fn decide(&mut self, len: usize, addr: usize, slice: bool, stats: &Stats) -> TxPath {
        let mut delta = AutoStats::default();
        let aligned = addr.is_multiple_of(page_size());
        let path = self.decide[usize::from(slice)].next(len as u64, aligned, &cpu_ns, &mut delta);
        if delta.fallback_costlier > 0 {
            stats.fallback(FallbackReason::Costlier, len as u64);
        }
        stats.add_auto_tx(&delta);
        path
    }

    fn finish_op(&mut self, len: usize, slice: bool, stats: &Stats) {
        let mut delta = AutoStats::default();
        self.decide[usize::from(slice)].done(len as u64, &cpu_ns, &mut delta);
        if delta != AutoStats::default() {
            stats.add_auto_tx(&delta);
        }
    }
}

impl Transmit for AutoTx {
    fn send_buf(&mut self, fd: BorrowedFd<'_>, buf: TxBuf, stats: &Stats) -> Result<()> {
        let len = buf.len();
        if self.count_copy_only(len, buf.data_addr(), false, stats) {
            return self.copy.send_buf(fd, buf, stats);
        }
        let path = self.decide(len, buf.data_addr(), false, stats);
        let r = match (path, self.zc.as_mut(), self.uring.as_mut()) {
            (TxPath::Zerocopy, Some(zc), _) if self.zc_ok => zc.tx().send_buf(fd, buf, stats),
            (TxPath::Uring, _, Some(u)) => u.send_buf(fd, buf, stats),
            (TxPath::Copy, _, _) => self.copy.send_buf(fd, buf, stats),
            _ => {
                // SO_ZEROCOPY refused on this socket: the wanted path cannot run.
                stats.fallback(FallbackReason::Unsupported, len as u64);
                self.copy.send_buf(fd, buf, stats)
            }
        };
        self.finish_op(len, false, stats);
        r
    }

    fn send_lent(
        &mut self,
        fd: BorrowedFd<'_>,
        owned: Box<dyn Lend>,
        stats: &Stats,
        timeout: Duration,
    ) -> Result<()> {
        let (len, addr) = (owned.bytes().len(), owned.bytes().as_ptr() as usize);
        if self.count_copy_only(len, addr, false, stats) {
            return self.copy.send_lent(fd, owned, stats, timeout);
        }
        let path = self.decide(len, addr, false, stats);
        let r = match (path, self.zc.as_mut()) {
            (TxPath::Zerocopy, Some(zc)) if self.zc_ok => {
                zc.tx().send_lent(fd, owned, stats, timeout)
            }
            (TxPath::Copy, _) => self.copy.send_lent(fd, owned, stats, timeout),
            _ => {
                // The wanted path cannot lend this memory here: copied, and counted.
                stats.fallback(FallbackReason::Unsupported, len as u64);
                self.copy.send_lent(fd, owned, stats, timeout)
            }
        };
        self.finish_op(len, false, stats);
        r
    }

    fn send_slice(
        &mut self,
        fd: BorrowedFd<'_>,
        data: &[u8],
        stats: &Stats,
        timeout: Duration,
    ) -> Result<()> {
        if self.count_copy_only(data.len(), data.as_ptr() as usize, true, stats) {
            return super::plain::send_all(fd, data, stats, timeout);
        }
        let path = self.decide(data.len(), data.as_ptr() as usize, true, stats);
        let r = match (path, self.zc.as_mut()) {
            (TxPath::Cow, Some(ZcState::Cow(c))) => c.send_slice(fd, data, stats, timeout),
            _ => super::plain::send_all(fd, data, stats, timeout),
        };
        self.finish_op(data.len(), true, stats);
        r
    }

    fn reap(&mut self, fd: BorrowedFd<'_>, stats: &Stats) -> Result<usize> {
        let mut n = 0;
        if let Some(zc) = self.zc.as_mut() {
            n += zc.tx().reap(fd, stats)?;
        }
        if let Some(u) = self.uring.as_mut() {
            n += u.reap(fd, stats)?;
        }
        Ok(n)
    }

    fn wait(&mut self, fd: BorrowedFd<'_>, stats: &Stats, timeout: Duration) -> Result<usize> {
        let zc_busy = self
            .zc
            .as_ref()
            .is_some_and(|z| z.tx_ref().buffers_in_flight() > 0);
        let uring_busy = self
            .uring
            .as_ref()
            .is_some_and(|u| u.buffers_in_flight() > 0);
        // Both busy: split the wait so neither's completions sit unread for long.
        let slice = if zc_busy && uring_busy {
            timeout / 2
        } else {
            timeout
        };
        let mut n = 0;
        if let (true, Some(zc)) = (zc_busy, self.zc.as_mut()) {
            n += zc.tx().wait(fd, stats, slice)?;
        }
        if let (true, Some(u)) = (uring_busy, self.uring.as_mut()) {
            n += u.wait(fd, stats, slice)?;
        }
        Ok(n + self.reap(fd, stats)?)
    }

    fn buffers_in_flight(&self) -> usize {
        self.zc
            .as_ref()
            .map_or(0, |z| z.tx_ref().buffers_in_flight())
            + self.uring.as_ref().map_or(0, |u| u.buffers_in_flight())
    }

    fn abandon(&mut self) -> usize {
        self.zc.as_mut().map_or(0, |z| z.tx().abandon())
            + self.uring.as_mut().map_or(0, |u| u.abandon())
    }
}
