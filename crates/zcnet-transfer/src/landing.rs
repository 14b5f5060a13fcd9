//! BLAKE3 of a file computed while its bytes land, not in a second pass afterwards.
//!
//! The receiver splices each range of a large file from the socket into its partial file
//! (the kernel copies the bytes into the page cache once). Hashing the whole file after the
//! last byte reads every page back from memory a second time: for a file larger than the
//! last-level cache that is a cold pass over DRAM. [`LandingHash`] instead hashes each range
//! on a second thread right after it landed, while its pages are still in the shared L3
//! cache, so verification costs about BLAKE3's own work plus one copy out of L3, and no
//! extra trip to DRAM. The whole-transfer figures (`bench/transfer.sh`) are in the closing
//! notes of the session that built it.
//!
//! The hash covers the partial file's bytes as read back from the page cache, the same bytes
//! the final name will carry: the file is this session's own (created `O_EXCL`, mode 0600,
//! held under `flock`), so between a range's landing and the rename only a process of the
//! receiver's own user (or root) could change it — one that could as well change the final
//! file after the rename.

use super::digest::HASH_CHUNK;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::mpsc;
use std::thread::JoinHandle;

/// Bytes the receiver lands per step while hashing: small enough that a range is hashed
/// while it is still in the last-level cache, large enough that the per-call work
/// (`fstat`, `fcntl`, `fallocate`, a channel message) is noise.
pub const LAND_STEP: u64 = 2 << 20;

/// How far the landing thread got: the prefix of the file it has covered and the hash
/// state over it (over all of it, or over the parts of it inside `spans`).
struct Hashed {
    len: u64,
    hasher: blake3::Hasher,
    /// Only these ranges are hashed, ascending (a sparse file's extents, version 9); the
    /// holes between them are passed over, never read. `None`: every byte.
    spans: Option<Vec<(u64, u64)>>,
    /// The first of `spans` not yet hashed to its end.
    next: usize,
}

/// Hashes a file's prefix `0..end` on its own thread as [`LandingHash::landed`] reports
/// that `end` has arrived. Dropped without [`LandingHash::finish`], the thread stops at the
/// next range.
#[derive(Debug)]
pub struct LandingHash {
    tell: Option<mpsc::Sender<u64>>,
    worker: Option<JoinHandle<io::Result<HashedOut>>>,
}

/// The worker's result.
#[derive(Debug)]
struct HashedOut {
    len: u64,
    hash: [u8; 32],
}

impl LandingHash {
    /// Starts hashing `file` (read through its own duplicate descriptor) from byte 0.
    pub fn start(file: &File) -> io::Result<Self> {
        Self::resume(file, 0, blake3::Hasher::new())
    }

    /// Goes on from `hasher`, the state after the file's first `len` bytes (a resumed
    /// file's prefix, already hashed to offer it).
    pub fn resume(file: &File, len: u64, hasher: blake3::Hasher) -> io::Result<Self> {
        Self::run(file, len, hasher, None)
    }

    /// Hashes only the bytes of `spans` (ascending, from `from` on) into `hasher` as they
    /// land: a sparse file's extents (version 9), whose holes are never read. The work is
    /// the data's, whatever the file's length.
    pub fn spans(
        file: &File,
        from: u64,
        spans: Vec<(u64, u64)>,
        hasher: blake3::Hasher,
    ) -> io::Result<Self> {
        Self::run(file, from, hasher, Some(spans))
    }

    fn run(
        file: &File,
        len: u64,
        hasher: blake3::Hasher,
        spans: Option<Vec<(u64, u64)>>,
    ) -> io::Result<Self> {
        let file = file.try_clone()?;
        let (tell, told) = mpsc::channel::<u64>();
        let worker = std::thread::Builder::new()
            .name("zcnet-landing-hash".into())
            .spawn(move || {
                let mut state = Hashed {
                    len,
                    hasher,
                    spans,
                    next: 0,
                };
                let mut buf = vec![0u8; HASH_CHUNK];
                // Reports may queue up; each only moves the end further.
                while let Ok(end) = told.recv() {
                    catch_up(&file, &mut state, end, &mut buf)?;
                }
                Ok(HashedOut {
                    len: state.len,
                    hash: *state.hasher.finalize().as_bytes(),
                })
            })?;
        Ok(Self {
            tell: Some(tell),
            worker: Some(worker),
        })
    }

    /// Bytes `0..end` of the file are in place: hash up to there.
    pub fn landed(&self, end: u64) {
        if let Some(t) = &self.tell {
            // A closed channel means the worker failed; `finish` reports why.
            let _ = t.send(end);
        }
    }

    /// Waits for the hash of exactly the first `len` bytes. An error if the file turned
    /// out shorter, or reading it failed; the caller then has no landed hash to offer and
    /// must not treat the file as verified.
    pub fn finish(mut self, len: u64) -> io::Result<[u8; 32]> {
        self.landed(len);
        self.tell = None;
        let out = self
            .worker
            .take()
            .expect("worker present until finish")
            .join()
            .map_err(|_| io::Error::other("the hashing thread panicked"))??;
        if out.len != len {
            return Err(io::Error::other(format!(
                "hashed {} bytes as they landed, expected {len}",
                out.len
            )));
        }
        Ok(out.hash)
    }
}

