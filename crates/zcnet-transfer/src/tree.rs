//! The sender's walk of the paths it is asked to send: which entries become files on the
//! wire, which are skipped and why, and which are extra names of one inode (hard links).
//!
//! Every entry is classified by `lstat` (lstat(2)) before anything is opened: opening a FIFO
//! for reading blocks until a writer appears (fifo(7)), and opening a device can have side
//! effects (a tape rewinds), so special files are never opened, only skipped and counted.
//! Hard links are sent as independent copies (the protocol names files, not inodes); the
//! walk counts the extra names so the summary can say so. Symlinks are sent as symlinks,
//! never followed, when their target stays inside the tree; others are skipped and counted. A directory under which nothing is
//! sent becomes a `Dir` of its own, so empty directories arrive too.

use crate::session::Source;
use std::collections::HashSet;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Why an entry of a tree was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkipKind {
    /// A named pipe: opening it would block.
    Fifo,
    /// A Unix-domain socket.
    Socket,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
    /// A symbolic link whose target leaves the tree (absolute, or `..` above its top).
    SymlinkOutside,
    /// A name that is not UTF-8 (the protocol's names are UTF-8).
    NotUtf8,
}

impl SkipKind {
    /// A few words for a warning.
    pub fn describe(self) -> &'static str {
        match self {
            SkipKind::Fifo => "a FIFO (named pipe), not opened",
            SkipKind::Socket => "a socket",
            SkipKind::CharDevice => "a character device, not opened",
            SkipKind::BlockDevice => "a block device, not opened",
            SkipKind::SymlinkOutside => {
                "a symbolic link whose target leaves the tree, or climbs ('..') after a name, which a receiver refuses (symlinks are never followed)"
            }
            SkipKind::NotUtf8 => "its name (or its symlink target) is not UTF-8",
        }
    }
}

/// One entry the walk did not send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Where it is on the sender.
    pub path: PathBuf,
    /// Why it was skipped.
    pub kind: SkipKind,
}

/// A path on the command line could not be walked.
#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    /// `lstat` or `readdir` failed.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A path named explicitly is neither a regular file nor a directory.
    #[error("{0}: not a regular file or directory")]
    NotFileOrDir(PathBuf),
    /// A path named explicitly has no usable last component.
    #[error("{0}: no usable file name")]
    NoName(PathBuf),
}

/// The files to send and what was left out, gathered over one or more paths.
#[derive(Default)]
pub struct Walk {
    /// The files, in sending order (names sorted within each directory), and the directories
    /// that would otherwise not arrive (empty, or holding only skipped entries).
    pub sources: Vec<Source>,
    /// Their total size in bytes when they were walked.
    pub total: u64,
    /// Entries inside trees that are not sent.
    pub skipped: Vec<Skipped>,
    /// Names sent as copies because an earlier name in this walk is the same inode.
    pub hard_link_copies: usize,
    /// (device, inode) of every multiply-linked file already taken.
    seen: HashSet<(u64, u64)>,
}

impl Walk {
    /// An empty walk.
    pub fn new() -> Walk {
        Walk::default()
    }

    /// Skipped entries of one kind.
    pub fn skipped_of(&self, kind: SkipKind) -> usize {
        self.skipped.iter().filter(|s| s.kind == kind).count()
    }

