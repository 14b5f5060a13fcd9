//! What the library did, per socket and in total: bytes by path, bytes the kernel copied
//! anyway (COPIED completions), fallbacks by reason, protection faults. Counters are atomics
//! so a copying send counts without a lock.

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use zcnet_sys::board;

/// The process's totals on `zcnet run`'s board ([`crate::slot`]), in [`board::COUNTERS`]'
/// order: every event a socket's counters record is added there too.
const T_CALLS: usize = board::word::COUNTERS;
const T_BYTES_COPY: usize = T_CALLS + 1;
const T_BYTES_ZC: usize = T_CALLS + 2;
const T_COPIED_ANYWAY: usize = T_CALLS + 3;
const T_ZC_CALLS: usize = T_CALLS + 4;
const T_FAULTS: usize = T_CALLS + 5;
const T_PAGES: usize = T_CALLS + 6;
const T_DETOURS: usize = T_CALLS + 7;

fn tally(w: usize, n: u64) {
    crate::slot::add(w, n);
}

/// Why a send that could have gone zero-copy was copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// Below the size threshold.
    TooSmall,
    /// No page-aligned span large enough.
    Unaligned,
    /// `auto`: protecting a page costs more than copying it on this host.
    ProtectCostlier,
    /// The socket's completions kept saying COPIED (the kernel copies anyway: loopback).
    DemotedCopied,
    /// No write-protection engine, or `SO_ZEROCOPY` refused.
    Unsupported,
    /// The memory cannot be protected (file-backed, shared, stack, not resident).
    Unprotectable,
    /// A socket open in another process too since a `fork` (one error queue for both),
    /// or a forked child's protection engine (the parent started it, in its address space).
    Forked,
    /// The program reads this socket's error queue itself (its own `SO_ZEROCOPY`,
    /// timestamping, `IP_RECVERR`).
    AppErrqueue,
    /// An address, control message or flag (`MSG_OOB`, `MSG_FASTOPEN`) only a replay keeps.
    Flags,
    /// `MSG_ZEROCOPY` refused with `ENOBUFS` (locked-memory limit): that span was copied.
    Enobufs,
    /// `auto`: the program wrote buffers of this socket while they were in flight, and
    /// each such page cost a write fault and a copy — far more than copying it.
    Rewritten,
    /// `auto`: the peer is this host (loopback, or the socket's own address), where the
    /// kernel copies every zero-copy byte at delivery: protection could only add its cost.
    LocalDelivery,
    /// Another socket of this process to the same peer was demoted for COPIED completions
    /// (`crate::copying_peers`): this one copies from its first send.
    RouteCopies,
    /// The process has an `io_uring` ring (module `rings`): the kernel may write into its
    /// memory through calls this library never sees, so no page is protected any more.
    IoUring,
}

impl Reason {
    const ALL: [Reason; 14] = [
        Reason::TooSmall,
        Reason::Unaligned,
        Reason::ProtectCostlier,
        Reason::DemotedCopied,
        Reason::Unsupported,
        Reason::Unprotectable,
        Reason::Forked,
        Reason::AppErrqueue,
        Reason::Flags,
        Reason::Enobufs,
        Reason::Rewritten,
        Reason::LocalDelivery,
        Reason::RouteCopies,
        Reason::IoUring,
    ];

    /// The name in the stats file.
    pub fn name(self) -> &'static str {
        match self {
            Reason::TooSmall => "too_small",
            Reason::Unaligned => "unaligned",
            Reason::ProtectCostlier => "protect_costlier",
            Reason::DemotedCopied => "demoted_copied",
            Reason::Unsupported => "unsupported",
            Reason::Unprotectable => "unprotectable",
            Reason::Forked => "forked",
            Reason::AppErrqueue => "app_errqueue",
            Reason::Flags => "flags",
            Reason::Enobufs => "enobufs",
            Reason::Rewritten => "rewritten_in_flight",
            Reason::LocalDelivery => "local_delivery",
            Reason::RouteCopies => "route_copies",
            Reason::IoUring => "io_uring",
        }
    }
}

