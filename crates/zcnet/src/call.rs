//! One API call's bound in time, shared by every path the call goes through.
//!
//! A [`crate::Sender`] or [`crate::Receiver`] call (`send`, `send_slice`, `send_file`,
//! `recv`, `recv_into`, …) may cross several paths and many syscalls: the `cow` path sends a
//! head by copying, a middle zero-copy and a tail by copying; `send_file` falls back to
//! `pread` + `send`; the mmap receive polls between `TCP_ZEROCOPY_RECEIVE` calls. The
//! caller's timeout bounds the *call*, not each step, so the API entry starts one
//! [`Deadline`] ([`begin`]) and every wait below it reads the same one ([`deadline`]); a
//! thread-local is how it reaches paths whose trait methods take no clock, as
//! `stats::tx_handed_by_this_thread` reaches the count of bytes a call queued.
//!
//! How a path keeps to it:
//!
//! * `send`/`recv`-style syscalls pass `MSG_DONTWAIT` when the deadline is finite
//!   ([`Deadline::dontwait`]) and wait in [`Deadline::wait_fd`], a `poll` no longer than
//!   what is left. Without a timeout they block in the kernel, as `TcpStream` does.
//! * `sendfile`/`splice` take no such flag: before each of them the socket's own
//!   `SO_SNDTIMEO`/`SO_RCVTIMEO` is set to what is left ([`Deadline::arm_kernel`]).
//! * A socket the caller made non-blocking (`O_NONBLOCK`, read when a wait would start, so
//!   a caller may switch modes between calls) never waits: [`Error::WouldBlock`] with the
//!   bytes of the call queued so far.
//! * Running out is [`Error::Timeout`] saying how long the call really ran.

use crate::error::Error;
use std::cell::Cell;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};
use zcnet_sys::raw::socket::{self, PollFlags};

/// The bound the paths use for "no timeout": long enough never to end (a century), short
/// enough that `Instant::now() + FOREVER` cannot overflow.
pub(crate) const FOREVER: Duration = Duration::from_secs(100 * 365 * 86_400);

/// Longest single `poll` while waiting without a bound, so a wait notices a socket that
/// turned non-blocking or an error the poll does not report.
const UNBOUNDED_SLICE: Duration = Duration::from_millis(500);

/// When one call must end.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    start: Instant,
    /// `None`: the call may wait as long as it takes.
    limit: Option<Duration>,
}

thread_local! {
    static ACTIVE: Cell<Option<Deadline>> = const { Cell::new(None) };
}

/// The current call, ended when dropped (the outer call's deadline comes back).
#[must_use = "the call ends when this is dropped"]
pub(crate) struct Call {
    prev: Option<Deadline>,
}

impl Drop for Call {
    fn drop(&mut self) {
        ACTIVE.with(|a| a.set(self.prev));
    }
}

/// Starts an API call bounded by `timeout` ([`FOREVER`]: unbounded). A call inside another
/// (`io::Write::write` → `send_slice`) keeps the outer call's deadline.
pub(crate) fn begin(timeout: Duration) -> Call {
    let prev = ACTIVE.with(Cell::get);
    if prev.is_none() {
        ACTIVE.with(|a| a.set(Some(Deadline::new(timeout))));
    }
    Call { prev }
}

/// The running call's deadline, or one starting now bounded by `timeout` when a path runs
/// outside an API call (its own tests, the async crate).
pub(crate) fn deadline(timeout: Duration) -> Deadline {
    ACTIVE
        .with(Cell::get)
        .unwrap_or_else(|| Deadline::new(timeout))
}

/// Whether the caller made `fd` non-blocking.
pub(crate) fn nonblocking(fd: BorrowedFd<'_>) -> bool {
    zcnet_sys::raw::splice::status_flags(fd)
        .is_ok_and(|f| f.contains(zcnet_sys::raw::splice::OFlags::NONBLOCK))
}

impl Deadline {
    /// A deadline `timeout` from now ([`FOREVER`] or more: none).
    pub(crate) fn new(timeout: Duration) -> Deadline {
        Deadline {
            start: Instant::now(),
            limit: (timeout < FOREVER).then_some(timeout),
        }
    }

    /// Whether the call has a bound (then syscalls must not block on their own).
    pub(crate) fn dontwait(&self) -> bool {
        self.limit.is_some()
    }

    /// Time left; `None` when unbounded.
    pub(crate) fn remaining(&self) -> Option<Duration> {
        self.limit.map(|l| l.saturating_sub(self.start.elapsed()))
    }

    /// Whether the bound has passed.
    pub(crate) fn expired(&self) -> bool {
        self.remaining().is_some_and(|r| r.is_zero())
    }

    /// The next wait: at most `max`, and no longer than what is left.
    pub(crate) fn slice(&self, max: Duration) -> Duration {
        self.remaining().map_or(max, |r| r.min(max))
    }

