//! zcnet-msg: whole messages over UDP — up to [`MsgConfig::max_message`] bytes (1 MiB by
//! default) sent as self-describing datagrams, many per system call with GSO
//! (`UDP_SEGMENT`), optionally from loaned buffers with `MSG_ZEROCOPY` or io_uring
//! `SEND_ZC`, received with GRO (`UDP_GRO`) and reassembled — or reported lost, never
//! delivered in part. A transport of its own beside zcnet's TCP paths, with its own wire
//! format ([`wire`]) and reassembly; from the core it takes the transmit pool
//! ([`zcnet::Pool`]), the zero-copy [`zcnet::Policy`] and its COPIED demotion, the
//! completion bookkeeping ([`zcnet::zc`]) and [`zcnet::Stats`], so a loaned message goes
//! zero-copy by the same rules, and is counted in the same counters, as a stream's buffer.
//! A user of `zcnet::Sender` compiles none of it. The wire format, the semantics and the
//! limits: [`guide`].
//!
//! ```
//! use zcnet_msg::{MsgConfig, MsgEvent, MsgReceiver, MsgSender, MsgTx};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = MsgConfig::new(MsgTx::Zerocopy); // loaned buffers go MSG_ZEROCOPY where it pays
//! let mut rx = MsgReceiver::bind("127.0.0.1:0".parse()?, &cfg)?;
//! let mut tx = MsgSender::connect(rx.local_addr()?, &cfg)?;
//! tx.send_slice(b"hello")?; // copy semantics: the slice is yours again at once
//! let mut buf = tx.buffer(100_000)?; // a loan laid out with header holes
//! buf.copy_from(&[7u8; 100_000]);
//! tx.send(buf)?; // back to its pool when the kernel's completion covers it
//! for want in [5, 100_000] {
//!     match rx.recv(std::time::Duration::from_secs(5))? {
//!         Some(MsgEvent::Message(m)) => assert_eq!(m.len(), want), // whole, or not at all
//!         other => panic!("{other:?}"),
//!     }
//! }
//! println!("{:?}\n{}", tx.stats().snapshot(), tx.io_stats().snapshot()); // messages; bytes
//! # Ok(()) }
//! ```
//!
//! The idea is Lightweight Messages' (Jin, Zhang, Tan, "Lightweight Messages", §3.1):
//! fragment in the application, with a hole for each fragment's header in the send buffer,
//! so the payload is written once and every datagram is one contiguous piece of that buffer. Today's kernel does the rest that
//! paper had to patch a driver for: one `sendmsg` hands it up to 64 KiB of datagrams (GSO),
//! `MSG_ZEROCOPY` sends them from the application's pages, and `UDP_GRO` hands a receiver
//! up to 64 KiB of them per read with the segment size in a control message.
//!
//! * [`MsgSender`] — over a connected socket. [`MsgSender::send_slice`] copies (the caller may
//!   reuse its slice at once; an iovec interleaves headers and the caller's bytes, so nothing
//!   is copied in user space). [`MsgSender::buffer`] lends a [`MsgBuf`] laid out with header
//!   holes; [`MsgSender::send`] sends it with `MSG_ZEROCOPY` when [`MsgConfig::tx`] says
//!   so and the [`zcnet::Policy`] agrees, and the buffer goes back to its pool when the
//!   kernel's completion covers it.
//! * [`MsgReceiver`] — over a bound socket. [`MsgReceiver::recv`] returns a [`MsgEvent`]: a
//!   whole [`Message`], or [`Lost`] with the message id(s) and a [`LossReason`].
//! * [`Framer`] — the sender's steps without the syscalls (ids, headers, GSO batches), pure
//!   code that the blocking sender and zcnet-tokio's `ZcUdpSocket` both drive.
//! * [`Reassembly`] — the receiver's bounded table, pure code.
//! * [`wire`] — the 28-byte fragment header and the message layout, and the sender's
//!   mark (a header-only datagram): how many ids it sent, so the receiver reports a lost
//!   tail too.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

// One module per part, each re-exported here: a user names `zcnet_msg::MsgSender`, never
// the file it lives in. `wire` stays a module: the format is a protocol of its own, which
// tests and other implementations speak with raw datagrams.
mod framer;
mod msgbuf;
mod reassembly;
mod recv;
mod send;
mod stats;
mod uring;
pub mod wire;

/// `docs/msg.md`: whole messages over UDP — the wire format, loss reporting, the numbers.
#[cfg(not(doctest))]
#[doc = include_str!("../docs/msg.md")]
pub mod guide {}

