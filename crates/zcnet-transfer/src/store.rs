//! The receiver's side of the file system: where received data may go, and how a file
//! becomes final.
//!
//! Rules (`docs/transfer-protocol.md`, "Receiver rules"):
//! * names are checked by [`super::names`]; every directory and file is opened relative to
//!   the target directory beneath it, never through a symlink ([`super::resolve`]:
//!   `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, or a component walk where the kernel
//!   lacks it), so neither `..` nor a symlink already in the tree (nor one planted during the
//!   transfer) can lead outside it;
//! * only regular files are opened for data — final names, partial files, `.ranges`
//!   records — with `O_NOFOLLOW | O_NONBLOCK` and an `fstat` check ([`super::open`]): a FIFO
//!   planted under a name the receiver opens never blocks a session;
//! * a symlink is created only if its target resolves inside, as the file system will
//!   resolve it ([`Store::make_link`]);
//! * each session writes its own partial file, `NAME.<owner>.<random>.partial`, created with
//!   `O_CREAT | O_EXCL` — never opened through an existing name, so a planted hard link or
//!   symlink is never written through — and, when it may be resumed, held under
//!   `flock(LOCK_EX)` while in use (a `Put`'s, never resumed, has a longer tag instead);
//! * only after the length and the BLAKE3 hash check out is the partial file fsynced, given
//!   its mode (setuid, setgid and sticky bits dropped unless asked) and mtime, and renamed
//!   onto `NAME` — `renameat2(RENAME_NOREPLACE)` unless overwriting, so of two sessions
//!   completing one name the second is told "exists"; with overwriting the last rename wins
//!   and, each session having its own inode, the final file is always one sender's whole
//!   file — and the directory fsynced;
//! * space is reserved with `fallocate` when a file starts and released when its session
//!   ends early (the bytes that arrived stay, for `--resume`; a partial file with no bytes
//!   is removed); a refused file leaves nothing;
//! * `max_bytes` caps what one sender may write, counted across its connections by a shared
//!   [`Quota`] keyed by address (and token), reservations included;
//! * `--resume` continues only a partial file of the same owner (the token, or without one
//!   the sender's address), only when the sender verifies the whole file, and never one with
//!   more than one link.

use super::digest::{hash_prefix, hash_prefix_until, prefix_state_until};
use super::names::{components, NameError, PARTIAL_SUFFIX};
use super::open::{kind_of, open_regular, OpenError};
use super::resolve::{open_beneath_by, Resolution};
use super::wire::Code;
use rustix::fs::{AtFlags, FlockOperation, Mode, OFlags, RenameFlags};
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

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

    pub(crate) fn io(what: &str, name: &str, e: io::Error) -> Self {
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
    /// Continue an existing partial file of the same owner.
    pub resume: bool,
    /// Cap on the bytes one sender may write (see [`Quota`]).
    pub max_bytes: Option<u64>,
    /// Keep setuid, setgid and sticky bits as sent (dropped by default).
    pub keep_special_bits: bool,
}

/// Bytes written or reserved per sender, shared by all of a receiver's sessions so that a
/// cap "per sender" holds across connections. Each session charges every key it has (its
/// address, and its token when one is set); a charge that would take any key over the cap
/// is refused whole.
#[derive(Debug)]
pub struct Quota {
    max: u64,
    used: Mutex<HashMap<String, u64>>,
}

impl Quota {
    /// A cap of `max` bytes per key.
    pub fn new(max: u64) -> Arc<Quota> {
        Arc::new(Quota {
            max,
            used: Mutex::new(HashMap::new()),
        })
    }

    /// The cap.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Bytes charged to `key`.
    pub fn used(&self, key: &str) -> u64 {
        let m = self.used.lock().unwrap_or_else(|p| p.into_inner());
        m.get(key).copied().unwrap_or(0)
    }

    /// Charges `n` bytes to every key, or to none: `Err(used)` with the most any key had.
    fn charge(&self, keys: &[String], n: u64) -> Result<(), u64> {
        let mut m = self.used.lock().unwrap_or_else(|p| p.into_inner());
        let worst = keys
            .iter()
            .map(|k| m.get(k).copied().unwrap_or(0))
            .max()
            .unwrap_or(0);
        if worst.saturating_add(n) > self.max {
            return Err(worst);
        }
        for k in keys {
            *m.entry(k.clone()).or_insert(0) += n;
        }
        Ok(())
    }

    /// Gives back `n` bytes reserved but not written.
    fn refund(&self, keys: &[String], n: u64) {
        let mut m = self.used.lock().unwrap_or_else(|p| p.into_inner());
        for k in keys {
            if let Some(v) = m.get_mut(k) {
                *v = v.saturating_sub(n);
            }
        }
    }
}

/// Who is sending: the keys of its byte cap and the owner tag of its partial files.
#[derive(Debug, Clone, Default)]
pub struct SenderId {
    /// The peer's address.
    pub address: Option<IpAddr>,
    /// The token it proved, if any.
    pub token: Option<Vec<u8>>,
}

impl SenderId {
    fn keys(&self) -> Vec<String> {
        let mut k = Vec::new();
        if let Some(a) = self.address {
            k.push(format!("address {a}"));
        }
        if let Some(t) = &self.token {
            k.push(format!("token {}", tag(b"zcnet-v1 quota key", t)));
        }
        if k.is_empty() {
            k.push("local".into());
        }
        k
    }

    /// Whether this sender is the one that started its partial files, as far as the
    /// receiver can tell: it proved the token (every holder of it is the owner), or it has
    /// no address (a local [`Store::open`], whose caller is its one sender). An address
    /// alone proves nothing — another user of the host, or anyone behind the same NAT,
    /// shares it — so such a sender is never offered a partial file's prefix hash, with
    /// which it could confirm guesses of the contents (issue 40).
    pub fn proves_ownership(&self) -> bool {
        self.token.is_some() || self.address.is_none()
    }

    /// 16 hex digits naming the owner of a partial file: derived from the token when there
    /// is one (any holder of it may resume), else from the address. One-way, so the name on
    /// disk reveals neither.
    fn owner(&self) -> String {
        match (&self.token, self.address) {
            (Some(t), _) => tag(b"zcnet-v1 partial owner, token", t),
            (None, Some(a)) => tag(b"zcnet-v1 partial owner, address", a.to_string().as_bytes()),
            (None, None) => tag(b"zcnet-v1 partial owner, local", b""),
        }
    }
}

