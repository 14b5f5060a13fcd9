//! What this process's receive trials found, remembered so that the next connection on the
//! same route does not pay for it again: the candidates a trial dropped as clear losers
//! ([`super::trial`]: dearer than copy by more than a quarter in each of its first two
//! rounds), and the path trials in a row kept ([`Memory::verdict`]), each on a route and a
//! sender op size, for [`TTL`].
//!
//! Why: without a profile every connection runs a trial, and on loopback at 16 KiB the
//! mapping receiver, mapping nothing from a copying sender, ran 2.4× copy in its windows —
//! about 3–6 % of a 1-second transfer before it was dropped, on every connection
//! (`git show 758b630:docs/measurements/auto.md`). A server taking connection after connection from the same
//! peer learns that once. A loser is measured again once [`TTL`] has passed, as the kernel's
//! TCP metrics forget a route's figures.
//!
//! Keyed by both ends' addresses (not ports), the sender's bytes per send call, rounded
//! to a power of two, and the sender's transmit path: which receive path pays depends on
//! how the sender writes (over veth the mapping receiver was among the best at 16 KiB and no
//! loser at 256 KiB), and on loopback a copy sender's trial and a `uring` sender's drew
//! different verdicts on one candidate, so under one key each undid the other's drop and
//! nothing was ever confirmed. Op size and path come from the sender's card
//! ([`crate::peer_card`]), so only connections from a zcnet sender on this host are remembered.
//!
//! A drop is remembered only once confirmed: skipped after [`CONFIRM`] trials in a row on the
//! key dropped it, and forgotten as soon as a trial measures it to the end. Over veth at
//! 16 KiB one noisy trial once dropped the mapping receiver — the receive half of the
//! cheapest pair there — and with one drop enough the connections after it kept copy for
//! the rest of the sitting: `auto → auto` 15.8 % over `copy → mmap` (2026-11-28 14:35,
//! `git show 758b630:docs/measurements/auto.md`). On loopback at 16 KiB, where every trial drops both
//! candidates, the second connection confirms and the third skips them.
//!
//! A *verdict* — the path the trials on a key found cheapest — is taken without a trial once
//! [`CONFIRM`] trials have measured the key, and then stands for at most [`REUSES`]
//! connections before the next one measures again. It is not the last trial's pick but
//! its rule ([`super::trial::pick_from`]) over the paired rounds of the last trials pooled
//! ([`POOL_ROUNDS`] per candidate): one trial's four rounds are a noisy verdict — over veth
//! at 16 KiB eight trials in one sitting kept `mmap` four times, `uring` three times and
//! copy once, where the bench put `copy → mmap` 12 % under `copy → copy` and `uring →
//! uring` 2 % — and a dozen rounds say more than any four. The next trial's rounds join
//! the pool, so a verdict that went stale (which path wins changes from sitting to sitting)
//! is outvoted within a few trials. Why at all: a trial is a fixed 240 MiB per connection,
//! two thirds of it on candidates — over veth at 16 KiB about 40 % of a 1-second transfer —
//! so each connection that takes a verdict at once spends its bytes on the path the trials
//! found cheapest. A connection that takes one other than copy still has the run-time
//! check, on both ends' clocks, against copy.
//!
//! Off by default in the library ([`crate::ReceiverConfig::trial_memory`]: state shared by a
//! process's receivers is kept only when asked); the `zcnet` CLI turns it on
//! (`ZCNET_TRIAL_MEMORY=off` there turns it off), since drops must be confirmed: over veth at 16 KiB the confirmed memory skipped
//! `uring` (never the mapping receiver) in 9 of 15 connections per sender, and `auto →
//! auto` read 4.2 % over `copy → mmap` against 9.4 % and 14.0 % in the two sittings
//! without it that day (2026-11-28 18:39, `git show 758b630:docs/measurements/auto.md`).

