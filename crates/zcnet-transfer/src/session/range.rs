//! Both ends of one range of a large file (version 6): the file is cut into ranges, nodes
//! of its BLAKE3 tree ([`ranges::split`]), that travel on whichever streams of the session;
//! it is final once all of them landed ([`RangedFiles`]).

use super::super::digest::hash_range;
use super::super::landing::LAND_STEP;
use super::super::ranges::{self, FileMeta, Landed, RangedFiles};
use super::super::store::{Refusal, Store};
use super::super::wire::{Code, Frame};
use super::recv_channel::RecvChannel;
use super::send_channel::SendChannel;
use super::{
    ack_outcome, io_err, join_hasher, ready_or_refuse, trailer_hash, unexpected, Entry,
    FileOutcome, SendOptions, Tally, TransferError,
};
use std::fs::File;
use std::io;
use std::path::Path;

/// Sends range `offset..offset+len` of the `size`-byte file at `path` (a node of its BLAKE3
/// tree): `Range`, the receiver's `Ready`, `Start`, the bytes by `sendfile`, and a `Trailer`
/// with the range's chaining value, hashed from the page cache on a second thread as the
/// bytes go. Its outcome is the range's; the file's is all of its ranges'.
pub(super) fn send_range(
    chan: &mut SendChannel<'_>,
    path: &Path,
    name: &str,
    (offset, len, size): (u64, u64, u64),
    opts: &SendOptions,
    tally: &mut Tally<'_>,
) -> Result<FileOutcome, TransferError> {
    let file = File::open(path).map_err(io_err(format!("opening {}", path.display())))?;
    let meta = file
        .metadata()
        .map_err(io_err(format!("reading {}", path.display())))?;
    if meta.len() != size || !ranges::is_node(size, offset, len) {
        // Never announce a range of a file that is no longer the one split.
        return Ok(FileOutcome::failed(
            Entry::File,
            name,
            Code::Length,
            format!(
                "{} changed size while being sent ({size} bytes, then {}); range {offset}+{len} not sent",
                path.display(),
                meta.len()
            ),
        ));
    }
    use std::os::unix::fs::MetadataExt;
    chan.send_frame(&Frame::Range {
        name: name.into(),
        size,
        mode: meta.mode() & 0o7777,
        mtime_s: meta.mtime(),
        mtime_ns: meta.mtime_nsec() as u32,
        verify: opts.verify,
        offset,
        len,
    })?;
    let end = offset + len;
    let start = match ready_or_refuse(chan.read_frame()?)? {
        Ok((at, None)) if at == offset => offset,
        // A rerun: the receiver has `offset..at`; go on from there only if it is ours.
        Ok((at, Some(theirs))) if at > offset && at <= end => {
            let mut h = blake3::Hasher::new();
            match hash_range(&file, &mut h, offset, at) {
                Ok(()) if *h.finalize().as_bytes() == theirs => at,
                _ => offset,
            }
        }
        Ok(_) => {
            return Err(TransferError::Unexpected {
                expected: "ready inside the range",
                got: "ready elsewhere",
            })
        }
        Err((code, message)) => return Ok(FileOutcome::failed(Entry::File, name, code, message)),
    };
    chan.send_frame(&Frame::Start { offset: start })?;
    let cv = std::thread::scope(|s| {
        let hasher = opts.verify.then(|| {
            s.spawn(|| {
                let mut h = ranges::range_hasher(offset);
                hash_range(&file, &mut h, offset, end).map(|()| {
                    use blake3::hazmat::HasherExt;
                    h.finalize_non_root()
                })
            })
        });
        let shrank = |got| TransferError::Shrank {
            name: name.into(),
            expected: size,
            got,
        };
        chan.send_extent(&file, start, end, &shrank, &mut |n| tally.bytes(n))?;
        join_hasher(hasher, path)
    })?;
    chan.send_frame(&Frame::Trailer { hash: cv })?;
    ack_outcome(chan.read_frame()?, name, end - start, cv.is_some())
}

/// A range's frame at the receiver: the file's name and metadata, and the range.
pub(super) struct RangeFrame {
    pub(super) name: String,
    pub(super) meta: FileMeta,
    pub(super) offset: u64,
    pub(super) len: u64,
}

