//! The `auto` receive path: which receive path a connection takes, from this host's profile.
//!
//! Unlike transmit, the choice is made once per connection, from the receiver's operation
//! size (`ReceiverConfig::op_size`): receive paths cannot be mixed on one socket
//! while an io_uring multishot `recv` is armed (it would race a plain `recv` for the same
//! bytes), and the mapping path's page-multiple MSS has to be advertised before the
//! handshake. What can change online is `mmap`: while the kernel keeps mapping nothing it is
//! demoted to plain `recv` and re-probed later ([`super::mmap`]).

use crate::auto::ProfileSource;
use crate::auto::{load, pair, AutoStats, Chooser};
use crate::path::RxPath;
use std::net::IpAddr;

/// The decision for one listener or connection.
#[derive(Debug, Clone)]
pub(crate) struct AutoRxChoice {
    /// The concrete path.
    pub path: RxPath,
    /// Whether the profile measured `mmap` mapping at this size (demote if it then does not).
    pub expect_mapping: bool,
    /// Why no profile is in force, if none is.
    pub note: Option<String>,
    /// The decision, for `Stats`.
    pub delta: AutoStats,
}

/// Chooses the receive path for a receiver bound to (or accepted at) `local` that receives
/// `op_size` bytes per call (and reads them, if `touch`), by the profile `profile` names.
pub(crate) fn choose(
    profile: &ProfileSource,
    touch: bool,
    op_size: usize,
    local: IpAddr,
) -> AutoRxChoice {
    let loaded = load::load(profile, local);
    let chooser = match loaded.profile.as_deref() {
        // Both ends measured together on this host: the receiver's half of the cheapest
        // pair (the sender, if `auto` on the same profile, takes the other half).
        Some(p) if pair::has_pairs(&p.pairs, touch) => {
            Chooser::from_measurements(&pair::rx_rows(&p.pairs, touch), touch)
        }
        Some(p) => Chooser::from_measurements(&p.rx, touch),
        None => Chooser::defaults(),
    };
    let size = op_size.max(1) as u64;
    let choice = chooser.choose(size, true);
    let mut delta = AutoStats::default();
    delta.record_choice(&choice);
    AutoRxChoice {
        path: choice.path,
        expect_mapping: chooser.expects_zero_copy(RxPath::Mmap, size),
        note: loaded.note,
        delta,
    }
}