use crate::path::RxPath;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a clear loser is skipped before a trial measures it again (and how long an
/// unconfirmed drop waits for its confirmation).
pub(crate) const TTL: Duration = Duration::from_secs(600);
/// Trials in a row on a key that must drop a candidate before the next ones skip it.
pub(crate) const CONFIRM: u32 = 2;
/// Connections that take a verdict at once before the next one measures again (once
/// [`CONFIRM`] trials have measured the key, three in four connections skip their trial).
pub(crate) const REUSES: u32 = 3;
/// Paired rounds per candidate a key's verdict is drawn from: the last three trials'.
pub(crate) const POOL_ROUNDS: usize = 12;
/// How much cheaper than copy, by the median of the pooled rounds, a candidate must be for
/// a verdict to take it: less than a trial's own margin ([`super::cost::MARGIN`]), as a
/// dozen paired rounds are firmer evidence than four, and a verdict that takes a path no
/// cheaper than copy costs the connection at most this much before the run-time check.
/// Over veth at 16 KiB single trials' medians for the mapping receiver spread 0.68–1.42
/// where the bench put `copy → mmap` 8–12 % under `copy → copy`: a 5 % bar on top of that
/// noise kept copy in pools whose rounds leaned `mmap`'s way.
pub(crate) const POOL_MARGIN: f64 = 0.02;
/// Remembered (route, size, path) entries at most, and verdicts at most; the oldest goes
/// first.
const CAPACITY: usize = 256;

/// A route, the sender's op size class and its transmit path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    sender: IpAddr,
    receiver: IpAddr,
    /// The sender's transmit path ([`crate::peer_card::path_code`]): on loopback a copy sender
    /// and a `uring` one drew different verdicts on the same receive candidate, and under
    /// one key each trial undid the other's drop, so no drop was ever confirmed.
    sender_path: u64,
    /// The sender's bytes per send call to the nearest power of two, as the bit length of
    /// 1.5 × it (16 KiB → 15: 10 923 … 21 845 bytes), so that a sender writing exactly a
    /// power of two sits in the middle of its class, not at an edge one short write crosses.
    size_class: u32,
}

impl Key {
    pub(crate) fn new(sender: IpAddr, receiver: IpAddr, op_size: u64, sender_path: u64) -> Self {
        Key {
            sender,
            receiver,
            sender_path,
            size_class: u64::BITS - op_size.saturating_add(op_size / 2).leading_zeros(),
        }
    }
}

/// One candidate dropped on one key: how many trials in a row dropped it, the last when.
#[derive(Debug, Clone, Copy)]
struct Dropped {
    key: Key,
    path: RxPath,
    drops: u32,
    at: Instant,
}

/// What the trials on one key measured: each candidate's last [`POOL_ROUNDS`] paired
/// ratios to copy, how many trials, how many connections have taken the verdict since the
/// last one, and when that was.
#[derive(Debug, Clone)]
struct Pool {
    key: Key,
    rounds: Vec<(RxPath, Vec<f64>)>,
    trials: u32,
    taken: u32,
    at: Instant,
}

/// A process's memory (one static instance; tests make their own).
#[derive(Debug, Default)]
pub(crate) struct Memory {
    losers: Mutex<Vec<Dropped>>,
    verdicts: Mutex<Vec<Pool>>,
}

static MEMORY: Memory = Memory {
    losers: Mutex::new(Vec::new()),
    verdicts: Mutex::new(Vec::new()),
};

/// This process's memory, for a receiver that asked for it (`asked`:
/// [`crate::ReceiverConfig::trial_memory`], off by default; no environment variable
/// overrides it — the `zcnet` CLI reads `ZCNET_TRIAL_MEMORY` itself).
pub(crate) fn global(asked: bool) -> Option<&'static Memory> {
    asked.then_some(&MEMORY)
}

/// Whether an entry last touched `at` is still remembered at `now` ([`TTL`]).
fn fresh(at: Instant, now: Instant) -> bool {
    now.saturating_duration_since(at) < TTL
}

/// Keeps the [`CAPACITY`] newest of `entries` (by `at`), the oldest going first.
fn keep_newest<T>(entries: &mut Vec<T>, at: impl Fn(&T) -> Instant) {
    if entries.len() > CAPACITY {
        entries.sort_by_key(|e| std::cmp::Reverse(at(e)));
        entries.truncate(CAPACITY);
    }
}

impl Memory {
    /// The candidates to skip on `key` at `now`: dropped by [`CONFIRM`] trials in a row.
    pub(crate) fn losers(&self, key: Key, now: Instant) -> Vec<RxPath> {
        let mut m = self.losers.lock().unwrap_or_else(|e| e.into_inner());
        m.retain(|d| fresh(d.at, now));
        m.iter()
            .filter(|d| d.key == key && d.drops >= CONFIRM)
            .map(|d| d.path)
            .collect()
    }

