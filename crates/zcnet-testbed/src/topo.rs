//! Where a test's two ends run: both on loopback, or one in each namespace of a [`VethPair`].
//!
//! Tests are written once against a [`Topo`] and run on both: the receiving side binds in
//! namespace `b` (or on 127.0.0.1), the sending side connects from namespace `a`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use crate::netns::{self, VethPair};

/// Where a transfer runs.
#[derive(Debug, Clone, Copy)]
pub enum Topo<'a> {
    /// Both ends on 127.0.0.1 in the caller's namespace.
    Loopback,
    /// The receiver in namespace `b`, the sender in namespace `a`.
    Netns(&'a VethPair),
}

impl Topo<'_> {
    /// The receiving side's address with `port` (0: any).
    pub fn receiver_addr(self, port: u16) -> SocketAddr {
        match self {
            Topo::Loopback => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
            Topo::Netns(p) => SocketAddr::new(IpAddr::V4(p.addr_b()), port),
        }
    }

    /// Runs `f` on the receiving side: here for loopback, on a thread inside namespace `b`
    /// otherwise, so the sockets `f` creates belong there.
    pub fn on_receiver<R: Send>(self, f: impl FnOnce() -> R + Send) -> R {
        match self {
            Topo::Loopback => f(),
            Topo::Netns(p) => p.run_in_b(f).expect("entering namespace b"),
        }
    }

    /// Runs `f` on the sending side (namespace `a`).
    pub fn on_sender<R: Send>(self, f: impl FnOnce() -> R + Send) -> R {
        match self {
            Topo::Loopback => f(),
            Topo::Netns(p) => p.run_in_a(f).expect("entering namespace a"),
        }
    }
}

/// A veth pair with `mtu`, for a test marked
/// `#[cfg_attr(not(zcnet_netns), ignore = "needs root and iproute2 (network namespaces)")]`:
/// its build found root and `ip`, so a pair that cannot be made here is a failure, with why
/// ([`netns::available`]), never a pass that ran nothing.
pub fn veth_pair(mtu: u32) -> VethPair {
    if let Err(why) = netns::available() {
        panic!("network namespaces unavailable, though the build found root and `ip`: {why}");
    }
    VethPair::create(mtu).expect("creating a veth pair")
}
