//! `zcnet manuals --out DIR` (hidden): the man pages and shell completions, generated from
//! the clap definitions so that they cannot drift from `--help`. The Debian package's build
//! (`.ci/package-deb`) runs it and installs what it writes; nothing generated is committed.
//!
//! Written under `DIR`: `man/zcnet.1` and one page per subcommand (`man/zcnet-send.1`, …,
//! clap_mangen's naming), and `completions/` with `zcnet.bash`, `_zcnet` (zsh) and
//! `zcnet.fish`.

use clap_complete::Shell;
use std::path::{Path, PathBuf};

/// Options of `zcnet manuals`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Directory to write `man/` and `completions/` into (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

/// Writes the pages and completions for `cmd` (the whole `zcnet` command).
pub fn run(args: &Args, cmd: clap::Command) -> Result<(), String> {
    let written = write(&args.out, cmd).map_err(|e| format!("{}: {e}", args.out.display()))?;
    for p in written {
        println!("{}", p.display());
    }
    Ok(())
}

/// Writes every page and completion file under `out`; returns their paths.
fn write(out: &Path, cmd: clap::Command) -> std::io::Result<Vec<PathBuf>> {
    let man = out.join("man");
    let comp = out.join("completions");
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&comp)?;
    clap_mangen::generate_to(cmd.clone(), &man)?;
    let mut written: Vec<PathBuf> = std::fs::read_dir(&man)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    written.sort();
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let mut cmd = cmd.clone();
        written.push(clap_complete::generate_to(shell, &mut cmd, "zcnet", &comp)?);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_visible_subcommand_gets_a_page_and_each_shell_a_completion() {
        let cmd = clap::Command::new("zcnet")
            .version("1.2.3")
            .subcommand(
                clap::Command::new("send").about("Send files").arg(
                    clap::Arg::new("to")
                        .long("to")
                        .help("Where the receiver listens"),
                ),
            )
            .subcommand(clap::Command::new("secret").hide(true));
        let dir = tempfile::tempdir().unwrap();
        let written = write(dir.path(), cmd).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "zcnet-send.1",
                "zcnet.1",
                "zcnet.bash",
                "_zcnet",
                "zcnet.fish"
            ]
        );
        let send = std::fs::read_to_string(dir.path().join("man/zcnet-send.1")).unwrap();
        assert!(send.contains("Where the receiver listens"), "{send}");
        let bash = std::fs::read_to_string(dir.path().join("completions/zcnet.bash")).unwrap();
        assert!(bash.contains("--to"), "{bash}");
    }
}
