//! The raw half of an `LD_PRELOAD` interposer (feature `preload`): the C library's own
//! functions ([`real`]), typed views of each interposed call's arguments and the [`Hook`]
//! trait a policy implements ([`hook`]), the raw-pointer bodies of the exported symbols
//! ([`entry`]), and [`crate::export_preload!`], which defines those symbols in the shared
//! library that names its policy.
//!
//! Why a macro rather than symbols defined here: a `#[no_mangle] fn write` compiled into
//! `zcnet-sys` would be linked into *every* binary of the workspace that enables this
//! feature (cargo unifies features across a workspace build), where the static linker
//! resolves the standard library's own `write` against it. Defined by the macro, the symbols
//! exist only in the `cdylib` that invokes it; their text, and every `unsafe` in them,
//! stays in this crate.
//!
//! Interposition covers calls made through the dynamic symbol table: a program linked
//! statically, or one that makes system calls itself (Go), is not covered; the C library's
//! internal calls (stdio's `fwrite` reaches `write` internally) are not seen either.

pub mod entry;
pub mod errno;
pub mod hook;
pub mod real;

pub use hook::{Datagram, Errno, FdSet, Hook, MmsgCall, RecvCall, SendCall, SendKind, SysResult};
#[doc(hidden)]
pub use libc;

