//! Receive paths: one module per path, one small trait they share.
//!
//! * [`copy`] — `recv(2)` into a buffer the receiver owns.
//! * [`mmap`] — `TCP_ZEROCOPY_RECEIVE`: received pages are mapped, not copied, when the
//!   sender and the MSS let the kernel (see [`crate::sys::zcrecv`]).

pub mod copy;
pub mod mmap;

use crate::error::Result;
use crate::stats::Stats;
use std::fmt;
use std::ops::Deref;
use std::os::fd::BorrowedFd;
use std::str::FromStr;

/// Which receive path a [`crate::Receiver`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RxPath {
    /// Plain `recv`.
    Copy,
    /// `TCP_ZEROCOPY_RECEIVE` into a socket mapping, `recv` for what cannot be mapped.
    Mmap,
}

impl RxPath {
    /// Every path this build knows.
    pub const ALL: [RxPath; 2] = [RxPath::Copy, RxPath::Mmap];

    /// The CLI/JSON name.
    pub fn name(self) -> &'static str {
        match self {
            RxPath::Copy => "copy",
            RxPath::Mmap => "mmap",
        }
    }
}

impl fmt::Display for RxPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for RxPath {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        RxPath::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown receive path {s:?} (known: copy, mmap)"))
    }
}

/// Received bytes, lent by the [`crate::Receiver`] until dropped.
///
/// Mapped chunks point straight at the pages the NIC (or the kernel's deferred copy) filled;
/// the receiver releases them in batches once the mapping window is used up, and cannot
/// reuse the window while a chunk borrows it.
#[derive(Debug)]
pub struct RxChunk<'a> {
    data: &'a [u8],
    mapped: bool,
}

impl<'a> RxChunk<'a> {
    pub(crate) fn new(data: &'a [u8], mapped: bool) -> Self {
        RxChunk { data, mapped }
    }

    /// True when these bytes were mapped rather than copied.
    pub fn is_mapped(&self) -> bool {
        self.mapped
    }
}

impl Deref for RxChunk<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.data
    }
}

/// What every receive path does.
pub(crate) trait Receive: Send {
    /// The next bytes of the stream, `None` at end of stream.
    fn recv<'a>(&'a mut self, fd: BorrowedFd<'_>, stats: &Stats) -> Result<Option<RxChunk<'a>>>;

    /// Copies the next bytes into `buf`; 0 means end of stream (or an empty `buf`).
    fn recv_into(&mut self, fd: BorrowedFd<'_>, buf: &mut [u8], stats: &Stats) -> Result<usize>;
}
