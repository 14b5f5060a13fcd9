//! How the receiver opens a file it reads or writes data in: only a regular file, never
//! through a symlink, and never in a way that can block on what is there.
//!
//! Every final name, partial file and `.ranges` record is opened here, with `O_NOFOLLOW |
//! O_NONBLOCK` beneath its directory ([`super::resolve::open_beneath`]) and checked with
//! `fstat` before a byte is read or written. Without `O_NONBLOCK`, opening a FIFO for reading
//! waits for a writer and for writing waits for a reader (fifo(7)), for ever: a local user
//! who can write into the receive directory and plants a FIFO under a name the receiver will
//! open — a partial file's name is computable from the sender's address — would hang the
//! session in `open`. With it, a FIFO opens at once and `fstat` shows what it is; a socket
//! fails `ENXIO`; a device is refused before any `read`/`ioctl`. Once the file is known to be
//! regular, `O_NONBLOCK` is cleared (it means nothing for a regular file on the file systems
//! we know, but a file system may give it a meaning).

use super::resolve::{open_beneath_by, Resolution};
use rustix::fs::{FileType, OFlags};
use std::fs::File;
use std::io;
use std::os::fd::AsFd;

/// Why a data file was not opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// Something other than a regular file is under the name.
    #[error("{0}, not a regular file (only regular files are opened for data)")]
    NotRegular(&'static str),
    /// The name is a symlink (never followed).
    #[error("a symlink (never followed)")]
    Symlink,
    /// The open (or its check) failed.
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl OpenError {
    /// The `errno`, for callers that branch on it (`EEXIST` of `O_EXCL`, `ENOENT`).
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            OpenError::Io(e) => e.raw_os_error(),
            _ => None,
        }
    }
}

impl From<OpenError> for io::Error {
    fn from(e: OpenError) -> Self {
        match e {
            OpenError::Io(e) => e,
            other => io::Error::other(other.to_string()),
        }
    }
}

/// A file type named for people ("a FIFO", "a socket", …).
pub fn kind_of(ft: FileType) -> &'static str {
    match ft {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symlink",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        _ => "of an unknown type",
    }
}

/// Opens `name` beneath `dir` for data with `flags` (`O_CREAT`, `O_EXCL`, … as the caller
/// needs; `O_NOFOLLOW | O_NONBLOCK` are added), only if it is a regular file.
pub fn open_regular(
    how: Resolution,
    dir: impl AsFd,
    name: &str,
    flags: OFlags,
    mode: u32,
) -> Result<File, OpenError> {
    let fd = open_beneath_by(
        how,
        &dir,
        name,
        flags | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY,
        mode,
    )
    .map_err(|e| match e.raw_os_error() {
        // A socket cannot be opened at all, nor a FIFO for writing without a reader, nor a
        // device without its driver: what is there, for the reason.
        Some(libc::ENXIO) => {
            match rustix::fs::statat(&dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => OpenError::NotRegular(kind_of(FileType::from_raw_mode(st.st_mode))),
                Err(_) => OpenError::Io(e),
            }
        }
        Some(libc::ELOOP) => OpenError::Symlink,
        _ => OpenError::Io(e),
    })?;
    let st = rustix::fs::fstat(&fd).map_err(io::Error::from)?;
    let ft = FileType::from_raw_mode(st.st_mode);
    if ft != FileType::RegularFile {
        return Err(OpenError::NotRegular(kind_of(ft)));
    }
    let fl = rustix::fs::fcntl_getfl(&fd).map_err(io::Error::from)?;
    rustix::fs::fcntl_setfl(&fd, fl - OFlags::NONBLOCK).map_err(io::Error::from)?;
    Ok(File::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::Mode;

    #[test]
    fn fifos_sockets_and_symlinks_are_refused_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let fd =
            rustix::fs::open(d.path(), OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).unwrap();
        rustix::fs::mknodat(&fd, "fifo", FileType::Fifo, Mode::from_raw_mode(0o600), 0).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(d.path().join("sock")).unwrap();
        std::os::unix::fs::symlink("file", d.path().join("link")).unwrap();
        std::fs::write(d.path().join("file"), b"data").unwrap();
        for how in [Resolution::Kernel, Resolution::Walk] {
            if how == Resolution::Kernel
                && super::super::resolve::kernel_resolution() != Resolution::Kernel
            {
                continue;
            }
            for flags in [OFlags::RDONLY, OFlags::RDWR, OFlags::WRONLY] {
                let e = open_regular(how, &fd, "fifo", flags, 0).unwrap_err();
                assert!(matches!(e, OpenError::NotRegular("a FIFO")), "{e}");
                let e = open_regular(how, &fd, "sock", flags, 0).unwrap_err();
                assert!(matches!(e, OpenError::NotRegular(_)), "{e}");
                let e = open_regular(how, &fd, "link", flags, 0).unwrap_err();
                assert!(matches!(e, OpenError::Symlink), "{e}");
            }
            let f = open_regular(how, &fd, "file", OFlags::RDWR, 0).unwrap();
            let fl = rustix::fs::fcntl_getfl(&f).unwrap();
            assert!(!fl.contains(OFlags::NONBLOCK), "cleared once known regular");
            let mut s = String::new();
            std::io::Read::read_to_string(&mut &f, &mut s).unwrap();
            assert_eq!(s, "data");
        }
    }
}
