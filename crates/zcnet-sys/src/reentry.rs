//! Which threads are running zcnet's own code right now, so that the C calls that code makes
//! reach the C library directly even where an `LD_PRELOAD` interposer (feature `preload`)
//! defines the same symbols.
//!
//! An interposed `pread` that itself takes the write-protect engine's lock deadlocks a
//! thread that already holds it: the engine's fault handler reads `/proc/self/pagemap`
//! under its lock, and the Rust standard library reaches the C library's `pread` for that.
//! The flag is per thread (a `const` thread-local without a destructor, read in a signal
//! handler too): the interposer's own calls set it for their duration, the engine's
//! handler thread for its whole life.

use std::cell::Cell;

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Held while this thread runs zcnet's own code; dropped, the thread is the program's again.
#[derive(Debug)]
pub struct Inside(());

impl Inside {
    /// Marks this thread as inside, unless it already was (`None`: an outer holder exists,
    /// and this call is a re-entry that must go straight to the C library).
    pub fn enter() -> Option<Inside> {
        // Built only for the outermost entry: an `Inside` built and discarded would clear
        // the flag in its drop (and a re-entry would then pass for an outermost call).
        if INSIDE.with(|h| h.replace(true)) {
            None
        } else {
            Some(Inside(()))
        }
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.with(|h| h.set(false));
    }
}

/// Marks this thread as zcnet's own for the rest of its life (a thread zcnet started: every
/// C call it makes is the library's, never the program's).
pub fn own_thread() {
    INSIDE.with(|h| h.set(true));
}

/// Whether this thread is inside zcnet's own code.
pub fn inside() -> bool {
    INSIDE.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_outermost_entry_holds_and_an_own_thread_stays_inside() {
        assert!(!inside());
        let outer = Inside::enter().expect("first entry");
        assert!(Inside::enter().is_none(), "a re-entry");
        assert!(inside());
        drop(outer);
        assert!(!inside());
        std::thread::spawn(|| {
            own_thread();
            assert!(Inside::enter().is_none());
            assert!(inside());
        })
        .join()
        .unwrap();
    }
}
