//! Moving file bytes without a user-space copy: `sendfile(2)`, `splice(2)` and its pipes, plus
//! the file calls around them (`fallocate(2)`, `posix_fadvise(2)`, `fcntl(F_GETFL)`).
//!
//! `sendfile` hands page-cache pages to the socket by reference; `splice` moves references
//! through a pipe, file → pipe → socket on transmit and socket → pipe → file on receive
//! (splice(2); docs/measurements/kernel-findings.md §4). Into a *file*, splice still copies
//! into the page cache — it only skips the user buffer.
//!
//! Since Linux 6.5 both write to a socket through `splice_to_socket` → `sock_sendmsg`
//! without `MSG_NOSIGNAL`, so a closed peer raises `SIGPIPE` (checked here: a C program with
//! the default disposition dies with status 141 on either call). [`sendfile`] and
//! [`splice_to_socket`] therefore block `SIGPIPE` in the calling thread for the call and
//! consume the one they caused, so the caller sees `EPIPE` — the promise `socket::send` keeps
//! with `MSG_NOSIGNAL` — whatever the process's `SIGPIPE` disposition.
//!
//! Nothing here retries: `EINTR`, `EAGAIN` (a socket timeout) and `EINVAL` (the file system
//! has no `splice_read`/`splice_write`) go back to the caller.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd};

/// `posix_fadvise(2)` advice.
pub use rustix::fs::Advice;
/// `fallocate(2)` modes (empty: allocate the range and extend the file to cover it).
pub use rustix::fs::FallocateFlags;
/// File status flags (`O_APPEND`, `O_NONBLOCK`, the access mode...).
pub use rustix::fs::OFlags;
/// `splice(2)` flags: `MOVE` (a hint to move pages rather than copy; a no-op since 2.6.21,
/// kept for when it is not), `NONBLOCK` (do not block on the pipe), `MORE` (more data
/// follows: `MSG_MORE` on a socket).
pub use rustix::pipe::SpliceFlags;

/// The largest count one `sendfile`/`splice` call moves (`MAX_RW_COUNT`, INT_MAX rounded
/// down to a page); larger requests come back short anyway.
pub const MAX_RW_COUNT: usize = 0x7fff_f000;

/// Refuses an offset past the largest `off_t` before the kernel sees it (rustix takes a
/// `u64`, and the kernel's answer would be a less clear `EINVAL`/`EOVERFLOW`).
fn off_t(v: u64) -> io::Result<u64> {
    if v > i64::MAX as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "file offset exceeds the largest off_t",
        ));
    }
    Ok(v)
}

/// Runs `f` with `SIGPIPE` blocked in this thread; if it failed with `EPIPE`, consumes the
/// `SIGPIPE` it raised (unless one was already pending before), then restores the mask.
fn without_sigpipe<T>(f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    // SAFETY: sigset_t is plain old data; sigemptyset initialises it before any other use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut pending: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: set/old/pending are live locals; these calls only read and write them and the
    // calling thread's signal mask.
    let (blocked_before, pending_before) = unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) != 0 {
            // Could not block it: run unguarded (a Rust binary ignores SIGPIPE anyway).
            return f();
        }
        libc::sigemptyset(&mut pending);
        libc::sigpending(&mut pending);
        (
            libc::sigismember(&old, libc::SIGPIPE) == 1,
            libc::sigismember(&pending, libc::SIGPIPE) == 1,
        )
    };
    let r = f();
    if matches!(&r, Err(e) if e.raw_os_error() == Some(libc::EPIPE)) && !pending_before {
        let zero = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: set is initialised; a null siginfo pointer is allowed; zero is a live
        // timespec. With a zero timeout the call never blocks (EAGAIN if nothing pending).
        unsafe {
            libc::sigtimedwait(&set, std::ptr::null_mut(), &zero);
        }
    }
    if !blocked_before {
        // SAFETY: old is the mask pthread_sigmask returned above.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        }
    }
    r
}

/// `sendfile(out, in, &offset, count)` (sendfile(2)): up to `count` bytes of `in_file`
/// starting at `offset` to `out` (a socket), without the file position moving. Returns the
/// bytes sent; 0 means `offset` is at or past the end of the file. `SIGPIPE` is suppressed
/// (see the module docs).
pub fn sendfile(
    out: BorrowedFd<'_>,
    in_file: BorrowedFd<'_>,
    offset: u64,
    count: usize,
) -> io::Result<usize> {
    let mut off = off_t(offset)?;
    without_sigpipe(|| {
        Ok(rustix::fs::sendfile(
            out,
            in_file,
            Some(&mut off),
            count.min(MAX_RW_COUNT),
        )?)
    })
}

