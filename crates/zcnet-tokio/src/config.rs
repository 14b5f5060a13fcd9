//! How a stream decides per send, and where it counts.

use std::sync::Arc;
use zcnet::{Policy, Stats};

/// Options of a [`crate::ZcStream`].
///
/// The [`Policy`] is zcnet's own (the blocking `Sender` uses the same one): sends smaller
/// than its threshold are copied (pinning pages and reading a notification cost more than
/// copying a few pages), and a socket whose completions keep saying the kernel copied
/// anyway (loopback, veth into a namespace) stops asking for zero-copy. Every such choice is
/// a counted fallback in [`Stats`].
#[derive(Debug, Clone, Default)]
pub struct ZcConfig {
    pub(crate) policy: Policy,
    pub(crate) stats: Option<Arc<Stats>>,
}

impl ZcConfig {
    /// zcnet's default policy (16 KiB threshold, demotion after 64 COPIED completions in a
    /// row) and fresh counters.
    pub fn new() -> Self {
        Self::default()
    }

    /// Uses `policy` for the per-send choice between copy and `MSG_ZEROCOPY`.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Counts into `stats` (shared with other streams, or with blocking zcnet senders).
    pub fn stats(mut self, stats: Arc<Stats>) -> Self {
        self.stats = Some(stats);
        self
    }
}
