//! A fault seam below the send and receive loops (in the spirit of smoltcp's
//! `phy::FaultInjector`): the copy send loop, the `MSG_ZEROCOPY` send loop, the error-queue
//! reader and the copy receive loop make their socket calls through here, and a test may
//! attach a [`FaultPlan`] to one socket to make chosen calls fail (`ENOBUFS`, `EAGAIN`,
//! `EINTR`, `ECONNRESET`…), come up short, or have their completions reported copied,
//! out of order or coalesced — so every fallback and error path runs on any machine,
//! without root and without kernel tricks, against real sockets that carry every byte.
//!
//! Test-only: public (and hidden from the docs) only with the `fault-seam` feature, which
//! zcnet's own tests turn on. Without it each call is the syscall alone; with it and no
//! plan attached anywhere, one relaxed atomic load more.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use zcnet_sys::raw::socket::{self, RecvFlags, SendFlags};
use zcnet_sys::raw::zerocopy::{self as zc, ErrqueueEntry};

/// A socket call the seam can fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// `send(2)` of the copy loop.
    Send,
    /// `send(2)` with `MSG_ZEROCOPY`.
    SendZerocopy,
    /// `recv(2)` of the copy receive loop.
    Recv,
}

/// What to do to one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fail with this errno without making the call.
    Errno(i32),
    /// Make the call with at most this many bytes (a short send or read).
    Short(usize),
}

/// What to do to the completions of a `MSG_ZEROCOPY` socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Completions {
    /// Report them as the kernel did.
    #[default]
    AsIs,
    /// Report every range as copied (`SO_EE_CODE_ZEROCOPY_COPIED`).
    Copied,
    /// Report the calls numbered below this one as copied and the rest as not (a route
    /// that stopped copying: a packet tap went away); a range across it is split.
    CopiedBefore(u32),
    /// Split every range into single calls and report each read's calls in reverse order.
    Reversed,
    /// Hold completions back and report them merged into contiguous ranges once `n` have
    /// gathered (or when a read finds nothing new, so a waiting sender is never starved).
    Coalesced(usize),
}

type Decide = Box<dyn FnMut(u64) -> Option<Fault> + Send>;

/// Faults for one socket: per [`Op`], a rule given the call's number (0, 1, 2, … per op).
#[derive(Default)]
pub struct FaultPlan {
    rules: HashMap<Op, Decide>,
    calls: HashMap<Op, u64>,
    completions: Completions,
    held: Vec<ErrqueueEntry>,
}

impl std::fmt::Debug for FaultPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultPlan")
            .field("ops", &self.rules.keys().collect::<Vec<_>>())
            .field("calls", &self.calls)
            .field("completions", &self.completions)
            .finish()
    }
}

impl FaultPlan {
    /// No faults yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Faults calls of `op`: `rule(n)` for the `n`-th call (from 0) says what to do, `None`
    /// to let it through.
    pub fn on(mut self, op: Op, rule: impl FnMut(u64) -> Option<Fault> + Send + 'static) -> Self {
        self.rules.insert(op, Box::new(rule));
        self
    }

    /// How completions are reported.
    pub fn completions(mut self, c: Completions) -> Self {
        self.completions = c;
        self
    }

    fn decide(&mut self, op: Op) -> Option<Fault> {
        let n = self.calls.entry(op).or_insert(0);
        let i = *n;
        *n += 1;
        self.rules.get_mut(&op).and_then(|r| r(i))
    }
}

static ACTIVE: AtomicUsize = AtomicUsize::new(0);
static PLANS: Mutex<Vec<(u64, FaultPlan)>> = Mutex::new(Vec::new());

fn plans() -> MutexGuard<'static, Vec<(u64, FaultPlan)>> {
    PLANS.lock().unwrap_or_else(|p| p.into_inner())
}

/// A socket's identity for the registry: its inode, unique while it is open (a descriptor
/// number can be reused by another test's socket).
fn key(fd: BorrowedFd<'_>) -> Option<u64> {
    rustix::fs::fstat(fd).ok().map(|st| st.st_ino)
}

/// A plan attached to a socket; detached when dropped.
#[derive(Debug)]
#[must_use = "the plan is detached when this is dropped"]
pub struct Attached {
    key: u64,
}

