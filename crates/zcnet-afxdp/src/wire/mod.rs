//! The bytes on the wire, pure code tested without sockets: what a peer must write to be
//! understood, and what a receiver checks before it trusts a frame.
//!
//! * [`udp`]: the Ethernet II / IPv4 / UDP headers an XSK reads and writes itself, since it
//!   sees whole frames.
//! * [`lm`]: the Lightweight Messages header inside each UDP payload, and how a message is
//!   cut into fragments.

pub mod lm;
pub mod udp;