    /// A trial on `key` ended at `now`: of its `candidates`, it dropped `dropped` (clear
    /// losers) and measured the others to the end. A drop counts towards the confirmation
    /// (one more trial in a row); a candidate measured to the end is forgotten — the drop
    /// before it was noise.
    pub(crate) fn remember(
        &self,
        key: Key,
        candidates: &[RxPath],
        dropped: &[RxPath],
        now: Instant,
    ) {
        let mut m = self.losers.lock().unwrap_or_else(|e| e.into_inner());
        m.retain(|d| {
            fresh(d.at, now)
                && !(d.key == key && candidates.contains(&d.path) && !dropped.contains(&d.path))
        });
        for &path in dropped {
            match m.iter_mut().find(|d| d.key == key && d.path == path) {
                Some(d) => {
                    d.drops = d.drops.saturating_add(1);
                    d.at = now;
                }
                None => m.push(Dropped {
                    key,
                    path,
                    drops: 1,
                    at: now,
                }),
            }
        }
        keep_newest(&mut m, |d| d.at);
    }

    /// The path a connection on `key` takes at `now` without a trial, if any: once
    /// [`CONFIRM`] trials have measured the key, and fewer than [`REUSES`] connections took
    /// a verdict since the last (this one is counted), what [`super::trial::pick_from`]
    /// keeps over their pooled rounds with `margin`, among `here` — the candidates this
    /// receiver could set up. `None`: the connection runs its trial.
    pub(crate) fn verdict(
        &self,
        key: Key,
        here: &[RxPath],
        margin: f64,
        now: Instant,
    ) -> Option<RxPath> {
        let mut m = self.verdicts.lock().unwrap_or_else(|e| e.into_inner());
        m.retain(|v| fresh(v.at, now));
        let v = m.iter_mut().find(|v| v.key == key)?;
        if v.trials < CONFIRM || v.taken >= REUSES {
            return None;
        }
        v.taken += 1;
        let rounds: Vec<(RxPath, Vec<f64>)> = v
            .rounds
            .iter()
            .filter(|(p, _)| here.contains(p))
            .cloned()
            .collect();
        Some(super::trial::pick_from(&rounds, margin))
    }

