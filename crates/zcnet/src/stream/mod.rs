//! The application-facing API: [`Sender`], [`Listener`] and [`Receiver`]. They own the
//! socket and its options, pick the path per operation through the path modules, and never
//! make a syscall themselves beyond set-up.

mod listener;
mod receiver;
mod sender;

pub use listener::Listener;
pub use receiver::{Receiver, ReceiverConfig};
pub use sender::{Sender, SenderConfig};

use socket2::Socket;

/// The socket's local address, which names the interface whose profile `auto` uses
/// (unspecified — so loopback's — if the socket cannot say).
pub(crate) fn local_ip(sock: &Socket) -> std::net::IpAddr {
    sock.local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |a| a.ip())
}