impl Drop for LandingHash {
    fn drop(&mut self) {
        self.tell = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// Hashes `state.len..end` (nothing if `end` is not beyond what is hashed); with spans,
/// only their parts in that range.
fn catch_up(file: &File, state: &mut Hashed, end: u64, buf: &mut [u8]) -> io::Result<()> {
    if end <= state.len {
        return Ok(());
    }
    let Some(spans) = &state.spans else {
        let from = state.len;
        return read_into(file, &mut state.hasher, from, end, buf, &mut state.len);
    };
    while let Some(&(o, l)) = spans.get(state.next) {
        if o >= end {
            break;
        }
        let from = o.max(state.len);
        let to = (o + l).min(end);
        let mut at = from;
        read_into(file, &mut state.hasher, from, to, buf, &mut at)?;
        if to < o + l {
            break;
        }
        state.next += 1;
    }
    state.len = end;
    Ok(())
}

/// Feeds bytes `from..to` of `file` into `hasher`, keeping `at` where it got.
fn read_into(
    file: &File,
    hasher: &mut blake3::Hasher,
    from: u64,
    to: u64,
    buf: &mut [u8],
    at: &mut u64,
) -> io::Result<()> {
    *at = from;
    while *at < to {
        let want = (to - *at).min(buf.len() as u64) as usize;
        let n = match file.read_at(&mut buf[..want], *at) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the file ends at {at} bytes, {to} reported landed"),
                ))
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        *at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 131 % 251) as u8).collect()
    }

    #[test]
    fn ranges_reported_as_they_land_hash_like_the_whole_file() {
        let all = data(5 * HASH_CHUNK + 333);
        let f = tempfile::tempfile().unwrap();
        let h = LandingHash::start(&f).unwrap();
        // Uneven ranges, some reports repeated or going backwards (ignored).
        let mut off = 0;
        for step in [1, HASH_CHUNK - 1, 7, 3 * HASH_CHUNK, 0, 500, usize::MAX] {
            let end = off + step.min(all.len() - off);
            f.write_all_at(&all[off..end], off as u64).unwrap();
            h.landed(end as u64);
            h.landed(off as u64);
            off = end;
        }
        assert_eq!(off, all.len());
        assert_eq!(
            h.finish(all.len() as u64).unwrap(),
            *blake3::hash(&all).as_bytes()
        );
    }

    #[test]
    fn resumed_from_a_prefix_state_it_hashes_the_whole_file() {
        let all = data(3 * HASH_CHUNK + 5);
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(&all, 0).unwrap();
        let cut = HASH_CHUNK + 1;
        let h = LandingHash::resume(
            &f,
            cut as u64,
            crate::digest::prefix_state(&f, cut as u64).unwrap(),
        )
        .unwrap();
        h.landed(all.len() as u64);
        assert_eq!(
            h.finish(all.len() as u64).unwrap(),
            *blake3::hash(&all).as_bytes()
        );
    }

    #[test]
    fn spans_hash_their_bytes_only_as_they_land() {
        let f = tempfile::tempfile().unwrap();
        let x = vec![(100, 3), (5000, HASH_CHUNK as u64 + 7)];
        let d = data(HASH_CHUNK + 10);
        let h = LandingHash::spans(&f, 0, x.clone(), blake3::Hasher::new()).unwrap();
        f.write_all_at(&d[..3], 100).unwrap();
        h.landed(103);
        // Half of the second span, then the rest.
        f.write_all_at(&d[3..1000], 5000).unwrap();
        h.landed(5997);
        f.write_all_at(&d[1000..HASH_CHUNK + 10], 5997).unwrap();
        f.set_len(1 << 40).unwrap();
        // The terabyte of holes after the last span is never read.
        let got = h.finish(1 << 40).unwrap();
        assert_eq!(got, *blake3::hash(&d).as_bytes());
    }

    #[test]
    fn a_file_shorter_than_reported_is_an_error_not_a_hash() {
        let all = data(1000);
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(&all, 0).unwrap();
        let h = LandingHash::start(&f).unwrap();
        h.landed(1000);
        let err = h.finish(1001).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn finishing_short_of_what_landed_is_refused() {
        let all = data(4096);
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(&all, 0).unwrap();
        let h = LandingHash::start(&f).unwrap();
        h.landed(4096);
        // Asked for 100 bytes after 4096 were hashed: the prefix hash no longer exists.
        assert!(h.finish(100).is_err());
    }

    #[test]
    fn dropped_unfinished_stops_its_thread() {
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(&data(10), 0).unwrap();
        let h = LandingHash::start(&f).unwrap();
        h.landed(10);
        drop(h); // joins; a hang here would be the bug
    }
}
