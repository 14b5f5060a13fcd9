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

/// Defines the C-variadic symbol `$name(path, arg0, ..., NULL)` — `execl`, `execlp`,
/// `execle` — as a trampoline to the ordinary `extern "C" fn $list(path, argv) -> c_int`,
/// where `argv` is the whole argument list as one NULL-terminated array (for `execle`,
/// followed by the environment pointer). x86-64 and aarch64.
///
/// Stable Rust cannot define a variadic function, but a naked one receives its arguments
/// as the ABI places them, and the System V x86-64 ABI (§3.2.3, "Parameter Passing")
/// passes a variadic callee's pointer arguments exactly as a fixed one's: the first six in
/// `rdi`, `rsi`, `rdx`, `rcx`, `r8`, `r9`, the rest on the stack from `[rsp + 8]` at entry,
/// one eight-byte slot each. `path` is in `rdi`; the list starts in `rsi`. The trampoline
/// pops the return address and pushes `r9` down to `rsi`: the five register arguments
/// then lie just below the stack ones, in order — the list is one array, where it already
/// is. No copy, no bound on its length beyond the kernel's own and no allocation: an
/// `exec` may run in a `vfork` child, in its parent's memory and heap. It then calls
/// `$list` with the stack aligned to 16 bytes (the return address kept below the array)
/// and returns its result, with `errno` as `$list` left it.
///
/// On aarch64 the procedure call standard (AAPCS64 as Linux uses it: unlike Apple's, a
/// variadic argument goes where a fixed one would) passes `path` in `x0`, the list's first
/// seven pointers in `x1`–`x7` and the rest on the stack from `[sp]` at entry, eight bytes
/// each. The trampoline takes 64 bytes of stack (keeping `sp` 16-byte aligned, as aarch64
/// requires): the link register at the bottom, then `x1`–`x7`, which end where the stack
/// arguments begin — again one array, in place, handed over as `x1`. It returns through
/// the saved link register.
///
/// Why not a `global_asm!` symbol in this crate: it would be defined in every binary
/// linking this crate with `preload` on (see the module docs); expanded in
/// [`crate::export_preload!`], it exists only in the interposer's `cdylib`.
#[macro_export]
macro_rules! exec_list_trampoline {
    ($name:ident => $list:path) => {
        #[cfg(target_arch = "aarch64")]
        #[no_mangle]
        #[unsafe(naked)]
        #[allow(unreachable_pub)] // reachable by its symbol, not by a Rust path
        // SAFETY: a C caller passes (path, arg0, ..., NULL[, envp]) by AAPCS64, which the
        // code below reads as `$list`'s (path, argv) and restores before `ret`.
        pub unsafe extern "C" fn $name(
            path: *const $crate::preload::libc::c_char,
            arg0: *const $crate::preload::libc::c_char,
        ) -> $crate::preload::libc::c_int {
            ::core::arch::naked_asm!(
                // A landing pad for a branch-target-checked indirect call (a hint: a no-op
                // where BTI is off or absent).
                "hint #34",
                // 64 bytes, sp stays 16-byte aligned: lr at [sp], x1..x7 at [sp + 8] up to
                // [sp + 64], where the stack arguments start.
                "sub sp, sp, #64",
                "str x30, [sp]",
                "stp x1, x2, [sp, #8]",
                "stp x3, x4, [sp, #24]",
                "stp x5, x6, [sp, #40]",
                "str x7, [sp, #56]",
                // path stays in x0; the list is the array from [sp + 8].
                "add x1, sp, #8",
                "bl {list}",
                "ldr x30, [sp]",
                "add sp, sp, #64",
                "ret",
                list = sym $list,
            )
        }
        #[cfg(target_arch = "x86_64")]
        #[no_mangle]
        #[unsafe(naked)]
        #[allow(unreachable_pub)] // reachable by its symbol, not by a Rust path
        // SAFETY: a C caller passes (path, arg0, ..., NULL[, envp]) by the System V ABI,
        // which the code below reads as `$list`'s (path, argv) and restores before `ret`.
        pub unsafe extern "C" fn $name(
            path: *const $crate::preload::libc::c_char,
            arg0: *const $crate::preload::libc::c_char,
        ) -> $crate::preload::libc::c_int {
            ::core::arch::naked_asm!(
                // The return address; rsp now points at the first stack argument.
                "pop rax",
                // The register arguments, the list's first five, just below the stack ones.
                "push r9",
                "push r8",
                "push rcx",
                "push rdx",
                "push rsi",
                // rsp was 8 mod 16 at entry: after one pop and six pushes it is 0 mod 16,
                // as a call needs.
                "push rax",
                "lea rsi, [rsp + 8]",
                "call {list}",
                // Back to the caller: the return address where it was, `ret` (not a `jmp`,
                // which would leave the return-stack predictor one call behind).
                "pop rcx",
                "add rsp, 32",
                "mov [rsp], rcx",
                "ret",
                list = sym $list,
            )
        }
    };
}

