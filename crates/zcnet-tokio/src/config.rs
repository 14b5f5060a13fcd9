//! How a stream decides per send, and where it counts.

use std::sync::Arc;
use zcnet::{Policy, Stats};

/// Options of a [`crate::ZcStream`].
///
/// The [`Policy`] is zcnet's own (the blocking `Sender` uses the same one): sends smaller
/// than its threshold are copied (pinning pages and reading a notification cost more than
/// copying a few pages), and a socket whose completions keep saying the kernel copied
/// anyway (loopback, veth into a namespace) stops asking for zero-copy — counted in bytes,
/// since the kernel merges notifications. Then zcnet's run-time cost check (the blocking
/// `auto` path's, `zcnet::auto::cost`): the stream measures its own CPU per byte on
/// zero-copy and on copy and leaves zero-copy while it costs more than 5 % above copy.
/// A stream connected to this host starts demoted ([`ZcConfig::local_zerocopy`]). Every
/// such choice is a counted fallback in [`Stats`] (`local_delivery`, `demoted_copied`,
/// `costlier`), and the check's windows and verdicts, the demotion's retries, are in
/// [`zcnet::StatsSnapshot`]'s `auto_tx`.
#[derive(Debug, Clone, Default)]
pub struct ZcConfig {
    pub(crate) policy: Policy,
    pub(crate) cost_check: Option<bool>,
    pub(crate) stats: Option<Arc<Stats>>,
    pub(crate) local_zerocopy: bool,
}

impl ZcConfig {
    /// zcnet's default policy (16 KiB threshold, demotion after 64 COPIED completions or
    /// 4 MiB of COPIED bytes in a row), the cost check, and fresh counters.
    pub fn new() -> Self {
        Self::default()
    }

    /// Uses `policy` for the per-send choice between copy and `MSG_ZEROCOPY`.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Turns the run-time cost check on or off. Without this call it runs when the policy
    /// can demote ([`Policy::demotes`]): [`Policy::always`] asks for zero-copy on every send
    /// and is not second-guessed.
    pub fn cost_check(mut self, on: bool) -> Self {
        self.cost_check = Some(on);
        self
    }

    /// Asks for zero-copy on a local route too. A stream connected to this host (a
    /// loopback address, or its own address: `zcnet::policy::delivery_is_local`) under a
    /// policy that demotes starts demoted for good, counted as `local_delivery`: the kernel
    /// copies every zero-copy byte at local delivery, so asking only costs (pinning and
    /// notifications on top of the copy). `true` keeps asking until the COPIED demotion
    /// says otherwise — for a test of that demotion on loopback. A policy that never
    /// demotes ([`Policy::always`]) asks everywhere regardless.
    pub fn local_zerocopy(mut self, on: bool) -> Self {
        self.local_zerocopy = on;
        self
    }

    pub(crate) fn checks_cost(&self) -> bool {
        self.cost_check.unwrap_or_else(|| self.policy.demotes())
    }

    /// Counts into `stats` (shared with other streams, or with blocking zcnet senders).
    pub fn stats(mut self, stats: Arc<Stats>) -> Self {
        self.stats = Some(stats);
        self
    }
}
