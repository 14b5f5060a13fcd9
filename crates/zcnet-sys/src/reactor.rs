//! Registering an owned descriptor with tokio's reactor (feature `tokio`).
//!
//! tokio's `AsyncFd::register_with_interest` is `unsafe` because a generic `T: AsRawFd`
//! might return a different or closed descriptor later (tokio pull request 8587, "I/O
//! safety"). An [`OwnedFd`] cannot: it owns exactly one open descriptor until dropped, and
//! the `AsyncFd` owns it. The condition holds by construction, so the wrapper is safe.

use std::io;
use std::os::fd::OwnedFd;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// `AsyncFd::register_with_interest` for an owned descriptor. Must be called inside a
/// tokio runtime with I/O enabled.
pub fn register_owned(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: `fd` is an open descriptor owned by the `AsyncFd` for its whole life; an
    // `OwnedFd`'s `as_raw_fd` always returns that same descriptor and nothing else can
    // close it while it is owned.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(io::Error::from)
}
