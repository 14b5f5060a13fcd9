//! `zcnet run -- CMD ARGS…`: starts an unmodified program with `libzcnet_preload.so` in
//! `LD_PRELOAD`, so its TCP sends take zcnet's paths with copy semantics intact (see the
//! `zcnet-preload` crate).
//!
//! The library is found through `$ZCNET_PRELOAD`, else next to the `zcnet` binary. Programs
//! the loader does not preload into are named before starting them: static executables
//! (no `PT_INTERP`), Go programs (they make system calls without the C library), and setuid
//! or setgid ones (the loader ignores `LD_PRELOAD` for them, ld.so(8), "secure-execution
//! mode").

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

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
    Statically linked programs, Go programs and setuid programs are not covered\n\
    (zcnet run says so when it sees one). The library is $ZCNET_PRELOAD, else\n\
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
    /// Set-user-ID or set-group-ID: `LD_PRELOAD` is ignored.
    Setuid,
}

impl NotCovered {
    fn why(self) -> &'static str {
        match self {
            NotCovered::Static => "is statically linked: LD_PRELOAD has no effect on it",
            NotCovered::Go => "is a Go program: it makes system calls without the C library",
            NotCovered::Setuid => "is setuid/setgid: the loader ignores LD_PRELOAD for it",
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

/// What keeps the library out of the program at `path`, if anything.
pub fn not_covered(path: &Path) -> Option<NotCovered> {
    let meta = path.metadata().ok()?;
    if meta.permissions().mode() & 0o6000 != 0 {
        return Some(NotCovered::Setuid);
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

/// Runs `zcnet run`: replaces this process with the program (returns only on failure).
pub fn run(args: &Args) -> Result<(), String> {
    let lib = crate::preload_lib::find().map_err(|e| e.to_string())?;
    let lib = std::fs::canonicalize(&lib).unwrap_or(lib);
    let program = &args.cmd[0];
    match resolve(program) {
        Some(p) => {
            if let Some(n) = not_covered(&p) {
                eprintln!(
                    "zcnet run: {} {}; it runs without zcnet",
                    p.display(),
                    n.why()
                );
            }
        }
        None => return Err(format!("{program}: command not found")),
    }
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(old) if !old.is_empty() => format!("{} {old}", lib.display()),
        _ => lib.display().to_string(),
    };
    let mut cmd = std::process::Command::new(program);
    cmd.args(&args.cmd[1..])
        .env("LD_PRELOAD", preload)
        .env("ZCNET_TX", args.tx.name());
    if let Some(s) = &args.stats {
        let abs = std::path::absolute(s).map_err(|e| format!("{}: {e}", s.display()))?;
        cmd.env("ZCNET_STATS", abs);
    }
    let e = cmd.exec();
    Err(format!("starting {program}: {e}"))
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
