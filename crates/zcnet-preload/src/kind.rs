//! Which descriptors are TCP (or UDP) sockets, in a lock-free table, so a `write` to a file or
//! a pipe costs one atomic load.
//!
//! Learned from the calls the program makes — `socket` and `socketpair` name the kind
//! ([`of_socket`]), `accept` gives the listener's, `dup` the original's — so that the
//! library makes no system call the program would not have made. Only a descriptor this
//! library did not see made (inherited across `exec`, received over a Unix socket) is asked
//! of the kernel (`SO_TYPE`, `SO_DOMAIN`, `SO_PROTOCOL`, [`classify`]), and only when a send
//! large enough to go zero-copy would use it. OpenSSH's pre-authentication child runs
//! under a seccomp filter that kills it for a `getsockopt`.

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

/// What `socket(domain, ty, proto)` made.
pub fn of_socket(domain: i32, ty: i32, proto: i32) -> Kind {
    if !matches!(domain, libc::AF_INET | libc::AF_INET6) {
        return Kind::Other;
    }
    match (ty & 0xf, proto) {
        (libc::SOCK_STREAM, 0 | libc::IPPROTO_TCP) => Kind::Tcp,
        (libc::SOCK_DGRAM, 0 | libc::IPPROTO_UDP) => Kind::Udp,
        _ => Kind::Other,
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

    #[test]
    fn socket_arguments_name_the_kind_the_kernel_would() {
        use libc::*;
        assert_eq!(of_socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), Kind::Tcp);
        assert_eq!(of_socket(AF_INET6, SOCK_STREAM, IPPROTO_TCP), Kind::Tcp);
        assert_eq!(of_socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0), Kind::Udp);
        assert_eq!(of_socket(AF_INET, SOCK_STREAM, 262), Kind::Other, "MPTCP");
        assert_eq!(of_socket(AF_UNIX, SOCK_STREAM, 0), Kind::Other);
        assert_eq!(of_socket(AF_INET, SOCK_RAW, IPPROTO_TCP), Kind::Other);
        for (d, t, p) in [(AF_INET, SOCK_STREAM, 0), (AF_INET6, SOCK_DGRAM, 0)] {
            let fd = rustix::net::socket(
                rustix::net::AddressFamily::from_raw(d as u16),
                rustix::net::SocketType::from_raw(t as u32),
                None,
            )
            .unwrap();
            assert_eq!(classify(fd.as_raw_fd()), of_socket(d, t, p));
        }
    }
}