/// Receives one range of a file arriving by ranges: claims it in the session's
/// [`RangedFiles`] (or refuses it), splices its bytes at their offset into the file's one
/// partial file, hashes them back from the page cache step by step as they land (while they
/// are still in cache), and answers with an `Ack` — for the range that completes the file,
/// once the file is final.
pub(super) fn receive_range(
    chan: &mut RecvChannel<'_>,
    store: &mut Store,
    ranged: &RangedFiles,
    range: RangeFrame,
    tally: &mut Tally<'_>,
) -> Result<(), TransferError> {
    let RangeFrame {
        name,
        meta,
        offset,
        len,
    } = range;
    let end_file = |code: Code, message: String, bytes: u64, tally: &mut Tally<'_>| {
        tally.done(FileOutcome {
            entry: Entry::File,
            name: name.clone(),
            bytes,
            verified: code == Code::Ok && meta.verify,
            result: if code == Code::Ok {
                Ok(())
            } else {
                Err((code, message))
            },
        });
    };
    let claim = match ranged.claim(store, &name, meta, offset, len) {
        Ok(c) => c,
        Err(Refusal { code, message }) => {
            chan.reply(&Frame::Refuse {
                code,
                message: message.clone(),
            })?;
            end_file(code, message, 0, tally);
            return Ok(());
        }
    };
    let end = offset + len;
    let kept = kept_prefix(&claim, offset);
    chan.reply(&Frame::Ready {
        offset: kept.as_ref().map_or(offset, |k| k.0),
        prefix: kept.as_ref().map(|k| k.1),
    })?;
    let mut hasher = meta.verify.then(|| ranges::range_hasher(offset));
    let start = match chan.read_frame()? {
        Some(Frame::Start { offset: o }) if o == offset => offset,
        Some(Frame::Start { offset: o }) if kept.as_ref().is_some_and(|k| k.0 == o) => {
            if meta.verify {
                hasher = kept.map(|k| k.2);
            }
            o
        }
        Some(Frame::Abort { message }) => {
            let landed = ranged.land(
                claim,
                Err(Refusal {
                    code: Code::Io,
                    message: format!("the sender gave up: {message}"),
                }),
            );
            if let Landed::Failed { refusal, first } = landed {
                if first {
                    end_file(refusal.code, refusal.message, 0, tally);
                }
            }
            return Ok(());
        }
        Some(other) => return Err(unexpected("start at the range's offset", &other)),
        None => {
            return Err(zcnet::Error::PeerClosed {
                op: "waiting for data",
            }
            .into())
        }
    };
    let hashing = splice_range(
        chan,
        &claim,
        &name,
        (offset, start, end),
        &mut hasher,
        tally,
    )?;
    let theirs = trailer_hash(chan.read_frame()?, meta.verify)?;
    let arrived = match hashing {
        Ok(()) => {
            use blake3::hazmat::HasherExt;
            Ok((hasher.map(|h| h.finalize_non_root()), theirs))
        }
        Err(e) => Err(Refusal::io("hashing a range of", &name, e)),
    };
    let (code, message, bytes) = match ranged.land(claim, arrived) {
        Landed::Range => (Code::Ok, String::new(), len),
        Landed::Final(n) => {
            end_file(Code::Ok, String::new(), n, tally);
            (Code::Ok, String::new(), n)
        }
        Landed::Failed { refusal, first } => {
            if first {
                end_file(refusal.code, refusal.message.clone(), 0, tally);
            }
            (refusal.code, refusal.message, 0)
        }
    };
    chan.reply(&Frame::Ack {
        code,
        bytes,
        message,
    })
}

/// A rerun: the recorded bytes of the range from `offset`, offered with their hash — where
/// they end, their plain BLAKE3 hash, and their hash state in the range's chaining value
/// (hashed once, from where they are read).
fn kept_prefix(claim: &ranges::Claim, offset: u64) -> Option<(u64, [u8; 32], blake3::Hasher)> {
    if claim.resume_at() <= offset {
        return None;
    }
    let (mut plain, mut tree) = (blake3::Hasher::new(), ranges::range_hasher(offset));
    let at = claim.resume_at();
    if hash_range(claim.file(), &mut plain, offset, at).is_ok()
        && hash_range(claim.file(), &mut tree, offset, at).is_ok()
    {
        return Some((at, *plain.finalize().as_bytes(), tree));
    }
    None
}

/// Splices `start..end` of the range that begins at `offset` into the claimed file,
/// hashing each step back from the page cache into `hasher` as it lands and recording the
/// progress every [`ranges::JOURNAL_STEP`]; how the hashing went (the data itself either
/// all arrived or failed the session).
fn splice_range(
    chan: &mut RecvChannel<'_>,
    claim: &ranges::Claim,
    name: &str,
    (offset, start, end): (u64, u64, u64),
    hasher: &mut Option<blake3::Hasher>,
    tally: &mut Tally<'_>,
) -> Result<Result<(), io::Error>, TransferError> {
    let mut hashing: Result<(), io::Error> = Ok(());
    let mut off = start;
    let mut recorded = start;
    while off < end {
        let n = match chan.recv_to_file(claim.file(), off, (end - off).min(LAND_STEP)) {
            Ok(n) => n,
            Err(TransferError::Net(zcnet::Error::Truncated { got, .. })) => {
                return Err(TransferError::Truncated {
                    name: name.into(),
                    expected: end - offset,
                    got: off - offset + got,
                })
            }
            Err(e) => return Err(e),
        };
        if let (Some(h), Ok(())) = (hasher.as_mut(), &hashing) {
            hashing = hash_range(claim.file(), h, off, off + n);
        }
        off += n;
        tally.bytes(n);
        if claim.recorded() && off - recorded >= ranges::JOURNAL_STEP && off < end {
            // Best effort: without the record a rerun sends these bytes again.
            let _ = claim.record(off);
            recorded = off;
        }
    }
    Ok(hashing)
}
