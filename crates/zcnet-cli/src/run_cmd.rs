//! `zcnet run -- CMD ARGS…`: starts an unmodified program with `libzcnet_preload.so` in
//! `LD_PRELOAD`, so its TCP sends take zcnet's paths with copy semantics intact (see the
//! `zcnet-preload` crate), and stays its parent: signals sent to `zcnet run` are relayed,
//! the stats line of every process that could not write its own is written from the board
//! ([`crate::run_board`]), and `zcnet run` exits as the program did.
//!
//! The library is found through `$ZCNET_PRELOAD`, else next to the `zcnet` binary. Programs
//! the loader does not preload into are named before starting them: static executables
//! (no `PT_INTERP`), Go programs (they make system calls without the C library), and those
//! the loader runs in secure-execution mode (`AT_SECURE`: setuid or setgid to another id,
//! file capabilities beyond the user's; ld.so(8)); what actually happened is said after.

use crate::run_board::BoardReport;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use zcnet_sys::raw::signal::SigSet;

/// How the library sends (its `ZCNET_TX`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tx {
    /// Zero-copy under protection where this host's measured costs say it pays.
    Auto,
    /// Copy every send (the program as it is, counted).
    Copy,
    /// Zero-copy under protection wherever memory allows (for measuring).
    Zerocopy,
    /// Zero-copy under protection where eligible, demoted on COPIED completions.
    Cow,
}

impl Tx {
    fn name(self) -> &'static str {
        match self {
            Tx::Auto => "auto",
            Tx::Copy => "copy",
            Tx::Zerocopy => "zerocopy",
            Tx::Cow => "cow",
        }
    }
}

/// Options of `zcnet run`.
#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "Examples:\n  \
    zcnet run -- curl -o big http://127.0.0.1:8080/big\n  \
    zcnet run --tx cow --stats s.json -- iperf3 -c 127.0.0.1\n\n\
    Statically linked programs, Go programs and programs run in secure-execution\n\
    mode (setuid to another user, file capabilities) are not covered (zcnet run\n\
    says so before and after). The library is $ZCNET_PRELOAD, else\n\
    libzcnet_preload.so beside this binary, in ../lib/zcnet/ from it, or the copy\n\
    built into it (cargo install), written to ~/.cache/zcnet/.")]
pub struct Args {
    /// How TCP sends go out.
    #[arg(long, value_enum, default_value = "auto")]
    tx: Tx,
    /// Append one JSON line per process to FILE at exit: bytes by path per socket and in
    /// total, bytes the kernel copied anyway, fallbacks by reason, protection faults.
    #[arg(long, value_name = "FILE", env = "ZCNET_STATS")]
    stats: Option<PathBuf>,
    /// The program and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    cmd: Vec<String>,
}

/// Why the loader would not preload into a program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotCovered {
    /// No program interpreter: statically linked.
    Static,
    /// A Go program: its system calls bypass the C library.
    Go,
    /// Set-user-ID or set-group-ID to another user or group than the one running it: the
    /// loader runs it in secure-execution mode and ignores `LD_PRELOAD`.
    Setuid,
    /// File capabilities this user does not hold: secure-execution mode too.
    FileCaps,
}

impl NotCovered {
    fn why(self) -> &'static str {
        match self {
            NotCovered::Static => "is statically linked: LD_PRELOAD has no effect on it",
            NotCovered::Go => "is a Go program: it makes system calls without the C library",
            NotCovered::Setuid => {
                "is setuid/setgid to another user: the loader runs it in secure-execution \
                 mode (AT_SECURE) and ignores LD_PRELOAD"
            }
            NotCovered::FileCaps => {
                "has file capabilities this user lacks: the loader runs it in \
                 secure-execution mode (AT_SECURE) and ignores LD_PRELOAD"
            }
        }
    }
}

/// Looks `name` up as the shell would (a path if it has a slash, else in `$PATH`).
pub fn resolve(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Some(PathBuf::from(name));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Whether an ELF image has a `PT_INTERP` program header (is dynamically linked).
/// `None` if it is not a 64-bit little-endian ELF (a script, say: its interpreter decides).
pub fn has_interp(elf: &[u8]) -> Option<bool> {
    if elf.len() < 64 || &elf[..4] != b"\x7fELF" || elf[4] != 2 || elf[5] != 1 {
        return None;
    }
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[32..40].try_into().ok()?) as usize;
    let (entsize, num) = (u16_at(54), u16_at(56));
    Some((0..num).any(|i| {
        let o = phoff + i * entsize;
        elf.get(o..o + 4)
            .is_some_and(|t| u32::from_le_bytes([t[0], t[1], t[2], t[3]]) == 3)
    }))
}

/// The identity the program would start with, as the kernel judges `AT_SECURE` by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Runner {
    /// Real user id.
    pub uid: u32,
    /// Real group id.
    pub gid: u32,
    /// Effective user id (0: every capability is already held).
    pub euid: u32,
}

