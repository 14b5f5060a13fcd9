//! Sparse files: the sender finds a file's data with `lseek(SEEK_DATA/SEEK_HOLE)`
//! (lseek(2)) and sends only those extents (`StartSparse`, version 4); the receiver writes
//! each at its offset and leaves the holes unwritten, so the file stays sparse where the
//! receiving file system keeps holes (ext4, xfs, btrfs, tmpfs do).
//!
//! What the `Trailer` hash covers: up to version 8 the whole file, holes read as zeros —
//! so the receiver hashed every byte a peer *claimed*, about 2 CPU-s per claimed GiB for a
//! few bytes on the wire (issue 40). BLAKE3 cannot skip a run of zeros: every 1 KiB chunk's
//! chaining value depends on its index (the chunk counter), so no two zero chunks hash
//! alike and no table of zero subtrees exists. From version 9 the hash of a file sent with
//! `StartSparse` is therefore the [`digest`] of what was sent — the extent list and the
//! extents' bytes, bound to the file's size and its kept prefix — which both ends compute in
//! time proportional to the data. The holes are not hashed: the receiver never writes them,
//! in a partial file of its own past its end, so they read as zeros
//! (`docs/transfer-protocol.md`, version 9).

use super::digest::hash_range;
use super::wire::{WireError, MAX_EXTENTS};
use rustix::fs::SeekFrom;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;

/// BLAKE3 key-derivation context of the version-9 sparse digest: the digest is never a
/// plain BLAKE3 hash of some bytes, so it cannot be taken for a dense file's.
pub const DIGEST_CONTEXT: &str = "zcnet transfer protocol v9 sparse file digest";

/// The start of the version-9 sparse digest of a file of `size` bytes whose data goes from
/// `offset` as `extents`, after a kept prefix whose BLAKE3 hash is `prefix` (of no bytes
/// when `offset` is 0): BLAKE3 in key-derivation mode ([`DIGEST_CONTEXT`]) over size and
/// offset (u64 big-endian), `prefix`, the extent count (u32) and each extent's start and
/// length (u64 each). The extents' bytes, in order, follow ([`digest`]).
pub fn digest_head(
    size: u64,
    offset: u64,
    prefix: &[u8; 32],
    extents: &[(u64, u64)],
) -> blake3::Hasher {
    let mut h = blake3::Hasher::new_derive_key(DIGEST_CONTEXT);
    h.update(&size.to_be_bytes());
    h.update(&offset.to_be_bytes());
    h.update(prefix);
    h.update(&(extents.len() as u32).to_be_bytes());
    for &(o, l) in extents {
        h.update(&o.to_be_bytes());
        h.update(&l.to_be_bytes());
    }
    h
}

/// The version-9 sparse digest of `file` ([`digest_head`], then the bytes of each extent
/// read from `file`): reads the extents only, never the holes.
pub fn digest(
    file: &File,
    size: u64,
    offset: u64,
    prefix: &[u8; 32],
    extents: &[(u64, u64)],
) -> io::Result<[u8; 32]> {
    let mut h = digest_head(size, offset, prefix, extents);
    for &(o, l) in extents {
        hash_range(file, &mut h, o, o + l)?;
    }
    Ok(*h.finalize().as_bytes())
}

/// Holes a receiver hashes for free in a session below version 9 (whose hash covers them as
/// zeros), on top of [`OLD_HOLES_PER_DATA_BYTE`] per byte of data: about 0.1 CPU-s.
pub const OLD_HOLES_FREE: u64 = 64 << 20;
/// Hole bytes a receiver hashes, below version 9, per byte of a sparse file's data: a disk
/// image a fiftieth full passes; a claim of a terabyte carrying a byte does not.
pub const OLD_HOLES_PER_DATA_BYTE: u64 = 64;

/// What is left of a session's budget of holes to hash (below version 9).
#[derive(Debug, Clone, Copy)]
pub struct HoleBudget {
    free: u64,
}

