//! The board: one small file that every process of one `zcnet run` maps shared, so that
//! what the preload library counted survives however a process ends — a signal, `_exit`,
//! `exec` — and `zcnet run`, which stays the parent, can write the stats line for it.
//!
//! Slot 0 is the header (a magic word, the next free slot, the claims refused for want of
//! room); each process that loads the library claims one slot for its life (a forked child
//! claims its own). A slot is [`SLOT_WORDS`] atomic words: its [`word`]s, then the counters
//! named by [`COUNTERS`], [`REASONS`] and [`UDP`] in that order. The file is opened and
//! mapped once, at load, before the program's `main`: after that the board costs no
//! system call, so a process under a seccomp filter still reports through it.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Words per slot.
pub const SLOT_WORDS: usize = 64;
/// Slots in a board (the header's included): one `zcnet run` may see this many processes
/// load the library, less one.
pub const SLOTS: usize = 4096;
const MAGIC: u64 = u64::from_le_bytes(*b"zcnetbd1");

/// The named words of a slot.
pub mod word {
    /// [`super::state`] bits.
    pub const STATE: usize = 0;
    /// The process id.
    pub const PID: usize = 1;
    /// Why the library went passive in this process ([`super::passive`]), 0 if it did not.
    pub const PASSIVE: usize = 2;
    /// The first counter.
    pub const COUNTERS: usize = 8;
}

/// Bits of [`word::STATE`].
pub mod state {
    /// The slot belongs to a process (the library loaded into it).
    pub const CLAIMED: u64 = 1;
    /// The library wrote the process's stats line itself, at normal exit.
    pub const WRITTEN: u64 = 2;
    /// The image was replaced by `exec` (a new slot follows for the same pid).
    pub const EXECED: u64 = 4;
}

/// Values of [`word::PASSIVE`].
pub mod passive {
    /// A seccomp filter was in force when the library loaded (`/proc/self/status`).
    pub const FILTER_AT_LOAD: u64 = 1;
    /// The program installed a seccomp filter (`prctl`, `seccomp`).
    pub const FILTER_INSTALLED: u64 = 2;

    /// The name in the stats line.
    pub fn name(v: u64) -> Option<&'static str> {
        match v {
            FILTER_AT_LOAD => Some("seccomp_filter_at_load"),
            FILTER_INSTALLED => Some("seccomp_filter_installed"),
            _ => None,
        }
    }
}

/// The per-process totals, from [`word::COUNTERS`] on.
pub const COUNTERS: [&str; 8] = [
    "calls",
    "bytes_copy",
    "bytes_zerocopy",
    "copied_anyway",
    "zerocopy_calls",
    "protection_faults",
    "pages_protected",
    "kernel_write_detours",
];

/// Fallback reasons: after [`COUNTERS`], calls for each, then (at [`REASONS_MAX`] further
/// on) bytes for each.
pub const REASONS: [&str; 14] = [
    "too_small",
    "unaligned",
    "protect_costlier",
    "demoted_copied",
    "unsupported",
    "unprotectable",
    "forked",
    "app_errqueue",
    "flags",
    "enobufs",
    "rewritten_in_flight",
    "local_delivery",
    "route_copies",
    "io_uring",
];

/// Room for reasons in a slot.
pub const REASONS_MAX: usize = 16;

/// Word of the calls that fell back for reason `i`.
pub const fn fallback_calls(i: usize) -> usize {
    word::COUNTERS + COUNTERS.len() + i
}

/// Word of the bytes that fell back for reason `i`.
pub const fn fallback_bytes(i: usize) -> usize {
    fallback_calls(i) + REASONS_MAX
}

/// `sendmmsg` counters, after the fallbacks.
pub const UDP: [&str; 6] = [
    "calls",
    "gso_sends",
    "gso_datagrams",
    "gso_bytes",
    "forwarded_datagrams",
    "gso_refused",
];

/// Word of `sendmmsg` counter `i`.
pub const fn udp(i: usize) -> usize {
    fallback_bytes(REASONS_MAX) + i
}

/// Memory given back while zero-copy sends still held some of its pages (the stats line's
/// `freed_in_flight`), after the `sendmmsg` counters; `errors` are system calls that failed
/// while letting go (a page may then still be protected).
pub const FREED: [&str; 4] = ["calls", "pages", "protected_pages", "errors"];

/// Word of give-back counter `i`.
pub const fn freed(i: usize) -> usize {
    udp(UDP.len()) + i
}

/// An `io_uring` ring in the process (the stats line's `io_uring`), after the give-back
/// counters: how it was found ([`ring_found`]), and the pages a send still held then, which
/// were let go of at once, and the system calls that failed meanwhile (`errors`).
pub const RING: [&str; 4] = ["found", "pages", "protected_pages", "errors"];

/// Word of ring counter `i`.
pub const fn ring(i: usize) -> usize {
    freed(FREED.len()) + i
}

/// How a ring was found (the value of [`RING`]'s `found`).
pub mod ring_found {
    /// A set-up call the library saw: liburing's `io_uring_queue_init*` or
    /// `syscall(SYS_io_uring_setup)`.
    pub const SETUP_CALL: u64 = 1;
    /// A ring's mapping in `/proc/self/maps` (made with the program's own system calls).
    pub const MAPPING: u64 = 2;

    /// The name of `v`, if it is one.
    pub fn name(v: u64) -> Option<&'static str> {
        match v {
            SETUP_CALL => Some("setup_call"),
            MAPPING => Some("mapping"),
            _ => None,
        }
    }
}

