//! The `auto` transmit path: per operation, the path this host's profile measured cheapest.
//!
//! Loaned buffers ([`crate::Sender::send`]) choose among `copy`, `zerocopy` and `uring`;
//! `send_slice` callers keep copy semantics, so their choice is between `copy` and `cow`. The
//! decision is [`crate::auto`]'s: [`Chooser`] by size and alignment, `Hysteresis` so a stream
//! does not flap, `Demotion` when completions keep coming back `COPIED` on a path the profile
//! measured going zero-copy, with a re-probe after a back-off counted in operations. Every
//! decision, hold, switch and demotion is added to [`Stats`] with its reason.
//!
//! One socket, several paths: plain `send`, `MSG_ZEROCOPY` and io_uring `SEND_ZC` can be
//! mixed on one TCP socket because each call returns only once its bytes are queued
//! (`uring` waits for the request's result CQE), so the stream keeps the order of the calls.
//! Only one `MSG_ZEROCOPY` user may read the socket's error queue (completion ids are one
//! per-socket sequence), so loaned zero-copy sends go through the `cow` path's state when
//! `cow` may be chosen for slices — it sends loaned buffers exactly as `zerocopy` does.
//! Sub-paths run with [`Policy::always`]: the profile, not a fixed size threshold, decides,
//! and demotion is this module's, not the sub-path's.

use super::{copy::CopyTx, cow::CowTx, uring::UringTx, zerocopy::ZerocopyTx, Transmit};
use crate::auto::demotion::{DEMOTE_AFTER, MAX_REPROBE_AFTER_OPS, REPROBE_AFTER_OPS};
use crate::auto::pair;
use crate::auto::{
    AutoStats, Choice, ChoiceReason, Chooser, CostCheck, Demotion, DemotionReason, Hysteresis,
    Measurement, Profile, Report, Route,
};
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

/// Consecutive operations that must prefer another path before a stream switches.
pub(crate) const HYSTERESIS_OPS: u32 = 8;

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

/// A remembered decision: (size, aligned) and what the chooser said.
type Memo = Option<((usize, bool), Choice<TxPath>)>;
/// A copy-only stream's remembered decision: (size, aligned) and the counters it adds
/// ([`AutoStats::touched`]), or `None` where the chooser did not say copy.
type CopyMemo = Option<((usize, bool), Option<Vec<usize>>)>;

/// State of the auto path on one socket.
pub(crate) struct AutoTx {
    copy: CopyTx,
    zc: Option<ZcState>,
    uring: Option<UringTx>,
    buf_chooser: Chooser<TxPath>,
    slice_chooser: Chooser<TxPath>,
    buf_hyst: Hysteresis<TxPath>,
    slice_hyst: Hysteresis<TxPath>,
    demotion: Demotion<TxPath>,
    ops: u64,
    marks: (u64, u64),
    zc_ok: bool,
    /// The last decision per kind (slice, buf), keyed by (size, aligned): a stream repeats
    /// its size, and interpolating the curves on every 4 KiB send would cost a noticeable
    /// share of the send itself.
    memo: [Memo; 2],
    /// The run-time cost check per kind (buf, slice): the wanted path against copy, in
    /// this thread's CPU per byte on this connection.
    cost: [CostCheck<TxPath>; 2],
    /// The remembered decisions of a copy-only stream ([`AutoTx::count_copy_only`]).
    copy_memo: [CopyMemo; 2],
}

/// The chooser over the paths `keep` admits: from the profile's pair table where it has one
/// (`pairs`: the sender's half of the cheapest pair, assuming the peer is `auto` on the same
/// profile — a peer that is not costs the check below a probe), else from the single-end
/// table, else the built-in default.
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

