//! The repository's guides, here so a link from the API reaches them: each module's page
//! is one file of `docs/`. Their code blocks are text, never compiled.

/// `docs/guide.md`: installing, the paths and how `auto` chooses, file transfer, UDP
/// messages, the iperf3 mode, tokio and `zcnet run`, for a user.
#[cfg(not(doctest))]
#[doc = include_str!("../docs/guide.md")]
pub mod usage {}

/// `docs/ARCHITECTURE.md`: the crates, the layers inside `zcnet`, where each path lives,
/// who owns which buffer, how to add a path.
#[cfg(not(doctest))]
#[doc = include_str!("../docs/ARCHITECTURE.md")]
pub mod architecture {}
