//! A private `epoll(7)` instance watching one socket, so an async runtime can be told about
//! the socket through the instance's own descriptor while the caller reads the socket's
//! true event mask (`EPOLLIN`, `EPOLLOUT`, `EPOLLERR`, `EPOLLHUP` kept apart).
//!
//! Why: a `MSG_ZEROCOPY` completion raises `EPOLLERR` on its socket
//! (Documentation/networking/msg_zerocopy.rst, "Notification Reception"), and a reactor that
//! takes `EPOLLOUT|EPOLLERR` for "write side closed for good" (mio's `is_write_closed`,
//! which tokio's readiness never clears) then reports the socket writable forever. An epoll
//! instance is itself pollable (`EPOLLIN` while its ready list is non-empty), so nesting it
//! in the reactor keeps the reactor's wakeups and leaves the interpretation to the caller.

use rustix::event::epoll;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

pub use rustix::event::epoll::EventFlags;

/// `epoll_create1(EPOLL_CLOEXEC)`.
pub fn create() -> io::Result<OwnedFd> {
    Ok(epoll::create(epoll::CreateFlags::CLOEXEC)?)
}

/// `epoll_ctl(EPOLL_CTL_ADD)` of `fd` with `flags` (`EPOLLERR`/`EPOLLHUP` are always
/// reported, whether asked for or not).
pub fn add(ep: BorrowedFd<'_>, fd: BorrowedFd<'_>, flags: EventFlags) -> io::Result<()> {
    Ok(epoll::add(ep, fd, epoll::EventData::new_u64(0), flags)?)
}

/// `epoll_ctl(EPOLL_CTL_MOD)`: `fd` now watched for `flags`. The kernel checks the new mask
/// against the descriptor's readiness at once and queues an event if it matches, so a
/// caller that adds a bit after finding the descriptor not ready loses no edge.
pub fn modify(ep: BorrowedFd<'_>, fd: BorrowedFd<'_>, flags: EventFlags) -> io::Result<()> {
    Ok(epoll::modify(ep, fd, epoll::EventData::new_u64(0), flags)?)
}

/// `epoll_ctl(EPOLL_CTL_DEL)`: `fd` no longer watched, and no longer in its wait queues,
/// so its wakeups cost nothing on this instance's account.
pub fn delete(ep: BorrowedFd<'_>, fd: BorrowedFd<'_>) -> io::Result<()> {
    Ok(epoll::delete(ep, fd)?)
}

/// `epoll_wait` with a zero timeout: takes every pending event without waiting and returns
/// the union of their masks (empty when nothing was pending).
pub fn take_events(ep: BorrowedFd<'_>) -> io::Result<EventFlags> {
    // On the stack: called once per wake-up, so no allocation each time.
    let mut buf = [const { std::mem::MaybeUninit::<epoll::Event>::uninit() }; 4];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    loop {
        match epoll::wait(ep, &mut buf, Some(&zero)) {
            Ok((events, _)) => {
                return Ok(events
                    .iter()
                    .fold(EventFlags::empty(), |acc, e| acc | e.flags))
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn reports_the_true_mask_once_per_edge() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let ep = create().unwrap();
        add(
            ep.as_fd(),
            b.as_fd(),
            EventFlags::IN | EventFlags::OUT | EventFlags::ET,
        )
        .unwrap();
        let first = take_events(ep.as_fd()).unwrap();
        assert!(first.contains(EventFlags::OUT) && !first.contains(EventFlags::IN));
        assert!(
            take_events(ep.as_fd()).unwrap().is_empty(),
            "edge-triggered"
        );
        a.write_all(b"x").unwrap();
        assert!(take_events(ep.as_fd()).unwrap().contains(EventFlags::IN));
    }

    #[test]
    fn a_bit_added_by_modify_reports_the_readiness_already_there() {
        let (_a, b) = UnixStream::pair().unwrap();
        let ep = create().unwrap();
        add(ep.as_fd(), b.as_fd(), EventFlags::IN | EventFlags::ET).unwrap();
        assert!(take_events(ep.as_fd()).unwrap().is_empty(), "not watched");
        modify(
            ep.as_fd(),
            b.as_fd(),
            EventFlags::IN | EventFlags::OUT | EventFlags::ET,
        )
        .unwrap();
        assert!(take_events(ep.as_fd()).unwrap().contains(EventFlags::OUT));
        modify(ep.as_fd(), b.as_fd(), EventFlags::IN | EventFlags::ET).unwrap();
        assert!(take_events(ep.as_fd()).unwrap().is_empty());
    }
}