    /// A trial on `key` ended at `now` with `rounds` — each candidate's paired ratios to
    /// copy ([`super::trial::Trial::rounds`]): pooled with the last trials' (each
    /// candidate's newest [`POOL_ROUNDS`] kept), and the connections taking the verdict
    /// counted from none again.
    pub(crate) fn remember_rounds(&self, key: Key, rounds: &[(RxPath, Vec<f64>)], now: Instant) {
        let mut m = self.verdicts.lock().unwrap_or_else(|e| e.into_inner());
        m.retain(|v| fresh(v.at, now));
        let i = match m.iter().position(|v| v.key == key) {
            Some(i) => i,
            None => {
                m.push(Pool {
                    key,
                    rounds: Vec::new(),
                    trials: 0,
                    taken: 0,
                    at: now,
                });
                m.len() - 1
            }
        };
        let v = &mut m[i];
        for (path, new) in rounds {
            let i = match v.rounds.iter().position(|(p, _)| p == path) {
                Some(i) => i,
                None => {
                    v.rounds.push((*path, Vec::new()));
                    v.rounds.len() - 1
                }
            };
            let pooled = &mut v.rounds[i].1;
            pooled.extend_from_slice(new);
            let extra = pooled.len().saturating_sub(POOL_ROUNDS);
            pooled.drain(..extra);
        }
        v.trials = v.trials.saturating_add(1);
        v.taken = 0;
        v.at = now;
        keep_newest(&mut m, |v| v.at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    const BOTH: [RxPath; 2] = [RxPath::Uring, RxPath::Mmap];
    const COPY: u64 = 1;
    const URING: u64 = 3;

    /// `CONFIRM` trials in a row on `key` that dropped `dropped`, at `at`.
    fn confirm(m: &Memory, key: Key, dropped: &[RxPath], at: Instant) {
        for _ in 0..CONFIRM {
            m.remember(key, &BOTH, dropped, at);
        }
    }

    #[test]
    fn losers_are_kept_per_route_and_size_class_until_they_expire() {
        let m = Memory::default();
        let t0 = Instant::now();
        let lo = Key::new(ip("127.0.0.1"), ip("127.0.0.1"), 16 << 10, COPY);
        confirm(&m, lo, &[RxPath::Mmap], t0);
        assert_eq!(m.losers(lo, t0), vec![RxPath::Mmap]);
        // 12, 16 and 20 KiB are one class (a power of two in the middle of its own); 256
        // KiB, 8 KiB, another route or another sender not.
        for kib in [12, 16, 20] {
            let k = Key::new(ip("127.0.0.1"), ip("127.0.0.1"), kib << 10, COPY);
            assert_eq!(m.losers(k, t0), vec![RxPath::Mmap], "{kib} KiB");
        }
        let lo8 = Key::new(ip("127.0.0.1"), ip("127.0.0.1"), 8 << 10, COPY);
        assert!(m.losers(lo8, t0).is_empty());
        let lo256 = Key::new(ip("127.0.0.1"), ip("127.0.0.1"), 256 << 10, COPY);
        assert!(m.losers(lo256, t0).is_empty());
        assert!(m
            .losers(
                Key::new(ip("10.0.0.1"), ip("127.0.0.1"), 16 << 10, COPY),
                t0
            )
            .is_empty());
        assert!(m
            .losers(
                Key::new(ip("127.0.0.1"), ip("10.0.0.2"), 16 << 10, COPY),
                t0
            )
            .is_empty());
        // Dropped again later: counted from then.
        let t1 = t0 + Duration::from_secs(300);
        confirm(&m, lo, &[RxPath::Mmap, RxPath::Uring], t1);
        assert_eq!(m.losers(lo, t1).len(), 2);
        assert_eq!(m.losers(lo, t1 + TTL - Duration::from_secs(1)).len(), 2);
        // Gone once the TTL has passed: the next trial measures them again.
        assert!(m.losers(lo, t1 + TTL).is_empty());
    }

    #[test]
    fn a_drop_is_skipped_only_once_confirmed_and_forgotten_when_measured_to_the_end() {
        let m = Memory::default();
        let t0 = Instant::now();
        let veth = Key::new(ip("10.0.0.1"), ip("10.0.0.2"), 16 << 10, COPY);
        // One noisy trial drops mmap: the next trial still measures it.
        m.remember(veth, &BOTH, &[RxPath::Mmap], t0);
        assert!(m.losers(veth, t0).is_empty());
        // That trial measures mmap to the end (drops nothing): the first drop is forgotten,
        // so a later single drop is again only one.
        m.remember(veth, &BOTH, &[], t0);
        m.remember(veth, &BOTH, &[RxPath::Mmap], t0);
        assert!(m.losers(veth, t0).is_empty(), "not two in a row");
        // A trial that did not measure mmap (it was not a candidate) says nothing of it.
        m.remember(veth, &[RxPath::Uring], &[], t0);
        m.remember(veth, &BOTH, &[RxPath::Mmap], t0);
        assert_eq!(m.losers(veth, t0), vec![RxPath::Mmap], "two in a row");
        // Confirmed, then measured to the end (after its TTL, say): forgotten at once.
        m.remember(veth, &BOTH, &[RxPath::Uring], t0);
        assert!(m.losers(veth, t0).is_empty());
        // An unconfirmed drop waits for its confirmation no longer than the TTL.
        let t1 = t0 + TTL;
        m.remember(veth, &BOTH, &[RxPath::Mmap], t1);
        assert_eq!(m.losers(veth, t1), vec![], "the old drop expired: one only");
    }

    #[test]
    fn the_memory_is_bounded_newest_kept() {
        let m = Memory::default();
        let t0 = Instant::now();
        for i in 0..(CAPACITY as u64 + 10) {
            let k = Key::new(ip("127.0.0.1"), ip("127.0.0.1"), 1 << (i % 40), COPY);
            let k = Key {
                size_class: i as u32,
                ..k
            };
            confirm(&m, k, &[RxPath::Mmap], t0 + Duration::from_millis(i));
        }
        let n = m.losers.lock().unwrap().len();
        assert_eq!(n, CAPACITY);
        let newest = Key {
            size_class: CAPACITY as u32 + 9,
            ..Key::new(ip("127.0.0.1"), ip("127.0.0.1"), 1, COPY)
        };
        assert_eq!(m.losers(newest, t0).len(), 1);
        let oldest = Key {
            size_class: 0,
            ..newest
        };
        assert!(m.losers(oldest, t0).is_empty());
    }

    #[test]
    fn a_verdict_is_drawn_from_the_pooled_rounds_of_the_last_trials() {
        let m = Memory::default();
        let t0 = Instant::now();
        let veth = Key::new(ip("10.0.0.1"), ip("10.0.0.2"), 16 << 10, COPY);
        let here = [RxPath::Mmap, RxPath::Uring];
        let v = |m: &Memory, here: &[RxPath]| m.verdict(veth, here, 0.05, t0);
        let trial = |uring: [f64; 4], mmap: [f64; 4]| {
            [
                (RxPath::Uring, uring.to_vec()),
                (RxPath::Mmap, mmap.to_vec()),
            ]
        };
        // Nothing measured yet, then one trial (whose own rounds put uring first): not
        // enough.
        assert_eq!(v(&m, &here), None);
        m.remember_rounds(
            veth,
            &trial([0.8, 0.85, 0.9, 0.8], [0.9, 0.88, 0.9, 0.92]),
            t0,
        );
        assert_eq!(v(&m, &here), None, "one trial");
        // A second trial in which uring is level with copy: pooled, mmap's 10 % holds and
        // uring's median is past the margin — mmap, where the first trial kept uring.
        m.remember_rounds(
            veth,
            &trial([1.0, 1.02, 0.99, 1.0], [0.89, 0.9, 0.93, 0.9]),
            t0,
        );
        for i in 0..REUSES {
            assert_eq!(v(&m, &here), Some(RxPath::Mmap), "connection {i}");
        }
        assert_eq!(v(&m, &here), None, "the next one measures again");
        // That trial finds both level with copy; the pool keeps twelve rounds per
        // candidate, so one such trial does not yet outvote the mmap rounds before...
        m.remember_rounds(veth, &trial([1.0; 4], [1.0; 4]), t0);
        assert_eq!(v(&m, &here), Some(RxPath::Mmap));
        assert_eq!(v(&m, &here), Some(RxPath::Mmap));
        assert_eq!(v(&m, &here), Some(RxPath::Mmap));
        m.remember_rounds(veth, &trial([1.0; 4], [1.0; 4]), t0);
        // ...and two do: the first trial's rounds have left the pool.
        assert_eq!(v(&m, &here), Some(RxPath::Copy));
        m.remember_rounds(veth, &trial([1.0; 4], [1.0; 4]), t0);
        assert_eq!(v(&m, &here), Some(RxPath::Copy));
        // A receiver that could set up only uring is given copy (uring is no cheaper);
        // another route, op size or sender path has no verdict; after the TTL it is gone.
        m.remember_rounds(veth, &trial([1.0; 4], [0.8; 4]), t0);
        assert_eq!(v(&m, &here), Some(RxPath::Copy), "one trial in three");
        m.remember_rounds(veth, &trial([1.0; 4], [0.8; 4]), t0);
        assert_eq!(v(&m, &here), Some(RxPath::Mmap), "two in three");
        assert_eq!(v(&m, &[RxPath::Uring]), Some(RxPath::Copy));
        let other = Key::new(ip("10.0.0.1"), ip("10.0.0.2"), 256 << 10, COPY);
        assert_eq!(m.verdict(other, &here, 0.05, t0), None);
        let uring = Key::new(ip("10.0.0.1"), ip("10.0.0.2"), 16 << 10, URING);
        assert_eq!(m.verdict(uring, &here, 0.05, t0), None);
        assert_eq!(m.verdict(veth, &here, 0.05, t0 + TTL), None, "expired");
    }

    /// Senders on different transmit paths keep separate memories on one route: a copy
    /// sender's confirmed loser is measured again for a `uring` sender, and trials
    /// alternating between the two no longer undo each other's drops — each sender's own
    /// two drops in a row confirm them.
    #[test]
    fn senders_on_different_paths_are_remembered_apart() {
        let m = Memory::default();
        let t0 = Instant::now();
        let copy = Key::new(ip("127.0.0.1"), ip("127.0.0.1"), 256 << 10, COPY);
        let uring = Key::new(ip("127.0.0.1"), ip("127.0.0.1"), 256 << 10, URING);
        assert_ne!(copy, uring);
        for _ in 0..CONFIRM {
            // The copy sender's trial drops the mapping receiver; the `uring` sender's
            // measures it to the end.
            m.remember(copy, &BOTH, &[RxPath::Mmap], t0);
            m.remember(uring, &BOTH, &[], t0);
        }
        assert_eq!(m.losers(copy, t0), vec![RxPath::Mmap]);
        assert!(m.losers(uring, t0).is_empty());
    }
}
