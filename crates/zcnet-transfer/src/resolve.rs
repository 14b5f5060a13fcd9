//! Paths beneath the receive directory, resolved so that they never leave it.
//!
//! Two questions are asked of a path under the directory, and each has two ways of being
//! answered ([`Resolution`]):
//!
//! * **Opening for the receiver's own use** ([`open_beneath`]): never through any symlink.
//!   With the kernel's `openat2(2)` this is `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//!   RESOLVE_NO_MAGICLINKS`; without it, a walk that opens one component at a time with
//!   `O_NOFOLLOW` (intermediate ones `O_DIRECTORY`), refusing `..` (the names reaching here
//!   were checked by [`super::names`] and have none).
//! * **Where a symlink's target goes, as a reader following links would find it**
//!   ([`check_follows_inside`]): with `openat2(O_PATH, RESOLVE_BENEATH |
//!   RESOLVE_NO_MAGICLINKS)` the kernel follows every symlink and fails with `EXDEV` at the
//!   first step that would leave the directory (openat2(2)); without it, the same walk done
//!   here — a stack of the directories passed through, each symlink's target spliced in
//!   front of what is left, `..` popping one, popping the directory itself or an absolute
//!   target being the escape, more than 40 symlinks a loop (path_resolution(7)). A path
//!   that stops at a name not there (yet) is inside as far as it goes.
//!
//! `openat2` is probed once per process ([`kernel_resolution`]) and the answer kept, as
//! quinn-udp keeps its GSO probe: a kernel without it (before 5.6, or a seccomp filter
//! answering `ENOSYS`) gets the walk, which is slower (a syscall per component) and gives the
//! same answers.

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU8, Ordering};

/// How paths beneath the directory are resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resolution {
    /// The kernel's `openat2(2)` with `RESOLVE_BENEATH` (Linux 5.6 on).
    Kernel,
    /// One component at a time, here (every kernel).
    Walk,
}

/// 0: not probed; 1: `openat2` works; 2: it does not.
static OPENAT2: AtomicU8 = AtomicU8::new(0);

/// Whether this kernel resolves beneath a directory itself (`openat2` with
/// `RESOLVE_BENEATH`), probed once on the current directory's `.` and kept.
pub fn kernel_resolution() -> Resolution {
    match OPENAT2.load(Ordering::Relaxed) {
        1 => return Resolution::Kernel,
        2 => return Resolution::Walk,
        _ => {}
    }
    let works = match rustix::fs::openat2(
        rustix::fs::CWD,
        ".",
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
    ) {
        Ok(_) => true,
        // No such call (old kernel, seccomp) or flags it does not know.
        Err(Errno::NOSYS) | Err(Errno::INVAL) | Err(Errno::PERM) => false,
        // Anything else (EACCES on a cwd we may not search, …) says the call exists.
        Err(_) => true,
    };
    OPENAT2.store(if works { 1 } else { 2 }, Ordering::Relaxed);
    if works {
        Resolution::Kernel
    } else {
        Resolution::Walk
    }
}

/// Most symlinks one resolution follows before calling it a loop (the kernel's
/// `MAXSYMLINKS`, path_resolution(7)).
const MAX_LINKS: usize = 40;

/// Retries of an `openat2` that answered `EAGAIN` (a rename elsewhere on the system raced
/// the lookup; openat2(2) asks the caller to retry) before the answer is taken as an error.
const AGAIN: usize = 64;

fn openat2_retrying(
    dir: impl AsFd,
    path: &str,
    flags: OFlags,
    mode: u32,
    how: ResolveFlags,
) -> Result<OwnedFd, Errno> {
    let mut again = 0;
    loop {
        match rustix::fs::openat2(
            &dir,
            path,
            flags | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
            how,
        ) {
            Err(Errno::INTR) => continue,
            Err(Errno::AGAIN) if again < AGAIN => again += 1,
            r => return r,
        }
    }
}

fn openat_retrying(dir: impl AsFd, name: &str, flags: OFlags, mode: u32) -> Result<OwnedFd, Errno> {
    loop {
        match rustix::fs::openat(
            &dir,
            name,
            flags | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        ) {
            Err(Errno::INTR) => continue,
            r => return r,
        }
    }
}

/// Opens `path` beneath `dir` without following any symlink on the way or at the end
/// (`ELOOP` or `EXDEV` when one is there), by the kernel where it can ([`kernel_resolution`]).
pub fn open_beneath(dir: impl AsFd, path: &str, flags: OFlags, mode: u32) -> io::Result<OwnedFd> {
    open_beneath_by(kernel_resolution(), dir, path, flags, mode)
}

