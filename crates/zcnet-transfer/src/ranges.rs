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

use super::store::{Incoming, Refusal, Store};
use super::wire::Code;
use blake3::hazmat::{
    left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode,
};
use std::collections::HashMap;
use std::fs::File;
use std::sync::{Arc, Mutex, MutexGuard};

/// Smallest file split into ranges. Below it a file rides one stream whole and the tree's
/// other files fill the other streams: a range costs a round trip (`Range`/`Ready`) and a
/// `Trailer`/`Ack`, and 64 MiB takes about 50 ms on one loopback stream here, so smaller
/// pieces gain less than they cost.
pub const RANGE_THRESHOLD: u64 = 64 << 20;

/// Smallest range [`split`] makes (the left child of a split node; a right-edge remainder
/// may be smaller).
pub const MIN_RANGE: u64 = 8 << 20;

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
}

/// A range a stream took: the partial file to write it into (its own descriptor) and the
/// file's shared state.
#[derive(Debug)]
pub struct Claim {
    file: File,
    range: (u64, u64),
    name: String,
    entry: Arc<Mutex<Ranged>>,
}

impl Claim {
    /// The partial file, to write the range at its offset.
    pub fn file(&self) -> &File {
        &self.file
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
#[derive(Debug, Default)]
pub struct RangedFiles {
    files: Mutex<HashMap<String, Arc<Mutex<Ranged>>>>,
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
        let entry = {
            let mut files = lock(&self.files);
            match files.get(name) {
                Some(e) => e.clone(),
                None => {
                    let mut inc = store.begin(name, Some(meta.size), meta.verify)?;
                    if inc.offset() > 0 {
                        inc.restart()?;
                    }
                    let e = Arc::new(Mutex::new(Ranged {
                        meta,
                        inc: Some(inc),
                        claimed: Vec::new(),
                        landed: Vec::new(),
                        done: 0,
                        failed: None,
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
        Ok(Claim {
            file,
            range: (offset, len),
            name: name.to_string(),
            entry: entry.clone(),
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
                    return Landed::Range;
                }
                self.finish(&name, &mut f)
            }
        };
        lock(&self.files).remove(&name);
        match result {
            Ok(n) => Landed::Final(n),
            Err(refusal) => {
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