pub use framer::{Batch, Framer, Outgoing};
pub use msgbuf::MsgBuf;
pub use reassembly::{InFlight, Reassembly};
pub use recv::MsgReceiver;
pub use send::MsgSender;
pub use stats::{MsgStats, MsgStatsSnapshot};
pub use uring::{MsgRing, Refused};

use std::net::SocketAddr;
use std::time::Duration;
use zcnet::Policy;

/// The largest [`MsgConfig::max_message`] accepted (why: there).
pub(crate) const MAX_MESSAGE_LIMIT: usize = 1 << 30;

/// How [`MsgSender::send`] sends a loaned buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum MsgTx {
    /// Plain `sendmsg`: the kernel copies; the buffer returns to its pool at once.
    Copy,
    /// `MSG_ZEROCOPY`: the kernel references the buffer's pages; the completion returns it.
    Zerocopy,
    /// io_uring `IORING_OP_SEND_ZC` from the pool registered as fixed buffers ([`MsgRing`]):
    /// zero-copy without pinning each page per send or reading an error queue. Where
    /// io_uring or `SEND_ZC` is missing, `MSG_ZEROCOPY` instead (counted as
    /// [`zcnet::FallbackReason::Unsupported`]).
    Uring,
}

impl MsgTx {
    /// Whether messages go out zero-copy (by either engine).
    pub fn is_zerocopy(self) -> bool {
        matches!(self, MsgTx::Zerocopy | MsgTx::Uring)
    }
}

/// Bounds of the receiver's reassembly state, in memory and in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReassemblyLimits {
    /// Messages being reassembled at once; a new one beyond this evicts the least recently
    /// active (reported lost, [`LossReason::Evicted`]).
    pub max_messages: usize,
    /// Bytes reserved for messages being reassembled (each reserves its total length on its
    /// first fragment); must be at least [`MsgConfig::max_message`].
    pub max_bytes: usize,
    /// A message that receives no fragment for this long is lost ([`LossReason::Timeout`]);
    /// an id that has not shown up this long after a later id did is lost
    /// ([`LossReason::Gap`]). It is the reorder window.
    pub timeout: Duration,
    /// Senders (address + session) whose id sequences are tracked; beyond it the least
    /// recently heard is forgotten (its open messages and gaps reported lost).
    pub max_senders: usize,
}

impl Default for ReassemblyLimits {
    fn default() -> Self {
        ReassemblyLimits {
            max_messages: 64,
            max_bytes: 16 << 20,
            timeout: Duration::from_secs(1),
            max_senders: 256,
        }
    }
}

/// Configuration of a [`MsgSender`] or [`MsgReceiver`] (each reads the fields it needs).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MsgConfig {
    /// Largest message, sender and receiver (1 MiB by default, at most 1 GiB: reassembly
    /// reserves a message's whole length when its first fragment arrives, so the limit keeps
    /// one configuration from asking for more than a sane amount of memory per message).
    /// Larger sends are [`MsgError::TooLarge`]; larger incoming messages are reported lost
    /// ([`LossReason::TooLarge`]).
    pub max_message: usize,
    /// How loaned buffers are sent.
    pub tx: MsgTx,
    /// When a loaned message goes zero-copy (size threshold over its wire bytes, COPIED
    /// demotion), as for streams.
    pub policy: Policy,
    /// Datagram size in bytes, header included; `None` derives it from the path MTU of the
    /// connected socket (`IP_MTU`: 1500 → 1472, loopback's 65536 → 65507).
    pub segment: Option<usize>,
    /// Use GSO (`UDP_SEGMENT`) on send. Off: one datagram per `sendmsg`, the baseline.
    pub gso: bool,
    /// Ask for `UDP_GRO` on receive. Off: one datagram per `recvmsg`, the baseline.
    pub gro: bool,
    /// Buffers in the sender's pool of [`MsgBuf`]s (created on first use, each sized for
    /// `max_message` with header holes). The flow-control bound for zero-copy sends.
    pub pool_buffers: usize,
    /// Send timeout (`SO_SNDTIMEO`), and how long [`MsgSender::buffer`] waits for a loan.
    pub timeout: Duration,
    /// Receive socket buffer to ask for (`SO_RCVBUF`, `SO_RCVBUFFORCE` when allowed): a burst
    /// larger than it is dropped by the kernel, and the messages are then reported lost.
    pub recv_buffer: usize,
    /// Receive buffer of one read: a GRO read of up to 64 KiB must fit, or its tail is
    /// truncated (`MSG_TRUNC`) and the messages in it reported lost.
    pub datagram_buffer: usize,
    /// Receiver's reassembly bounds.
    pub reassembly: ReassemblyLimits,
}

