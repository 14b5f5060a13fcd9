//! What an interposer sees of each call: typed, borrowed views of the application's
//! arguments, and the [`Hook`] trait whose safe methods decide what to do with them.

pub use super::errno::{Errno, SysResult};
use super::real;
use libc::{c_int, c_void, iovec, msghdr, sockaddr, socklen_t};
use std::io::{IoSlice, IoSliceMut};

/// The original call, kept to replay it exactly as the application made it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RawSend {
    Send(*const c_void, usize),
    SendTo(*const c_void, usize, *const sockaddr, socklen_t),
    SendMsg(*const msghdr),
    Write(*const c_void, usize),
    Writev(*const iovec, c_int),
}

/// Which call the application made to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendKind {
    /// `send(2)`.
    Send,
    /// `sendto(2)`.
    SendTo,
    /// `sendmsg(2)`.
    SendMsg,
    /// `write(2)`.
    Write,
    /// `writev(2)`.
    Writev,
}

/// One send-family call: the buffers, the flags, and the original arguments.
#[derive(Debug)]
pub struct SendCall<'a> {
    pub(crate) fd: c_int,
    pub(crate) bufs: &'a [IoSlice<'a>],
    pub(crate) flags: c_int,
    pub(crate) extras: bool,
    pub(crate) raw: RawSend,
}

impl<'a> SendCall<'a> {
    /// The descriptor.
    pub fn fd(&self) -> c_int {
        self.fd
    }

    /// The application's buffers, valid for the call.
    pub fn bufs(&self) -> &'a [IoSlice<'a>] {
        self.bufs
    }

    /// The `MSG_*` flags (0 for `write`/`writev`).
    pub fn flags(&self) -> c_int {
        self.flags
    }

    /// Which call it was.
    pub fn kind(&self) -> SendKind {
        match self.raw {
            RawSend::Send(..) => SendKind::Send,
            RawSend::SendTo(..) => SendKind::SendTo,
            RawSend::SendMsg(_) => SendKind::SendMsg,
            RawSend::Write(..) => SendKind::Write,
            RawSend::Writev(..) => SendKind::Writev,
        }
    }

    /// The call carries a destination address or control messages: only a replay keeps
    /// its meaning.
    pub fn has_extras(&self) -> bool {
        self.extras
    }

    /// Makes the application's call unchanged, to the C library.
    pub fn forward(&self) -> SysResult {
        // SAFETY: every pointer was the application's argument to this call and is valid
        // (or invalid, which the kernel reports as EFAULT) for its duration, which `'a`
        // spans: a SendCall is built by `entry` and lives only inside the interposed call.
        let r = unsafe {
            match self.raw {
                RawSend::Send(b, l) => real::send_fn()(self.fd, b, l, self.flags),
                RawSend::SendTo(b, l, a, al) => real::sendto_fn()(self.fd, b, l, self.flags, a, al),
                RawSend::SendMsg(m) => real::sendmsg_fn()(self.fd, m, self.flags),
                RawSend::Write(b, l) => real::write_fn()(self.fd, b, l),
                RawSend::Writev(v, n) => real::writev_fn()(self.fd, v, n),
            }
        };
        real::check(r)
    }
}

/// One message of a `sendmmsg` call.
#[derive(Debug)]
pub struct Datagram<'a> {
    /// The destination (`msg_name`, a raw `sockaddr`), if the message names one.
    pub name: Option<&'a [u8]>,
    /// The payload.
    pub bufs: &'a [IoSlice<'a>],
    /// It carries control messages, whose meaning only the original call keeps.
    pub control: bool,
}

impl Datagram<'_> {
    /// Payload bytes.
    pub fn len(&self) -> usize {
        self.bufs.iter().map(|b| b.len()).sum()
    }

    /// Whether it carries no payload byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One `sendmmsg(2)` call: its messages, and the application's array, whose `msg_len`
/// fields the call sets for the messages sent.
#[derive(Debug)]
pub struct MmsgCall<'a> {
    pub(crate) fd: c_int,
    pub(crate) msgs: Vec<Datagram<'a>>,
    pub(crate) flags: c_int,
    pub(crate) raw: *mut libc::mmsghdr,
}

impl<'a> MmsgCall<'a> {
    /// The descriptor.
    pub fn fd(&self) -> c_int {
        self.fd
    }

    /// The `MSG_*` flags.
    pub fn flags(&self) -> c_int {
        self.flags
    }