fn splice_raw(
    fd_in: BorrowedFd<'_>,
    off_in: Option<u64>,
    fd_out: BorrowedFd<'_>,
    off_out: Option<u64>,
    len: usize,
    flags: SpliceFlags,
) -> io::Result<usize> {
    let mut oi = off_in.map(off_t).transpose()?;
    let mut oo = off_out.map(off_t).transpose()?;
    Ok(rustix::pipe::splice(
        fd_in,
        oi.as_mut(),
        fd_out,
        oo.as_mut(),
        len.min(MAX_RW_COUNT),
        flags,
    )?)
}

/// `splice(2)` between `fd_in` and `fd_out`, one of which must be a pipe. `off_in`/`off_out`
/// are positional offsets for a file end (`None` for a pipe or socket; a file's position
/// does not move when given). Returns the bytes moved; 0 means end of input (a socket's FIN,
/// a file's end).
pub fn splice(
    fd_in: BorrowedFd<'_>,
    off_in: Option<u64>,
    fd_out: BorrowedFd<'_>,
    off_out: Option<u64>,
    len: usize,
    flags: SpliceFlags,
) -> io::Result<usize> {
    splice_raw(fd_in, off_in, fd_out, off_out, len, flags)
}

/// `splice(2)` from a pipe to a socket, with `SIGPIPE` suppressed (see the module docs).
pub fn splice_to_socket(
    pipe: BorrowedFd<'_>,
    sock: BorrowedFd<'_>,
    len: usize,
    flags: SpliceFlags,
) -> io::Result<usize> {
    without_sigpipe(|| splice_raw(pipe, None, sock, None, len, flags))
}

/// A pipe for splicing (pipe2(2) with `O_CLOEXEC`), both ends owned and closed on drop.
/// Bytes left in it after a failed transfer are gone with it: drop the pipe rather than
/// reuse it when its content is unknown.
#[derive(Debug)]
pub struct Pipe {
    read: File,
    write: File,
}

impl Pipe {
    /// A fresh pipe (capacity 64 KiB until [`Pipe::set_size`]).
    pub fn new() -> io::Result<Pipe> {
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        Ok(Pipe {
            read: File::from(r),
            write: File::from(w),
        })
    }

    /// The read end.
    pub fn read_end(&self) -> BorrowedFd<'_> {
        self.read.as_fd()
    }

    /// The write end.
    pub fn write_end(&self) -> BorrowedFd<'_> {
        self.write.as_fd()
    }

    /// `read(2)` from the read end (blocks while the pipe is empty and a writer exists; the
    /// write end is ours, so only read what is known to be in it).
    pub fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read.read(buf)
    }

    /// `fcntl(F_SETPIPE_SZ)`: asks for `bytes` of capacity; returns what the kernel set (a
    /// power-of-two number of pages). Unprivileged callers are capped by
    /// `/proc/sys/fs/pipe-max-size` (`EPERM` above it) and by `pipe-user-pages-soft`.
    pub fn set_size(&self, bytes: usize) -> io::Result<usize> {
        Ok(rustix::pipe::fcntl_setpipe_size(&self.write, bytes)?)
    }

    /// `fcntl(F_GETPIPE_SZ)`: the capacity in bytes.
    pub fn size(&self) -> io::Result<usize> {
        Ok(rustix::pipe::fcntl_getpipe_size(&self.write)?)
    }
}

