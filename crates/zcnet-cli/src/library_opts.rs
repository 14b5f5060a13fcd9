//! What the `zcnet` CLI asks of the library that the library does not do by default.
//!
//! The `zcnet` library reads no file and no environment variable unless its caller asks
//! (docs/guide.md, "What zcnet touches"). The CLI asks, in this one place, for every
//! connection it makes on the `auto` path (`bench`, `send`, `tune`'s checks):
//!
//! * the profile `zcnet tune` wrote, at the default location (`$ZCNET_PROFILE`, else
//!   `$XDG_CONFIG_HOME/zcnet/`, else `~/.config/zcnet/`): [`zcnet::auto::ProfileSource::DefaultLocation`];
//! * the sender's clock card in `/dev/shm/zcnet-$EUID/` for a receiver's trial
//!   (`peer_clock`; `ZCNET_PEER_CLOCK=off`, `0` or `no` turns it off);
//! * the receivers' trial memory (`trial_memory`; `ZCNET_TRIAL_MEMORY=off`, `0` or `no`
//!   turns it off);
//! * the copy-on-write backend `ZCNET_COW_BACKEND` names (`userfaultfd`, `mprotect`, `none`),
//!   when set ([`zcnet::cow::use_backend_named`]);
//! * for `send`/`recv`, encryption (TLS 1.3; the library's default is plaintext): the
//!   receiver's identity and the sender's known hosts in the state directory
//!   (`--tls-dir`, else `$XDG_STATE_HOME/zcnet/`, else `~/.local/state/zcnet/`), the
//!   identity generated there on first use ([`recv_security`], [`send_security`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use zcnet::auto::ProfileSource;
use zcnet::{ReceiverConfig, SenderConfig};
use zcnet_transfer::session::{RecvSecurity, SendSecurity};
use zcnet_transfer::tls::{Expect, Fingerprint, Identity};

/// The file of the sender's known hosts in the state directory.
pub(crate) const KNOWN_HOSTS: &str = "known_hosts";

/// Where the CLI keeps its TLS identity and known hosts: `explicit` (`--tls-dir`), else
/// `$XDG_STATE_HOME/zcnet`, else `$HOME/.local/state/zcnet` (the XDG base directory
/// specification's state directory: data that should persist but is not worth backing up).
pub(crate) fn tls_dir(explicit: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(d) = explicit {
        return Ok(d.to_path_buf());
    }
    let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(x) = nonempty("XDG_STATE_HOME") {
        return Ok(PathBuf::from(x).join("zcnet"));
    }
    match nonempty("HOME") {
        Some(h) => Ok(PathBuf::from(h).join(".local/state/zcnet")),
        None => Err(
            "no state directory for the TLS identity and known hosts: set HOME or XDG_STATE_HOME, or give --tls-dir (or --plaintext)"
                .into(),
        ),
    }
}

/// The receiver's encryption: none with `--plaintext`; else the identity in `cert`/`key`
/// (`--tls-cert`/`--tls-key`), else the one kept in the state directory, generated there
/// on first use. Returns it with a line saying where the identity is, for the start-up
/// message.
pub(crate) fn recv_security(
    plaintext: bool,
    dir: Option<&Path>,
    cert_key: Option<(&Path, &Path)>,
) -> Result<(RecvSecurity, Option<String>), String> {
    if plaintext {
        return Ok((RecvSecurity::Plaintext, None));
    }
    let (identity, whence) = match cert_key {
        Some((cert, key)) => (
            Identity::from_files(cert, key).map_err(|e| e.to_string())?,
            format!("from {} and {}", cert.display(), key.display()),
        ),
        None => {
            let dir = tls_dir(dir)?;
            let (id, created) = Identity::load_or_generate(&dir).map_err(|e| e.to_string())?;
            let path = Identity::path_in(&dir);
            let whence = match created {
                true => format!("generated now in {}", path.display()),
                false => format!("from {}", path.display()),
            };
            (id, whence)
        }
    };
    let line = format!(
        "zcnet: TLS identity {} ({whence}); senders pin it with --fingerprint {}",
        identity.fingerprint(),
        identity.fingerprint()
    );
    Ok((RecvSecurity::Tls(Arc::new(identity)), Some(line)))
}

/// The sender's encryption for the receiver `host` (as the user wrote it): none with
/// `--plaintext`; the pinned key with `--fingerprint`; else the key recorded for `host` in
/// the state directory's known hosts (recorded there on first use).
pub(crate) fn send_security(
    plaintext: bool,
    fingerprint: Option<&str>,
    dir: Option<&Path>,
    host: &str,
) -> Result<SendSecurity, String> {
    if plaintext {
        return Ok(SendSecurity::Plaintext);
    }
    if let Some(fp) = fingerprint {
        let fp: Fingerprint = fp.parse().map_err(|e| format!("--fingerprint: {e}"))?;
        return Ok(SendSecurity::Tls(Expect::Pinned(fp)));
    }
    let dir = tls_dir(dir)?;
    create_private_dir(&dir)?;
    Ok(SendSecurity::Tls(Expect::KnownHosts {
        file: dir.join(KNOWN_HOSTS),
        host: host.to_string(),
    }))
}

/// Creates `dir` (and its parents) mode 0700 if missing.
fn create_private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("creating {}: {e}", dir.display()))
}

/// Whether the environment variable `name` is set to off (`off`, `0` or `no`).
fn turned_off(name: &str) -> bool {
    matches!(
        std::env::var(name).as_deref().map(str::trim),
        Ok("off" | "0" | "no")
    )
}

/// `cfg` with the CLI's opt-ins on the sending side: the default profile location and the
/// clock card.
pub(crate) fn sender(mut cfg: SenderConfig) -> SenderConfig {
    if matches!(cfg.profile, ProfileSource::NoProfile) {
        cfg.profile = ProfileSource::DefaultLocation;
    }
    cfg.peer_clock = !turned_off("ZCNET_PEER_CLOCK");
    cfg
}

/// `cfg` with the CLI's opt-ins on the receiving side: the default profile location, the
/// sender's clock card and the trial memory.
pub(crate) fn receiver(mut cfg: ReceiverConfig) -> ReceiverConfig {
    if matches!(cfg.profile, ProfileSource::NoProfile) {
        cfg.profile = ProfileSource::DefaultLocation;
    }
    cfg.peer_clock = !turned_off("ZCNET_PEER_CLOCK");
    cfg.trial_memory = !turned_off("ZCNET_TRIAL_MEMORY");
    cfg
}

/// Starts the copy-on-write engine with the backend `ZCNET_COW_BACKEND` names, if set
/// (otherwise the engine makes its automatic choice on first use). Once, at start: a
/// backend that cannot run here leaves `cow` sends copying, as the library reports.
pub(crate) fn cow_backend() {
    if let Ok(name) = std::env::var("ZCNET_COW_BACKEND") {
        // `none` and unavailable backends are reported by every `cow` sender's fallbacks.
        let _ = zcnet::cow::use_backend_named(&name);
    }
}