impl Default for MsgConfig {
    fn default() -> Self {
        MsgConfig {
            max_message: 1 << 20,
            tx: MsgTx::Copy,
            policy: Policy::default(),
            segment: None,
            gso: true,
            gro: true,
            pool_buffers: 4,
            timeout: Duration::from_secs(10),
            recv_buffer: 8 << 20,
            datagram_buffer: 64 << 10,
            reassembly: ReassemblyLimits::default(),
        }
    }
}

/// `name(self, value) -> Self` for each `name: Type` of a `#[non_exhaustive]` configuration
/// struct, generated from one list so the methods and the fields cannot drift apart (zcnet's
/// configurations have the same, crate-private there).
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty),+ $(,)?) => {
        $(
            $(#[$doc])*
            #[must_use]
            pub fn $name(mut self, $name: $ty) -> Self {
                self.$name = $name;
                self
            }
        )+
    };
}

impl ReassemblyLimits {
    setters! {
        /// Sets [`ReassemblyLimits::max_messages`].
        max_messages: usize,
        /// Sets [`ReassemblyLimits::max_bytes`].
        max_bytes: usize,
        /// Sets [`ReassemblyLimits::timeout`], the reorder window.
        timeout: Duration,
        /// Sets [`ReassemblyLimits::max_senders`].
        max_senders: usize,
    }
}

impl MsgConfig {
    /// Defaults with loaned buffers sent as `tx` says.
    pub fn new(tx: MsgTx) -> Self {
        MsgConfig {
            tx,
            ..Self::default()
        }
    }

    setters! {
        /// Sets [`MsgConfig::max_message`] (raise [`ReassemblyLimits::max_bytes`] with it
        /// above 16 MiB: [`MsgConfig::validate`] says so).
        max_message: usize,
        /// Sets [`MsgConfig::tx`].
        tx: MsgTx,
        /// Sets [`MsgConfig::policy`].
        policy: Policy,
        /// Sets [`MsgConfig::gso`].
        gso: bool,
        /// Sets [`MsgConfig::gro`].
        gro: bool,
        /// Sets [`MsgConfig::pool_buffers`].
        pool_buffers: usize,
        /// Sets [`MsgConfig::timeout`].
        timeout: Duration,
        /// Sets [`MsgConfig::recv_buffer`].
        recv_buffer: usize,
        /// Sets [`MsgConfig::datagram_buffer`].
        datagram_buffer: usize,
        /// Sets [`MsgConfig::reassembly`].
        reassembly: ReassemblyLimits,
    }

    /// Fixes [`MsgConfig::segment`] (the datagram size, header included).
    #[must_use]
    pub fn segment(mut self, segment: usize) -> Self {
        self.segment = Some(segment);
        self
    }

    /// Sets the receiver's reorder window ([`ReassemblyLimits::timeout`]): how long a
    /// message may wait for a fragment, and an id for its turn, before it is reported lost.
    #[must_use]
    pub fn reorder_window(mut self, window: Duration) -> Self {
        self.reassembly.timeout = window;
        self
    }

    /// Checks the numbers against each other; every error names the field.
    pub fn validate(&self) -> Result<(), MsgError> {
        let bad = |s: String| Err(MsgError::Config(s));
        if self.max_message > MAX_MESSAGE_LIMIT {
            return bad(format!(
                "max_message {} is above the limit of {MAX_MESSAGE_LIMIT} bytes",
                self.max_message
            ));
        }
        let r = &self.reassembly;
        if r.max_bytes < self.max_message {
            return bad(format!(
                "reassembly.max_bytes {} is below max_message {}: a largest message could never be reassembled",
                r.max_bytes, self.max_message
            ));
        }
        if r.max_messages == 0 || r.max_senders == 0 {
            return bad("reassembly.max_messages and max_senders must be at least 1".into());
        }
        if r.timeout.is_zero() {
            return bad("reassembly.timeout must be positive".into());
        }
        if self.pool_buffers == 0 {
            return bad("pool_buffers must be at least 1".into());
        }
        if self.datagram_buffer <= wire::HEADER_LEN {
            return bad(format!(
                "datagram_buffer {} cannot hold a {}-byte header and payload",
                self.datagram_buffer,
                wire::HEADER_LEN
            ));
        }
        if let Some(s) = self.segment {
            if let Err(e) = wire::Layout::new(s) {
                return bad(format!("segment: {e}"));
            }
            if s > zcnet_sys::raw::udp_msg::MAX_UDP_PAYLOAD_V4 {
                return bad(format!(
                    "segment {s} is above the largest UDP payload ({})",
                    zcnet_sys::raw::udp_msg::MAX_UDP_PAYLOAD_V4
                ));
            }
        }
        Ok(())
    }
}