/// Attaches `plan` to the socket `fd` (replacing any plan it had).
pub fn attach(fd: impl AsFd, plan: FaultPlan) -> io::Result<Attached> {
    let k = key(fd.as_fd()).ok_or_else(|| io::Error::other("fstat failed"))?;
    let mut p = plans();
    p.retain(|(x, _)| *x != k);
    p.push((k, plan));
    ACTIVE.store(p.len(), Ordering::Relaxed);
    Ok(Attached { key: k })
}

impl Drop for Attached {
    fn drop(&mut self) {
        let mut p = plans();
        p.retain(|(x, _)| *x != self.key);
        ACTIVE.store(p.len(), Ordering::Relaxed);
    }
}

/// Runs `f` on the plan of `fd`, if it has one.
fn with_plan<R>(fd: BorrowedFd<'_>, f: impl FnOnce(&mut FaultPlan) -> R) -> Option<R> {
    if cfg!(not(feature = "fault-seam")) || ACTIVE.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let k = key(fd)?;
    let mut p = plans();
    p.iter_mut().find(|(x, _)| *x == k).map(|(_, plan)| f(plan))
}

fn apply<T>(
    fd: BorrowedFd<'_>,
    op: Op,
    len: usize,
    call: impl FnOnce(usize) -> io::Result<T>,
) -> io::Result<T> {
    match with_plan(fd, |p| p.decide(op)).flatten() {
        None => call(len),
        Some(Fault::Errno(e)) => Err(io::Error::from_raw_os_error(e)),
        Some(Fault::Short(n)) => call(n.min(len).max(len.min(1))),
    }
}

/// `send(2)` through the seam.
pub(crate) fn send(fd: BorrowedFd<'_>, data: &[u8], flags: SendFlags) -> io::Result<usize> {
    apply(fd, Op::Send, data.len(), |n| {
        socket::send(fd, &data[..n], flags)
    })
}

/// `send(2)` with `MSG_ZEROCOPY` through the seam.
pub(crate) fn send_zerocopy(
    fd: BorrowedFd<'_>,
    data: &[u8],
    flags: SendFlags,
) -> io::Result<usize> {
    apply(fd, Op::SendZerocopy, data.len(), |n| {
        zc::send_zerocopy(fd, &data[..n], flags)
    })
}

/// `recv(2)` through the seam.
pub(crate) fn recv(fd: BorrowedFd<'_>, buf: &mut [u8], flags: RecvFlags) -> io::Result<usize> {
    let len = buf.len();
    apply(fd, Op::Recv, len, |n| {
        socket::recv(fd, &mut buf[..n], flags)
    })
}

/// Reads the error queue through the seam, rewriting completions as the plan says;
/// stops early once `enough` says so of the entries read ([`zc::read_errqueue_until`],
/// judged before the plan's rewriting).
pub(crate) fn read_errqueue(
    fd: BorrowedFd<'_>,
    out: &mut Vec<ErrqueueEntry>,
    enough: impl FnMut(&[ErrqueueEntry]) -> bool,
) -> io::Result<usize> {
    let start = out.len();
    let n = zc::read_errqueue_until(fd, out, enough)?;
    let rewritten = with_plan(fd, |p| {
        let fresh: Vec<ErrqueueEntry> = out.drain(start..).collect();
        let got_new = !fresh.is_empty();
        let rewritten = rewrite(p, fresh, got_new);
        out.extend(rewritten);
    });
    Ok(if rewritten.is_some() {
        out.len() - start
    } else {
        n
    })
}

