//! `io_uring` rings: a kernel writer this library cannot see. A ring's reads complete in
//! the kernel, into whatever buffer the program names — a buffer it just sent included —
//! and a write-protected page fails such a read with `EFAULT` in its completion, which no
//! interposed call ever returns. So once a process has a ring, the library lets go of every
//! page a send still holds (each still-protected page gets its private copy first: the
//! program keeps its bytes, the kernel keeps sending the originals) and protects nothing
//! more: every later send that would have gone zero-copy is copied, counted as `io_uring`.
//!
//! A ring is found two ways:
//!
//! * **Its set-up call**, exactly, before the ring exists: liburing's
//!   `io_uring_queue_init`, `_params`, `_mem` and `io_uring_setup` when liburing is a shared
//!   library, and `syscall(SYS_io_uring_setup, …)` (the Rust `io-uring` crate's way)
//!   ([`zcnet_sys::preload::Hook::before_io_uring`]).
//! * **Its mapping** in `/proc/self/maps` (`anon_inode:[io_uring]`), for a ring made with
//!   the program's own system calls (liburing linked statically): looked for before the
//!   process's first protection, and again before a protection at most every
//!   [`LOOK_EVERY`]. A ring made that way after the last look, whose read targets a buffer
//!   sent before the next one, can still meet a protected page; so can one made with
//!   `IORING_SETUP_NO_MMAP` by the program's own system calls, which maps nothing here.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use zcnet_sys::board::{self, ring_found};

/// How often, at most, a process that protects pages looks for a ring's mapping (about
/// 20–120 µs per look, by the process's mappings).
pub const LOOK_EVERY: Duration = Duration::from_millis(20);

/// How a ring was found ([`ring_found`]); 0 for not yet.
static FOUND: AtomicU64 = AtomicU64::new(0);
static PAGES: AtomicU64 = AtomicU64::new(0);
static PROTECTED: AtomicU64 = AtomicU64::new(0);
/// System calls that failed while letting go (a page may then still be protected).
static ERRORS: AtomicU64 = AtomicU64::new(0);
/// When the mapping was last looked for, in ns since [`epoch`]; 0 for never.
static LAST_LOOK: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static E: OnceLock<Instant> = OnceLock::new();
    *E.get_or_init(Instant::now)
}

/// Whether this process has a ring (as far as the library found): nothing is protected.
pub fn found() -> bool {
    FOUND.load(Relaxed) != 0
}

/// The program is about to make a ring (a set-up call the library saw).
pub fn setup_call() {
    found_by(ring_found::SETUP_CALL);
}

/// Before a protection: whether the process has a ring, looking for its mapping if the
/// last look is older than [`LOOK_EVERY`] (or there was none).
pub fn present() -> bool {
    if found() {
        return true;
    }
    let now = (epoch().elapsed().as_nanos() as u64).max(1);
    let last = LAST_LOOK.load(Relaxed);
    if last != 0 && now.saturating_sub(last) < LOOK_EVERY.as_nanos() as u64 {
        return false;
    }
    LAST_LOOK.store(now, Relaxed);
    if mapped() {
        found_by(ring_found::MAPPING);
        return true;
    }
    false
}

/// Records the ring and lets go of every page a send still holds (once per process).
fn found_by(how: u64) {
    if FOUND.compare_exchange(0, how, Relaxed, Relaxed).is_err() {
        return;
    }
    let r = zcnet::cow::let_go_all();
    PAGES.fetch_add(r.pages, Relaxed);
    PROTECTED.fetch_add(r.protected, Relaxed);
    ERRORS.fetch_add(r.errors, Relaxed);
    crate::slot::add(board::ring(0), how);
    crate::slot::add(board::ring(1), r.pages);
    crate::slot::add(board::ring(2), r.protected);
    crate::slot::add(board::ring(3), r.errors);
}

/// In a forked child: the ring is the parent's too (its descriptor is inherited), so
/// nothing is protected here either; the pages let go of were the parent's.
pub fn after_fork_in_child() {
    PAGES.store(0, Relaxed);
    PROTECTED.store(0, Relaxed);
    ERRORS.store(0, Relaxed);
}

/// The stats line's `io_uring`: `null` if no ring was found.
pub fn report() -> serde_json::Value {
    match ring_found::name(FOUND.load(Relaxed)) {
        None => serde_json::Value::Null,
        Some(how) => serde_json::json!({
            "found": how,
            "pages": PAGES.load(Relaxed),
            "protected_pages": PROTECTED.load(Relaxed),
            "errors": ERRORS.load(Relaxed),
        }),
    }
}

/// Whether `/proc/self/maps` shows a ring's mapping (read with the library's own system
/// calls; `false` if it cannot be read).
fn mapped() -> bool {
    use rustix::fs::{Mode, OFlags};
    let Ok(fd) = rustix::fs::open(
        "/proc/self/maps",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return false;
    };
    let mut seen = Seen::default();
    let mut buf = [0u8; 8192];
    loop {
        match rustix::io::read(&fd, &mut buf) {
            Ok(0) | Err(_) => return false,
            Ok(n) => {
                if seen.feed(&buf[..n]) {
                    return true;
                }
            }
        }
    }
}

/// What a ring's mapping is named in `/proc/PID/maps`.
const NAME: &[u8] = b"[io_uring]";

/// A search for [`NAME`] across the chunks of a text read in pieces.
#[derive(Default)]
struct Seen {
    /// The last bytes of the previous chunk (a name may straddle two).
    tail: Vec<u8>,
}

impl Seen {
    fn feed(&mut self, chunk: &[u8]) -> bool {
        self.tail.extend_from_slice(chunk);
        if self.tail.windows(NAME.len()).any(|w| w == NAME) {
            return true;
        }
        let keep = NAME.len() - 1;
        let cut = self.tail.len().saturating_sub(keep);
        self.tail.drain(..cut);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_is_found_whole_or_split_across_chunks_and_nowhere_else() {
        let text = b"7f00-7f01 rw-s 00000000 00:0f 1234 anon_inode:[io_uring]\n";
        for cut in 0..text.len() {
            let mut s = Seen::default();
            let (a, b) = text.split_at(cut);
            assert!(s.feed(a) || s.feed(b), "cut at {cut}");
        }
        let other = b"7f00-7f01 rw-p 00000000 00:00 0 [heap]\n7f02-7f03 r--s 0 00:0f 9 anon_inode:[io_uringx\n";
        for cut in 0..other.len() {
            let mut s = Seen::default();
            let (a, b) = other.split_at(cut);
            assert!(!s.feed(a) && !s.feed(b), "cut at {cut}");
        }
    }

    #[cfg_attr(
        not(zcnet_has_io_uring),
        ignore = "needs io_uring (Linux 5.1, kernel.io_uring_disabled 0)"
    )]
    #[test]
    fn this_test_process_has_no_ring_until_it_makes_one() {
        // No other test of this crate makes one; one made here (by the `io-uring` crate's
        // own system calls, as a statically linked liburing would) shows.
        assert!(!mapped());
        let _ring = io_uring::IoUring::new(8)
            .expect("a ring (the build found io_uring allowed; a seccomp profile may refuse it)");
        assert!(mapped(), "a live ring's mapping is in /proc/self/maps");
    }
}
