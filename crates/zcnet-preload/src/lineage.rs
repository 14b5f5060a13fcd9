//! A process named so that a reused pid cannot pass for it: its pid and its start time
//! (`starttime`, field 22 of `/proc/PID/stat`, proc(5)) — the pair is unique for the
//! kernel's uptime. A forked child holds the completions of its parent's sends to be the
//! parent's to read only while that very process lives; once it has exited, its pid may
//! name an unrelated process at once.
//!
//! The parent reads its own start time before it forks; the child inherits the value as
//! its parent's and reads nothing in between (no file access between `fork` and what the
//! child does next). If the parent had already exited when the child asks `getppid`, the
//! pid is the reaper's, whose start time differs: gone, as it should be.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// This process's start time, read before its first fork (0: not read yet, or inherited
/// and reset in a child).
static SELF_START: AtomicU64 = AtomicU64::new(0);

/// A process: pid and start time (clock ticks after boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Process {
    /// Its pid.
    pub pid: u32,
    /// Its start time; `None` if it could not be read (then only the pid is checked).
    pub start: Option<u64>,
}

impl Process {
    /// Whether this very process still runs. A zombie counts as gone: it has exited, and
    /// nothing of it reads completions any more.
    pub fn alive(&self) -> bool {
        match (self.start, stat(self.pid)) {
            (_, None) => false,
            (_, Some((state, _))) if state == 'Z' || state == 'X' => false,
            (Some(want), Some((_, got))) => want == got,
            (None, Some(_)) => true,
        }
    }
}

/// The state letter and start time in `/proc/<pid>/stat`.
fn stat(pid: u32) -> Option<(char, u64)> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// State (field 3) and start time (field 22) of a `stat` line; the command name (field
/// 2) is in parentheses and may itself hold spaces and parentheses, so fields are counted
/// from the last `)`.
pub fn parse_stat(line: &str) -> Option<(char, u64)> {
    let rest = &line[line.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let start = f.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// Before `fork`: remember this process's start time (read once) for the child.
pub fn before_fork() {
    if SELF_START.load(Relaxed) == 0 {
        if let Some((_, s)) = stat(std::process::id()) {
            SELF_START.store(s, Relaxed);
        }
    }
}

/// In the child after `fork`: its parent, named by the start time inherited from it.
pub fn parent_after_fork() -> Process {
    let start = SELF_START.swap(0, Relaxed);
    Process {
        pid: std::os::unix::process::parent_id(),
        start: (start != 0).then_some(start),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let line = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 \
                    1000 10 18446744073709551615";
        assert_eq!(parse_stat(line), Some(('S', 987654)));
        assert_eq!(parse_stat("4242 (x) S 1"), None, "too short");
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_live_process_is_alive_and_a_reused_pid_or_a_dead_one_is_not() {
        let me = std::process::id();
        let (_, start) = stat(me).expect("own stat");
        let same = Process {
            pid: me,
            start: Some(start),
        };
        assert!(same.alive());
        let other_start = Process {
            pid: me,
            start: Some(start + 1),
        };
        assert!(
            !other_start.alive(),
            "same pid, another start: a reused pid"
        );
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        let (_, cstart) = stat(pid).expect("child stat");
        child.wait().expect("wait");
        let gone = Process {
            pid,
            start: Some(cstart),
        };
        assert!(!gone.alive(), "an exited and reaped process");
    }

    #[test]
    fn the_child_inherits_the_parents_start_time_once() {
        before_fork();
        let (_, mine) = stat(std::process::id()).expect("own stat");
        assert_eq!(SELF_START.load(Relaxed), mine);
        let p = parent_after_fork();
        assert_eq!(p.start, Some(mine));
        assert_eq!(
            SELF_START.load(Relaxed),
            0,
            "reset: a child's own start differs"
        );
    }
}
