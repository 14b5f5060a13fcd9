//! Where `zcnet run` finds `libzcnet_preload.so`. The first of these that exists wins:
//!
//! 1. `$ZCNET_PRELOAD` when set and not empty (an error if it names no file: the user asked
//!    for that one and no other);
//! 2. beside this binary: a cargo target dir (`cargo build -p zcnet-cli -p zcnet-preload`),
//!    or an unpacked archive holding both;
//! 3. `deps/` beside this binary: where cargo leaves the library when it builds it as a
//!    dependency of `zcnet-cli`;
//! 4. `../lib/zcnet/` from this binary's directory: the Debian package (`/usr/bin/zcnet`,
//!    `/usr/lib/zcnet/libzcnet_preload.so`) and any `PREFIX/bin`, `PREFIX/lib/zcnet` install;
//! 5. the copy carried inside this binary — present when it was built from the packaged
//!    crate, as `cargo install zcnet-cli` builds it (see `build.rs`) — written on first use
//!    to `$XDG_CACHE_HOME/zcnet/` (else `$HOME/.cache/zcnet/`) as
//!    `libzcnet_preload-VERSION.so`, and written again whenever that file differs from the
//!    carried copy (another build of the same version).
//!
//! "This binary" is `/proc/self/exe`, so a symlink to `zcnet` finds the library beside the
//! real file.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The library's file name, wherever it lies.
const FILE: &str = "libzcnet_preload.so";

/// The library built into this binary (`build.rs` says when).
#[cfg(zcnet_bundled_preload)]
const CARRIED: Option<&[u8]> = Some(include_bytes!(env!("ZCNET_BUNDLED_PRELOAD")));
#[cfg(not(zcnet_bundled_preload))]
const CARRIED: Option<&[u8]> = None;

/// Why no library was found.
#[derive(Debug, thiserror::Error)]
pub enum PreloadLibError {
    #[error("ZCNET_PRELOAD={} is not a file", .0.display())]
    EnvNotAFile(PathBuf),
    #[error("finding this binary: {0}")]
    Exe(std::io::Error),
    #[error(
        "{FILE} is not beside {exe}, in {exe_dir}/../lib/zcnet/, nor built into this binary, \
         and ZCNET_PRELOAD is not set (build it with `cargo build --release -p zcnet-preload` \
         and point ZCNET_PRELOAD at it)",
        exe = .0.display(),
        exe_dir = .0.parent().unwrap_or(Path::new("/")).display()
    )]
    NotFound(PathBuf),
    #[error("writing the library this binary carries to {}: {source}", .path.display())]
    WriteCarried {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "neither XDG_CACHE_HOME nor HOME is set: nowhere to write the library this binary carries"
    )]
    NoCacheDir,
}

/// The library `zcnet run` preloads, by the search order above.
pub fn find() -> Result<PathBuf, PreloadLibError> {
    if let Some(p) = std::env::var_os("ZCNET_PRELOAD").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(PreloadLibError::EnvNotAFile(p))
        };
    }
    let exe = std::env::current_exe().map_err(PreloadLibError::Exe)?;
    if let Some(p) = candidates(&exe).into_iter().find(|p| p.is_file()) {
        return Ok(p);
    }
    match CARRIED {
        Some(bytes) => write_carried(&cache_dir()?, bytes),
        None => Err(PreloadLibError::NotFound(exe)),
    }
}

/// Places 2–4 of the search order, for the binary at `exe`.
fn candidates(exe: &Path) -> [PathBuf; 3] {
    let dir = exe.parent().unwrap_or(Path::new("/"));
    [
        dir.join(FILE),
        dir.join("deps").join(FILE),
        dir.join("../lib/zcnet").join(FILE),
    ]
}

/// `$XDG_CACHE_HOME/zcnet`, else `$HOME/.cache/zcnet` (the XDG base directory default).
fn cache_dir() -> Result<PathBuf, PreloadLibError> {
    let nonempty = |k| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    nonempty("XDG_CACHE_HOME")
        .or_else(|| nonempty("HOME").map(|h| h.join(".cache")))
        .map(|d| d.join("zcnet"))
        .ok_or(PreloadLibError::NoCacheDir)
}

/// Writes `bytes` to `dir/libzcnet_preload-VERSION.so` unless that file already holds
/// them. The file is replaced by a rename, never rewritten in place: a program still
/// running under the old file keeps its mapping intact.
fn write_carried(dir: &Path, bytes: &[u8]) -> Result<PathBuf, PreloadLibError> {
    let path = dir.join(format!("libzcnet_preload-{}.so", env!("CARGO_PKG_VERSION")));
    if std::fs::read(&path).is_ok_and(|old| old == bytes) {
        return Ok(path);
    }
    let fail = |source| PreloadLibError::WriteCarried {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(fail)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(fail)?;
    tmp.write_all(bytes).map_err(fail)?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o755))
        .map_err(fail)?;
    tmp.persist(&path).map_err(|e| fail(e.error))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_debian_layout_is_searched_after_the_binarys_own_directory() {
        let c = candidates(Path::new("/usr/bin/zcnet"));
        assert_eq!(
            c.map(|p| p.display().to_string()),
            [
                "/usr/bin/libzcnet_preload.so",
                "/usr/bin/deps/libzcnet_preload.so",
                "/usr/bin/../lib/zcnet/libzcnet_preload.so",
            ]
        );
    }

    #[test]
    fn the_carried_copy_is_written_once_and_rewritten_when_it_differs() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("zcnet");
        let p = write_carried(&cache, b"first").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"first");
        let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        let before = inode(&p);
        // The same bytes: the file is left alone.
        assert_eq!(write_carried(&cache, b"first").unwrap(), p);
        assert_eq!(inode(&p), before);
        // Other bytes (another build of this version): replaced by a new file.
        assert_eq!(write_carried(&cache, b"second").unwrap(), p);
        assert_eq!(std::fs::read(&p).unwrap(), b"second");
        assert_ne!(inode(&p), before);
        assert_eq!(
            std::fs::read_dir(&cache).unwrap().count(),
            1,
            "no temp file left"
        );
    }
}
