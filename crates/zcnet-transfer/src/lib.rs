//! File transfer: the protocol, the receiver's safety rules and both ends of a session.
//! The wire format is specified in `docs/transfer-protocol.md`.
//!
//! This is the only zcnet crate that hashes (BLAKE3) and authenticates (HMAC-SHA256); a user
//! of the `zcnet` library compiles neither.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]
#![warn(missing_docs)]

pub mod auth;
pub mod descriptors;
pub mod digest;
mod finish;
pub mod handshake;
pub mod landing;
pub mod limits;
pub mod names;
pub mod open;
pub mod ranges;
pub mod resolve;
pub mod server;
pub mod session;
pub mod sparse;
pub mod store;
pub mod streams;
pub mod tls;
pub mod tree;
pub mod wire;

use zcnet::stats::StatsSnapshot;

/// One line saying which paths carried the bytes of a session, from either side's stats.
pub fn paths_summary(st: &StatsSnapshot) -> String {
    let mut parts = Vec::new();
    let mut add = |what: &str, n: u64| {
        if n > 0 {
            parts.push(format!("{what} {}", zcnet::stats::fmt_bytes(n)));
        }
    };
    add("sendfile/splice out of the page cache", st.tx_bytes_file);
    add("zero-copy send", st.tx_bytes_zerocopy);
    add(
        "copied send (control frames, small files, streams, fallbacks)",
        st.tx_bytes_copy,
    );
    add("spliced into files", st.rx_bytes_file);
    add("mapped receive", st.rx_bytes_mapped);
    add(
        "copied receive (control frames, small files, streams, fallbacks)",
        st.rx_bytes_copied,
    );
    let mut s = if parts.is_empty() {
        "nothing moved".to_string()
    } else {
        parts.join(", ")
    };
    for (reason, ops, bytes) in &st.fallbacks {
        s += &format!(
            "; fallback {}: {ops} ops, {}",
            reason.name(),
            zcnet::stats::fmt_bytes(*bytes)
        );
    }
    s
}
