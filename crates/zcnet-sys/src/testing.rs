//! Safe, owning handles on the raw memory and process operations that the copy-on-write
//! tests need (`tests/cow.rs`, `tests/cow_mprotect.rs`), so that those tests contain no
//! `unsafe` of their own.
//!
//! The `cow` transmit path has to behave when the application does unusual things to memory
//! that is still in flight: unmaps it, moves it with `mremap(2)`, sends from shared or
//! file-backed memory, `fork(2)`s, or writes read-only memory that is not ours. Tests provoke
//! each of those; this module gives them the means without handing out dangling slices:
//! a [`Mapping`] owns its pages, slices borrow the `Mapping`, and every operation that
//! unmaps or moves the pages consumes it.
//!
//! Not part of the supported API (hence `#[doc(hidden)]` on the module), but every function
//! here is sound for any caller, as everywhere in `sys`.

use std::ffi::c_void;
use std::io::{self, Write as _};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::ptr::NonNull;
use std::time::Duration;

use crate::mem::round_to_pages;

/// An owned memory mapping (`mmap(2)`), unmapped on drop or by [`Mapping::unmap`].
///
/// Unlike [`crate::mem::PageBuf`] (always private, anonymous, pre-faulted and read-write),
/// the kind of memory is chosen by the constructor, because what the tests check is exactly
/// how the engine treats each kind (see `zcnet::cow`: only private anonymous memory is
/// protected; shared and file-backed memory is copied and counted as unprotectable).
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
}

