//! This process's slot on the board of the `zcnet run` that started it (`ZCNET_BOARD`,
//! [`zcnet_sys::board`]): the process's counters, in memory `zcnet run` reads once the
//! process is gone — however it ended: a signal, `_exit`, `exec` — and why the library
//! went passive here, if it did. Opened at load; after that, no system call: a forked
//! child takes the slot its parent reserved for it before the fork, and the parent names
//! the child's pid in it when `fork` returns.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;
use zcnet_sys::board::{passive, state, word, Board, Slot};

static BOARD: OnceLock<Option<Board>> = OnceLock::new();
/// The slot's index on the board; 0 for none.
static INDEX: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The slot this thread reserved for the child of the `fork` it is making.
    static FOR_CHILD: Cell<usize> = const { Cell::new(0) };
}

fn board() -> Option<&'static Board> {
    BOARD.get()?.as_ref()
}

fn current() -> Option<Slot> {
    board()?.slot(INDEX.load(Relaxed))
}

/// At load: maps the board named by `ZCNET_BOARD` (if any) and claims a slot — which also
/// tells `zcnet run` that the loader did preload the library into this program. True
/// when the process has a slot.
pub fn load() -> bool {
    let b = BOARD.get_or_init(|| {
        let path = std::env::var_os("ZCNET_BOARD").filter(|p| !p.is_empty())?;
        Board::open(std::path::Path::new(&path)).ok()
    });
    if let Some(b) = b {
        if let Some(i) = b.reserve() {
            if let Some(s) = b.slot(i) {
                s.claim(std::process::id());
                INDEX.store(i, Relaxed);
            }
        }
    }
    INDEX.load(Relaxed) != 0
}

/// Adds `n` to word `w` of this process's slot.
pub fn add(w: usize, n: u64) {
    if let Some(s) = current() {
        s.add(w, n);
    }
}

/// The library went passive in this process, for `why` ([`passive`]).
pub fn went_passive(why: u64) {
    if let Some(s) = current() {
        s.put(word::PASSIVE, why);
    }
}

/// A seccomp filter was in force at load.
pub fn filtered_at_load() {
    went_passive(passive::FILTER_AT_LOAD);
}

/// The program installs a seccomp filter.
pub fn filter_installed() {
    went_passive(passive::FILTER_INSTALLED);
}

/// The library wrote this process's stats line itself (normal exit).
pub fn written() {
    if let Some(s) = current() {
        s.set(word::STATE, state::WRITTEN);
    }
}

/// The image is about to be replaced (`exec`): its counters are final. False without a
/// slot.
pub fn execed() -> bool {
    current()
        .inspect(|s| s.set(word::STATE, state::EXECED))
        .is_some()
}

/// The `exec` failed: the image goes on.
pub fn exec_failed() {
    if let Some(s) = current() {
        s.clear(word::STATE, state::EXECED);
    }
}

/// Before `fork`: reserves the child's slot.
pub fn before_fork() {
    let i = board().and_then(Board::reserve).unwrap_or(0);
    FOR_CHILD.with(|c| c.set(i));
}

/// After `fork` returned `pid`: the child takes its slot, the parent names the child in it.
pub fn after_fork(pid: i32) {
    let i = FOR_CHILD.with(|c| c.replace(0));
    if pid == 0 {
        INDEX.store(i, Relaxed);
    } else if let (Ok(pid), Some(s)) = (u32::try_from(pid), board().and_then(|b| b.slot(i))) {
        s.claim(pid);
    }
}
