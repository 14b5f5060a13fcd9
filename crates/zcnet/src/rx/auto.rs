//! The `auto` receive path: switches between the copy, `mmap` and `uring` receivers by the
//! answers of its decider, and nothing else.
//!
//! * What a connection takes — the profile's path, its half of a pair, or a trial — is
//!   decided once, before the first byte, by [`crate::auto::rx_choice`].
//! * The trial and the run-time check are `crate::auto::decide::RxDecider`'s, a pure state
//!   machine; this module feeds it the bytes each receive delivered and the CPU clock.
//! * The clock is the receiving thread's, plus the sender's where its card was found
//!   ([`RxClock`], reading [`crate::peer_card`]).
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
use crate::auto::decide::{cost_check_within, Decide, RxDecider, TRIAL_ROUNDS};
use crate::auto::rx_choice::AutoRxChoice;
use crate::auto::trial::Trial;
use crate::auto::AutoStats;
use crate::error::Result;
use crate::path::{FallbackReason, RxPath};
use crate::peer_card::{default_dir, PeerClock};
use crate::stats::Stats;
use std::os::fd::BorrowedFd;

/// Bytes a trial waits, on copy, for its sender's card to count a send (its key in the
/// trial memory) before it starts without it.
const PENDING_MAX_BYTES: u64 = 1 << 20;
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

impl AutoRx {
    /// `alts` are the paths `choice` may take besides copy (the chosen one, or a trial's
    /// candidates that could be set up); the check measures windows of `window` bytes;
    /// `memory`: a trial uses the process's memory of clear losers
    /// ([`crate::auto::memory`]); `peer_clock`: a trial looks for the sender's clock card
    /// ([`crate::peer_card`]).
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

/// Whether, and how, a receiver reads its sender's CPU clock ([`crate::peer_card`]).
#[derive(Debug)]
pub(crate) enum Peer {
    /// Not wanted: a profile chose, or [`crate::ReceiverConfig::peer_clock`] is off.
    Off,
    /// Wanted (a trial without a profile), not looked for yet.
    Wanted,
    /// Found: the sender's clock.
    Found(PeerClock),
    /// Looked for; no card, or its thread could not be read.
    Absent,
}

/// The receiving thread's CPU clock, plus the sending thread's where its card was found:
/// counted from when it was found, so that the sum never jumps, and restated per byte this
/// receiver took ([`PeerClock::now`]).
#[derive(Debug)]
pub(crate) struct RxClock {
    pub(crate) peer: Peer,
    /// Bytes delivered so far (once some have, a zcnet sender has written its card: it
    /// does before its first send).
    pub(crate) received: u64,
    /// Both ends' addresses, once the sender's card was found.
    pub(crate) route: Option<(std::net::IpAddr, std::net::IpAddr)>,
}

impl RxClock {
    /// The trial memory's key: the route and the sender's op size, where its card was
    /// found and has counted a send.
    pub(crate) fn key(&self) -> Option<crate::auto::memory::Key> {
        match (&self.peer, self.route) {
            (Peer::Found(p), Some((sender, receiver))) => p
                .op_size()
                .map(|op| crate::auto::memory::Key::new(sender, receiver, op, p.sender_path())),
            _ => None,
        }
    }

    pub(crate) fn now(&self) -> u64 {
        let own = zcnet_sys::raw::cpu::thread_cpu_ns();
        match &self.peer {
            Peer::Found(p) => own + p.now(self.received),
            _ => own,
        }
    }

    /// Counts `n` bytes delivered.
    pub(crate) fn delivered(&mut self, n: usize) {
        self.received += n as u64;
    }

    /// Looks for the card of the sender of `fd`'s connection, once bytes have arrived.
    pub(crate) fn look(&mut self, fd: BorrowedFd<'_>, delta: &mut AutoStats) {
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