fn tag(context: &[u8], key: &[u8]) -> String {
    let mut h = blake3::Hasher::new();
    h.update(&(context.len() as u64).to_le_bytes());
    h.update(context);
    h.update(key);
    h.finalize().as_bytes()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A target directory that received files go into, for one sender.
#[derive(Debug)]
pub struct Store {
    dir: OwnedFd,
    opts: StoreOptions,
    quota: Option<Arc<Quota>>,
    keys: Vec<String>,
    owner: String,
    /// Whether a partial file's contents may be offered (its prefix hash, a range's
    /// recorded end) to this sender: only one that proved the token the partial file was
    /// started under, or a local store's one sender ([`SenderId::proves_ownership`]).
    offers_prefixes: bool,
    /// When the session must end (`--session-deadline`): hashing a file already on disk
    /// for `--resume` stops there ([`Store::set_deadline`]).
    deadline: Option<std::time::Instant>,
    /// Directories already opened beneath `dir` this session, by their path: a tree's files
    /// share a few directories, and walking each one's path again (`mkdirat`, `openat2` and
    /// `close` per component) was most of a small file's cost. Each was opened by the same
    /// rules; a directory moved away while the session runs takes the files after it along.
    dirs: HashMap<String, Arc<OwnedFd>>,
    /// Random bytes for partial-file names, fetched in bulk.
    random: Vec<u8>,
    /// How paths beneath `dir` are resolved (the kernel's `openat2` where it has it).
    how: Resolution,
}

/// Disk space reserved ahead of a file's data: when it begins, and then as its data lands
/// ([`Incoming::allocate`]), never the whole announced size up front (a bare `File` header
/// claiming 60 MiB took 60 MiB of a 64 MiB file system while its sender idled, issue 40).
pub const RESERVE_STEP: u64 = 8 << 20;

/// Most directories a [`Store`] keeps open (it forgets them all when full).
const DIR_CACHE: usize = 256;

/// Partial files of `Put`s carry a longer random tag than resumable ones, so that
/// [`find_resumable`] never picks one up: a `Put` is resent whole, never resumed, and so its
/// partial file needs no lock.
const PUT_TAG_BYTES: usize = 8;

/// Frees the blocks reserved past the end of the data: growing the file by one byte and
/// truncating it back makes every file system drop blocks beyond the new end, including
/// those `fallocate(FALLOC_FL_KEEP_SIZE)` reserved (truncate(2); ext4 and tmpfs both free
/// them on a size-reducing truncate, which a same-size truncate is not).
fn release_reservation(file: &File) -> io::Result<u64> {
    let len = file.metadata()?.len();
    file.set_len(len + 1)?;
    file.set_len(len)?;
    Ok(len)
}

/// `n` random bytes as hex, taken from `pool` (refilled with one `getrandom` call when short).
fn random_hex(pool: &mut Vec<u8>, n: usize) -> io::Result<String> {
    if pool.len() < n {
        let mut b = vec![0u8; 512];
        getrandom::fill(&mut b).map_err(|e| io::Error::other(e.to_string()))?;
        pool.extend_from_slice(&b);
    }
    let take = pool.split_off(pool.len() - n);
    Ok(take.iter().map(|b| format!("{b:02x}")).collect())
}

impl Store {
    /// Opens `dir` (which must exist and be a directory) for one local sender with its own
    /// cap (`opts.max_bytes`).
    pub fn open(dir: &Path, opts: StoreOptions) -> io::Result<Store> {
        let quota = opts.max_bytes.map(Quota::new);
        Self::open_for(dir, opts, quota, &SenderId::default())
    }

    /// Opens `dir` for `sender`, charging `quota` (shared by the receiver's sessions).
    pub fn open_for(
        dir: &Path,
        opts: StoreOptions,
        quota: Option<Arc<Quota>>,
        sender: &SenderId,
    ) -> io::Result<Store> {
        let fd = rustix::fs::open(
            dir,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Store {
            dir: fd,
            opts,
            quota,
            keys: sender.keys(),
            owner: sender.owner(),
            offers_prefixes: sender.proves_ownership(),
            deadline: None,
            dirs: HashMap::new(),
            random: Vec::new(),
            how: super::resolve::kernel_resolution(),
        })
    }

    /// Resolves paths beneath the directory by `how` rather than by what the kernel offers
    /// (tests of the walk that stands in for `openat2` on kernels without it).
    pub fn resolve_by(&mut self, how: Resolution) {
        self.how = how;
        self.dirs.clear();
    }

    fn too_large(&self, name: &str, size: u64, used: u64) -> Refusal {
        let max = self.quota.as_ref().map_or(0, |q| q.max());
        Refusal::new(
            Code::TooLarge,
            format!(
                "{name:?} ({size} bytes) would exceed this receiver's limit of {max} bytes per sender ({used} already written or reserved)"
            ),
        )
    }

    /// Opens (creating as needed) the directories `dirs` of `name`, one component at a time
    /// beneath the target directory, never following a symlink.
    /// Opened directories are kept for the session (see [`Store::dirs`]).
    fn parent(&mut self, name: &str, dirs: &[&str]) -> Result<Arc<OwnedFd>, Refusal> {
        let key = dirs.join("/");
        if let Some(fd) = self.dirs.get(&key) {
            return Ok(fd.clone());
        }
        let fd = Arc::new(self.open_parent(name, dirs)?);
        if self.opts.resume {
            sweep_put_partials(self.how, &fd, &self.owner);
        }
        if self.dirs.len() >= DIR_CACHE {
            self.dirs.clear();
        }
        self.dirs.insert(key, fd.clone());
        Ok(fd)
    }

    fn open_parent(&self, name: &str, dirs: &[&str]) -> Result<OwnedFd, Refusal> {
        let mut parent =
            rustix::io::dup(&self.dir).map_err(|e| Refusal::io("opening", name, e.into()))?;
        for d in dirs {
            match rustix::fs::mkdirat(&parent, *d, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(Refusal::io("creating directory", d, e.into())),
            }
            parent = open_beneath_by(self.how, &parent, d, OFlags::DIRECTORY | OFlags::RDONLY, 0)
                .map_err(|e| {
                if e.raw_os_error() == Some(libc::ELOOP) || e.raw_os_error() == Some(libc::EXDEV) {
                    Refusal::new(
                        Code::UnsafeName,
                        format!("{name:?}: {d:?} is a symlink; refusing to follow it"),
                    )
                } else {
                    Refusal::io("opening directory", d, e)
                }
            })?;
        }
        Ok(parent)
    }

    /// Creates the directory `name` (an empty directory of the sender's tree) under the same
    /// name rules as a file, with `mode & 0o777`. One that already exists as a directory is
    /// left as it is; anything else under that name (a file, a symlink) is refused.
    pub fn make_dir(&mut self, name: &str, mode: u32) -> Result<(), Refusal> {
        let parts = components(name)?;
        let (leaf, dirs) = parts.split_last().expect("components() is never empty");
        let parent = self.parent(name, dirs)?;
        match rustix::fs::mkdirat(&parent, *leaf, Mode::from_raw_mode(0o700)) {
            Ok(()) => {
                let d = open_beneath_by(
                    self.how,
                    &parent,
                    leaf,
                    OFlags::DIRECTORY | OFlags::RDONLY,
                    0,
                )
                .map_err(|e| Refusal::io("opening directory", name, e))?;
                rustix::fs::fchmod(&d, Mode::from_raw_mode(mode & 0o777))
                    .map_err(|e| Refusal::io("setting the mode of", name, e.into()))?;
                rustix::fs::fsync(&parent)
                    .map_err(|e| Refusal::io("syncing the parent of", name, e.into()))?;
                Ok(())
            }
            Err(rustix::io::Errno::EXIST) => {
                match rustix::fs::statat(&parent, *leaf, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st)
                        if rustix::fs::FileType::from_raw_mode(st.st_mode)
                            == rustix::fs::FileType::Directory =>
                    {
                        Ok(())
                    }
                    Ok(_) => Err(Refusal::new(
                        Code::Exists,
                        format!("{name:?} exists and is not a directory"),
                    )),
                    Err(e) => Err(Refusal::io("checking", name, e.into())),
                }
            }
            Err(e) => Err(Refusal::io("creating directory", name, e.into())),
        }
    }

    /// Creates the symlink `name` -> `target` (a symlink of the sender's tree), only if it
    /// will resolve inside the receive directory:
    /// * by its spelling ([`crate::names::link_target_allowed`]): relative, each leading
    ///   `..` climbing one of the link's own directories, and no `..` after a name — so no
    ///   chain of links the receiver creates, in any order, leads outside;
    /// * by resolution against what is already there: the link's directory joined with the
    ///   target is resolved from the receive directory as a reader would, following every
    ///   symlink ([`crate::resolve::check_follows_inside`]); a path through an existing link
    ///   that leads outside (one planted, or made by an older receiver) is refused.
    ///
    /// Anything else is refused as an unsafe name. `symlinkat(2)` never follows a link
    /// already at `name`: any existing entry there is refused as existing.
    pub fn make_link(&mut self, name: &str, target: &str) -> Result<(), Refusal> {
        let parts = components(name)?;
        let (leaf, dirs) = parts.split_last().expect("components() is never empty");
        let unsafe_link = |why: &dyn std::fmt::Display| {
            Refusal::new(
                Code::UnsafeName,
                format!("symlink {name:?} -> {target:?}: {why}; not created"),
            )
        };
        crate::names::link_target_allowed(target, dirs.len()).map_err(|why| unsafe_link(&why))?;
        let parent = self.parent(name, dirs)?;
        let from_root = match dirs.is_empty() {
            true => target.to_string(),
            false => format!("{}/{target}", dirs.join("/")),
        };
        crate::resolve::check_follows_inside(self.how, &self.dir, &from_root)
            .map_err(|why| unsafe_link(&why))?;
        match rustix::fs::symlinkat(target, &parent, *leaf) {
            Ok(()) => rustix::fs::fsync(&parent)
                .map_err(|e| Refusal::io("syncing the parent of", name, e.into())),
            Err(rustix::io::Errno::EXIST) => Err(Refusal::new(
                Code::Exists,
                format!("{name:?} exists; a symlink is never created over it"),
            )),
            Err(e) => Err(Refusal::io("creating symlink", name, e.into())),
        }
    }

    /// Starts receiving `name` of `size` bytes (`None` for a stream of unknown size).
    /// `verified`: the sender will send the whole file's hash — only then is a partial file
    /// offered for resuming, because only then is the prefix checked with the rest.
    pub fn begin(
        &mut self,
        name: &str,
        size: Option<u64>,
        verified: bool,
    ) -> Result<Incoming, Refusal> {
        self.begin_as(name, size, verified, true)
    }

    /// [`Store::begin`] for a file arriving by ranges (`ranges`): with `--resume` an
    /// interrupted partial file of ours is taken as it is — offset 0, not hashed, not
    /// truncated — since which of its bytes landed is the ranges' own record, not a prefix;
    /// a final file already there is not offered as done.
    pub fn begin_ranged(
        &mut self,
        name: &str,
        size: u64,
        verified: bool,
    ) -> Result<Incoming, Refusal> {
        self.begin_as(name, Some(size), verified, false)
    }

    fn begin_as(
        &mut self,
        name: &str,
        size: Option<u64>,
        verified: bool,
        whole: bool,
    ) -> Result<Incoming, Refusal> {
        let parts = components(name)?;
        let (leaf, dirs) = parts.split_last().expect("components() is never empty");
        if let (Some(q), Some(size), false) = (&self.quota, size, self.opts.resume) {
            // Early, cheap refusal (without resume: no bytes can already be there); the real
            // charge comes once the offset is known.
            let used = self.keys.iter().map(|k| q.used(k)).max().unwrap_or(0);
            if used.saturating_add(size) > q.max() {
                return Err(self.too_large(name, size, used));
            }
        }
        let parent = self.parent(name, dirs)?;
        match rustix::fs::statat(&*parent, *leaf, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => {
                let ft = rustix::fs::FileType::from_raw_mode(st.st_mode);
                let is_reg = ft == rustix::fs::FileType::RegularFile;
                if !is_reg {
                    // A FIFO, socket, device, directory or symlink: never opened, never
                    // replaced, whatever the options.
                    return Err(Refusal::new(
                        Code::Exists,
                        format!(
                            "{name:?} exists and is {}, not a regular file; refused",
                            kind_of(ft)
                        ),
                    ));
                }
                if let (true, true, Some(size)) =
                    (self.opts.resume, verified && is_reg && whole, size)
                {
                    if let Some(inc) = self.already_there(&parent, leaf, name, size)? {
                        return Ok(inc);
                    }
                }
                if !self.opts.overwrite {
                    return Err(Refusal::new(
                        Code::Exists,
                        format!("{name:?} exists (use --overwrite to replace it)"),
                    ));
                }
            }
            Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(Refusal::io("checking", name, e.into())),
        }
        let prefix_of_ours = format!("{leaf}.{}.", self.owner);
        let resumed = if self.opts.resume && verified && size.is_some() {
            find_resumable(self.how, &parent, &prefix_of_ours)
        } else {
            None
        };
        let (file, partial, created) = match resumed {
            Some((f, p)) => (f, p, false),
            None => {
                let (f, p) = create_partial(
                    self.how,
                    &parent,
                    &prefix_of_ours,
                    &mut self.random,
                    4,
                    true,
                )
                .map_err(|e| Refusal::io("creating a partial file for", name, e))?;
                (f, p, true)
            }
        };
        let mut inc = Incoming {
            parent,
            leaf: leaf.to_string(),
            partial,
            file,
            name: name.to_string(),
            size,
            offset: 0,
            prefix: None,
            overwrite: self.opts.overwrite,
            keep_special_bits: self.opts.keep_special_bits,
            quota: self.quota.clone(),
            keys: self.keys.clone(),
            reserved: 0,
            settled: false,
            written: false,
            looked: true,
            existing: false,
            owner: self.owner.clone(),
            landed: None,
            prefix_state: None,
            sparse: None,
            how: self.how,
        };
        if !created && whole {
            let have = inc
                .file
                .metadata()
                .map_err(|e| Refusal::io("reading", &inc.partial, e))?
                .len();
            // A sender that cannot prove it started the partial file gets offset 0 and no
            // hash: the bytes are dropped and the name reused, so nothing piles up and
            // nothing of the contents is told.
            if size.is_some_and(|s| have <= s) && have > 0 && self.offers_prefixes {
                inc.offset = have;
                let state = prefix_state_until(&inc.file, have, self.deadline)
                    .map_err(|e| Refusal::io("hashing", &inc.partial, e))?;
                inc.prefix = Some(*state.finalize().as_bytes());
                inc.prefix_state = Some(state);
            } else {
                // Nothing usable (longer than announced): start over.
                inc.file
                    .set_len(0)
                    .map_err(|e| Refusal::io("truncating", &inc.partial, e))?;
            }
        }
        if let Some(s) = size {
            inc.reserve(s - inc.offset)?;
        }
        Ok(inc)
    }

    /// Counts `n` stream bytes against the cap; a refusal once it would be exceeded.
    pub fn charge(&mut self, n: u64) -> Result<(), Refusal> {
        match &self.quota {
            Some(q) => q.charge(&self.keys, n).map_err(|used| {
                Refusal::new(
                    Code::TooLarge,
                    format!(
                        "this receiver's limit of {} bytes per sender is exceeded ({used} already written or reserved)",
                        q.max()
                    ),
                )
            }),
            None => Ok(()),
        }
    }

    /// With `--resume`, a final file already under `name` with the announced length (a
    /// rerun after an interruption): offered as a partial file that is complete, with the
    /// hash of its contents, so a sender whose file hashes the same sends nothing more and is
    /// answered once it is checked again and synced. It is never modified: no mode or mtime
    /// is set, nothing renamed, and a sender whose bytes differ starts a partial file of its
    /// own (refused at the rename unless overwriting). `None`: no such file.
    fn already_there(
        &mut self,
        parent: &Arc<OwnedFd>,
        leaf: &str,
        name: &str,
        size: u64,
    ) -> Result<Option<Incoming>, Refusal> {
        let file = match open_regular(self.how, &**parent, leaf, OFlags::RDONLY, 0) {
            Ok(f) => f,
            Err(OpenError::Io(_)) => return Ok(None),
            Err(e) => {
                return Err(Refusal::new(
                    Code::Exists,
                    format!("{name:?} exists: {e}; refused"),
                ))
            }
        };
        let st = rustix::fs::fstat(&file).map_err(|e| Refusal::io("checking", name, e.into()))?;
        if st.st_size as u64 != size {
            return Ok(None);
        }
        let prefix = hash_prefix_until(&file, size, self.deadline)
            .map_err(|e| Refusal::io("hashing", name, e))?;
        Ok(Some(Incoming {
            parent: parent.clone(),
            leaf: leaf.to_string(),
            partial: leaf.to_string(),
            file,
            name: name.to_string(),
            size: Some(size),
            offset: size,
            prefix: Some(prefix),
            overwrite: self.opts.overwrite,
            keep_special_bits: self.opts.keep_special_bits,
            quota: self.quota.clone(),
            keys: self.keys.clone(),
            reserved: 0,
            settled: true,
            written: false,
            looked: true,
            existing: true,
            owner: self.owner.clone(),
            landed: None,
            prefix_state: None,
            sparse: None,
            how: self.how,
        }))
    }

    /// Writes a whole small file (a `Put`, already read from the wire) to a new partial file
    /// of its own, after checking `data` against the sender's `hash` when it sent one: a
    /// mismatch creates nothing. The bytes written are the bytes hashed, so
    /// [`Incoming::check`] does not read them back. No resume (a `Put` is resent whole, and
    /// its longer tag keeps `find_resumable` away, so no lock either), no space
    /// reservation (the bytes go at once; the quota is charged for them), and without
    /// overwriting no look at the final name beforehand: `RENAME_NOREPLACE` refuses an
    /// existing one.
    pub fn put(
        &mut self,
        name: &str,
        data: &[u8],
        hash: Option<[u8; 32]>,
    ) -> Result<Incoming, Refusal> {
        let parts = components(name)?;
        let (leaf, dirs) = parts.split_last().expect("components() is never empty");
        let size = data.len() as u64;
        if let Some(want) = hash {
            if *blake3::hash(data).as_bytes() != want {
                return Err(Refusal::new(
                    Code::HashMismatch,
                    format!("{name:?}: BLAKE3 hash of the received data differs from the sender's"),
                ));
            }
        }
        let parent = self.parent(name, dirs)?;
        if let (true, Some(want)) = (self.opts.resume, hash) {
            if let Some(mut inc) = self.already_there(&parent, leaf, name, size)? {
                if inc.prefix == Some(want) {
                    inc.written = true;
                    return Ok(inc);
                }
            }
        }
        if self.opts.overwrite {
            match rustix::fs::statat(&*parent, *leaf, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st)
                    if rustix::fs::FileType::from_raw_mode(st.st_mode)
                        != rustix::fs::FileType::RegularFile =>
                {
                    return Err(Refusal::new(
                        Code::Exists,
                        format!(
                            "{name:?} exists and is {}, not a regular file; refused",
                            kind_of(rustix::fs::FileType::from_raw_mode(st.st_mode))
                        ),
                    ))
                }
                Ok(_) | Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(Refusal::io("checking", name, e.into())),
            }
        }
        if let Some(q) = &self.quota {
            q.charge(&self.keys, size)
                .map_err(|used| self.too_large(name, size, used))?;
        }
        let prefix_of_ours = format!("{leaf}.{}.", self.owner);
        let created = create_partial(
            self.how,
            &parent,
            &prefix_of_ours,
            &mut self.random,
            PUT_TAG_BYTES,
            // Locked when resuming, so that another session's sweep leaves it alone.
            self.opts.resume,
        );
        let (file, partial) = match created {
            Ok(c) => c,
            Err(e) => {
                if let Some(q) = &self.quota {
                    q.refund(&self.keys, size);
                }
                return Err(Refusal::io("creating a partial file for", name, e));
            }
        };
        let mut inc = Incoming {
            parent,
            leaf: leaf.to_string(),
            partial,
            file,
            name: name.to_string(),
            size: Some(size),
            offset: 0,
            prefix: None,
            overwrite: self.opts.overwrite,
            keep_special_bits: self.opts.keep_special_bits,
            quota: self.quota.clone(),
            keys: self.keys.clone(),
            reserved: size,
            settled: false,
            written: true,
            looked: self.opts.overwrite,
            existing: false,
            owner: self.owner.clone(),
            landed: None,
            prefix_state: None,
            sparse: None,
            how: self.how,
        };
        if let Err(e) = inc.file.write_all_at(data, 0) {
            inc.discard();
            return Err(Refusal::io("writing", name, e));
        }
        Ok(inc)
    }

    /// The session must end at `at` (`--session-deadline`): what this store hashes on its
    /// own before answering — a partial file's prefix or a final file already there, for
    /// `--resume`, which for a large file takes minutes — stops there, and the file is
    /// refused ([`Store::deadline_passed`] then says why).
    pub fn set_deadline(&mut self, at: std::time::Instant) {
        self.deadline = Some(at);
    }

    /// Whether the deadline set by [`Store::set_deadline`] has passed.
    pub fn deadline_passed(&self) -> bool {
        self.deadline
            .is_some_and(|t| std::time::Instant::now() >= t)
    }

    /// Whether interrupted files are resumed (`--resume`).
    pub fn resumes(&self) -> bool {
        self.opts.resume
    }

    /// Whether what a partial file holds may be offered to this sender (`--resume`, and a
    /// sender that proves it started it: [`SenderId::proves_ownership`]).
    pub fn offers_prefixes(&self) -> bool {
        self.opts.resume && self.offers_prefixes
    }

    /// The owner tag in this sender's partial file names.
    pub fn owner(&self) -> &str {
        &self.owner
    }
}

