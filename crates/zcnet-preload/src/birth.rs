//! Which descriptors this process opened since its last `fork` — the only ones no other
//! process can hold. A socket open in two processes has one error queue: `MSG_ZEROCOPY`
//! completions of one process's sends would show as `POLLERR` in the other (which cannot
//! tell them from a real error without reading them, and must not read them: they end the
//! first process's protections). So a socket that may be shared never sends zero-copy.
//!
//! Every `socket` and `accept` this library sees records the fork generation it happened
//! in; a duplicate takes its original's. A descriptor whose birth is unknown — opened
//! before this library was loaded (inherited through `exec`), or by a call it cannot see —
//! counts as shared.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

const SLOTS: usize = 1 << 16;

/// Per descriptor: 1 + the generation it was opened in; 0 for unknown.
static BIRTH: [AtomicU32; SLOTS] = [const { AtomicU32::new(0) }; SLOTS];

/// Forks this process has gone through (as parent or as child).
static GENERATION: AtomicU32 = AtomicU32::new(0);

fn slot(fd: i32) -> Option<&'static AtomicU32> {
    usize::try_from(fd).ok().and_then(|i| BIRTH.get(i))
}

/// `fd` was opened now (`socket`, `accept`).
pub fn opened(fd: i32) {
    if let Some(s) = slot(fd) {
        s.store(GENERATION.load(Relaxed) + 1, Relaxed);
    }
}

/// `new` duplicates `old`: it is as shared as `old`.
pub fn duplicated(old: i32, new: i32) {
    let b = slot(old).map_or(0, |s| s.load(Relaxed));
    if let Some(s) = slot(new) {
        s.store(b, Relaxed);
    }
}

/// `fd` was closed: a later descriptor of this number is unknown until seen opened.
pub fn closed(fd: i32) {
    if let Some(s) = slot(fd) {
        s.store(0, Relaxed);
    }
}

/// A fork happened (called in both processes): every descriptor open now is shared.
pub fn forked() {
    GENERATION.fetch_add(1, Relaxed);
}

/// Whether `fd` may be open in another process too.
pub fn may_be_shared(fd: i32) -> bool {
    let b = slot(fd).map_or(0, |s| s.load(Relaxed));
    b == 0 || b - 1 != GENERATION.load(Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the generation is process-wide.
    #[test]
    fn descriptors_opened_before_a_fork_or_of_unknown_birth_are_shared() {
        let (a, b, c) = (60_001, 60_002, 60_003);
        assert!(may_be_shared(a), "unknown birth");
        opened(a);
        assert!(!may_be_shared(a));
        duplicated(a, b);
        assert!(!may_be_shared(b), "a duplicate of a private descriptor");
        duplicated(60_004, c);
        assert!(may_be_shared(c), "a duplicate of an unknown one");
        forked();
        assert!(may_be_shared(a) && may_be_shared(b), "open across the fork");
        opened(c);
        assert!(!may_be_shared(c), "opened after the fork");
        closed(c);
        assert!(may_be_shared(c));
        assert!(may_be_shared(-1) && may_be_shared(1 << 20));
    }
}