/// Counters of one socket (or of all).
#[derive(Debug, Default)]
pub struct Counters {
    calls: AtomicU64,
    bytes_copy: AtomicU64,
    bytes_zerocopy: AtomicU64,
    copied_anyway: AtomicU64,
    zc_calls: AtomicU64,
    faults: AtomicU64,
    pages_protected: AtomicU64,
    detours: AtomicU64,
    fallback_calls: [AtomicU64; Reason::ALL.len()],
    fallback_bytes: [AtomicU64; Reason::ALL.len()],
}

/// A snapshot of [`Counters`], as written to the stats file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Interposed send calls.
    pub calls: u64,
    /// Bytes sent by copying.
    pub bytes_copy: u64,
    /// Bytes sent zero-copy under write protection.
    pub bytes_zerocopy: u64,
    /// Of those, bytes the kernel copied anyway (COPIED completions).
    pub copied_anyway: u64,
    /// `MSG_ZEROCOPY` calls made.
    pub zerocopy_calls: u64,
    /// Write faults on protected pages (the program wrote a buffer still in flight; each
    /// got a private copy).
    pub protection_faults: u64,
    /// Pages write-protected.
    pub pages_protected: u64,
    /// Receives into a protected buffer, done into scratch and copied.
    pub kernel_write_detours: u64,
    /// Fallbacks to copy by reason: calls.
    pub fallback_calls: BTreeMap<&'static str, u64>,
    /// Fallbacks to copy by reason: bytes.
    pub fallback_bytes: BTreeMap<&'static str, u64>,
}

impl Counters {
    /// A send call of `bytes` copied (`reason`: why not zero-copy, if it could have been).
    pub fn copied(&self, bytes: u64, reason: Option<Reason>) {
        self.bytes_copy.fetch_add(bytes, Relaxed);
        tally(T_BYTES_COPY, bytes);
        if let Some(r) = reason {
            self.fallback(r, bytes);
        }
    }

    /// A copied span of a call that otherwise went zero-copy, or a whole call, for `r`.
    pub fn fallback(&self, r: Reason, bytes: u64) {
        let i = r as usize;
        self.fallback_calls[i].fetch_add(1, Relaxed);
        self.fallback_bytes[i].fetch_add(bytes, Relaxed);
        tally(board::fallback_calls(i), 1);
        tally(board::fallback_bytes(i), bytes);
    }

    /// One interposed send call.
    pub fn call(&self) {
        self.calls.fetch_add(1, Relaxed);
        tally(T_CALLS, 1);
    }

    /// Bytes sent by copy inside a zero-copy call (head, tail, small buffers).
    pub fn copy_bytes(&self, bytes: u64) {
        self.bytes_copy.fetch_add(bytes, Relaxed);
        tally(T_BYTES_COPY, bytes);
    }

    /// One `MSG_ZEROCOPY` call that sent `bytes`.
    pub fn zerocopy(&self, bytes: u64) {
        self.zc_calls.fetch_add(1, Relaxed);
        self.bytes_zerocopy.fetch_add(bytes, Relaxed);
        tally(T_ZC_CALLS, 1);
        tally(T_BYTES_ZC, bytes);
    }

    /// Completions that said COPIED for `bytes`.
    pub fn copied_anyway(&self, bytes: u64) {
        self.copied_anyway.fetch_add(bytes, Relaxed);
        tally(T_COPIED_ANYWAY, bytes);
    }

    /// Pages protected for one span.
    pub fn protected(&self, pages: u64) {
        self.pages_protected.fetch_add(pages, Relaxed);
        tally(T_PAGES, pages);
    }

    /// Faults taken by spans released.
    pub fn faults(&self, n: u64) {
        self.faults.fetch_add(n, Relaxed);
        tally(T_FAULTS, n);
    }

    /// Faults counted so far.
    pub fn faults_so_far(&self) -> u64 {
        self.faults.load(Relaxed)
    }