/// `/proc/sys/fs/pipe-max-size`: the largest pipe an unprivileged process may ask for.
pub fn pipe_max_size() -> Option<usize> {
    std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// `fallocate(fd, mode, offset, len)` (fallocate(2)). An empty mode allocates the range and
/// extends the file size to cover it. File systems without it answer `EOPNOTSUPP`;
/// pseudo-files `ENODEV`/`ESPIPE`/`EFBIG`.
pub fn fallocate(
    fd: BorrowedFd<'_>,
    mode: FallocateFlags,
    offset: u64,
    len: u64,
) -> io::Result<()> {
    let (o, l) = (off_t(offset)?, off_t(len)?);
    Ok(rustix::fs::fallocate(fd, mode, o, l)?)
}

/// `posix_fadvise(fd, offset, len, advice)` (posix_fadvise(2)); `len` 0 means to the end.
pub fn fadvise(fd: BorrowedFd<'_>, offset: u64, len: u64, advice: Advice) -> io::Result<()> {
    let len = std::num::NonZeroU64::new(off_t(len)?);
    Ok(rustix::fs::fadvise(fd, off_t(offset)?, len, advice)?)
}

/// `fcntl(F_GETFL)`: the file status flags (`O_APPEND`, `O_NONBLOCK`, access mode…).
pub fn status_flags(fd: BorrowedFd<'_>) -> io::Result<OFlags> {
    Ok(rustix::fs::fcntl_getfl(fd)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    fn tmpfile(content: &[u8]) -> File {
        let dir = std::env::temp_dir();
        let path = dir.join(format!(
            "zcnet-splice-unit-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f.write_all(content).unwrap();
        f.rewind().unwrap();
        f
    }

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    #[test]
    fn sendfile_sends_from_an_offset_and_reports_eof_as_zero() {
        let f = tmpfile(b"0123456789");
        let (c, mut s) = pair();
        assert_eq!(sendfile(c.as_fd(), f.as_fd(), 3, 4).unwrap(), 4);
        assert_eq!(sendfile(c.as_fd(), f.as_fd(), 10, 4).unwrap(), 0);
        drop(c);
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"3456");
    }

    #[test]
    fn splice_through_a_pipe_into_a_file_at_an_offset() {
        let (mut c, s) = pair();
        c.write_all(b"hello").unwrap();
        let p = Pipe::new().unwrap();
        assert!(p.set_size(1 << 20).unwrap() >= 64 * 1024);
        assert_eq!(p.size().unwrap(), p.set_size(1 << 20).unwrap());
        let n = splice(s.as_fd(), None, p.write_end(), None, 5, SpliceFlags::MOVE).unwrap();
        assert_eq!(n, 5);
        let out = tmpfile(b"..........");
        let m = splice(
            p.read_end(),
            None,
            out.as_fd(),
            Some(2),
            5,
            SpliceFlags::MOVE,
        )
        .unwrap();
        assert_eq!(m, 5);
        let mut got = Vec::new();
        (&out).read_to_end(&mut got).unwrap();
        assert_eq!(got, b"..hello...");
    }

    /// Whether SIGPIPE is pending for this thread (or the process); consumes it if so.
    fn take_pending_sigpipe() -> bool {
        // SAFETY: sigset_t is plain old data, initialised by sigemptyset before use; a zero
        // timeout never blocks.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGPIPE);
            let zero = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            libc::sigtimedwait(&set, std::ptr::null_mut(), &zero) == libc::SIGPIPE
        }
    }

    #[test]
    fn a_closed_peer_is_epipe_and_the_sigpipe_is_consumed() {
        // Block SIGPIPE in this test thread, so a raised one stays pending (blocked signals
        // are never discarded as ignored) and we can see whether our calls leave one behind.
        // SAFETY: set/old are live locals; only this thread's mask changes, restored below.
        let old = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGPIPE);
            assert_eq!(libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old), 0);
            old
        };
        let f = tmpfile(&[7u8; 4096]);
        let (c, s) = pair();
        drop(s);
        let p = Pipe::new().unwrap();
        // Control: send(2) without MSG_NOSIGNAL on the dead socket does raise SIGPIPE.
        let mut control = false;
        for _ in 0..100 {
            // SAFETY: a live 1-byte buffer and a valid fd.
            let r = unsafe { libc::send(c.as_raw_fd(), [1u8].as_ptr().cast(), 1, 0) };
            if r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EPIPE) {
                control = take_pending_sigpipe();
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(control, "send(2) on a closed socket raised no SIGPIPE");
        let e = sendfile(c.as_fd(), f.as_fd(), 0, 4096).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPIPE));
        assert!(!take_pending_sigpipe(), "sendfile left a SIGPIPE pending");
        let n = splice(
            f.as_fd(),
            Some(0),
            p.write_end(),
            None,
            4096,
            SpliceFlags::empty(),
        )
        .unwrap();
        let e = splice_to_socket(p.read_end(), c.as_fd(), n, SpliceFlags::empty()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPIPE));
        assert!(!take_pending_sigpipe(), "splice left a SIGPIPE pending");
        // SAFETY: restores the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    }

    #[test]
    fn append_flag_and_fallocate_are_visible() {
        let f = tmpfile(b"");
        assert!(!status_flags(f.as_fd()).unwrap().contains(OFlags::APPEND));
        fallocate(f.as_fd(), FallocateFlags::empty(), 0, 8192).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 8192);
        fadvise(f.as_fd(), 0, 0, Advice::Sequential).unwrap();
        assert!(pipe_max_size().is_some_and(|n| n >= 4096));
    }
}