/// Defines the interposed C symbols (`send`, `sendto`, `sendmsg`, `write`, `writev`,
/// `read`, `pread`, `pread64`, `readv`, `preadv`, `preadv64`, `recv`, `recvfrom`,
/// `recvmsg` and their `_chk` variants, `poll`,
/// `ppoll`, `select`, `pselect`, `epoll_wait`, `epoll_pwait`, `epoll_ctl`, `getsockopt`,
/// `setsockopt`, `close`, `dup`, `dup2`, `dup3`, `socket`, `socketpair`, `accept`,
/// `accept4`, `fork`, `sendmmsg`, `execve`, `execv`, `execvp`, `execvpe`, `getrandom`, `fread`, `fread_unlocked`, `prctl` and `syscall` for the seccomp filters they
/// install, and `free`, `realloc`, `munmap`, `madvise` and `mremap`, which give memory
/// back that a zero-copy send may still hold)
/// in the invoking crate, each calling [`entry`] with the `static` hook `$hook`.
///
/// Invoke it once, in a `cdylib`.
#[macro_export]
macro_rules! export_preload {
    ($hook:path) => {
        const _: () = {
            use $crate::preload::entry as e;
            use $crate::preload::libc::{
                c_int, c_void, epoll_event, fd_set, iovec, msghdr, nfds_t, pid_t, pollfd, sigset_t,
                size_t, sockaddr, socklen_t, ssize_t, timespec, timeval,
            };
            // SAFETY (all below): each symbol has the C prototype of the function it replaces
            // and passes its arguments, under that function's contract, to `entry`.
            #[no_mangle]
            pub unsafe extern "C" fn send(
                fd: c_int,
                b: *const c_void,
                l: size_t,
                f: c_int,
            ) -> ssize_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::send(&$hook, fd, b, l, f) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn sendto(
                fd: c_int,
                b: *const c_void,
                l: size_t,
                f: c_int,
                a: *const sockaddr,
                al: socklen_t,
            ) -> ssize_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::sendto(&$hook, fd, b, l, f, a, al) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn sendmsg(fd: c_int, m: *const msghdr, f: c_int) -> ssize_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::sendmsg(&$hook, fd, m, f) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn sendmmsg(
                fd: c_int,
                v: *mut $crate::preload::libc::mmsghdr,
                n: $crate::preload::libc::c_uint,
                f: c_int,
            ) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::sendmmsg(&$hook, fd, v, n, f) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn write(fd: c_int, b: *const c_void, l: size_t) -> ssize_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::write(&$hook, fd, b, l) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn writev(fd: c_int, v: *const iovec, n: c_int) -> ssize_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::writev(&$hook, fd, v, n) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn read(fd: c_int, b: *mut c_void, l: size_t) -> ssize_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::read(&$hook, fd, b, l) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn __read_chk(
                fd: c_int,
                b: *mut c_void,
                l: size_t,
                bl: size_t,
            ) -> ssize_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::read_chk(&$hook, fd, b, l, bl) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn pread(
                fd: c_int,
                b: *mut c_void,
                l: size_t,
                o: $crate::preload::libc::off_t,
            ) -> ssize_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::pread(&$hook, fd, b, l, o) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn pread64(
                fd: c_int,
                b: *mut c_void,
                l: size_t,
                o: $crate::preload::libc::off64_t,
            ) -> ssize_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::pread(&$hook, fd, b, l, o) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn __pread_chk(
                fd: c_int,
                b: *mut c_void,
                l: size_t,
                o: $crate::preload::libc::off_t,
                bl: size_t,
            ) -> ssize_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::pread_chk(&$hook, fd, b, l, o, bl) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn __pread64_chk(
                fd: c_int,
                b: *mut c_void,
                l: size_t,
                o: $crate::preload::libc::off64_t,
                bl: size_t,
            ) -> ssize_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::pread_chk(&$hook, fd, b, l, o, bl) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn preadv(
                fd: c_int,
                v: *const iovec,
                n: c_int,
                o: $crate::preload::libc::off_t,
            ) -> ssize_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::preadv(&$hook, fd, v, n, o) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn preadv64(
                fd: c_int,
                v: *const iovec,
                n: c_int,
                o: $crate::preload::libc::off64_t,
            ) -> ssize_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::preadv(&$hook, fd, v, n, o) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn readv(fd: c_int, v: *const iovec, n: c_int) -> ssize_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::readv(&$hook, fd, v, n) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn recv(
                fd: c_int,
                b: *mut c_void,
                l: size_t,
                f: c_int,
            ) -> ssize_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::recv(&$hook, fd, b, l, f) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn __recv_chk(
                fd: c_int,
                b: *mut c_void,
                l: size_t,
                bl: size_t,
                f: c_int,
            ) -> ssize_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::recv_chk(&$hook, fd, b, l, bl, f) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn recvfrom(
                fd: c_int,
                b: *mut c_void,
                l: size_t,
                f: c_int,
                a: *mut sockaddr,
                al: *mut socklen_t,
            ) -> ssize_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::recvfrom(&$hook, fd, b, l, f, a, al) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn __recvfrom_chk(
                fd: c_int,
                b: *mut c_void,
                l: size_t,
                bl: size_t,
                f: c_int,
                a: *mut sockaddr,
                al: *mut socklen_t,
            ) -> ssize_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::recvfrom_chk(&$hook, fd, b, l, bl, f, a, al) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn recvmsg(fd: c_int, m: *mut msghdr, f: c_int) -> ssize_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::recvmsg(&$hook, fd, m, f) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn poll(p: *mut pollfd, n: nfds_t, t: c_int) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::poll(&$hook, p, n, t) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn __poll_chk(
                p: *mut pollfd,
                n: nfds_t,
                t: c_int,
                pl: size_t,
            ) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::poll_chk(&$hook, p, n, t, pl) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn ppoll(
                p: *mut pollfd,
                n: nfds_t,
                t: *const timespec,
                m: *const sigset_t,
            ) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::ppoll(&$hook, p, n, t, m) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn select(
                n: c_int,
                r: *mut fd_set,
                w: *mut fd_set,
                x: *mut fd_set,
                t: *mut timeval,
            ) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::select(&$hook, n, r, w, x, t) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn pselect(
                n: c_int,
                r: *mut fd_set,
                w: *mut fd_set,
                x: *mut fd_set,
                t: *const timespec,
                m: *const sigset_t,
            ) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::pselect(&$hook, n, r, w, x, t, m) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn epoll_wait(
                ep: c_int,
                ev: *mut epoll_event,
                max: c_int,
                t: c_int,
            ) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::epoll_wait(&$hook, ep, ev, max, t) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn epoll_pwait(
                ep: c_int,
                ev: *mut epoll_event,
                max: c_int,
                t: c_int,
                m: *const sigset_t,
            ) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::epoll_pwait(&$hook, ep, ev, max, t, m) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn epoll_ctl(
                ep: c_int,
                op: c_int,
                fd: c_int,
                ev: *mut epoll_event,
            ) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::epoll_ctl(&$hook, ep, op, fd, ev) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn getsockopt(
                fd: c_int,
                lv: c_int,
                n: c_int,
                v: *mut c_void,
                l: *mut socklen_t,
            ) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::getsockopt(&$hook, fd, lv, n, v, l) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn setsockopt(
                fd: c_int,
                lv: c_int,
                n: c_int,
                v: *const c_void,
                l: socklen_t,
            ) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::setsockopt(&$hook, fd, lv, n, v, l) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn close(fd: c_int) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::close(&$hook, fd) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::dup(&$hook, fd) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn dup2(o: c_int, n: c_int) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::dup2(&$hook, o, n) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn dup3(o: c_int, n: c_int, f: c_int) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::dup3(&$hook, o, n, f) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn socket(d: c_int, t: c_int, p: c_int) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::socket(&$hook, d, t, p) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn execve(
                p: *const $crate::preload::libc::c_char,
                a: *const *const $crate::preload::libc::c_char,
                e_: *const *const $crate::preload::libc::c_char,
            ) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::execve(&$hook, p, a, e_) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn execv(
                p: *const $crate::preload::libc::c_char,
                a: *const *const $crate::preload::libc::c_char,
            ) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::execv(&$hook, p, a) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn execvp(
                p: *const $crate::preload::libc::c_char,
                a: *const *const $crate::preload::libc::c_char,
            ) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::execvp(&$hook, p, a) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn execvpe(
                p: *const $crate::preload::libc::c_char,
                a: *const *const $crate::preload::libc::c_char,
                e_: *const *const $crate::preload::libc::c_char,
            ) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::execvpe(&$hook, p, a, e_) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn getrandom(
                b: *mut c_void,
                l: size_t,
                f: $crate::preload::libc::c_uint,
            ) -> ssize_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::getrandom(&$hook, b, l, f) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn fread(
                b: *mut c_void,
                s: size_t,
                n: size_t,
                f: *mut $crate::preload::libc::FILE,
            ) -> size_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::fread(&$hook, b, s, n, f, false) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn fread_unlocked(
                b: *mut c_void,
                s: size_t,
                n: size_t,
                f: *mut $crate::preload::libc::FILE,
            ) -> size_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::fread(&$hook, b, s, n, f, true) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn socketpair(
                d: c_int,
                t: c_int,
                p: c_int,
                sv: *mut c_int,
            ) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::socketpair(&$hook, d, t, p, sv) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn prctl(
                o: c_int,
                a: $crate::preload::libc::c_ulong,
                b: $crate::preload::libc::c_ulong,
                c: $crate::preload::libc::c_ulong,
                d: $crate::preload::libc::c_ulong,
            ) -> c_int {
                // SAFETY: the C contract of this symbol (variadic in C: every option's
                // arguments are `unsigned long`s in the registers these name).
                unsafe { e::prctl(&$hook, o, a, b, c, d) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn syscall(
                n: $crate::preload::libc::c_long,
                a: $crate::preload::libc::c_long,
                b: $crate::preload::libc::c_long,
                c: $crate::preload::libc::c_long,
                d: $crate::preload::libc::c_long,
                e_: $crate::preload::libc::c_long,
                f: $crate::preload::libc::c_long,
            ) -> $crate::preload::libc::c_long {
                // SAFETY: the C contract of this symbol (variadic in C: up to six `long`s,
                // read from the registers and stack slot these name, as the C library's
                // own `syscall` reads them).
                unsafe { e::syscall(&$hook, n, a, b, c, d, e_, f) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn accept(
                fd: c_int,
                a: *mut sockaddr,
                l: *mut socklen_t,
            ) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::accept(&$hook, fd, a, l) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn accept4(
                fd: c_int,
                a: *mut sockaddr,
                l: *mut socklen_t,
                f: c_int,
            ) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::accept4(&$hook, fd, a, l, f) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn free(p: *mut c_void) {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::free(&$hook, p) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn realloc(p: *mut c_void, n: size_t) -> *mut c_void {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::realloc(&$hook, p, n) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn munmap(a: *mut c_void, l: size_t) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::munmap(&$hook, a, l) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn madvise(a: *mut c_void, l: size_t, adv: c_int) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::madvise(&$hook, a, l, adv) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn mremap(
                a: *mut c_void,
                l: size_t,
                n: size_t,
                f: c_int,
                to: *mut c_void,
            ) -> *mut c_void {
                // SAFETY: the C contract of this symbol (variadic in C: the new address, a
                // pointer in the register this names, is read only with MREMAP_FIXED).
                unsafe { e::mremap(&$hook, a, l, n, f, to) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn fork() -> pid_t {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::fork(&$hook) }
            }
            // Runs at load, before the program's `main` and before it can change its
            // environment (nginx replaces `environ`): the hook reads its settings here.
            #[used]
            #[link_section = ".init_array"]
            static INIT: extern "C" fn() = {
                extern "C" fn init() {
                    e::init(&$hook)
                }
                init
            };
        };
    };
}
