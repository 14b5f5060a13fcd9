//! The `auto` receive path: which receive path a connection takes, from this host's profile,
//! and the run-time check that keeps it only while it costs no more than copy.
//!
//! The choice is made once per connection, from the receiver's operation size
//! (`ReceiverConfig::op_size`): the mapping path's page-multiple MSS has to be advertised
//! before the handshake, and an io_uring multishot `recv` cannot share the socket with a
//! plain `recv` while it is armed. Where the profile has a pair table (both ends measured
//! together on this host), the receiver takes its half of the cheapest pair
//! ([`crate::auto::pair`]); else the single-end table; without a profile it *tries* `uring`
//! (multishot `recv` into provided buffers: still a copy, with one syscall for many reads)
//! and keeps it unless the check below finds it dearer than copy.
//!
//! At run time [`AutoRx`] measures its own cost, as the transmit side does
//! ([`crate::auto::cost`]): a window of bytes on the chosen path, one settling window and one
//! measured window on copy, in the receiving thread's CPU clock per byte, on this
//! connection. A path costlier than copy by more than 5 % in two comparisons in a row is left
//! for a back-off that doubles while the verdict stands. Switching is safe mid-stream: `mmap`
//! reads with plain `recv` while told to ([`MmapRx::set_copy`]; `TCP_ZEROCOPY_RECEIVE` and
//! `recv` take the same queue in order), and `uring` is parked — its request cancelled and
//! what it had received handed out first — before plain `recv` reads the socket
//! ([`UringRx::park`]). Still demoted online too: `mmap` while the kernel maps nothing
//! ([`super::mmap`]).

use super::copy::CopyRx;
use super::mmap::MmapRx;
use super::uring::UringRx;
use super::{Receive, RxChunk};
use crate::auto::ProfileSource;
use crate::auto::{load, pair, AutoStats, Chooser, CostCheck, Route};
use crate::error::Result;
use crate::path::{FallbackReason, RxPath};
use crate::stats::Stats;
use std::net::IpAddr;
use std::os::fd::BorrowedFd;

/// The decision for one listener or connection.
#[derive(Debug, Clone)]
pub(crate) struct AutoRxChoice {
    /// The concrete path.
    pub path: RxPath,
    /// Whether the profile measured `mmap` mapping at this size (demote if it then does not).
    pub expect_mapping: bool,
    /// No profile: `path` is tried, and kept only while no dearer than copy.
    pub trial: bool,
    /// Why no profile is in force, if none is.
    pub note: Option<String>,
    /// The decision, for `Stats`.
    pub delta: AutoStats,
}

/// Chooses the receive path for a receiver bound to (or accepted at) `local` that receives
/// `op_size` bytes per call (and reads them, if `touch`), by the profile `profile` names.
pub(crate) fn choose(
    profile: &ProfileSource,
    touch: bool,
    op_size: usize,
    local: IpAddr,
) -> AutoRxChoice {
    let loaded = load::load(profile, local);
    let chooser = match loaded.profile.as_deref() {
        // Both ends measured together on this host: the receiver's half of the cheapest
        // pair (the sender, if `auto` on the same profile, takes the other half).
        Some(p) if pair::has_pairs(&p.pairs, touch) => {
            Chooser::from_measurements(&pair::rx_rows(&p.pairs, touch), touch)
        }
        Some(p) => Chooser::from_measurements(&p.rx, touch),
        None => Chooser::defaults(),
    };
    let size = op_size.max(1) as u64;
    let choice = chooser.choose(size, true);
    let mut delta = AutoStats::default();
    // Nothing measured here, and not told to stay on the built-in default: try `uring`.
    let trial = choice.reason == crate::auto::ChoiceReason::NoProfile
        && !matches!(profile, ProfileSource::BuiltIn);
    let path = if trial {
        delta.decisions += 1;
        delta.chose_trial += 1;
        RxPath::Uring
    } else {
        delta.record_choice(&choice);
        choice.path
    };
    AutoRxChoice {
        path,
        expect_mapping: chooser.expects_zero_copy(RxPath::Mmap, size),
        trial,
        note: loaded.note,
        delta,
    }
}

/// The path besides copy that an [`AutoRx`] may take.
pub(crate) enum Alt {
    /// `TCP_ZEROCOPY_RECEIVE`; it reads with plain `recv` itself when told to.
    Mmap(MmapRx),
    /// Multishot `recv` into provided buffers; parked while copy reads.
    Uring(Box<UringRx>),
}

