//! The application-facing API: [`Sender`], [`Listener`] and [`Receiver`]. They own the
//! socket and its options, pick the path per operation through the path modules, and never
//! make a syscall themselves beyond set-up.

mod listener;
mod receiver;
mod sender;

pub use listener::Listener;
pub use receiver::{Receiver, ReceiverConfig};
pub use sender::{Sender, SenderConfig};

use crate::error::{Error, Result};
use crate::path::RxPath;
use crate::policy::page_multiple_mss;
use socket2::Socket;
use zcnet_sys::mem::page_size;
use zcnet_sys::raw::socket;

/// The socket's local address, which names the interface whose profile `auto` uses
/// (unspecified — so loopback's — if the socket cannot say).
pub(crate) fn local_ip(sock: &Socket) -> std::net::IpAddr {
    sock.local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |a| a.ip())
}

fn tcp_timestamps_enabled() -> bool {
    // /proc/sys/net resolves to the calling thread's network namespace.
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_timestamps")
        .map(|s| s.trim() != "0")
        .unwrap_or(true)
}

/// For the mmap path with `page_multiple_mss`: sets `TCP_MAXSEG` on a socket not yet
/// connected (or listening) to the page-multiple MSS of the MTU of the interface holding
/// `ip`, so payloads land in whole pages. The MSS is advertised in the handshake and cannot
/// change later. Returns the MSS set, if any (none when no local interface holds `ip`).
pub(crate) fn set_page_multiple_mss(
    sock: &Socket,
    ip: std::net::IpAddr,
    cfg: &ReceiverConfig,
) -> Result<Option<u32>> {
    if cfg.path != RxPath::Mmap || !cfg.page_multiple_mss {
        return Ok(None);
    }
    let Ok(Some(mtu)) = socket::mtu_for_addr(ip) else {
        return Ok(None);
    };
    let mss = page_multiple_mss(
        mtu,
        ip.is_ipv6(),
        tcp_timestamps_enabled(),
        page_size() as u32,
    );
    if let Some(m) = mss {
        sock.set_tcp_mss(m)
            .map_err(|e| Error::io("setsockopt(TCP_MAXSEG)", e))?;
    }
    Ok(mss)
}

/// The local address the kernel would use to reach `peer` (a connected UDP probe socket
/// sends nothing), so `auto` can look up the profile of the interface a client's
/// connection will use before it connects. Unspecified when the route cannot be told.
pub(crate) fn local_route_ip(peer: std::net::SocketAddr) -> std::net::IpAddr {
    let unspecified: std::net::IpAddr = match peer {
        std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
        std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
    };
    std::net::UdpSocket::bind(std::net::SocketAddr::new(unspecified, 0))
        .and_then(|s| s.connect(peer).and_then(|()| s.local_addr()))
        .map_or(unspecified, |a| a.ip())
}

/// The bound the paths use for "no timeout": long enough never to end (a century), short
/// enough that `Instant::now() + FOREVER` cannot overflow.
pub(crate) const FOREVER: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 86_400);

/// The configured timeout, or [`FOREVER`] where none was asked for.
pub(crate) fn bound(timeout: Option<std::time::Duration>) -> std::time::Duration {
    timeout.unwrap_or(FOREVER)
}