    /// The messages (at most `UIO_MAXIOV`, as the kernel takes).
    pub fn msgs(&self) -> &[Datagram<'a>] {
        &self.msgs
    }

    /// Sends messages `range` as the application would have: the C library's `sendmmsg` of
    /// that part of its array (the kernel sets their `msg_len`). The count sent.
    pub fn forward(&self, range: std::ops::Range<usize>) -> SysResult {
        let range = range.start.min(self.msgs.len())..range.end.min(self.msgs.len());
        // SAFETY: `raw` is the application's array of at least `msgs.len()` entries, valid
        // for the call; the sub-range lies inside it.
        let r = unsafe {
            real::sendmmsg_fn()(
                self.fd,
                self.raw.add(range.start),
                range.len() as libc::c_uint,
                self.flags,
            )
        };
        real::check(r as libc::ssize_t)
    }

    /// Sends messages `range` as one UDP GSO send to the first one's destination, cut into
    /// datagrams of `seg` bytes (the caller checks that every message but the last is
    /// `seg` bytes long and the last at most that, so the datagrams are the messages).
    /// Bytes sent; on success, every message's `msg_len` is set.
    pub fn send_gso(&self, range: std::ops::Range<usize>, seg: u16) -> SysResult {
        let msgs = &self.msgs[range.clone()];
        let bufs: Vec<IoSlice<'_>> = msgs.iter().flat_map(|m| m.bufs.iter().copied()).collect();
        let name = msgs.first().and_then(|m| m.name);
        let n = real::sendmsg_gso(self.fd, name, &bufs, seg, self.flags)?;
        for (i, m) in range.zip(msgs) {
            // SAFETY: entry `i` of the application's array, valid for the call; only its
            // `msg_len` is written, which no view borrows.
            unsafe { (*self.raw.add(i)).msg_len = m.len() as libc::c_uint };
        }
        Ok(n)
    }
}

/// The original receive call, to replay it into the application's or another buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RawRecv {
    Read,
    Pread(libc::off64_t),
    Preadv(libc::off64_t),
    Recv(c_int),
    RecvFrom(c_int, *mut sockaddr, *mut socklen_t),
    RecvMsg(*mut msghdr, c_int),
    Readv,
}

/// One receive-family call (`read`, `pread`, `readv`, `preadv`, `recv`, `recvfrom`,
/// `recvmsg` and their `_FORTIFY_SOURCE` variants): a kernel write into the application's buffers.
#[derive(Debug)]
pub struct RecvCall<'a> {
    pub(crate) fd: c_int,
    pub(crate) bufs: &'a mut [IoSliceMut<'a>],
    pub(crate) raw: RawRecv,
}

impl<'a> RecvCall<'a> {
    /// The descriptor.
    pub fn fd(&self) -> c_int {
        self.fd
    }

    /// The application's buffers.
    pub fn bufs(&self) -> &[IoSliceMut<'a>] {
        self.bufs
    }

    /// The application's buffers, writable.
    pub fn bufs_mut(&mut self) -> &mut [IoSliceMut<'a>] {
        self.bufs
    }

    /// Makes the application's call unchanged, into its own buffers.
    pub fn forward(&mut self) -> SysResult {
        let iov = self.bufs.as_mut_ptr() as *mut iovec;
        let n = self.bufs.len();
        self.replay(iov, n)
    }

    /// Makes the same call (same flags, address and control buffers) into `scratch`
    /// instead of the application's buffers.
    pub fn forward_into(&mut self, scratch: &mut [u8]) -> SysResult {
        let mut one = [IoSliceMut::new(scratch)];
        let iov = one.as_mut_ptr() as *mut iovec;
        self.replay(iov, 1)
    }