    /// One receive detoured through scratch.
    pub fn detour(&self) {
        self.detours.fetch_add(1, Relaxed);
        tally(T_DETOURS, 1);
    }

    /// Back to zero, without touching the board: in a forked child, whose counts so far
    /// are its parent's (see `table::after_fork`), and whose board slot starts empty.
    pub fn reset(&self) {
        for c in [
            &self.calls,
            &self.bytes_copy,
            &self.bytes_zerocopy,
            &self.copied_anyway,
            &self.zc_calls,
            &self.faults,
            &self.pages_protected,
            &self.detours,
        ]
        .into_iter()
        .chain(&self.fallback_calls)
        .chain(&self.fallback_bytes)
        {
            c.store(0, Relaxed);
        }
    }

    /// Adds `other` into `self`.
    pub fn absorb(&self, o: &Report) {
        self.calls.fetch_add(o.calls, Relaxed);
        self.bytes_copy.fetch_add(o.bytes_copy, Relaxed);
        self.bytes_zerocopy.fetch_add(o.bytes_zerocopy, Relaxed);
        self.copied_anyway.fetch_add(o.copied_anyway, Relaxed);
        self.zc_calls.fetch_add(o.zerocopy_calls, Relaxed);
        self.faults.fetch_add(o.protection_faults, Relaxed);
        self.pages_protected.fetch_add(o.pages_protected, Relaxed);
        self.detours.fetch_add(o.kernel_write_detours, Relaxed);
        for r in Reason::ALL {
            let i = r as usize;
            self.fallback_calls[i].fetch_add(
                o.fallback_calls.get(r.name()).copied().unwrap_or(0),
                Relaxed,
            );
            self.fallback_bytes[i].fetch_add(
                o.fallback_bytes.get(r.name()).copied().unwrap_or(0),
                Relaxed,
            );
        }
    }

    /// The counters now.
    pub fn report(&self) -> Report {
        let mut fc = BTreeMap::new();
        let mut fb = BTreeMap::new();
        for r in Reason::ALL {
            let i = r as usize;
            let c = self.fallback_calls[i].load(Relaxed);
            if c > 0 {
                fc.insert(r.name(), c);
                fb.insert(r.name(), self.fallback_bytes[i].load(Relaxed));
            }
        }
        Report {
            calls: self.calls.load(Relaxed),
            bytes_copy: self.bytes_copy.load(Relaxed),
            bytes_zerocopy: self.bytes_zerocopy.load(Relaxed),
            copied_anyway: self.copied_anyway.load(Relaxed),
            zerocopy_calls: self.zc_calls.load(Relaxed),
            protection_faults: self.faults.load(Relaxed),
            pages_protected: self.pages_protected.load(Relaxed),
            kernel_write_detours: self.detours.load(Relaxed),
            fallback_calls: fc,
            fallback_bytes: fb,
        }
    }
}

/// What `sendmmsg` on UDP sockets did, for the whole process.
#[derive(Debug, Default)]
pub struct UdpCounters {
    calls: AtomicU64,
    gso_sends: AtomicU64,
    gso_datagrams: AtomicU64,
    gso_bytes: AtomicU64,
    forwarded: AtomicU64,
    gso_refused: AtomicU64,
}

/// A snapshot of [`UdpCounters`], as written to the stats file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct UdpReport {
    /// Interposed `sendmmsg` calls on UDP sockets.
    pub calls: u64,
    /// GSO sends made for them.
    pub gso_sends: u64,
    /// Datagrams those carried.
    pub gso_datagrams: u64,
    /// Payload bytes those carried.
    pub gso_bytes: u64,
    /// Datagrams sent as the program's own `sendmmsg` (short runs, mixed sizes or peers,
    /// control messages, `MSG_MORE`, a socket that refused GSO).
    pub forwarded_datagrams: u64,
    /// Datagrams whose GSO send the kernel refused (then sent as they were).
    pub gso_refused: u64,
}

