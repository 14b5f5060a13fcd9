//! Lightweight Messages over AF_XDP: [`LmSocket`] and its configuration, events and errors.
//! The crate docs describe the protocol; `docs/lm-afxdp.md` the findings and figures.

mod program;
mod socket;
mod stats;

pub use program::{LmProgram, Progress};
pub use socket::{LmBuf, LmSocket};
pub use stats::LmStats;

use std::io;
use std::net::SocketAddrV4;
use std::time::Duration;

use crate::program::AttachMode;
use crate::xsk::{BindMode, XskError};

/// How an [`LmSocket`] is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LmConfig {
    /// Our IPv4 address and UDP port: control datagrams are exchanged there, data frames
    /// carry it as their source and are received for it.
    pub local: SocketAddrV4,
    /// The interface `local` is on; `None` finds it by address.
    pub ifname: Option<String>,
    /// The interface queue to bind (veth has one per CPU; traffic from a peer veth arrives
    /// on queue 0).
    pub queue: u32,
    /// Largest message, either direction.
    pub max_message: usize,
    /// XSK bind mode: zero-copy where the driver has it, copy otherwise (counted).
    pub bind: BindMode,
    /// Where the XDP program runs.
    pub attach: AttachMode,
    /// Use AF_XDP at all; `false` forces the kernel-socket fallback (for comparison).
    pub xsk: bool,
    /// Attach the XDP program and receive through the XSK; `false` makes a send-only
    /// socket (it still answers nothing: messages sent to it are not admitted).
    pub receive: bool,
    /// How long [`LmBuf::send`] waits to be admitted, rejections included.
    pub admission_timeout: Duration,
    /// How long a receiver waits for all fragments of an admitted message.
    pub assembly_timeout: Duration,
}

impl LmConfig {
    /// Defaults for `local`: 1 MiB messages, prefer zero-copy, native XDP, AF_XDP on,
    /// admission within 2 s, assembly within 1 s.
    pub fn new(local: SocketAddrV4) -> LmConfig {
        LmConfig {
            local,
            ifname: None,
            queue: 0,
            max_message: 1 << 20,
            bind: BindMode::PreferZeroCopy,
            attach: AttachMode::Native,
            xsk: true,
            receive: true,
            admission_timeout: Duration::from_secs(2),
            assembly_timeout: Duration::from_secs(1),
        }
    }
}

/// Why a message was reported lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LossReason {
    /// Not every fragment arrived within the assembly timeout.
    Timeout,
    /// The XDP program dropped fragments (out of order, or injected loss) and the sender
    /// has finished.
    Dropped,
    /// A frame landed in a slot meant for another one.
    Misplaced,
}

/// A message that will not be delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LmLost {
    /// Its sender.
    pub from: SocketAddrV4,
    /// The sender's message number.
    pub id: u32,
    /// Its length.
    pub len: usize,
    /// Fragments that did arrive, of `count`.
    pub arrived: usize,
    /// Fragments it had.
    pub count: usize,
    /// Why.
    pub reason: LossReason,
}

/// A whole message, borrowed in place: from the UMEM when it was assembled there, from the
/// socket's reassembly buffer on the fallback path. Valid until the next call on the socket.
#[derive(Debug)]
#[non_exhaustive]
pub struct LmMessage<'a> {
    /// Its sender.
    pub from: SocketAddrV4,
    /// The sender's message number.
    pub id: u32,
    /// Assembled in the UMEM by the XSK (no copy in user space), or by the fallback.
    pub in_place: bool,
    /// The bytes.
    pub data: &'a [u8],
}

impl std::ops::Deref for LmMessage<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.data
    }
}

/// What [`LmSocket::recv`] returns.
#[derive(Debug)]
pub enum LmEvent<'a> {
    /// A message, whole.
    Message(LmMessage<'a>),
    /// A message that will not come.
    Lost(LmLost),
}

/// LM failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LmError {
    /// A configuration that cannot work, caught before any syscall.
    #[error("invalid LM configuration: {0}")]
    Config(String),
    /// The control socket or interface lookup failed.
    #[error("{op}: {source}")]
    Io {
        /// What was called.
        op: &'static str,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// AF_XDP failed after setup (setup failures fall back instead).
    #[error(transparent)]
    Xsk(#[from] XskError),
    /// The message is longer than [`LmConfig::max_message`].
    #[error("message of {len} bytes is longer than the maximum of {max}")]
    TooLong {
        /// Its length.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// No admission within [`LmConfig::admission_timeout`].
    #[error("{peer} did not admit message {id} within {waited:?} ({rejections} busy rejections, {retries} unanswered requests)")]
    NotAdmitted {
        /// The receiver.
        peer: SocketAddrV4,
        /// The message number.
        id: u32,
        /// How long we tried.
        waited: Duration,
        /// `LM_ACQ_REJ` (busy) answers received.
        rejections: u64,
        /// Requests that got no answer in time.
        retries: u64,
    },
    /// The receiver refused this message for good.
    #[error("{peer} refused message {id}: {reason}")]
    Refused {
        /// The receiver.
        peer: SocketAddrV4,
        /// The message number.
        id: u32,
        /// `too_long` or `bad_geometry`.
        reason: &'static str,
    },
    /// Transmit frames did not complete in time (the interface stopped sending).
    #[error("{0} transmit frames still in flight after {1:?}")]
    TxStuck(usize, Duration),
}
