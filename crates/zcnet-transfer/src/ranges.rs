//! One large file split into ranges over parallel streams (protocol version 6).
//!
//! A file of at least [`RANGE_THRESHOLD`] bytes sent over several streams is cut into
//! ranges that are whole subtrees of its BLAKE3 tree ([`split`]), so each range hashes on
//! its own — at the sender as it is read, at the receiver as it lands — to a chaining value,
//! and the chaining values combine into the root hash of the whole file ([`root`]) without
//! anyone hashing the file in one pass (BLAKE3 paper, section 2.1 "Tree structure";
//! `blake3::hazmat`). Each range travels as `Range` (name, size, offset, length), then
//! `Start` and its raw bytes, then a `Trailer` with the range's chaining value.
//!
//! The receiver writes every range at its offset into one partial file ([`RangedFiles`], one
//! per session, shared by its streams), checks each range's chaining value against the
//! sender's as the range ends, and finishes the file — length, the combined root against the
//! root of the sender's chaining values, `fsync`, rename, directory `fsync` — exactly once,
//! when the last byte of the file has landed. The first range that fails removes the partial
//! file and fails the file: nothing final appears.
//!
//! With `--resume`, what each range has landed survives a crash in a small record beside the
//! partial file ([`Journal`], `PARTIAL.ranges`): every [`JOURNAL_STEP`] bytes of a range, and
//! at its end, the partial file's data is synced (`fdatasync`) and then a record of the
//! range's landed end appended and synced, so a record never names bytes that are not on
//! disk. A rerun offers each range from its recorded end with the BLAKE3 hash of the bytes
//! there; the sender continues from there only if its own bytes hash the same (a hole in a
//! partial file is not data: only recorded bytes are offered).

use super::descriptors::{per_ranged_file, Held, SessionDescriptors};
use super::open::open_regular;
use super::store::{Incoming, Refusal, Store};
use super::wire::Code;
use blake3::hazmat::{
    left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode,
};
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex, MutexGuard};

/// Smallest file split into ranges. Below it a file rides one stream whole and the tree's
/// other files fill the other streams: a range costs a round trip (`Range`/`Ready`) and a
/// `Trailer`/`Ack`, and 64 MiB takes about 50 ms on one loopback stream here, so smaller
/// pieces gain less than they cost.
pub const RANGE_THRESHOLD: u64 = 64 << 20;

/// Smallest range [`split`] makes (the left child of a split node; a right-edge remainder
/// may be smaller).
pub const MIN_RANGE: u64 = 8 << 20;

/// Bytes of a range landed between two records in its [`Journal`] (each costs an
/// `fdatasync` of the partial file and of the record).
pub const JOURNAL_STEP: u64 = 16 << 20;

/// The record's name: the partial file's, and this (so no rule for partial files, which end
/// in `.partial`, ever takes it for one).
pub const JOURNAL_SUFFIX: &str = ".ranges";

/// One record: file size, range offset, range length, landed end (u64 each, big-endian),
/// then the first 16 bytes of the BLAKE3 of those 32 — a torn or foreign record is skipped.
const RECORD: usize = 48;

fn record_bytes(size: u64, offset: u64, len: u64, end: u64) -> [u8; RECORD] {
    let mut r = [0u8; RECORD];
    for (i, v) in [size, offset, len, end].iter().enumerate() {
        r[i * 8..i * 8 + 8].copy_from_slice(&v.to_be_bytes());
    }
    let check = blake3::hash(&r[..32]);
    r[32..].copy_from_slice(&check.as_bytes()[..16]);
    r
}

/// The landed end of each range `(offset, len)` a [`Journal`] recorded.
pub type Recorded = HashMap<(u64, u64), u64>;

/// What a ranged partial file holds, kept beside it as appended records (see the module
/// doc): for each range, the end of the bytes that landed and were synced.
#[derive(Debug)]
pub struct Journal {
    file: File,
    parent: Arc<rustix::fd::OwnedFd>,
    name: String,
    at: Mutex<u64>,
}

