//! The `auto` receive path: which receive path a connection takes, from this host's profile,
//! and the run-time check that keeps it only while it costs no more than copy.
//!
//! The choice is made once per connection, from the receiver's operation size
//! (`ReceiverConfig::op_size`): the mapping path's page-multiple MSS has to be advertised
//! before the handshake, and an io_uring multishot `recv` cannot share the socket with a
//! plain `recv` while it is armed. Where the profile has a pair table (both ends measured
//! together on this host), the receiver takes its half of the cheapest pair
//! (`crate::auto::pair`); else the single-end table. Without a profile it *measures* its
//! candidates (`TRIAL`: `uring`, multishot `recv` into provided buffers, still a copy with
//! one syscall for many reads; `mmap`, whose receive loop costs less than `recv`'s on some
//! routes even where it maps nothing) and copy in interleaved rounds
//! (`crate::auto::trial`), keeps the candidate whose paired median beats copy by the
//! margin (else copy), and keeps it only while the check below finds it no dearer than copy.
//!
//! At run time `AutoRx` measures its own cost, as the transmit side does
//! (`crate::auto::cost`): a window of bytes on the chosen path, one settling window and one
//! measured window on copy, in the receiving thread's CPU clock per byte, on this
//! connection. A path costlier than copy by more than 5 % in two comparisons in a row is left
//! for a back-off that doubles while the verdict stands. Switching is safe mid-stream: `mmap`
//! reads with plain `recv` while told to (`MmapRx::set_copy`; `TCP_ZEROCOPY_RECEIVE` and
//! `recv` take the same queue in order), and hands out what it holds before `uring` reads;
//! `uring` is parked — its request cancelled and what it had received handed out first —
//! before anyone else reads the socket (`UringRx::park`). Still demoted online too: `mmap` while the kernel maps nothing
//! ([`super::mmap`]).

use super::copy::CopyRx;
use super::mmap::MmapRx;
use super::uring::UringRx;
use super::{Receive, RxChunk};
use crate::auto::trial::{Step, Trial};
use crate::auto::ProfileSource;
use crate::auto::{load, pair, AutoStats, Chooser, CostCheck, Route};
use crate::error::Result;
use crate::path::{FallbackReason, RxPath};
use crate::stats::Stats;
use std::net::IpAddr;
use std::os::fd::BorrowedFd;

/// What a receiver without a profile tries, in this order, each against copy on the
/// connection ([`crate::auto::trial`]): `uring` (multishot `recv` into provided buffers:
/// still a copy, one syscall for many reads) and `mmap` (`TCP_ZEROCOPY_RECEIVE`, whose
/// receive loop costs less than `recv`'s on some routes even where it maps nothing).
pub(crate) const TRIAL: [RxPath; 2] = [RxPath::Uring, RxPath::Mmap];
/// Rounds of a trial: each measures one window of copy and of each candidate. Four, so a
/// candidate's median survives one disturbed round either way; with two candidates and
/// the default window (16 MiB, a quarter more to settle each) 240 MiB.
const TRIAL_ROUNDS: usize = 4;
/// Bytes a trial waits, on copy, for its sender's card to count a send (its key in the
/// trial memory) before it starts without it.
const PENDING_MAX_BYTES: u64 = 1 << 20;
/// Dearer verdicts in a row before the check leaves a trial's pick: one more than for a
/// profile's choice ([`crate::auto::cost::CONFIRM`]), as the pick already beat copy by the
/// margin in the median of [`TRIAL_ROUNDS`] paired windows — one or two dear windows are
/// weaker evidence than that.
const TRIAL_PICK_CONFIRM: u32 = 3;

/// The decision for one listener or connection.
#[derive(Debug, Clone)]
pub(crate) struct AutoRxChoice {
    /// The concrete path (a trial's first candidate).
    pub path: RxPath,
    /// Whether the profile measured `mmap` mapping at this size: the listener then advertises
    /// the page-multiple MSS (fixed before the handshake, where no kernel evidence exists
    /// yet; a copy sender pays for it in CPU no receive check can see).
    pub expect_mapping: bool,
    /// No profile, or one whose measurements could not tell (`SpreadOverlap`): the
    /// candidates tried ([`TRIAL`]); empty when a profile chose.
    pub trial: Vec<RxPath>,
    /// With a pairs table that could not tell: the receive half of its cheapest pair by
    /// median, and how much dearer than copy the receiver may find it
    /// ([`pair::rx_tolerance`]; from an older profile, the share of `copy → copy`'s cost the
    /// pair saved); the trial keeps it unless it measures it dearer than copy by more than
    /// that (or the margin) ([`Trial::favouring`]).
    pub favoured: Option<(RxPath, f64)>,
    /// How much dearer than copy the run-time check lets the chosen path be on the
    /// receiver's own clock before it leaves it: the margin, or — for the receive half of
    /// the pair a pairs table chose outright — that pair's tolerance
    /// ([`pair::rx_tolerance`]), as for a favoured trial pick.
    pub check_margin: f64,
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
    let paired = loaded
        .profile
        .as_deref()
        .is_some_and(|p| pair::has_pairs(&p.pairs, touch));
    let chooser = match loaded.profile.as_deref() {
        // Both ends measured together on this host: the receiver's half of the cheapest
        // pair (the sender, if `auto` on the same profile, takes the other half).
        Some(p) if paired => Chooser::from_measurements(&pair::rx_rows(&p.pairs, touch), touch),
        Some(p) => Chooser::from_measurements(&p.rx, touch),
        None => Chooser::defaults(),
    };
    let size = op_size.max(1) as u64;
    let choice = chooser.choose(size, true);
    let mut delta = AutoStats::default();
    // Nothing measured here, and not told to stay on the built-in default: try the
    // candidates. Likewise where the profile measured a path cheaper than copy but within
    // the spread of its repeats (`SpreadOverlap`): the profile cannot tell, so the
    // connection measures it itself, and a tie keeps copy — unless the table is a pairs
    // table, whose cheapest pair the trial then favours (below). Over veth at 16 KiB `tune`
    // kept copy so (2.382 [1.98–2.99] against mmap's 2.353 [1.95–2.93] CPU-s/GiB) while the
    // bench's medians put copy → mmap 10 % under copy → copy.
    use crate::auto::ChoiceReason;
    let trial = match choice.reason {
        ChoiceReason::NoProfile => !matches!(profile, ProfileSource::BuiltIn),
        ChoiceReason::SpreadOverlap => true,
        _ => false,
    };
    // The pairs' rows are the sums of both ends: where they put a candidate's pair cheapest
    // by median, the trial — which sees the receiver alone — keeps it on a tie.
    let favoured = (paired && choice.reason == ChoiceReason::SpreadOverlap)
        .then(|| chooser.cheapest_median(size))
        .flatten()
        .filter(|p| TRIAL.contains(p))
        .and_then(|p| {
            // How much dearer the receiver may find it: exact with the ends' shares of the
            // pairs' costs; from a profile without them, the pair's saving (exact only
            // where the saving lies on the sender).
            let allowance = loaded
                .profile
                .as_deref()
                .and_then(|pr| pair::rx_tolerance(&pr.pairs, touch, size, p));
            let copy = chooser.estimate(RxPath::Copy, size)?.median;
            let it = chooser.estimate(p, size)?.median;
            (copy > 0.0).then(|| (p, allowance.unwrap_or(1.0 - it / copy)))
        });
    // A pairs table that chose a receive path outright chose it for the pair: where its
    // saving lies on the sender (the mapping receiver over veth at 16 KiB), the receiver's
    // own clock finds it level with copy or dearer, and a check by the margin alone sent
    // it back to copy — after `tune` over veth, in 16 of 30 `copy → auto` runs, a third to
    // all of their bytes, those runs 11 % dearer than the ones left alone. So the check
    // lets it be as much dearer as the pair can afford, no less than the margin.
    let check_margin = match loaded.profile.as_deref() {
        Some(p) if paired && choice.reason == ChoiceReason::Profile => {
            pair::rx_tolerance(&p.pairs, touch, size, choice.path)
                .map_or(crate::auto::cost::MARGIN, |t| {
                    t.clamp(crate::auto::cost::MARGIN, 1.0)
                })
        }
        _ => crate::auto::cost::MARGIN,
    };
    let (path, trial) = if trial {
        if choice.reason == ChoiceReason::NoProfile {
            delta.decisions += 1;
        } else {
            delta.record_choice(&choice);
        }
        delta.chose_trial += 1;
        // A favoured candidate is tried alone against copy: the pairs measured the others'
        // pairs dearer, and each arm the trial adds spends a third of its bytes elsewhere
        // (over veth at 16 KiB a 240 MiB trial is 0.4 s of a 1-s transfer, and `copy →
        // uring` read 22 % over `copy → mmap` there).
        let order = match favoured {
            Some((f, _)) => vec![f],
            None => TRIAL.to_vec(),
        };
        (order[0], order)
    } else {
        delta.record_choice(&choice);
        (choice.path, Vec::new())
    };
    AutoRxChoice {
        path,
        favoured,
        check_margin,
        // A trial's `mmap` is judged by its cost against copy, not by whether it maps: from a
        // copying sender it maps nothing over loopback or veth (kernel-findings §2) and can
        // still cost less, so mapping nothing is no reason to demote it mid-trial.
        expect_mapping: trial.is_empty() && chooser.expects_zero_copy(RxPath::Mmap, size),
        trial,
        note: loaded.note,
        delta,
    }
}

