//! The bench's file paths, a leaf: `--tx file` sends from a page-cache file with
//! `Sender::send_file` (`sendfile(2)`, as `iperf3 -Z` and netperf's `TCP_SENDFILE` do;
//! `--cold` drops the file's pages first, `posix_fadvise(POSIX_FADV_DONTNEED)`, so every
//! pass reads from the device), and `--rx file` splices what arrives into a file with
//! `Receiver::recv_to_file` (socket → pipe → page cache, splice(2)).
//!
//! Both files live in `--file-dir` (the temporary directory by default), unnamed
//! (`O_TMPFILE`, gone when the run ends), and are a fixed window of whole blocks reused as a
//! ring: a time-limited run at several GB/s would otherwise fill the directory — and on
//! tmpfs, memory. The window (64 MiB) is larger than any socket buffer, so the sender
//! never sends a page the kernel still holds from the previous pass. On tmpfs the page
//! cache is the file itself: `--cold` cannot drop it, and says so.

use super::spec::BenchError;
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use zcnet_sys::raw::splice::{fadvise, Advice};

/// The path name both directions use.
pub(crate) const FILE: &str = "file";

/// The copying way to send the same file: `pread` into a buffer, then `send`
/// (`Sender::send_file_with` in `FileTxMode::ReadSend`) — what `file` is measured against,
/// and what `auto` may choose for a caller's file where copying is cheaper.
pub(crate) const READ_SEND: &str = "read_send";

/// Whether a transmit path name sends from the page-cache file, and how.
pub(crate) fn file_tx_mode(name: &str) -> Option<zcnet::FileTxMode> {
    match name {
        FILE => Some(zcnet::FileTxMode::Sendfile),
        READ_SEND => Some(zcnet::FileTxMode::ReadSend),
        _ => None,
    }
}

/// Bytes of a file window (the send file's unless `--file-window` says otherwise: `iperf3
/// -Z` sends one block from offset 0 again and again, so the receiver copies from pages that
/// stay in the CPU's cache — a window that large never does).
const WINDOW: u64 = 64 << 20;

/// Where file paths keep their files, and whether sends start cold: set once from the
/// command line (the in-process server reads the same).
#[derive(Debug, Clone, Default)]
pub(crate) struct FileSetup {
    /// `--file-dir`; the temporary directory when unset.
    pub dir: Option<PathBuf>,
    /// `--cold`.
    pub cold: bool,
    /// `--file-window`: bytes of the send file (rounded up to whole blocks); 64 MiB if
    /// unset.
    pub window: Option<u64>,
}

static SETUP: OnceLock<FileSetup> = OnceLock::new();

/// Records the command line's choice (the first call wins).
pub(crate) fn set_up(s: FileSetup) {
    let _ = SETUP.set(s);
}

fn setup() -> FileSetup {
    SETUP.get().cloned().unwrap_or_default()
}

fn dir() -> PathBuf {
    setup().dir.unwrap_or_else(std::env::temp_dir)
}

fn window(block: u64) -> u64 {
    window_of(setup().window.unwrap_or(WINDOW), block)
}

/// `bytes` rounded up to whole `block`s, at least one.
fn window_of(bytes: u64, block: u64) -> u64 {
    let block = block.max(1);
    bytes.max(1).div_ceil(block) * block
}

/// A file to send from.
#[derive(Debug)]
pub(crate) struct SourceFile {
    pub file: File,
    pub len: u64,
    cold: bool,
}

