//! Thin forwards to the socket syscalls the transmit and receive paths call per operation,
//! with the flags they need (`MSG_NOSIGNAL`, `MSG_DONTWAIT`, `MSG_ZEROCOPY`) and integer
//! socket options that `socket2` does not name. Nothing here retries or decides: `EINTR`,
//! `EAGAIN` and friends go back to the caller as `io::Error`s.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

pub use rustix::event::PollFlags;
pub use rustix::net::{RecvFlags, SendFlags};

/// `send(2)` with `flags`; `MSG_NOSIGNAL` is always added so a closed peer is an `EPIPE`
/// error, never a process-killing `SIGPIPE`.
pub fn send(fd: BorrowedFd<'_>, buf: &[u8], flags: SendFlags) -> io::Result<usize> {
    Ok(rustix::net::send(fd, buf, flags | SendFlags::NOSIGNAL)?)
}

/// `recv(2)` into `buf` with `flags`.
pub fn recv(fd: BorrowedFd<'_>, buf: &mut [u8], flags: RecvFlags) -> io::Result<usize> {
    Ok(rustix::net::recv(fd, buf, flags)?.0)
}

/// `poll(2)` on one fd; returns the `revents` (empty on timeout). `None` waits forever.
pub fn poll(
    fd: BorrowedFd<'_>,
    events: PollFlags,
    timeout: Option<Duration>,
) -> io::Result<PollFlags> {
    poll_all([(fd, events)], timeout).map(|[r]| r)
}

