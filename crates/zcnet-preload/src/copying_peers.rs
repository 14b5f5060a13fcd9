//! The peers this process's sockets found copying: once one socket's completions demoted
//! it (every zero-copy byte COPIED at delivery — veth into another namespace, a bridge to a
//! container, any route the kernel delivers on this host), a new socket to the same peer
//! copies from its first send instead of paying the protections and the demotion again.
//! A server that takes a connection per request (python's http.server, a `curl` per file)
//! would otherwise protect each connection's first 512 KiB (or 64 notifications) anew.
//!
//! Kept for the process's life, and for the later processes of this boot in the same
//! network namespace in `routes-copying.json` ([`crate::cache`]): a program started per
//! transfer (a server per test) would otherwise start the protection engine and its thread,
//! protect, take write faults and demote in every process. The route to a peer rarely
//! changes within a boot, and a wrong "copies" costs only what `copy` costs — the mode
//! every byte may take. Peers are keyed by network namespace: one address names different
//! hosts in two of them.

use crate::cache;
use crate::globals::config;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};

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

/// The cache file's name, in [`crate::cache::dir`].
pub const CACHE_FILE: &str = "routes-copying.json";

/// Peers the cache file holds at most (over all namespaces).
const CACHE_MAX: usize = 256;

/// The cache file's facts.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Known {
    copying: Vec<Entry>,
}

/// A peer found copying, from a network namespace (`/proc/self/ns/net`'s link text).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Entry {
    netns: String,
    peer: IpAddr,
}

/// The process's memory, filled from the cache file on first use.
struct State {
    routes: Routes,
    /// The cache file and this process's network namespace, once looked up (`None` inside:
    /// no file to use).
    file: Option<Option<(PathBuf, String)>>,
}

static ROUTES: Mutex<State> = Mutex::new(State {
    routes: Routes {
        copying: Vec::new(),
    },
    file: None,
});

fn state() -> MutexGuard<'static, State> {
    let mut g = ROUTES.lock().unwrap_or_else(PoisonError::into_inner);
    if g.file.is_none() {
        let file = config().cache_dir.as_ref().and_then(|d| {
            let ns = std::fs::read_link("/proc/self/ns/net").ok()?;
            Some((d.join(CACHE_FILE), ns.to_str()?.to_owned()))
        });
        if let Some((path, ns)) = &file {
            for e in cache::read::<Known>(path).unwrap_or_default().copying {
                if &e.netns == ns {
                    g.routes.copies(e.peer);
                }
            }
        }
        g.file = Some(file);
    }
    g
}

/// Records, for this process and the later ones of this boot in its network namespace,
/// that sockets to `peer` are copied at delivery.
pub fn remember_copies(peer: IpAddr) {
    let file = {
        let mut g = state();
        if g.routes.copied(peer) {
            return;
        }
        g.routes.copies(peer);
        g.file.clone().flatten()
    };
    if let Some((path, netns)) = file {
        // Read again: other processes may have added theirs since this one started.
        let mut known = cache::read::<Known>(&path).unwrap_or_default();
        let e = Entry {
            netns,
            peer: peer.to_canonical(),
        };
        if !known.copying.contains(&e) && known.copying.len() < CACHE_MAX {
            known.copying.push(e);
            let _ = cache::write(&path, &known);
        }
    }
}

/// Whether a socket to `peer` was demoted for COPIED completions, in this process or an
/// earlier one of this boot in its network namespace.
pub fn copies(peer: IpAddr) -> bool {
    state().routes.copied(peer)
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