/// [`open_beneath`] by the given [`Resolution`].
pub fn open_beneath_by(
    how: Resolution,
    dir: impl AsFd,
    path: &str,
    flags: OFlags,
    mode: u32,
) -> io::Result<OwnedFd> {
    match how {
        Resolution::Kernel => openat2_retrying(
            dir,
            path,
            flags,
            mode,
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(io::Error::from),
        Resolution::Walk => walk_open(dir.as_fd(), path, flags, mode),
    }
}

/// The walk behind [`open_beneath_by`]: each directory on the way opened `O_DIRECTORY |
/// O_NOFOLLOW` from the one before, the last component with `flags | O_NOFOLLOW`.
fn walk_open(
    dir: rustix::fd::BorrowedFd<'_>,
    path: &str,
    flags: OFlags,
    mode: u32,
) -> io::Result<OwnedFd> {
    if path.starts_with('/') {
        return Err(Errno::XDEV.into());
    }
    let parts: Vec<&str> = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if parts.contains(&"..") {
        // Beneath means no climbing: the names that reach here never have `..`.
        return Err(Errno::XDEV.into());
    }
    let Some((last, dirs)) = parts.split_last() else {
        return openat_retrying(dir, ".", flags | OFlags::NOFOLLOW, mode).map_err(Into::into);
    };
    let mut here: Option<OwnedFd> = None;
    for d in dirs {
        let next = match &here {
            Some(h) => {
                openat_retrying(h, d, OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW, 0)
            }
            None => openat_retrying(
                dir,
                d,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW,
                0,
            ),
        };
        // `O_PATH | O_NOFOLLOW` opens a symlink itself rather than failing; with
        // `O_DIRECTORY` it fails `ENOTDIR` — a symlink on the way is `ELOOP`, as openat2 says.
        let next = next.map_err(|e| {
            let at = match &here {
                Some(h) => rustix::fs::statat(h, *d, AtFlags::SYMLINK_NOFOLLOW),
                None => rustix::fs::statat(dir, *d, AtFlags::SYMLINK_NOFOLLOW),
            };
            match at {
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => Errno::LOOP,
                _ => e,
            }
        })?;
        here = Some(next);
    }
    let r = match &here {
        Some(h) => openat_retrying(h, last, flags | OFlags::NOFOLLOW, mode),
        None => openat_retrying(dir, last, flags | OFlags::NOFOLLOW, mode),
    };
    r.map_err(Into::into)
}

/// Why a symlink's target would not stay beneath the directory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Escape {
    /// Following it, as the file system does, leaves the directory.
    #[error("following it leaves the receive directory")]
    Leaves,
    /// More than 40 symlinks on the way (a loop, or a chain too long to follow).
    #[error("it goes through more than 40 symlinks (a loop?)")]
    Loop,
    /// The path could not be looked at.
    #[error("resolving it: {0}")]
    Io(#[source] io::Error),
}

/// Whether `path` (relative to `dir`), resolved as a reader following every symlink would
/// resolve it, stays beneath `dir` — as far as it exists: a path that stops at a missing
/// name, or at a file where a directory is needed, is judged on what it went through.
pub fn check_follows_inside(how: Resolution, dir: impl AsFd, path: &str) -> Result<(), Escape> {
    match how {
        Resolution::Kernel => match openat2_retrying(
            dir,
            path,
            OFlags::PATH,
            0,
            ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
        ) {
            Ok(_) | Err(Errno::NOENT) | Err(Errno::NOTDIR) => Ok(()),
            Err(Errno::XDEV) => Err(Escape::Leaves),
            Err(Errno::LOOP) => Err(Escape::Loop),
            Err(e) => Err(Escape::Io(e.into())),
        },
        Resolution::Walk => walk_follow(dir.as_fd(), path),
    }
}

/// The walk behind [`check_follows_inside`] (see the module doc).
fn walk_follow(dir: rustix::fd::BorrowedFd<'_>, path: &str) -> Result<(), Escape> {
    let io = |e: Errno| Escape::Io(e.into());
    if path.starts_with('/') {
        return Err(Escape::Leaves);
    }
    // The directories passed through, below `dir` (empty: at `dir` itself).
    let mut stack: Vec<OwnedFd> = Vec::new();
    let mut todo: VecDeque<String> = path.split('/').map(str::to_string).collect();
    let mut links = 0usize;
    while let Some(c) = todo.pop_front() {
        match c.as_str() {
            "" | "." => {}
            ".." => {
                if stack.pop().is_none() {
                    return Err(Escape::Leaves);
                }
            }
            name => {
                let st = match stack.last() {
                    Some(h) => rustix::fs::statat(h, name, AtFlags::SYMLINK_NOFOLLOW),
                    None => rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW),
                };
                let st = match st {
                    Ok(st) => st,
                    Err(Errno::NOENT) | Err(Errno::NOTDIR) => return Ok(()),
                    Err(e) => return Err(io(e)),
                };
                match FileType::from_raw_mode(st.st_mode) {
                    FileType::Symlink => {
                        links += 1;
                        if links > MAX_LINKS {
                            return Err(Escape::Loop);
                        }
                        let target = match stack.last() {
                            Some(h) => rustix::fs::readlinkat(h, name, Vec::new()),
                            None => rustix::fs::readlinkat(dir, name, Vec::new()),
                        }
                        .map_err(io)?;
                        let target = target.to_string_lossy().into_owned();
                        if target.starts_with('/') {
                            return Err(Escape::Leaves);
                        }
                        for t in target.split('/').rev() {
                            todo.push_front(t.to_string());
                        }
                    }
                    FileType::Directory => {
                        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW;
                        let fd = match stack.last() {
                            Some(h) => openat_retrying(h, name, flags, 0),
                            None => openat_retrying(dir, name, flags, 0),
                        };
                        match fd {
                            Ok(fd) => stack.push(fd),
                            // Replaced or removed since the look: judged on what it was.
                            Err(Errno::NOENT) | Err(Errno::NOTDIR) | Err(Errno::LOOP) => {
                                return Ok(())
                            }
                            Err(e) => return Err(io(e)),
                        }
                    }
                    // A file: the path ends here (or would fail `ENOTDIR` past it).
                    _ => return Ok(()),
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn dir_fd(p: &std::path::Path) -> OwnedFd {
        rustix::fs::open(p, OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).unwrap()
    }

    /// The resolutions to compare: the walk always, and the kernel's where the build found
    /// `openat2` (`zcnet_has_openat2`; without it the kernel half is
    /// [`the_kernel_resolves_with_openat2_where_the_build_found_it`], ignored with why).
    fn both() -> Vec<Resolution> {
        if cfg!(zcnet_has_openat2) {
            assert_eq!(
                kernel_resolution(),
                Resolution::Kernel,
                "openat2, which the build found"
            );
            vec![Resolution::Kernel, Resolution::Walk]
        } else {
            vec![Resolution::Walk]
        }
    }

    #[cfg_attr(
        not(zcnet_has_openat2),
        ignore = "needs openat2 (Linux 5.6): the kernel half of the resolution tests"
    )]
    #[test]
    fn the_kernel_resolves_with_openat2_where_the_build_found_it() {
        assert_eq!(kernel_resolution(), Resolution::Kernel);
        assert_eq!(both(), [Resolution::Kernel, Resolution::Walk]);
    }

    #[test]
    fn both_resolutions_judge_the_chains_alike() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("dir");
        std::fs::create_dir_all(root.join("d1/d2")).unwrap();
        symlink(".", root.join("q")).unwrap();
        symlink("..", root.join("d1/up")).unwrap();
        symlink(".", root.join("r")).unwrap();
        symlink("/etc", root.join("abs")).unwrap();
        symlink("loop2", root.join("loop1")).unwrap();
        symlink("loop1", root.join("loop2")).unwrap();
        symlink("../..", root.join("d1/d2/top")).unwrap();
        let fd = dir_fd(&root);
        let deep = format!("{}../..", "r/".repeat(20));
        for how in both() {
            let inside = |p: &str| check_follows_inside(how, &fd, p).is_ok();
            let leaves = |p: &str| matches!(check_follows_inside(how, &fd, p), Err(Escape::Leaves));
            assert!(inside("q/q/q"), "{how:?}");
            assert!(leaves("q/q/q/../../.."), "{how:?}");
            assert!(inside("d1/up"), "{how:?}");
            assert!(leaves("d1/up/.."), "{how:?}");
            assert!(leaves(&deep), "{how:?}");
            assert!(leaves("abs"), "{how:?}");
            assert!(leaves("abs/missing"), "{how:?}");
            assert!(inside("d1/d2/top/d1/d2/top/q"), "{how:?}");
            assert!(leaves("d1/d2/top/.."), "{how:?}");
            assert!(
                inside("missing/../../.."),
                "{how:?}: stops at the missing name"
            );
            assert!(
                matches!(check_follows_inside(how, &fd, "loop1"), Err(Escape::Loop)),
                "{how:?}"
            );
        }
    }

    #[test]
    fn opening_beneath_never_follows_a_symlink_by_either_resolution() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("a/b")).unwrap();
        std::fs::write(t.path().join("a/b/f"), b"x").unwrap();
        symlink("b", t.path().join("a/lb")).unwrap();
        symlink("f", t.path().join("a/b/lf")).unwrap();
        let fd = dir_fd(t.path());
        for how in both() {
            assert!(open_beneath_by(how, &fd, "a/b/f", OFlags::RDONLY, 0).is_ok());
            let e = open_beneath_by(how, &fd, "a/lb/f", OFlags::RDONLY, 0).unwrap_err();
            assert!(
                matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::EXDEV)),
                "{how:?}: {e}"
            );
            let e = open_beneath_by(how, &fd, "a/b/lf", OFlags::RDONLY, 0).unwrap_err();
            assert!(
                matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::EXDEV)),
                "{how:?}: {e}"
            );
            // Out of the directory, by `..` or by an absolute path: never.
            assert!(open_beneath_by(how, &fd, "../x", OFlags::RDONLY, 0).is_err());
            assert!(open_beneath_by(how, &fd, "a/../../x", OFlags::RDONLY, 0).is_err());
            assert!(open_beneath_by(how, &fd, "/etc/passwd", OFlags::RDONLY, 0).is_err());
        }
    }
}
