//! The body of every exported symbol: raw C arguments in, typed views to the [`Hook`] out.
//! [`crate::export_preload!`] defines the `extern "C"` symbols that call these.
//!
//! Each function first takes the re-entrancy guard: a C call made while a hook runs on this
//! thread — by the hook itself, by the Rust standard library under it, or by zcnet's own
//! syscall wrappers, which call the C library and so land here again — goes straight to the
//! C library.

use super::hook::{
    Datagram, Errno, FdSet, Hook, MmsgCall, RawRecv, RawSend, RecvCall, SendCall, SysResult,
};
use super::real;
use crate::cow::{pages_held_anywhere, GiveBack};
use crate::reentry::Inside;
use libc::{c_int, c_void, iovec, msghdr, nfds_t, pollfd, size_t, sockaddr, socklen_t, ssize_t};
use std::io::{IoSlice, IoSliceMut};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The library stepped aside in this process for good ([`go_passive`]).
static PASSIVE: AtomicBool = AtomicBool::new(false);

/// Held while a hook runs on this thread ([`crate::reentry`]): never taken once the
/// library went passive, so that every call then is the C library's alone.
struct Guard(#[allow(dead_code)] Inside);

impl Guard {
    fn enter() -> Option<Guard> {
        if PASSIVE.load(Relaxed) {
            return None;
        }
        Inside::enter().map(Guard)
    }
}

/// From now on, in this process, every interposed call goes straight to the C library and
/// no hook runs: no system call the program did not make itself (a seccomp filter kills
/// the process for one it does not allow).
pub fn go_passive() {
    PASSIVE.store(true, Relaxed);
}

/// Whether [`go_passive`] was called.
pub fn passive() -> bool {
    PASSIVE.load(Relaxed)
}

/// Runs `f` as if inside an interposed call: C calls it makes go straight to the C library.
/// For the interposer's own threads and exit handlers, which are not inside one.
pub fn as_hook<R>(f: impl FnOnce() -> R) -> R {
    let _g = Inside::enter();
    f()
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

fn ret(r: SysResult) -> ssize_t {
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => {
            set_errno(e.0);
            -1
        }
    }
}

/// `len` bytes at `p` as a slice; `None` for a null pointer with a non-zero length or a
/// length no slice can have (the call is then forwarded as it is, for the kernel to refuse).
///
/// # Safety
/// `p` must be valid for reads of `len` bytes for `'a`, or null.
unsafe fn bytes<'a>(p: *const c_void, len: size_t) -> Option<&'a [u8]> {
    if len == 0 {
        return Some(&[]);
    }
    if p.is_null() || len > isize::MAX as usize {
        return None;
    }
    // SAFETY: the caller's contract.
    Some(unsafe { std::slice::from_raw_parts(p.cast(), len) })
}

/// # Safety
/// `p` must be valid for writes of `len` bytes for `'a`, or null.
unsafe fn bytes_mut<'a>(p: *mut c_void, len: size_t) -> Option<&'a mut [u8]> {
    if len == 0 {
        return Some(&mut []);
    }
    if p.is_null() || len > isize::MAX as usize {
        return None;
    }
    // SAFETY: the caller's contract.
    Some(unsafe { std::slice::from_raw_parts_mut(p.cast(), len) })
}

/// # Safety
/// `iov` must point at `n` iovecs, each valid for its length, or be null.
unsafe fn iovs<'a>(iov: *const iovec, n: c_int) -> Option<&'a [IoSlice<'a>]> {
    if n <= 0 || n > libc::UIO_MAXIOV || iov.is_null() {
        return None;
    }
    // SAFETY: the caller's contract.
    let raw: &[iovec] = unsafe { std::slice::from_raw_parts(iov, n as usize) };
    if raw
        .iter()
        .any(|v| v.iov_base.is_null() || v.iov_len > isize::MAX as usize)
    {
        return None;
    }
    // SAFETY: every base is non-null and valid for its length (the caller's contract);
    // IoSlice is ABI-compatible with iovec on Unix.
    Some(unsafe { std::slice::from_raw_parts(iov.cast(), n as usize) })
}

/// # Safety
/// `iov` must point at `n` iovecs, each valid for writes of its length, or be null.
unsafe fn iovs_mut<'a>(iov: *mut iovec, n: usize) -> Option<&'a mut [IoSliceMut<'a>]> {
    if n == 0 || n > libc::UIO_MAXIOV as usize || iov.is_null() {
        return None;
    }
    // SAFETY: the caller's contract.
    let raw: &[iovec] = unsafe { std::slice::from_raw_parts(iov, n) };
    if raw
        .iter()
        .any(|v| v.iov_base.is_null() || v.iov_len > isize::MAX as usize)
    {
        return None;
    }
    // SAFETY: every base is non-null and valid for writes of its length (the caller's
    // contract); IoSliceMut is ABI-compatible with iovec on Unix.
    Some(unsafe { std::slice::from_raw_parts_mut(iov.cast(), n) })
}

/// `send(2)`.
///
/// # Safety
/// The C contract of `send`: `buf` valid for `len` bytes.
pub unsafe fn send<H: Hook>(
    h: &H,
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
) -> ssize_t {
    let g = Guard::enter();
    // SAFETY: the C contract.
    let data = unsafe { bytes(buf, len) };
    match (g, data) {
        (Some(_g), Some(d)) => {
            let b = [IoSlice::new(d)];
            ret(h.send(SendCall {
                fd,
                bufs: &b,
                flags,
                extras: false,
                raw: RawSend::Send(buf, len),
            }))
        }
        // SAFETY: forwarding the application's own arguments.
        _ => unsafe { real::send_fn()(fd, buf, len, flags) },
    }
}

/// `sendto(2)`.
///
/// # Safety
/// The C contract of `sendto`.
pub unsafe fn sendto<H: Hook>(
    h: &H,
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    let g = Guard::enter();
    // SAFETY: the C contract.
    let data = unsafe { bytes(buf, len) };
    match (g, data) {
        (Some(_g), Some(d)) => {
            let b = [IoSlice::new(d)];
            let call = SendCall {
                fd,
                bufs: &b,
                flags,
                extras: !addr.is_null(),
                raw: RawSend::SendTo(buf, len, addr, alen),
            };
            ret(h.send(call))
        }
        // SAFETY: forwarding the application's own arguments.
        _ => unsafe { real::sendto_fn()(fd, buf, len, flags, addr, alen) },
    }
}

/// `sendmsg(2)`.
///
/// # Safety
/// The C contract of `sendmsg`.
pub unsafe fn sendmsg<H: Hook>(h: &H, fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    let g = Guard::enter();
    let view = if msg.is_null() {
        None
    } else {
        // SAFETY: the C contract: msg points at a msghdr whose iov is valid.
        unsafe {
            let m = &*msg;
            iovs(m.msg_iov, m.msg_iovlen as c_int)
                .map(|v| (v, !m.msg_name.is_null() || m.msg_controllen > 0))
        }
    };
    match (g, view) {
        (Some(_g), Some((bufs, extras))) => ret(h.send(SendCall {
            fd,
            bufs,
            flags,
            extras,
            raw: RawSend::SendMsg(msg),
        })),
        // SAFETY: forwarding the application's own arguments.
        _ => unsafe { real::sendmsg_fn()(fd, msg, flags) },
    }
}

/// `sendmmsg(2)`.
///
/// # Safety
/// The C contract of `sendmmsg`: `msgvec` points at `vlen` messages, each valid as for
/// `sendmsg`.
pub unsafe fn sendmmsg<H: Hook>(
    h: &H,
    fd: c_int,
    msgvec: *mut libc::mmsghdr,
    vlen: libc::c_uint,
    flags: c_int,
) -> c_int {
    let g = Guard::enter();
    // The kernel sends at most UIO_MAXIOV messages per call.
    let n = (vlen as usize).min(libc::UIO_MAXIOV as usize);
    let view = if msgvec.is_null() || n == 0 {
        None
    } else {
        let mut v = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: the C contract: msgvec points at vlen messages.
            let m = unsafe { &(*msgvec.add(i)).msg_hdr };
            let bufs = if m.msg_iovlen == 0 {
                Some(&[][..])
            } else {
                // SAFETY: the C contract: each message's iov is valid.
                unsafe { iovs(m.msg_iov, m.msg_iovlen as c_int) }
            };
            let name = if m.msg_name.is_null() {
                Some(None)
            } else {
                // SAFETY: the C contract: msg_name is valid for msg_namelen bytes.
                unsafe { bytes(m.msg_name, m.msg_namelen as size_t) }.map(Some)
            };
            match (bufs, name) {
                (Some(bufs), Some(name)) => v.push(Datagram {
                    name,
                    bufs,
                    control: m.msg_controllen > 0,
                }),
                _ => break,
            }
        }
        // A message the views cannot describe: the whole call goes to the kernel as it is.
        (v.len() == n).then_some(v)
    };
    match (g, view) {
        (Some(_g), Some(msgs)) => ret(h.send_mmsg(MmsgCall {
            fd,
            msgs,
            flags,
            raw: msgvec,
        })) as c_int,
        // SAFETY: forwarding the application's own arguments.
        _ => unsafe { real::sendmmsg_fn()(fd, msgvec, vlen, flags) },
    }
}