// SAFETY: a Mapping uniquely owns its pages, like a Box<[u8]>; slices are only handed out
// through borrows of the Mapping, so sending or sharing it across threads is as safe as for
// Box<[u8]>. (Shared anonymous memory is reachable by another process only after a fork;
// see `fork_and_run` for why that cannot race with a borrow.)
unsafe impl Send for Mapping {}
// SAFETY: see Send; `&Mapping` only hands out shared slices.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// `len` bytes (rounded up to whole pages) of zero-filled private anonymous memory,
    /// read-write, not pre-faulted (`MAP_PRIVATE|MAP_ANONYMOUS`) — what `malloc` uses for
    /// large allocations.
    pub fn anon_private(len: usize) -> io::Result<Mapping> {
        Self::anon(len, libc::MAP_PRIVATE, true)
    }

    /// `len` bytes (rounded up to whole pages) of zero-filled *shared* anonymous memory
    /// (`MAP_SHARED|MAP_ANONYMOUS`, shmem-backed), read-write.
    pub fn anon_shared(len: usize) -> io::Result<Mapping> {
        Self::anon(len, libc::MAP_SHARED, true)
    }

    /// `len` bytes (rounded up to whole pages) of zero-filled private anonymous memory that
    /// is *read-only* (`PROT_READ`): [`Mapping::write_volatile`] on it raises `SIGSEGV`.
    pub fn anon_private_readonly(len: usize) -> io::Result<Mapping> {
        Self::anon(len, libc::MAP_PRIVATE, false)
    }

    fn anon(len: usize, share: libc::c_int, writable: bool) -> io::Result<Mapping> {
        let len = round_to_pages(len);
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: an anonymous mapping with a null hint replaces nothing and has no
        // preconditions; the result is checked against MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                share | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        Self::from_mmap(p, len, writable)
    }

    /// A private, read-only mapping (`MAP_PRIVATE`, `PROT_READ`) of a regular file holding
    /// a copy of `contents`, padded with zeros to whole pages.
    ///
    /// The file is created unnamed (`O_TMPFILE` in [`std::env::temp_dir`]) and its
    /// descriptor closed once mapped, so no other process or handle can truncate it (which
    /// would turn reads into `SIGBUS`) or change the bytes behind the slices this mapping
    /// hands out. That is why this takes the contents rather than a caller's `&File`: a
    /// mapping of a file others can write cannot safely be viewed as `&[u8]`.
    pub fn file_copy(contents: &[u8]) -> io::Result<Mapping> {
        Self::file(contents, false)
    }

    /// [`Mapping::file_copy`], writable: a write gives the writing page a private anonymous
    /// copy (copy-on-write of a `MAP_PRIVATE` file page), as a program that fills a buffer it
    /// mapped from a temporary file does (iperf3's send buffer). The file never changes.
    pub fn file_copy_writable(contents: &[u8]) -> io::Result<Mapping> {
        Self::file(contents, true)
    }

    fn file(contents: &[u8], writable: bool) -> io::Result<Mapping> {
        let len = round_to_pages(contents.len());
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_TMPFILE)
            .open(std::env::temp_dir())?;
        file.write_all(contents)?;
        file.set_len(len as u64)?;
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a private mapping of a file only we hold, with a null hint (it replaces
        // nothing); the result is checked against MAP_FAILED before use. The mapping keeps
        // its own reference to the file after `file` is closed. Being private, writes to it
        // never reach the file.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        Self::from_mmap(p, len, writable)
    }

    fn from_mmap(p: *mut c_void, len: usize, writable: bool) -> io::Result<Mapping> {
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Mapping { ptr, len, writable })
    }

    /// Length in bytes (a whole number of pages).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a mapping has at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether [`Mapping::as_mut_slice`] may be used.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// The whole mapping.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is a live, readable mapping owned by self (every constructor
        // maps at least PROT_READ, and nothing here changes protections), initialised (zero
        // fill or file contents), unaliased by any `&mut` while `&self` is borrowed, and not
        // modified behind our back (anonymous memory is ours; the file of `file_copy` has no
        // other handle).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole mapping, writable.
    ///
    /// # Panics
    /// If the mapping is read-only (a mutable slice of read-only pages would fault on
    /// every write; use [`Mapping::write_volatile`] to provoke that on purpose).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        assert!(self.writable, "as_mut_slice on a read-only mapping");
        // SAFETY: as in as_slice, the pages are also writable (checked above), and
        // `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Writes `value` at `offset` with a volatile store, whatever the protection.
    ///
    /// On a read-only mapping the store faults: the process receives `SIGSEGV` (which, by
    /// default, kills it). That is the point — it is how tests check that a fault the `cow`
    /// engine does not own still reaches the previous handler. A handler that makes the page
    /// writable and returns lets the store complete, which is sound too: `&mut self` means
    /// no slice of this mapping exists meanwhile.
    ///
    /// # Panics
    /// If `offset` is not inside the mapping.
    pub fn write_volatile(&mut self, offset: usize, value: u8) {
        assert!(offset < self.len, "offset {offset} outside {} B", self.len);
        // SAFETY: offset is in bounds of our live mapping (checked above) and `&mut self`
        // excludes every other reference to it; a store to a read-only page is not undefined
        // behaviour but a synchronous SIGSEGV, documented above.
        unsafe { std::ptr::write_volatile(self.ptr.as_ptr().add(offset), value) };
    }

    /// Moves the mapping to a new address and grows (or shrinks) it to `new_len` bytes,
    /// rounded up to whole pages, as `realloc` does for large blocks (`mremap(2)` with
    /// `MREMAP_MAYMOVE|MREMAP_FIXED`). The pages keep their contents; growth is zero-filled.
    ///
    /// The target is first reserved (`PROT_NONE`) so the move is certain, not left to the
    /// kernel's choice: tests use this to check that in-flight pages that *moved* are still
    /// handled. Consumes `self`, so no slice of the old address can outlive the move.
    pub fn move_and_resize(self, new_len: usize) -> io::Result<Mapping> {
        let new_len = round_to_pages(new_len);
        let target = Self::anon(new_len, libc::MAP_PRIVATE, false)?;
        let old = std::mem::ManuallyDrop::new(self);
        // SAFETY: `old` is our live mapping, which nobody else references (we own it by
        // value); the target is our own fresh reservation, which MREMAP_FIXED replaces. On
        // success both old ranges are gone and the new one is exactly target..target+new_len,
        // which we then own; on failure nothing changed and both are still ours.
        let q = unsafe {
            libc::mremap(
                old.ptr.as_ptr().cast(),
                old.len,
                new_len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                target.ptr.as_ptr().cast::<c_void>(),
            )
        };
        if q == libc::MAP_FAILED {
            let err = io::Error::last_os_error();
            drop(std::mem::ManuallyDrop::into_inner(old));
            return Err(err); // `target` unmaps the reservation
        }
        assert_eq!(
            q,
            target.ptr.as_ptr().cast::<c_void>(),
            "MREMAP_FIXED moved elsewhere"
        );
        let moved = Mapping {
            ptr: target.ptr,
            len: new_len,
            writable: old.writable,
        };
        std::mem::forget(target); // its range now belongs to `moved`
        Ok(moved)
    }

    /// Unmaps the pages now, reporting a failure (drop ignores it).
    pub fn unmap(self) -> io::Result<()> {
        let m = std::mem::ManuallyDrop::new(self);
        // SAFETY: ptr/len describe exactly the mapping we own, unmapped once here (Drop
        // will not run for `m`); no slice of it can outlive `self`, consumed above.
        if unsafe { libc::munmap(m.ptr.as_ptr().cast(), m.len) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe exactly the mapping we own, unmapped once here.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// How a child run by [`fork_and_run`] ended, other than by returning.
fn child_failed(what: String) -> io::Error {
    io::Error::other(what)
}

/// Forks, runs `child` in the child process, and `_exit`s it with the returned code; the
/// parent waits at most `timeout` for it (then kills it with `SIGKILL` and reports
/// `TimedOut`) and returns the child's exit code.
///
/// For tests that need `fork(2)` semantics specifically (what a forked child inherits:
/// copy-on-write memory, *no* userfaultfd registration), which spawning a fresh process
/// cannot show. A child that panics exits with code 101 without unwinding into the
/// parent's frames; a child killed by a signal is reported as an error.
///
/// Waiting uses a pidfd (`pidfd_open(2)`, `poll(2)`, `pidfd_send_signal(2)`), so the kill
/// can never hit a recycled pid.
///
/// # Caveat
/// In a multithreaded process the child has only the forking thread. POSIX allows it only
/// async-signal-safe calls until `exec`; glibc keeps `malloc` usable after fork, but a lock
/// another thread held at the fork (stdout, a `Mutex` of the caller's) stays held forever in
/// the child. Keep `child` to plain memory work; if it blocks, the timeout turns the hang
/// into an error. This is a liveness caveat, not a memory-safety one.
pub fn fork_and_run<F: FnOnce() -> i32>(timeout: Duration, child: F) -> io::Result<i32> {
    // SAFETY: memory safety of fork. The child is a copy of this process with only this
    // thread: every reference `child` captured points into the child's own copy of memory,
    // except MAP_SHARED pages, which both processes see. Those the parent cannot touch while
    // the child runs: `child` (and so its borrows) lives until this function returns, which
    // is after the child is dead and reaped (or the wait failed, see below), so any `&mut`
    // the child writes through is exclusive in the parent too. Locks held by other threads
    // cannot give the child access they exclude; they only block it (see Caveat). The child
    // never returns from here: it runs `child` inside catch_unwind and `_exit`s, so no
    // destructor or test-harness frame of the parent runs twice.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(101);
        // SAFETY: _exit ends the child without running atexit handlers or destructors that
        // belong to the parent's state; it is async-signal-safe.
        unsafe { libc::_exit(code) };
    }
    // Ok(true): the child exited; Ok(false): still running at the deadline.
    let pidfd = pidfd_open(pid);
    let exited = match &pidfd {
        Ok(fd) => exited_within(fd, timeout),
        Err(e) => Err(io::Error::new(e.kind(), format!("pidfd_open({pid}): {e}"))),
    };
    let outcome = match exited {
        Ok(true) => Ok(()),
        Ok(false) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("forked child {pid} still running after {timeout:?}; killed"),
        )),
        Err(e) => Err(e),
    };
    if outcome.is_err() {
        // Timed out, or no bounded wait is possible: kill, so the reaping below cannot hang.
        match &pidfd {
            // SAFETY: signalling the process the pidfd refers to (our child, which a pidfd
            // names even if its pid were recycled); no memory is passed (null siginfo).
            Ok(fd) => unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
            },
            // SAFETY: `pid` is our child and we have not reaped it, so it is not recycled
            // (unless another thread reaps children it does not own, see the Caveat).
            Err(_) => unsafe {
                libc::kill(pid, libc::SIGKILL);
            },
        }
    }
    let mut status = 0;
    let r = loop {
        // SAFETY: reaping our own child; `status` is a valid out-pointer. The child has
        // exited or been sent SIGKILL, so this does not hang.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            break r;
        }
    };
    let reaped = if r == pid {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    };
    outcome?;
    reaped?;
    if libc::WIFEXITED(status) {
        Ok(libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        Err(child_failed(format!(
            "forked child {pid} killed by signal {}",
            libc::WTERMSIG(status)
        )))
    } else {
        Err(child_failed(format!(
            "forked child {pid}: wait status {status:#x}"
        )))
    }
}