impl AutoTx {
    pub(crate) fn new(fd: BorrowedFd<'_>, s: AutoSetup<'_>) -> Self {
        let buf_chooser = chooser(s.profile, s.touch, true, |p| {
            matches!(p, TxPath::Copy | TxPath::Zerocopy | TxPath::Uring)
        });
        // `send_slice` keeps copy semantics (copy or cow); `tune` measures cow into a copy
        // receiver only, so its table is the single-end one.
        let slice_chooser = chooser(s.profile, s.touch, false, |p| {
            matches!(p, TxPath::Copy | TxPath::Cow)
        });
        let policy = Policy::always();
        let zc = if slice_chooser.can_choose(TxPath::Cow) {
            Some(ZcState::Cow(CowTx::new(
                fd, policy, s.cow, s.timeout, !s.zc_ok,
            )))
        } else if buf_chooser.may_want(TxPath::Zerocopy) {
            Some(ZcState::Zerocopy(ZerocopyTx::new(
                policy, s.timeout, !s.zc_ok,
            )))
        } else {
            None
        };
        let uring = buf_chooser
            .may_want(TxPath::Uring)
            .then(|| UringTx::new(s.pool, policy, s.timeout, s.stats));
        AutoTx {
            copy: CopyTx { timeout: s.timeout },
            zc,
            uring,
            buf_chooser,
            slice_chooser,
            buf_hyst: Hysteresis::new(TxPath::Copy, HYSTERESIS_OPS),
            slice_hyst: Hysteresis::new(TxPath::Copy, HYSTERESIS_OPS),
            demotion: Demotion::new(DEMOTE_AFTER, REPROBE_AFTER_OPS, MAX_REPROBE_AFTER_OPS),
            ops: 0,
            marks: s.stats.zc_completion_marks(),
            zc_ok: s.zc_ok,
            memo: [None, None],
            cost: [CostCheck::new(TxPath::Copy), CostCheck::new(TxPath::Copy)],
            copy_memo: [None, None],
        }
    }

    /// For a stream with no path but copy set up (no profile, or one that measured copy
    /// cheapest at every size — neither sub-path exists, and none is made later): counts the
    /// decision for an operation of `len` bytes at `addr` as [`AutoTx::decide`] would, and
    /// says whether it is copy (else the caller decides in full). Hysteresis, demotion and
    /// the cost check never act on copy; summing the thirty counters per operation and
    /// stepping through the rest cost a copying sender without a profile about 2 % of its
    /// CPU at 16 KiB on loopback (sampled with `perf`).
    fn count_copy_only(&mut self, len: usize, addr: usize, slice: bool, stats: &Stats) -> bool {
        if self.zc.is_some() || self.uring.is_some() {
            return false;
        }
        let key = (len, addr.is_multiple_of(page_size()));
        let memo = &mut self.copy_memo[usize::from(slice)];
        let at = match memo {
            Some((k, at)) if *k == key => at,
            _ => {
                let chooser = if slice {
                    &self.slice_chooser
                } else {
                    &self.buf_chooser
                };
                let c = chooser.choose(len as u64, key.1);
                let at = (c.path == TxPath::Copy).then(|| {
                    let mut d = AutoStats::default();
                    d.record_choice(&c);
                    d.touched()
                });
                &mut memo.insert((key, at)).1
            }
        };
        match at {
            Some(at) => {
                stats.count_auto_tx(at);
                self.ops += 1;
                true
            }
            None => false,
        }
    }

    /// Chooser → hysteresis → demotion for one operation of `len` bytes at `addr`.
    fn decide(&mut self, len: usize, addr: usize, slice: bool, delta: &mut AutoStats) -> TxPath {
        let aligned = addr.is_multiple_of(page_size());
        let (chooser, hyst) = if slice {
            (&self.slice_chooser, &mut self.slice_hyst)
        } else {
            (&self.buf_chooser, &mut self.buf_hyst)
        };
        let key = (len, aligned);
        let memo = &mut self.memo[usize::from(slice)];
        let choice = match *memo {
            Some((k, c)) if k == key => c,
            _ => {
                let mut c = chooser.choose(len as u64, aligned);
                // Where the profile cannot tell copy from a cheaper-looking loan path, the
                // loan path goes first and this connection's cost check below decides — as
                // the receive side runs its trial there. Over veth at 16K `tune` kept copy
                // so while `uring → copy` read 13 % cheaper. `send_slice` stays on copy: its
                // alternative is `cow`, whose protection costs it cannot take back.
                if c.reason == ChoiceReason::SpreadOverlap && !slice {
                    if let Some(p) = chooser.cheapest_median(len as u64) {
                        c.path = p;
                    }
                }
                *memo = Some((key, c));
                c
            }
        };
        delta.record_choice(&choice);
        let wanted = hyst.observe(choice.path, delta);
        let admitted = self
            .demotion
            .admit(wanted, TxPath::Copy, self.ops, delta)
            .path;
        // Last, the connection's own cost check: it only ever sends an operation to copy.
        match self.cost[usize::from(slice)].route(admitted, zcnet_sys::raw::cpu::thread_cpu_ns) {
            Route::Wanted(p) => p,
            Route::ProbeCopy(_) => {
                delta.cost_probe_ops += 1;
                TxPath::Copy
            }
            Route::Costlier(_) => {
                delta.fallback_costlier += 1;
                TxPath::Copy
            }
        }
    }

