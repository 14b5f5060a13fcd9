//! The receiver's side of the file system: where received data may go, and how a file
//! becomes final.
//!
//! Rules (DESIGN.md, "Files and sockets we own"):
//! * names are checked by [`super::names`]; every directory and file is opened relative to
//!   the target directory with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, so neither
//!   `..` nor a symlink already in the tree (nor one planted during the transfer) can lead
//!   outside it;
//! * data goes to `NAME.partial`; only after the length and the BLAKE3 hash check out is it
//!   fsynced, given its mode and mtime, and renamed onto `NAME` (`RENAME_NOREPLACE` unless
//!   overwriting), and the directory fsynced — so a file with its final name is complete;
//! * an existing `NAME` is not overwritten unless asked; `max_bytes` caps what one sender
//!   may write; an interrupted file stays `NAME.partial`, for `--resume`.

use super::digest::hash_prefix;
use super::names::{components, NameError, PARTIAL_SUFFIX};
use super::wire::Code;
use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags, ResolveFlags};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

/// A file (or session) the receiver will not take, with the code sent to the sender.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    /// Protocol code.
    pub code: Code,
    /// For people (both sides print it).
    pub message: String,
}

impl Refusal {
    fn new(code: Code, message: impl Into<String>) -> Self {
        Refusal {
            code,
            message: message.into(),
        }
    }

    fn io(what: &str, name: &str, e: io::Error) -> Self {
        Refusal::new(Code::Io, format!("{what} {name:?}: {e}"))
    }
}

impl From<NameError> for Refusal {
    fn from(e: NameError) -> Self {
        Refusal::new(Code::UnsafeName, e.to_string())
    }
}

/// What the receiver allows.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct StoreOptions {
    /// Replace existing files.
    pub overwrite: bool,
    /// Continue an existing `NAME.partial`.
    pub resume: bool,
    /// Cap on the bytes one session may write.
    pub max_bytes: Option<u64>,
}

/// A target directory that received files go into.
#[derive(Debug)]
pub struct Store {
    dir: OwnedFd,
    opts: StoreOptions,
    written: u64,
}

const BENEATH: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_SYMLINKS);

fn open_beneath(dir: impl AsFd, name: &str, flags: OFlags, mode: u32) -> io::Result<OwnedFd> {
    loop {
        match rustix::fs::openat2(
            &dir,
            name,
            flags | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
            BENEATH,
        ) {
            Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => continue,
            r => return r.map_err(io::Error::from),
        }
    }
}

impl Store {
    /// Opens `dir` (which must exist and be a directory).
    pub fn open(dir: &Path, opts: StoreOptions) -> io::Result<Store> {
        let fd = rustix::fs::open(
            dir,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Store {
            dir: fd,
            opts,
            written: 0,
        })
    }

