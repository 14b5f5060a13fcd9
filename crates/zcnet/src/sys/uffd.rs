//! userfaultfd write-protect (`UFFD_USER_MODE_ONLY`, `UFFDIO_REGISTER_MODE_WP`,
//! `UFFDIO_WRITEPROTECT`): the mechanism that can guard a loaned buffer against writes while
//! the kernel may still read it (findings §6, Documentation/admin-guide/mm/userfaultfd.rst,
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

/// `UFFDIO_WRITEPROTECT_MODE_WP`: protect (without it: unprotect).
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;

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

fn range_of(mem: &[u8]) -> UffdioRange {
    UffdioRange {
        start: mem.as_ptr() as u64,
        len: mem.len() as u64,
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
        Ok(Userfaultfd {
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
        })
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
        let mut arg = UffdioRegister {
            range: range_of(mem),
            mode: mode.0,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes exactly one uffdio_register, a live local;
        // the range names memory we borrow, and registering it changes only how future
        // faults on it are handled.
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

    /// `UFFDIO_UNREGISTER` of `mem`.
    pub fn unregister(&self, mem: &[u8]) -> io::Result<()> {
        let mut arg = range_of(mem);
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

    /// `UFFDIO_WRITEPROTECT` of `mem` (registered with [`RegisterMode::WP`]): protects
    /// when `protect`, else removes the protection and wakes threads waiting on it.
    pub fn write_protect(&self, mem: &[u8], protect: bool) -> io::Result<()> {
        let mut arg = UffdioWriteprotect {
            range: range_of(mem),
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
    use crate::sys::mem::{page_size, PageBuf};

    #[test]
    fn ioctl_numbers_match_the_uapi_header() {
        // Values as the 6.x header expands them on x86_64/aarch64.
        assert_eq!(UFFDIO_API, 0xC018_AA3F);
        assert_eq!(UFFDIO_REGISTER, 0xC020_AA00);
        assert_eq!(UFFDIO_UNREGISTER, 0x8010_AA01);
        assert_eq!(UFFDIO_WRITEPROTECT, 0xC018_AA06);
        assert_eq!((RegisterMode::MISSING | RegisterMode::WP).0, 3);
    }

    #[test]
    fn write_protect_round_trip_on_anonymous_memory() {
        // Kernel 6.18 with CONFIG_USERFAULTFD and PTE_MARKER_UFFD_WP (findings §6).
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
}
