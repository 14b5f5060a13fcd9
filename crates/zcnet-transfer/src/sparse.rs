//! Sparse files: the sender finds a file's data with `lseek(SEEK_DATA/SEEK_HOLE)`
//! (lseek(2)) and sends only those extents (`StartSparse`, version 4); the receiver writes
//! each at its offset and leaves the holes unwritten, so the file stays sparse where the
//! receiving file system keeps holes (ext4, xfs, btrfs, tmpfs do). The hash still covers
//! the whole file, holes read as zeros.

use super::wire::{WireError, MAX_EXTENTS};
use rustix::fs::SeekFrom;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;

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
}