    /// Bytes accepted so far in this session (counted against `max_bytes`).
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Starts receiving `name` of `size` bytes (`None` for a stream of unknown size).
    pub fn begin(&mut self, name: &str, size: Option<u64>) -> Result<Incoming, Refusal> {
        let parts = components(name)?;
        if let (Some(max), Some(size)) = (self.opts.max_bytes, size) {
            if self.written.saturating_add(size) > max {
                return Err(Refusal::new(
                    Code::TooLarge,
                    format!(
                        "{name:?} ({size} bytes) would exceed this receiver's limit of {max} bytes per sender ({} already written)",
                        self.written
                    ),
                ));
            }
        }
        let (leaf, dirs) = parts.split_last().expect("components() is never empty");
        let mut parent =
            rustix::io::dup(&self.dir).map_err(|e| Refusal::io("opening", name, e.into()))?;
        for d in dirs {
            match rustix::fs::mkdirat(&parent, *d, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(Refusal::io("creating directory", d, e.into())),
            }
            parent =
                open_beneath(&parent, d, OFlags::DIRECTORY | OFlags::RDONLY, 0).map_err(|e| {
                    if e.raw_os_error() == Some(libc::ELOOP)
                        || e.raw_os_error() == Some(libc::EXDEV)
                    {
                        Refusal::new(
                            Code::UnsafeName,
                            format!("{name:?}: {d:?} is a symlink; refusing to follow it"),
                        )
                    } else {
                        Refusal::io("opening directory", d, e)
                    }
                })?;
        }
        match rustix::fs::statat(&parent, *leaf, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => {
                let is_reg = rustix::fs::FileType::from_raw_mode(st.st_mode)
                    == rustix::fs::FileType::RegularFile;
                if !self.opts.overwrite {
                    return Err(Refusal::new(
                        Code::Exists,
                        format!("{name:?} exists (use --overwrite to replace it)"),
                    ));
                }
                if !is_reg {
                    return Err(Refusal::new(
                        Code::Exists,
                        format!("{name:?} exists and is not a regular file"),
                    ));
                }
            }
            Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(Refusal::io("checking", name, e.into())),
        }
        let partial = format!("{leaf}{PARTIAL_SUFFIX}");
        let mut offset = 0;
        let mut prefix = None;
        let resumed = if self.opts.resume {
            match open_beneath(&parent, &partial, OFlags::RDWR, 0) {
                Ok(fd) => Some(File::from(fd)),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
                Err(e) => return Err(Refusal::io("opening", &partial, e)),
            }
        } else {
            None
        };
        let file = match resumed {
            Some(f) => {
                let have = f
                    .metadata()
                    .map_err(|e| Refusal::io("reading", &partial, e))?
                    .len();
                if size.is_some_and(|s| have <= s) && have > 0 {
                    offset = have;
                    prefix = Some(
                        hash_prefix(&f, have).map_err(|e| Refusal::io("hashing", &partial, e))?,
                    );
                } else {
                    // Nothing usable (longer than announced, or a stream): start over.
                    f.set_len(0)
                        .map_err(|e| Refusal::io("truncating", &partial, e))?;
                }
                f
            }
            None => File::from(
                open_beneath(
                    &parent,
                    &partial,
                    OFlags::RDWR | OFlags::CREATE | OFlags::TRUNC,
                    0o600,
                )
                .map_err(|e| Refusal::io("creating", &partial, e))?,
            ),
        };
        if let Some(s) = size {
            if s > offset {
                // Reserve the space now so a full disk shows up before the data flows.
                match rustix::fs::fallocate(
                    &file,
                    rustix::fs::FallocateFlags::KEEP_SIZE,
                    offset,
                    s - offset,
                ) {
                    Ok(()) | Err(rustix::io::Errno::OPNOTSUPP) | Err(rustix::io::Errno::NOSYS) => {}
                    Err(e) => return Err(Refusal::io("reserving space for", name, e.into())),
                }
            }
        }
        Ok(Incoming {
            parent,
            leaf: leaf.to_string(),
            partial,
            file,
            name: name.to_string(),
            size,
            offset,
            prefix,
            overwrite: self.opts.overwrite,
        })
    }

    /// Counts `n` bytes against the session cap; a refusal once it is exceeded (streams).
    pub fn charge(&mut self, n: u64) -> Result<(), Refusal> {
        self.written = self.written.saturating_add(n);
        match self.opts.max_bytes {
            Some(max) if self.written > max => Err(Refusal::new(
                Code::TooLarge,
                format!("this receiver's limit of {max} bytes per sender is exceeded"),
            )),
            _ => Ok(()),
        }
    }
}

/// A file being received into `NAME.partial`.
#[derive(Debug)]
pub struct Incoming {
    parent: OwnedFd,
    leaf: String,
    partial: String,
    file: File,
    name: String,
    size: Option<u64>,
    offset: u64,
    prefix: Option<[u8; 32]>,
    overwrite: bool,
}

impl Incoming {
    /// The partial file, to write the data into at the right offsets.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The name as sent.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Announced size (`None`: stream).
    pub fn size(&self) -> Option<u64> {
        self.size
    }

    /// Where data resumes (bytes already in the partial file).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// BLAKE3 of the bytes already there (resume only).
    pub fn prefix(&self) -> Option<[u8; 32]> {
        self.prefix
    }

