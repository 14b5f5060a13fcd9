//! zcnet: zero-copy network I/O for Linux.
//!
//! The library moves bytes between application buffers and TCP sockets with as few CPU copies
//! as the kernel allows, and falls back to copying whenever a fast path's conditions fail —
//! always counting the fallback in [`Stats`], never hiding it.
//!
//! ```
//! use std::io::Read;
//! use zcnet::{Listener, ReceiverConfig, Sender, SenderConfig};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let listener = Listener::bind("127.0.0.1:0".parse()?, &ReceiverConfig::default())?;
//! let addr = listener.local_addr()?;
//! let sending = std::thread::spawn(move || -> Result<_, zcnet::Error> {
//!     let mut tx = Sender::connect(addr, &SenderConfig::default())?;
//!     let mut buf = tx.buffer()?;   // a pooled, page-aligned buffer: empty, capacity() of room
//!     buf.append(b"hello, ");       // fill it (or read into buf.spare_mut(), then commit)
//!     tx.send(buf)?;                // moved in: back to its pool when the kernel is done
//!     tx.send_slice(b"world")?;     // copy semantics: the slice is yours again at once
//!     tx.finish()                   // FIN, wait for completions, return the counters
//! });
//! let mut rx = listener.accept()?;  // a Receiver; `Receiver::connect` for a client
//! let mut got = String::new();
//! rx.read_to_string(&mut got)?;     // io::Read; `recv()` lends chunks without a copy
//! assert_eq!(got, "hello, world");
//! let stats = sending.join().unwrap()?;
//! println!("{stats}");              // bytes by path, and every fallback with its reason
//! # Ok(()) }
//! ```
//!
//! # Start here
//!
//! * Sending: [`Sender`] (`connect`, or `from_stream` on a socket you have) and
//!   [`SenderConfig`]; its calls — [`Sender::send`] (a pool [`TxBuf`]),
//!   [`Sender::send_lent`] (your `Vec`/`Bytes`, lent), [`Sender::send_slice`] and
//!   `io::Write` (copy semantics), [`Sender::send_reader`] (a reader, in whole buffers),
//!   [`Sender::send_file`] (`sendfile`).
//! * Receiving: [`Listener`], [`Receiver`] and [`ReceiverConfig`]: [`Receiver::recv`]
//!   (lent [`RxChunk`]s), [`Receiver::recv_into`] and `io::Read`,
//!   [`Receiver::recv_to_file`] (`splice`).
//! * Time and blocking: a call blocks as a `TcpStream`'s would, up to the config's timeout
//!   or the socket's `SO_SNDTIMEO`/`SO_RCVTIMEO` for the whole call ([`Error::Timeout`]
//!   says how long it ran); on a non-blocking socket it returns [`Error::WouldBlock`] with
//!   the bytes it queued, and the next call goes on from there.
//! * Which path, and why a byte was copied: [`TxPath`], [`RxPath`], [`Stats`],
//!   [`FallbackReason`]; [`auto`] picks per operation from `zcnet tune`'s profile.
//! * UDP messages: the `zcnet-msg` crate. Async (tokio, hyper): the `zcnet-tokio` crate.
//!   AF_XDP and Lightweight Messages: the `zcnet-afxdp` crate.
//! * The guides, in this documentation: [`guide::usage`] (for a user) and
//!   [`guide::architecture`] (the map of the code and the ownership rules).
//!
//! # The paths
//!
//! * Transmit ([`Sender`], [`TxPath`]): `copy` (`send(2)`), `zerocopy` (`MSG_ZEROCOPY`,
//!   completions from the socket error queue), `uring` (io_uring `SEND_ZC` from registered
//!   buffers) and `cow` (`MSG_ZEROCOPY` behind copy semantics: pages write-protected while
//!   in flight, copied on write).
//! * Receive ([`Receiver`], [`RxPath`]): `copy` (`recv(2)`), `mmap` (`TCP_ZEROCOPY_RECEIVE`
//!   into a mapping of the socket), `uring` (multishot recv into a provided buffer ring) and
//!   `zcrx` (io_uring zero-copy receive where a NIC allows it; refused and counted here).
//! * Files: [`Sender::send_file`] (`sendfile(2)`, or `splice(2)` file → pipe → socket) and
//!   [`Receiver::recv_to_file`] (`splice(2)` socket → pipe → file), with read+send and
//!   recv+pwrite as counted fallbacks.
//!
//! Ownership is the API ([`guide::architecture`]): [`Sender::send`] takes a [`TxBuf`] by
//! value and the buffer goes back to its [`Pool`] only when the kernel's completion covers it;
//! [`Sender::send_slice`] keeps copy semantics. [`Receiver::recv`] lends an [`RxChunk`] whose
//! mapped pages are released when it is dropped.
//!
//! [`auto`] makes the `auto` path's per-operation decisions from the host profile `zcnet tune`
//! writes. This crate contains no `unsafe`: the syscalls and the memory the kernel touches
//! are owned by `zcnet-sys`. Whole messages over UDP (`zcnet-msg`, on this crate's pool,
//! policy and completions), the file-transfer protocol (`zcnet-transfer`), the bench's pure
//! half (`zcnet-bench`) and the two-host test bed (`zcnet-testbed`) are crates of their own,
//! so a user of [`Sender`] compiles none of them.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(unreachable_pub)]

pub mod auto;
pub(crate) mod buf;

pub(crate) mod builder;
mod call;
mod counters;
pub mod cow;
pub(crate) mod error;
#[cfg(feature = "fault-seam")]
#[doc(hidden)]
pub mod fault;
#[cfg(not(feature = "fault-seam"))]
#[allow(unreachable_pub, dead_code)]
mod fault;
pub(crate) mod file;
pub mod guide;
pub(crate) mod lend;
mod named;
pub(crate) mod path;
pub(crate) mod peer_card;
pub mod policy;
mod profile;
pub(crate) mod rx;
pub mod stats;
pub mod stream;
pub mod tuning;
pub(crate) mod tx;
pub mod zc;

pub use buf::{Pool, TxBuf};
pub use error::{Error, RangeError};
pub use lend::Lend;
pub use named::UnknownName;
pub use path::{FallbackReason, FileRxMode, FileTxMode, RxPath, TxPath};
pub use policy::Policy;
pub use rx::RxChunk;
pub use stats::{Stats, StatsSnapshot};
pub use stream::{Listener, Receiver, ReceiverConfig, Sender, SenderConfig};
/// Seals a memfd and maps it, soundly and with no `unsafe` of the caller's: a shard kept in
/// a memfd becomes a [`Lend`]able mapping.
#[cfg(feature = "memmap2")]
pub use zcnet_sys::mem::map_sealed;

/// The README's examples, compiled and run by `cargo test` so the first code a user copies
/// keeps working.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The guide's examples (`docs/guide.md`), compiled and run the same way.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide.md")]
pub struct GuideDoctests;