/// Which receiver an operation goes to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    Alt,
    Copy,
}

/// The `auto` receive path with its run-time cost check (see the module docs).
pub(crate) struct AutoRx {
    copy: CopyRx,
    alt: Alt,
    /// The path the choice (or the trial) wants.
    wanted: RxPath,
    /// `uring` owns the socket: armed, or parked with bytes still to hand out.
    uring_on: bool,
    check: CostCheck<RxPath>,
    /// What a parked `uring` had received when the socket was released
    /// ([`Receive::release_socket`]), and how much of it is handed out.
    held: Vec<u8>,
    held_off: usize,
}

impl AutoRx {
    /// `alt` is the path `choice` chose; the check measures windows of `window` bytes.
    pub(crate) fn new(copy: CopyRx, alt: Alt, choice: &AutoRxChoice, window: u64) -> Self {
        use crate::auto::cost::{BACKOFF_WINDOWS, CONFIRM, MARGIN, MAX_GAP_WINDOWS};
        use crate::auto::cost::{MAX_RECHECK_WINDOWS, RECHECK_WINDOWS};
        let check = CostCheck::with(
            RxPath::Copy,
            window,
            MARGIN,
            (RECHECK_WINDOWS, MAX_RECHECK_WINDOWS),
            (BACKOFF_WINDOWS, MAX_GAP_WINDOWS),
        )
        .confirm(CONFIRM);
        AutoRx {
            copy,
            alt,
            wanted: choice.path,
            uring_on: true,
            check,
            held: Vec::new(),
            held_off: 0,
        }
    }

    /// The cost check's route for the next operation, and the switch it implies.
    fn prepare(
        &mut self,
        fd: BorrowedFd<'_>,
        stats: &Stats,
        delta: &mut AutoStats,
    ) -> Result<(Use, bool)> {
        let (want_alt, costlier) = match self
            .check
            .route(self.wanted, zcnet_sys::raw::cpu::thread_cpu_ns)
        {
            Route::Wanted(_) => (true, false),
            Route::ProbeCopy(_) => {
                delta.cost_probe_ops += 1;
                (false, false)
            }
            Route::Costlier(_) => (false, true),
        };
        let use_ = match &mut self.alt {
            Alt::Mmap(m) => {
                m.set_copy(!want_alt);
                Use::Alt
            }
            Alt::Uring(u) if want_alt => {
                if u.is_parked() {
                    u.unpark();
                }
                self.uring_on = true;
                Use::Alt
            }
            Alt::Uring(u) if self.uring_on => {
                if !u.is_parked() {
                    // Not confirmed over in time: the parked ring keeps reading until its
                    // request's end is seen, so the order of the bytes still holds.
                    let _ = u.park();
                }
                if u.parked_drained(fd, stats)? {
                    self.uring_on = false;
                    Use::Copy
                } else {
                    Use::Alt
                }
            }
            Alt::Uring(_) => Use::Copy,
        };
        Ok((use_, costlier))
    }

    /// Hands up to `max` bytes of `held` to `sink`.
    fn take_held(
        &mut self,
        max: usize,
        sink: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<usize> {
        let rest = &self.held[self.held_off.min(self.held.len())..];
        let n = rest.len().min(max);
        if n == 0 {
            return Ok(0);
        }
        sink(&rest[..n])?;
        self.held_off += n;
        Ok(n)
    }

    /// After an operation that delivered `n` bytes.
    fn finish(
        check: &mut CostCheck<RxPath>,
        n: usize,
        costlier: bool,
        mut delta: AutoStats,
        stats: &Stats,
    ) {
        if let Some(v) = check.after(n as u64, zcnet_sys::raw::cpu::thread_cpu_ns) {
            delta.cost_checks += 1;
            if v.costlier {
                delta.cost_costlier += 1;
            }
        }
        if costlier && n > 0 {
            delta.fallback_costlier += 1;
            stats.fallback(FallbackReason::Costlier, n as u64);
        }
        if delta != AutoStats::default() {
            stats.add_auto_rx(&delta);
        }
    }
}

impl Receive for AutoRx {
    fn recv<'a>(&'a mut self, fd: BorrowedFd<'_>, stats: &Stats) -> Result<Option<RxChunk<'a>>> {
        if self.held_off >= self.held.len() && !self.held.is_empty() {
            self.held = Vec::new();
            self.held_off = 0;
        }
        if !self.held.is_empty() {
            let start = self.held_off;
            self.held_off = self.held.len();
            return Ok(Some(RxChunk::new(&self.held[start..], false)));
        }
        let mut delta = AutoStats::default();
        let (use_, costlier) = self.prepare(fd, stats, &mut delta)?;
        let AutoRx {
            copy, alt, check, ..
        } = self;
        let r = match (use_, alt) {
            (Use::Alt, Alt::Mmap(m)) => m.recv(fd, stats)?,
            (Use::Alt, Alt::Uring(u)) => u.recv(fd, stats)?,
            (Use::Copy, _) => copy.recv(fd, stats)?,
        };
        Self::finish(
            check,
            r.as_ref().map_or(0, |c| c.len()),
            costlier,
            delta,
            stats,
        );
        Ok(r)
    }

