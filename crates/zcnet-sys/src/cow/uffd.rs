//! userfaultfd write-protect (`UFFD_USER_MODE_ONLY`, `UFFDIO_REGISTER_MODE_WP`,
//! `UFFDIO_WRITEPROTECT`): the mechanism that can guard a loaned buffer against writes while
//! the kernel may still read it (docs/measurements/kernel-findings.md §6, Documentation/admin-guide/mm/userfaultfd.rst,
//! userfaultfd(2), ioctl_userfaultfd(2)).
//!
//! The fd is always created with `UFFD_USER_MODE_ONLY`: that works without privileges even
//! when `vm.unprivileged_userfaultfd=0`, and it makes *kernel* writes into a protected page
//! (`read(2)`, `recv(2)` into the buffer) fail with `EFAULT` instead of blocking on a handler.
//! It is also `O_NONBLOCK`, because `poll(2)` on a blocking userfaultfd reports `POLLERR`.
//!
//! The ioctl numbers and structs are carried here (linux/userfaultfd.h of 6.x): Debian's
//! headers predate `UFFD_USER_MODE_ONLY`, `WP_UNPOPULATED` and `UFFDIO_MOVE`.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `UFFD_USER_MODE_ONLY`: handle user-mode faults only; kernel-mode faults fail (`EFAULT`).
pub const UFFD_USER_MODE_ONLY: i32 = 1;
/// `UFFD_API`: the only API version.
pub const UFFD_API: u64 = 0xAA;

/// `UFFD_FEATURE_PAGEFAULT_FLAG_WP`: write-protect faults are reported (with
/// `UFFD_PAGEFAULT_FLAG_WP` in the message).
pub const UFFD_FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
/// `UFFD_FEATURE_WP_HUGETLBFS_SHMEM`: write-protect also on hugetlbfs and shmem.
pub const UFFD_FEATURE_WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
/// `UFFD_FEATURE_WP_UNPOPULATED`: write-protecting an unpopulated anonymous page protects it
/// (installs a PTE marker) instead of doing nothing.
pub const UFFD_FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
/// `UFFD_FEATURE_WP_ASYNC`: the kernel resolves write-protect faults itself (dirty tracking).
pub const UFFD_FEATURE_WP_ASYNC: u64 = 1 << 15;
/// `UFFD_FEATURE_MOVE`: `UFFDIO_MOVE` is available.
pub const UFFD_FEATURE_MOVE: u64 = 1 << 16;
/// `UFFD_FEATURE_EVENT_REMAP`: when `mremap(2)` moves a registered range, the registration
/// (and the write-protect bits) move with it and an [`UffdEvent::Remap`] is queued; the
/// `mremap` caller waits until the event is read. Without it the moved range silently loses
/// both, so a later write would land in the page the kernel may still be sending.
pub const UFFD_FEATURE_EVENT_REMAP: u64 = 1 << 2;

/// `UFFD_PAGEFAULT_FLAG_WRITE`: the fault was a write.
pub const UFFD_PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
/// `UFFD_PAGEFAULT_FLAG_WP`: the fault hit a write-protected page (else: a missing page).
pub const UFFD_PAGEFAULT_FLAG_WP: u64 = 1 << 1;
/// `UFFD_PAGEFAULT_FLAG_MINOR`: a minor fault (shmem, hugetlbfs).
pub const UFFD_PAGEFAULT_FLAG_MINOR: u64 = 1 << 2;

const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFD_EVENT_REMAP: u8 = 0x14;

/// Size of `struct uffd_msg` (packed).
pub const UFFD_MSG_SIZE: usize = 32;

const UFFDIO: u64 = 0xAA;
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;

/// `_IOC(dir, 0xAA, nr, size)` as asm-generic/ioctl.h builds it.
const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (UFFDIO << 8) | nr
}

/// `struct uffdio_range`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct UffdioRange {
    start: u64,
    len: u64,
}