/// A path besides copy that an [`AutoRx`] may take.
pub(crate) enum Alt {
    /// `TCP_ZEROCOPY_RECEIVE`; it reads with plain `recv` itself when told to.
    Mmap(Box<MmapRx>),
    /// Multishot `recv` into provided buffers; parked while another reader takes the socket.
    Uring(Box<UringRx>),
}

/// Which receiver an operation goes to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    Mmap,
    Uring,
    Copy,
}

/// The trial of candidates (without a profile) while it lasts, then the cost check.
struct Judge {
    check: CostCheck<RxPath>,
    trial: Option<Trial<RxPath>>,
    /// A trial waiting for the receiver to look for its sender's card (after the first
    /// bytes; copy until then): its candidates. It then starts without those this process
    /// remembers as clear losers on that route and sender op size
    /// ([`crate::auto::memory`]).
    pending: Option<Vec<RxPath>>,
    /// Where the trial's clear losers are remembered (a zcnet sender's card was found).
    key: Option<crate::auto::memory::Key>,
    /// The process's memory of clear losers, unless turned off.
    memory: Option<&'static crate::auto::memory::Memory>,
    /// The path the choice wants (with a trial: its pick, once made).
    wanted: RxPath,
    window: u64,
}

/// The run-time check of the wanted path against copy in windows of `window` bytes, which
/// finds it costlier only beyond `margin` (the cost module's margin, a trial's favoured
/// pick's tolerance — [`Trial::margin_for`] — or a pairs table's choice's,
/// [`AutoRxChoice::check_margin`]).
fn cost_check_within(window: u64, margin: f64) -> CostCheck<RxPath> {
    use crate::auto::cost::{BACKOFF_WINDOWS, CONFIRM, MAX_GAP_WINDOWS};
    use crate::auto::cost::{MAX_RECHECK_WINDOWS, RECHECK_WINDOWS};
    CostCheck::with(
        RxPath::Copy,
        window,
        margin,
        (RECHECK_WINDOWS, MAX_RECHECK_WINDOWS),
        (BACKOFF_WINDOWS, MAX_GAP_WINDOWS),
    )
    .confirm(CONFIRM)
}

/// The run-time check of a path a trial measured against copy in every round (its pick, or
/// the verdict of the trials before, [`Judge::start_trial`]), by `margin`: it goes on as
/// after that many good verdicts (its first look 64 windows on), and leaving the path takes
/// more dear verdicts in a row ([`TRIAL_PICK_CONFIRM`]) than leaving a profile's choice.
fn pick_check(window: u64, margin: f64) -> CostCheck<RxPath> {
    cost_check_within(window, margin)
        .confirm(TRIAL_PICK_CONFIRM)
        .as_if_good(TRIAL_ROUNDS as u32)
}

impl Judge {
    /// Starts the pending trial, without the candidates remembered as clear losers on `key`
    /// (counted); with none left, copy is kept at once. Where the trials before on `key`
    /// reached a verdict ([`crate::auto::memory::Memory::verdict`]), no trial: that path
    /// is taken at once (counted), under the run-time check.
    fn start_trial(&mut self, key: Option<crate::auto::memory::Key>, delta: &mut AutoStats) {
        let Some(candidates) = self.pending.take() else {
            return;
        };
        self.key = key;
        if let Some(p) = key.zip(self.memory).and_then(|(k, m)| {
            m.verdict(
                k,
                &candidates,
                crate::auto::memory::POOL_MARGIN,
                std::time::Instant::now(),
            )
        }) {
            // The trials before this connection on the route found `p` cheapest, pooled:
            // taken without one, and judged as a trial's pick would be — the check's first
            // look as far off (each look runs two windows on copy), leaving it as hard. A
            // verdict gone stale costs at most that gap: the next trial is never more than
            // `REUSES` connections away.
            delta.trial_skipped_verdict += 1;
            self.wanted = p;
            self.check = pick_check(self.window, crate::auto::cost::MARGIN);
            return;
        }
        let skip = match (key, self.memory) {
            (Some(k), Some(m)) => m.losers(k, std::time::Instant::now()),
            _ => Vec::new(),
        };
        let here: Vec<RxPath> = candidates
            .iter()
            .copied()
            .filter(|p| !skip.contains(p))
            .collect();
        delta.trial_skipped_remembered += (candidates.len() - here.len()) as u64;
        let t = Trial::new(&here, TRIAL_ROUNDS, self.window, crate::auto::cost::MARGIN);
        if let Some(p) = t.picked() {
            // Nothing left to measure: the verdict is copy's, as after a trial.
            delta.trial_picks += 1;
            delta.trial_kept_copy += 1;
            self.wanted = p;
        }
        self.trial = Some(t);
    }

    /// Whether `path` can no longer be wanted: no trial to come or under way, and the
    /// choice (the cost check moves only between it and copy) is another path.
    fn settled_without(&self, path: RxPath) -> bool {
        self.pending.is_none()
            && self.trial.as_ref().is_none_or(|t| t.picked().is_some())
            && self.wanted != path
    }

