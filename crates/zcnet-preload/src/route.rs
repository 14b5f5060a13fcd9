//! The peers this process's sockets found copying: once one socket's completions demoted
//! it (every zero-copy byte COPIED at delivery — veth into another namespace, a bridge to a
//! container, any route the kernel delivers on this host), a new socket to the same peer
//! copies from its first send instead of paying the protections and the demotion again.
//! A server that takes a connection per request (python's http.server, a `curl` per file)
//! would otherwise protect each connection's first 4 MiB (or 64 notifications) anew.
//!
//! Kept per process, for its life: the route to a peer rarely changes while a program runs,
//! and a wrong "copies" costs only what `copy` costs — the mode every byte may take.

use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};

/// Peers remembered at most: a server facing many peers keeps the first ones.
pub const REMEMBERED_MAX: usize = 64;

/// A set of peer addresses, bounded.
#[derive(Debug, Default)]
pub struct Routes {
    copying: Vec<IpAddr>,
}

impl Routes {
    /// Records that sockets to `peer` are copied at delivery.
    pub fn copies(&mut self, peer: IpAddr) {
        let peer = peer.to_canonical();
        if !self.copying.contains(&peer) && self.copying.len() < REMEMBERED_MAX {
            self.copying.push(peer);
        }
    }

    /// Whether a socket to `peer` was found copying.
    pub fn copied(&self, peer: IpAddr) -> bool {
        self.copying.contains(&peer.to_canonical())
    }
}

static ROUTES: Mutex<Routes> = Mutex::new(Routes {
    copying: Vec::new(),
});

/// Records, for this process, that sockets to `peer` are copied at delivery.
pub fn remember_copies(peer: IpAddr) {
    ROUTES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .copies(peer);
}

/// Whether a socket of this process to `peer` was demoted for COPIED completions.
pub fn copies(peer: IpAddr) -> bool {
    ROUTES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .copied(peer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_found_copying_is_remembered_in_both_address_forms_and_others_are_not() {
        let mut r = Routes::default();
        let v4: IpAddr = "10.231.0.2".parse().unwrap();
        assert!(!r.copied(v4));
        r.copies(v4);
        assert!(r.copied(v4));
        assert!(r.copied("::ffff:10.231.0.2".parse().unwrap()));
        assert!(!r.copied("10.231.0.3".parse().unwrap()));
    }

    #[test]
    fn the_memory_is_bounded() {
        let mut r = Routes::default();
        for i in 0..(REMEMBERED_MAX as u32 + 10) {
            r.copies(IpAddr::from(i.to_be_bytes()));
        }
        assert_eq!(r.copying.len(), REMEMBERED_MAX);
        assert!(r.copied(IpAddr::from(0u32.to_be_bytes())));
    }
}