impl Journal {
    /// Opens (or creates) the record beside `inc`'s partial file and reads the landed end of
    /// each range of a `size`-byte file from it.
    pub fn open(inc: &Incoming, size: u64) -> io::Result<(Journal, Recorded)> {
        use rustix::fs::OFlags;
        let name = format!("{}{JOURNAL_SUFFIX}", inc.partial_name());
        let file = open_regular(
            inc.resolution(),
            &**inc.parent(),
            &name,
            OFlags::RDWR | OFlags::CREATE,
            0o600,
        )?;
        let meta = file.metadata()?;
        if !meta.is_file() || std::os::unix::fs::MetadataExt::nlink(&meta) != 1 {
            return Err(io::Error::other(
                "the range record is not a file of its own",
            ));
        }
        let mut bytes = vec![0u8; meta.len().min(1 << 20) as usize];
        file.read_exact_at(&mut bytes, 0)?;
        let mut landed = HashMap::new();
        for r in bytes.chunks_exact(RECORD) {
            let v = |i: usize| u64::from_be_bytes(r[i * 8..i * 8 + 8].try_into().expect("8"));
            let (s, o, l, e) = (v(0), v(1), v(2), v(3));
            if record_bytes(s, o, l, e) != *r || s != size || !is_node(size, o, l) {
                continue;
            }
            if e > o && e <= o + l {
                let end = landed.entry((o, l)).or_insert(o);
                *end = (*end).max(e);
            }
        }
        let at = bytes.len() as u64 / RECORD as u64 * RECORD as u64;
        Ok((
            Journal {
                file,
                parent: inc.parent().clone(),
                name,
                at: Mutex::new(at),
            },
            landed,
        ))
    }

    /// Range `offset+len` of a `size`-byte file has landed up to `end` in `data` (the
    /// partial file): synced, then recorded and the record synced.
    pub fn record(
        &self,
        data: &File,
        size: u64,
        (offset, len): (u64, u64),
        end: u64,
    ) -> io::Result<()> {
        data.sync_data()?;
        let mut at = lock(&self.at);
        self.file
            .write_all_at(&record_bytes(size, offset, len, end), *at)?;
        *at += RECORD as u64;
        drop(at);
        self.file.sync_data()
    }

    /// The file is final or failed: the record goes.
    fn remove(&self) {
        let _ = rustix::fs::unlinkat(&*self.parent, &self.name, rustix::fs::AtFlags::empty());
    }
}

/// Shortest range a receiver takes, but for the last of a file (the right edge of its tree
/// may be short): a peer cutting a file into 1 KiB chunks would cost a claim, a round trip
/// and a record each.
pub const MIN_PEER_RANGE: u64 = 1 << 20;

/// Most ranges one file may come in (a legitimate sender makes two per stream, at most 32).
pub const MAX_RANGES_PER_FILE: usize = 4096;

/// Most files a session may have unfinished by ranges at once (each holds its partial file
/// open until its last range lands).
pub const MAX_RANGED_FILES: usize = 1024;

/// The two children of a BLAKE3 tree node at `offset` of `len` bytes, or `None` for a
/// chunk (a leaf).
fn children(offset: u64, len: u64) -> Option<((u64, u64), (u64, u64))> {
    if len <= blake3::CHUNK_LEN as u64 {
        return None;
    }
    let left = left_subtree_len(len);
    Some(((offset, left), (offset + left, len - left)))
}

/// Cuts a file of `size` bytes into at most `pieces` ranges, each a node of the file's
/// BLAKE3 tree, in file order: the largest range whose left child is at least `min` is
/// split in two until there are `pieces` (or none can be split). Ranges are unequal where
/// the size is not a power of two (a left subtree is the largest power of two of chunks
/// below its parent's length); the streams balance them ([`super::streams::spread`]).
pub fn split(size: u64, pieces: usize, min: u64) -> Vec<(u64, u64)> {
    let mut out = vec![(0, size)];
    while out.len() < pieces {
        let pick = out
            .iter()
            .enumerate()
            .filter(|(_, &(o, l))| children(o, l).is_some_and(|(left, _)| left.1 >= min))
            .max_by_key(|(i, &(_, l))| (l, std::cmp::Reverse(*i)))
            .map(|(i, _)| i);
        let Some(i) = pick else { break };
        let (o, l) = out[i];
        let (left, right) = children(o, l).expect("filtered on children");
        out.splice(i..=i, [left, right]);
    }
    out
}