/// `struct uffdio_api`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

/// `struct uffdio_register`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

/// `struct uffdio_writeprotect`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

/// `UFFDIO_API` = `_IOWR(0xAA, 0x3F, struct uffdio_api)`.
pub const UFFDIO_API: u64 = ioc(IOC_READ | IOC_WRITE, 0x3F, std::mem::size_of::<UffdioApi>());
/// `UFFDIO_REGISTER` = `_IOWR(0xAA, 0x00, struct uffdio_register)`.
pub const UFFDIO_REGISTER: u64 = ioc(
    IOC_READ | IOC_WRITE,
    0x00,
    std::mem::size_of::<UffdioRegister>(),
);
/// `UFFDIO_UNREGISTER` = `_IOR(0xAA, 0x01, struct uffdio_range)`.
pub const UFFDIO_UNREGISTER: u64 = ioc(IOC_READ, 0x01, std::mem::size_of::<UffdioRange>());
/// `UFFDIO_WRITEPROTECT` = `_IOWR(0xAA, 0x06, struct uffdio_writeprotect)`.
pub const UFFDIO_WRITEPROTECT: u64 = ioc(
    IOC_READ | IOC_WRITE,
    0x06,
    std::mem::size_of::<UffdioWriteprotect>(),
);

/// Bit of `UFFDIO_WRITEPROTECT` (`1 << _UFFDIO_WRITEPROTECT`) in the `ioctls` mask that
/// `UFFDIO_REGISTER` returns for the range.
pub const IOCTL_BIT_WRITEPROTECT: u64 = 1 << 0x06;

/// `struct uffdio_copy`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

/// `struct uffdio_zeropage`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}

/// `UFFDIO_WAKE` = `_IOR(0xAA, 0x02, struct uffdio_range)`.
pub const UFFDIO_WAKE: u64 = ioc(IOC_READ, 0x02, std::mem::size_of::<UffdioRange>());
/// `UFFDIO_COPY` = `_IOWR(0xAA, 0x03, struct uffdio_copy)`.
pub const UFFDIO_COPY: u64 = ioc(
    IOC_READ | IOC_WRITE,
    0x03,
    std::mem::size_of::<UffdioCopy>(),
);
/// `UFFDIO_ZEROPAGE` = `_IOWR(0xAA, 0x04, struct uffdio_zeropage)`.
pub const UFFDIO_ZEROPAGE: u64 = ioc(
    IOC_READ | IOC_WRITE,
    0x04,
    std::mem::size_of::<UffdioZeropage>(),
);

/// `UFFDIO_WRITEPROTECT_MODE_WP`: protect (without it: unprotect).
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;

/// One message read from a userfaultfd (`struct uffd_msg`, decoded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UffdEvent {
    /// A thread faulted on `address` and sleeps until the fault is resolved (or the range
    /// woken). `flags` holds `UFFD_PAGEFAULT_FLAG_*`.
    Pagefault {
        /// `UFFD_PAGEFAULT_FLAG_WRITE` / `_WP` / `_MINOR`.
        flags: u64,
        /// The faulting address (page-aligned unless `UFFD_FEATURE_EXACT_ADDRESS`).
        address: u64,
    },
    /// `mremap` moved `len` bytes of a registered range from `from` to `to`
    /// ([`UFFD_FEATURE_EVENT_REMAP`]).
    Remap {
        /// Old start.
        from: u64,
        /// New start.
        to: u64,
        /// Length moved.
        len: u64,
    },
    /// A fork, remove or unmap event (only if those features were asked for), or an event
    /// this code does not know: reported, not interpreted.
    Other(u8),
}