/// Whether the process behind `pidfd` exits within `timeout` (`poll(2)` for `POLLIN`,
/// retried after `EINTR` until the deadline).
fn exited_within(pidfd: &OwnedFd, timeout: Duration) -> io::Result<bool> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let readable = rustix::event::PollFlags::IN;
        match crate::raw::socket::poll(std::os::fd::AsFd::as_fd(pidfd), readable, Some(left)) {
            Ok(ev) if ev.is_empty() && left.is_zero() => return Ok(false),
            Ok(ev) if ev.is_empty() => continue,
            Ok(_) => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// `pidfd_open(2)`: a descriptor that becomes readable when the process exits.
fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: no memory is passed; the result is checked before use.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_hold_their_kind_and_contents() {
        let mut a = Mapping::anon_private(5000).unwrap();
        assert_eq!(a.len() % crate::mem::page_size(), 0);
        assert!(a.as_slice().iter().all(|&b| b == 0));
        a.as_mut_slice()[4999] = 9;
        a.write_volatile(0, 7);
        let m = a.move_and_resize(1 << 20).unwrap();
        assert_eq!(m.len(), 1 << 20);
        assert_eq!((m.as_slice()[0], m.as_slice()[4999]), (7, 9));
        assert!(m.as_slice()[5000..].iter().all(|&b| b == 0));
        m.unmap().unwrap();

        let mut s = Mapping::anon_shared(100).unwrap();
        s.as_mut_slice().fill(3);
        let f = Mapping::file_copy(b"hello").unwrap();
        assert!(!f.is_writable());
        assert_eq!(&f.as_slice()[..6], b"hello\0");
    }

    #[test]
    fn fork_and_run_reports_exit_panic_and_timeout() {
        let mut shared = Mapping::anon_shared(4096).unwrap();
        let mut private = [0u8; 16];
        let s = shared.as_mut_slice();
        let code = fork_and_run(Duration::from_secs(20), || {
            s[0] = 1;
            private[0] = 1;
            42
        });
        assert_eq!(code.unwrap(), 42);
        assert_eq!(shared.as_slice()[0], 1, "shared memory is shared");
        assert_eq!(private[0], 0, "private memory is copied");
        assert_eq!(
            fork_and_run(Duration::from_secs(20), || panic!("in child")).unwrap(),
            101
        );
        let e = fork_and_run(Duration::from_millis(200), || loop {
            std::hint::spin_loop();
        })
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
    }
}
