//! What `zcnet run` reads from its board ([`zcnet_sys::board`]) once the program is gone:
//! a stats line for every process that could not write its own — ended by a signal, by
//! `_exit` or by `exec` (no exit handler ran), or passive under a seccomp filter — and
//! whether the library loaded into the program at all.

use serde_json::{json, Map, Value};
use std::io::Write;
use std::path::Path;
use std::process::ExitStatus;
use zcnet_sys::board::{self, passive, state, word, Board, Slot};

/// The board as the program left it.
#[derive(Debug, Default)]
pub struct BoardReport {
    /// Lines for the processes that wrote none.
    pub lines: Vec<Value>,
    /// Processes where the library went passive: pid and why.
    pub passive: Vec<(u64, &'static str)>,
    /// The library loaded into the program's own process (it claimed a slot).
    pub loaded: bool,
    /// Processes that found the board full.
    pub refused: u64,
}

fn counters(s: &Slot) -> Value {
    let mut t = Map::new();
    for (i, name) in board::COUNTERS.iter().enumerate() {
        t.insert((*name).into(), s.get(word::COUNTERS + i).into());
    }
    let (mut calls, mut bytes) = (Map::new(), Map::new());
    for (i, name) in board::REASONS.iter().enumerate() {
        let c = s.get(board::fallback_calls(i));
        if c > 0 {
            calls.insert((*name).into(), c.into());
            bytes.insert((*name).into(), s.get(board::fallback_bytes(i)).into());
        }
    }
    t.insert("fallback_calls".into(), calls.into());
    t.insert("fallback_bytes".into(), bytes.into());
    t.into()
}

fn udp(s: &Slot) -> Value {
    let mut u = Map::new();
    for (i, name) in board::UDP.iter().enumerate() {
        u.insert((*name).into(), s.get(board::udp(i)).into());
    }
    u.into()
}

fn freed(s: &Slot) -> Value {
    let mut f = Map::new();
    for (i, name) in board::FREED.iter().enumerate() {
        f.insert((*name).into(), s.get(board::freed(i)).into());
    }
    f.into()
}

/// The stats line's `io_uring`: `null` if the process made no ring.
fn ring(s: &Slot) -> Value {
    match board::ring_found::name(s.get(board::ring(0))) {
        None => Value::Null,
        Some(how) => json!({
            "found": how,
            "pages": s.get(board::ring(1)),
            "protected_pages": s.get(board::ring(2)),
            "errors": s.get(board::ring(3)),
        }),
    }
}

/// How the program's own process ended, in words.
fn ending(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.signal(), status.code()) {
        (Some(sig), _) => format!("signal {sig}"),
        (None, Some(c)) => format!("exit {c} without exit handlers (_exit)"),
        _ => "unknown".into(),
    }
}

impl BoardReport {
    /// Reads `board` after the program (`pid`, ended with `status`, run with `tx`).
    pub fn read(board: &Board, tx: &str, pid: i32, status: &ExitStatus) -> BoardReport {
        let mut r = BoardReport {
            refused: board.refused(),
            ..BoardReport::default()
        };
        for s in board.slots() {
            let p = s.get(word::PID);
            let st = s.get(word::STATE);
            let why = passive::name(s.get(word::PASSIVE));
            if p == pid as u64 {
                r.loaded = true;
            }
            if let Some(w) = why {
                r.passive.push((p, w));
            }
            let sent = s.get(word::COUNTERS) > 0 || s.get(board::udp(0)) > 0 || why.is_some();
            if st & state::WRITTEN != 0 || !sent {
                continue;
            }
            let ended = if st & state::EXECED != 0 {
                "exec".to_string()
            } else if p == pid as u64 {
                ending(status)
            } else {
                "without exit handlers (a signal or _exit)".to_string()
            };
            r.lines.push(json!({
                "pid": p,
                "tx": tx,
                "written_by": "zcnet run",
                "ended": ended,
                "passive": why,
                "total": counters(&s),
                "udp_sendmmsg": udp(&s),
                "freed_in_flight": freed(&s),
                "io_uring": ring(&s),
            }));
        }
        r
    }

    /// Appends the lines to the stats file at `path`.
    pub fn append(&self, path: &Path) -> std::io::Result<()> {
        if self.lines.is_empty() {
            return Ok(());
        }
        let mut text = String::new();
        for l in &self.lines {
            text.push_str(&l.to_string());
            text.push('\n');
        }
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?
            .write_all(text.as_bytes())
    }

    /// What `zcnet run` says about the run: passive processes, coverage that differs from
    /// what it predicted, a full board.
    /// `not_covered`: `zcnet run` said before the start that the library would not load.
    /// `noted`: a note said before the start that the program is covered although it is
    /// setuid, setgid or has file capabilities (confirmed or corrected here).
    pub fn messages(&self, program: &str, not_covered: bool, noted: bool) -> Vec<String> {
        let mut m = Vec::new();
        if !self.passive.is_empty() {
            let list: Vec<String> = self
                .passive
                .iter()
                .map(|(p, w)| format!("pid {p}: {w}"))
                .collect();
            m.push(format!(
                "the library stepped aside in {} process(es) under a seccomp filter ({}): \
                 their calls went to the C library unchanged",
                self.passive.len(),
                list.join(", ")
            ));
        }
        match (not_covered, self.loaded) {
            (true, true) => m.push(format!(
                "{program} was covered after all: the loader preloaded the library into it"
            )),
            (false, false) => m.push(format!(
                "the library did not load into {program}: it ran without zcnet"
            )),
            (false, true) if noted => {
                m.push(format!("confirmed: the library loaded into {program}"))
            }
            _ => {}
        }
        if self.refused > 0 {
            m.push(format!(
                "{} process(es) found the board full: their stats are missing",
                self.refused
            ));
        }
        m
    }
}