/// `write(2)`.
///
/// # Safety
/// The C contract of `write`.
pub unsafe fn write<H: Hook>(h: &H, fd: c_int, buf: *const c_void, len: size_t) -> ssize_t {
    let g = Guard::enter();
    // SAFETY: the C contract.
    let data = unsafe { bytes(buf, len) };
    match (g, data) {
        (Some(_g), Some(d)) => {
            let b = [IoSlice::new(d)];
            ret(h.send(SendCall {
                fd,
                bufs: &b,
                flags: 0,
                extras: false,
                raw: RawSend::Write(buf, len),
            }))
        }
        // SAFETY: forwarding the application's own arguments.
        _ => unsafe { real::write_fn()(fd, buf, len) },
    }
}

/// `writev(2)`.
///
/// # Safety
/// The C contract of `writev`.
pub unsafe fn writev<H: Hook>(h: &H, fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    let g = Guard::enter();
    // SAFETY: the C contract.
    let view = unsafe { iovs(iov, n) };
    match (g, view) {
        (Some(_g), Some(bufs)) => ret(h.send(SendCall {
            fd,
            bufs,
            flags: 0,
            extras: false,
            raw: RawSend::Writev(iov, n),
        })),
        // SAFETY: forwarding the application's own arguments.
        _ => unsafe { real::writev_fn()(fd, iov, n) },
    }
}

/// A one-buffer receive call.
///
/// # Safety
/// `buf` valid for writes of `len` bytes (the C contract of the call `raw` names), and
/// `raw`'s pointers valid for the call.
unsafe fn recv_one<H: Hook>(
    h: &H,
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    raw: RawRecv,
) -> Option<ssize_t> {
    if !h.detours_receives() {
        return None;
    }
    let _g = Guard::enter()?;
    // SAFETY: the caller's contract.
    let data = unsafe { bytes_mut(buf, len) }?;
    let mut b = [IoSliceMut::new(data)];
    Some(ret(h.recv(RecvCall {
        fd,
        bufs: &mut b,
        raw,
    })))
}

/// `read(2)`.
///
/// # Safety
/// The C contract of `read`.
pub unsafe fn read<H: Hook>(h: &H, fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t {
    // SAFETY: the C contract.
    unsafe {
        recv_one(h, fd, buf, len, RawRecv::Read).unwrap_or_else(|| real::read_fn()(fd, buf, len))
    }
}

/// `pread(2)` (and `pread64`: one function on 64-bit Linux).
///
/// # Safety
/// The C contract of `pread`.
pub unsafe fn pread<H: Hook>(
    h: &H,
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    off: libc::off64_t,
) -> ssize_t {
    // SAFETY: the C contract.
    unsafe {
        recv_one(h, fd, buf, len, RawRecv::Pread(off))
            .unwrap_or_else(|| real::pread64_fn()(fd, buf, len, off))
    }
}

/// `__pread64_chk` / `__pread_chk`.
///
/// # Safety
/// The C contract of `__pread64_chk`.
pub unsafe fn pread_chk<H: Hook>(
    h: &H,
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    off: libc::off64_t,
    buflen: size_t,
) -> ssize_t {
    if len > buflen {
        // SAFETY: the C library reports the overflow (it aborts).
        return unsafe { real::pread64_chk_fn()(fd, buf, len, off, buflen) };
    }
    // SAFETY: the C contract.
    unsafe { pread(h, fd, buf, len, off) }
}

/// `preadv(2)` (and `preadv64`).
///
/// # Safety
/// The C contract of `preadv`.
pub unsafe fn preadv<H: Hook>(
    h: &H,
    fd: c_int,
    iov: *const iovec,
    n: c_int,
    off: libc::off64_t,
) -> ssize_t {
    if let Some(_g) = Guard::enter().filter(|_| h.detours_receives()) {
        // SAFETY: the C contract: the iovecs name writable buffers.
        if let Some(bufs) = unsafe { iovs_mut(iov as *mut iovec, n.max(0) as usize) } {
            return ret(h.recv(RecvCall {
                fd,
                bufs,
                raw: RawRecv::Preadv(off),
            }));
        }
    }
    // SAFETY: forwarding the application's own arguments.
    unsafe { real::preadv64_fn()(fd, iov, n, off) }
}

/// `__read_chk` (`read` under `_FORTIFY_SOURCE`).
///
/// # Safety
/// The C contract of `__read_chk`.
pub unsafe fn read_chk<H: Hook>(
    h: &H,
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    buflen: size_t,
) -> ssize_t {
    if len > buflen {
        // SAFETY: the C library reports the overflow (it aborts).
        return unsafe { real::read_chk_fn()(fd, buf, len, buflen) };
    }
    // SAFETY: the C contract.
    unsafe { read(h, fd, buf, len) }
}

/// `recv(2)`.
///
/// # Safety
/// The C contract of `recv`.
pub unsafe fn recv<H: Hook>(
    h: &H,
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: the C contract.
    unsafe {
        recv_one(h, fd, buf, len, RawRecv::Recv(flags))
            .unwrap_or_else(|| real::recv_fn()(fd, buf, len, flags))
    }
}

/// `__recv_chk`.
///
/// # Safety
/// The C contract of `__recv_chk`.
pub unsafe fn recv_chk<H: Hook>(
    h: &H,
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    if len > buflen {
        // SAFETY: the C library reports the overflow (it aborts).
        return unsafe { real::recv_chk_fn()(fd, buf, len, buflen, flags) };
    }
    // SAFETY: the C contract.
    unsafe { recv(h, fd, buf, len, flags) }
}

/// `recvfrom(2)`.
///
/// # Safety
/// The C contract of `recvfrom`.
pub unsafe fn recvfrom<H: Hook>(
    h: &H,
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    // SAFETY: the C contract.
    unsafe {
        recv_one(h, fd, buf, len, RawRecv::RecvFrom(flags, addr, alen))
            .unwrap_or_else(|| real::recvfrom_fn()(fd, buf, len, flags, addr, alen))
    }
}

/// `__recvfrom_chk`.
///
/// # Safety
/// The C contract of `__recvfrom_chk`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn recvfrom_chk<H: Hook>(
    h: &H,
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    if len > buflen {
        // SAFETY: the C library reports the overflow (it aborts).
        return unsafe { real::recvfrom_chk_fn()(fd, buf, len, buflen, flags, addr, alen) };
    }
    // SAFETY: the C contract.
    unsafe { recvfrom(h, fd, buf, len, flags, addr, alen) }
}

