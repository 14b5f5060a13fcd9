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

pub(crate) use crate::call::FOREVER;

/// The configured timeout, or [`FOREVER`] where none was asked for.
pub(crate) fn bound(timeout: Option<std::time::Duration>) -> std::time::Duration {
    timeout.unwrap_or(FOREVER)
}

/// What `from_stream` checks and adopts: `sock` must be a TCP socket (IPv4 or IPv6) — a
/// Unix-domain stream or a datagram socket forced into a `TcpStream` is refused, since no
/// zero-copy path works on it and copying through it silently would hide that — and the
/// timeout is the configured one, else the socket's own `SO_SNDTIMEO` (`send`) or
/// `SO_RCVTIMEO`, which then bounds every call as the configured one would.
pub(crate) fn adopt(
    sock: &Socket,
    configured: Option<std::time::Duration>,
    send: bool,
) -> Result<Option<std::time::Duration>> {
    let int = |name, what| {
        socket::get_int(std::os::fd::AsFd::as_fd(sock), libc::SOL_SOCKET, name)
            .map_err(|e| Error::io(what, e))
    };
    let domain = int(libc::SO_DOMAIN, "getsockopt(SO_DOMAIN)")?;
    let ty = int(libc::SO_TYPE, "getsockopt(SO_TYPE)")?;
    let proto = int(libc::SO_PROTOCOL, "getsockopt(SO_PROTOCOL)")?;
    let family = match domain {
        libc::AF_INET | libc::AF_INET6 => None,
        libc::AF_UNIX => Some("a Unix-domain socket"),
        _ => Some("not an IPv4 or IPv6 socket"),
    };
    let kind = match ty {
        libc::SOCK_STREAM if proto == libc::IPPROTO_TCP || proto == 0 => None,
        libc::SOCK_STREAM => Some("a stream socket of a protocol other than TCP"),
        libc::SOCK_DGRAM => Some("a datagram socket"),
        _ => Some("not a stream socket"),
    };
    if let Some(what) = family.or(kind) {
        return Err(Error::UnsuitableSocket(format!(
            "from_stream takes a connected TCP socket; this is {what} \
             (use it through std's own type: zcnet's paths are TCP's)"
        )));
    }
    if configured.is_some() {
        return Ok(configured);
    }
    let own = if send {
        sock.write_timeout()
    } else {
        sock.read_timeout()
    };
    own.map_err(|e| Error::io("getsockopt(SO_SNDTIMEO/SO_RCVTIMEO)", e))
}