/// `poll(2)` on several fds at once; returns each one's `revents` (all empty on timeout).
/// `None` waits forever; a non-zero timeout shorter than a millisecond waits one millisecond
/// rather than spinning.
pub fn poll_all<const N: usize>(
    fds: [(BorrowedFd<'_>, PollFlags); N],
    timeout: Option<Duration>,
) -> io::Result<[PollFlags; N]> {
    let mut pfds = fds.map(|(fd, events)| rustix::event::PollFd::from_borrowed_fd(fd, events));
    let ts = timeout.map(|t| {
        let t = if !t.is_zero() && t < Duration::from_millis(1) {
            Duration::from_millis(1)
        } else {
            t
        };
        rustix::event::Timespec {
            tv_sec: t.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: i64::from(t.subsec_nanos()),
        }
    });
    rustix::event::poll(&mut pfds, ts.as_ref())?;
    Ok(pfds.map(|p| p.revents()))
}

/// An `ifreq` naming `ifname`, for the `SIOCGIF*` ioctls. A name no interface can have
/// (empty, too long, with a NUL) is `ENODEV`, as the kernel would answer.
fn ifreq(ifname: &str) -> io::Result<libc::ifreq> {
    let bytes = ifname.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(io::Error::from_raw_os_error(libc::ENODEV));
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value (empty name, zero union).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, &b) in req.ifr_name.iter_mut().zip(bytes) {
        *d = b as libc::c_char;
    }
    Ok(req)
}

fn ifreq_ioctl(fd: BorrowedFd<'_>, request: libc::Ioctl, req: &mut libc::ifreq) -> io::Result<()> {
    // SAFETY: `req` is a valid, NUL-terminated ifreq living across the call, which is what
    // the SIOCGIF* requests read and write; `fd` is an open socket.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), request, req as *mut libc::ifreq) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `SIOCGIFHWADDR`: the Ethernet address of `ifname`, on a socket of the calling thread's
/// namespace (unlike `/sys/class/net`, which shows the namespace sysfs was mounted in).
pub fn interface_mac(ifname: &str) -> io::Result<[u8; 6]> {
    let probe = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    let mut req = ifreq(ifname)?;
    ifreq_ioctl(
        std::os::fd::AsFd::as_fd(&probe),
        libc::SIOCGIFHWADDR,
        &mut req,
    )?;
    // SAFETY: SIOCGIFHWADDR filled the union's ifru_hwaddr member (a sockaddr).
    let sa = unsafe { req.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (m, &b) in mac.iter_mut().zip(&sa.sa_data[..6]) {
        *m = b as u8;
    }
    Ok(mac)
}

/// `setsockopt(level, name)` with an `int` value.
pub fn set_int(fd: BorrowedFd<'_>, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: we pass a pointer to a live i32 and its exact size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `getsockopt(level, name)` of an `int` value.
pub fn get_int(fd: BorrowedFd<'_>, level: i32, name: i32) -> io::Result<i32> {
    let mut value: i32 = 0;
    let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: value and len are live locals; the kernel writes at most `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut value as *mut i32).cast(),
            &mut len,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(value)
    }
}

/// Bytes in the socket's send queue not yet acknowledged (`SIOCOUTQ`).
pub fn outq(fd: BorrowedFd<'_>) -> io::Result<usize> {
    let mut v: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one int to the pointer we pass, which is a live local.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCOUTQ, &mut v) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(v.max(0) as usize)
    }
}

/// The subset of `struct tcp_info` zcnet reads.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpInfo {
    /// Connection state (`tcpi_state`: `TCP_ESTABLISHED` = 1, …, `TCP_CLOSE` = 7).
    pub state: u8,
    /// Negotiated options (`TCPI_OPT_TIMESTAMPS` = 1, …).
    pub options: u8,
    /// Current send MSS.
    pub snd_mss: u32,
    /// Current receive MSS estimate.
    pub rcv_mss: u32,
    /// Segments retransmitted over the connection's life (`tcpi_total_retrans`).
    pub total_retrans: u32,
    /// Congestion window, in segments (`tcpi_snd_cwnd`).
    pub snd_cwnd: u32,
    /// Smoothed round-trip time, µs (`tcpi_rtt`).
    pub rtt: u32,
    /// Round-trip time variance, µs (`tcpi_rttvar`).
    pub rttvar: u32,
    /// Path MTU (`tcpi_pmtu`).
    pub pmtu: u32,
}

/// `getsockopt(IPPROTO_TCP, TCP_INFO)`.
pub fn tcp_info(fd: BorrowedFd<'_>) -> io::Result<TcpInfo> {
    // SAFETY: tcp_info is plain old data; all-zero is a valid value.
    let mut ti: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: ti is a live local of `len` bytes; the kernel writes at most that many.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut ti as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(TcpInfo {
        state: ti.tcpi_state,
        options: ti.tcpi_options,
        snd_mss: ti.tcpi_snd_mss,
        rcv_mss: ti.tcpi_rcv_mss,
        total_retrans: ti.tcpi_total_retrans,
        snd_cwnd: ti.tcpi_snd_cwnd,
        rtt: ti.tcpi_rtt,
        rttvar: ti.tcpi_rttvar,
        pmtu: ti.tcpi_pmtu,
    })
}

/// `getrlimit(RLIMIT_MEMLOCK)`: (soft, hard), `None` meaning unlimited.
pub fn memlock_limit() -> io::Result<(Option<u64>, Option<u64>)> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: rl is a live local the kernel fills.
    let r = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let f = |v: libc::rlim_t| (v != libc::RLIM_INFINITY).then_some(v);
    Ok((f(rl.rlim_cur), f(rl.rlim_max)))
}

/// The effective user id (`geteuid(2)`).
pub fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and has no preconditions.
    unsafe { libc::geteuid() }
}

/// True when the effective uid is 0.
pub fn is_root() -> bool {
    euid() == 0
}

/// Name of the first interface with an address for which `wanted` is true, in the calling
/// thread's network namespace (`getifaddrs(3)`), `None` if there is none.
pub fn find_interface(wanted: impl Fn(std::net::IpAddr) -> bool) -> io::Result<Option<String>> {
    use std::net::IpAddr;
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills ifap with a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut ifap) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut name = None;
    let mut cur = ifap;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points at a sockaddr whose family says its type.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let this: Option<IpAddr> = match family {
            libc::AF_INET => {
                // SAFETY: family AF_INET means the sockaddr is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                Some(IpAddr::from(
                    u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                ))
            }
            libc::AF_INET6 => {
                // SAFETY: family AF_INET6 means the sockaddr is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                Some(IpAddr::from(sin6.sin6_addr.s6_addr))
            }
            _ => None,
        };
        if this.is_some_and(&wanted) {
            // SAFETY: ifa_name is a NUL-terminated C string owned by the list, still live.
            let cname = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
            name = Some(cname.to_string_lossy().into_owned());
            break;
        }
    }
    // SAFETY: ifap came from getifaddrs and is freed exactly once; no reference into it
    // survives (the name was copied).
    unsafe { libc::freeifaddrs(ifap) };
    Ok(name)
}

/// MTU of interface `name` (`SIOCGIFMTU` on a socket of the calling thread's namespace).
pub fn interface_mtu(name: &str) -> io::Result<u32> {
    let probe = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    let mut req = ifreq(name)?;
    ifreq_ioctl(std::os::fd::AsFd::as_fd(&probe), libc::SIOCGIFMTU, &mut req)?;
    // SAFETY: after a successful SIOCGIFMTU the union holds ifru_mtu.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    Ok(mtu.max(0) as u32)
}

/// MTU of the interface that owns `addr` in the calling thread's network namespace, `None`
/// if no interface has it. For the unspecified address the loopback interface is used.
pub fn mtu_for_addr(addr: std::net::IpAddr) -> io::Result<Option<u32>> {
    let name = find_interface(|a| {
        if addr.is_unspecified() {
            a.is_loopback()
        } else {
            a == addr
        }
    })?;
    name.map(|n| interface_mtu(&n)).transpose()
}
