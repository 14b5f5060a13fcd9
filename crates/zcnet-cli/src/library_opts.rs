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
//!   when set ([`zcnet::cow::use_backend_named`]).

use zcnet::auto::ProfileSource;
use zcnet::{ReceiverConfig, SenderConfig};

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