impl Runner {
    /// This process's ids.
    pub fn me() -> Runner {
        Runner {
            uid: rustix::process::getuid().as_raw(),
            gid: rustix::process::getgid().as_raw(),
            euid: rustix::process::geteuid().as_raw(),
        }
    }
}

/// Whether `exec` of a file (its `mode`, owner, group, and whether it carries a
/// `security.capability` attribute) by `who` runs in secure-execution mode — the kernel's
/// `AT_SECURE`, under which the loader ignores `LD_PRELOAD` (ld.so(8)): the effective user
/// or group changes (setuid or setgid to an id other than the real one; the kernel's
/// `bprm_fill_uid`), or the file grants capabilities the process lacks
/// (`cap_bprm_creds_from_file`; root already holds them all).
pub fn secure_exec(
    mode: u32,
    owner: u32,
    group: u32,
    caps: bool,
    who: Runner,
) -> Option<NotCovered> {
    if (mode & 0o4000 != 0 && owner != who.uid) || (mode & 0o2000 != 0 && group != who.gid) {
        return Some(NotCovered::Setuid);
    }
    (caps && who.euid != 0).then_some(NotCovered::FileCaps)
}

/// Whether the file at `path` carries file capabilities.
fn has_caps(path: &Path) -> bool {
    let mut buf = [0u8; 64];
    rustix::fs::getxattr(path, "security.capability", &mut buf).is_ok_and(|n| n > 0)
}

/// A note for a program that is setuid, setgid or has file capabilities and is covered
/// all the same (its owner runs it, or root): said before it starts, confirmed after.
pub fn covered_note(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = path.metadata().ok()?;
    let special = m.mode() & 0o6000 != 0 || has_caps(path);
    (special && not_covered(path).is_none()).then(|| {
        format!(
            "{} is setuid/setgid or has file capabilities, but not beyond what this user \
             holds: no secure-execution mode, the loader preloads the library",
            path.display()
        )
    })
}

/// What keeps the library out of the program at `path`, if anything.
pub fn not_covered(path: &Path) -> Option<NotCovered> {
    use std::os::unix::fs::MetadataExt;
    let meta = path.metadata().ok()?;
    if let Some(n) = secure_exec(
        meta.mode(),
        meta.uid(),
        meta.gid(),
        has_caps(path),
        Runner::me(),
    ) {
        return Some(n);
    }
    let image = std::fs::read(path).ok()?;
    if has_interp(&image) == Some(false) {
        return Some(NotCovered::Static);
    }
    if has_interp(&image).is_some() && image.windows(14).any(|w| w == b"\xff Go buildinf:") {
        return Some(NotCovered::Go);
    }
    None
}

/// Signals `zcnet run` passes on to the program when a process sent them to it (a
/// terminal's `^C` reaches the whole foreground process group, the program included).
const RELAYED: [i32; 7] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
];

/// How long, after the program ended, its other processes (children it left running) may
/// take to end before their stats are written as they stand.
const STRAGGLERS: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs `zcnet run`: starts the program with the library and stays its parent (as
/// `perf stat` does), relaying signals sent to it; when the program is gone, writes the
/// stats line of every process of it that could not write its own (ended by a signal, by
/// `_exit` or by `exec`, or passive under a seccomp filter), says what happened, and exits
/// as the program did. Returns only on failure to start.
pub fn run(args: &Args) -> Result<(), String> {
    let lib = crate::preload_lib::find().map_err(|e| e.to_string())?;
    let lib = std::fs::canonicalize(&lib).unwrap_or(lib);
    let program = &args.cmd[0];
    let (predicted, noted) = match resolve(program) {
        Some(p) => {
            let n = not_covered(&p);
            if let Some(n) = n {
                eprintln!(
                    "zcnet run: {} {}; it runs without zcnet",
                    p.display(),
                    n.why()
                );
            }
            let note = covered_note(&p);
            if let Some(note) = &note {
                eprintln!("zcnet run: {note}");
            }
            (n, note.is_some())
        }
        None => return Err(format!("{program}: command not found")),
    };
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(old) if !old.is_empty() => format!("{} {old}", lib.display()),
        _ => lib.display().to_string(),
    };
    let dir = tempfile::Builder::new()
        .prefix("zcnet-run-")
        .tempdir()
        .map_err(|e| format!("a directory for the board: {e}"))?;
    let board_path = dir.path().join("board");
    let board = zcnet_sys::board::Board::create(&board_path)
        .map_err(|e| format!("{}: {e}", board_path.display()))?;
    let stats = match &args.stats {
        Some(s) => Some(std::path::absolute(s).map_err(|e| format!("{}: {e}", s.display()))?),
        None => None,
    };
    let mut watched = RELAYED.to_vec();
    watched.push(libc::SIGCHLD);
    let signals = SigSet::of(&watched);
    signals
        .block()
        .map_err(|e| format!("blocking signals: {e}"))?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(&args.cmd[1..])
        .env("LD_PRELOAD", preload)
        .env("ZCNET_TX", args.tx.name())
        .env("ZCNET_BOARD", &board_path);
    if let Some(s) = &stats {
        cmd.env("ZCNET_STATS", s);
    }
    signals.unblocked_in(&mut cmd);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("starting {program}: {e}"))?;
    let pid = child.id() as i32;
    let status = loop {
        if let Ok(Some(st)) = child.try_wait() {
            break st;
        }
        match signals.wait() {
            Ok(r) if r.signal == libc::SIGCHLD => {}
            Ok(r) if r.sent && r.pid != pid => {
                let _ = rustix::process::kill_process(
                    rustix::process::Pid::from_child(&child),
                    signal_of(r.signal),
                );
            }
            Ok(_) => {}
            Err(_) => {
                break child
                    .wait()
                    .map_err(|e| format!("waiting for {program}: {e}"))?
            }
        }
    };
    wait_for_stragglers(&board, pid);
    let report = BoardReport::read(&board, args.tx.name(), pid, &status);
    if let Some(path) = &stats {
        if let Err(e) = report.append(path) {
            eprintln!("zcnet run: writing {}: {e}", path.display());
        }
    }
    for line in report.messages(program, predicted.is_some(), noted) {
        eprintln!("zcnet run: {line}");
    }
    drop(dir);
    exit_as(&status)
}