/// Defines the interposed C symbols (`send`, `sendto`, `sendmsg`, `write`, `writev`,
/// `read`, `pread`, `pread64`, `readv`, `preadv`, `preadv64`, `recv`, `recvfrom`,
/// `recvmsg` and their `_chk` variants, `poll`,
/// `ppoll`, `select`, `pselect`, `epoll_wait`, `epoll_pwait`, `epoll_ctl`, `getsockopt`,
/// `setsockopt`, `close`, `dup`, `dup2`, `dup3`, `socket`, `socketpair`, `accept`,
/// `accept4`, `fork`, `sendmmsg`, `execve`, `execv`, `execvp`, `execvpe`, `fexecve`, `execl`,
/// `execlp` and `execle` (x86-64 and aarch64: C-variadic, see [`crate::exec_list_trampoline!`]),
/// `getrandom`, `fread`, `fread_unlocked`, `prctl` and `syscall` for the seccomp filters they
/// install (and `syscall`'s `io_uring_setup`), liburing's ring set-up calls
/// (`io_uring_queue_init`, `io_uring_queue_init_params`, `io_uring_queue_init_mem`,
/// `io_uring_setup`: see [`entry::uring_setup`]), and `free`, `realloc`, `munmap`, `madvise` and `mremap`, which give memory
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
            pub unsafe extern "C" fn fexecve(
                fd: c_int,
                a: *const *const $crate::preload::libc::c_char,
                e_: *const *const $crate::preload::libc::c_char,
            ) -> c_int {
                // SAFETY: the C contract of this symbol, passed on to `entry`.
                unsafe { e::fexecve(&$hook, fd, a, e_) }
            }
            // `execl`, `execlp`, `execle`: C-variadic, defined by a trampoline for x86-64
            // and aarch64 (elsewhere they stay the C library's; see `exec_list_trampoline!`).
            #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
            const _: () = {
                type Cstr = *const $crate::preload::libc::c_char;
                extern "C" fn execl_list(p: Cstr, a: *const Cstr) -> c_int {
                    // SAFETY: `execl`'s C contract; the trampoline made `a` its list.
                    unsafe { e::execl(&$hook, p, a) }
                }
                extern "C" fn execlp_list(p: Cstr, a: *const Cstr) -> c_int {
                    // SAFETY: `execlp`'s C contract; the trampoline made `a` its list.
                    unsafe { e::execlp(&$hook, p, a) }
                }
                extern "C" fn execle_list(p: Cstr, a: *const Cstr) -> c_int {
                    // SAFETY: `execle`'s C contract; the trampoline made `a` its list,
                    // followed by the environment pointer.
                    unsafe { e::execle(&$hook, p, a) }
                }
        $crate::exec_list_trampoline!(execl => execl_list);
        $crate::exec_list_trampoline!(execlp => execlp_list);
        $crate::exec_list_trampoline!(execle => execle_list);
            };
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
            pub unsafe extern "C" fn io_uring_queue_init(
                n: $crate::preload::libc::c_uint,
                r: *mut c_void,
                f: $crate::preload::libc::c_uint,
            ) -> c_int {
                // SAFETY: liburing's contract for this symbol, passed on to `entry`.
                unsafe {
                    e::uring_setup(
                        &$hook,
                        $crate::preload::real::UringFn::QueueInit,
                        [n as usize, r as usize, f as usize, 0, 0],
                    )
                }
            }
            #[no_mangle]
            pub unsafe extern "C" fn io_uring_queue_init_params(
                n: $crate::preload::libc::c_uint,
                r: *mut c_void,
                p: *mut c_void,
            ) -> c_int {
                // SAFETY: liburing's contract for this symbol, passed on to `entry`.
                unsafe {
                    e::uring_setup(
                        &$hook,
                        $crate::preload::real::UringFn::QueueInitParams,
                        [n as usize, r as usize, p as usize, 0, 0],
                    )
                }
            }
            #[no_mangle]
            pub unsafe extern "C" fn io_uring_queue_init_mem(
                n: $crate::preload::libc::c_uint,
                r: *mut c_void,
                p: *mut c_void,
                b: *mut c_void,
                l: size_t,
            ) -> c_int {
                // SAFETY: liburing's contract for this symbol, passed on to `entry`.
                unsafe {
                    e::uring_setup(
                        &$hook,
                        $crate::preload::real::UringFn::QueueInitMem,
                        [n as usize, r as usize, p as usize, b as usize, l],
                    )
                }
            }
            #[no_mangle]
            pub unsafe extern "C" fn io_uring_setup(
                n: $crate::preload::libc::c_uint,
                p: *mut c_void,
            ) -> c_int {
                // SAFETY: liburing's contract for this symbol, passed on to `entry`.
                unsafe {
                    e::uring_setup(
                        &$hook,
                        $crate::preload::real::UringFn::Setup,
                        [n as usize, p as usize, 0, 0, 0],
                    )
                }
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

/// The trampoline called as C calls a variadic function: every list length, with the
/// register and stack parts of the list both used and the environment after the NULL.
#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
mod tests {
    use libc::{c_char, c_int};
    use std::cell::RefCell;
    use std::ffi::CString;
    use std::ptr::null;

    type Cstr = *const c_char;
    /// The trampolines as a C caller sees them: `(path, arg0, ...)`. Calling through this
    /// type makes a true variadic call (`al` holds the count of vector registers used, as
    /// the ABI asks of a variadic call), as a C program's `execl` does.
    type ListFn = unsafe extern "C" fn(Cstr, Cstr, ...) -> c_int;

    thread_local! {
        /// What [`collect`] saw: the path, the list and the pointer after its NULL.
        static SEEN: RefCell<Option<(Cstr, Vec<Cstr>, Cstr)>> = const { RefCell::new(None) };
    }

    /// Keeps what the trampoline handed over; returns a value the test can tell apart
    /// from any argument count, to check the result comes back unchanged.
    extern "C" fn collect(path: Cstr, argv: *const Cstr) -> c_int {
        let mut list = Vec::new();
        loop {
            // SAFETY: the trampoline's `argv` is the caller's NULL-terminated list.
            let p = unsafe { *argv.add(list.len()) };
            if p.is_null() {
                break;
            }
            list.push(p);
        }
        // SAFETY: the test's callers pass one pointer after the NULL.
        let envp = unsafe { super::entry::list_envp(argv) }.unwrap();
        SEEN.with(|s| *s.borrow_mut() = Some((path, list, envp.cast())));
        -7777
    }

    crate::exec_list_trampoline!(zcnet_sys_test_exec_list => collect);

    fn list_fn() -> ListFn {
        // SAFETY: the trampoline's C prototype is `int (const char *, const char *, ...)`;
        // the Rust one names only the two fixed parameters of a naked function.
        unsafe {
            std::mem::transmute::<unsafe extern "C" fn(Cstr, Cstr) -> c_int, ListFn>(
                zcnet_sys_test_exec_list,
            )
        }
    }

    /// Calls `f(path, v[i]..., NULL, envp)` for the indices given.
    macro_rules! call {
        ($f:expr, $path:expr, $envp:expr, $v:expr; ) => {
            // SAFETY: a NULL-terminated list and one pointer after it.
            unsafe { $f($path, null::<c_char>(), $envp) }
        };
        ($f:expr, $path:expr, $envp:expr, $v:expr; $($i:literal)+) => {
            // SAFETY: a NULL-terminated list and one pointer after it.
            unsafe { $f($path, $($v[$i],)+ null::<c_char>(), $envp) }
        };
    }

    #[test]
    fn the_trampoline_hands_over_every_list_length_whole_with_the_pointer_after_its_null() {
        let args: Vec<CString> = (0..40)
            .map(|i| CString::new(format!("arg{i}")).unwrap())
            .collect();
        let v: Vec<Cstr> = args.iter().map(|a| a.as_ptr()).collect();
        let path = c"/the/path".as_ptr();
        let env = [c"A=1".as_ptr(), null()];
        let envp = env.as_ptr().cast::<c_char>();
        let f = list_fn();
        // x86-64 has five list pointers in registers, aarch64 seven: both edges.
        for n in [0usize, 1, 5, 6, 7, 8, 40] {
            let r = match n {
                0 => call!(f, path, envp, v;),
                1 => call!(f, path, envp, v; 0),
                5 => call!(f, path, envp, v; 0 1 2 3 4),
                6 => call!(f, path, envp, v; 0 1 2 3 4 5),
                7 => call!(f, path, envp, v; 0 1 2 3 4 5 6),
                8 => call!(f, path, envp, v; 0 1 2 3 4 5 6 7),
                _ => call!(f, path, envp, v; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18
                    19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39),
            };
            assert_eq!(r, -7777, "{n} arguments: the result");
            let (p, list, e) = SEEN.with(|s| s.borrow_mut().take()).unwrap();
            assert_eq!(p, path, "{n} arguments: the path");
            assert_eq!(list, v[..n], "{n} arguments: the list");
            assert_eq!(e, envp, "{n} arguments: the environment");
        }
    }
}

/// `execle` through the trampoline reaches the hook and the C library as an interposed
/// `execve` does: `before_exec` first, and for an `exec` that fails, `exec_failed`, then
/// `-1` with the C library's `errno` (not the one the hook left).
#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
mod execle_tests {
    use super::hook::Hook;
    use libc::{c_char, c_int};
    use std::ptr::null;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    type Cstr = *const c_char;
    type ListFn = unsafe extern "C" fn(Cstr, Cstr, ...) -> c_int;

    struct Counting {
        before: AtomicUsize,
        failed: AtomicUsize,
    }

    impl Hook for Counting {
        fn before_exec(&self) {
            self.before.fetch_add(1, SeqCst);
        }
        /// Clobbers `errno`, as a hook's own system calls may.
        fn exec_failed(&self) {
            self.failed.fetch_add(1, SeqCst);
            // SAFETY: closing a descriptor no test opens fails with `EBADF`, nothing more.
            unsafe { libc::close(-1) };
        }
    }

    static COUNTING: Counting = Counting {
        before: AtomicUsize::new(0),
        failed: AtomicUsize::new(0),
    };

    extern "C" fn execle_counting(path: Cstr, argv: *const Cstr) -> c_int {
        // SAFETY: the trampoline's list, followed by the environment pointer.
        unsafe { super::entry::execle(&COUNTING, path, argv) }
    }

    crate::exec_list_trampoline!(zcnet_sys_test_execle => execle_counting);

    #[test]
    fn a_failed_execle_settles_first_and_returns_the_c_librarys_errno() {
        // SAFETY: as in `tests::list_fn`.
        let f = unsafe {
            std::mem::transmute::<unsafe extern "C" fn(Cstr, Cstr) -> c_int, ListFn>(
                zcnet_sys_test_execle,
            )
        };
        let env = [c"A=1".as_ptr(), null()];
        // SAFETY: a NULL-terminated list and the environment after it, as execle(3) wants.
        let r = unsafe {
            f(
                c"/nonexistent/zcnet-sys-test".as_ptr(),
                c"x".as_ptr(),
                c"y".as_ptr(),
                null::<c_char>(),
                env.as_ptr(),
            )
        };
        let errno = std::io::Error::last_os_error().raw_os_error();
        assert_eq!((r, errno), (-1, Some(libc::ENOENT)));
        assert_eq!(COUNTING.before.load(SeqCst), 1, "before_exec");
        assert_eq!(COUNTING.failed.load(SeqCst), 1, "exec_failed");
    }
}