    fn replay(&mut self, iov: *mut iovec, n: usize) -> SysResult {
        // SAFETY: `iov[..n]` are live, writable buffers (IoSliceMut is ABI-compatible with
        // iovec); the address and control pointers are the application's arguments to this
        // very call, valid for its duration. For a one-buffer call `n >= 1` (entry builds
        // one slice for it).
        let r = unsafe {
            let first = &*iov;
            match self.raw {
                RawRecv::Read => real::read_fn()(self.fd, first.iov_base, first.iov_len),
                RawRecv::Pread(o) => real::pread64_fn()(self.fd, first.iov_base, first.iov_len, o),
                RawRecv::Preadv(o) => real::preadv64_fn()(self.fd, iov, n as c_int, o),
                RawRecv::Recv(f) => real::recv_fn()(self.fd, first.iov_base, first.iov_len, f),
                RawRecv::RecvFrom(f, a, al) => {
                    real::recvfrom_fn()(self.fd, first.iov_base, first.iov_len, f, a, al)
                }
                RawRecv::Readv => real::readv_fn()(self.fd, iov, n as c_int),
                RawRecv::RecvMsg(m, f) => {
                    let mut copy = *m;
                    copy.msg_iov = iov;
                    copy.msg_iovlen = n;
                    let r = real::recvmsg_fn()(self.fd, &mut copy, f);
                    (*m).msg_namelen = copy.msg_namelen;
                    (*m).msg_controllen = copy.msg_controllen;
                    (*m).msg_flags = copy.msg_flags;
                    r
                }
            }
        };
        real::check(r)
    }
}

/// A `select(2)` descriptor set, borrowed.
#[derive(Debug)]
pub struct FdSet<'a>(pub(crate) &'a mut libc::fd_set);

impl FdSet<'_> {
    /// Whether `fd` is in the set (`fd < FD_SETSIZE`).
    pub fn contains(&self, fd: c_int) -> bool {
        if !(0..libc::FD_SETSIZE as c_int).contains(&fd) {
            return false;
        }
        // SAFETY: the set is a live fd_set and `fd` is within FD_SETSIZE.
        unsafe { libc::FD_ISSET(fd, &*self.0) }
    }

    /// Sets or clears `fd` (`fd < FD_SETSIZE`).
    pub fn set(&mut self, fd: c_int, on: bool) {
        if !(0..libc::FD_SETSIZE as c_int).contains(&fd) {
            return;
        }
        // SAFETY: the set is a live, writable fd_set and `fd` is within FD_SETSIZE.
        unsafe {
            if on {
                libc::FD_SET(fd, self.0)
            } else {
                libc::FD_CLR(fd, self.0)
            }
        }
    }
}

/// The policy of an interposer: every method is called inside an interposed call, on the
/// calling thread, with a guard set so that C calls the method makes itself go straight to
/// the C library. The defaults do what the C library alone would do.
pub trait Hook: Sync {
    /// The library was loaded, before the program's `main`. `filtered`: a seccomp filter
    /// is already in force; the library goes passive when this returns, and the hook must
    /// make no system call here.
    fn init(&self, _filtered: bool) {}

    /// The program is about to install a seccomp filter: the last moment the library may
    /// make system calls of its own in this process (it goes passive next).
    fn before_seccomp(&self) {}

    /// The program is about to make an `io_uring` ring (through liburing or `syscall`): from
    /// now on the kernel may write into the program's memory in calls this library never
    /// sees, so no page may stay write-protected.
    fn before_io_uring(&self) {}

    /// A send-family call. Default: forwarded.
    fn send(&self, call: SendCall<'_>) -> SysResult {
        call.forward()
    }

    /// A `sendmmsg` call. Default: forwarded.
    fn send_mmsg(&self, call: MmsgCall<'_>) -> SysResult {
        call.forward(0..call.msgs().len())
    }

    /// A receive-family call. Default: forwarded.
    fn recv(&self, mut call: RecvCall<'_>) -> SysResult {
        call.forward()
    }

    /// Whether [`Hook::recv`] may do anything but forward right now. While false, the
    /// interposed receive family (`read`, `recv`, `readv`, `recvmsg`, `pread`, ...) calls the
    /// C library's function at once, with no [`RecvCall`] made: a program that only
    /// receives (`curl`, a benchmark client) pays one atomic load per call, not the hook's
    /// machinery. Asked once per call. Default: true.
    fn detours_receives(&self) -> bool {
        true
    }

    /// Whether `after_poll`, `after_epoll` or `after_select` may hide anything right now.
    /// While false, the interposed `poll`, `epoll_wait` and `select` families make the
    /// program's call as it is, without reading the clock (which only a call made again for
    /// the rest of its timeout needs); asked again when the call returns. Default: true.
    fn hides_readiness(&self) -> bool {
        true
    }

    /// `poll`/`ppoll` returned `ready` (> 0): return how many entries remain ready after
    /// clearing what the application must not see. Zero makes the call wait again for
    /// the rest of its timeout.
    fn after_poll(&self, _fds: &mut [libc::pollfd], ready: usize) -> usize {
        ready
    }