/// `readv(2)`.
///
/// # Safety
/// The C contract of `readv`.
pub unsafe fn readv<H: Hook>(h: &H, fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    if let Some(_g) = Guard::enter().filter(|_| h.detours_receives()) {
        // SAFETY: the C contract: the iovecs name writable buffers.
        if let Some(bufs) = unsafe { iovs_mut(iov as *mut iovec, n.max(0) as usize) } {
            return ret(h.recv(RecvCall {
                fd,
                bufs,
                raw: RawRecv::Readv,
            }));
        }
    }
    // SAFETY: forwarding the application's own arguments.
    unsafe { real::readv_fn()(fd, iov, n) }
}

/// `recvmsg(2)`.
///
/// # Safety
/// The C contract of `recvmsg`.
pub unsafe fn recvmsg<H: Hook>(h: &H, fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    if let Some(_g) = Guard::enter() {
        if flags & libc::MSG_ERRQUEUE != 0 {
            h.before_error_read(fd);
        } else if !msg.is_null() && h.detours_receives() {
            // SAFETY: the C contract: msg points at a msghdr whose iov names writable buffers.
            let bufs = unsafe { iovs_mut((*msg).msg_iov, (*msg).msg_iovlen) };
            if let Some(bufs) = bufs {
                return ret(h.recv(RecvCall {
                    fd,
                    bufs,
                    raw: RawRecv::RecvMsg(msg, flags),
                }));
            }
        }
    }
    // SAFETY: forwarding the application's own arguments.
    unsafe { real::recvmsg_fn()(fd, msg, flags) }
}

/// What is left of a timeout that started at `start` (not started yet: all of it); `None`
/// for "forever".
fn remaining(start: Option<Instant>, total: Option<Duration>) -> Option<Duration> {
    total.map(|t| t.saturating_sub(start.map_or(Duration::ZERO, |s| s.elapsed())))
}

/// When a readiness call started, if the hook may hide what it returns
/// ([`Hook::hides_readiness`]): the clock is read only then, since only then may the call
/// be made again for the rest of its timeout. A hook that starts hiding while the call
/// waits (another thread's first zero-copy send) gets a start from the moment it returned:
/// the call then waits at most its timeout again, once.
fn started<H: Hook>(h: &H, start: &mut Option<Instant>) -> bool {
    if start.is_none() && h.hides_readiness() {
        *start = Some(Instant::now());
    }
    start.is_some()
}

fn ms(d: Option<Duration>) -> c_int {
    d.map_or(-1, |d| d.as_millis().min(c_int::MAX as u128) as c_int)
}

/// # Safety
/// `fds` valid for `n` pollfds.
unsafe fn poll_filtered<H: Hook>(
    h: &H,
    fds: *mut pollfd,
    n: nfds_t,
    timeout: Option<Duration>,
    mut call: impl FnMut(Option<Duration>) -> c_int,
) -> c_int {
    let Some(_g) = Guard::enter() else {
        return call(timeout);
    };
    let mut start = None;
    started(h, &mut start);
    loop {
        let r = call(remaining(start, timeout));
        if r <= 0 || fds.is_null() || !started(h, &mut start) {
            return r;
        }
        // SAFETY: the C contract: fds points at n pollfds.
        let view = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
        let left = h.after_poll(view, r as usize);
        if left > 0 || remaining(start, timeout) == Some(Duration::ZERO) {
            return left as c_int;
        }
    }
}

/// `poll(2)`.
///
/// # Safety
/// The C contract of `poll`.
pub unsafe fn poll<H: Hook>(h: &H, fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    let t = (timeout >= 0).then(|| Duration::from_millis(timeout as u64));
    // SAFETY: the C contract; the closure forwards the application's arguments.
    unsafe { poll_filtered(h, fds, n, t, |t| real::poll_fn()(fds, n, ms(t))) }
}

/// `__poll_chk`.
///
/// # Safety
/// The C contract of `__poll_chk`.
pub unsafe fn poll_chk<H: Hook>(
    h: &H,
    fds: *mut pollfd,
    n: nfds_t,
    timeout: c_int,
    fdslen: size_t,
) -> c_int {
    if (fdslen / std::mem::size_of::<pollfd>()) < n as usize {
        // SAFETY: the C library reports the overflow (it aborts).
        return unsafe { real::poll_chk_fn()(fds, n, timeout, fdslen) };
    }
    // SAFETY: the C contract.
    unsafe { poll(h, fds, n, timeout) }
}

fn ts(t: *const libc::timespec) -> Option<Duration> {
    if t.is_null() {
        return None;
    }
    // SAFETY: the application passed a readable timespec (the C contract of the call).
    let t = unsafe { *t };
    Some(Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    ))
}

fn to_ts(d: Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: d.as_secs() as libc::time_t,
        tv_nsec: d.subsec_nanos() as _,
    }
}

/// `ppoll(2)`.
///
/// # Safety
/// The C contract of `ppoll`.
pub unsafe fn ppoll<H: Hook>(
    h: &H,
    fds: *mut pollfd,
    n: nfds_t,
    t: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    let timeout = ts(t);
    let call = |left: Option<Duration>| {
        let spec = left.map(to_ts);
        let p = spec.as_ref().map_or(std::ptr::null(), |s| s as *const _);
        // SAFETY: the application's arguments, with a timeout of our own (or none).
        unsafe { real::ppoll_fn()(fds, n, p, mask) }
    };
    // SAFETY: the C contract.
    unsafe { poll_filtered(h, fds, n, timeout, call) }
}