const _: () = assert!(ring(RING.len()) <= SLOT_WORDS && REASONS.len() <= REASONS_MAX);

/// A board, mapped shared for the life of the process.
#[derive(Debug)]
pub struct Board {
    words: &'static [AtomicU64],
}

impl Board {
    /// Creates the board file at `path` (which must not exist) and maps it: `zcnet run`.
    pub fn create(path: &Path) -> io::Result<Board> {
        let f = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        f.set_len((SLOTS * SLOT_WORDS * 8) as u64)?;
        let b = Board::map(&f)?;
        b.words[0].store(MAGIC, Relaxed);
        b.words[1].store(1, Relaxed);
        Ok(b)
    }

    /// Maps the board at `path` that `zcnet run` made: the library, at load. Its own
    /// system calls (rustix's, never the C library's, which an interposer may define).
    pub fn open(path: &Path) -> io::Result<Board> {
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::open(path, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())?;
        let st = rustix::fs::fstat(&fd)?;
        if st.st_size < (SLOTS * SLOT_WORDS * 8) as i64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "board too small",
            ));
        }
        let b = Board::map(&fd)?;
        if b.words[0].load(Relaxed) != MAGIC {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "not a board"));
        }
        Ok(b)
    }

    fn map(fd: impl AsFd) -> io::Result<Board> {
        let len = SLOTS * SLOT_WORDS * 8;
        use rustix::mm::{MapFlags, ProtFlags};
        // SAFETY: a new shared mapping of `len` bytes of a file at least that long, at an
        // address the kernel picks; it is never unmapped (leaked for the life of the
        // process), so the `'static` slice below stays valid. Every access is atomic:
        // other processes write the same words concurrently.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )?
        };
        // SAFETY: `p` is page-aligned (so aligned for u64), `len` bytes long, zero-filled
        // or written only with atomics, and lives for ever (see above).
        let words = unsafe { std::slice::from_raw_parts(p.cast::<AtomicU64>(), len / 8) };
        Ok(Board { words })
    }

    /// Reserves a free slot (not claimed yet: [`Slot::claim`]); `None` when the board is
    /// full (counted in the header).
    pub fn reserve(&self) -> Option<usize> {
        let i = self.words[1].fetch_add(1, Relaxed) as usize;
        if i >= SLOTS {
            self.words[2].fetch_add(1, Relaxed);
            return None;
        }
        Some(i)
    }

    /// Slot `i` (from [`Board::reserve`]).
    pub fn slot(&self, i: usize) -> Option<Slot> {
        (1..SLOTS)
            .contains(&i)
            .then(|| Slot(&self.words[i * SLOT_WORDS..(i + 1) * SLOT_WORDS]))
    }

    /// Reserves and claims a slot for process `pid`.
    pub fn claim(&self, pid: u32) -> Option<Slot> {
        let s = self.slot(self.reserve()?)?;
        s.claim(pid);
        Some(s)
    }

    /// Every claimed slot, in the order claimed.
    pub fn slots(&self) -> impl Iterator<Item = Slot> + '_ {
        let n = (self.words[1].load(Relaxed) as usize).min(SLOTS);
        (1..n)
            .map(|i| Slot(&self.words[i * SLOT_WORDS..(i + 1) * SLOT_WORDS]))
            .filter(|s| s.get(word::STATE) & state::CLAIMED != 0)
    }

    /// Processes that found the board full.
    pub fn refused(&self) -> u64 {
        self.words[2].load(Relaxed)
    }
}

/// One process's slot.
#[derive(Debug, Clone, Copy)]
pub struct Slot(&'static [AtomicU64]);

impl Slot {
    /// Gives the slot to process `pid`.
    pub fn claim(&self, pid: u32) {
        self.put(word::PID, u64::from(pid));
        self.set(word::STATE, state::CLAIMED);
    }

    /// Adds `n` to word `w`.
    pub fn add(&self, w: usize, n: u64) {
        if let Some(x) = self.0.get(w) {
            x.fetch_add(n, Relaxed);
        }
    }

    /// Sets bits `b` in word `w`.
    pub fn set(&self, w: usize, b: u64) {
        if let Some(x) = self.0.get(w) {
            x.fetch_or(b, Relaxed);
        }
    }

    /// Clears bits `b` in word `w`.
    pub fn clear(&self, w: usize, b: u64) {
        if let Some(x) = self.0.get(w) {
            x.fetch_and(!b, Relaxed);
        }
    }

    /// Stores `v` in word `w`.
    pub fn put(&self, w: usize, v: u64) {
        if let Some(x) = self.0.get(w) {
            x.store(v, Relaxed);
        }
    }

    /// Word `w`.
    pub fn get(&self, w: usize) -> u64 {
        self.0.get(w).map_or(0, |x| x.load(Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_claimed_in_one_mapping_is_seen_in_another() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("board");
        let a = Board::create(&p).unwrap();
        let b = Board::open(&p).unwrap();
        let s = b.claim(42).unwrap();
        s.add(word::COUNTERS, 7);
        s.set(word::STATE, state::WRITTEN);
        let seen: Vec<Slot> = a.slots().collect();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].get(word::PID), 42);
        assert_eq!(seen[0].get(word::COUNTERS), 7);
        assert_eq!(seen[0].get(word::STATE), state::CLAIMED | state::WRITTEN);
        assert!(Board::create(&p).is_err(), "never over an existing file");
        std::fs::write(dir.path().join("junk"), vec![0u8; SLOTS * SLOT_WORDS * 8]).unwrap();
        assert!(Board::open(&dir.path().join("junk")).is_err());
    }
}