    /// Adds `path`: a regular file under its own name, or a directory as a tree under its
    /// name. A path named explicitly that is anything else is an error, not a skip.
    pub fn add(&mut self, path: &Path) -> Result<(), WalkError> {
        let meta = lstat(path)?;
        let base = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| WalkError::NoName(path.to_path_buf()))?
            .to_string();
        if meta.is_dir() {
            self.dir(path, &base)
        } else if meta.is_file() {
            self.file(path.to_path_buf(), base, &meta);
            Ok(())
        } else {
            Err(WalkError::NotFileOrDir(path.to_path_buf()))
        }
    }

    fn file(&mut self, path: PathBuf, name: String, meta: &std::fs::Metadata) {
        if meta.nlink() > 1 && !self.seen.insert((meta.dev(), meta.ino())) {
            self.hard_link_copies += 1;
        }
        self.total += meta.len();
        self.sources.push(Source::File { path, name });
    }

    fn dir(&mut self, dir: &Path, prefix: &str) -> Result<(), WalkError> {
        let io = |source| WalkError::Io {
            path: dir.to_path_buf(),
            source,
        };
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .map_err(io)?
            .collect::<Result<_, _>>()
            .map_err(io)?;
        entries.sort_by_key(|e| e.file_name());
        let before = self.sources.len();
        for e in entries {
            let path = e.path();
            let Some(name) = e.file_name().to_str().map(str::to_string) else {
                self.skip(path, SkipKind::NotUtf8);
                continue;
            };
            let rel = format!("{prefix}/{name}");
            // `lstat` relative to the directory's descriptor (`fstatat`), not by a path
            // looked up from the top again for every file.
            let meta = e.metadata().map_err(|source| WalkError::Io {
                path: path.clone(),
                source,
            })?;
            let ft = meta.file_type();
            if ft.is_dir() {
                self.dir(&path, &rel)?;
            } else if ft.is_file() {
                self.file(path, rel, &meta);
            } else if ft.is_symlink() {
                // Sent as a symlink, never followed; only if it points inside the tree, whose
                // top is `prefix`'s first component, by the rule a receiver holds it to.
                let target = std::fs::read_link(&path).map_err(|source| WalkError::Io {
                    path: path.clone(),
                    source,
                })?;
                match target.to_str() {
                    None => self.skip(path, SkipKind::NotUtf8),
                    Some(t) => {
                        match crate::names::link_target_allowed(t, prefix.matches('/').count()) {
                            Ok(()) => self.sources.push(Source::Link {
                                name: rel,
                                target: t.to_string(),
                            }),
                            Err(_) => self.skip(path, SkipKind::SymlinkOutside),
                        }
                    }
                }
            } else if ft.is_fifo() {
                self.skip(path, SkipKind::Fifo);
            } else if ft.is_socket() {
                self.skip(path, SkipKind::Socket);
            } else if ft.is_char_device() {
                self.skip(path, SkipKind::CharDevice);
            } else {
                self.skip(path, SkipKind::BlockDevice);
            }
        }
        if self.sources.len() == before {
            // Nothing under it is sent: without its own entry it would not arrive at all.
            self.sources.push(Source::Dir {
                path: dir.to_path_buf(),
                name: prefix.to_string(),
            });
        }
        Ok(())
    }

    fn skip(&mut self, path: PathBuf, kind: SkipKind) {
        self.skipped.push(Skipped { path, kind });
    }

    /// One line for the summary: what was skipped by kind and how many hard links went as
    /// copies; `None` when there is nothing to say.
    pub fn summary(&self) -> Option<String> {
        let mut parts = Vec::new();
        for (kind, what) in [
            (SkipKind::Fifo, "FIFO(s)"),
            (SkipKind::Socket, "socket(s)"),
            (SkipKind::CharDevice, "character device(s)"),
            (SkipKind::BlockDevice, "block device(s)"),
            (
                SkipKind::SymlinkOutside,
                "symlink(s) pointing outside the tree",
            ),
            (SkipKind::NotUtf8, "non-UTF-8 name(s)"),
        ] {
            match self.skipped_of(kind) {
                0 => {}
                n => parts.push(format!("{n} {what}")),
            }
        }
        let mut s = Vec::new();
        if !parts.is_empty() {
            s.push(format!("skipped {}", parts.join(", ")));
        }
        if self.hard_link_copies > 0 {
            s.push(format!(
                "{} hard link(s) sent as separate copies",
                self.hard_link_copies
            ));
        }
        (!s.is_empty()).then(|| s.join("; "))
    }
}

fn lstat(path: &Path) -> Result<std::fs::Metadata, WalkError> {
    std::fs::symlink_metadata(path).map_err(|source| WalkError::Io {
        path: path.to_path_buf(),
        source,
    })
}