fn rewrite(p: &mut FaultPlan, fresh: Vec<ErrqueueEntry>, got_new: bool) -> Vec<ErrqueueEntry> {
    match p.completions {
        Completions::AsIs => fresh,
        Completions::Copied => fresh
            .into_iter()
            .map(|e| match e {
                ErrqueueEntry::Zerocopy { lo, hi, .. } => ErrqueueEntry::Zerocopy {
                    lo,
                    hi,
                    copied: true,
                },
                other => other,
            })
            .collect(),
        Completions::CopiedBefore(n) => {
            let mut out = Vec::new();
            for e in fresh {
                match e {
                    ErrqueueEntry::Zerocopy { lo, hi, .. } if lo < n && hi >= n => {
                        out.push(ErrqueueEntry::Zerocopy {
                            lo,
                            hi: n - 1,
                            copied: true,
                        });
                        out.push(ErrqueueEntry::Zerocopy {
                            lo: n,
                            hi,
                            copied: false,
                        });
                    }
                    ErrqueueEntry::Zerocopy { lo, hi, .. } => out.push(ErrqueueEntry::Zerocopy {
                        lo,
                        hi,
                        copied: hi < n,
                    }),
                    other => out.push(other),
                }
            }
            out
        }
        Completions::Reversed => {
            let mut singles = Vec::new();
            for e in fresh {
                match e {
                    ErrqueueEntry::Zerocopy { lo, hi, copied } => {
                        let mut id = lo;
                        loop {
                            singles.push(ErrqueueEntry::Zerocopy {
                                lo: id,
                                hi: id,
                                copied,
                            });
                            if id == hi {
                                break;
                            }
                            id = id.wrapping_add(1);
                        }
                    }
                    other => singles.push(other),
                }
            }
            singles.reverse();
            singles
        }
        Completions::Coalesced(n) => {
            p.held.extend(fresh);
            let calls: u64 = p
                .held
                .iter()
                .map(|e| match e {
                    ErrqueueEntry::Zerocopy { lo, hi, .. } => u64::from(hi.wrapping_sub(*lo)) + 1,
                    _ => 0,
                })
                .sum();
            if calls < n as u64 && got_new {
                return Vec::new();
            }
            merge(std::mem::take(&mut p.held))
        }
    }
}

/// Merges ranges that are contiguous in the 32-bit counter (as the kernel itself does).
fn merge(entries: Vec<ErrqueueEntry>) -> Vec<ErrqueueEntry> {
    let mut out: Vec<ErrqueueEntry> = Vec::new();
    for e in entries {
        if let (
            Some(ErrqueueEntry::Zerocopy {
                hi: last_hi,
                copied: last_copied,
                ..
            }),
            ErrqueueEntry::Zerocopy { lo, hi, copied },
        ) = (out.last_mut(), e)
        {
            if last_hi.wrapping_add(1) == lo && *last_copied == copied {
                *last_hi = hi;
                continue;
            }
        }
        out.push(e);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zc(lo: u32, hi: u32) -> ErrqueueEntry {
        ErrqueueEntry::Zerocopy {
            lo,
            hi,
            copied: false,
        }
    }

    #[test]
    fn completions_are_rewritten_as_asked() {
        let mut p = FaultPlan::new().completions(Completions::Reversed);
        assert_eq!(
            rewrite(&mut p, vec![zc(1, 3)], true),
            vec![zc(3, 3), zc(2, 2), zc(1, 1)]
        );
        let mut p = FaultPlan::new().completions(Completions::Coalesced(4));
        assert!(rewrite(&mut p, vec![zc(0, 0), zc(1, 1)], true).is_empty());
        assert_eq!(rewrite(&mut p, vec![zc(2, 3)], true), vec![zc(0, 3)]);
        // A read with nothing new releases what is held, so a waiting sender is not starved.
        assert!(rewrite(&mut p, vec![zc(4, 4)], true).is_empty());
        assert_eq!(rewrite(&mut p, vec![], false), vec![zc(4, 4)]);
        let mut p = FaultPlan::new().completions(Completions::Copied);
        assert_eq!(
            rewrite(&mut p, vec![zc(u32::MAX, 1)], true),
            vec![ErrqueueEntry::Zerocopy {
                lo: u32::MAX,
                hi: 1,
                copied: true
            }]
        );
        let mut p = FaultPlan::new().completions(Completions::CopiedBefore(5));
        let copied = |lo, hi| ErrqueueEntry::Zerocopy {
            lo,
            hi,
            copied: true,
        };
        assert_eq!(
            rewrite(&mut p, vec![zc(0, 2), zc(3, 7), zc(8, 9)], true),
            vec![copied(0, 2), copied(3, 4), zc(5, 7), zc(8, 9)]
        );
    }

    #[test]
    fn rules_see_each_op_numbered_from_zero() {
        let mut p = FaultPlan::new().on(Op::Send, |i| (i % 2 == 1).then_some(Fault::Short(3)));
        assert_eq!(p.decide(Op::Send), None);
        assert_eq!(p.decide(Op::Send), Some(Fault::Short(3)));
        assert_eq!(p.decide(Op::Recv), None);
        assert_eq!(p.decide(Op::Send), None);
    }
}
