//! The C library's own definitions of every interposed call, found with
//! `dlsym(RTLD_NEXT, name)` (dlsym(3): the next occurrence after the interposing library,
//! which is the C library's), and safe forwards to the few the policy calls itself.
//!
//! Each pointer is looked up on first use and cached in an atomic: no lock, so a call made
//! while another thread (or this one, re-entering) is still looking it up simply looks it up
//! again.

use super::errno::{Errno, SysResult};
use libc::{
    c_int, c_uint, c_void, iovec, msghdr, nfds_t, pollfd, size_t, sockaddr, socklen_t, ssize_t,
};
use std::io::IoSlice;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering::Relaxed};

/// Writes `msg` to standard error with a raw `write` and aborts: a C library without one
/// of the calls this library interposes cannot run the program correctly.
fn missing(name: &str) -> ! {
    let msg = format!("zcnet-preload: the C library has no `{name}`\n");
    // SAFETY: descriptor 2 is only borrowed for this write.
    let err = unsafe { std::os::fd::BorrowedFd::borrow_raw(2) };
    let _ = rustix::io::write(err, msg.as_bytes());
    std::process::abort()
}

macro_rules! real_fns {
    ($($name:ident = $sym:literal : fn($($arg:ty),*) -> $ret:ty;)*) => {$(
        #[doc = concat!("The C library's `", $sym, "`.")]
        pub fn $name() -> unsafe extern "C" fn($($arg),*) -> $ret {
            static P: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
            let mut p = P.load(Relaxed);
            if p.is_null() {
                // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated symbol name.
                p = unsafe { libc::dlsym(libc::RTLD_NEXT, concat!($sym, "\0").as_ptr().cast()) };
                if p.is_null() {
                    missing($sym);
                }
                P.store(p, Relaxed);
            }
            // SAFETY: `p` is the address of the C library's function of this name, whose C
            // prototype (glibc's <sys/socket.h>, <unistd.h>, <poll.h>, <sys/select.h>,
            // <sys/epoll.h>) is exactly this function pointer type.
            unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(p) }
        }
    )*};
}