/// # Safety
/// `events` valid for `max` epoll_events.
unsafe fn epoll_filtered<H: Hook>(
    h: &H,
    epfd: c_int,
    events: *mut libc::epoll_event,
    timeout: c_int,
    mut call: impl FnMut(c_int) -> c_int,
) -> c_int {
    let total = (timeout >= 0).then(|| Duration::from_millis(timeout as u64));
    let Some(_g) = Guard::enter() else {
        return call(timeout);
    };
    let mut start = None;
    started(h, &mut start);
    loop {
        let r = call(ms(remaining(start, total)));
        if r <= 0 || !started(h, &mut start) {
            return r;
        }
        // SAFETY: the kernel filled the first r entries of the application's array.
        let view = unsafe { std::slice::from_raw_parts_mut(events, r as usize) };
        let left = h.after_epoll(epfd, view);
        if left > 0 || remaining(start, total) == Some(Duration::ZERO) {
            return left as c_int;
        }
    }
}

/// `epoll_wait(2)`.
///
/// # Safety
/// The C contract of `epoll_wait`.
pub unsafe fn epoll_wait<H: Hook>(
    h: &H,
    epfd: c_int,
    events: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    // SAFETY: the C contract; the closure forwards the application's arguments.
    unsafe {
        epoll_filtered(h, epfd, events, timeout, |t| {
            real::epoll_wait_fn()(epfd, events, max, t)
        })
    }
}

/// `epoll_pwait(2)`.
///
/// # Safety
/// The C contract of `epoll_pwait`.
pub unsafe fn epoll_pwait<H: Hook>(
    h: &H,
    epfd: c_int,
    events: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: the C contract; the closure forwards the application's arguments.
    unsafe {
        epoll_filtered(h, epfd, events, timeout, |t| {
            real::epoll_pwait_fn()(epfd, events, max, t, mask)
        })
    }
}

/// `epoll_ctl(2)`.
///
/// # Safety
/// The C contract of `epoll_ctl`.
pub unsafe fn epoll_ctl<H: Hook>(
    h: &H,
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut libc::epoll_event,
) -> c_int {
    // SAFETY: forwarding the application's own arguments.
    let r = unsafe { real::epoll_ctl_fn()(epfd, op, fd, ev) };
    if r == 0 {
        if let Some(_g) = Guard::enter() {
            // SAFETY: the application's event, read (unaligned: the struct is packed).
            let e = (!ev.is_null()).then(|| unsafe { std::ptr::read_unaligned(ev) });
            h.epoll_ctl(epfd, op, fd, e.map(|e| (e.events, e.u64)));
        }
    }
    r
}

/// # Safety
/// Each set null or valid.
unsafe fn select_filtered<H: Hook>(
    h: &H,
    nfds: c_int,
    sets: [*mut libc::fd_set; 3],
    timeout: Option<Duration>,
    mut call: impl FnMut(Option<Duration>) -> c_int,
) -> c_int {
    let Some(_g) = Guard::enter() else {
        return call(timeout);
    };
    let mut start = None;
    started(h, &mut start);
    // SAFETY: the C contract: each non-null set is a readable fd_set.
    let saved: [Option<libc::fd_set>; 3] = sets.map(|s| (!s.is_null()).then(|| unsafe { *s }));
    loop {
        let r = call(remaining(start, timeout));
        if r <= 0 || !started(h, &mut start) {
            return r;
        }
        // SAFETY: the C contract: each non-null set is a writable fd_set, distinct or not
        // (FdSet borrows are used one at a time by the hook's reads and writes).
        let mut views = sets.map(|s| (!s.is_null()).then(|| FdSet(unsafe { &mut *s })));
        let [r_, w_, e_] = &mut views;
        let left = h.after_select(nfds, r_.as_mut(), w_.as_mut(), e_.as_mut(), r as usize);
        if left > 0 || remaining(start, timeout) == Some(Duration::ZERO) {
            return left as c_int;
        }
        for (s, v) in sets.iter().zip(saved.iter()) {
            if let Some(v) = v {
                // SAFETY: restoring the application's set before waiting again.
                unsafe { **s = *v };
            }
        }
    }
}

/// `select(2)`.
///
/// # Safety
/// The C contract of `select`.
pub unsafe fn select<H: Hook>(
    h: &H,
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    t: *mut libc::timeval,
) -> c_int {
    let timeout = (!t.is_null()).then(|| {
        // SAFETY: the application passed a readable timeval.
        let tv = unsafe { *t };
        Duration::from_micros(tv.tv_sec.max(0) as u64 * 1_000_000 + tv.tv_usec.max(0) as u64)
    });
    let call = |left: Option<Duration>| {
        if let Some(d) = left {
            // SAFETY: select(2) on Linux writes the time left back into the caller's timeval;
            // this writes our remaining time there, as the kernel would.
            unsafe {
                *t = libc::timeval {
                    tv_sec: d.as_secs() as _,
                    tv_usec: d.subsec_micros() as _,
                };
            }
        }
        // SAFETY: the application's arguments.
        unsafe { real::select_fn()(nfds, r, w, e, t) }
    };
    // SAFETY: the C contract.
    unsafe { select_filtered(h, nfds, [r, w, e], timeout, call) }
}

/// `pselect(2)`.
///
/// # Safety
/// The C contract of `pselect`.
pub unsafe fn pselect<H: Hook>(
    h: &H,
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    t: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    let call = |left: Option<Duration>| {
        let spec = left.map(to_ts);
        let p = spec.as_ref().map_or(std::ptr::null(), |s| s as *const _);
        // SAFETY: the application's arguments, with a timeout of our own (or none).
        unsafe { real::pselect_fn()(nfds, r, w, e, p, mask) }
    };
    // SAFETY: the C contract.
    unsafe { select_filtered(h, nfds, [r, w, e], ts(t), call) }
}

/// `getsockopt(2)`.
///
/// # Safety
/// The C contract of `getsockopt`.
pub unsafe fn getsockopt<H: Hook>(
    h: &H,
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    if level == libc::SOL_SOCKET && name == libc::SO_ERROR {
        if let Some(_g) = Guard::enter() {
            h.before_error_read(fd);
        }
    }
    // SAFETY: forwarding the application's own arguments.
    unsafe { real::getsockopt_fn()(fd, level, name, val, len) }
}

/// `setsockopt(2)`.
///
/// # Safety
/// The C contract of `setsockopt`.
pub unsafe fn setsockopt<H: Hook>(
    h: &H,
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    // SAFETY: forwarding the application's own arguments.
    let r = unsafe { real::setsockopt_fn()(fd, level, name, val, len) };
    if r == 0 {
        if let Some(_g) = Guard::enter() {
            let v = (!val.is_null() && len as usize >= std::mem::size_of::<c_int>())
                // SAFETY: the application passed at least an int's worth of readable bytes.
                .then(|| unsafe { std::ptr::read_unaligned(val.cast::<c_int>()) });
            h.after_setsockopt(fd, level, name, v);
        }
    }
    r
}

/// `close(2)`.
///
/// # Safety
/// None beyond `close`'s.
pub unsafe fn close<H: Hook>(h: &H, fd: c_int) -> c_int {
    if let Some(_g) = Guard::enter() {
        h.before_close(fd);
    }
    // SAFETY: forwarding the application's own argument.
    unsafe { real::close_fn()(fd) }
}

