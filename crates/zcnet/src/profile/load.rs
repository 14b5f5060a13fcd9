//! Finding and loading the profile for one connection: what reads the environment, the file
//! system and the host's interfaces for `auto`, which decides from what this gives it.
//!
//! Nothing here runs unless the caller asked for a profile ([`ProfileSource`]'s default reads
//! nothing). A connection's profile is the one `zcnet tune` wrote for the interface that carries it
//! (the interface holding the local address; `lo` for loopback), at
//! [`Profile::default_path_from_env`], and it must match this kernel and that interface's MTU
//! ([`HostKey`]). Anything else — no file, a file from another host, an old schema — leaves
//! the connection on the built-in defaults, and the reason is kept in [`Loaded::note`] for
//! the CLI to print: a refused profile is never applied and never silently ignored.

use super::{HostKey, Profile};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use zcnet_sys::raw::socket;

/// Where a [`crate::Sender`]/[`crate::Receiver`] on the `auto` path gets its profile.
///
/// The default reads nothing: a library must not read files or environment variables its
/// caller did not ask for, so a program that wants `zcnet tune`'s profile says so with
/// [`ProfileSource::DefaultLocation`] (as the `zcnet` CLI does).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub enum ProfileSource {
    /// No profile is read: `auto` measures for itself (a receive trial), exactly as when the
    /// default location holds no profile.
    #[default]
    NoProfile,
    /// The profile `zcnet tune` wrote for the connection's interface, at the default location
    /// (`$ZCNET_PROFILE`, else `$XDG_CONFIG_HOME/zcnet/profile-IF-mtuN.json`, else
    /// `~/.config/zcnet/profile-IF-mtuN.json`): the only source that reads the environment.
    DefaultLocation,
    /// That file (still checked against this host).
    Path(PathBuf),
    /// No profile: the built-in conservative defaults (`copy`).
    BuiltIn,
    /// This profile, already parsed; the caller vouches that it fits the connection.
    Given(Arc<Profile>),
}

/// What loading gave.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// The profile in force, if any.
    pub profile: Option<Arc<Profile>>,
    /// Why there is none (or `None` when there is one, or when built-in defaults were asked
    /// for).
    pub note: Option<String>,
}

/// Why this host's key could not be made: a read of the kernel release or of the
/// interfaces failed, or no interface in this network namespace holds the address; the
/// message says which.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct HostKeyError(#[from] KeyFault);

/// The reasons behind a [`HostKeyError`].
#[derive(Debug, thiserror::Error)]
enum KeyFault {
    /// A read of the kernel or the interfaces failed; `what` names it.
    #[error("{what}: {source}")]
    Io {
        /// What was being read.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// No interface in this network namespace holds the address.
    #[error("no interface holds {0}")]
    NoInterface(IpAddr),
}

/// This host's key for a connection whose local address is `local`: kernel release, the
/// interface holding that address (`lo` for loopback and unspecified addresses) and its MTU.
pub fn host_key_for(local: IpAddr) -> Result<HostKey, HostKeyError> {
    let io = |what: &str| {
        let what = what.to_string();
        move |source| KeyFault::Io { what, source }
    };
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_err(io("reading the kernel release"))?
        .trim()
        .to_owned();
    let interface = socket::find_interface(|a| {
        if local.is_unspecified() || local.is_loopback() {
            a.is_loopback()
        } else {
            a == local
        }
    })
    .map_err(io("listing interfaces"))?
    .ok_or(KeyFault::NoInterface(local))?;
    let mtu = socket::interface_mtu(&interface)
        .map_err(io(&format!("reading the MTU of {interface}")))?;
    Ok(HostKey {
        kernel,
        interface,
        mtu,
    })
}

/// Loads the profile `source` names for a connection whose local address is `local`.
pub fn load(source: &ProfileSource, local: IpAddr) -> Loaded {
    let path = match source {
        ProfileSource::BuiltIn | ProfileSource::NoProfile => return Loaded::default(),
        ProfileSource::Given(p) => {
            return Loaded {
                profile: Some(p.clone()),
                note: None,
            }
        }
        ProfileSource::Path(p) => Some(p.clone()),
        ProfileSource::DefaultLocation => None,
    };
    let none = |note: String| Loaded {
        profile: None,
        note: Some(note),
    };
    let key = match host_key_for(local) {
        Ok(k) => k,
        Err(e) => return none(format!("no profile: {e}")),
    };
    let path = match path {
        Some(p) => p,
        None => match Profile::default_path_from_env(&key.interface, key.mtu) {
            Ok(p) => p,
            Err(e) => return none(format!("no profile: {e}")),
        },
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return none(format!(
                "no profile at {} (run `zcnet tune`); using built-in defaults",
                path.display()
            ))
        }
        Err(e) => return none(format!("cannot read profile {}: {e}", path.display())),
    };
    match Profile::parse(&text, &key) {
        Ok(p) => Loaded {
            profile: Some(Arc::new(p)),
            note: None,
        },
        Err(e) => none(format!(
            "profile {} refused: {e}; using built-in defaults",
            path.display()
        )),
    }
}