    /// [`AutoTx::decide`], counting an operation the demotion sent to `copy` as a fallback.
    fn decide_counted(
        &mut self,
        len: usize,
        addr: usize,
        slice: bool,
        stats: &Stats,
        delta: &mut AutoStats,
    ) -> TxPath {
        let before = (delta.fallback_demoted, delta.fallback_costlier);
        let path = self.decide(len, addr, slice, delta);
        if delta.fallback_demoted > before.0 {
            stats.fallback(FallbackReason::DemotedCopied, len as u64);
        }
        if delta.fallback_costlier > before.1 {
            stats.fallback(FallbackReason::Costlier, len as u64);
        }
        path
    }

    /// After an operation on zero-copy path `path`: did completions arrive, and were they
    /// copied? Reported to the demotion only where the profile expected zero-copy there.
    fn observe(&mut self, path: TxPath, len: usize, stats: &Stats, delta: &mut AutoStats) {
        let now = stats.zc_completion_marks();
        let (calls, copied) = (now.0 - self.marks.0, now.1 - self.marks.1);
        self.marks = now;
        if calls == 0 || path == TxPath::Copy {
            return;
        }
        let chooser = if path == TxPath::Cow {
            &self.slice_chooser
        } else {
            &self.buf_chooser
        };
        let report = if copied > 0 && chooser.expects_zero_copy(path, len as u64) {
            Report::Bad(DemotionReason::TxCopied)
        } else {
            Report::Good
        };
        // One report per completed call: the kernel batches notifications (one range can
        // cover hundreds of calls), and the demotion threshold counts calls, not batches.
        // A batch with any COPIED bytes counts as copied throughout — the kernel flags a
        // range only when a call in it was copied, and on a copying route all of them are.
        for _ in 0..calls.min(u64::from(DEMOTE_AFTER)) {
            if self.demotion.report(path, report, self.ops, delta) {
                break;
            }
        }
    }

    fn finish_op(
        &mut self,
        path: TxPath,
        len: usize,
        slice: bool,
        stats: &Stats,
        mut delta: AutoStats,
    ) {
        self.observe(path, len, stats, &mut delta);
        if let Some(v) =
            self.cost[usize::from(slice)].after(len as u64, zcnet_sys::raw::cpu::thread_cpu_ns)
        {
            delta.cost_checks += 1;
            if v.costlier {
                delta.cost_costlier += 1;
            }
        }
        self.ops += 1;
        stats.add_auto_tx(&delta);
    }
}

impl Transmit for AutoTx {
    fn send_buf(&mut self, fd: BorrowedFd<'_>, buf: TxBuf, stats: &Stats) -> Result<()> {
        let len = buf.len();
        if self.count_copy_only(len, buf.data_addr(), false, stats) {
            return self.copy.send_buf(fd, buf, stats);
        }
        let mut delta = AutoStats::default();
        let path = self.decide_counted(len, buf.data_addr(), false, stats, &mut delta);
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
        self.finish_op(path, len, false, stats, delta);
        r
    }

    fn send_owned(
        &mut self,
        fd: BorrowedFd<'_>,
        owned: Box<dyn Lend>,
        stats: &Stats,
        timeout: Duration,
    ) -> Result<()> {
        let (len, addr) = (owned.bytes().len(), owned.bytes().as_ptr() as usize);
        if self.count_copy_only(len, addr, false, stats) {
            return self.copy.send_owned(fd, owned, stats, timeout);
        }
        let mut delta = AutoStats::default();
        let path = self.decide_counted(len, addr, false, stats, &mut delta);
        let r = match (path, self.zc.as_mut()) {
            (TxPath::Zerocopy, Some(zc)) if self.zc_ok => {
                zc.tx().send_owned(fd, owned, stats, timeout)
            }
            (TxPath::Copy, _) => self.copy.send_owned(fd, owned, stats, timeout),
            _ => {
                // The wanted path cannot lend this memory here: copied, and counted.
                stats.fallback(FallbackReason::Unsupported, len as u64);
                self.copy.send_owned(fd, owned, stats, timeout)
            }
        };
        self.finish_op(path, len, false, stats, delta);
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
        let mut delta = AutoStats::default();
        let path = self.decide_counted(data.len(), data.as_ptr() as usize, true, stats, &mut delta);
        let r = match (path, self.zc.as_mut()) {
            (TxPath::Cow, Some(ZcState::Cow(c))) => c.send_slice(fd, data, stats, timeout),
            _ => super::plain::send_all(fd, data, stats, timeout),
        };
        self.finish_op(path, data.len(), true, stats, delta);
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