real_fns! {
    send_fn = "send": fn(c_int, *const c_void, size_t, c_int) -> ssize_t;
    sendto_fn = "sendto": fn(c_int, *const c_void, size_t, c_int, *const sockaddr, socklen_t) -> ssize_t;
    sendmsg_fn = "sendmsg": fn(c_int, *const msghdr, c_int) -> ssize_t;
    sendmmsg_fn = "sendmmsg": fn(c_int, *mut libc::mmsghdr, libc::c_uint, c_int) -> c_int;
    write_fn = "write": fn(c_int, *const c_void, size_t) -> ssize_t;
    writev_fn = "writev": fn(c_int, *const iovec, c_int) -> ssize_t;
    read_fn = "read": fn(c_int, *mut c_void, size_t) -> ssize_t;
    readv_fn = "readv": fn(c_int, *const iovec, c_int) -> ssize_t;
    recv_fn = "recv": fn(c_int, *mut c_void, size_t, c_int) -> ssize_t;
    recvfrom_fn = "recvfrom": fn(c_int, *mut c_void, size_t, c_int, *mut sockaddr, *mut socklen_t) -> ssize_t;
    recvmsg_fn = "recvmsg": fn(c_int, *mut msghdr, c_int) -> ssize_t;
    pread_fn = "pread": fn(c_int, *mut c_void, size_t, libc::off_t) -> ssize_t;
    pread64_fn = "pread64": fn(c_int, *mut c_void, size_t, libc::off64_t) -> ssize_t;
    pread_chk_fn = "__pread_chk": fn(c_int, *mut c_void, size_t, libc::off_t, size_t) -> ssize_t;
    pread64_chk_fn = "__pread64_chk": fn(c_int, *mut c_void, size_t, libc::off64_t, size_t) -> ssize_t;
    preadv_fn = "preadv": fn(c_int, *const iovec, c_int, libc::off_t) -> ssize_t;
    preadv64_fn = "preadv64": fn(c_int, *const iovec, c_int, libc::off64_t) -> ssize_t;
    read_chk_fn = "__read_chk": fn(c_int, *mut c_void, size_t, size_t) -> ssize_t;
    recv_chk_fn = "__recv_chk": fn(c_int, *mut c_void, size_t, size_t, c_int) -> ssize_t;
    recvfrom_chk_fn = "__recvfrom_chk": fn(c_int, *mut c_void, size_t, size_t, c_int, *mut sockaddr, *mut socklen_t) -> ssize_t;
    poll_fn = "poll": fn(*mut pollfd, nfds_t, c_int) -> c_int;
    poll_chk_fn = "__poll_chk": fn(*mut pollfd, nfds_t, c_int, size_t) -> c_int;
    ppoll_fn = "ppoll": fn(*mut pollfd, nfds_t, *const libc::timespec, *const libc::sigset_t) -> c_int;
    select_fn = "select": fn(c_int, *mut libc::fd_set, *mut libc::fd_set, *mut libc::fd_set, *mut libc::timeval) -> c_int;
    pselect_fn = "pselect": fn(c_int, *mut libc::fd_set, *mut libc::fd_set, *mut libc::fd_set, *const libc::timespec, *const libc::sigset_t) -> c_int;
    epoll_wait_fn = "epoll_wait": fn(c_int, *mut libc::epoll_event, c_int, c_int) -> c_int;
    epoll_pwait_fn = "epoll_pwait": fn(c_int, *mut libc::epoll_event, c_int, c_int, *const libc::sigset_t) -> c_int;
    epoll_ctl_fn = "epoll_ctl": fn(c_int, c_int, c_int, *mut libc::epoll_event) -> c_int;
    getsockopt_fn = "getsockopt": fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int;
    setsockopt_fn = "setsockopt": fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int;
    close_fn = "close": fn(c_int) -> c_int;
    dup_fn = "dup": fn(c_int) -> c_int;
    dup2_fn = "dup2": fn(c_int, c_int) -> c_int;
    dup3_fn = "dup3": fn(c_int, c_int, c_int) -> c_int;
    fork_fn = "fork": fn() -> libc::pid_t;
    socket_fn = "socket": fn(c_int, c_int, c_int) -> c_int;
    accept_fn = "accept": fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
    accept4_fn = "accept4": fn(c_int, *mut sockaddr, *mut socklen_t, c_int) -> c_int;
    execve_fn = "execve": fn(*const libc::c_char, *const *const libc::c_char, *const *const libc::c_char) -> c_int;
    execv_fn = "execv": fn(*const libc::c_char, *const *const libc::c_char) -> c_int;
    execvp_fn = "execvp": fn(*const libc::c_char, *const *const libc::c_char) -> c_int;
    execvpe_fn = "execvpe": fn(*const libc::c_char, *const *const libc::c_char, *const *const libc::c_char) -> c_int;
    fexecve_fn = "fexecve": fn(c_int, *const *const libc::c_char, *const *const libc::c_char) -> c_int;
    getrandom_fn = "getrandom": fn(*mut c_void, size_t, libc::c_uint) -> ssize_t;
    fread_fn = "fread": fn(*mut c_void, size_t, size_t, *mut libc::FILE) -> size_t;
    fread_unlocked_fn = "fread_unlocked": fn(*mut c_void, size_t, size_t, *mut libc::FILE) -> size_t;
    socketpair_fn = "socketpair": fn(c_int, c_int, c_int, *mut c_int) -> c_int;
    prctl_fn = "prctl": fn(c_int, libc::c_ulong, libc::c_ulong, libc::c_ulong, libc::c_ulong) -> c_int;
    syscall_fn = "syscall": fn(libc::c_long, libc::c_long, libc::c_long, libc::c_long, libc::c_long, libc::c_long, libc::c_long) -> libc::c_long;
    realloc_fn = "realloc": fn(*mut c_void, size_t) -> *mut c_void;
    munmap_fn = "munmap": fn(*mut c_void, size_t) -> c_int;
    madvise_fn = "madvise": fn(*mut c_void, size_t, c_int) -> c_int;
    mremap_fn = "mremap": fn(*mut c_void, size_t, size_t, c_int, *mut c_void) -> *mut c_void;
}

/// liburing's functions that make an `io_uring` ring ([`uring_fn`]).
#[derive(Debug, Clone, Copy)]
pub enum UringFn {
    /// `int io_uring_queue_init(unsigned entries, struct io_uring *ring, unsigned flags)`.
    QueueInit = 0,
    /// `int io_uring_queue_init_params(unsigned entries, struct io_uring *ring,
    /// struct io_uring_params *p)`.
    QueueInitParams = 1,
    /// `int io_uring_queue_init_mem(unsigned entries, struct io_uring *ring,
    /// struct io_uring_params *p, void *buf, size_t buf_size)` (liburing 2.5).
    QueueInitMem = 2,
    /// `int io_uring_setup(unsigned entries, struct io_uring_params *p)`: liburing's system
    /// call wrapper.
    Setup = 3,
}

