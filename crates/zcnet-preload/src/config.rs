//! What the library was asked to do, read once from the environment `zcnet run` sets.

use std::path::PathBuf;

/// How sends on TCP sockets go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Per call: zero-copy under write protection when this host's measured cost of
    /// protecting a page is below that of copying it — on 4 KiB pages, or for buffers in
    /// transparent huge pages on huge ones ([`crate::huge`]) — and the socket is neither
    /// demoted nor seen rewriting its buffers in flight.
    Auto,
    /// Every send copies (what the program does without the library, counted).
    Copy,
    /// Zero-copy under protection wherever the memory allows, regardless of cost and of
    /// COPIED completions (for measuring). Never unprotected: copy semantics hold.
    Zerocopy,
    /// Zero-copy under protection where eligible; demoted after COPIED completions.
    Cow,
}

impl Mode {
    /// The mode a `ZCNET_TX` value names.
    pub fn parse(s: &str) -> Option<Mode> {
        Some(match s {
            "" | "auto" => Mode::Auto,
            "copy" => Mode::Copy,
            "zerocopy" => Mode::Zerocopy,
            "cow" => Mode::Cow,
            _ => return None,
        })
    }
}

/// The library's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// `ZCNET_TX` (default `auto`; an unknown value means `copy`, reported in the stats).
    pub mode: Mode,
    /// `ZCNET_TX` as given, when it named no mode.
    pub bad_mode: Option<String>,
    /// `ZCNET_STATS`: the file one JSON line per process is appended to at exit.
    pub stats: Option<PathBuf>,
    /// `ZCNET_PRELOAD_MIN`: calls smaller than this are copied (default: zcnet's policy).
    pub min_bytes: usize,
    /// `ZCNET_LOCAL_ZEROCOPY=1`: `auto` decides for a peer on this host as for any other
    /// (by default it copies there: the kernel copies at local delivery anyway). For tests
    /// that exercise `auto`'s protection choice over loopback.
    pub local_zerocopy: bool,
    /// Where this boot's page costs and copying routes are kept between processes
    /// (`crate::cache::dir`: `$ZCNET_PROFILE_DIR`, else beside the default `auto` profiles).
    pub cache_dir: Option<PathBuf>,
}

impl Config {
    /// Reads the environment.
    pub fn from_env() -> Config {
        let raw = std::env::var("ZCNET_TX").unwrap_or_default();
        let mode = Mode::parse(&raw);
        Config {
            mode: mode.unwrap_or(Mode::Copy),
            bad_mode: mode.is_none().then_some(raw),
            stats: std::env::var_os("ZCNET_STATS")
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
            min_bytes: std::env::var("ZCNET_PRELOAD_MIN")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(zcnet::Policy::default().min_zerocopy_bytes),
            local_zerocopy: std::env::var("ZCNET_LOCAL_ZEROCOPY").is_ok_and(|v| v == "1"),
            cache_dir: crate::cache::dir(
                std::env::var_os("ZCNET_PROFILE_DIR").as_deref(),
                std::env::var_os("XDG_CONFIG_HOME").as_deref(),
                std::env::var_os("HOME").as_deref(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_unknown_is_refused() {
        assert_eq!(Mode::parse("cow"), Some(Mode::Cow));
        assert_eq!(Mode::parse(""), Some(Mode::Auto));
        assert_eq!(Mode::parse("zerocopy"), Some(Mode::Zerocopy));
        assert_eq!(Mode::parse("fast"), None);
    }
}