    /// The sender will not resume: start the partial file over.
    pub fn restart(&mut self) -> Result<(), Refusal> {
        self.file
            .set_len(0)
            .map_err(|e| Refusal::io("truncating", &self.partial, e))?;
        self.offset = 0;
        self.prefix = None;
        Ok(())
    }

    /// Verifies length and hash, syncs, sets mode and mtime, and renames onto the final name.
    /// On a failed check the partial file is removed (its bytes are wrong) and the refusal
    /// says why; nothing with the final name is created.
    pub fn finish(
        self,
        hash: Option<[u8; 32]>,
        mode: u32,
        mtime: (i64, u32),
    ) -> Result<u64, Refusal> {
        let len = self
            .file
            .metadata()
            .map_err(|e| Refusal::io("checking", &self.partial, e))?
            .len();
        if let Some(s) = self.size {
            if len != s {
                self.discard();
                return Err(Refusal::new(
                    Code::Length,
                    format!("{:?}: received {len} bytes, announced {s}", self.name),
                ));
            }
        }
        if let Some(want) = hash {
            let got = hash_prefix(&self.file, len)
                .map_err(|e| Refusal::io("hashing", &self.partial, e))?;
            if got != want {
                self.discard();
                return Err(Refusal::new(
                    Code::HashMismatch,
                    format!(
                        "{:?}: BLAKE3 hash of the received data differs from the sender's",
                        self.name
                    ),
                ));
            }
        }
        let io_err = |what: &str, e: io::Error| Refusal::io(what, &self.name, e);
        rustix::fs::fchmod(&self.file, Mode::from_raw_mode(mode & 0o7777))
            .map_err(|e| io_err("setting mode of", e.into()))?;
        let t = rustix::fs::Timespec {
            tv_sec: mtime.0,
            tv_nsec: mtime.1.min(999_999_999) as _,
        };
        rustix::fs::futimens(
            &self.file,
            &rustix::fs::Timestamps {
                last_access: t,
                last_modification: t,
            },
        )
        .map_err(|e| io_err("setting mtime of", e.into()))?;
        self.file.sync_all().map_err(|e| io_err("syncing", e))?;
        let flags = if self.overwrite {
            RenameFlags::empty()
        } else {
            RenameFlags::NOREPLACE
        };
        rustix::fs::renameat_with(&self.parent, &self.partial, &self.parent, &self.leaf, flags)
            .map_err(|e| {
                if e == rustix::io::Errno::EXIST {
                    Refusal::new(
                        Code::Exists,
                        format!(
                            "{:?} appeared during the transfer; kept as {}",
                            self.name, self.partial
                        ),
                    )
                } else {
                    io_err("renaming", e.into())
                }
            })?;
        rustix::fs::fsync(&self.parent)
            .map_err(|e| io_err("syncing the directory of", e.into()))?;
        Ok(len)
    }

    /// Removes the partial file (its contents are known to be wrong).
    pub fn discard(&self) {
        let _ = rustix::fs::unlinkat(&self.parent, &self.partial, AtFlags::empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::{symlink, MetadataExt};

    fn store(opts: StoreOptions) -> (tempfile::TempDir, Store) {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path(), opts).unwrap();
        (d, s)
    }

    fn write(inc: &Incoming, data: &[u8]) {
        let mut f = inc.file();
        f.write_all(data).unwrap();
    }

    #[test]
    fn a_verified_file_becomes_final_with_mode_and_mtime() {
        let (d, mut s) = store(StoreOptions::default());
        let inc = s.begin("sub/dir/f.bin", Some(5)).unwrap();
        write(&inc, b"hello");
        assert!(d.path().join("sub/dir/f.bin.partial").exists());
        assert!(!d.path().join("sub/dir/f.bin").exists());
        let h = *blake3::hash(b"hello").as_bytes();
        assert_eq!(inc.finish(Some(h), 0o640, (1_000_000, 5)).unwrap(), 5);
        let p = d.path().join("sub/dir/f.bin");
        assert_eq!(std::fs::read(&p).unwrap(), b"hello");
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.mode() & 0o777, 0o640);
        assert_eq!(m.mtime(), 1_000_000);
        assert!(!d.path().join("sub/dir/f.bin.partial").exists());
    }