/// A new partial file `PREFIX<random>.partial` (`tag_bytes` random bytes in hex), created
/// exclusively, and locked when `lock` (resumable ones: locked before anyone resuming could
/// take it).
fn create_partial(
    how: Resolution,
    parent: &OwnedFd,
    prefix: &str,
    random: &mut Vec<u8>,
    tag_bytes: usize,
    lock: bool,
) -> io::Result<(File, String)> {
    let mut last = io::Error::other("no unique name found");
    for _ in 0..16 {
        let name = format!("{prefix}{}{PARTIAL_SUFFIX}", random_hex(random, tag_bytes)?);
        match open_regular(
            how,
            parent,
            &name,
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL,
            0o600,
        ) {
            Ok(fd) => {
                if lock && rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).is_err()
                {
                    last = io::Error::other("a fresh partial file was locked by another session");
                    continue;
                }
                // Between the creation and the lock, a sweep of this owner's stale partials
                // (another stream of the same resuming session) may have found the file
                // unlocked and unlinked it; the lock is then ours but the name is gone, and
                // the rename at the end would fail. A sweep unlinks only under the lock, so
                // one link left now means it stays.
                if lock && !rustix::fs::fstat(&fd).is_ok_and(|st| st.st_nlink == 1) {
                    last = io::Error::other("a fresh partial file was swept away before its lock");
                    continue;
                }
                return Ok((fd, name));
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => last = e.into(),
            Err(e) => return Err(e.into()),
        }
    }
    Err(last)
}