/// Whether `offset..offset+len` is a node of the BLAKE3 tree of a `size`-byte file, other
/// than the root (a peer's range must be, or its chaining value means nothing).
pub fn is_node(size: u64, offset: u64, len: u64) -> bool {
    if len == 0 || len >= size || offset.checked_add(len).is_none_or(|end| end > size) {
        return false;
    }
    let (mut o, mut l) = (0, size);
    loop {
        if (o, l) == (offset, len) {
            return true;
        }
        match children(o, l) {
            None => return false,
            Some((left, right)) => (o, l) = if offset < right.0 { left } else { right },
        }
    }
}

/// A hasher for the range at `offset` (a node per [`is_node`]); its
/// [`HasherExt::finalize_non_root`] is the range's chaining value.
pub fn range_hasher(offset: u64) -> blake3::Hasher {
    let mut h = blake3::Hasher::new();
    h.set_input_offset(offset);
    h
}

/// The chaining value of node `(offset, len)` from the ranges' `cvs`, merging children
/// where no range is the node itself.
fn node_cv(offset: u64, len: u64, cvs: &[(u64, u64, ChainingValue)]) -> Option<ChainingValue> {
    if let Some(&(_, _, cv)) = cvs.iter().find(|c| (c.0, c.1) == (offset, len)) {
        return Some(cv);
    }
    let (l, r) = children(offset, len)?;
    Some(merge_subtrees_non_root(
        &node_cv(l.0, l.1, cvs)?,
        &node_cv(r.0, r.1, cvs)?,
        Mode::Hash,
    ))
}

/// The BLAKE3 hash of a `size`-byte file from the chaining values of ranges covering it
/// (nodes below the root, per [`is_node`]); `None` if they do not cover it.
pub fn root(size: u64, cvs: &[(u64, u64, ChainingValue)]) -> Option<[u8; 32]> {
    let (l, r) = children(0, size)?;
    let left = node_cv(l.0, l.1, cvs)?;
    let right = node_cv(r.0, r.1, cvs)?;
    Some(*merge_subtrees_root(&left, &right, Mode::Hash).as_bytes())
}

/// What every range of one file must agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileMeta {
    /// The whole file's length.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modification time (seconds, nanoseconds).
    pub mtime: (i64, u32),
    /// Chaining values follow each range.
    pub verify: bool,
}

/// A range landed and checked: offset, length, our chaining value, the sender's (`None`
/// without verification).
type LandedRange = (u64, u64, Option<ChainingValue>, Option<ChainingValue>);

/// A file being received by ranges.
#[derive(Debug)]
struct Ranged {
    meta: FileMeta,
    /// The partial file; `None` once finished or failed.
    inc: Option<Incoming>,
    /// Ranges taken by a stream (landed or not).
    claimed: Vec<(u64, u64)>,
    /// Ranges landed and checked, with the chaining values: ours, the sender's.
    landed: Vec<LandedRange>,
    /// Bytes landed and checked.
    done: u64,
    /// Why the file failed (the first failing range's reason).
    failed: Option<Refusal>,
    /// With `--resume` and verification: the record of landed ranges, and what it held when
    /// the file began here.
    journal: Option<Arc<Journal>>,
    resumable: Recorded,
    /// The descriptors of the partial file and its record, charged to the session until
    /// the file is finished or failed.
    fds: Option<Held>,
}

impl Drop for Ranged {
    /// The session ended inside the file: its bytes stay for `--resume` (and its record
    /// with them), or both go if none arrived.
    fn drop(&mut self) {
        if let Some(mut inc) = self.inc.take() {
            if inc.release() == 0 {
                if let Some(j) = &self.journal {
                    j.remove();
                }
            }
        }
    }
}