impl UffdEvent {
    /// Decodes one 32-byte `struct uffd_msg`; `None` if `b` is shorter.
    pub fn decode(b: &[u8]) -> Option<UffdEvent> {
        if b.len() < UFFD_MSG_SIZE {
            return None;
        }
        let u64_at = |o: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[o..o + 8]);
            u64::from_ne_bytes(w)
        };
        Some(match b[0] {
            UFFD_EVENT_PAGEFAULT => UffdEvent::Pagefault {
                flags: u64_at(8),
                address: u64_at(16),
            },
            UFFD_EVENT_REMAP => UffdEvent::Remap {
                from: u64_at(8),
                to: u64_at(16),
                len: u64_at(24),
            },
            // FORK 0x13, REMOVE 0x15, UNMAP 0x16, and anything newer.
            e => UffdEvent::Other(e),
        })
    }
}

/// Room for this many messages in one [`Userfaultfd::read_events`] call.
pub const EVENT_BATCH: usize = 16;

/// How a range is registered (`UFFDIO_REGISTER_MODE_*`); combine with `|`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegisterMode(pub u64);

impl RegisterMode {
    /// `UFFDIO_REGISTER_MODE_MISSING`: faults on missing pages.
    pub const MISSING: RegisterMode = RegisterMode(1 << 0);
    /// `UFFDIO_REGISTER_MODE_WP`: write-protect faults.
    pub const WP: RegisterMode = RegisterMode(1 << 1);
    /// `UFFDIO_REGISTER_MODE_MINOR`: minor faults (shmem, hugetlbfs).
    pub const MINOR: RegisterMode = RegisterMode(1 << 2);
}

impl std::ops::BitOr for RegisterMode {
    type Output = RegisterMode;
    fn bitor(self, rhs: RegisterMode) -> RegisterMode {
        RegisterMode(self.0 | rhs.0)
    }
}

/// What the `UFFDIO_API` handshake reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiInfo {
    /// Every feature this kernel offers (`UFFD_FEATURE_*` bits; unknown bits kept).
    pub features: u64,
    /// The ioctls available on the fd (`1 << _UFFDIO_*`).
    pub ioctls: u64,
}

impl ApiInfo {
    /// Whether all bits of `feature` are offered.
    pub fn has(&self, feature: u64) -> bool {
        self.features & feature == feature
    }
}

/// A userfaultfd created with `UFFD_USER_MODE_ONLY | O_NONBLOCK | O_CLOEXEC`. Closing it
/// unregisters every range it registered and drops any write protection it set.
#[derive(Debug)]
pub struct Userfaultfd {
    fd: OwnedFd,
}

impl AsFd for Userfaultfd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Userfaultfd {
    /// `userfaultfd(UFFD_USER_MODE_ONLY | O_NONBLOCK | O_CLOEXEC)`. `EINVAL` on kernels
    /// before 5.11 (no user-mode-only flag), `EPERM` where the sysctl or an LSM forbids it,
    /// `ENOSYS` when the kernel was built without it.
    pub fn user_mode_only() -> io::Result<Userfaultfd> {
        let flags = UFFD_USER_MODE_ONLY | libc::O_NONBLOCK | libc::O_CLOEXEC;
        // SAFETY: userfaultfd takes one int of flags and touches no user memory.
        let r = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let raw =
            i32::try_from(r).map_err(|_| io::Error::other("userfaultfd returned a bad fd"))?;
        // SAFETY: the syscall just returned this fd; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Userfaultfd { fd })
    }