    /// The trial, while it lasts.
    fn trying(&mut self) -> Option<&mut Trial<RxPath>> {
        self.trial.as_mut().filter(|t| t.picked().is_none())
    }

    /// Where the next operation goes: the trial's arm while it lasts, else the cost check's
    /// route for the wanted path. `clock` is read only when a window starts.
    fn route(&mut self, clock: impl Fn() -> u64) -> Route<RxPath> {
        if self.pending.is_some() {
            return Route::Wanted(RxPath::Copy);
        }
        if let Some(t) = self.trying() {
            return Route::Wanted(t.route(clock));
        }
        self.check.route(self.wanted, clock)
    }

    /// After an operation that delivered `n` bytes, on the CPU clock `clock` (ns: the
    /// receiver's [`RxClock`]); `costlier`: it was kept on copy because the wanted path was
    /// found costlier.
    fn after(
        &mut self,
        n: usize,
        costlier: bool,
        mut delta: AutoStats,
        stats: &Stats,
        clock: impl Fn() -> u64,
    ) {
        let (key, memory) = (self.key, self.memory);
        if self.pending.is_some() {
            // Copy, unmeasured, until the trial starts.
        } else if let Some(t) = self.trying() {
            match t.after(n as u64, clock) {
                Step::Stay => {}
                Step::Next(_) => delta.trial_next += 1,
                Step::Pick(p) => {
                    let margin = t.margin_for(p);
                    if let (Some(k), Some(m)) = (key, memory) {
                        let now = std::time::Instant::now();
                        m.remember(k, t.candidates(), &t.dropped(), now);
                        m.remember_rounds(k, &t.rounds(), now);
                    }
                    delta.trial_picks += 1;
                    delta.rate_trial(&t.ratios());
                    match p {
                        RxPath::Uring => delta.trial_picked_uring += 1,
                        RxPath::Mmap => delta.trial_picked_mmap += 1,
                        _ => delta.trial_kept_copy += 1,
                    }
                    self.wanted = p;
                    // A favoured pick is judged by the tolerance the trial kept it by:
                    // with the margin alone the check undid it — over veth at 256K, picked
                    // in 7 of 7 runs, it was left for copy in 2 (about 250 MiB each) on the
                    // receiver's clock alone.
                    self.check = pick_check(self.window, margin);
                }
            }
        } else if let Some(v) = self.check.after(n as u64, clock) {
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

/// The `auto` receive path with its run-time cost check (see the module docs).
pub(crate) struct AutoRx {
    copy: CopyRx,
    mmap: Option<MmapRx>,
    uring: Option<Box<UringRx>>,
    /// `uring` owns the socket: armed, or parked with bytes still to hand out.
    uring_on: bool,
    judge: Judge,
    /// What a parked `uring` had received when the socket was released
    /// ([`Receive::release_socket`]), and how much of it is handed out.
    held: Vec<u8>,
    held_off: usize,
    /// Bytes the last operation took from the socket, and through which receiver: told to
    /// the others before the next one, so their reads stay placed by the stream offset
    /// ([`super::place`]) whichever path read in between.
    taken: Option<(Use, u64)>,
    /// The clock the trial and the check read.
    clock: RxClock,
}

/// Whether, and how, a receiver reads its sender's CPU clock ([`crate::auto::peer`]).
#[derive(Debug)]
enum Peer {
    /// Not wanted: a profile chose, or [`crate::ReceiverConfig::peer_clock`] is off.
    Off,
    /// Wanted (a trial without a profile), not looked for yet.
    Wanted,
    /// Found: the sender's clock.
    Found(crate::auto::peer::PeerClock),
    /// Looked for; no card, or its thread could not be read.
    Absent,
}

/// The receiving thread's CPU clock, plus the sending thread's where its card was found:
/// counted from when it was found, so that the sum never jumps, and restated per byte this
/// receiver took ([`crate::auto::peer::PeerClock::now`]).
#[derive(Debug)]
struct RxClock {
    peer: Peer,
    /// Bytes delivered so far (once some have, a zcnet sender has written its card: it
    /// does before its first send).
    received: u64,
    /// Both ends' addresses, once the sender's card was found.
    route: Option<(std::net::IpAddr, std::net::IpAddr)>,
}

impl RxClock {
    /// The trial memory's key: the route and the sender's op size, where its card was
    /// found and has counted a send.
    fn key(&self) -> Option<crate::auto::memory::Key> {
        match (&self.peer, self.route) {
            (Peer::Found(p), Some((sender, receiver))) => p
                .op_size()
                .map(|op| crate::auto::memory::Key::new(sender, receiver, op, p.sender_path())),
            _ => None,
        }
    }

    fn now(&self) -> u64 {
        let own = zcnet_sys::raw::cpu::thread_cpu_ns();
        match &self.peer {
            Peer::Found(p) => own + p.now(self.received),
            _ => own,
        }
    }

    /// Counts `n` bytes delivered.
    fn delivered(&mut self, n: usize) {
        self.received += n as u64;
    }

    /// Looks for the card of the sender of `fd`'s connection, once bytes have arrived.
    fn look(&mut self, fd: BorrowedFd<'_>, delta: &mut AutoStats) {
        use crate::auto::peer::{default_dir, PeerClock};
        if !matches!(self.peer, Peer::Wanted) || self.received == 0 {
            return;
        }
        let sock = socket2::SockRef::from(&fd);
        let addr = |a: std::io::Result<socket2::SockAddr>| a.ok().and_then(|a| a.as_socket());
        let found = match (
            addr(sock.peer_addr()),
            addr(sock.local_addr()),
            default_dir(),
        ) {
            (Some(sender), Some(receiver), Some(dir)) => {
                PeerClock::find(&dir, sender, receiver, self.received)
                    .map(|p| (p, sender, receiver))
            }
            _ => None,
        };
        self.peer = match found {
            Some((p, sender, receiver)) => {
                delta.peer_clock += 1;
                self.route = Some((sender.ip(), receiver.ip()));
                Peer::Found(p)
            }
            None => Peer::Absent,
        };
    }
}

impl AutoRx {
    /// `alts` are the paths `choice` may take besides copy (the chosen one, or a trial's
    /// candidates that could be set up); the check measures windows of `window` bytes;
    /// `memory`: a trial uses the process's memory of clear losers
    /// ([`crate::auto::memory`]); `peer_clock`: a trial looks for the sender's clock card
    /// ([`crate::auto::peer`]).
    pub(crate) fn new(
        copy: CopyRx,
        alts: Vec<Alt>,
        choice: &AutoRxChoice,
        window: u64,
        memory: bool,
        peer_clock: bool,
    ) -> Self {
        let (mut mmap, mut uring) = (None, None);
        for a in alts {
            match a {
                Alt::Mmap(m) => mmap = Some(*m),
                Alt::Uring(u) => uring = Some(u),
            }
        }
        // The trial's candidates that are here, in its order.
        let here: Vec<RxPath> = choice
            .trial
            .iter()
            .copied()
            .filter(|p| match p {
                RxPath::Mmap => mmap.is_some(),
                RxPath::Uring => uring.is_some(),
                _ => false,
            })
            .collect();
        // A profile's choice is judged on the receiver's own clock, as its tolerance was
        // computed ([`crate::auto::pair::rx_tolerance`]).
        let peer_wanted = !choice.trial.is_empty() && choice.favoured.is_none() && peer_clock;
        // Such a trial waits for the sender's card: with it, what earlier trials on the
        // same route and sender op size dropped is skipped.
        let memory = crate::auto::memory::global(memory).filter(|_| peer_wanted);
        let pending = memory.is_some().then(|| here.clone());
        let trial = (!choice.trial.is_empty() && pending.is_none()).then(|| {
            let t = Trial::new(&here, TRIAL_ROUNDS, window, crate::auto::cost::MARGIN);
            match choice.favoured {
                Some((f, saving)) => t.favouring(f, saving),
                None => t,
            }
        });
        let wanted = match &trial {
            Some(t) => t.picked().unwrap_or(RxPath::Copy),
            None => choice.path,
        };
        AutoRx {
            copy,
            mmap,
            uring,
            uring_on: false,
            judge: Judge {
                check: cost_check_within(window, choice.check_margin),
                trial,
                pending,
                key: None,
                memory,
                wanted,
                window,
            },
            held: Vec::new(),
            held_off: 0,
            taken: None,
            clock: RxClock {
                peer: if peer_wanted { Peer::Wanted } else { Peer::Off },
                received: 0,
                route: None,
            },
        }
    }

    /// The cost check's route for the next operation, and the switch it implies.
    fn prepare(
        &mut self,
        fd: BorrowedFd<'_>,
        stats: &Stats,
        delta: &mut AutoStats,
    ) -> Result<(Use, bool)> {
        self.tell_others();
        self.clock.look(fd, delta);
        if self.judge.pending.is_some() && !matches!(self.clock.peer, Peer::Wanted) {
            // The sender counts a send just after it returns: a receiver can be a step
            // ahead of the count. Wait for it a little, then go without the memory.
            let key = self.clock.key();
            let found = matches!(self.clock.peer, Peer::Found(_));
            if key.is_some() || !found || self.clock.received >= PENDING_MAX_BYTES {
                self.judge.start_trial(key, delta);
            }
        }
        let clock = &self.clock;
        let (target, costlier) = match self.judge.route(|| clock.now()) {
            Route::Wanted(p) => (p, false),
            Route::ProbeCopy(_) => {
                delta.cost_probe_ops += 1;
                (RxPath::Copy, false)
            }
            Route::Costlier(_) => (RxPath::Copy, true),
        };
        // An armed `uring` gives the socket up before anyone else reads it.
        if target != RxPath::Uring && self.uring_on {
            if let Some(u) = self.uring.as_mut() {
                if !u.is_parked() {
                    // Not confirmed over in time: the parked ring keeps reading until its
                    // request's end is seen, so the order of the bytes still holds.
                    let _ = u.park();
                }
                if !u.parked_drained(fd, stats)? {
                    return Ok((Use::Uring, costlier));
                }
            }
            self.uring_on = false;
        }
        // A receiver that can no longer be wanted goes once it holds nothing: copy then
        // reads straight from the socket, not through the mapping receiver's copy mode, and
        // the mapping window, the scratch and the ring's buffers are freed.
        if self.judge.settled_without(RxPath::Mmap)
            && self.mmap.as_ref().is_some_and(|m| !m.holds())
        {
            self.mmap = None;
        }
        if self.judge.settled_without(RxPath::Uring) && !self.uring_on {
            self.uring = None;
        }
        if let Some(m) = self.mmap.as_mut() {
            // Copy reads through the mapping receiver (plain `recv`, its held bytes first);
            // `uring` waits until those are handed out.
            m.set_copy(target != RxPath::Mmap);
            if target != RxPath::Uring || m.holds() {
                return Ok((Use::Mmap, costlier));
            }
        }
        Ok(match (target, self.uring.as_mut()) {
            (RxPath::Uring, Some(u)) => {
                if u.is_parked() {
                    u.unpark();
                }
                self.uring_on = true;
                (Use::Uring, costlier)
            }
            _ => (Use::Copy, costlier),
        })
    }

    /// Whether the receiver is copy for good: the choice or the trial kept copy (the check
    /// never moves off copy), the other receivers are gone and nothing is held. Each
    /// operation then goes straight to copy, skipping the routing a choice still open needs
    /// (`AutoRx::recv` and `judged` were about a quarter of an `auto` receiver's user-space
    /// samples at 16 KiB on loopback, `perf record -e cpu-clock`).
    fn copy_for_good(&self) -> bool {
        self.judge.wanted == RxPath::Copy
            && self.mmap.is_none()
            && self.uring.is_none()
            && !self.uring_on
            && self.held.is_empty()
            && self.judge.settled_without(RxPath::Mmap)
            && self.judge.settled_without(RxPath::Uring)
    }

    /// Tells the receivers that did not take the last operation's bytes that the stream moved
    /// past them (a parked `uring`'s bytes count as `uring`'s when handed out).
    fn tell_others(&mut self) {
        let Some((by, n)) = self.taken.take() else {
            return;
        };
        if by != Use::Copy {
            self.copy.socket_bytes_taken(n);
        }
        if let (false, Some(m)) = (by == Use::Mmap, self.mmap.as_mut()) {
            m.socket_bytes_taken(n);
        }
    }

    /// Records that `by` handed out `n` bytes of the stream.
    fn took(&mut self, by: Use, n: usize) {
        match &mut self.taken {
            Some((u, m)) if *u == by => *m += n as u64,
            _ => {
                self.tell_others();
                self.taken = Some((by, n as u64));
            }
        }
    }

    /// Hands up to `max` bytes of `held` (a parked `uring`'s) to `sink`.
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
        self.took(Use::Uring, n);
        Ok(n)
    }
}

/// After an operation that delivered `n` bytes: counts them on `clock` and has `judge`
/// judge it on that clock ([`Judge::after`]).
fn judged(
    judge: &mut Judge,
    clock: &mut RxClock,
    n: usize,
    costlier: bool,
    delta: AutoStats,
    stats: &Stats,
) {
    clock.delivered(n);
    let clock = &*clock;
    judge.after(n, costlier, delta, stats, || clock.now());
}

/// The receiver an operation goes to (fields apart, so the judge stays free to borrow).
fn receiver<'a>(
    use_: Use,
    copy: &'a mut CopyRx,
    mmap: &'a mut Option<MmapRx>,
    uring: &'a mut Option<Box<UringRx>>,
) -> &'a mut dyn Receive {
    match (use_, mmap.as_mut(), uring.as_mut()) {
        (Use::Mmap, Some(m), _) => m,
        (Use::Uring, _, Some(u)) => u.as_mut(),
        _ => copy,
    }
}