/// Whether `partial` is the name of a `Put`'s partial file (its tag is [`PUT_TAG_BYTES`]
/// long, a resumable one's shorter).
fn is_put_partial(partial: &str) -> bool {
    partial
        .strip_suffix(PARTIAL_SUFFIX)
        .and_then(|rest| rest.rsplit_once('.'))
        .is_some_and(|(_, tag)| {
            tag.len() == 2 * PUT_TAG_BYTES && tag.bytes().all(|b| b.is_ascii_hexdigit())
        })
}

/// With `--resume`, removes the partial files an interrupted session of this owner left for
/// `Put`s in `dir` (their tag is [`PUT_TAG_BYTES`] long): a `Put` is always sent whole again,
/// so they would only stay behind. One in use is locked (a resuming receiver locks its
/// `Put` partial files) and kept. Best effort: what cannot be checked is left.
fn sweep_put_partials(how: Resolution, dir: &OwnedFd, owner: &str) {
    let Ok(entries) = rustix::fs::Dir::read_from(dir) else {
        return;
    };
    let marker = format!(".{owner}.");
    for entry in entries.flatten() {
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        let Some(rest) = name.strip_suffix(PARTIAL_SUFFIX) else {
            continue;
        };
        let Some(at) = rest.rfind(&marker) else {
            continue;
        };
        let tag = &rest[at + marker.len()..];
        if tag.len() != 2 * PUT_TAG_BYTES || !tag.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let name = name.to_string();
        // Not a regular file (a FIFO planted under such a name): left alone, never opened
        // in a way that could wait on it.
        let Ok(fd) = open_regular(how, dir, &name, OFlags::RDONLY, 0) else {
            continue;
        };
        let stale = rustix::fs::fstat(&fd).is_ok_and(|st| st.st_nlink == 1)
            && rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).is_ok();
        if stale {
            let _ = rustix::fs::unlinkat(dir, &name, AtFlags::empty());
        }
    }
}

/// The first partial file named `PREFIX*.partial` that is a regular file with one link and
/// not in use by another session (its lock is free), opened and locked.
fn find_resumable(how: Resolution, parent: &OwnedFd, prefix: &str) -> Option<(File, String)> {
    let dir = rustix::fs::Dir::read_from(parent).ok()?;
    for entry in dir.flatten() {
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        let rest = match name.strip_prefix(prefix) {
            Some(r) => r,
            None => continue,
        };
        let Some(tag) = rest.strip_suffix(PARTIAL_SUFFIX) else {
            continue;
        };
        if tag.len() != 8 || !tag.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let name = name.to_string();
        let Ok(fd) = open_regular(how, parent, &name, OFlags::RDWR, 0) else {
            continue;
        };
        let Ok(st) = rustix::fs::fstat(&fd) else {
            continue;
        };
        if st.st_nlink != 1 {
            continue;
        }
        if rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).is_ok() {
            return Some((fd, name));
        }
    }
    None
}

/// What a sparse file's digest (version 9) is over besides its extents' bytes: the offset
/// its data went from, the kept prefix's hash, the extents.
type SparseDigest = (u64, [u8; 32], Vec<(u64, u64)>);