impl UringFn {
    fn symbol(self) -> &'static std::ffi::CStr {
        match self {
            UringFn::QueueInit => c"io_uring_queue_init",
            UringFn::QueueInitParams => c"io_uring_queue_init_params",
            UringFn::QueueInitMem => c"io_uring_queue_init_mem",
            UringFn::Setup => c"io_uring_setup",
        }
    }
}

/// The address of liburing's `f`, or `None` if no liburing in this process has it.
///
/// Unlike the C library's calls, liburing may be absent from the global scope: a library
/// loaded with `dlopen(RTLD_LOCAL)` that needs it brings it in where `RTLD_NEXT` does not
/// look, while its calls still bind to this library's definition. So, failing `RTLD_NEXT`,
/// the already-loaded `liburing.so.2` is asked directly (`RTLD_NOLOAD`: never loaded here).
pub fn uring_fn(f: UringFn) -> Option<*mut c_void> {
    static P: [AtomicPtr<c_void>; 4] = [const { AtomicPtr::new(null_mut()) }; 4];
    let slot = &P[f as usize];
    let p = slot.load(Relaxed);
    if !p.is_null() {
        return Some(p);
    }
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated symbol name.
    let mut p = unsafe { libc::dlsym(libc::RTLD_NEXT, f.symbol().as_ptr()) };
    if p.is_null() {
        // SAFETY: a NUL-terminated file name; RTLD_NOLOAD only finds a loaded object.
        let h = unsafe {
            libc::dlopen(
                c"liburing.so.2".as_ptr(),
                libc::RTLD_NOLOAD | libc::RTLD_LAZY,
            )
        };
        if !h.is_null() {
            // SAFETY: a handle dlopen just returned and a NUL-terminated symbol name.
            p = unsafe { libc::dlsym(h, f.symbol().as_ptr()) };
            // SAFETY: drops the reference RTLD_NOLOAD took; the object stays loaded.
            unsafe { libc::dlclose(h) };
        }
    }
    if p.is_null() {
        return None;
    }
    slot.store(p, Relaxed);
    Some(p)
}

thread_local! {
    /// This thread is looking up the next `free` ([`free`]).
    static LOOKING_UP_FREE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Frees `p` with the next `free` after this library's — the C library's, or that of an
/// allocator loaded before it (jemalloc, tcmalloc), whichever made the chunk. Looked up on
/// first use; a `free` this thread makes while looking it up (`dlsym` may free an earlier
/// error message) is skipped, and that chunk leaks: safe, and at most once per thread.
///
/// # Safety
/// `p` null or a chunk of that allocator not freed yet (free(3)).
#[inline]
pub unsafe fn free(p: *mut c_void) {
    static P: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
    let mut f = P.load(Relaxed);
    if f.is_null() {
        if LOOKING_UP_FREE.with(|l| l.replace(true)) {
            return;
        }
        // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated symbol name.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"free".as_ptr()) };
        LOOKING_UP_FREE.with(|l| l.set(false));
        if f.is_null() {
            missing("free");
        }
        P.store(f, Relaxed);
    }
    // SAFETY: `f` is the next `free` (void free(void *)); `p` is the caller's to free.
    unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void)>(f)(p) }
}

/// `Ok(r)` for a non-negative C return, else the thread's `errno`.
pub(crate) fn check(r: ssize_t) -> SysResult {
    if r < 0 {
        Err(Errno::last())
    } else {
        Ok(r as usize)
    }
}

/// The C library's `send(2)` of `buf`.
pub fn send(fd: c_int, buf: &[u8], flags: c_int) -> SysResult {
    // SAFETY: `buf` is a live slice of `buf.len()` readable bytes for the whole call.
    check(unsafe { send_fn()(fd, buf.as_ptr().cast(), buf.len(), flags) })
}

