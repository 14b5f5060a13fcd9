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
//! The trial and the check are `crate::auto::decide::RxDecider`'s, a pure state machine;
//! this module sets it up, feeds it the bytes each receive delivered and the CPU clock
//! (the receiving thread's, plus the sender's where its card was found — `RxClock`), and
//! switches receivers by its answers.
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
use crate::auto::decide::{cost_check_within, Decide, RxDecider, TRIAL, TRIAL_ROUNDS};
use crate::auto::trial::Trial;
use crate::auto::ProfileSource;
use crate::auto::{load, pair, AutoStats, Chooser};
use crate::error::Result;
use crate::path::{FallbackReason, RxPath};
use crate::stats::Stats;
use std::net::IpAddr;
use std::os::fd::BorrowedFd;

/// Bytes a trial waits, on copy, for its sender's card to count a send (its key in the
/// trial memory) before it starts without it.
const PENDING_MAX_BYTES: u64 = 1 << 20;
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

/// The `auto` receive path with its run-time cost check (see the module docs).
pub(crate) struct AutoRx {
    copy: CopyRx,
    mmap: Option<MmapRx>,
    uring: Option<Box<UringRx>>,
    /// `uring` owns the socket: armed, or parked with bytes still to hand out.
    uring_on: bool,
    decider: RxDecider,
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
            decider: RxDecider {
                check: cost_check_within(window, choice.check_margin),
                trial,
                pending,
                key: None,
                memory,
                wanted,
                window,
                wall: std::time::Instant::now,
                costlier: false,
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
    fn prepare(&mut self, fd: BorrowedFd<'_>, stats: &Stats, delta: &mut AutoStats) -> Result<Use> {
        self.tell_others();
        self.clock.look(fd, delta);
        if self.decider.pending.is_some() && !matches!(self.clock.peer, Peer::Wanted) {
            // The sender counts a send just after it returns: a receiver can be a step
            // ahead of the count. Wait for it a little, then go without the memory.
            let key = self.clock.key();
            let found = matches!(self.clock.peer, Peer::Found(_));
            if key.is_some() || !found || self.clock.received >= PENDING_MAX_BYTES {
                self.decider.start_trial(key, delta);
            }
        }
        let clock = &self.clock;
        let target = self.decider.next(0, true, &|| clock.now(), delta);
        // An armed `uring` gives the socket up before anyone else reads it.
        if target != RxPath::Uring && self.uring_on {
            if let Some(u) = self.uring.as_mut() {
                if !u.is_parked() {
                    // Not confirmed over in time: the parked ring keeps reading until its
                    // request's end is seen, so the order of the bytes still holds.
                    let _ = u.park();
                }
                if !u.parked_drained(fd, stats)? {
                    return Ok(Use::Uring);
                }
            }
            self.uring_on = false;
        }
        // A receiver that can no longer be wanted goes once it holds nothing: copy then
        // reads straight from the socket, not through the mapping receiver's copy mode, and
        // the mapping window, the scratch and the ring's buffers are freed.
        if self.decider.settled_without(RxPath::Mmap)
            && self.mmap.as_ref().is_some_and(|m| !m.holds())
        {
            self.mmap = None;
        }
        if self.decider.settled_without(RxPath::Uring) && !self.uring_on {
            self.uring = None;
        }
        if let Some(m) = self.mmap.as_mut() {
            // Copy reads through the mapping receiver (plain `recv`, its held bytes first);
            // `uring` waits until those are handed out.
            m.set_copy(target != RxPath::Mmap);
            if target != RxPath::Uring || m.holds() {
                return Ok(Use::Mmap);
            }
        }
        Ok(match (target, self.uring.as_mut()) {
            (RxPath::Uring, Some(u)) => {
                if u.is_parked() {
                    u.unpark();
                }
                self.uring_on = true;
                Use::Uring
            }
            _ => Use::Copy,
        })
    }

    /// Whether the receiver is copy for good: the choice or the trial kept copy (the check
    /// never moves off copy), the other receivers are gone and nothing is held. Each
    /// operation then goes straight to copy, skipping the routing a choice still open needs
    /// (`AutoRx::recv` and `judged` were about a quarter of an `auto` receiver's user-space
    /// samples at 16 KiB on loopback, `perf record -e cpu-clock`).
    fn copy_for_good(&self) -> bool {
        self.decider.wanted == RxPath::Copy
            && self.mmap.is_none()
            && self.uring.is_none()
            && !self.uring_on
            && self.held.is_empty()
            && self.decider.settled_without(RxPath::Mmap)
            && self.decider.settled_without(RxPath::Uring)
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

/// After an operation that delivered `n` bytes: counts them on `clock`, has the decider
/// judge it on that clock, and adds what it counted (an operation kept on copy as dearer is
/// a fallback too).
fn judged(
    decider: &mut RxDecider,
    clock: &mut RxClock,
    n: usize,
    mut delta: AutoStats,
    stats: &Stats,
) {
    clock.delivered(n);
    let clock = &*clock;
    decider.done(n as u64, &|| clock.now(), &mut delta);
    if delta.fallback_costlier > 0 {
        stats.fallback(FallbackReason::Costlier, n as u64);
    }
    if delta != AutoStats::default() {
        stats.add_auto_rx(&delta);
    }
}

/// The receiver an operation goes to (fields apart, so the decider stays free to borrow).
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
        let use_ = self.prepare(fd, stats, &mut delta)?;
        let AutoRx {
            copy,
            mmap,
            uring,
            decider,
            taken,
            clock,
            ..
        } = self;
        let r = receiver(use_, copy, mmap, uring).recv(fd, stats)?;
        let n = r.as_ref().map_or(0, |c| c.len());
        // `prepare` told the others what the last operation took, so this starts afresh.
        *taken = Some((use_, n as u64));
        judged(decider, clock, n, delta, stats);
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
        let use_ = self.prepare(fd, stats, &mut delta)?;
        let n = receiver(use_, &mut self.copy, &mut self.mmap, &mut self.uring)
            .recv_into(fd, buf, stats)?;
        self.took(use_, n);
        judged(&mut self.decider, &mut self.clock, n, delta, stats);
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
        let use_ = self.prepare(fd, stats, &mut delta)?;
        let n = receiver(use_, &mut self.copy, &mut self.mmap, &mut self.uring)
            .recv_lend(fd, scratch, max, stats, sink)?;
        self.took(use_, n);
        judged(&mut self.decider, &mut self.clock, n, delta, stats);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