impl Receive for AutoRx {
    fn recv<'a>(&'a mut self, fd: BorrowedFd<'_>, stats: &Stats) -> Result<Option<RxChunk<'a>>> {
        if self.copy_for_good() {
            self.tell_others();
            return self.copy.recv(fd, stats);
        }
        if self.held_off >= self.held.len() && !self.held.is_empty() {
            self.held = Vec::new();
            self.held_off = 0;
        }
        if !self.held.is_empty() {
            let start = self.held_off;
            self.held_off = self.held.len();
            self.took(Use::Uring, self.held.len() - start);
            return Ok(Some(RxChunk::new(&self.held[start..], false)));
        }
        let mut delta = AutoStats::default();
        let (use_, costlier) = self.prepare(fd, stats, &mut delta)?;
        let AutoRx {
            copy,
            mmap,
            uring,
            judge,
            taken,
            clock,
            ..
        } = self;
        let r = receiver(use_, copy, mmap, uring).recv(fd, stats)?;
        let n = r.as_ref().map_or(0, |c| c.len());
        // `prepare` told the others what the last operation took, so this starts afresh.
        *taken = Some((use_, n as u64));
        judged(judge, clock, n, costlier, delta, stats);
        Ok(r)
    }

    fn recv_into(&mut self, fd: BorrowedFd<'_>, buf: &mut [u8], stats: &Stats) -> Result<usize> {
        if self.copy_for_good() {
            self.tell_others();
            return self.copy.recv_into(fd, buf, stats);
        }
        let held = self.take_held(buf.len(), &mut |b| {
            buf[..b.len()].copy_from_slice(b);
            Ok(())
        })?;
        if held > 0 {
            return Ok(held);
        }
        let mut delta = AutoStats::default();
        let (use_, costlier) = self.prepare(fd, stats, &mut delta)?;
        let n = receiver(use_, &mut self.copy, &mut self.mmap, &mut self.uring)
            .recv_into(fd, buf, stats)?;
        self.took(use_, n);
        judged(&mut self.judge, &mut self.clock, n, costlier, delta, stats);
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
        // At most one of them holds bytes: each hands its own out before the other reads.
        if let Some(m) = self.mmap.as_mut() {
            let n = m.take_buffered(max, sink)?;
            if n > 0 {
                self.took(Use::Mmap, n);
                return Ok(n);
            }
        }
        let n = match self.uring.as_mut() {
            Some(u) if self.uring_on => u.take_buffered(max, sink)?,
            _ => 0,
        };
        self.took(Use::Uring, n);
        Ok(n)
    }