/// The C library's `sendmsg(2)` of `bufs` (no address, no control message).
pub fn sendmsg_iov(fd: c_int, bufs: &[IoSlice<'_>], flags: c_int) -> SysResult {
    // SAFETY: msghdr is plain old data; all-zero is "no name, no iov, no control".
    let mut msg: msghdr = unsafe { std::mem::zeroed() };
    // IoSlice is ABI-compatible with iovec on Unix (std's documented guarantee); the kernel
    // only reads through msg_iov.
    msg.msg_iov = bufs.as_ptr() as *mut iovec;
    msg.msg_iovlen = bufs.len();
    // SAFETY: msg and the buffers it names are live for the call and only read.
    check(unsafe { sendmsg_fn()(fd, &msg, flags) })
}

/// The C library's `sendmsg(2)` of `bufs` to `name` (a raw `sockaddr`, or none for a
/// connected socket) as one UDP GSO send: the kernel cuts the payload into datagrams of
/// `seg` bytes, the last possibly shorter (`UDP_SEGMENT`, udp(7)).
pub fn sendmsg_gso(
    fd: c_int,
    name: Option<&[u8]>,
    bufs: &[IoSlice<'_>],
    seg: u16,
    flags: c_int,
) -> SysResult {
    let mut control = [0u64; 4];
    // SAFETY: msghdr is plain old data; all-zero is "no name, no iov, no control".
    let mut msg: msghdr = unsafe { std::mem::zeroed() };
    if let Some(n) = name {
        msg.msg_name = n.as_ptr() as *mut c_void;
        msg.msg_namelen = n.len() as socklen_t;
    }
    // IoSlice is ABI-compatible with iovec on Unix (std's documented guarantee); the kernel
    // only reads through msg_iov.
    msg.msg_iov = bufs.as_ptr() as *mut iovec;
    msg.msg_iovlen = bufs.len();
    // SAFETY: CMSG_SPACE/CMSG_LEN are arithmetic on a length.
    let (space, len) = unsafe {
        (
            libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) as usize,
            libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as usize,
        )
    };
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: msg_control points at `control`, aligned for cmsghdr and larger than
    // CMSG_SPACE(2), so CMSG_FIRSTHDR is non-null and the header and its 2-byte payload
    // lie inside `control`.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = crate::raw::udp::SOL_UDP;
        (*c).cmsg_type = crate::raw::udp::UDP_SEGMENT;
        (*c).cmsg_len = len;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), seg);
    }
    // SAFETY: msg, the name, the buffers and the control buffer it names are live for the
    // call and only read by the kernel.
    check(unsafe { sendmsg_fn()(fd, &msg, flags) })
}

/// The C library's `poll(2)` of `fds`.
pub fn poll(fds: &mut [pollfd], timeout_ms: c_int) -> SysResult {
    // SAFETY: `fds` is a live, writable array of `fds.len()` pollfds.
    check(unsafe { poll_fn()(fds.as_mut_ptr(), fds.len() as nfds_t, timeout_ms) } as ssize_t)
}

/// The C library's `epoll_ctl(epfd, EPOLL_CTL_MOD, fd, {events, data})`.
pub fn epoll_modify(epfd: c_int, fd: c_int, events: u32, data: u64) -> SysResult {
    let mut ev = libc::epoll_event { events, u64: data };
    // SAFETY: `ev` is a live epoll_event for the call.
    check(unsafe { epoll_ctl_fn()(epfd, libc::EPOLL_CTL_MOD, fd, &mut ev) } as ssize_t)
}

/// The C library's `dup(2)`.
pub fn dup(fd: c_int) -> SysResult {
    // SAFETY: dup takes and returns plain integers.
    check(unsafe { dup_fn()(fd) } as ssize_t)
}

/// The C library's `close(2)`.
pub fn close(fd: c_int) -> SysResult {
    // SAFETY: close takes a plain integer; closing a descriptor this library owns.
    check(unsafe { close_fn()(fd) } as ssize_t)
}

/// An unsigned flag word as the C `int` the calls take.
pub fn flags(f: c_uint) -> c_int {
    f as c_int
}

/// Registers `f` to run at normal process exit (atexit(3)).
pub fn at_exit(f: extern "C" fn()) -> bool {
    // SAFETY: `f` is a plain function without arguments, as atexit requires.
    unsafe { libc::atexit(f) == 0 }
}

/// Runs `f` on `fd` borrowed for the call; `None` for a negative descriptor.
///
/// An interposer only sees descriptors as the application's integer arguments; this lends
/// one to the typed wrappers of [`crate::raw`] for as long as the interposed call runs. A
/// descriptor that is not open only makes those wrappers' syscalls fail with `EBADF`.
pub fn with_fd<R>(fd: c_int, f: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> R) -> Option<R> {
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is not -1 (BorrowedFd's niche); it is the application's descriptor,
    // borrowed only for the duration of `f`, inside the call that named it.
    Some(f(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }))
}