impl SourceFile {
    /// A window of whole `block`s, written, synced (so its pages are clean and can be
    /// dropped) and, with `--cold`, dropped from the page cache.
    pub(crate) fn create(block: u64) -> Result<SourceFile, BenchError> {
        use std::io::Write as _;
        let d = dir();
        let mut file = tempfile::tempfile_in(&d).map_err(|e| {
            BenchError::io_owned(format!("creating a send file in {}", d.display()), e)
        })?;
        let len = window(block);
        let chunk: Vec<u8> = (0..1u64 << 20).map(|i| (i % 251) as u8).collect();
        let mut left = len;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            file.write_all(&chunk[..n])
                .map_err(|e| BenchError::io("writing the send file", e))?;
            left -= n as u64;
        }
        file.sync_data()
            .map_err(|e| BenchError::io("fdatasync (send file)", e))?;
        let s = SourceFile {
            file,
            len,
            cold: setup().cold,
        };
        s.drop_cache_if_cold()?;
        Ok(s)
    }

    fn drop_cache_if_cold(&self) -> Result<(), BenchError> {
        if self.cold {
            fadvise(self.file.as_fd(), 0, 0, Advice::DontNeed)
                .map_err(|e| BenchError::io("posix_fadvise(DONTNEED)", e))?;
        }
        Ok(())
    }
}

/// The send file for blocks of `block` bytes, written on first use and kept for the
/// process's later runs (64 MiB written and synced takes longer than a short run; it is
/// made before the run's clock starts). With `--cold` its pages are dropped again here, so
/// every run starts cold.
pub(crate) fn source(block: u64) -> Result<Arc<SourceFile>, BenchError> {
    static CACHE: OnceLock<Mutex<HashMap<u64, Arc<SourceFile>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut m = cache.lock().unwrap_or_else(|e| e.into_inner());
    let s = match m.get(&block) {
        Some(s) => s.clone(),
        None => {
            let s = Arc::new(SourceFile::create(block)?);
            m.insert(block, s.clone());
            s
        }
    };
    s.drop_cache_if_cold()?;
    Ok(s)
}

/// One sender's position in a [`SourceFile`].
#[derive(Debug, Default)]
pub(crate) struct Cursor {
    offset: u64,
}

impl Cursor {
    /// Where the next `n` bytes start; at the end of the window, back to its start (and,
    /// cold, its pages dropped again first).
    pub(crate) fn next(&mut self, src: &SourceFile, n: u64) -> Result<u64, BenchError> {
        if self.offset + n > src.len {
            self.offset = 0;
            src.drop_cache_if_cold()?;
        }
        let at = self.offset;
        self.offset += n;
        Ok(at)
    }
}

/// A file to receive into: one window, written over and over.
#[derive(Debug)]
pub(crate) struct SinkFile {
    pub file: File,
    len: u64,
    offset: u64,
}

impl SinkFile {
    pub(crate) fn create(block: u64) -> Result<SinkFile, BenchError> {
        let d = dir();
        let file = tempfile::tempfile_in(&d).map_err(|e| {
            BenchError::io_owned(format!("creating a receive file in {}", d.display()), e)
        })?;
        Ok(SinkFile {
            file,
            len: window_of(WINDOW, block),
            offset: 0,
        })
    }

    /// Where the next `n` bytes go.
    pub(crate) fn next(&mut self, n: u64) -> u64 {
        if self.offset + n > self.len {
            self.offset = 0;
        }
        let at = self.offset;
        self.offset += n;
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_whole_blocks_and_cursors_wrap_inside_them() {
        assert_eq!(window(64 << 10), 64 << 20);
        assert_eq!(window(3 << 20) % (3 << 20), 0);
        assert!(window(3 << 20) >= 64 << 20);
        // `--file-window 1`: one block, iperf3 -Z's loop; never less than a block.
        assert_eq!(window_of(1, 1 << 20), 1 << 20);
        assert_eq!(window_of(3 << 20, 2 << 20), 4 << 20);
        let src = SourceFile::create(16 << 20).unwrap();
        assert_eq!(src.file.metadata().unwrap().len(), src.len);
        let mut c = Cursor::default();
        let offs: Vec<u64> = (0..5).map(|_| c.next(&src, 16 << 20).unwrap()).collect();
        assert_eq!(offs, [0, 16 << 20, 32 << 20, 48 << 20, 0]);
        let mut sink = SinkFile::create(48 << 20).unwrap();
        assert_eq!(
            [sink.next(48 << 20), sink.next(48 << 20), sink.next(1)],
            [0, 48 << 20, 0]
        );
    }
}