    /// `epoll_wait`/`epoll_pwait` filled `events` (all of it ready): compact it to what
    /// the application may see and return that count.
    fn after_epoll(&self, _epfd: c_int, events: &mut [libc::epoll_event]) -> usize {
        events.len()
    }

    /// `epoll_ctl(epfd, op, fd, {events, data})` succeeded.
    fn epoll_ctl(&self, _epfd: c_int, _op: c_int, _fd: c_int, _ev: Option<(u32, u64)>) {}

    /// `select`/`pselect` returned `ready` (> 0) for descriptors below `nfds`.
    fn after_select(
        &self,
        _nfds: c_int,
        _read: Option<&mut FdSet<'_>>,
        _write: Option<&mut FdSet<'_>>,
        _except: Option<&mut FdSet<'_>>,
        ready: usize,
    ) -> usize {
        ready
    }

    /// Before `getsockopt(fd, SOL_SOCKET, SO_ERROR)` or `recvmsg(fd, MSG_ERRQUEUE)`: the
    /// application is about to read the socket's error state.
    fn before_error_read(&self, _fd: c_int) {}

    /// `setsockopt(fd, level, name, value)` succeeded (`value`: the first `int`, if any).
    fn after_setsockopt(&self, _fd: c_int, _level: c_int, _name: c_int, _value: Option<c_int>) {}

    /// Before `close(fd)`, or before `dup2`/`dup3` replace `fd`.
    fn before_close(&self, _fd: c_int) {}

    /// `fd` is a new descriptor (`socket`, `accept`): forget anything cached for its number.
    fn new_fd(&self, _fd: c_int) {}

    /// `fd` was made by `socket(domain, ty, proto)` (or is one end of a `socketpair`):
    /// what it is, known without asking the kernel.
    fn new_socket(&self, fd: c_int, _domain: c_int, _ty: c_int, _proto: c_int) {
        self.new_fd(fd);
    }

    /// `fd` was accepted on `listener`: a socket of the listener's kind.
    fn accepted(&self, _listener: c_int, fd: c_int) {
        self.new_fd(fd);
    }

    /// `new` is a duplicate of `old` (`dup`, `dup2`, `dup3`): the same open file under
    /// another number.
    fn new_dup(&self, _old: c_int, new: c_int) {
        self.new_fd(new);
    }

    /// Before `execve` (and `execv`, `execvp`, `execvpe`, `fexecve`, and on x86-64 and aarch64 `execl`,
    /// `execlp`, `execle`) replaces the process image: the
    /// last moment this image's state can be settled.
    fn before_exec(&self) {}

    /// The `exec` failed: the image goes on.
    fn exec_failed(&self) {}

    /// Whether a kernel write into `buf` would fail now (it is write-protected while a
    /// send still reads it): `getrandom` and `fread` into it then go through scratch
    /// memory, copied in by user-mode writes. Default: never.
    fn kernel_write_blocked(&self, _buf: &[u8]) -> bool {
        false
    }

    /// A kernel write went through scratch memory ([`Hook::kernel_write_blocked`]).
    fn detoured(&self) {}

    /// Whether some zero-copy send may still hold a page of this process: asked (without
    /// a lock, cheaply) on every `free`, `realloc`, `munmap`, `madvise` and `mremap`;
    /// while false they are the C library's alone. Default: never.
    fn holds_pages(&self) -> bool {
        false
    }

    /// Whether a send still holds a page of `start..start + len` (protected or registered).
    /// `realloc` of such a chunk is made as `malloc`, copy and `free`, so that the old
    /// chunk is freed where this library sees it. Default: never.
    fn holds_any(&self, _start: usize, _len: usize) -> bool {
        false
    }

    /// The program gives back `start..start + len` — `free` (the chunk's usable bytes),
    /// `madvise(MADV_DONTNEED | MADV_FREE | MADV_REMOVE)`, `munmap`, `mremap` — before the
    /// C library does it: no page of it may stay write-protected (see
    /// [`crate::cow::CowSpace::let_go`]). Runs inside `free`: it must not allocate while
    /// holding a lock a `malloc` may wait for.
    fn giving_back(&self, _start: usize, _len: usize, _how: crate::cow::GiveBack) {}

    /// Before `fork()`.
    fn before_fork(&self) {}

    /// After `fork()` returned `pid`: the child's pid in the parent, 0 in the child.
    fn after_fork(&self, _pid: libc::pid_t) {}
}