/// A range a stream took: the partial file to write it into (its own descriptor) and the
/// file's shared state.
#[derive(Debug)]
pub struct Claim {
    file: File,
    range: (u64, u64),
    name: String,
    entry: Arc<Mutex<Ranged>>,
    size: u64,
    journal: Option<Arc<Journal>>,
    resume_at: u64,
}

impl Claim {
    /// The partial file, to write the range at its offset.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Where the range's recorded bytes end in the partial file (a rerun with `--resume`),
    /// or its offset.
    pub fn resume_at(&self) -> u64 {
        self.resume_at
    }

    /// The range has landed up to `end`: recorded, when a record is kept (every
    /// [`JOURNAL_STEP`]; the caller says when).
    pub fn record(&self, end: u64) -> io::Result<()> {
        match &self.journal {
            Some(j) => j.record(&self.file, self.size, self.range, end),
            None => Ok(()),
        }
    }

    /// Whether a record is kept (`--resume` with verification).
    pub fn recorded(&self) -> bool {
        self.journal.is_some()
    }
}

/// How a range ended, for its `Ack`.
#[derive(Debug)]
pub enum Landed {
    /// Landed and checked; other ranges are still to come.
    Range,
    /// The last range: the file is final (verified, synced, renamed), of this many bytes.
    Final(u64),
    /// The file failed (`first`: this range is where it failed, so it is reported once).
    Failed {
        /// Why.
        refusal: Refusal,
        /// This range failed the file (rather than finding it failed already).
        first: bool,
    },
}

/// The files a session receives by ranges, shared by the session's streams (each holds an
/// `Arc`). Dropped with files unfinished (a stream's connection ended inside a range), their
/// partial files stay as any interrupted file's do ([`Incoming`]'s drop).
///
/// A file that failed stays here, failed, for the rest of the session (holding no
/// descriptor), so every later range of it is refused with the first failure's code rather
/// than beginning the file again; it counts against [`MAX_RANGED_FILES`] like an unfinished
/// one.
#[derive(Debug, Default)]
pub struct RangedFiles {
    files: Mutex<HashMap<String, Arc<Mutex<Ranged>>>>,
    /// What the session's files may hold open ([`SessionDescriptors`]).
    descriptors: Arc<SessionDescriptors>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn protocol(message: String) -> Refusal {
    Refusal {
        code: Code::Protocol,
        message,
    }
}

impl RangedFiles {
    /// The ranged files of a session whose descriptors are charged to `descriptors` (the
    /// default counts them without a cap).
    pub fn new(descriptors: Arc<SessionDescriptors>) -> RangedFiles {
        RangedFiles {
            files: Mutex::default(),
            descriptors,
        }
    }

    /// The session's account of descriptors (its connections are charged to it too).
    pub fn descriptors(&self) -> &Arc<SessionDescriptors> {
        &self.descriptors
    }