/// A file being received into its own partial file. Dropped without [`Incoming::finish`]
/// or [`Incoming::discard`] (the session ended early), it releases the space it reserved,
/// keeps the bytes that arrived for `--resume`, and removes the partial file if none did.
#[derive(Debug)]
pub struct Incoming {
    parent: Arc<OwnedFd>,
    leaf: String,
    partial: String,
    file: File,
    name: String,
    size: Option<u64>,
    offset: u64,
    prefix: Option<[u8; 32]>,
    overwrite: bool,
    keep_special_bits: bool,
    quota: Option<Arc<Quota>>,
    keys: Vec<String>,
    /// Bytes charged to the quota beyond `offset` for this file.
    reserved: u64,
    /// Finished, discarded or released: nothing left to do on drop.
    settled: bool,
    /// Written whole by [`Store::put`] from bytes it hashed: [`Incoming::check`] need not
    /// read them back.
    written: bool,
    /// The final name was looked at when the file began (so an existing one found at the
    /// rename appeared during the transfer).
    looked: bool,
    /// The final file itself, already there whole ([`Store::already_there`]): never written,
    /// stamped, renamed or removed.
    existing: bool,
    /// The owner tag for partial file names.
    owner: String,
    /// BLAKE3 of the first `.0` bytes, computed while they landed ([`Incoming::landed_hash`]).
    landed: Option<(u64, [u8; 32])>,
    /// The hash state after the kept prefix (`offset` bytes) when resuming.
    prefix_state: Option<blake3::Hasher>,
    /// A sparse file verified by its digest (version 9): the offset its data went from, the
    /// kept prefix's hash and the extents ([`crate::sparse::digest`]).
    sparse: Option<SparseDigest>,
    /// How paths beneath the directory are resolved (its [`Store`]'s).
    how: Resolution,
}

impl Incoming {
    /// The partial file, to write the data into at the right offsets.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Whether the partial file is on tmpfs, where `fallocate` allocates (and zeroes, when
    /// asked again over a reserved range) every page rather than reserving extents
    /// (`shmem_fallocate`): its reservation is then better not repeated per received range.
    pub fn on_tmpfs(&self) -> bool {
        rustix::fs::fstatfs(&self.file).is_ok_and(|s| s.f_type == libc::TMPFS_MAGIC)
    }

    /// The name as sent.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The partial file's name, beside the final one.
    pub fn partial_name(&self) -> &str {
        &self.partial
    }

    /// The directory the partial file is in (for a record kept beside it).
    pub fn parent(&self) -> &Arc<OwnedFd> {
        &self.parent
    }

    /// How paths beneath the directory are resolved (for a record kept beside it).
    pub(crate) fn resolution(&self) -> Resolution {
        self.how
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

    /// The hash state after the kept prefix (its [`Incoming::offset`] bytes), taken once:
    /// hashing the rest as it lands goes on from there instead of reading the prefix again.
    pub fn take_prefix_state(&mut self) -> Option<(u64, blake3::Hasher)> {
        self.prefix_state.take().map(|h| (self.offset, h))
    }

    /// The hash of the partial file's first `len` bytes, computed while they landed
    /// (`landing::LandingHash`): [`Incoming::check`] uses it instead of reading the file
    /// again, if the file is exactly `len` bytes long then.
    pub fn landed_hash(&mut self, len: u64, hash: [u8; 32]) {
        self.landed = Some((len, hash));
    }

    /// The file's data goes from `offset` as `extents` after a prefix hashing to `prefix`,
    /// and the sender's hash is its sparse digest (version 9): [`Incoming::check`] then
    /// compares the landed hash with it, or reads back the extents only, never the holes.
    pub fn sparse_digest(&mut self, offset: u64, prefix: [u8; 32], extents: Vec<(u64, u64)>) {
        self.sparse = Some((offset, prefix, extents));
    }

    /// Charges `n` more bytes to the quota and reserves them on disk.
    fn reserve(&mut self, n: u64) -> Result<(), Refusal> {
        if let Some(q) = &self.quota {
            if let Err(used) = q.charge(&self.keys, n) {
                let max = q.max();
                return Err(Refusal::new(
                    Code::TooLarge,
                    format!(
                        "{:?} ({n} bytes) would exceed this receiver's limit of {max} bytes per sender ({used} already written or reserved)",
                        self.name
                    ),
                ));
            }
        }
        self.reserved += n;
        // A file larger than the free space is refused at once (nothing reserved); the first
        // step of the space is reserved now, so a full disk shows up before the data flows,
        // and the rest as the data arrives ([`Incoming::allocate`]): a peer that announces a
        // large file and sends nothing takes no more of the disk than a step.
        if let Ok(st) = rustix::fs::fstatvfs(&self.file) {
            let free = st.f_bavail.saturating_mul(st.f_frsize);
            if n > free {
                return Err(Refusal::new(
                    Code::Io,
                    format!(
                        "reserving space for {:?}: {n} bytes announced, {free} bytes of space free",
                        self.name
                    ),
                ));
            }
        }
        self.allocate(self.offset, n.min(RESERVE_STEP))
    }

    /// Reserves `len` bytes of disk from `from` (`fallocate`, the size kept), in steps of
    /// at most [`RESERVE_STEP`] ahead of the data that has landed; a file system that cannot
    /// reserve space gets the bytes as they are written.
    pub fn allocate(&self, from: u64, len: u64) -> Result<(), Refusal> {
        if len == 0 {
            return Ok(());
        }
        match rustix::fs::fallocate(&self.file, rustix::fs::FallocateFlags::KEEP_SIZE, from, len) {
            Ok(()) | Err(rustix::io::Errno::OPNOTSUPP) | Err(rustix::io::Errno::NOSYS) => Ok(()),
            Err(e) => Err(Refusal::io("reserving space for", &self.name, e.into())),
        }
    }

    /// The sender will not resume: start the partial file over.
    pub fn restart(&mut self) -> Result<(), Refusal> {
        if self.existing {
            // The sender's file differs from the one already there: a partial file of its
            // own, never the final one truncated.
            let prefix = format!("{}.{}.", self.leaf, self.owner);
            let (file, partial) =
                create_partial(self.how, &self.parent, &prefix, &mut Vec::new(), 4, true)
                    .map_err(|e| Refusal::io("creating a partial file for", &self.name, e))?;
            self.file = file;
            self.partial = partial;
            self.existing = false;
            self.settled = false;
            self.looked = false;
            self.offset = 0;
            self.prefix = None;
            self.landed = None;
            self.prefix_state = None;
            let size = self.size.unwrap_or(0);
            return self.reserve(size);
        }
        self.file
            .set_len(0)
            .map_err(|e| Refusal::io("truncating", &self.partial, e))?;
        let had = self.offset;
        self.offset = 0;
        self.prefix = None;
        self.landed = None;
        self.prefix_state = None;
        self.reserve(had)
    }

    /// Settles the quota: bytes on disk beyond the offset stay charged, the rest of the
    /// reservation goes back.
    fn settle_quota(&mut self, on_disk: u64) {
        if let Some(q) = &self.quota {
            let written = on_disk.saturating_sub(self.offset).min(self.reserved);
            q.refund(&self.keys, self.reserved - written);
        }
        self.reserved = 0;
    }

    /// Verifies length and hash, sets mode and mtime, syncs, renames onto the final name and
    /// syncs its directory: [`Incoming::check`], [`Checked::sync`], [`Checked::publish`] and
    /// [`sync_dir`] in a row. On a failed check the partial file is removed (its bytes are
    /// wrong) and the refusal says why; nothing with the final name is created.
    pub fn finish(
        self,
        hash: Option<[u8; 32]>,
        mode: u32,
        mtime: (i64, u32),
    ) -> Result<u64, Refusal> {
        let checked = self.check(hash, mode, mtime)?;
        checked.sync()?;
        let published = checked.publish()?;
        sync_dir(published.parent())
            .map_err(|e| Refusal::io("syncing the directory of", published.name(), e))?;
        Ok(published.bytes())
    }

    /// The checks before a file may become final: its length is the announced one and its
    /// BLAKE3 hash the sender's `hash` (read back from the partial file, unless
    /// [`Store::put`] wrote it from bytes it had checked); then its mode (special bits
    /// dropped unless kept) and mtime are set. A failed check removes the partial file.
    pub fn check(
        mut self,
        hash: Option<[u8; 32]>,
        mode: u32,
        mtime: (i64, u32),
    ) -> Result<Checked, Refusal> {
        let len = if self.written {
            self.size.expect("a put has its size")
        } else {
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
                let got = match (self.landed, &self.sparse) {
                    (Some((l, h)), _) if l == len => h,
                    (_, Some((offset, prefix, extents))) => {
                        crate::sparse::digest(&self.file, len, *offset, prefix, extents)
                            .map_err(|e| Refusal::io("hashing", &self.partial, e))?
                    }
                    _ => hash_prefix(&self.file, len)
                        .map_err(|e| Refusal::io("hashing", &self.partial, e))?,
                };
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
            len
        };
        if self.existing {
            return Ok(Checked { inc: self, len });
        }
        let keep = if self.keep_special_bits {
            0o7777
        } else {
            0o777
        };
        let io_err = |what: &str, e: io::Error| Refusal::io(what, &self.name, e);
        rustix::fs::fchmod(&self.file, Mode::from_raw_mode(mode & keep))
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
        Ok(Checked { inc: self, len })
    }

    /// Removes the partial file (its contents are wrong or unwanted) and gives back the
    /// reservation.
    pub fn discard(&mut self) {
        if self.existing {
            self.settled = true;
            return;
        }
        let on_disk = self.file.metadata().map(|m| m.len()).unwrap_or(0);
        self.settle_quota(on_disk);
        let _ = rustix::fs::unlinkat(&self.parent, &self.partial, AtFlags::empty());
        self.settled = true;
    }

    /// Ends the file early but keeps what arrived (for `--resume`): frees the reserved space
    /// past the data and the unused part of the quota; with no data, removes the file.
    /// Returns the bytes kept.
    pub fn release(&mut self) -> u64 {
        if self.settled {
            return 0;
        }
        if is_put_partial(&self.partial) {
            // A `Put` is always sent whole again: its bytes are worth nothing to a rerun,
            // and a pipeline reset mid-way would leave its whole window behind.
            self.discard();
            return 0;
        }
        match release_reservation(&self.file) {
            Ok(0) | Err(_) => {
                self.discard();
                0
            }
            Ok(len) => {
                self.settle_quota(len);
                self.settled = true;
                len
            }
        }
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        self.release();
    }
}

/// A received file whose length and hash checked out and whose mode and mtime are set: it
/// still has to be made durable ([`Checked::sync`], or an `fsync` of [`Checked::file`]
/// elsewhere, e.g. on a pool of threads) before [`Checked::publish`] gives it its name.
/// Dropped before that, it is an early end like an [`Incoming`]'s (the bytes stay, partial).
#[derive(Debug)]
pub struct Checked {
    inc: Incoming,
    len: u64,
}

impl Checked {
    /// The partial file (to `fsync`).
    pub fn file(&self) -> &File {
        &self.inc.file
    }

