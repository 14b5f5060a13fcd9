//! Which descriptors are TCP (or UDP) sockets: asked once per descriptor (`SO_TYPE`, `SO_DOMAIN`,
//! `SO_PROTOCOL`) and cached in a lock-free table, so a `write` to a file or a pipe costs one
//! atomic load. The cache is forgotten for a descriptor number whenever this library sees
//! it closed or handed out again (`close`, `dup*`, `socket`, `accept`).

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use zcnet_sys::preload::real::with_fd;
use zcnet_sys::raw::socket::get_int;

/// What a descriptor is, as far as this library cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Not asked yet.
    Unknown,
    /// Anything but a TCP socket: never touched.
    Other,
    /// A TCP socket (IPv4 or IPv6).
    Tcp,
    /// A UDP socket (IPv4 or IPv6): only its `sendmmsg` is looked at.
    Udp,
    /// A UDP socket whose kernel or route refused a GSO send: `sendmmsg` goes as it is.
    UdpNoGso,
}

const SLOTS: usize = 1 << 16;
static KINDS: [AtomicU8; SLOTS] = [const { AtomicU8::new(0) }; SLOTS];

/// The cached kind (descriptors beyond the table are always `Unknown`).
pub fn cached(fd: i32) -> Kind {
    match usize::try_from(fd)
        .ok()
        .and_then(|i| KINDS.get(i))
        .map(|k| k.load(Relaxed))
    {
        Some(1) => Kind::Other,
        Some(2) => Kind::Tcp,
        Some(3) => Kind::Udp,
        Some(4) => Kind::UdpNoGso,
        _ => Kind::Unknown,
    }
}

/// Caches `kind` for `fd`.
pub fn remember(fd: i32, kind: Kind) {
    if let Some(k) = usize::try_from(fd).ok().and_then(|i| KINDS.get(i)) {
        k.store(
            match kind {
                Kind::Unknown => 0,
                Kind::Other => 1,
                Kind::Tcp => 2,
                Kind::Udp => 3,
                Kind::UdpNoGso => 4,
            },
            Relaxed,
        );
    }
}

/// Asks the kernel what `fd` is.
pub fn classify(fd: i32) -> Kind {
    let ask = |name| with_fd(fd, |b| get_int(b, libc::SOL_SOCKET, name).ok()).flatten();
    let ty = ask(libc::SO_TYPE);
    if !(ty == Some(libc::SOCK_STREAM) || ty == Some(libc::SOCK_DGRAM))
        || !matches!(ask(libc::SO_DOMAIN), Some(libc::AF_INET | libc::AF_INET6))
    {
        return Kind::Other;
    }
    match (ty, ask(libc::SO_PROTOCOL)) {
        (Some(libc::SOCK_STREAM), Some(libc::IPPROTO_TCP)) => Kind::Tcp,
        (Some(libc::SOCK_DGRAM), Some(libc::IPPROTO_UDP)) => Kind::Udp,
        _ => Kind::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn tcp_sockets_are_told_from_udp_pipes_and_unix_sockets() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let f = tempfile::tempfile().unwrap();
        assert_eq!(classify(c.as_raw_fd()), Kind::Tcp);
        assert_eq!(classify(l.as_raw_fd()), Kind::Tcp);
        assert_eq!(classify(u.as_raw_fd()), Kind::Udp);
        assert_eq!(classify(a.as_raw_fd()), Kind::Other);
        assert_eq!(classify(f.as_raw_fd()), Kind::Other);
        remember(c.as_raw_fd(), Kind::Tcp);
        assert_eq!(cached(c.as_raw_fd()), Kind::Tcp);
        remember(c.as_raw_fd(), Kind::UdpNoGso);
        assert_eq!(cached(c.as_raw_fd()), Kind::UdpNoGso);
        remember(c.as_raw_fd(), Kind::Unknown);
        assert_eq!(cached(c.as_raw_fd()), Kind::Unknown);
        assert_eq!(cached(-1), Kind::Unknown);
    }
}