fn signal_of(n: i32) -> rustix::process::Signal {
    rustix::process::Signal::from_named_raw(n).unwrap_or(rustix::process::Signal::TERM)
}

/// Waits (up to [`STRAGGLERS`]) for every process on the board but the program, which is
/// reaped already, to be gone or to have written its own line.
fn wait_for_stragglers(board: &zcnet_sys::board::Board, pid: i32) {
    use zcnet_sys::board::{state, word};
    let start = std::time::Instant::now();
    while start.elapsed() < STRAGGLERS {
        let running = board.slots().any(|s| {
            let p = s.get(word::PID) as i32;
            p != pid
                && s.get(word::STATE) & (state::WRITTEN | state::EXECED) == 0
                && rustix::process::Pid::from_raw(p)
                    .is_some_and(|p| rustix::process::test_kill_process(p).is_ok())
        });
        if !running {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Exits as the program did: with its code, or by its signal (the default action, after
/// the stats are written), so that a shell or a supervisor sees the same end.
fn exit_as(status: &std::process::ExitStatus) -> ! {
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = status.signal() {
        zcnet_sys::raw::signal::die_by(sig);
    }
    std::process::exit(status.code().unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_is_dynamic_and_bytes_are_not_elf() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(has_interp(&me), Some(true));
        assert_eq!(has_interp(b"#!/bin/sh\necho hi\n"), None);
        assert_eq!(not_covered(&std::env::current_exe().unwrap()), None);
    }

    #[test]
    fn secure_execution_is_judged_as_the_kernel_does() {
        let root = Runner {
            uid: 0,
            gid: 0,
            euid: 0,
        };
        let user = Runner {
            uid: 1000,
            gid: 1000,
            euid: 1000,
        };
        // setuid root: secure for a user, not for root.
        assert_eq!(
            secure_exec(0o4755, 0, 0, false, user),
            Some(NotCovered::Setuid)
        );
        assert_eq!(secure_exec(0o4755, 0, 0, false, root), None);
        // setgid to another group; setuid to the user running it.
        assert_eq!(
            secure_exec(0o2755, 0, 50, false, root),
            Some(NotCovered::Setuid)
        );
        assert_eq!(secure_exec(0o4755, 1000, 1000, false, user), None);
        // file capabilities: secure for a user, not for root, who holds them all.
        assert_eq!(
            secure_exec(0o755, 0, 0, true, user),
            Some(NotCovered::FileCaps)
        );
        assert_eq!(secure_exec(0o755, 0, 0, true, root), None);
        assert_eq!(secure_exec(0o755, 0, 0, false, user), None);
    }

    #[test]
    fn a_static_image_has_no_interpreter() {
        // A minimal ELF64 header with one PT_LOAD program header and no PT_INTERP.
        let mut elf = vec![0u8; 64 + 56];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[32..40].copy_from_slice(&64u64.to_le_bytes());
        elf[54..56].copy_from_slice(&56u16.to_le_bytes());
        elf[56..58].copy_from_slice(&1u16.to_le_bytes());
        elf[64..68].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(has_interp(&elf), Some(false));
        elf[64..68].copy_from_slice(&3u32.to_le_bytes());
        assert_eq!(has_interp(&elf), Some(true));
    }
}