    /// The name as sent.
    pub fn name(&self) -> &str {
        &self.inc.name
    }

    /// `fsync(2)`s the file; on failure removes the partial file (whether its bytes reached
    /// the disk is unknown) and says why.
    pub fn sync(&self) -> Result<(), Refusal> {
        self.inc.file.sync_all().map_err(|e| self.sync_failed(e))
    }

    /// The refusal for a failed `fsync` of this file.
    pub fn sync_failed(&self, e: io::Error) -> Refusal {
        Refusal::io("syncing", &self.inc.name, e)
    }

    /// Gives up on the file (its sync failed): the partial file is removed.
    pub fn discard(mut self) {
        self.inc.discard();
    }

    /// Renames the (synced) partial file onto its final name — `RENAME_NOREPLACE` unless
    /// overwriting — and settles the quota. The name is durable only once its directory is
    /// synced ([`sync_dir`] of [`Published::parent`]).
    pub fn publish(mut self) -> Result<Published, Refusal> {
        let inc = &mut self.inc;
        if inc.existing {
            return Ok(Published {
                parent: inc.parent.clone(),
                name: inc.name.clone(),
                len: self.len,
            });
        }
        let flags = if inc.overwrite {
            RenameFlags::empty()
        } else {
            RenameFlags::NOREPLACE
        };
        let renamed =
            rustix::fs::renameat_with(&*inc.parent, &inc.partial, &*inc.parent, &inc.leaf, flags);
        if let Err(e) = renamed {
            let name = inc.name.clone();
            let looked = inc.looked;
            inc.discard();
            return Err(if e != rustix::io::Errno::EXIST {
                Refusal::io("renaming", &name, e.into())
            } else if looked {
                Refusal::new(
                    Code::Exists,
                    format!("{name:?} appeared during the transfer (another sender finished it first); use --overwrite to replace it"),
                )
            } else {
                Refusal::new(
                    Code::Exists,
                    format!("{name:?} exists (use --overwrite to replace it)"),
                )
            });
        }
        inc.settle_quota(self.len);
        inc.settled = true;
        Ok(Published {
            parent: inc.parent.clone(),
            name: inc.name.clone(),
            len: self.len,
        })
    }
}

/// A file under its final name; durable once [`sync_dir`] of its parent returns.
#[derive(Debug)]
pub struct Published {
    parent: Arc<OwnedFd>,
    name: String,
    len: u64,
}

impl Published {
    /// The directory holding the name (shared by the files of one directory in a session,
    /// so one `fsync` serves them all).
    pub fn parent(&self) -> &Arc<OwnedFd> {
        &self.parent
    }

    /// The name as sent.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes in the file.
    pub fn bytes(&self) -> u64 {
        self.len
    }
}

/// `fsync(2)` of a directory, so the names created in it survive a power cut.
pub fn sync_dir(dir: &OwnedFd) -> io::Result<()> {
    rustix::fs::fsync(dir).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

    fn store(opts: StoreOptions) -> (tempfile::TempDir, Store) {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path(), opts).unwrap();
        (d, s)
    }

    fn write(inc: &Incoming, data: &[u8]) {
        let mut f = inc.file();
        f.write_all(data).unwrap();
    }

    /// The file system type of the mount holding `path`, from /proc/self/mounts (longest
    /// mount point that is a prefix of it).
    fn mount_type(path: &Path) -> Option<String> {
        let path = path.canonicalize().ok()?;
        let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
        mounts
            .lines()
            .filter_map(|l| {
                let mut f = l.split(' ');
                let (_, at, kind) = (f.next()?, f.next()?, f.next()?);
                path.starts_with(at).then(|| (at.len(), kind.to_string()))
            })
            .max_by_key(|(n, _)| *n)
            .map(|(_, kind)| kind)
    }