    #[test]
    fn wrong_hash_or_length_leaves_no_final_file() {
        let (d, mut s) = store(StoreOptions::default());
        let inc = s.begin("a", Some(3)).unwrap();
        write(&inc, b"abc");
        let e = inc.finish(Some([0; 32]), 0o644, (0, 0)).unwrap_err();
        assert_eq!(e.code, Code::HashMismatch);
        let inc = s.begin("b", Some(4)).unwrap();
        write(&inc, b"abc");
        assert_eq!(
            inc.finish(None, 0o644, (0, 0)).unwrap_err().code,
            Code::Length
        );
        for n in ["a", "b", "a.partial", "b.partial"] {
            assert!(!d.path().join(n).exists(), "{n}");
        }
    }

    #[test]
    fn existing_files_need_overwrite() {
        let (d, mut s) = store(StoreOptions::default());
        std::fs::write(d.path().join("x"), b"old").unwrap();
        assert_eq!(s.begin("x", Some(1)).unwrap_err().code, Code::Exists);
        let o = StoreOptions {
            overwrite: true,
            ..Default::default()
        };
        let mut s2 = Store::open(d.path(), o).unwrap();
        let inc = s2.begin("x", Some(3)).unwrap();
        write(&inc, b"new");
        inc.finish(None, 0o644, (0, 0)).unwrap();
        assert_eq!(std::fs::read(d.path().join("x")).unwrap(), b"new");
    }

    #[test]
    fn symlinks_in_the_tree_are_not_followed() {
        let (d, mut s) = store(StoreOptions::default());
        let outside = tempfile::tempdir().unwrap();
        symlink(outside.path(), d.path().join("link")).unwrap();
        let e = s.begin("link/evil", Some(1)).unwrap_err();
        assert_eq!(e.code, Code::UnsafeName, "{e}");
        // A planted symlink as the partial file itself is not followed either.
        symlink(outside.path().join("target"), d.path().join("f.partial")).unwrap();
        assert!(s.begin("f", Some(1)).is_err());
        assert!(!outside.path().join("target").exists());
        assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
    }

    #[test]
    fn unsafe_names_and_byte_caps_are_refused() {
        let (_d, mut s) = store(StoreOptions {
            max_bytes: Some(10),
            ..Default::default()
        });
        assert_eq!(s.begin("../x", Some(1)).unwrap_err().code, Code::UnsafeName);
        assert_eq!(
            s.begin("/etc/x", Some(1)).unwrap_err().code,
            Code::UnsafeName
        );
        assert_eq!(s.begin("big", Some(11)).unwrap_err().code, Code::TooLarge);
        assert!(s.charge(10).is_ok());
        assert_eq!(s.charge(1).unwrap_err().code, Code::TooLarge);
    }

    #[test]
    fn resume_offers_the_partial_prefix() {
        let (d, mut s) = store(StoreOptions {
            resume: true,
            ..Default::default()
        });
        std::fs::write(d.path().join("r.partial"), b"abcd").unwrap();
        let inc = s.begin("r", Some(8)).unwrap();
        assert_eq!(inc.offset(), 4);
        assert_eq!(inc.prefix(), Some(*blake3::hash(b"abcd").as_bytes()));
        {
            use std::os::unix::fs::FileExt;
            inc.file().write_all_at(b"efgh", 4).unwrap();
        }
        inc.finish(Some(*blake3::hash(b"abcdefgh").as_bytes()), 0o644, (0, 0))
            .unwrap();
        assert_eq!(std::fs::read(d.path().join("r")).unwrap(), b"abcdefgh");
        // A partial longer than announced is started over.
        std::fs::write(d.path().join("q.partial"), b"0123456789").unwrap();
        let inc = s.begin("q", Some(2)).unwrap();
        assert_eq!(inc.offset(), 0);
        assert_eq!(inc.file().metadata().unwrap().len(), 0);
    }
}