fn new_dup<H: Hook>(h: &H, old: c_int, r: c_int) -> c_int {
    if r >= 0 {
        if let Some(_g) = Guard::enter() {
            h.new_dup(old, r);
        }
    }
    r
}

/// `dup(2)`.
///
/// # Safety
/// None beyond `dup`'s.
pub unsafe fn dup<H: Hook>(h: &H, fd: c_int) -> c_int {
    // SAFETY: forwarding the application's own argument.
    new_dup(h, fd, unsafe { real::dup_fn()(fd) })
}

/// `dup2(2)`.
///
/// # Safety
/// None beyond `dup2`'s.
pub unsafe fn dup2<H: Hook>(h: &H, old: c_int, new: c_int) -> c_int {
    if old != new {
        if let Some(_g) = Guard::enter() {
            h.before_close(new);
        }
    }
    // SAFETY: forwarding the application's own arguments.
    new_dup(h, old, unsafe { real::dup2_fn()(old, new) })
}

/// `dup3(2)`.
///
/// # Safety
/// None beyond `dup3`'s.
pub unsafe fn dup3<H: Hook>(h: &H, old: c_int, new: c_int, flags: c_int) -> c_int {
    if old != new {
        if let Some(_g) = Guard::enter() {
            h.before_close(new);
        }
    }
    // SAFETY: forwarding the application's own arguments.
    new_dup(h, old, unsafe { real::dup3_fn()(old, new, flags) })
}

/// `socket(2)`.
///
/// # Safety
/// None beyond `socket`'s.
pub unsafe fn socket<H: Hook>(h: &H, domain: c_int, ty: c_int, proto: c_int) -> c_int {
    // SAFETY: forwarding the application's own arguments.
    let r = unsafe { real::socket_fn()(domain, ty, proto) };
    if r >= 0 {
        if let Some(_g) = Guard::enter() {
            h.new_socket(r, domain, ty, proto);
        }
    }
    r
}

/// `socketpair(2)`.
///
/// # Safety
/// The C contract of `socketpair`: `sv` points at two ints.
pub unsafe fn socketpair<H: Hook>(
    h: &H,
    domain: c_int,
    ty: c_int,
    proto: c_int,
    sv: *mut c_int,
) -> c_int {
    // SAFETY: forwarding the application's own arguments.
    let r = unsafe { real::socketpair_fn()(domain, ty, proto, sv) };
    if r == 0 && !sv.is_null() {
        if let Some(_g) = Guard::enter() {
            // SAFETY: the call succeeded, so the kernel wrote both descriptors there.
            let (a, b) = unsafe { (*sv, *sv.add(1)) };
            h.new_socket(a, domain, ty, proto);
            h.new_socket(b, domain, ty, proto);
        }
    }
    r
}

fn accepted<H: Hook>(h: &H, listener: c_int, r: c_int) -> c_int {
    if r >= 0 {
        if let Some(_g) = Guard::enter() {
            h.accepted(listener, r);
        }
    }
    r
}

/// A seccomp filter is about to be installed: the hook finishes what it must while it may
/// still make its own system calls, and the library goes passive before the filter is in
/// force (and stays so if the call fails: the program may try another filter).
fn filter_coming<H: Hook>(h: &H) {
    if let Some(_g) = Guard::enter() {
        h.before_seccomp();
    }
    go_passive();
}

/// `prctl(2)`: `PR_SET_SECCOMP` installs a seccomp filter (or strict mode).
///
/// # Safety
/// The C contract of `prctl` for `option` (the C prototype is variadic; every option
/// takes at most four more `unsigned long`s, passed in registers as these are).
pub unsafe fn prctl<H: Hook>(
    h: &H,
    option: c_int,
    a: libc::c_ulong,
    b: libc::c_ulong,
    c: libc::c_ulong,
    d: libc::c_ulong,
) -> c_int {
    if option == libc::PR_SET_SECCOMP {
        filter_coming(h);
    }
    // SAFETY: forwarding the application's own arguments.
    unsafe { real::prctl_fn()(option, a, b, c, d) }
}

/// `syscall(3)`: `SYS_seccomp` (libseccomp's way) and `SYS_prctl` with `PR_SET_SECCOMP`
/// install a seccomp filter; every other call is forwarded untouched.
///
/// # Safety
/// The C contract of `syscall` for number `n` (variadic in C; the kernel takes at most
/// six `long`s, which the C library's `syscall` reads from the same registers and stack
/// slot whether or not the caller passed them).
#[allow(clippy::too_many_arguments)]
pub unsafe fn syscall<H: Hook>(
    h: &H,
    n: libc::c_long,
    a: libc::c_long,
    b: libc::c_long,
    c: libc::c_long,
    d: libc::c_long,
    e: libc::c_long,
    f: libc::c_long,
) -> libc::c_long {
    let op = |v: u32| a == libc::c_long::from(v);
    let seccomp = (n == libc::SYS_seccomp
        && (op(SECCOMP_SET_MODE_FILTER) || op(SECCOMP_SET_MODE_STRICT)))
        || (n == libc::SYS_prctl && a == libc::c_long::from(libc::PR_SET_SECCOMP));
    if seccomp {
        filter_coming(h);
    }
    if n == libc::SYS_io_uring_setup {
        ring_coming(h);
    }
    // SAFETY: forwarding the application's own arguments.
    unsafe { real::syscall_fn()(n, a, b, c, d, e, f) }
}

/// An `io_uring` ring is about to be made ([`Hook::before_io_uring`]).
fn ring_coming<H: Hook>(h: &H) {
    if let Some(_g) = Guard::enter() {
        h.before_io_uring();
    }
}

/// liburing's ring set-up calls (`io_uring_queue_init`, `_params`, `_mem`, and its
/// `io_uring_setup` wrapper): liburing makes its system calls itself, so these are the only
/// calls of a program using it that this library can see before the ring exists. The hook
/// runs, then liburing's own function; without one, `-ENOSYS` (liburing's way of failing).
///
/// # Safety
/// The C contract of liburing's function `f`, whose arguments are `args` (at most five
/// machine words: `unsigned`, pointers and a `size_t`, passed as their C types are).
pub unsafe fn uring_setup<H: Hook>(h: &H, f: real::UringFn, args: [usize; 5]) -> c_int {
    ring_coming(h);
    let Some(p) = real::uring_fn(f) else {
        return -libc::ENOSYS;
    };
    let [a, b, c, d, e] = args;
    let (entries, a1) = (a as libc::c_uint, b as *mut c_void);
    type Init = unsafe extern "C" fn(libc::c_uint, *mut c_void, libc::c_uint) -> c_int;
    type Params = unsafe extern "C" fn(libc::c_uint, *mut c_void, *mut c_void) -> c_int;
    type Mem =
        unsafe extern "C" fn(libc::c_uint, *mut c_void, *mut c_void, *mut c_void, size_t) -> c_int;
    type Setup = unsafe extern "C" fn(libc::c_uint, *mut c_void) -> c_int;
    // SAFETY: (each arm) `p` is liburing's function of that name, whose prototype
    // (liburing.h) is the pointer type it is cast to; the arguments are the caller's own,
    // narrowed back to the C types they were passed as.
    unsafe {
        match f {
            real::UringFn::QueueInit => {
                std::mem::transmute::<*mut c_void, Init>(p)(entries, a1, c as libc::c_uint)
            }
            real::UringFn::QueueInitParams => {
                std::mem::transmute::<*mut c_void, Params>(p)(entries, a1, c as *mut c_void)
            }
            real::UringFn::QueueInitMem => std::mem::transmute::<*mut c_void, Mem>(p)(
                entries,
                a1,
                c as *mut c_void,
                d as *mut c_void,
                e,
            ),
            real::UringFn::Setup => std::mem::transmute::<*mut c_void, Setup>(p)(entries, a1),
        }
    }
}

