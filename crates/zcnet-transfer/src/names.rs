//! Which names a receiver accepts. Pure code.
//!
//! A name is a relative path with `/` separators, made of normal components only: no
//! leading `/`, no `.` or `..`, no empty component, no NUL, at most [`MAX_NAME`] bytes and
//! 255 bytes per component, and not ending in `.partial` (the receiver's own suffix for data
//! in flight). Symlinks already in the target directory are handled when opening
//! (`openat2(RESOLVE_BENEATH)`), not here.

use super::wire::MAX_NAME;

/// Suffix of a file still being received.
pub const PARTIAL_SUFFIX: &str = ".partial";

/// Why a name is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// Empty name.
    #[error("empty file name")]
    Empty,
    /// Starts with `/`.
    #[error("absolute path {0:?}: names must be relative to the target directory")]
    Absolute(String),
    /// Contains `..`.
    #[error("{0:?} contains '..': it would leave the target directory")]
    ParentDir(String),
    /// Contains `.` or an empty component (`a//b`, trailing `/`).
    #[error("{0:?} is not in canonical form (empty or '.' component)")]
    NotCanonical(String),
    /// Contains a NUL byte.
    #[error("file name contains a NUL byte")]
    Nul,
    /// Too long.
    #[error("file name of {0} bytes is too long (max {MAX_NAME}, 255 per component)")]
    TooLong(usize),
    /// Ends in `.partial`.
    #[error("{0:?} ends in .partial, which the receiver reserves for files in flight")]
    Reserved(String),
}

/// Checks `name` and returns its components.
pub fn components(name: &str) -> Result<Vec<&str>, NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.contains('\0') {
        return Err(NameError::Nul);
    }
    if name.len() > MAX_NAME {
        return Err(NameError::TooLong(name.len()));
    }
    if name.starts_with('/') {
        return Err(NameError::Absolute(name.into()));
    }
    let parts: Vec<&str> = name.split('/').collect();
    for p in &parts {
        match *p {
            ".." => return Err(NameError::ParentDir(name.into())),
            "" | "." => return Err(NameError::NotCanonical(name.into())),
            p if p.len() > 255 => return Err(NameError::TooLong(p.len())),
            _ => {}
        }
    }
    if name.ends_with(PARTIAL_SUFFIX) {
        return Err(NameError::Reserved(name.into()));
    }
    Ok(parts)
}

/// `name` as it may be shown on a terminal or in a log: control characters (ESC, CR, …),
/// other non-printing characters (bidirectional overrides) and backslashes and quotes are
/// escaped as Rust escapes them, so a peer's name can neither drive the terminal nor pass for
/// another name.
pub fn printable(name: &str) -> String {
    name.escape_debug().to_string()
}

/// Whether a symlink target, read from a link `depth` directories below a root, stays
/// beneath that root when resolved from the link's directory (lexically: each `..` climbs one
/// directory, and climbing above the root is leaving it). `Err` says why not. Absolute
/// targets are never inside: they mean another place on each host.
pub fn link_target_stays_inside(target: &str, depth: usize) -> Result<(), &'static str> {
    if target.is_empty() || target.contains('\0') {
        return Err("empty or NUL in the target");
    }
    if target.starts_with('/') {
        return Err("an absolute target may point anywhere");
    }
    let mut d = depth;
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." if d == 0 => return Err("its target leaves the tree by its '..'s"),
            ".." => d -= 1,
            _ => d += 1,
        }
    }
    Ok(())
}