    fn recv_into(&mut self, fd: BorrowedFd<'_>, buf: &mut [u8], stats: &Stats) -> Result<usize> {
        let held = self.take_held(buf.len(), &mut |b| {
            buf[..b.len()].copy_from_slice(b);
            Ok(())
        })?;
        if held > 0 {
            return Ok(held);
        }
        let mut delta = AutoStats::default();
        let (use_, costlier) = self.prepare(fd, stats, &mut delta)?;
        let n = match (use_, &mut self.alt) {
            (Use::Alt, Alt::Mmap(m)) => m.recv_into(fd, buf, stats)?,
            (Use::Alt, Alt::Uring(u)) => u.recv_into(fd, buf, stats)?,
            (Use::Copy, _) => self.copy.recv_into(fd, buf, stats)?,
        };
        Self::finish(&mut self.check, n, costlier, delta, stats);
        Ok(n)
    }

    fn take_buffered(
        &mut self,
        max: usize,
        sink: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<usize> {
        let held = self.take_held(max, sink)?;
        if held > 0 {
            return Ok(held);
        }
        match &mut self.alt {
            Alt::Mmap(m) => m.take_buffered(max, sink),
            Alt::Uring(u) if self.uring_on => u.take_buffered(max, sink),
            Alt::Uring(_) => Ok(0),
        }
    }

    /// Parks `uring` and moves what it had received here, so the socket is plain reads'
    /// (or the caller's) from now on; the check may arm it again at a later receive.
    fn release_socket(&mut self, fd: BorrowedFd<'_>, stats: &Stats) -> Result<()> {
        let Alt::Uring(u) = &mut self.alt else {
            return Ok(());
        };
        if !self.uring_on {
            return Ok(());
        }
        if !u.is_parked() {
            let _ = u.park();
        }
        let mut rest = self.held.split_off(self.held_off);
        self.held.clear();
        self.held_off = 0;
        loop {
            while u.take_buffered(usize::MAX, &mut |b| {
                rest.extend_from_slice(b);
                Ok(())
            })? > 0
            {}
            if u.parked_drained(fd, stats)? {
                break;
            }
            if !u.has_held() {
                // Not drained and nothing taken: the end of the stream.
                break;
            }
        }
        self.held = rest;
        self.uring_on = false;
        Ok(())
    }

    fn socket_handover_ok(&self) -> bool {
        match &self.alt {
            Alt::Mmap(m) => m.socket_handover_ok(),
            Alt::Uring(_) => !self.uring_on,
        }
    }

    fn socket_bytes_taken(&mut self, n: u64) {
        if let Alt::Mmap(m) = &mut self.alt {
            m.socket_bytes_taken(n);
        }
    }

    fn recv_lend(
        &mut self,
        fd: BorrowedFd<'_>,
        scratch: &mut [u8],
        max: usize,
        stats: &Stats,
        sink: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<usize> {
        let held = self.take_held(max, sink)?;
        if held > 0 {
            return Ok(held);
        }
        let mut delta = AutoStats::default();
        let (use_, costlier) = self.prepare(fd, stats, &mut delta)?;
        let n = match (use_, &mut self.alt) {
            (Use::Alt, Alt::Mmap(m)) => m.recv_lend(fd, scratch, max, stats, sink)?,
            (Use::Alt, Alt::Uring(u)) => u.recv_lend(fd, scratch, max, stats, sink)?,
            (Use::Copy, _) => self.copy.recv_lend(fd, scratch, max, stats, sink)?,
        };
        Self::finish(&mut self.check, n, costlier, delta, stats);
        Ok(n)
    }
}