    /// Parks `uring` and moves what it had received here, so the socket is plain reads'
    /// (or the caller's) from now on; the check may arm it again at a later receive.
    fn release_socket(&mut self, fd: BorrowedFd<'_>, stats: &Stats) -> Result<()> {
        let Some(u) = self.uring.as_mut() else {
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
        !self.uring_on && self.mmap.as_ref().is_none_or(|m| m.socket_handover_ok())
    }

    fn socket_bytes_taken(&mut self, n: u64) {
        self.tell_others();
        self.copy.socket_bytes_taken(n);
        if let Some(m) = self.mmap.as_mut() {
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
        if self.copy_for_good() {
            self.tell_others();
            return self.copy.recv_lend(fd, scratch, max, stats, sink);
        }
        let held = self.take_held(max, sink)?;
        if held > 0 {
            return Ok(held);
        }
        let mut delta = AutoStats::default();
        let (use_, costlier) = self.prepare(fd, stats, &mut delta)?;
        let n = receiver(use_, &mut self.copy, &mut self.mmap, &mut self.uring)
            .recv_lend(fd, scratch, max, stats, sink)?;
        self.took(use_, n);
        judged(&mut self.judge, &mut self.clock, n, costlier, delta, stats);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A profile whose only rows are receive rows at 16 KiB and 1 MiB: copy at 1.0 and
    /// `mmap` at `mmap` CPU-s/GiB, each with a ±`spread` range.
    fn rx_profile(mmap: f64, spread: f64) -> ProfileSource {
        use crate::tuning::{Measurement, Profile, Spread};
        let row = |path, size, median: f64| Measurement {
            path,
            size,
            touch: false,
            cpu_s_per_gib: Spread::around(median, spread),
            zc_fraction: None,
        };
        let rx = [16u64 << 10, 1 << 20]
            .into_iter()
            .flat_map(|s| [row(RxPath::Copy, s, 1.0), row(RxPath::Mmap, s, mmap)])
            .collect();
        ProfileSource::Given(std::sync::Arc::new(Profile::scripted(Vec::new(), rx)))
    }

    #[test]
    fn a_profile_that_cannot_tell_leaves_the_choice_to_a_trial_on_the_connection() {
        let here = IpAddr::from([127, 0, 0, 1]);
        // mmap 3 % under copy, each ±5 %: the spreads overlap, the profile cannot tell.
        let c = choose(&rx_profile(0.97, 0.05), false, 16 << 10, here);
        assert_eq!(c.trial, TRIAL.to_vec());
        assert_eq!(c.path, TRIAL[0]);
        assert!(!c.expect_mapping, "a trial judges cost, not mapping");
        assert_eq!(
            (
                c.delta.decisions,
                c.delta.chose_default_overlap,
                c.delta.chose_trial
            ),
            (1, 1, 1),
            "counted as both: the profile's overlap and the trial it led to"
        );
        // mmap clearly cheaper: the profile decides, no trial.
        let c = choose(&rx_profile(0.3, 0.05), false, 16 << 10, here);
        assert!(c.trial.is_empty());
        assert_eq!(c.path, RxPath::Mmap);
        assert_eq!((c.delta.decisions, c.delta.chose_trial), (1, 0));
        // mmap dearer: copy is simply the cheapest, no trial.
        let c = choose(&rx_profile(1.5, 0.05), false, 16 << 10, here);
        assert!(c.trial.is_empty());
        assert_eq!(c.path, RxPath::Copy);
        assert_eq!(c.delta.chose_trial, 0);
    }

    /// A profile with a pairs table at 16 KiB and 1 MiB: `copy → copy` at 1.0 and
    /// `copy → mmap` at `mmap` CPU-s/GiB (both ends), `copy → uring` at 1.02, each ±`spread`.
    fn pairs_profile(mmap: f64, spread: f64) -> ProfileSource {
        pairs_profile_shared(mmap, spread, None)
    }

    /// [`pairs_profile`], with the receivers' shares of `copy → copy`'s and
    /// `copy → mmap`'s costs (`copy → uring`'s as copy's).
    fn pairs_profile_shared(mmap: f64, spread: f64, shares: Option<(f64, f64)>) -> ProfileSource {
        use crate::path::TxPath;
        use crate::tuning::{PairMeasurement, Profile, Spread};
        let row = |rx, size, median: f64| PairMeasurement {
            tx: TxPath::Copy,
            rx,
            size,
            touch: false,
            cpu_s_per_gib: Spread::around(median, spread),
            zc_fraction_tx: Some(0.0),
            zc_fraction_rx: Some(0.0),
            rx_share: shares.map(|(c, m)| if rx == RxPath::Mmap { m } else { c }),
        };
        let mut p = Profile::scripted(Vec::new(), Vec::new());
        p.pairs = [16u64 << 10, 1 << 20]
            .into_iter()
            .flat_map(|s| {
                [
                    row(RxPath::Copy, s, 1.0),
                    row(RxPath::Mmap, s, mmap),
                    row(RxPath::Uring, s, 1.02),
                ]
            })
            .collect();
        ProfileSource::Given(std::sync::Arc::new(p))
    }

    #[test]
    fn where_the_pairs_cannot_tell_the_trial_favours_their_cheapest_receive_half() {
        let here = IpAddr::from([127, 0, 0, 1]);
        // copy → mmap 8 % under copy → copy by median, inside its ±15 %: the pairs cannot
        // tell, so the connection tries mmap alone against copy, starting on it and keeping
        // it on a tie (copy → uring, 2 % over copy → copy, is not tried).
        let c = choose(&pairs_profile(0.92, 0.15), false, 16 << 10, here);
        let (f, saving) = c.favoured.expect("mmap favoured");
        assert_eq!(f, RxPath::Mmap);
        assert!((saving - 0.08).abs() < 1e-9, "the pair saved 8 %: {saving}");
        assert_eq!(c.trial, vec![RxPath::Mmap]);
        assert_eq!(c.path, RxPath::Mmap);
        assert_eq!(c.delta.chose_trial, 1);
        // With the ends' shares the receiver's allowance is the pair's, in its own terms.
        // Senders 0.65 and 0.534 (the saving on the sender): the receiver may run
        // (1 − 0.534) / 0.35 − 1 = 33 % over copy.
        let c = choose(
            &pairs_profile_shared(0.92, 0.15, Some((0.35, 0.42))),
            false,
            16 << 10,
            here,
        );
        let (f, tolerance) = c.favoured.expect("mmap favoured");
        assert_eq!(f, RxPath::Mmap);
        let want = (1.0 - 0.92 * 0.58) / 0.35 - 1.0;
        assert!(
            (tolerance - want).abs() < 1e-9,
            "{tolerance} against {want}"
        );
        // Senders alike (the saving all on the receiver): no allowance.
        let share = 1.0 - 0.65 / 0.92;
        let c = choose(
            &pairs_profile_shared(0.92, 0.15, Some((0.35, share))),
            false,
            16 << 10,
            here,
        );
        let (_, tolerance) = c.favoured.expect("mmap favoured");
        assert!(tolerance.abs() < 1e-9, "{tolerance}");
        // A single-end table that cannot tell (no pairs) favours nothing: its rows are each
        // path against a copy peer, blind to the sender the pairs see.
        let c = choose(&rx_profile(0.92, 0.15), false, 16 << 10, here);
        assert_eq!(c.favoured, None);
        assert_eq!(c.trial, TRIAL.to_vec());
        // Pairs clear about it: chosen outright, no trial, nothing favoured.
        let c = choose(&pairs_profile(0.5, 0.05), false, 16 << 10, here);
        assert_eq!(c.path, RxPath::Mmap);
        assert!(c.favoured.is_none());
        assert!(c.trial.is_empty());
        // ... and the check judges it by the pair's tolerance on the receiver's clock:
        // senders 0.65 and 0.8 × 0.5 = 0.4, so the receiver may run (1 − 0.4) / 0.35 − 1
        // = 71 % over copy before the pair loses what it saved.
        let c = choose(
            &pairs_profile_shared(0.5, 0.05, Some((0.35, 0.2))),
            false,
            16 << 10,
            here,
        );
        assert_eq!(c.path, RxPath::Mmap);
        let want = (1.0 - 0.5 * 0.8) / 0.35 - 1.0;
        assert!((c.check_margin - want).abs() < 1e-9, "{}", c.check_margin);
        // Without the shares, or from a single-end table, the margin.
        assert_eq!(
            c_margin(&pairs_profile(0.5, 0.05)),
            crate::auto::cost::MARGIN
        );
        assert_eq!(c_margin(&rx_profile(0.3, 0.05)), crate::auto::cost::MARGIN);
        // The saving mostly the receiver's (senders 0.65 and 0.9 × 0.72 = 0.648): the
        // pair could afford 0.6 %, and the check keeps the margin.
        let c = choose(
            &pairs_profile_shared(0.9, 0.01, Some((0.35, 0.28))),
            false,
            16 << 10,
            here,
        );
        assert_eq!((c.path, c.trial.len()), (RxPath::Mmap, 0));
        assert_eq!(c.check_margin, crate::auto::cost::MARGIN);
        // copy → copy cheapest: no trial.
        let c = choose(&pairs_profile(1.2, 0.15), false, 16 << 10, here);
        assert_eq!(c.path, RxPath::Copy);
        assert!(c.favoured.is_none());
        assert!(c.trial.is_empty());
    }

    /// The run-time check's margin for a 16 KiB receiver on loopback under `profile`.
    fn c_margin(profile: &ProfileSource) -> f64 {
        choose(profile, false, 16 << 10, IpAddr::from([127, 0, 0, 1])).check_margin
    }

    const WINDOW: u64 = 1 << 20;
    const OP: u64 = 64 * 1024;

    /// A judge of a trial of `uring` and `mmap`, as [`AutoRx::new`] makes it.
    fn judge() -> Judge {
        Judge {
            check: cost_check_within(WINDOW, crate::auto::cost::MARGIN),
            trial: Some(Trial::new(
                &TRIAL,
                TRIAL_ROUNDS,
                WINDOW,
                crate::auto::cost::MARGIN,
            )),
            pending: None,
            key: None,
            memory: None,
            wanted: RxPath::Copy,
            window: WINDOW,
        }
    }

    /// Drives `judge` over `bytes` in 64 KiB operations on a scripted clock: an operation
    /// on `path` starting at byte `at` costs `cost(path, at)` ns per byte. Returns the
    /// path each operation read with, and the counters.
    fn drive(
        judge: &mut Judge,
        bytes: u64,
        cost: impl Fn(RxPath, u64) -> u64,
    ) -> (Vec<RxPath>, AutoStats) {
        let stats = Stats::default();
        let clock = Cell::new(0u64);
        let mut paths = Vec::new();
        for i in 0..bytes / OP {
            let (path, costlier) = match judge.route(|| clock.get()) {
                Route::Wanted(p) => (p, false),
                Route::ProbeCopy(_) => (RxPath::Copy, false),
                Route::Costlier(_) => (RxPath::Copy, true),
            };
            paths.push(path);
            clock.set(clock.get() + cost(path, i * OP) * OP);
            judge.after(OP as usize, costlier, AutoStats::default(), &stats, || {
                clock.get()
            });
        }
        (paths, stats.snapshot().auto_rx)
    }

    /// The trial's bytes with the default rounds: three arms, each a window and a quarter
    /// per round.
    const TRIAL_BYTES: u64 = TRIAL_ROUNDS as u64 * 3 * (WINDOW + WINDOW / 4);

    #[test]
    fn the_trial_interleaves_copy_and_both_candidates_and_picks_within_its_bound() {
        // mmap 20 % under copy, uring level with it: mmap kept, counted.
        let mut j = judge();
        let cost = |p: RxPath, _| match p {
            RxPath::Mmap => 4,
            _ => 5,
        };
        let (paths, a) = drive(&mut j, TRIAL_BYTES, cost);
        assert_eq!(
            (a.trial_next, a.trial_picks, a.trial_picked_mmap),
            (11, 1, 1),
            "{a:?}"
        );
        assert_eq!((a.trial_kept_copy, a.trial_picked_uring), (0, 0), "{a:?}");
        // What it saw, counted with the pick: mmap at 4/5 of copy, uring level.
        assert_eq!(
            (a.trial_rated_mmap, a.trial_ratio_mmap_permille),
            (1, 800),
            "{a:?}"
        );
        assert_eq!(
            (a.trial_rated_uring, a.trial_ratio_uring_permille),
            (1, 1000),
            "{a:?}"
        );
        assert_eq!(a.cost_checks, 0, "the trial is not the cost check: {a:?}");
        // 12 stretches of 20 operations (4 settling, 16 measured), every arm in every
        // round, beginning with the first candidate.
        let runs: Vec<RxPath> = paths.chunks(20).map(|c| c[0]).collect();
        assert!(paths.chunks(20).all(|c| c.iter().all(|p| *p == c[0])));
        assert_eq!(runs[0], RxPath::Uring);
        for round in runs.chunks(3) {
            for arm in [RxPath::Copy, RxPath::Uring, RxPath::Mmap] {
                assert!(round.contains(&arm), "{runs:?}");
            }
        }
        // Then mmap, trusted as after four good verdicts (the gap 8, 16, 32, 64 windows)
        // before it is measured.
        let (paths, a) = drive(&mut j, 64 * WINDOW, cost);
        assert!(paths.iter().all(|p| *p == RxPath::Mmap), "{paths:?}");
        assert_eq!(a.cost_checks, 0, "{a:?}");
    }

    #[test]
    fn candidates_level_with_copy_leave_copy_and_nothing_is_checked_after() {
        let mut j = judge();
        // Both candidates 3 % under copy: within the margin.
        let (_, a) = drive(&mut j, TRIAL_BYTES, |p, _| match p {
            RxPath::Copy => 100,
            _ => 97,
        });
        assert_eq!((a.trial_picks, a.trial_kept_copy), (1, 1), "{a:?}");
        let (paths, a) = drive(&mut j, 64 * WINDOW, |_, _| 1);
        assert!(paths.iter().all(|p| *p == RxPath::Copy));
        assert_eq!((a.cost_checks, a.cost_probe_ops), (0, 0), "{a:?}");
    }

    /// A judge whose trial tries `mmap` alone, favoured with a pair that saved `saving`.
    fn judge_favouring_mmap(saving: f64) -> Judge {
        Judge {
            check: cost_check_within(WINDOW, crate::auto::cost::MARGIN),
            trial: Some(
                Trial::new(
                    &[RxPath::Mmap],
                    TRIAL_ROUNDS,
                    WINDOW,
                    crate::auto::cost::MARGIN,
                )
                .favouring(RxPath::Mmap, saving),
            ),
            pending: None,
            key: None,
            memory: None,
            wanted: RxPath::Mmap,
            window: WINDOW,
        }
    }

    #[test]
    fn a_favoured_pick_is_checked_by_the_tolerance_it_was_kept_by() {
        const TRIAL_OF_ONE: u64 = TRIAL_ROUNDS as u64 * 2 * (WINDOW + WINDOW / 4);
        // The pair saved 30 %; on the receiver's clock mmap is 10 % dearer than copy:
        // picked, and the checks after keep it (no costlier verdict, nothing on copy but
        // their probes).
        let dear = |p: RxPath, _| if p == RxPath::Mmap { 11 } else { 10 };
        let mut j = judge_favouring_mmap(0.3);
        let (_, a) = drive(&mut j, TRIAL_OF_ONE, dear);
        assert_eq!(a.trial_picked_mmap, 1, "{a:?}");
        let (paths, a) = drive(&mut j, 400 * WINDOW, dear);
        assert!(a.cost_checks >= 2, "{a:?}");
        assert_eq!((a.cost_costlier, a.fallback_costlier), (0, 0), "{a:?}");
        let on_mmap = paths.iter().filter(|p| **p == RxPath::Mmap).count();
        assert!(
            on_mmap * 10 > paths.len() * 9,
            "{on_mmap} of {}",
            paths.len()
        );
        // Dearer than the tolerance after the pick (a change on the connection): left.
        let mut j = judge_favouring_mmap(0.3);
        drive(&mut j, TRIAL_OF_ONE, dear);
        let (paths, a) = drive(&mut j, 400 * WINDOW, |p, _| {
            if p == RxPath::Mmap {
                15
            } else {
                10
            }
        });
        assert!(a.cost_costlier >= 1 && a.fallback_costlier > 0, "{a:?}");
        assert_eq!(*paths.last().unwrap(), RxPath::Copy);
    }

    /// A judge whose trial of `uring` and `mmap` waits for the sender's card (no profile,
    /// a zcnet sender expected), with `memory` for its clear losers.
    fn pending_judge(memory: &'static crate::auto::memory::Memory) -> Judge {
        Judge {
            check: cost_check_within(WINDOW, crate::auto::cost::MARGIN),
            trial: None,
            pending: Some(TRIAL.to_vec()),
            key: None,
            memory: Some(memory),
            wanted: RxPath::Copy,
            window: WINDOW,
        }
    }

    #[test]
    fn a_trials_clear_loser_is_not_measured_again_on_its_route_and_size() {
        use crate::auto::memory::{Key, Memory};
        use std::time::Instant;
        let memory: &'static Memory = Box::leak(Box::default());
        let lo = |op: u64| Key::new([127, 0, 0, 1].into(), [127, 0, 0, 1].into(), op, 1);
        // Loopback at 16 KiB as measured: mmap 2.4× copy, uring level with it.
        let cost = |p: RxPath, _| if p == RxPath::Mmap { 24 } else { 10 };
        let windows = |paths: &[RxPath], arm| {
            paths
                .chunks(20)
                .filter(|c| c[0] == arm && c.iter().all(|p| *p == arm))
                .count()
        };
        // Copy, unmeasured, until the receiver has looked for the card.
        let mut j = pending_judge(memory);
        let (paths, a) = drive(&mut j, 3 * OP, cost);
        assert!(paths.iter().all(|p| *p == RxPath::Copy), "{paths:?}");
        assert_eq!(a.trial_next + a.trial_picks, 0, "{a:?}");
        let mut d = AutoStats::default();
        j.start_trial(Some(lo(16 << 10)), &mut d);
        assert_eq!(d.trial_skipped_remembered, 0);
        let (paths, a) = drive(&mut j, TRIAL_BYTES, cost);
        assert_eq!((a.trial_picks, a.trial_kept_copy), (1, 1), "{a:?}");
        assert_eq!(windows(&paths, RxPath::Mmap), 2, "dropped after two rounds");
        assert!(
            memory.losers(lo(16 << 10), Instant::now()).is_empty(),
            "one trial's drop is not enough"
        );

        // The next connection measures it again, drops it again: confirmed.
        let mut j = pending_judge(memory);
        let mut d = AutoStats::default();
        j.start_trial(Some(lo(16 << 10)), &mut d);
        assert_eq!(d.trial_skipped_remembered, 0);
        let (paths, _) = drive(&mut j, TRIAL_BYTES, cost);
        assert_eq!(windows(&paths, RxPath::Mmap), 2, "measured again");
        assert_eq!(
            memory.losers(lo(16 << 10), Instant::now()),
            vec![RxPath::Mmap]
        );

        // Both trials kept copy: the connections after take it without a trial.
        for _ in 0..crate::auto::memory::REUSES {
            let mut j = pending_judge(memory);
            let mut d = AutoStats::default();
            j.start_trial(Some(lo(16 << 10)), &mut d);
            assert_eq!(
                (d.trial_skipped_verdict, d.trial_skipped_remembered),
                (1, 0)
            );
        }

        // The next connection on the route that measures again, sender writing the same
        // size: mmap skipped.
        let mut j = pending_judge(memory);
        let mut d = AutoStats::default();
        j.start_trial(Some(lo(16 << 10)), &mut d);
        assert_eq!(d.trial_skipped_remembered, 1);
        let (paths, a) = drive(&mut j, TRIAL_BYTES, cost);
        assert!(!paths.contains(&RxPath::Mmap), "{paths:?}");
        assert_eq!(
            windows(&paths, RxPath::Uring),
            TRIAL_ROUNDS,
            "uring still measured"
        );
        assert_eq!((a.trial_picks, a.trial_kept_copy), (1, 1), "{a:?}");

        // Another op size, or no card (no key): every candidate measured.
        for key in [Some(lo(256 << 10)), None] {
            let mut j = pending_judge(memory);
            let mut d = AutoStats::default();
            j.start_trial(key, &mut d);
            assert_eq!(d.trial_skipped_remembered, 0, "{key:?}");
            let (paths, _) = drive(&mut j, TRIAL_BYTES, cost);
            assert_eq!(windows(&paths, RxPath::Mmap), 2, "{key:?}");
        }

        // Both candidates remembered (trials of uring alone, mmap skipped, dropping it):
        // copy is kept at once, counted as the trial's verdict. (A `uring` sender's key:
        // on the copy sender's, copy is now the verdict that the trials kept.)
        let lo_uring = Key::new([127, 0, 0, 1].into(), [127, 0, 0, 1].into(), 16 << 10, 3);
        for dropped in [&[RxPath::Mmap][..], &[RxPath::Uring]] {
            for _ in 0..crate::auto::memory::CONFIRM {
                memory.remember(lo_uring, dropped, dropped, Instant::now());
            }
        }
        let mut j = pending_judge(memory);
        let mut d = AutoStats::default();
        j.start_trial(Some(lo_uring), &mut d);
        assert_eq!(
            (d.trial_skipped_remembered, d.trial_picks, d.trial_kept_copy),
            (2, 1, 1)
        );
        let (paths, a) = drive(&mut j, 4 * WINDOW, cost);
        assert!(paths.iter().all(|p| *p == RxPath::Copy));
        assert_eq!(a.trial_next + a.trial_picks, 0, "{a:?}");
    }

    #[test]
    fn the_verdict_of_the_trials_before_is_taken_without_a_trial_and_still_checked() {
        use crate::auto::memory::{Key, Memory, CONFIRM, REUSES};
        let memory: &'static Memory = Box::leak(Box::default());
        let veth = Key::new([10, 0, 0, 1].into(), [10, 0, 0, 2].into(), 16 << 10, 1);
        // mmap 20 % under copy, uring level with it.
        let cost = |p: RxPath, _| if p == RxPath::Mmap { 8 } else { 10 };
        let connection = |cost: &dyn Fn(RxPath, u64) -> u64, bytes| {
            let mut j = pending_judge(memory);
            let mut d = AutoStats::default();
            j.start_trial(Some(veth), &mut d);
            let (paths, a) = drive(&mut j, bytes, cost);
            (d.trial_skipped_verdict, paths, a)
        };
        // Trials until the key has a verdict, each measuring every arm.
        for i in 0..CONFIRM {
            let (skipped, paths, a) = connection(&cost, TRIAL_BYTES);
            assert_eq!((skipped, a.trial_picked_mmap), (0, 1), "trial {i}: {a:?}");
            assert!(paths.contains(&RxPath::Uring), "trial {i}");
        }
        // Then REUSES connections take mmap from their first byte, with no trial.
        for i in 0..REUSES {
            let (skipped, paths, a) = connection(&cost, TRIAL_BYTES);
            assert_eq!(skipped, 1, "connection {i}");
            assert_eq!(a.trial_next + a.trial_picks, 0, "no trial: {a:?}");
            assert_eq!(paths[0], RxPath::Mmap);
            assert!(!paths.contains(&RxPath::Uring), "connection {i}");
            let mmap = paths.iter().filter(|p| **p == RxPath::Mmap).count();
            assert!(
                mmap * 10 >= paths.len() * 9,
                "mostly mmap: {mmap}/{}",
                paths.len()
            );
        }
        // The next connection measures again (and keeps mmap again).
        let (skipped, _, a) = connection(&cost, TRIAL_BYTES);
        assert_eq!((skipped, a.trial_picked_mmap), (0, 1), "{a:?}");
        // A connection that takes it where mmap has turned dear leaves it for copy: the
        // check holds for a remembered verdict as for a trial's pick.
        let dear = |p: RxPath, _| if p == RxPath::Mmap { 20 } else { 10 };
        let (skipped, paths, a) = connection(&dear, 128 * WINDOW);
        assert_eq!(skipped, 1);
        assert!(a.cost_costlier >= 1 && a.fallback_costlier > 0, "{a:?}");
        assert_eq!(*paths.last().unwrap(), RxPath::Copy);
    }

    #[test]
    fn a_receiver_is_let_go_only_once_it_can_no_longer_be_wanted() {
        let memory: &'static crate::auto::memory::Memory = Box::leak(Box::default());
        // Waiting for the card, or trying: every candidate may still be wanted.
        let j = pending_judge(memory);
        assert!(!j.settled_without(RxPath::Mmap) && !j.settled_without(RxPath::Uring));
        let mut j = judge();
        let (_, _) = drive(&mut j, 3 * WINDOW, |_, _| 10);
        assert!(!j.settled_without(RxPath::Mmap), "mid-trial");
        // Picked uring: mmap can go, uring (the pick, checked against copy) stays.
        let j = judge_that_kept_uring();
        assert!(j.settled_without(RxPath::Mmap));
        assert!(!j.settled_without(RxPath::Uring));
    }

    fn judge_that_kept_uring() -> Judge {
        let mut j = judge();
        let (_, a) = drive(&mut j, TRIAL_BYTES, |p, _| match p {
            RxPath::Uring => 7,
            _ => 10,
        });
        assert_eq!(a.trial_picked_uring, 1, "{a:?}");
        j
    }

    #[test]
    fn a_trial_pick_survives_two_dear_windows_and_is_left_after_three() {
        let mut j = judge_that_kept_uring();
        // Past the first gap, two checks find uring's window dear (a load spike on it):
        // the third finds it cheap again, and it is kept.
        let gap = 64 * WINDOW;
        let spike = |p: RxPath, at: u64| match p {
            RxPath::Uring if at >= gap && at < gap + 6 * WINDOW => 20,
            RxPath::Uring => 7,
            _ => 10,
        };
        let (_, a) = drive(&mut j, gap + 9 * WINDOW, spike);
        assert_eq!((a.cost_checks, a.cost_costlier), (3, 0), "{a:?}");
        assert_eq!(a.fallback_costlier, 0, "{a:?}");
        // Really dearer from now on: left after three dear verdicts in a row.
        let mut j2 = judge_that_kept_uring();
        let (paths, a) = drive(&mut j2, gap + 12 * WINDOW, |p, _| match p {
            RxPath::Uring => 20,
            _ => 10,
        });
        assert_eq!((a.cost_checks, a.cost_costlier), (3, 1), "{a:?}");
        assert!(a.fallback_costlier > 0, "{a:?}");
        assert_eq!(*paths.last().unwrap(), RxPath::Copy);
    }
}