/// `seccomp(2)` operations that install a filter or strict mode (linux/seccomp.h).
const SECCOMP_SET_MODE_STRICT: u32 = 0;
const SECCOMP_SET_MODE_FILTER: u32 = 1;

/// The seccomp mode of this process from `/proc/self/status` (`Seccomp:` — 0 none,
/// 1 strict, 2 filter), read with the library's own system calls; `None` if unreadable.
pub fn seccomp_mode() -> Option<u32> {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::open(
        "/proc/self/status",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let mut buf = [0u8; 4096];
    let mut len = 0;
    while len < buf.len() {
        match rustix::io::read(&fd, &mut buf[len..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => len += n,
        }
    }
    seccomp_field(std::str::from_utf8(&buf[..len]).ok()?)
}

/// The `Seccomp:` field of a `/proc/PID/status` text (proc(5)).
pub fn seccomp_field(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .and_then(|v| v.trim().parse().ok())
}

/// `accept(2)`.
///
/// # Safety
/// The C contract of `accept`.
pub unsafe fn accept<H: Hook>(h: &H, fd: c_int, a: *mut sockaddr, l: *mut socklen_t) -> c_int {
    // SAFETY: forwarding the application's own arguments.
    accepted(h, fd, unsafe { real::accept_fn()(fd, a, l) })
}

/// `accept4(2)`.
///
/// # Safety
/// The C contract of `accept4`.
pub unsafe fn accept4<H: Hook>(
    h: &H,
    fd: c_int,
    a: *mut sockaddr,
    l: *mut socklen_t,
    f: c_int,
) -> c_int {
    // SAFETY: forwarding the application's own arguments.
    accepted(h, fd, unsafe { real::accept4_fn()(fd, a, l, f) })
}

/// The library was loaded (from its `.init_array` entry).
///
/// A process already under a seccomp filter (inherited across `exec`: systemd's
/// `SystemCallFilter=`, a container runtime's profile) gets a passive library at once: the
/// filter may kill it for any system call the program would not make itself.
pub fn init<H: Hook>(h: &H) {
    if let Some(_g) = Guard::enter() {
        let filtered = seccomp_mode().is_some_and(|m| m != 0);
        h.init(filtered);
        if filtered {
            go_passive();
        }
    }
}

type Cstr = *const libc::c_char;

/// Runs an `exec` family call between [`Hook::before_exec`] and, if it returns (it
/// failed), [`Hook::exec_failed`]. The caller gets the C library's `-1` and `errno`,
/// whatever the hook did after it.
fn exec<H: Hook>(h: &H, call: impl FnOnce() -> c_int) -> c_int {
    if let Some(_g) = Guard::enter() {
        h.before_exec();
    }
    let r = call();
    let errno = Errno::last();
    if let Some(_g) = Guard::enter() {
        h.exec_failed();
    }
    set_errno(errno.0);
    r
}

/// `execve(2)`.
///
/// # Safety
/// The C contract of `execve`.
pub unsafe fn execve<H: Hook>(h: &H, path: Cstr, argv: *const Cstr, envp: *const Cstr) -> c_int {
    // SAFETY: forwarding the application's own arguments.
    exec(h, || unsafe { real::execve_fn()(path, argv, envp) })
}

/// `execv(3)`.
///
/// # Safety
/// The C contract of `execv`.
pub unsafe fn execv<H: Hook>(h: &H, path: Cstr, argv: *const Cstr) -> c_int {
    // SAFETY: forwarding the application's own arguments.
    exec(h, || unsafe { real::execv_fn()(path, argv) })
}

/// `execvp(3)`.
///
/// # Safety
/// The C contract of `execvp`.
pub unsafe fn execvp<H: Hook>(h: &H, file: Cstr, argv: *const Cstr) -> c_int {
    // SAFETY: forwarding the application's own arguments.
    exec(h, || unsafe { real::execvp_fn()(file, argv) })
}

/// `execvpe(3)`.
///
/// # Safety
/// The C contract of `execvpe`.
pub unsafe fn execvpe<H: Hook>(h: &H, file: Cstr, argv: *const Cstr, envp: *const Cstr) -> c_int {
    // SAFETY: forwarding the application's own arguments.
    exec(h, || unsafe { real::execvpe_fn()(file, argv, envp) })
}

/// `fexecve(3)`: glibc's reaches the kernel through `execveat` (or its internal `execve`),
/// which no interposer sees, so it is interposed itself.
///
/// # Safety
/// The C contract of `fexecve`.
pub unsafe fn fexecve<H: Hook>(h: &H, fd: c_int, argv: *const Cstr, envp: *const Cstr) -> c_int {
    // SAFETY: forwarding the application's own arguments.
    exec(h, || unsafe { real::fexecve_fn()(fd, argv, envp) })
}

/// `execl(3)`: its argument list, laid out by [`crate::exec_list_trampoline!`] as the
/// NULL-terminated array `execv` takes, goes to [`execv`], as glibc's `execl` goes to
/// `execve` with `environ`.
///
/// # Safety
/// `path` as for `execv`; `argv` a NULL-terminated array of C strings.
pub unsafe fn execl<H: Hook>(h: &H, path: Cstr, argv: *const Cstr) -> c_int {
    // SAFETY: the caller's contract is `execv`'s.
    unsafe { execv(h, path, argv) }
}

/// `execlp(3)`: as [`execl`], through [`execvp`]'s search of `PATH`.
///
/// # Safety
/// `file` as for `execvp`; `argv` a NULL-terminated array of C strings.
pub unsafe fn execlp<H: Hook>(h: &H, file: Cstr, argv: *const Cstr) -> c_int {
    // SAFETY: the caller's contract is `execvp`'s.
    unsafe { execvp(h, file, argv) }
}

/// `execle(3)`: as [`execl`], with the environment the caller passed after the list's
/// NULL ([`list_envp`]), through [`execve`].
///
/// # Safety
/// `path` as for `execve`; `argv` a NULL-terminated array of C strings followed by the
/// environment's array pointer.
pub unsafe fn execle<H: Hook>(h: &H, path: Cstr, argv: *const Cstr) -> c_int {
    // SAFETY: the caller's contract.
    match unsafe { list_envp(argv) } {
        // SAFETY: the caller's contract is `execve`'s.
        Some(envp) => unsafe { execve(h, path, argv, envp) },
        None => {
            set_errno(libc::E2BIG);
            -1
        }
    }
}

/// The pointer `execle`'s caller passed after the NULL that ends its argument list: its
/// environment. Reads the list up to that NULL and the one slot after it, nothing more;
/// `None` (`E2BIG`) for a list of `c_int::MAX` arguments or more, glibc's own bound, which
/// the kernel's limit on an argument list (execve(2), "Limits on size of arguments and
/// environment") is far below anyway.
///
/// # Safety
/// `argv` must be a NULL-terminated array of pointers followed by one more pointer.
pub unsafe fn list_envp(argv: *const Cstr) -> Option<*const Cstr> {
    let mut i = 0usize;
    // SAFETY: every slot up to and including the NULL is the caller's list.
    while !unsafe { *argv.add(i) }.is_null() {
        i += 1;
        if i >= c_int::MAX as usize {
            return None;
        }
    }
    // SAFETY: the slot after the NULL is the caller's environment pointer.
    Some(unsafe { *argv.add(i + 1) }.cast())
}

/// Fills the application's `len` bytes at `buf` with `fill` — a C library call the kernel
/// writes for — directly, or, while [`Hook::kernel_write_blocked`] says the kernel cannot
/// write there, into scratch memory copied in by user-mode writes. `fill` returns the
/// call's result and the bytes it wrote.
///
/// # Safety
/// `buf` valid for writes of `len` bytes, or null.
unsafe fn into_app<H: Hook, R>(
    h: &H,
    buf: *mut c_void,
    len: size_t,
    fill: impl Fn(*mut c_void) -> (R, usize),
) -> R {
    if let Some(_g) = Guard::enter() {
        // SAFETY: the caller's contract.
        if let Some(b) = unsafe { bytes_mut(buf, len) } {
            if h.kernel_write_blocked(b) {
                let mut scratch = vec![0u8; len];
                let (r, n) = fill(scratch.as_mut_ptr().cast());
                let n = n.min(len);
                b[..n].copy_from_slice(&scratch[..n]);
                h.detoured();
                return r;
            }
        }
    }
    fill(buf).0
}

/// `getrandom(2)`.
///
/// # Safety
/// The C contract of `getrandom`.
pub unsafe fn getrandom<H: Hook>(
    h: &H,
    buf: *mut c_void,
    len: size_t,
    flags: libc::c_uint,
) -> ssize_t {
    // SAFETY: the C contract; `fill` gets `buf` or scratch of the same length.
    unsafe {
        into_app(h, buf, len, |p| {
            let r = real::getrandom_fn()(p, len, flags);
            (r, r.max(0) as usize)
        })
    }
}

/// `fread(3)` and `fread_unlocked(3)` (`unlocked`): stdio reads into the application's
/// buffer with the C library's internal `read`, which no interposer sees.
///
/// # Safety
/// The C contract of `fread`.
pub unsafe fn fread<H: Hook>(
    h: &H,
    buf: *mut c_void,
    size: size_t,
    n: size_t,
    f: *mut libc::FILE,
    unlocked: bool,
) -> size_t {
    let call = |p: *mut c_void| {
        // SAFETY: the application's stream and item counts, into `buf` or scratch of the
        // same length.
        let k = unsafe {
            if unlocked {
                real::fread_unlocked_fn()(p, size, n, f)
            } else {
                real::fread_fn()(p, size, n, f)
            }
        };
        (k, k.saturating_mul(size))
    };
    match size.checked_mul(n) {
        // SAFETY: the C contract: `buf` holds `size * n` bytes.
        Some(len) => unsafe { into_app(h, buf, len, call) },
        None => call(buf).0,
    }
}

/// `free(3)`: before the chunk goes back to the allocator, the hook lets go of any page of
/// it a zero-copy send still holds ([`Hook::giving_back`]). The library's own frees (and
/// every free while nothing is held) go straight on.
///
/// # Safety
/// The C contract of `free`.
#[inline]
pub unsafe fn free<H: Hook>(h: &H, p: *mut c_void) {
    if !p.is_null() && pages_held_anywhere() && !PASSIVE.load(Relaxed) && h.holds_pages() {
        if let Some(_g) = Guard::enter() {
            // SAFETY: `p` is a live chunk of the allocator (the C contract of `free`).
            let len = unsafe { libc::malloc_usable_size(p) };
            // Only a chunk of a page or more can hold a whole page.
            if len >= crate::mem::page_size() {
                h.giving_back(p as usize, len, GiveBack::Freed);
            }
        }
    }
    // SAFETY: the application's own argument.
    unsafe { real::free(p) }
}

/// `realloc(3)`. A chunk some zero-copy send still holds a page of is reallocated as
/// `malloc`, copy and [`free`] (which lets go of its pages): the allocator would otherwise
/// free it, or its tail, inside `realloc`, where no interposer sees it.
///
/// # Safety
/// The C contract of `realloc`.
pub unsafe fn realloc<H: Hook>(h: &H, p: *mut c_void, n: size_t) -> *mut c_void {
    if !p.is_null() && pages_held_anywhere() && !PASSIVE.load(Relaxed) && h.holds_pages() {
        if let Some(_g) = Guard::enter() {
            // SAFETY: `p` is a live chunk of the allocator (the C contract of `realloc`).
            let old = unsafe { libc::malloc_usable_size(p) };
            if old >= crate::mem::page_size() && h.holds_any(p as usize, old) {
                let q = if n == 0 {
                    null_mut()
                } else {
                    // SAFETY: malloc has no preconditions; null (ENOMEM) is checked.
                    let q = unsafe { libc::malloc(n) };
                    if q.is_null() {
                        return q; // `p` stays the program's, as realloc(3) leaves it
                    }
                    // SAFETY: `p` holds `old` readable bytes, `q` at least `n` writable
                    // ones; two live chunks do not overlap.
                    unsafe {
                        std::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), old.min(n))
                    };
                    q
                };
                h.giving_back(p as usize, old, GiveBack::Freed);
                // SAFETY: `p` is the application's chunk, copied (or `realloc(p, 0)`, which
                // frees it in glibc); it is not used after.
                unsafe { real::free(p) };
                return q;
            }
        }
    }
    // SAFETY: forwarding the application's own arguments.
    unsafe { real::realloc_fn()(p, n) }
}

