//! `setns(2)` for network namespaces: the one syscall [`crate::netns`] cannot do through
//! `std`.
//!
//! Only the network namespace is switched, and only for the calling thread: a thread's
//! namespaces live in its own `nsproxy`, so other threads of the process are unaffected.
//! Unlike the mount namespace, a network namespace may be joined by one thread of a
//! multithreaded process (`setns(2)`, "EINVAL ... CLONE_NEWNS ... multithreaded" applies to
//! mount and user namespaces only).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Moves the calling thread into the network namespace that `fd` refers to.
///
/// `fd` is a namespace handle: a bind-mounted `/var/run/netns/<name>` (what `ip netns add`
/// creates), a `/proc/<pid>/ns/net` file, or a pidfd. Sockets the thread creates afterwards
/// belong to that namespace for their whole life, wherever they are used from later.
///
/// Requires `CAP_SYS_ADMIN` in both the caller's and the target's user namespace. Errors:
/// `EINVAL` if `fd` is not a network namespace, `EPERM` without the capability. See
/// [`setns(2)`](https://man7.org/linux/man-pages/man2/setns.2.html).
pub fn setns_net(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: `setns` takes two integers and touches no memory of ours. `fd` is a
    // `BorrowedFd`, so the descriptor is open for the whole call; the kernel checks that it
    // names a network namespace (EINVAL otherwise) because we pass CLONE_NEWNET rather than 0.
    // The only effect is on the calling thread's network namespace, which Rust's std does not
    // cache anywhere, so no invariant of safe code can be broken by it.
    let rc = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}