    /// Takes range `offset..offset+len` of `name` for a stream: checks it is a node of the
    /// file's tree below the root, agrees with the file's other ranges and overlaps none;
    /// the first range of a file begins its partial file in `store` (the name rules, the
    /// byte cap and `--overwrite` as for any file; a resumable whole-file partial is started
    /// over, since ranges land out of order).
    pub fn claim(
        &self,
        store: &mut Store,
        name: &str,
        meta: FileMeta,
        offset: u64,
        len: u64,
    ) -> Result<Claim, Refusal> {
        if !is_node(meta.size, offset, len) {
            return Err(protocol(format!(
                "{name:?}: {offset}+{len} is not a range of a {}-byte file's BLAKE3 tree",
                meta.size
            )));
        }
        if len < MIN_PEER_RANGE && offset + len < meta.size {
            return Err(protocol(format!(
                "{name:?}: a range of {len} bytes (the least is {MIN_PEER_RANGE} but for the last)"
            )));
        }
        let entry = {
            let mut files = lock(&self.files);
            match files.get(name) {
                Some(e) => e.clone(),
                None if files.len() >= MAX_RANGED_FILES => {
                    return Err(Refusal {
                        code: Code::Busy,
                        message: format!(
                            "{name:?}: this session already has {MAX_RANGED_FILES} files arriving by ranges"
                        ),
                    })
                }
                None => {
                    // Charged before anything is opened: a peer that starts files by ranges
                    // and finishes none is refused at its cap, not at the process's.
                    let recorded = store.resumes() && meta.verify;
                    let fds = self
                        .descriptors
                        .take(per_ranged_file(recorded), &format!("{name:?}"))?;
                    let inc = store.begin_ranged(name, meta.size, meta.verify)?;
                    let (journal, resumable) = match store.resumes() && meta.verify {
                        true => {
                            let (j, r) = Journal::open(&inc, meta.size)
                                .map_err(|e| Refusal::io("opening the range record of", name, e))?;
                            // What landed is offered (with its hash) only to a sender that
                            // proves it started the file; any other sends every range whole.
                            let r = if store.offers_prefixes() {
                                r
                            } else {
                                HashMap::new()
                            };
                            (Some(Arc::new(j)), r)
                        }
                        false => (None, HashMap::new()),
                    };
                    let e = Arc::new(Mutex::new(Ranged {
                        meta,
                        inc: Some(inc),
                        claimed: Vec::new(),
                        landed: Vec::new(),
                        done: 0,
                        failed: None,
                        journal,
                        resumable,
                        fds: Some(fds),
                    }));
                    files.insert(name.to_string(), e.clone());
                    e
                }
            }
        };
        let mut f = lock(&entry);
        if let Some(r) = &f.failed {
            return Err(r.clone());
        }
        if f.meta != meta {
            return Err(protocol(format!(
                "{name:?}: a range announces another size, mode, mtime or verification than the file's first range"
            )));
        }
        if f.claimed.len() >= MAX_RANGES_PER_FILE {
            return Err(protocol(format!(
                "{name:?}: more than {MAX_RANGES_PER_FILE} ranges"
            )));
        }
        if f.claimed
            .iter()
            .any(|&(o, l)| offset < o + l && o < offset + len)
        {
            return Err(protocol(format!(
                "{name:?}: range {offset}+{len} overlaps one already sent"
            )));
        }
        let inc = f.inc.as_ref().ok_or_else(|| {
            protocol(format!(
                "{name:?}: a range after the file was finished in this session"
            ))
        })?;
        let file = inc
            .file()
            .try_clone()
            .map_err(|e| Refusal::io("duplicating the partial file of", name, e))?;
        f.claimed.push((offset, len));
        let resume_at = f.resumable.get(&(offset, len)).copied().unwrap_or(offset);
        Ok(Claim {
            file,
            range: (offset, len),
            name: name.to_string(),
            entry: entry.clone(),
            size: meta.size,
            journal: f.journal.clone(),
            resume_at,
        })
    }

    /// The claimed range has arrived (`Ok`: our chaining value and the sender's, `None`
    /// without verification) or failed. A mismatch or a failure fails the whole file and
    /// removes its partial file; the range that completes the file finishes it.
    pub fn land(
        &self,
        claim: Claim,
        arrived: Result<(Option<ChainingValue>, Option<ChainingValue>), Refusal>,
    ) -> Landed {
        let Claim {
            range: (offset, len),
            name,
            entry,
            file,
            size,
            journal,
            ..
        } = claim;
        let mut f = lock(&entry);
        if let Some(refusal) = &f.failed {
            return Landed::Failed {
                refusal: refusal.clone(),
                first: false,
            };
        }
        let checked = arrived.and_then(|(mine, theirs)| match (f.meta.verify, mine, theirs) {
            (false, ..) => Ok((None, None)),
            (true, Some(m), Some(t)) if m == t => Ok((Some(m), Some(t))),
            (true, Some(_), Some(_)) => Err(Refusal {
                code: Code::HashMismatch,
                message: format!(
                    "{name:?}: BLAKE3 of bytes {offset}..{} as received differs from the sender's",
                    offset + len
                ),
            }),
            _ => Err(protocol(format!(
                "{name:?}: range {offset}+{len} without its chaining value"
            ))),
        });
        let result = match checked {
            Err(refusal) => Err(refusal),
            Ok((mine, theirs)) => {
                f.landed.push((offset, len, mine, theirs));
                f.done += len;
                if f.done < f.meta.size {
                    if let Some(j) = &journal {
                        // Best effort: without the record a rerun sends the range again.
                        let _ = j.record(&file, size, (offset, len), offset + len);
                    }
                    return Landed::Range;
                }
                self.finish(&name, &mut f)
            }
        };
        if let Some(j) = &journal {
            j.remove();
        }
        f.fds = None;
        match result {
            Ok(n) => {
                lock(&self.files).remove(&name);
                Landed::Final(n)
            }
            Err(refusal) => {
                // Kept, failed, so the file's later ranges are refused with this reason.
                if let Some(mut inc) = f.inc.take() {
                    inc.discard();
                }
                f.failed = Some(refusal.clone());
                Landed::Failed {
                    refusal,
                    first: true,
                }
            }
        }
    }

