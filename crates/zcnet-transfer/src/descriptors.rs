//! Descriptors a peer makes an exposed receiver hold, counted per session and per address.
//!
//! Most of what a connection holds is bounded by the connection itself (its socket, its
//! directory cache, the window of small files waiting for their batch), so the limits on
//! connections bound it. What is not is a file received by ranges (protocol version 6): it
//! keeps its partial file open from its first range to its last, and its `.ranges` record
//! with `--resume`, whichever stream's connection brought them and however long the peer
//! waits — a peer starting many such files and finishing none pinned every descriptor of a
//! receiver (issue 40, finding 3). So every connection and every unfinished ranged file (and
//! its record) is charged here before it opens anything, against its session and its
//! sender's address; a charge past either cap is refused with [`Code::Busy`] and the reason,
//! and a [`Held`] gives its descriptors back when dropped.

use super::store::Refusal;
use super::wire::Code;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

/// Descriptors charged for each connection of a session: its socket, the server's handle
/// on it (to shut it down at a deadline), the finishing thread's duplicate, the two ends of
/// its splice pipe, its store's receive directory, and the duplicates of a partial file
/// being written (a range's, the landing hash's). Not charged, and bounded by the
/// connection: the store's cache of directories (at most 256) and the small files waiting
/// for their batch (at most a window's).
pub const PER_CONNECTION: usize = 8;

/// Descriptors of one unfinished ranged file: its partial file, and its record with
/// `--resume` (`recorded`).
pub fn per_ranged_file(recorded: bool) -> usize {
    1 + usize::from(recorded)
}

/// The counts and caps of one receiver, shared by its sessions.
#[derive(Debug)]
pub struct DescriptorBudget {
    per_session: usize,
    per_addr: usize,
    by_addr: Mutex<HashMap<IpAddr, usize>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl DescriptorBudget {
    /// At most `per_session` descriptors per session and `per_addr` per sender address.
    pub fn new(per_session: usize, per_addr: usize) -> Arc<DescriptorBudget> {
        Arc::new(DescriptorBudget {
            per_session,
            per_addr,
            by_addr: Mutex::new(HashMap::new()),
        })
    }

    /// A session's account (`addr`: its sender's address).
    pub fn session(self: &Arc<Self>, addr: IpAddr) -> Arc<SessionDescriptors> {
        Arc::new(SessionDescriptors {
            budget: Some((self.clone(), addr)),
            held: Mutex::new(0),
        })
    }

    /// Descriptors charged to `addr` now.
    pub fn of_addr(&self, addr: IpAddr) -> usize {
        lock(&self.by_addr).get(&addr).copied().unwrap_or(0)
    }

    /// Descriptors charged to every address together.
    pub fn total(&self) -> usize {
        lock(&self.by_addr).values().sum()
    }
}

/// One session's account: what its streams and its ranged files hold.
#[derive(Debug, Default)]
pub struct SessionDescriptors {
    /// The receiver's budget and the sender's address; `None` counts without a cap (a
    /// receiver serving one connection it accepted itself).
    budget: Option<(Arc<DescriptorBudget>, IpAddr)>,
    held: Mutex<usize>,
}

impl SessionDescriptors {
    /// Charges `n` descriptors for `what` (said in the refusal), or says why not.
    pub fn take(self: &Arc<Self>, n: usize, what: &str) -> Result<Held, Refusal> {
        let mut held = lock(&self.held);
        if let Some((budget, addr)) = &self.budget {
            if *held + n > budget.per_session {
                return Err(busy(format!(
                    "{what}: this session holds {} descriptors at the receiver, its limit is {} (each connection is counted {PER_CONNECTION}, each file arriving by ranges 1, 2 with --resume, until its last range); finish some files first",
                    *held, budget.per_session
                )));
            }
            let mut by_addr = lock(&budget.by_addr);
            let of_addr = by_addr.entry(*addr).or_insert(0);
            if *of_addr + n > budget.per_addr {
                let now = *of_addr;
                if now == 0 {
                    by_addr.remove(addr);
                }
                return Err(busy(format!(
                    "{what}: the sessions of {addr} hold {now} descriptors at the receiver, its limit per address is {}; finish some files first",
                    budget.per_addr
                )));
            }
            *of_addr += n;
        }
        *held += n;
        Ok(Held {
            session: self.clone(),
            n,
        })
    }

    /// Descriptors charged to this session now.
    pub fn held(&self) -> usize {
        *lock(&self.held)
    }

    fn give_back(&self, n: usize) {
        let mut held = lock(&self.held);
        *held -= n;
        if let Some((budget, addr)) = &self.budget {
            let mut by_addr = lock(&budget.by_addr);
            if let Some(c) = by_addr.get_mut(addr) {
                *c -= n.min(*c);
                if *c == 0 {
                    by_addr.remove(addr);
                }
            }
        }
    }
}

fn busy(message: String) -> Refusal {
    Refusal {
        code: Code::Busy,
        message,
    }
}

/// Descriptors charged to a session (and its address) until dropped.
#[derive(Debug)]
pub struct Held {
    session: Arc<SessionDescriptors>,
    n: usize,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.session.give_back(self.n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_stop_at_either_cap_and_come_back_when_dropped() {
        let b = DescriptorBudget::new(10, 15);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let other: IpAddr = "192.0.2.2".parse().unwrap();
        let s1 = b.session(a);
        let s2 = b.session(a);
        let h1 = s1.take(8, "x").unwrap();
        let e = s1.take(3, "f").unwrap_err();
        assert_eq!(e.code, Code::Busy);
        assert!(e.message.contains("this session holds 8"), "{}", e.message);
        let h2 = s2.take(7, "y").unwrap();
        let e = s2.take(1, "g").unwrap_err();
        assert!(
            e.message.contains("limit per address is 15"),
            "{}",
            e.message
        );
        // Another address has its own count.
        let _h3 = b.session(other).take(10, "z").unwrap();
        assert_eq!((b.of_addr(a), b.total()), (15, 25));
        drop(h1);
        assert_eq!((s1.held(), b.of_addr(a)), (0, 7));
        let _h4 = s2.take(1, "g").unwrap();
        drop(h2);
        assert_eq!(b.of_addr(a), 1);
    }

    #[test]
    fn a_session_without_a_budget_counts_but_never_refuses() {
        let s = Arc::new(SessionDescriptors::default());
        let h = s.take(1 << 20, "x").unwrap();
        assert_eq!(s.held(), 1 << 20);
        drop(h);
        assert_eq!(s.held(), 0);
    }
}
