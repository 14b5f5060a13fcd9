//! File transfer: the protocol, the receiver's safety rules and both ends of a session.
//! The wire format is specified in `docs/transfer-protocol.md`.

pub mod auth;
pub mod digest;
pub mod names;
pub mod session;
pub mod store;
pub mod wire;

use crate::stats::StatsSnapshot;

/// One line saying which paths carried the bytes of a session, from either side's stats.
pub fn paths_summary(st: &StatsSnapshot) -> String {
    let mut parts = Vec::new();
    let mut add = |what: &str, n: u64| {
        if n > 0 {
            parts.push(format!("{what} {}", crate::probe::fmt_bytes(n)));
        }
    };
    add("sendfile/splice out of the page cache", st.tx_bytes_file);
    add("zero-copy send", st.tx_bytes_zerocopy);
    add(
        "copied send (control frames, streams, fallbacks)",
        st.tx_bytes_copy,
    );
    add("spliced into files", st.rx_bytes_file);
    add("mapped receive", st.rx_bytes_mapped);
    add(
        "copied receive (control frames, streams, fallbacks)",
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
            crate::probe::fmt_bytes(*bytes)
        );
    }
    s
}