    /// Every byte of the file has landed: the combined hash checked, then synced and renamed
    /// as any file ([`Incoming::finish`]).
    fn finish(&self, name: &str, f: &mut Ranged) -> Result<u64, Refusal> {
        let mut inc = f
            .inc
            .take()
            .ok_or_else(|| protocol(format!("{name:?} finished twice")))?;
        let size = f.meta.size;
        let expected = if f.meta.verify {
            let of = |pick: fn(&LandedRange) -> Option<ChainingValue>| {
                let cvs: Option<Vec<_>> = f
                    .landed
                    .iter()
                    .map(|r| pick(r).map(|cv| (r.0, r.1, cv)))
                    .collect();
                cvs.and_then(|c| root(size, &c))
            };
            let (Some(ours), Some(theirs)) = (of(|r| r.2), of(|r| r.3)) else {
                inc.discard();
                return Err(protocol(format!(
                    "{name:?}: its ranges do not make up its BLAKE3 tree"
                )));
            };
            // Our root, from the bytes as they landed, stands in for a read back of the
            // file; the check compares it with the root of the sender's values.
            inc.landed_hash(size, ours);
            Some(theirs)
        } else {
            None
        };
        inc.finish(expected, f.meta.mode, f.meta.mtime)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 1024) as u8).collect()
    }

    fn cvs_of(d: &[u8], ranges: &[(u64, u64)]) -> Vec<(u64, u64, ChainingValue)> {
        ranges
            .iter()
            .map(|&(o, l)| {
                let mut h = range_hasher(o);
                h.update(&d[o as usize..(o + l) as usize]);
                (o, l, h.finalize_non_root())
            })
            .collect()
    }

    #[test]
    fn ranges_are_tree_nodes_covering_the_file_and_combine_to_its_hash() {
        let k = blake3::CHUNK_LEN as u64;
        for size in [
            2 * k + 1,
            8 * k,
            8 * k + 5,
            13 * k + 100,
            64 * k - 1,
            97 * k,
        ] {
            let d = data(size as usize);
            for pieces in [2, 3, 4, 8, 16] {
                let r = split(size, pieces, k);
                assert!(r.len() <= pieces && r.len() >= 2, "{size} {pieces}: {r:?}");
                let mut at = 0;
                for &(o, l) in &r {
                    assert_eq!(o, at, "in order, no gap");
                    assert!(is_node(size, o, l), "{size}: {o}+{l}");
                    at = o + l;
                }
                assert_eq!(at, size);
                assert_eq!(
                    root(size, &cvs_of(&d, &r)),
                    Some(*blake3::hash(&d).as_bytes()),
                    "{size} in {pieces}"
                );
                // One range missing: no root.
                assert_eq!(root(size, &cvs_of(&d, &r[1..])), None);
            }
        }
        // Bigger files: as many pieces as asked, none under the minimum but the edge's.
        let r = split(96 << 20, 8, MIN_RANGE);
        assert_eq!(r.len(), 8);
        assert!(r.iter().all(|&(_, l)| l >= MIN_RANGE));
        assert_eq!(
            split(64 << 20, 4, MIN_RANGE),
            vec![
                (0, 16 << 20),
                (16 << 20, 16 << 20),
                (32 << 20, 16 << 20),
                (48 << 20, 16 << 20)
            ]
        );
    }

    #[test]
    fn the_record_keeps_each_ranges_furthest_end_and_skips_torn_or_foreign_records() {
        use crate::store::StoreOptions;
        let d = tempfile::tempdir().unwrap();
        let opts = StoreOptions {
            resume: true,
            ..Default::default()
        };
        let mut store = Store::open(d.path(), opts).unwrap();
        let size = 96 << 20;
        let (a, b) = ((0, 64 << 20), (64 << 20, 32 << 20));
        let inc = store.begin_ranged("f", size, true).unwrap();
        let (j, had) = Journal::open(&inc, size).unwrap();
        assert!(had.is_empty());
        j.record(inc.file(), size, a, 16 << 20).unwrap();
        j.record(inc.file(), size, a, 32 << 20).unwrap();
        j.record(inc.file(), size, b, 96 << 20).unwrap();
        // Another size's record, and half a record (a write cut short), after them.
        j.record(inc.file(), size + 1, b, 70 << 20).unwrap();
        let path = d
            .path()
            .join(format!("{}{JOURNAL_SUFFIX}", inc.partial_name()));
        let mut raw = std::fs::read(&path).unwrap();
        raw.extend_from_slice(&record_bytes(size, 0, 64 << 20, 64 << 20)[..20]);
        std::fs::write(&path, &raw).unwrap();
        let (j2, had) = Journal::open(&inc, size).unwrap();
        assert_eq!(had.len(), 2);
        assert_eq!(had[&a], 32 << 20);
        assert_eq!(had[&b], 96 << 20);
        // New records go after the last whole one, over the torn tail.
        j2.record(inc.file(), size, a, 48 << 20).unwrap();
        let (_, had) = Journal::open(&inc, size).unwrap();
        assert_eq!(had[&a], 48 << 20);
        j2.remove();
        assert!(!path.exists());
    }

    /// A FIFO planted under the record's name (the partial file's name, computable with
    /// `--resume` once a resumable partial is there, and `.ranges`) is refused at once with
    /// the reason, never opened in a way that waits for a writer.
    #[test]
    fn a_fifo_under_the_records_name_is_refused_not_waited_on() {
        use crate::store::StoreOptions;
        let d = tempfile::tempdir().unwrap();
        let opts = StoreOptions {
            resume: true,
            ..Default::default()
        };
        let mut store = Store::open(d.path(), opts).unwrap();
        let partial = format!("f.{}.01234567.partial", store.owner());
        std::fs::write(d.path().join(&partial), b"").unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            d.path().join(format!("{partial}{JOURNAL_SUFFIX}")),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let inc = store.begin_ranged("f", 96 << 20, true).unwrap();
        assert_eq!(
            inc.partial_name(),
            partial,
            "the planted partial is resumed"
        );
        let e = Journal::open(&inc, 96 << 20).unwrap_err();
        assert!(e.to_string().contains("a FIFO, not a regular file"), "{e}");
    }

    #[test]
    fn a_peers_range_must_be_a_node_below_the_root() {
        let k = blake3::CHUNK_LEN as u64;
        let size = 10 * k;
        assert!(is_node(size, 0, 8 * k));
        assert!(is_node(size, 8 * k, 2 * k));
        assert!(is_node(size, 4 * k, 4 * k));
        assert!(!is_node(size, 0, size), "the root is no range");
        assert!(!is_node(size, 0, 5 * k));
        assert!(!is_node(size, 4 * k, 6 * k));
        assert!(!is_node(size, 1, 4 * k));
        assert!(!is_node(size, 8 * k, 3 * k), "past the end");
        assert!(!is_node(size, u64::MAX, 2));
        assert!(!is_node(size, 0, 0));
    }
}