impl Default for HoleBudget {
    fn default() -> Self {
        HoleBudget {
            free: OLD_HOLES_FREE,
        }
    }
}

impl HoleBudget {
    /// Takes the holes of a file of `size` bytes sent from `offset` as `extents` from the
    /// budget — [`OLD_HOLES_PER_DATA_BYTE`] per data byte, the rest from what is left free
    /// in the session — or says why not (then nothing is taken).
    pub fn take(&mut self, extents: &[(u64, u64)], offset: u64, size: u64) -> Result<(), String> {
        let data: u64 = extents.iter().map(|&(_, l)| l).sum();
        let holes = (size - offset).saturating_sub(data);
        let beyond = holes.saturating_sub(data.saturating_mul(OLD_HOLES_PER_DATA_BYTE));
        if beyond > self.free {
            return Err(format!(
                "a sparse file with {holes} bytes of holes and {data} of data: below protocol version 9 its holes would be hashed as zeros, past this receiver's budget ({OLD_HOLES_PER_DATA_BYTE} per data byte, {} more this session); upgrade the sender",
                self.free
            ));
        }
        self.free -= beyond;
        Ok(())
    }
}

/// The data extents of `file` within `from..size` when it has holes there and at most
/// [`MAX_EXTENTS`] extents; `None` for a file without holes (the common case, decided from
/// its allocated blocks without a seek), with too many extents, or on a file system that
/// cannot tell (such a file goes whole, holes as zeros).
pub fn data_extents(file: &File, from: u64, size: u64) -> io::Result<Option<Vec<(u64, u64)>>> {
    let meta = file.metadata()?;
    if from >= size || meta.blocks() * 512 >= size {
        return Ok(None);
    }
    let mut extents = Vec::new();
    let mut at = from;
    while at < size {
        let data = match rustix::fs::seek(file, SeekFrom::Data(at)) {
            Ok(d) => d,
            Err(rustix::io::Errno::NXIO) => break, // only a hole from here on
            Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::OPNOTSUPP) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if data >= size {
            break;
        }
        let hole = match rustix::fs::seek(file, SeekFrom::Hole(data)) {
            Ok(h) => h.min(size),
            Err(rustix::io::Errno::NXIO) => size,
            Err(e) => return Err(e.into()),
        };
        if hole <= data {
            return Ok(None); // the file changed under us: send it whole
        }
        if extents.len() == MAX_EXTENTS {
            return Ok(None);
        }
        extents.push((data, hole - data));
        at = hole;
    }
    let data: u64 = extents.iter().map(|(_, l)| l).sum();
    Ok((data < size - from).then_some(extents))
}

/// Checks a peer's extent list for a file of `size` bytes whose data starts at `from`:
/// ascending, non-empty, apart (a hole of at least a byte between two: touching extents are
/// one extent, and `SEEK_DATA`/`SEEK_HOLE` never give two), inside `from..size`.
pub fn check_extents(extents: &[(u64, u64)], from: u64, size: u64) -> Result<(), WireError> {
    let mut next = from;
    for (i, &(o, l)) in extents.iter().enumerate() {
        let end = o
            .checked_add(l)
            .ok_or(WireError::Malformed("start-sparse"))?;
        if l == 0 || o < next || (i > 0 && o == next) || end > size {
            return Err(WireError::Malformed("start-sparse"));
        }
        next = end;
    }
    Ok(())
}