    #[test]
    fn a_partial_file_knows_whether_it_is_on_tmpfs() {
        let mut dirs = vec![tempfile::tempdir().unwrap()];
        if let Ok(d) = tempfile::tempdir_in("/dev/shm") {
            dirs.push(d);
        }
        if let Ok(d) = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")) {
            dirs.push(d);
        }
        for d in dirs {
            // Every path lies under some mount point ("/" at least).
            let kind = mount_type(d.path())
                .unwrap_or_else(|| panic!("no /proc/self/mounts entry for {}", d.path().display()));
            let mut s = Store::open(d.path(), StoreOptions::default()).unwrap();
            let inc = s.begin("f", Some(10), true).unwrap();
            assert_eq!(
                inc.on_tmpfs(),
                kind == "tmpfs",
                "{}: {kind}",
                d.path().display()
            );
        }
    }

    #[test]
    fn a_verified_file_becomes_final_with_mode_and_mtime() {
        let (d, mut s) = store(StoreOptions::default());
        let inc = s.begin("sub/dir/f.bin", Some(5), true).unwrap();
        write(&inc, b"hello");
        let partial = d.path().join("sub/dir").join(inc.partial_name());
        assert!(partial.exists());
        assert!(
            inc.partial_name().starts_with("f.bin.") && inc.partial_name().ends_with(".partial")
        );
        assert!(!d.path().join("sub/dir/f.bin").exists());
        let h = *blake3::hash(b"hello").as_bytes();
        assert_eq!(inc.finish(Some(h), 0o640, (1_000_000, 5)).unwrap(), 5);
        assert!(!partial.exists());
        let p = d.path().join("sub/dir/f.bin");
        assert_eq!(std::fs::read(&p).unwrap(), b"hello");
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.mode() & 0o777, 0o640);
        assert_eq!(m.mtime(), 1_000_000);
    }

    #[test]
    fn wrong_hash_or_length_leaves_no_final_file() {
        let (d, mut s) = store(StoreOptions::default());
        let inc = s.begin("a", Some(3), true).unwrap();
        write(&inc, b"abc");
        let e = inc.finish(Some([0; 32]), 0o644, (0, 0)).unwrap_err();
        assert_eq!(e.code, Code::HashMismatch);
        let inc = s.begin("b", Some(4), true).unwrap();
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
        assert_eq!(s.begin("x", Some(1), true).unwrap_err().code, Code::Exists);
        let o = StoreOptions {
            overwrite: true,
            ..Default::default()
        };
        let mut s2 = Store::open(d.path(), o).unwrap();
        let inc = s2.begin("x", Some(3), true).unwrap();
        write(&inc, b"new");
        inc.finish(None, 0o644, (0, 0)).unwrap();
        assert_eq!(std::fs::read(d.path().join("x")).unwrap(), b"new");
    }

    #[test]
    fn symlinks_in_the_tree_are_not_followed() {
        let (d, mut s) = store(StoreOptions::default());
        let outside = tempfile::tempdir().unwrap();
        symlink(outside.path(), d.path().join("link")).unwrap();
        let e = s.begin("link/evil", Some(1), true).unwrap_err();
        assert_eq!(e.code, Code::UnsafeName, "{e}");
        assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
    }

    #[test]
    fn unsafe_names_and_byte_caps_are_refused() {
        let (_d, mut s) = store(StoreOptions {
            max_bytes: Some(10),
            ..Default::default()
        });
        assert_eq!(
            s.begin("../x", Some(1), true).unwrap_err().code,
            Code::UnsafeName
        );
        assert_eq!(
            s.begin("/etc/x", Some(1), true).unwrap_err().code,
            Code::UnsafeName
        );
        assert_eq!(
            s.begin("big", Some(11), true).unwrap_err().code,
            Code::TooLarge
        );
        assert!(s.charge(10).is_ok());
        assert_eq!(s.charge(1).unwrap_err().code, Code::TooLarge);
    }

    #[test]
    fn resume_takes_an_identical_final_file_as_done_and_never_touches_a_different_one() {
        let (d, mut s) = store(StoreOptions {
            resume: true,
            ..Default::default()
        });
        let h = |b: &[u8]| *blake3::hash(b).as_bytes();
        let same = d.path().join("same");
        std::fs::write(&same, b"12345678").unwrap();
        std::fs::set_permissions(&same, std::fs::Permissions::from_mode(0o600)).unwrap();
        let before = std::fs::metadata(&same).unwrap();
        // A `Put` of the same bytes: done, the file left exactly as it was.
        let inc = s.put("same", b"12345678", Some(h(b"12345678"))).unwrap();
        assert_eq!(inc.finish(Some(h(b"12345678")), 0o644, (1, 0)).unwrap(), 8);
        let after = std::fs::metadata(&same).unwrap();
        assert_eq!(after.ino(), before.ino());
        assert_eq!(after.mode(), before.mode());
        assert_eq!(after.mtime(), before.mtime());
        // A `File` of the same bytes is offered whole, with their hash.
        let inc = s.begin("same", Some(8), true).unwrap();
        assert_eq!((inc.offset(), inc.prefix()), (8, Some(h(b"12345678"))));
        assert_eq!(inc.finish(Some(h(b"12345678")), 0o644, (1, 0)).unwrap(), 8);
        // Different bytes of the same length: a `Put` is refused as existing, a `File` that
        // starts over gets a partial file of its own; the final file is never changed.
        let r = s.put("same", b"abcdefgh", Some(h(b"abcdefgh"))).unwrap();
        assert_eq!(
            r.finish(Some(h(b"abcdefgh")), 0o644, (1, 0))
                .unwrap_err()
                .code,
            Code::Exists
        );
        let mut inc = s.begin("same", Some(8), true).unwrap();
        inc.restart().unwrap();
        assert_ne!(inc.partial_name(), "same");
        write(&inc, b"abcdefgh");
        assert_eq!(
            inc.finish(Some(h(b"abcdefgh")), 0o644, (1, 0))
                .unwrap_err()
                .code,
            Code::Exists
        );
        assert_eq!(std::fs::read(&same).unwrap(), b"12345678");
        assert_eq!(std::fs::metadata(&same).unwrap().ino(), before.ino());
        assert_eq!(entries(d.path()), vec!["same".to_string()]);
    }

    #[test]
    fn resume_sweeps_stale_put_partials_of_its_owner_only() {
        let (d, mut s) = store(StoreOptions {
            resume: true,
            ..Default::default()
        });
        let o = s.owner().to_string();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        let stale = format!("x.{o}.0123456789abcdef.partial");
        let resumable = format!("x.{o}.01234567.partial");
        let foreign = "x.someoneelse.0123456789abcdef.partial";
        for n in [&stale, &resumable, &foreign.to_string()] {
            std::fs::write(d.path().join("sub").join(n), b"abc").unwrap();
        }
        let inc = s.put("sub/y", b"y", None).unwrap();
        inc.finish(None, 0o644, (1, 0)).unwrap();
        let mut left = entries(&d.path().join("sub"));
        left.sort();
        let mut want = vec![resumable, foreign.to_string(), "y".to_string()];
        want.sort();
        assert_eq!(left, want);
    }

    /// Two streams of one resuming session share the owner, and each sweeps a directory the
    /// first time it sees it: a sweep racing a `put` in that directory must never unlink the
    /// fresh partial between its creation and its lock (the rename then failed with ENOENT,
    /// seen in `tree_kill_resume` with two streams).
    #[test]
    fn a_sweep_racing_a_put_never_removes_the_fresh_partial() {
        // On tmpfs where there is one: the race is in the names, not in the disk's fsyncs.
        let d = match Path::new("/dev/shm").is_dir() {
            true => tempfile::tempdir_in("/dev/shm").unwrap(),
            false => tempfile::tempdir().unwrap(),
        };
        let opts = StoreOptions {
            resume: true,
            ..Default::default()
        };
        let mut s = Store::open(d.path(), opts).unwrap();
        let o = s.owner().to_string();
        let dir = d.path().to_path_buf();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sweeper = {
            let stop = stop.clone();
            let dir = dir.clone();
            std::thread::spawn(move || {
                let fd = rustix::fs::open(&dir, OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty())
                    .unwrap();
                let mut sweeps = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    sweep_put_partials(crate::resolve::kernel_resolution(), &fd, &o);
                    sweeps += 1;
                }
                sweeps
            })
        };
        for i in 0..2000 {
            let name = format!("f{i}");
            let inc = s.put(&name, name.as_bytes(), None).unwrap();
            inc.finish(None, 0o644, (1, 0)).unwrap_or_else(|e| {
                panic!("file {i}: the partial went away under its own put: {e:?}")
            });
            assert_eq!(std::fs::read(dir.join(&name)).unwrap(), name.as_bytes());
            // Keep the directory small, so each sweep is short and they come often.
            std::fs::remove_file(dir.join(&name)).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(sweeper.join().unwrap() > 0, "the sweeper never ran");
    }

    #[test]
    fn resume_offers_the_partial_prefix() {
        let (d, mut s) = store(StoreOptions {
            resume: true,
            ..Default::default()
        });
        let o = s.owner().to_string();
        std::fs::write(d.path().join(format!("r.{o}.0000abcd.partial")), b"abcd").unwrap();
        let inc = s.begin("r", Some(8), true).unwrap();
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
        std::fs::write(
            d.path().join(format!("q.{o}.0000abcd.partial")),
            b"0123456789",
        )
        .unwrap();
        let inc = s.begin("q", Some(2), true).unwrap();
        assert_eq!(inc.offset(), 0);
        assert_eq!(inc.file().metadata().unwrap().len(), 0);
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_planted_hard_link_is_never_written_through() {
        let (d, mut s) = store(StoreOptions {
            resume: true,
            overwrite: true,
            ..Default::default()
        });
        // A file outside the directory (same file system), linked in under the very name a
        // resumable partial file of this owner would have.
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
        let o = s.owner().to_string();
        std::fs::hard_link(&victim, d.path().join(format!("f.{o}.00000001.partial"))).unwrap();
        let inc = s.begin("f", Some(4), true).unwrap();
        assert_eq!(inc.offset(), 0, "a linked partial file is not resumed");
        assert!(!inc.partial_name().ends_with("00000001.partial"));
        write(&inc, b"evil");
        inc.finish(None, 0o4755, (0, 0)).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::metadata(&victim).unwrap().mode() & 0o7777, 0o644);
        // The final file lost its setuid bit.
        assert_eq!(
            std::fs::metadata(d.path().join("f")).unwrap().mode() & 0o7777,
            0o755
        );
    }

    /// FIFOs under a final name and under partial-file names of this owner, with
    /// `--resume`, by the kernel's resolution and by the walk: a `Put` and a `File` of the
    /// final name are refused naming the FIFO, a file beside the partial-name FIFOs is
    /// received into a fresh partial file; nothing waits on a FIFO (a hang fails the test by
    /// never ending).
    #[test]
    fn fifos_are_never_opened_for_data_by_either_resolution() {
        let mut hows = vec![Resolution::Walk];
        if crate::resolve::kernel_resolution() == Resolution::Kernel {
            hows.push(Resolution::Kernel);
        }
        for how in hows {
            let (d, mut s) = store(StoreOptions {
                resume: true,
                overwrite: true,
                ..Default::default()
            });
            s.resolve_by(how);
            let o = s.owner().to_string();
            let fifo = |n: &str| {
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    d.path().join(n),
                    rustix::fs::FileType::Fifo,
                    Mode::from_raw_mode(0o600),
                    0,
                )
                .unwrap()
            };
            std::fs::create_dir(d.path().join("sub")).unwrap();
            fifo("sub/final");
            fifo(&format!("sub/other.{o}.0123456789abcdef.partial"));
            fifo(&format!("sub/other.{o}.01234567.partial"));
            let h = *blake3::hash(b"data").as_bytes();
            let e = s.put("sub/final", b"data", Some(h)).unwrap_err();
            assert_eq!(e.code, Code::Exists, "{how:?}: {e}");
            assert!(e.message.contains("FIFO"), "{how:?}: {e}");
            let e = s.begin("sub/final", Some(4), true).unwrap_err();
            assert!(e.message.contains("FIFO"), "{how:?}: {e}");
            let inc = s.begin("sub/other", Some(4), true).unwrap();
            assert_eq!(inc.offset(), 0, "{how:?}: the FIFO is not resumed");
            write(&inc, b"data");
            inc.finish(Some(h), 0o644, (0, 0)).unwrap();
            assert_eq!(std::fs::read(d.path().join("sub/other")).unwrap(), b"data");
        }
    }

    #[test]
    fn special_mode_bits_are_kept_only_when_asked() {
        let (d, mut s) = store(StoreOptions {
            keep_special_bits: true,
            ..Default::default()
        });
        let inc = s.begin("s", Some(1), true).unwrap();
        write(&inc, b"x");
        inc.finish(None, 0o6755, (0, 0)).unwrap();
        assert_eq!(
            std::fs::metadata(d.path().join("s")).unwrap().mode() & 0o7777,
            0o6755
        );
    }

    #[test]
    fn an_early_end_releases_the_reservation_and_keeps_only_arrived_bytes() {
        let (d, mut s) = store(StoreOptions::default());
        let inc = s.begin("empty-end", Some(64 << 20), true).unwrap();
        let p = d.path().join(inc.partial_name());
        let blocks = std::fs::metadata(&p).unwrap().blocks();
        drop(inc);
        assert!(!p.exists(), "a partial file without data is removed");
        let inc = s.begin("some", Some(64 << 20), true).unwrap();
        write(&inc, &[7; 10_000]);
        let p = d.path().join(inc.partial_name());
        drop(inc);
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.len(), 10_000, "arrived bytes stay for --resume");
        assert!(
            m.blocks() * 512 < 1 << 20,
            "{} blocks still allocated (reserved {blocks})",
            m.blocks()
        );
    }

    #[test]
    fn the_byte_cap_holds_across_sessions_of_one_address_and_counts_reservations() {
        let d = tempfile::tempdir().unwrap();
        let opts = StoreOptions {
            max_bytes: Some(100),
            ..Default::default()
        };
        let q = Quota::new(100);
        let a = SenderId {
            address: Some("192.0.2.1".parse().unwrap()),
            token: None,
        };
        let b = SenderId {
            address: Some("192.0.2.2".parse().unwrap()),
            token: None,
        };
        let mut s1 = Store::open_for(d.path(), opts, Some(q.clone()), &a).unwrap();
        let mut s2 = Store::open_for(d.path(), opts, Some(q.clone()), &a).unwrap();
        let mut s3 = Store::open_for(d.path(), opts, Some(q.clone()), &b).unwrap();
        let inc = s1.begin("one", Some(80), true).unwrap();
        // Reserved, not yet written: the second connection of the same address is refused.
        assert_eq!(
            s2.begin("two", Some(30), true).unwrap_err().code,
            Code::TooLarge
        );
        // Another address has its own cap.
        drop(s3.begin("three", Some(90), true).unwrap());
        // The first ends early after 50 bytes: 30 of its reservation come back.
        write(&inc, &[1; 50]);
        drop(inc);
        let inc = s2.begin("two", Some(50), true).unwrap();
        write(&inc, &[2; 50]);
        inc.finish(None, 0o644, (0, 0)).unwrap();
        assert_eq!(
            s2.begin("more", Some(1), true).unwrap_err().code,
            Code::TooLarge
        );
        assert_eq!(s1.charge(1).unwrap_err().code, Code::TooLarge);
    }

    #[test]
    fn with_a_token_the_cap_also_holds_per_token_across_addresses() {
        let d = tempfile::tempdir().unwrap();
        let opts = StoreOptions {
            max_bytes: Some(100),
            ..Default::default()
        };
        let q = Quota::new(100);
        let id = |a: &str| SenderId {
            address: Some(a.parse().unwrap()),
            token: Some(b"shared".to_vec()),
        };
        let mut s1 = Store::open_for(d.path(), opts, Some(q.clone()), &id("192.0.2.1")).unwrap();
        let mut s2 = Store::open_for(d.path(), opts, Some(q.clone()), &id("192.0.2.2")).unwrap();
        let inc = s1.begin("a", Some(70), true).unwrap();
        write(&inc, &[1; 70]);
        inc.finish(None, 0o644, (0, 0)).unwrap();
        assert_eq!(
            s2.begin("b", Some(70), true).unwrap_err().code,
            Code::TooLarge
        );
    }

    #[test]
    fn two_sessions_of_one_name_never_mix_and_the_second_is_told() {
        for overwrite in [false, true] {
            let (d, mut s1) = store(StoreOptions {
                overwrite,
                ..Default::default()
            });
            let mut s2 = Store::open(
                d.path(),
                StoreOptions {
                    overwrite,
                    ..Default::default()
                },
            )
            .unwrap();
            let a = s1.begin("n", Some(4), true).unwrap();
            let b = s2.begin("n", Some(4), true).unwrap();
            assert_ne!(a.partial_name(), b.partial_name());
            write(&a, b"AAAA");
            write(&b, b"BBBB");
            a.finish(None, 0o644, (0, 0)).unwrap();
            let second = b.finish(None, 0o644, (0, 0));
            let got = std::fs::read(d.path().join("n")).unwrap();
            if overwrite {
                second.unwrap();
                assert_eq!(got, b"BBBB", "the last complete file wins whole");
            } else {
                assert_eq!(second.unwrap_err().code, Code::Exists);
                assert_eq!(got, b"AAAA");
            }
            assert_eq!(
                entries(d.path()),
                vec!["n".to_string()],
                "nothing else left"
            );
        }
    }

    #[test]
    fn resume_is_offered_only_to_the_owner_and_only_when_verified() {
        let d = tempfile::tempdir().unwrap();
        let opts = StoreOptions {
            resume: true,
            ..Default::default()
        };
        let me = SenderId {
            address: None,
            token: Some(b"mine".to_vec()),
        };
        let other = SenderId {
            address: Some("192.0.2.9".parse().unwrap()),
            token: None,
        };
        let mut s = Store::open_for(d.path(), opts, None, &me).unwrap();
        let inc = s.begin("r", Some(8), true).unwrap();
        write(&inc, b"abcd");
        drop(inc);
        let mut t = Store::open_for(d.path(), opts, None, &other).unwrap();
        assert_eq!(t.begin("r", Some(8), true).unwrap().offset(), 0);
        assert_eq!(
            s.begin("r", Some(8), false).unwrap().offset(),
            0,
            "unverified"
        );
        let inc = s.begin("r", Some(8), true).unwrap();
        assert_eq!(inc.offset(), 4);
        // While it is in use, a second session of the same owner does not get it.
        assert_eq!(s.begin("r", Some(8), true).unwrap().offset(), 0);
        drop(inc);
        // An address proves nothing: an address-only owner's partial file is taken over
        // from 0, its bytes dropped, and no hash of them is offered.
        let mut u = Store::open_for(d.path(), opts, None, &other).unwrap();
        let inc = u.begin("a", Some(8), true).unwrap();
        write(&inc, b"abcd");
        drop(inc);
        let inc = u.begin("a", Some(8), true).unwrap();
        assert_eq!((inc.offset(), inc.prefix()), (0, None));
        assert_eq!(inc.file().metadata().unwrap().len(), 0);
        assert!(!u.offers_prefixes());
    }
}
