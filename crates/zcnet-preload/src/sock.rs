//! One TCP socket's state: its counters, and its zero-copy bookkeeping — which
//! `MSG_ZEROCOPY` calls the kernel still reads, and the write protections held until it
//! is done with them.

use crate::copying_peers;
use crate::lineage::Process;
use crate::stats::Counters;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use zcnet::cow::Protection;
use zcnet::policy::CopiedDemotion;
use zcnet::zc::Completions;
use zcnet_sys::preload::real::with_fd;
use zcnet_sys::raw::zerocopy::{read_errqueue, set_so_zerocopy, ErrqueueEntry};

/// Completion ranges kept while their calls are not recorded yet (a drain on another thread
/// can read a completion between a send's return and its recording).
const EARLY_MAX: usize = 64;

/// Consecutive bytes reported COPIED that demote a socket: an eighth of zcnet's own 4 MiB.
/// Here every zero-copy send was also protected, which costs more than the copy on 4 KiB
/// pages unless the copy is slow (`cost.rs`), and a route that copies (veth into another
/// namespace) answers COPIED from the first notification. http.server over veth (64 KiB
/// calls) protected 20–70 calls per run (1.2–4.3 MiB) before the 4 MiB limit stopped it.
pub const DEMOTE_AFTER_COPIED_BYTES: u64 = 512 << 10;

/// Zero-copy bookkeeping of one socket.
#[derive(Debug, Default)]
pub struct Zc {
    completions: Completions<Protection>,
    demotion: CopiedDemotion,
    early: Vec<(u32, u32, bool)>,
    entries: Vec<ErrqueueEntry>,
    /// `SO_ZEROCOPY`: not tried (`None`), on, or refused.
    so_zerocopy: Option<bool>,
    /// The program reads the error queue itself: never send zero-copy here.
    pub app_errqueue: bool,
}

/// A TCP socket, shared by every descriptor of it in this process.
#[derive(Debug)]
pub struct Sock {
    /// Inode of the socket (descriptors of one socket share it) and its peer for the
    /// stats: asked of the kernel at the first send that may go zero-copy.
    identity: OnceLock<(u64, String)>,
    /// Counters.
    pub counters: Counters,
    /// Descriptors of this socket open in this process.
    pub fds: AtomicUsize,
    /// Held across a zero-copy send, so that its calls are numbered in order.
    pub sending: Mutex<()>,
    zc: Mutex<Zc>,
    zc_ever: AtomicBool,
    shared: AtomicBool,
    /// In a forked child: the process whose completions the error queue carries (`None`:
    /// ours).
    owner: Mutex<Option<Process>>,
    /// Both ends' addresses (local, peer), once known.
    ends: OnceLock<(IpAddr, IpAddr)>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Default for Sock {
    fn default() -> Sock {
        Sock::new()
    }
}

impl Sock {
    /// State for a socket not identified yet.
    pub fn new() -> Sock {
        Sock {
            identity: OnceLock::new(),
            counters: Counters::default(),
            fds: AtomicUsize::new(1),
            sending: Mutex::new(()),
            zc: Mutex::new(Zc::default()),
            zc_ever: AtomicBool::new(false),
            shared: AtomicBool::new(false),
            owner: Mutex::new(None),
            ends: OnceLock::new(),
        }
    }

    /// Records which socket this is: its inode and its peer.
    pub fn identify(&self, ino: u64, peer: String) {
        let _ = self.identity.set((ino, peer));
    }

    /// The socket's inode, once identified.
    pub fn ino(&self) -> Option<u64> {
        self.identity.get().map(|i| i.0)
    }

    /// The peer for the stats (empty if never identified: no send large enough).
    pub fn peer(&self) -> String {
        self.identity.get().map(|i| i.1.clone()).unwrap_or_default()
    }

    /// Both ends' addresses (local, peer): asked of the kernel once both are known (a
    /// socket still connecting has no peer yet, and is asked again at its next send), then
    /// kept.
    fn ends(&self, fd: i32) -> Option<(IpAddr, IpAddr)> {
        if let Some(&e) = self.ends.get() {
            return Some(e);
        }
        let ends = with_fd(fd, |b| {
            let r = socket2::SockRef::from(&b);
            let ip = |a: socket2::SockAddr| a.as_socket().map(|a| a.ip());
            Some((ip(r.local_addr().ok()?)?, ip(r.peer_addr().ok()?)?))
        })
        .flatten()?;
        Some(*self.ends.get_or_init(|| ends))
    }

    /// Whether this socket's peer is this host ([`zcnet::policy::delivery_is_local`]).
    pub fn delivery_is_local(&self, fd: i32) -> bool {
        self.ends(fd)
            .is_some_and(|(local, peer)| zcnet::policy::delivery_is_local(local, peer))
    }