/// Whether a receiver creates a symlink to `target` at a link `depth` directories below its
/// root: [`link_target_stays_inside`], and no `..` after a component that names something.
///
/// Why the second rule: a target is resolved by the file system, not by its spelling. Once
/// `q -> .` exists, `p -> q/q/q/../../..` climbs from the directory `q` led back to, not
/// from the three directories it spells, and lands two levels above the root. Each `..`
/// of a target that only *leads* it climbs from the link's own directory, which the receiver
/// reached through real directories (it never creates a link through a symlink): that climb
/// is physical and the lexical count bounds it. After a name, the name may be a symlink —
/// already there, or sent later — and `..` would climb from wherever it leads. With no `..`
/// after a name, following any chain of such links only ever descends from a place inside,
/// so every link the receiver creates resolves inside, whatever order they come in
/// (`docs/transfer-protocol.md`, version 3). `.` components are harmless and kept.
pub fn link_target_allowed(target: &str, depth: usize) -> Result<(), &'static str> {
    link_target_stays_inside(target, depth)?;
    let mut named = false;
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." if named => {
                return Err(
                    "'..' after a name climbs from wherever that name leads (it may be a symlink)",
                )
            }
            ".." => {}
            _ => named = true,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_names_cannot_drive_a_terminal() {
        assert_eq!(printable("a/b c.txt"), "a/b c.txt");
        let p = printable("x\u{1b}]0;pwned\u{7}\r\u{202e}y");
        assert!(!p.chars().any(|c| c.is_control() || c == '\u{202e}'), "{p}");
        assert!(p.contains("\\u{1b}"), "{p}");
    }

    #[test]
    fn plain_relative_names_pass() {
        assert_eq!(components("a").unwrap(), vec!["a"]);
        assert_eq!(components("d/e/f.txt").unwrap(), vec!["d", "e", "f.txt"]);
        assert_eq!(
            components("..hidden/x..y").unwrap(),
            vec!["..hidden", "x..y"]
        );
    }

    #[test]
    fn every_unsafe_name_is_refused_with_its_reason() {
        assert_eq!(components(""), Err(NameError::Empty));
        assert!(matches!(
            components("/etc/passwd"),
            Err(NameError::Absolute(_))
        ));
        assert!(matches!(components("../x"), Err(NameError::ParentDir(_))));
        assert!(matches!(
            components("a/../../x"),
            Err(NameError::ParentDir(_))
        ));
        assert!(matches!(components("a/.."), Err(NameError::ParentDir(_))));
        assert!(matches!(
            components("a//b"),
            Err(NameError::NotCanonical(_))
        ));
        assert!(matches!(components("./a"), Err(NameError::NotCanonical(_))));
        assert!(matches!(components("a/"), Err(NameError::NotCanonical(_))));
        assert_eq!(components("a\0b"), Err(NameError::Nul));
        assert!(matches!(
            components(&"x".repeat(256)),
            Err(NameError::TooLong(256))
        ));
        assert!(matches!(
            components(&"a/".repeat(2100)),
            Err(NameError::TooLong(_))
        ));
        assert!(matches!(
            components("f.partial"),
            Err(NameError::Reserved(_))
        ));
        assert!(components("../x")
            .unwrap_err()
            .to_string()
            .contains("leave the target"));
    }

    #[test]
    fn a_climb_after_a_name_is_refused_wherever_it_would_land() {
        assert!(link_target_allowed("../../lib/x.so", 2).is_ok());
        assert!(link_target_allowed("./a/./b", 0).is_ok());
        assert!(link_target_allowed(".", 0).is_ok());
        assert!(link_target_allowed("..", 1).is_ok());
        assert!(link_target_allowed("q/q/q/../../..", 0).is_err());
        assert!(link_target_allowed("up/..", 1).is_err());
        assert!(link_target_allowed("a/../b", 0).is_err());
        assert!(link_target_allowed("../a/..", 1).is_err());
        assert!(
            link_target_allowed("../x", 0).is_err(),
            "the lexical rule still holds"
        );
    }

    #[test]
    fn link_targets_are_judged_from_the_links_directory() {
        assert!(link_target_stays_inside("a", 0).is_ok());
        assert!(link_target_stays_inside("./a/../b", 0).is_ok());
        assert!(link_target_stays_inside("../x", 1).is_ok());
        assert!(link_target_stays_inside("a/../../x", 1).is_ok());
        assert!(link_target_stays_inside("../x", 0).is_err());
        assert!(link_target_stays_inside("a/../../x", 0).is_err());
        assert!(link_target_stays_inside("../../x", 1).is_err());
        assert!(link_target_stays_inside("/etc", 5).is_err());
        assert!(link_target_stays_inside("", 0).is_err());
        assert!(link_target_stays_inside("a\0b", 0).is_err());
    }
}