/// `munmap(2)`: the table forgets the range's pages first ([`GiveBack::Unmapped`]).
///
/// # Safety
/// The C contract of `munmap`.
pub unsafe fn munmap<H: Hook>(h: &H, addr: *mut c_void, len: size_t) -> c_int {
    if pages_held_anywhere() && aligned(addr) {
        if let Some(_g) = Guard::enter() {
            if h.holds_pages() {
                h.giving_back(addr as usize, len, GiveBack::Unmapped);
            }
        }
    }
    // SAFETY: forwarding the application's own arguments.
    unsafe { real::munmap_fn()(addr, len) }
}

/// Whether `addr` starts a page: `munmap`, `madvise` and `mremap` refuse (`EINVAL`) any
/// other address, and then nothing may be let go of.
fn aligned(addr: *mut c_void) -> bool {
    (addr as usize).is_multiple_of(crate::mem::page_size())
}

/// `madvise` advice that discards a range's contents (`MADV_DONTNEED_LOCKED`: Linux 5.18).
const DISCARDING: [c_int; 4] = [libc::MADV_DONTNEED, libc::MADV_FREE, libc::MADV_REMOVE, 24];

/// `madvise(2)`: advice that discards the contents lets go of the range's held pages
/// first ([`GiveBack::Freed`]).
///
/// # Safety
/// The C contract of `madvise`.
pub unsafe fn madvise<H: Hook>(h: &H, addr: *mut c_void, len: size_t, advice: c_int) -> c_int {
    if pages_held_anywhere() && DISCARDING.contains(&advice) && aligned(addr) {
        if let Some(_g) = Guard::enter() {
            if h.holds_pages() {
                // The kernel acts on whole pages: a partial last page too.
                let page = crate::mem::page_size();
                let whole = len.div_ceil(page).saturating_mul(page);
                h.giving_back(addr as usize, whole, GiveBack::Freed);
            }
        }
    }
    // SAFETY: forwarding the application's own arguments.
    unsafe { real::madvise_fn()(addr, len, advice) }
}