    /// Whether another socket of this process to the same peer was demoted for COPIED
    /// completions ([`crate::copying_peers`]).
    pub fn route_copies(&self, fd: i32) -> bool {
        self.ends(fd)
            .is_some_and(|(_, peer)| copying_peers::copies(peer))
    }

    /// The zero-copy bookkeeping, locked (briefly: never across a blocking call).
    pub fn zc(&self) -> MutexGuard<'_, Zc> {
        lock(&self.zc)
    }

    /// Whether a zero-copy send ever went out on this socket.
    pub fn zc_ever(&self) -> bool {
        self.zc_ever.load(Relaxed)
    }

    /// The socket may be open in another process too (it was open across a `fork`, or
    /// came from where this library could not see): its error queue is shared, so no
    /// process sends zero-copy on it any more (see [`crate::birth`]).
    pub fn shared(&self) -> bool {
        self.shared.load(Relaxed)
    }

    /// Marks the socket shared (see [`Sock::shared`]).
    pub fn set_shared(&self) {
        self.shared.store(true, Relaxed);
    }

    /// In a forked child: the parent `p` sent zero-copy on this socket, and the
    /// completions that still arrive in its error queue are the parent's to read.
    pub fn set_owner(&self, p: Process) {
        *lock(&self.owner) = Some(p);
    }

    /// The process whose completions this socket's error queue may carry, if not this one.
    pub fn foreign_owner(&self) -> Option<Process> {
        *lock(&self.owner)
    }

    /// Protections still held (calls the kernel may still read).
    pub fn in_flight(&self) -> usize {
        self.zc().completions.loans_in_flight()
    }

    /// Whether COPIED completions demoted the socket.
    pub fn demoted(&self) -> bool {
        self.zc().demotion.is_demoted()
    }

    /// Turns `SO_ZEROCOPY` on (once); false if the kernel refused.
    pub fn enable_zerocopy(&self, fd: i32) -> bool {
        let mut z = self.zc();
        *z.so_zerocopy
            .get_or_insert_with(|| with_fd(fd, |b| set_so_zerocopy(b).is_ok()).unwrap_or(false))
    }

    /// Records one `MSG_ZEROCOPY` call of `bytes` whose pages `p` protects.
    pub fn record(&self, bytes: usize, p: Protection, demote_after: Option<u32>) {
        self.zc_ever.store(true, Relaxed);
        let mut z = self.zc();
        let id = z.completions.record_call(bytes);
        if let Some(p) = z.completions.lend(p, id, id) {
            self.counters.faults(p.release().faults);
        }
        let early = std::mem::take(&mut z.early);
        for (lo, hi, copied) in early {
            self.apply(&mut z, lo, hi, copied, demote_after);
        }
    }

    fn apply(&self, z: &mut Zc, lo: u32, hi: u32, copied: bool, demote_after: Option<u32>) {
        match z.completions.complete(lo, hi) {
            Ok(done) => {
                for p in done.released {
                    self.counters.faults(p.release().faults);
                }
                if copied {
                    self.counters.copied_anyway(done.bytes);
                }
                // 64 notifications, or DEMOTE_AFTER_COPIED_BYTES reported COPIED in a row:
                // one notification may cover many calls (the kernel merges consecutive
                // ranges) or one large call.
                let demoted = demote_after.is_some_and(|n| {
                    let policy = zcnet::Policy::default()
                        .with_demotion(Some(n))
                        .with_demotion_bytes(Some(DEMOTE_AFTER_COPIED_BYTES));
                    z.demotion.observe_bytes(copied, done.bytes, &policy)
                });
                if demoted {
                    if let Some(&(_, peer)) = self.ends.get() {
                        copying_peers::remember_copies(peer);
                    }
                }
            }
            Err(_) => {
                if z.early.len() >= EARLY_MAX {
                    z.early.remove(0);
                }
                z.early.push((lo, hi, copied));
            }
        }
    }

    /// Reads every completion waiting in the error queue (through `fd`) and lifts the
    /// protections they end. On a socket whose completions are another process's, does
    /// nothing while that process lives (they end its protections, and it reads them);
    /// once it is gone, reads and drops them (nobody else would, and the queue would
    /// report `POLLERR` for ever).
    pub fn drain(&self, fd: i32, demote_after: Option<u32>) {
        if let Some(owner) = self.foreign_owner() {
            if owner.alive() || self.zc().app_errqueue {
                return;
            }
            let mut entries = Vec::new();
            let _ = with_fd(fd, |b| read_errqueue(b, &mut entries));
            return;
        }
        if !self.zc_ever() {
            return;
        }
        let mut z = self.zc();
        let mut entries = std::mem::take(&mut z.entries);
        entries.clear();
        let _ = with_fd(fd, |b| read_errqueue(b, &mut entries));
        for e in &entries {
            if let ErrqueueEntry::Zerocopy { lo, hi, copied } = *e {
                self.apply(&mut z, lo, hi, copied, demote_after);
            }
        }
        z.entries = entries;
    }
}