    /// How long the call has run.
    pub(crate) fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// The call ran out: [`Error::Timeout`] with the time it really took.
    pub(crate) fn timed_out(&self, op: &'static str, queued: u64) -> Error {
        Error::Timeout {
            op,
            after: self.start.elapsed(),
            queued,
        }
    }

    /// The call cannot go on until `fd` is ready for `events`: [`Error::WouldBlock`] on a
    /// non-blocking socket, [`Error::Timeout`] once the bound has passed, else a `poll` of
    /// at most what is left, after which the caller tries again (`Ok`, ready or not).
    pub(crate) fn wait_fd(
        &self,
        fd: BorrowedFd<'_>,
        events: PollFlags,
        op: &'static str,
        queued: u64,
    ) -> Result<(), Error> {
        self.check(fd, op, queued)?;
        match socket::poll(fd, events, Some(self.slice(UNBOUNDED_SLICE))) {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => Ok(()),
            Err(e) => Err(Error::io("poll", e)),
        }
    }

    /// Before a wait: [`Error::WouldBlock`] on a non-blocking socket, [`Error::Timeout`]
    /// once the bound has passed.
    pub(crate) fn check(
        &self,
        fd: BorrowedFd<'_>,
        op: &'static str,
        queued: u64,
    ) -> Result<(), Error> {
        if nonblocking(fd) {
            return Err(Error::WouldBlock { op, queued });
        }
        if self.expired() {
            return Err(self.timed_out(op, queued));
        }
        Ok(())
    }

    /// Before a syscall that blocks in the kernel with no flag to stop it (`sendfile`,
    /// `splice`): sets the socket's `SO_SNDTIMEO` (`send`) or `SO_RCVTIMEO` to what is
    /// left, so the syscall returns `EAGAIN` by the deadline. Nothing without a bound. The
    /// option is the caller's socket's: the returned guard puts back the value it had when
    /// dropped, so the socket leaves the call as it came.
    pub(crate) fn arm_kernel<'fd>(
        &self,
        fd: BorrowedFd<'fd>,
        send: bool,
    ) -> Result<KernelTimeout<'fd>, Error> {
        let Some(left) = self.remaining() else {
            return Ok(KernelTimeout {
                fd,
                send,
                previous: None,
            });
        };
        // Zero would mean "no timeout" to the kernel.
        let left = Some(left.max(Duration::from_millis(1)));
        let s = socket2::SockRef::from(&fd);
        let (previous, set) = if send {
            (s.write_timeout(), s.set_write_timeout(left))
        } else {
            (s.read_timeout(), s.set_read_timeout(left))
        };
        let op = if send { "SO_SNDTIMEO" } else { "SO_RCVTIMEO" };
        let previous = previous.map_err(|e| Error::io(op, e))?;
        set.map_err(|e| Error::io(op, e))?;
        Ok(KernelTimeout {
            fd,
            send,
            previous: Some(previous),
        })
    }
}

/// The socket timeout [`Deadline::arm_kernel`] lowered, put back when dropped.
#[must_use = "dropping it at once puts the socket's timeout back before the syscall"]
pub(crate) struct KernelTimeout<'fd> {
    fd: BorrowedFd<'fd>,
    send: bool,
    /// The value before arming; `None` when nothing was changed.
    previous: Option<Option<Duration>>,
}

impl Drop for KernelTimeout<'_> {
    fn drop(&mut self) {
        let Some(previous) = self.previous else {
            return;
        };
        let s = socket2::SockRef::from(&self.fd);
        // Best effort: a socket that took the option a moment ago takes it back; there is
        // no caller left to tell if it does not.
        let _ = if self.send {
            s.set_write_timeout(previous)
        } else {
            s.set_read_timeout(previous)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inner_call_keeps_the_outer_deadline_and_gives_it_back() {
        assert!(ACTIVE.with(Cell::get).is_none());
        let outer = begin(Duration::from_millis(50));
        std::thread::sleep(Duration::from_millis(20));
        {
            let _inner = begin(Duration::from_secs(60));
            let d = deadline(FOREVER);
            assert!(d.remaining().unwrap() <= Duration::from_millis(30));
        }
        assert!(deadline(FOREVER).dontwait());
        drop(outer);
        assert!(!deadline(FOREVER).dontwait());
        assert!(deadline(FOREVER).remaining().is_none());
    }

    #[test]
    fn a_timeout_says_how_long_the_call_ran() {
        let d = Deadline::new(Duration::from_millis(10));
        std::thread::sleep(Duration::from_millis(30));
        assert!(d.expired());
        match d.timed_out("x", 7) {
            Error::Timeout { after, queued, .. } => {
                assert!(after >= Duration::from_millis(30), "{after:?}");
                assert_eq!(queued, 7);
            }
            e => panic!("{e}"),
        }
    }
}