/// `mremap(2)`: a range that may move or shrink gets private copies of its protected
/// pages first ([`GiveBack::Moved`]).
///
/// # Safety
/// The C contract of `mremap` (`new_addr` is read only with `MREMAP_FIXED`).
pub unsafe fn mremap<H: Hook>(
    h: &H,
    old: *mut c_void,
    old_len: size_t,
    new_len: size_t,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let moves = new_len != old_len || flags & (libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP) != 0;
    if moves && pages_held_anywhere() && aligned(old) {
        if let Some(_g) = Guard::enter() {
            if h.holds_pages() {
                h.giving_back(old as usize, old_len, GiveBack::Moved);
            }
        }
    }
    // SAFETY: forwarding the application's own arguments.
    unsafe { real::mremap_fn()(old, old_len, new_len, flags, new_addr) }
}

/// `fork(2)`.
///
/// # Safety
/// None beyond `fork`'s.
pub unsafe fn fork<H: Hook>(h: &H) -> libc::pid_t {
    if let Some(_g) = Guard::enter() {
        h.before_fork();
    }
    // SAFETY: fork takes no arguments.
    let pid = unsafe { real::fork_fn()() };
    if pid >= 0 {
        if let Some(_g) = Guard::enter() {
            h.after_fork(pid);
        }
    }
    pid
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    /// Hides nothing, but counts: how often it was asked whether it may hide, and how often
    /// a result was handed to it. It may hide from its `from`-th question on.
    struct Counting {
        from: usize,
        asked: AtomicUsize,
        filtered: AtomicUsize,
    }

    impl Counting {
        fn new(from: usize) -> Counting {
            Counting {
                from,
                asked: AtomicUsize::new(0),
                filtered: AtomicUsize::new(0),
            }
        }
    }

    impl Hook for Counting {
        fn hides_readiness(&self) -> bool {
            self.asked.fetch_add(1, SeqCst) >= self.from
        }
        fn after_poll(&self, _fds: &mut [pollfd], ready: usize) -> usize {
            self.filtered.fetch_add(1, SeqCst);
            ready
        }
        fn after_epoll(&self, _epfd: c_int, events: &mut [libc::epoll_event]) -> usize {
            self.filtered.fetch_add(1, SeqCst);
            events.len()
        }
    }

    /// Counts the receive calls handed to it; detours nothing.
    struct Receiving {
        detours: bool,
        calls: AtomicUsize,
    }

    impl Hook for Receiving {
        fn detours_receives(&self) -> bool {
            self.detours
        }
        fn recv(&self, mut call: RecvCall<'_>) -> SysResult {
            self.calls.fetch_add(1, SeqCst);
            call.forward()
        }
    }

    #[test]
    fn receives_reach_the_hook_only_while_it_may_detour_them_and_get_their_bytes_either_way() {
        use std::os::fd::AsRawFd;
        for detours in [false, true] {
            let h = Receiving {
                detours,
                calls: AtomicUsize::new(0),
            };
            let (r, w) = rustix::pipe::pipe().unwrap();
            assert_eq!(rustix::io::write(&w, b"abcdefgh").unwrap(), 8);
            let mut a = [0u8; 3];
            // SAFETY: a is 3 writable bytes.
            let n = unsafe { read(&h, r.as_raw_fd(), a.as_mut_ptr().cast(), a.len()) };
            assert_eq!((n, &a), (3, b"abc"));
            let (mut b, mut c) = ([0u8; 2], [0u8; 3]);
            let iov = [
                iovec {
                    iov_base: b.as_mut_ptr().cast(),
                    iov_len: b.len(),
                },
                iovec {
                    iov_base: c.as_mut_ptr().cast(),
                    iov_len: c.len(),
                },
            ];
            // SAFETY: two iovecs naming writable buffers.
            let n = unsafe { readv(&h, r.as_raw_fd(), iov.as_ptr(), 2) };
            assert_eq!((n, &b, &c), (5, b"de", b"fgh"));
            assert_eq!(h.calls.load(SeqCst), if detours { 2 } else { 0 });
        }
    }

    /// A pipe with one byte in it: its read end is readable at once.
    fn readable() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
        let (r, w) = rustix::pipe::pipe().unwrap();
        assert_eq!(rustix::io::write(&w, b"x").unwrap(), 1);
        (r, w)
    }

    #[test]
    fn results_reach_the_hook_only_while_it_may_hide_or_once_it_began_to() {
        use std::os::fd::AsRawFd;
        let (r, _w) = readable();
        let ep = rustix::event::epoll::create(rustix::event::epoll::CreateFlags::CLOEXEC).unwrap();
        rustix::event::epoll::add(
            &ep,
            &r,
            rustix::event::epoll::EventData::new_u64(7),
            rustix::event::epoll::EventFlags::IN,
        )
        .unwrap();
        // Never, from the question after the call (hiding began while it waited), always.
        for (from, filtered) in [(usize::MAX, 0), (1, 1), (0, 1)] {
            let h = Counting::new(from);
            let mut p = [pollfd {
                fd: r.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            // SAFETY: p is one valid pollfd.
            assert_eq!(unsafe { poll(&h, p.as_mut_ptr(), 1, 5000) }, 1);
            assert_ne!(p[0].revents & libc::POLLIN, 0);
            assert_eq!(
                h.filtered.load(SeqCst),
                filtered,
                "poll, hiding from {from}"
            );
            let h = Counting::new(from);
            let mut out = [libc::epoll_event { events: 0, u64: 0 }; 4];
            // SAFETY: out holds 4 valid events.
            let n = unsafe { epoll_wait(&h, ep.as_raw_fd(), out.as_mut_ptr(), 4, 5000) };
            assert_eq!(n, 1);
            assert_eq!({ out[0].u64 }, 7);
            assert_eq!(
                h.filtered.load(SeqCst),
                filtered,
                "epoll, hiding from {from}"
            );
        }
    }
}