/// Gives back the space reserved past the end of a partial file (`fallocate` reserved it,
/// beyond the end, when the file began), so that the holes a sparse file's extents skip
/// stay holes. A hole punch (`FALLOC_FL_PUNCH_HOLE`) does nothing past the end on ext4; a
/// truncate that shortens the file frees every block beyond its new end (truncate(2)), so
/// the file is grown by a byte and cut back. Where that fails the file is still right,
/// only not sparse.
pub fn unreserve(file: &File) {
    if let Ok(m) = file.metadata() {
        let len = m.len();
        if file.set_len(len + 1).is_ok() {
            let _ = file.set_len(len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn extents_are_found_and_peer_lists_checked() {
        let dir = tempfile::tempdir().unwrap();
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("s"))
            .unwrap();
        let mib = 1u64 << 20;
        f.write_all_at(&vec![1; mib as usize], 4 * mib).unwrap();
        f.write_all_at(&vec![2; mib as usize], 9 * mib).unwrap();
        f.set_len(16 * mib).unwrap();
        let x = data_extents(&f, 0, 16 * mib).unwrap().expect("has holes");
        // File systems may round extents to their blocks; the data is inside them.
        assert_eq!(x.len(), 2, "{x:?}");
        assert!(x[0].0 <= 4 * mib && x[0].0 + x[0].1 >= 5 * mib, "{x:?}");
        assert!(x[1].0 <= 9 * mib && x[1].0 + x[1].1 >= 10 * mib, "{x:?}");
        assert!(check_extents(&x, 0, 16 * mib).is_ok());
        // From inside the first extent on.
        let y = data_extents(&f, 9 * mib, 16 * mib).unwrap().unwrap();
        assert_eq!(y.len(), 1);
        // A dense file has none.
        let d = File::create(dir.path().join("d")).unwrap();
        d.write_all_at(&[5; 8192], 0).unwrap();
        assert_eq!(data_extents(&d, 0, 8192).unwrap(), None);

        for bad in [
            vec![(0, 0)],
            vec![(5, 10), (10, 1)],
            vec![(0, 17)],
            vec![(u64::MAX, 2)],
            vec![(3, 1)],
            vec![(4, 2), (6, 2)], // touching: the doc says apart
        ] {
            assert!(check_extents(&bad, 4, 16).is_err(), "{bad:?}");
        }
        assert!(check_extents(&[(4, 2), (8, 8)], 4, 16).is_ok());
        assert!(check_extents(&[(4, 2), (7, 1)], 4, 16).is_ok());
    }

    #[test]
    fn the_digest_reads_the_extents_only_and_binds_everything_else() {
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(b"abc", 10).unwrap();
        f.write_all_at(b"xy", 100).unwrap();
        f.set_len(1000).unwrap();
        let x = [(10, 3), (100, 2)];
        let p = *blake3::hash(b"").as_bytes();
        let d = digest(&f, 1000, 0, &p, &x).unwrap();
        let mut h = digest_head(1000, 0, &p, &x);
        h.update(b"abcxy");
        assert_eq!(d, *h.finalize().as_bytes());
        // Size, offset, prefix and extent list each change it.
        assert_ne!(d, digest(&f, 1001, 0, &p, &x).unwrap());
        assert_ne!(d, digest(&f, 1000, 1, &p, &x).unwrap());
        assert_ne!(d, digest(&f, 1000, 0, &[1; 32], &x).unwrap());
        assert_ne!(d, digest(&f, 1000, 0, &p, &[(10, 3), (99, 3)]).unwrap());
        // Never a plain BLAKE3 of the file or of the data.
        assert_ne!(d, *blake3::hash(b"abcxy").as_bytes());
    }

    #[test]
    fn the_old_version_hole_budget_follows_the_data() {
        let mut b = HoleBudget::default();
        // A disk image a fiftieth full: its holes are within 64 per data byte.
        assert!(b.take(&[(0, 1 << 30)], 0, 50 << 30).is_ok());
        // A terabyte claim with one byte of data is not.
        assert!(b.take(&[(0, 1)], 0, 1 << 40).is_err());
        // The free part is one per session.
        assert!(b.take(&[(0, 1)], 0, OLD_HOLES_FREE).is_ok());
        assert!(b.take(&[(0, 1)], 0, 1 << 20).is_err());
    }
}