/// A failed message operation. Losses are not errors: they are [`MsgEvent::Lost`] events.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MsgError {
    /// The message is larger than [`MsgConfig::max_message`]; nothing was sent.
    #[error("message of {len} bytes is larger than the configured maximum of {max} bytes")]
    TooLarge {
        /// The message's length.
        len: usize,
        /// The configured maximum.
        max: usize,
    },
    /// The configuration is inconsistent.
    #[error("invalid message configuration: {0}")]
    Config(String),
    /// The socket or a syscall failed (including `ECONNREFUSED` when nobody listens on a
    /// connected peer, timeouts and an exhausted pool).
    #[error(transparent)]
    Io(#[from] zcnet::Error),
}

/// Why a message was reported lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LossReason {
    /// Some fragments never came within the reassembly timeout.
    Timeout,
    /// Evicted to keep reassembly within its limits (messages, bytes, senders).
    Evicted,
    /// A datagram of it was longer than the receive buffer (`MSG_TRUNC`).
    Truncated,
    /// Its fragments disagree (total length, overlapping ranges) or one is impossible.
    Inconsistent,
    /// Larger than the receiver's maximum message.
    TooLarge,
    /// No fragment of it ever arrived, and a later id of the same sender did, longer than
    /// the reorder window ago.
    Gap,
}

/// One message, delivered whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The sender's address.
    pub from: SocketAddr,
    /// The sender's session.
    pub session: u32,
    /// The message's id within the session.
    pub id: u64,
    /// Every byte of it.
    pub data: Vec<u8>,
}

impl std::ops::Deref for Message {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.data
    }
}

/// Messages that will not be delivered: ids `id .. id + count` of one sender's session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lost {
    /// The sender's address.
    pub from: SocketAddr,
    /// The sender's session.
    pub session: u32,
    /// First id lost.
    pub id: u64,
    /// How many consecutive ids (1 except for gaps).
    pub count: u64,
    /// Why.
    pub reason: LossReason,
}

impl Lost {
    /// The ids lost.
    pub fn ids(&self) -> std::ops::Range<u64> {
        self.id..self.id.saturating_add(self.count)
    }
}

/// What [`MsgReceiver::recv`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MsgEvent {
    /// A message, complete.
    Message(Message),
    /// Messages lost.
    Lost(Lost),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_set_the_fields_they_name() {
        let c = MsgConfig::default()
            .tx(MsgTx::Zerocopy)
            .max_message(64 << 10)
            .segment(1472)
            .pool_buffers(8)
            .recv_buffer(1 << 20)
            .reorder_window(Duration::from_millis(200))
            .gso(false);
        assert_eq!(c.tx, MsgTx::Zerocopy);
        assert_eq!(c.max_message, 64 << 10);
        assert_eq!(c.segment, Some(1472));
        assert_eq!(c.pool_buffers, 8);
        assert_eq!(c.recv_buffer, 1 << 20);
        assert_eq!(c.reassembly.timeout, Duration::from_millis(200));
        assert!(!c.gso && c.gro);
        let r = ReassemblyLimits::default().max_messages(3).max_senders(2);
        assert_eq!((r.max_messages, r.max_senders), (3, 2));
        assert!(c.reassembly(r).validate().is_ok());
    }

    #[test]
    fn config_errors_name_the_field() {
        assert!(MsgConfig::default().validate().is_ok());
        let c = MsgConfig {
            max_message: MAX_MESSAGE_LIMIT + 1,
            ..MsgConfig::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("max_message"));
        let mut c = MsgConfig {
            max_message: 32 << 20,
            ..MsgConfig::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("max_bytes"));
        c.reassembly.max_bytes = 64 << 20;
        assert!(c.validate().is_ok());
        let mut c = MsgConfig {
            segment: Some(20),
            ..MsgConfig::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("segment"));
        c.segment = Some(65_508);
        assert!(c.validate().is_err());
        c.segment = Some(1472);
        assert!(c.validate().is_ok());
        let mut c = MsgConfig::default();
        c.reassembly.max_messages = 0;
        assert!(c.validate().is_err());
    }
}
