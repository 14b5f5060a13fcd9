//! Per-address bookkeeping for an exposed receiver. Pure code (time is passed in), so the
//! rules are tested without sockets or sleeps.
//!
//! * [`AuthLimiter`]: failed authentications per address in a sliding window; an address
//!   over the limit is refused before its handshake until the window moves on, which bounds
//!   how fast a token can be guessed from one address.
//! * [`AddrCount`]: connections per address still in their handshake, so one address cannot
//!   take every unauthenticated slot.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Most addresses remembered by an [`AuthLimiter`]; past it, expired entries are dropped and,
/// if none are, the oldest address is forgotten (bounded memory under address spraying).
const MAX_TRACKED: usize = 65_536;

/// Failed authentications per address in a sliding window.
#[derive(Debug)]
pub struct AuthLimiter {
    max: usize,
    window: Duration,
    failures: HashMap<IpAddr, VecDeque<Instant>>,
}

impl AuthLimiter {
    /// At most `max` failures per `window` per address.
    pub fn new(max: usize, window: Duration) -> Self {
        AuthLimiter {
            max,
            window,
            failures: HashMap::new(),
        }
    }

    fn expire(&mut self, addr: IpAddr, now: Instant) -> usize {
        let window = self.window;
        match self.failures.get_mut(&addr) {
            Some(q) => {
                while q.front().is_some_and(|t| now.duration_since(*t) >= window) {
                    q.pop_front();
                }
                let n = q.len();
                if n == 0 {
                    self.failures.remove(&addr);
                }
                n
            }
            None => 0,
        }
    }

    /// `Some(wait)` when `addr` must wait before it may try again.
    pub fn blocked(&mut self, addr: IpAddr, now: Instant) -> Option<Duration> {
        if self.max == 0 || self.expire(addr, now) < self.max {
            return None;
        }
        let oldest = *self.failures.get(&addr)?.front()?;
        Some(self.window.saturating_sub(now.duration_since(oldest)))
    }

    /// Records a failed authentication from `addr`.
    pub fn failed(&mut self, addr: IpAddr, now: Instant) {
        if self.failures.len() >= MAX_TRACKED && !self.failures.contains_key(&addr) {
            let window = self.window;
            self.failures
                .retain(|_, q| q.back().is_some_and(|t| now.duration_since(*t) < window));
            if self.failures.len() >= MAX_TRACKED {
                if let Some(k) = self
                    .failures
                    .iter()
                    .min_by_key(|(_, q)| q.back().copied())
                    .map(|(k, _)| *k)
                {
                    self.failures.remove(&k);
                }
            }
        }
        let q = self.failures.entry(addr).or_default();
        q.push_back(now);
        while q.len() > self.max.max(1) {
            q.pop_front();
        }
    }

    /// Addresses remembered.
    pub fn tracked(&self) -> usize {
        self.failures.len()
    }
}

/// A count per address (connections in their handshake).
#[derive(Debug, Default)]
pub struct AddrCount {
    counts: HashMap<IpAddr, usize>,
}

impl AddrCount {
    /// Connections of `addr` counted now.
    pub fn get(&self, addr: IpAddr) -> usize {
        self.counts.get(&addr).copied().unwrap_or(0)
    }

    /// One more for `addr`.
    pub fn add(&mut self, addr: IpAddr) {
        *self.counts.entry(addr).or_insert(0) += 1;
    }

    /// One fewer for `addr`.
    pub fn remove(&mut self, addr: IpAddr) {
        if let Some(n) = self.counts.get_mut(&addr) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(&addr);
            }
        }
    }

    /// Addresses with at least one connection.
    pub fn addresses(&self) -> usize {
        self.counts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_block_an_address_until_the_window_moves_on() {
        let t0 = Instant::now();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let mut l = AuthLimiter::new(3, Duration::from_secs(60));
        for i in 0..3 {
            assert_eq!(l.blocked(a, t0), None, "attempt {i}");
            l.failed(a, t0 + Duration::from_secs(i));
        }
        let wait = l.blocked(a, t0 + Duration::from_secs(10)).unwrap();
        assert_eq!(wait, Duration::from_secs(50));
        assert_eq!(l.blocked(b, t0), None, "other addresses are not affected");
        // The first failure leaves the window: one more attempt is allowed.
        assert_eq!(l.blocked(a, t0 + Duration::from_secs(60)), None);
        l.failed(a, t0 + Duration::from_secs(60));
        assert!(l.blocked(a, t0 + Duration::from_secs(60)).is_some());
        assert!(l.blocked(a, t0 + Duration::from_secs(200)).is_none());
        assert_eq!(l.tracked(), 0, "expired addresses are forgotten");
    }

    #[test]
    fn sprayed_addresses_stay_bounded() {
        let t0 = Instant::now();
        let mut l = AuthLimiter::new(2, Duration::from_secs(60));
        for i in 0..(MAX_TRACKED as u32 + 100) {
            l.failed(IpAddr::from(i.to_be_bytes()), t0);
        }
        assert!(l.tracked() <= MAX_TRACKED);
    }

    #[test]
    fn counts_per_address_go_up_and_down() {
        let a: IpAddr = "::1".parse().unwrap();
        let mut c = AddrCount::default();
        c.add(a);
        c.add(a);
        assert_eq!(c.get(a), 2);
        c.remove(a);
        c.remove(a);
        c.remove(a);
        assert_eq!((c.get(a), c.addresses()), (0, 0));
    }
}