impl UdpCounters {
    /// One `sendmmsg` call.
    pub fn call(&self) {
        self.calls.fetch_add(1, Relaxed);
        tally(board::udp(0), 1);
    }

    /// One GSO send of `datagrams` carrying `bytes`.
    pub fn gso(&self, datagrams: u64, bytes: u64) {
        self.gso_sends.fetch_add(1, Relaxed);
        self.gso_datagrams.fetch_add(datagrams, Relaxed);
        self.gso_bytes.fetch_add(bytes, Relaxed);
        tally(board::udp(1), 1);
        tally(board::udp(2), datagrams);
        tally(board::udp(3), bytes);
    }

    /// `datagrams` sent as the program's own call.
    pub fn forwarded(&self, datagrams: u64) {
        self.forwarded.fetch_add(datagrams, Relaxed);
        tally(board::udp(4), datagrams);
    }

    /// A GSO send of `datagrams` refused.
    pub fn refused(&self, datagrams: u64) {
        self.gso_refused.fetch_add(datagrams, Relaxed);
        tally(board::udp(5), datagrams);
    }

    /// Back to zero (a forked child: see [`Counters::reset`]).
    pub fn reset(&self) {
        for c in [
            &self.calls,
            &self.gso_sends,
            &self.gso_datagrams,
            &self.gso_bytes,
            &self.forwarded,
            &self.gso_refused,
        ] {
            c.store(0, Relaxed);
        }
    }

    /// The counters now.
    pub fn report(&self) -> UdpReport {
        UdpReport {
            calls: self.calls.load(Relaxed),
            gso_sends: self.gso_sends.load(Relaxed),
            gso_datagrams: self.gso_datagrams.load(Relaxed),
            gso_bytes: self.gso_bytes.load(Relaxed),
            forwarded_datagrams: self.forwarded.load(Relaxed),
            gso_refused: self.gso_refused.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_index_their_own_slot() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
    }

    /// `zcnet run` names the board's words by zcnet-sys's lists: they must be the names
    /// this library writes in its own stats lines, in the order it counts them.
    #[test]
    fn the_boards_names_are_the_stats_lines_names() {
        let names: Vec<&str> = Reason::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(names, board::REASONS);
        let a = Counters::default();
        a.call();
        a.zerocopy(1);
        let r = serde_json::to_value(a.report()).unwrap();
        let want = [1, 0, 1, 0, 1, 0, 0, 0];
        for (i, name) in board::COUNTERS.iter().enumerate() {
            assert_eq!(r[name], want[i], "{name} is word {i}");
        }
        let u = serde_json::to_value(UdpReport::default()).unwrap();
        for name in board::UDP {
            assert!(u.get(name).is_some(), "{name}");
        }
        let f = serde_json::to_value(crate::globals::FreedReport::default()).unwrap();
        for name in board::FREED {
            assert!(f.get(name).is_some(), "{name}");
        }
    }

    #[test]
    fn reset_forgets_every_count() {
        let a = Counters::default();
        a.call();
        a.copied(100, Some(Reason::TooSmall));
        a.zerocopy(8192);
        a.copied_anyway(8192);
        a.protected(2);
        a.faults(1);
        a.detour();
        a.reset();
        assert_eq!(a.report(), Report::default());
        let u = UdpCounters::default();
        u.call();
        u.gso(3, 3000);
        u.forwarded(1);
        u.refused(1);
        u.reset();
        assert_eq!(u.report(), UdpReport::default());
    }

    #[test]
    fn absorb_adds_a_report() {
        let a = Counters::default();
        a.call();
        a.copied(100, Some(Reason::TooSmall));
        a.zerocopy(8192);
        let b = Counters::default();
        b.absorb(&a.report());
        b.absorb(&a.report());
        let r = b.report();
        assert_eq!((r.calls, r.bytes_copy, r.bytes_zerocopy), (2, 200, 16384));
        assert_eq!(r.fallback_bytes.get("too_small"), Some(&200));
    }
}
