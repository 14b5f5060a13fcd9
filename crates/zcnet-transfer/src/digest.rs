//! BLAKE3 of a file's first bytes, read from the page cache in cache-sized pieces.
//!
//! Why a 128 KiB buffer: `pread` into a buffer that stays in the core's L2 cache (512 KiB on
//! the EPYC we measure on) costs about 0.13 CPU-s/GiB; from 256 KiB up the copy spills and
//! costs 0.45–0.5, more than the hash itself (0.26–0.38 in memory). `io::copy`'s 8 KiB
//! buffer pays a syscall per 8 KiB instead (0.48–0.56 in all).
//!
//! Mapping the file instead of copying it does not pay, and not only because a file
//! truncated under a mapping raises `SIGBUS`: with 4 KiB pages, setting up and tearing down
//! the page-table entries costs more than the copy saves. On a 1 GiB tmpfs file, thread
//! CPU-s/GiB (`examples/hash_cost.rs`, median of 7): BLAKE3 alone 0.17 (its AVX-512 path;
//! 0.18 with 16 KiB updates), `pread` of 128 KiB or 2 MiB + hash 0.32–0.33, read-only
//! `MAP_SHARED` windows + hash 0.35–0.38 (512 KiB to 1 GiB windows, with or without
//! `MAP_POPULATE`). The measured mapping, with a `SIGBUS` handler that maps zeros over a
//! truncated page and fails the read, is in this crate's history (`zcnet-sys` `filemap`).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::time::Instant;

/// Read size for hashing (see the module docs).
pub const HASH_CHUNK: usize = 128 * 1024;

/// BLAKE3 of the first `len` bytes of `file`; `UnexpectedEof` if it is shorter.
pub fn hash_prefix(file: &File, len: u64) -> io::Result<[u8; 32]> {
    hash_prefix_until(file, len, None)
}

/// [`hash_prefix`], given up with `TimedOut` once `until` has passed ([`hash_range_until`]).
pub fn hash_prefix_until(file: &File, len: u64, until: Option<Instant>) -> io::Result<[u8; 32]> {
    Ok(*prefix_state_until(file, len, until)?.finalize().as_bytes())
}

/// The hash state after the first `len` bytes of `file`, to finalize now and go on from
/// later (a resumed file's kept prefix is then read once, not twice).
pub fn prefix_state(file: &File, len: u64) -> io::Result<blake3::Hasher> {
    prefix_state_until(file, len, None)
}

/// [`prefix_state`], given up with `TimedOut` once `until` has passed.
pub fn prefix_state_until(
    file: &File,
    len: u64,
    until: Option<Instant>,
) -> io::Result<blake3::Hasher> {
    let mut h = blake3::Hasher::new();
    hash_range_until(file, &mut h, 0, len, until)?;
    Ok(h)
}

/// Feeds bytes `from..to` of `file` into `h`; `UnexpectedEof` if the file ends first.
pub fn hash_range(file: &File, h: &mut blake3::Hasher, from: u64, to: u64) -> io::Result<()> {
    hash_range_until(file, h, from, to, None)
}

/// [`hash_range`] that looks at the clock between reads (one per [`HASH_CHUNK`], so a few
/// dozen microseconds apart) and fails with `TimedOut` once `until` has passed: hashing a
/// file the receiver found on its disk (for `--resume`) may take minutes for a large one,
/// and must not carry a session past its deadline.
pub fn hash_range_until(
    file: &File,
    h: &mut blake3::Hasher,
    from: u64,
    to: u64,
    until: Option<Instant>,
) -> io::Result<()> {
    let mut buf = vec![0u8; HASH_CHUNK];
    let (mut off, len) = (from, to);
    while off < len {
        if until.is_some_and(|t| Instant::now() >= t) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the deadline passed after {} of {} bytes",
                    off - from,
                    to - from
                ),
            ));
        }
        let want = (len - off).min(buf.len() as u64) as usize;
        let n = match file.read_at(&mut buf[..want], off) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file shrank while hashing",
                ))
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&buf[..n]);
        off += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn hashes_exactly_the_prefix_across_chunk_boundaries() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..(3 * HASH_CHUNK + 17))
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        f.write_all(&data).unwrap();
        for len in [
            0,
            1,
            HASH_CHUNK - 1,
            HASH_CHUNK,
            2 * HASH_CHUNK + 5,
            data.len(),
        ] {
            assert_eq!(
                hash_prefix(&f, len as u64).unwrap(),
                *blake3::hash(&data[..len]).as_bytes(),
                "len {len}"
            );
        }
        let err = hash_prefix(&f, data.len() as u64 + 1).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn hashing_stops_once_its_deadline_has_passed() {
        let f = tempfile::tempfile().unwrap();
        f.set_len(1 << 40).unwrap();
        let past = Instant::now();
        let err = hash_prefix_until(&f, 1 << 40, Some(past)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        // Well ahead of its deadline it hashes as ever.
        let later = Instant::now() + std::time::Duration::from_secs(3600);
        assert_eq!(
            hash_prefix_until(&f, 4096, Some(later)).unwrap(),
            *blake3::hash(&[0; 4096]).as_bytes()
        );
    }

    #[test]
    fn a_prefix_state_goes_on_to_the_whole_hash() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..(2 * HASH_CHUNK + 99))
            .map(|i| (i % 253) as u8)
            .collect();
        f.write_all(&data).unwrap();
        for cut in [0, 1, HASH_CHUNK + 3, data.len()] {
            let mut h = prefix_state(&f, cut as u64).unwrap();
            assert_eq!(
                *h.finalize().as_bytes(),
                *blake3::hash(&data[..cut]).as_bytes()
            );
            hash_range(&f, &mut h, cut as u64, data.len() as u64).unwrap();
            assert_eq!(*h.finalize().as_bytes(), *blake3::hash(&data).as_bytes());
        }
    }
}
