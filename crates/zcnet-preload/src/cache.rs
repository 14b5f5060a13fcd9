//! What earlier processes of this boot found, kept in files beside the `auto` profiles so
//! that a program started per transfer does not pay to find it again: this host's page
//! costs ([`crate::cost`]) and the peers whose route copies ([`crate::copying_peers`]). Each file
//! names the boot it was written in (a new boot may be a new kernel, new namespaces, or
//! the VM on another host); a missing, unreadable or other boot's file means finding out
//! again, as a process without the file would.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// The directory: `$ZCNET_PROFILE_DIR`, else the one the `auto` profiles live in by default
/// (`$XDG_CONFIG_HOME/zcnet`, else `$HOME/.config/zcnet`). Pure: the environment's values
/// are parameters (empty counts as unset).
pub fn dir(
    profile_dir: Option<&OsStr>,
    xdg_config_home: Option<&OsStr>,
    home: Option<&OsStr>,
) -> Option<PathBuf> {
    if let Some(d) = profile_dir.filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d));
    }
    let any = zcnet::auto::Profile::default_path("lo", 0, None, xdg_config_home, home).ok()?;
    Some(any.parent()?.to_path_buf())
}

/// A file's contents: the boot it holds facts of, and the facts.
#[derive(Debug, Serialize, Deserialize)]
struct Stamped<T> {
    boot_id: String,
    #[serde(flatten)]
    facts: T,
}

/// This boot's identity (`/proc/sys/kernel/random/boot_id`).
pub fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(id.trim().to_owned()).filter(|id| !id.is_empty())
}

/// The facts in `text` if it was written in boot `boot`.
pub fn parse<T: DeserializeOwned>(text: &str, boot: &str) -> Option<T> {
    let s: Stamped<T> = serde_json::from_str(text).ok()?;
    (s.boot_id == boot).then_some(s.facts)
}

/// The facts in the file at `path`, if it was written in this boot.
pub fn read<T: DeserializeOwned>(path: &Path) -> Option<T> {
    parse(&std::fs::read_to_string(path).ok()?, &boot_id()?)
}

/// Writes `facts` for this boot whole or not at all (a reader never sees half a file): to a
/// file of this process's own, renamed over the old one. Failing (a read-only home) only
/// means the next process finds out again.
pub fn write<T: Serialize>(path: &Path, facts: &T) -> std::io::Result<()> {
    let boot_id = boot_id().ok_or_else(|| std::io::Error::other("no boot id"))?;
    let text = serde_json::to_string(&Stamped { boot_id, facts }).map_err(std::io::Error::other)?;
    zcnet::tuning::write_atomically(path, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_are_beside_the_profiles() {
        let p = |d: Option<&str>, x: Option<&str>, h: Option<&str>| {
            dir(d.map(OsStr::new), x.map(OsStr::new), h.map(OsStr::new))
        };
        assert_eq!(
            p(Some("/d"), Some("/x"), Some("/h")),
            Some(PathBuf::from("/d"))
        );
        assert_eq!(
            p(Some(""), Some("/x"), Some("/h")),
            Some(PathBuf::from("/x/zcnet"))
        );
        assert_eq!(
            p(None, None, Some("/h")),
            Some(PathBuf::from("/h/.config/zcnet"))
        );
        assert_eq!(p(None, None, None), None);
    }

    #[test]
    fn facts_of_another_boot_are_not_read() {
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct F {
            n: u32,
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("f.json");
        write(&path, &F { n: 3 }).unwrap();
        assert_eq!(read::<F>(&path), Some(F { n: 3 }));
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(parse::<F>(&text, "another boot"), None);
        assert_eq!(parse::<F>("{", "x"), None);
        assert_eq!(
            std::fs::read_dir(dir.path().join("sub")).unwrap().count(),
            1
        );
    }
}