    /// The `UFFDIO_API` handshake, required once before any other ioctl. Asks for the
    /// `features` bits (0 asks for none and is always accepted) and returns what the kernel
    /// offers; asking for an unoffered bit fails with `EINVAL`.
    pub fn api(&self, features: u64) -> io::Result<ApiInfo> {
        let mut arg = UffdioApi {
            api: UFFD_API,
            features,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and writes exactly one uffdio_api, a live local.
        let r = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                UFFDIO_API as libc::Ioctl,
                &mut arg as *mut UffdioApi,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(ApiInfo {
            features: arg.features,
            ioctls: arg.ioctls,
        })
    }

    /// `UFFDIO_REGISTER` of `mem` (page-aligned start and length, else `EINVAL`) in `mode`.
    /// Returns the mask of ioctls usable on the range (see [`IOCTL_BIT_WRITEPROTECT`]).
    ///
    /// Once a range is write-protected, a *user-mode* write to it blocks until someone
    /// reads the fault from this fd and resolves it; with no handler that thread hangs.
    pub fn register(&self, mem: &[u8], mode: RegisterMode) -> io::Result<u64> {
        self.register_range(mem.as_ptr() as usize, mem.len(), mode)
    }

    /// `UFFDIO_UNREGISTER` of `mem`.
    pub fn unregister(&self, mem: &[u8]) -> io::Result<()> {
        self.unregister_range(mem.as_ptr() as usize, mem.len())
    }

    /// `UFFDIO_WRITEPROTECT` of `mem` (registered with [`RegisterMode::WP`]): protects
    /// when `protect`, else removes the protection and wakes threads waiting on it.
    pub fn write_protect(&self, mem: &[u8], protect: bool) -> io::Result<()> {
        self.write_protect_range(mem.as_ptr() as usize, mem.len(), protect)
    }
}

impl Userfaultfd {
    /// Reads pending messages without blocking (the fd is `O_NONBLOCK`) into `out`; returns
    /// how many were decoded, 0 when none is pending (`EAGAIN`). Reading a non-cooperative
    /// event (such as [`UffdEvent::Remap`]) is what lets the thread that caused it go on.
    ///
    /// Allocates nothing: the fault handler calls it while an application thread may hold
    /// the allocator's lock and sleep on a write fault.
    pub fn read_events(&self, out: &mut [Option<UffdEvent>; EVENT_BATCH]) -> io::Result<usize> {
        let mut raw = [0u8; UFFD_MSG_SIZE * EVENT_BATCH];
        let n = loop {
            // SAFETY: raw is a live, writable buffer of exactly raw.len() bytes; read(2)
            // writes at most that many.
            let r = unsafe { libc::read(self.fd.as_raw_fd(), raw.as_mut_ptr().cast(), raw.len()) };
            if r >= 0 {
                break r as usize;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) => return Ok(0),
                Some(libc::EINTR) => continue,
                _ => return Err(e),
            }
        };
        let mut count = 0;
        for (slot, msg) in out.iter_mut().zip(raw[..n].chunks_exact(UFFD_MSG_SIZE)) {
            *slot = UffdEvent::decode(msg);
            count += 1;
        }
        Ok(count)
    }

