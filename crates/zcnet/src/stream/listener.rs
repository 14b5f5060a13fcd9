//! [`Listener`]: accepts [`Receiver`]s set up from one [`ReceiverConfig`].

use super::receiver::{Receiver, ReceiverConfig};
use super::set_page_multiple_mss;
use crate::auto::rx_choice::AutoRxChoice;
use crate::error::{Error, Result};
use crate::path::RxPath;
use socket2::{Domain, SockAddr, Socket, Type};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use zcnet_sys::raw::socket;

/// A listening socket that accepts [`Receiver`]s.
#[derive(Debug)]
pub struct Listener {
    sock: Socket,
    cfg: ReceiverConfig,
    mss: Option<u32>,
    auto: Option<AutoRxChoice>,
}

impl Listener {
    /// Binds and listens on `addr`. For the mmap path with `page_multiple_mss`, sets
    /// `TCP_MAXSEG` to the page-multiple MSS of the bound interface's MTU first (the MSS is
    /// advertised in the handshake, so it cannot be changed later).
    pub fn bind(addr: SocketAddr, cfg: &ReceiverConfig) -> Result<Listener> {
        // `auto` decides now: the mapping path's MSS must be set before listen.
        let auto = (cfg.path == RxPath::Auto).then(|| {
            let loaded = crate::profile::load::load(&cfg.profile, addr.ip());
            crate::auto::rx_choice::choose(&cfg.profile, loaded, cfg.touch, cfg.op_size)
        });
        let cfg = &match &auto {
            Some(a) => ReceiverConfig {
                path: a.path,
                // The page-multiple MSS buys mapping; where the profile measured `mmap`
                // mapping nothing at this size it buys nothing, and its smaller segments
                // cost the sender (and copy, should the cost check fall back to it).
                page_multiple_mss: cfg.page_multiple_mss && a.expect_mapping,
                ..cfg.clone()
            },
            None => cfg.clone(),
        };
        let sock = Socket::new(Domain::for_address(addr), Type::STREAM, None)
            .map_err(|e| Error::io("socket", e))?;
        sock.set_reuse_address(true)
            .map_err(|e| Error::io("setsockopt(SO_REUSEADDR)", e))?;
        if let Some(n) = cfg.rcvbuf {
            sock.set_recv_buffer_size(n)
                .map_err(|e| Error::io("setsockopt(SO_RCVBUF)", e))?;
        }
        let mss = set_page_multiple_mss(&sock, addr.ip(), cfg)?;
        sock.bind(&SockAddr::from(addr))
            .map_err(|e| Error::io("bind", e))?;
        sock.listen(128).map_err(|e| Error::io("listen", e))?;
        Ok(Listener {
            sock,
            cfg: cfg.clone(),
            mss,
            auto,
        })
    }

    /// The bound address (with the port the kernel chose for port 0).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.sock
            .local_addr()
            .map_err(|e| Error::io("getsockname", e))?
            .as_socket()
            .ok_or_else(|| Error::io("getsockname", std::io::Error::other("not an IP address")))
    }

    /// The MSS advertised for the mmap path, if one was set.
    pub fn mss(&self) -> Option<u32> {
        self.mss
    }

    /// Accepts one connection (bounded by the configured timeout).
    pub fn accept(&self) -> Result<Receiver> {
        let d = crate::call::Deadline::new(super::bound(self.cfg.timeout));
        let ev = loop {
            match socket::poll(
                self.sock.as_fd(),
                zcnet_sys::raw::socket::PollFlags::IN,
                d.remaining(),
            ) {
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                r => break r.map_err(|e| Error::io("poll (accept)", e))?,
            }
        };
        if ev.is_empty() {
            return Err(d.timed_out("accept", 0));
        }
        let (sock, _) = loop {
            match self.sock.accept() {
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                r => break r.map_err(|e| Error::io("accept", e))?,
            }
        };
        Receiver::setup(sock, &self.cfg, self.auto.clone())
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

impl AsRawFd for Listener {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}