    /// `UFFDIO_WAKE` of `len` bytes at `start`: wakes threads sleeping on faults there, to
    /// fault again. Only wakes; it changes no page, so any range is harmless.
    pub fn wake(&self, start: usize, len: usize) -> io::Result<()> {
        let mut arg = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        // SAFETY: UFFDIO_WAKE reads one uffdio_range, a live local, and touches no memory.
        let r = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                UFFDIO_WAKE as libc::Ioctl,
                &mut arg as *mut UffdioRange,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// `UFFDIO_ZEROPAGE` of `len` bytes at `start` (registered `MISSING`, page-aligned):
    /// maps the zero page where no page is mapped (`EEXIST` where one is) and wakes the
    /// range. Only fills *missing* pages of private anonymous memory, whose contents are
    /// zero by definition (that is what the kernel itself maps on a read fault there), so
    /// it cannot change any byte a reader could have seen.
    ///
    /// The exception is a page that a copy-on-write in progress has just zapped (see
    /// [`crate::cow`]); that code holds its lock across the zap and refill, and its
    /// handler serialises missing faults behind the same lock.
    pub fn zeropage(&self, start: usize, len: usize) -> io::Result<()> {
        let mut arg = UffdioZeropage {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode: 0,
            zeropage: 0,
        };
        // SAFETY: UFFDIO_ZEROPAGE reads and writes one uffdio_zeropage, a live local; it only
        // maps zero pages into holes of a range registered with this fd (see above).
        let r = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                UFFDIO_ZEROPAGE as libc::Ioctl,
                &mut arg as *mut UffdioZeropage,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// `UFFDIO_COPY`: maps a fresh page holding `src` at `dst` (page-aligned, in a range
    /// registered `MISSING` with this fd, where no page is mapped), then wakes `dst`.
    ///
    /// # Safety
    ///
    /// Whatever was logically at `dst` (zeros, for an anonymous hole) is replaced by `src`,
    /// behind the back of any reference to that memory. The caller must know that `src`
    /// holds exactly the bytes `dst` is meant to contain — as the copy-on-write in
    /// [`crate::sys::cow`] does, which just saved them from the page it zapped.
    pub(crate) unsafe fn copy_page(&self, dst: usize, src: &[u8]) -> io::Result<()> {
        let mut arg = UffdioCopy {
            dst: dst as u64,
            src: src.as_ptr() as u64,
            len: src.len() as u64,
            mode: 0,
            copy: 0,
        };
        // SAFETY: UFFDIO_COPY reads and writes one uffdio_copy, a live local, and reads
        // src.len() bytes at src (a live slice); what it writes at dst is the caller's
        // responsibility (see # Safety).
        let r = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                UFFDIO_COPY as libc::Ioctl,
                &mut arg as *mut UffdioCopy,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// `UFFDIO_REGISTER` of `len` bytes at `start`, for ranges the caller does not borrow
    /// (the copy-on-write engine registers pages it has no slice for after a `mremap`).
    pub fn register_range(&self, start: usize, len: usize, mode: RegisterMode) -> io::Result<u64> {
        let mut arg = UffdioRegister {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode: mode.0,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes exactly one uffdio_register, a live
        // local; registering a range changes only how future faults on it are handled, and
        // the kernel validates the range (EINVAL for unaligned or unmapped memory).
        let r = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                UFFDIO_REGISTER as libc::Ioctl,
                &mut arg as *mut UffdioRegister,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(arg.ioctls)
    }

    /// `UFFDIO_UNREGISTER` of `len` bytes at `start`. The kernel also drops every
    /// write-protect bit this fd set there and wakes threads waiting on the range.
    pub fn unregister_range(&self, start: usize, len: usize) -> io::Result<()> {
        let mut arg = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        // SAFETY: UFFDIO_UNREGISTER reads one uffdio_range, a live local.
        let r = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                UFFDIO_UNREGISTER as libc::Ioctl,
                &mut arg as *mut UffdioRange,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// `UFFDIO_WRITEPROTECT` of `len` bytes at `start` (see [`Userfaultfd::write_protect`]).
    pub fn write_protect_range(&self, start: usize, len: usize, protect: bool) -> io::Result<()> {
        let mut arg = UffdioWriteprotect {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode: if protect {
                UFFDIO_WRITEPROTECT_MODE_WP
            } else {
                0
            },
        };
        // SAFETY: UFFDIO_WRITEPROTECT reads one uffdio_writeprotect, a live local; changing
        // the protection of registered pages cannot make any Rust reference dangle.
        let r = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                UFFDIO_WRITEPROTECT as libc::Ioctl,
                &mut arg as *mut UffdioWriteprotect,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::{page_size, PageBuf};

    #[test]
    fn ioctl_numbers_match_the_uapi_header() {
        // Values as the 6.x header expands them on x86_64/aarch64.
        assert_eq!(UFFDIO_API, 0xC018_AA3F);
        assert_eq!(UFFDIO_REGISTER, 0xC020_AA00);
        assert_eq!(UFFDIO_UNREGISTER, 0x8010_AA01);
        assert_eq!(UFFDIO_WRITEPROTECT, 0xC018_AA06);
        assert_eq!(UFFDIO_WAKE, 0x8010_AA02);
        assert_eq!(UFFDIO_COPY, 0xC028_AA03);
        assert_eq!(UFFDIO_ZEROPAGE, 0xC020_AA04);
        assert_eq!((RegisterMode::MISSING | RegisterMode::WP).0, 3);
    }

    #[test]
    fn write_protect_round_trip_on_anonymous_memory() {
        // Kernel 6.18 with CONFIG_USERFAULTFD and PTE_MARKER_UFFD_WP (docs/measurements/kernel-findings.md §6).
        let uffd = Userfaultfd::user_mode_only().expect("userfaultfd(USER_MODE_ONLY)");
        let api = uffd.api(0).expect("UFFDIO_API");
        assert!(
            api.has(UFFD_FEATURE_PAGEFAULT_FLAG_WP),
            "features {:#x}",
            api.features
        );
        let buf = PageBuf::new(4 * page_size()).unwrap();
        let ioctls = uffd
            .register(buf.as_slice(), RegisterMode::WP)
            .expect("register WP");
        assert_ne!(ioctls & IOCTL_BIT_WRITEPROTECT, 0, "ioctls {ioctls:#x}");
        uffd.write_protect(buf.as_slice(), true).expect("protect");
        uffd.write_protect(buf.as_slice(), false)
            .expect("unprotect");
        uffd.unregister(buf.as_slice()).expect("unregister");
        // A misaligned range is refused, not silently rounded.
        let err = uffd
            .register(&buf.as_slice()[1..page_size() + 1], RegisterMode::WP)
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn second_handshake_is_refused() {
        let uffd = Userfaultfd::user_mode_only().unwrap();
        uffd.api(0).unwrap();
        assert!(uffd.api(0).is_err());
    }

    #[test]
    fn decodes_pagefault_and_remap_messages() {
        let mut m = [0u8; UFFD_MSG_SIZE];
        m[0] = 0x12;
        m[8..16]
            .copy_from_slice(&(UFFD_PAGEFAULT_FLAG_WP | UFFD_PAGEFAULT_FLAG_WRITE).to_ne_bytes());
        m[16..24].copy_from_slice(&0x7000_1000u64.to_ne_bytes());
        assert_eq!(
            UffdEvent::decode(&m),
            Some(UffdEvent::Pagefault {
                flags: 3,
                address: 0x7000_1000
            })
        );
        m[0] = 0x14;
        m[24..32].copy_from_slice(&8192u64.to_ne_bytes());
        assert_eq!(
            UffdEvent::decode(&m),
            Some(UffdEvent::Remap {
                from: 3,
                to: 0x7000_1000,
                len: 8192
            })
        );
        m[0] = 0x16;
        assert_eq!(UffdEvent::decode(&m), Some(UffdEvent::Other(0x16)));
        assert_eq!(UffdEvent::decode(&m[..31]), None);
    }

    #[test]
    fn empty_queue_reads_nothing_and_wake_is_harmless() {
        let uffd = Userfaultfd::user_mode_only().unwrap();
        uffd.api(0).unwrap();
        let mut out = [None; EVENT_BATCH];
        assert_eq!(uffd.read_events(&mut out).unwrap(), 0);
        let buf = PageBuf::new(page_size()).unwrap();
        uffd.register(buf.as_slice(), RegisterMode::MISSING | RegisterMode::WP)
            .unwrap();
        uffd.wake(buf.as_ptr() as usize, page_size()).unwrap();
        // A populated page is not missing: the zero page is not mapped over it.
        let err = uffd
            .zeropage(buf.as_ptr() as usize, page_size())
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EEXIST));
        uffd.unregister_range(buf.as_ptr() as usize, page_size())
            .unwrap();
    }
}

/// Whether this process may have *kernel-mode* faults on its registered memory handled —
/// a userfaultfd without `UFFD_USER_MODE_ONLY` — which would let a kernel write into a page
/// in flight (`read(2)`, io_uring, any raw system call) sleep on the handler and take the
/// copy-on-write instead of failing with `EFAULT` (userfaultfd(2), "unprivileged_userfaultfd";
/// Documentation/admin-guide/mm/userfaultfd.rst). Reported, not used: see
/// docs/measurements/preload.md ("Kernel-mode faults: probed, reported, not used").
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct KernelFaults {
    /// `/proc/sys/vm/unprivileged_userfaultfd` (1: anyone may; 0: only with
    /// `CAP_SYS_PTRACE`); `None` if unreadable.
    pub unprivileged_sysctl: Option<u8>,
    /// `CAP_SYS_PTRACE` is in the process's effective set (`/proc/self/status` `CapEff`).
    pub cap_sys_ptrace: bool,
    /// `userfaultfd(2)` without `UFFD_USER_MODE_ONLY`: `None` if it gave a descriptor (closed
    /// at once), else its errno. Not tried (`Some(EPERM)`) where the sysctl and the
    /// capability both say no: the kernel would log a line for the refusal.
    pub syscall_errno: Option<i32>,
    /// `/dev/userfaultfd` (Linux 6.1; its file mode decides): `None` if opened and
    /// `USERFAULTFD_IOC_NEW` gave a descriptor, else the errno (`ENOENT`: no device).
    pub dev_errno: Option<i32>,
}

impl KernelFaults {
    /// Whether some way to handle kernel-mode faults is open to this process.
    pub fn allowed(&self) -> bool {
        self.syscall_errno.is_none() || self.dev_errno.is_none()
    }
}

/// `USERFAULTFD_IOC_NEW` (linux/userfaultfd.h: `_IO(0xAA, 0x00)`).
const USERFAULTFD_IOC_NEW: u64 = 0xAA00;

/// Finds out (see [`KernelFaults`]) with at most one `userfaultfd(2)` and one open of
/// `/dev/userfaultfd`; every descriptor made is closed before it returns.
pub fn kernel_faults() -> KernelFaults {
    let unprivileged_sysctl = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd")
        .ok()
        .and_then(|s| s.trim().parse().ok());
    const CAP_SYS_PTRACE: u32 = 19;
    let cap_sys_ptrace = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))?
                .trim()
                .to_owned();
            u64::from_str_radix(&hex, 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_PTRACE) != 0);
    let flags = libc::O_NONBLOCK | libc::O_CLOEXEC;
    let syscall_errno = if unprivileged_sysctl == Some(0) && !cap_sys_ptrace {
        Some(libc::EPERM)
    } else {
        // SAFETY: userfaultfd takes one int of flags and touches no user memory.
        let r = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
        fd_or_errno(r)
    };
    let dev_errno = match std::fs::File::options()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd")
    {
        Err(e) => Some(e.raw_os_error().unwrap_or(libc::ENOENT)),
        Ok(dev) => {
            // SAFETY: USERFAULTFD_IOC_NEW takes the new descriptor's flags as its argument
            // and touches no user memory.
            let r = unsafe {
                libc::ioctl(
                    dev.as_raw_fd(),
                    USERFAULTFD_IOC_NEW as libc::Ioctl,
                    flags as libc::c_ulong,
                )
            };
            fd_or_errno(libc::c_long::from(r))
        }
    };
    KernelFaults {
        unprivileged_sysctl,
        cap_sys_ptrace,
        syscall_errno,
        dev_errno,
    }
}

/// Closes the descriptor a call returned (`None`), or its errno.
fn fd_or_errno(r: libc::c_long) -> Option<i32> {
    match i32::try_from(r) {
        Ok(fd) if fd >= 0 => {
            // SAFETY: the call just returned this descriptor; nothing else owns it.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
            None
        }
        _ => Some(
            io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL),
        ),
    }
}
