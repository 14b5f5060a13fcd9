//! zcnet-tokio: zero-copy network I/O for tokio, on tokio's own reactor — no second
//! runtime, no thread per connection. TCP streams whose sends lend their buffers to the
//! kernel (`MSG_ZEROCOPY`), receives that map pages (`TCP_ZEROCOPY_RECEIVE`), whole
//! messages over UDP, and hyper/axum bodies sent without a copy.
//!
//! ```
//! use bytes::Bytes;
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! use zcnet_tokio::{ZcListener, ZcStream};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let listener = ZcListener::bind("127.0.0.1:0").await?;
//! let addr = listener.local_addr()?;
//! let server = tokio::spawn(async move {
//!     let (mut s, _peer) = listener.accept().await?;
//!     let mut got = Vec::new();
//!     s.read_to_end(&mut got).await?; // AsyncRead: a drop-in for tokio's TcpStream
//!     Ok::<_, std::io::Error>(got)
//! });
//!
//! let mut s = ZcStream::connect(addr).await?;
//! let body = Bytes::from(vec![42u8; 1 << 20]);
//! let sent = s.send_bytes(body.clone()).await?; // returns once queued; no copy where it pays
//! let (r, buf) = s.send_zc(vec![7u8; 64 << 10]).await; // the Vec comes back after the kernel
//! r?;
//! s.shutdown().await?;
//!
//! let got = server.await.unwrap()?;
//! assert_eq!(&got[..body.len()], &body[..]);
//! assert_eq!(&got[body.len()..], &buf[..]);
//! println!("{sent:?}; {}", s.stats().snapshot()); // zero-copy, copied, and why
//! # Ok(())
//! # }
//! ```
//!
//! # Start here
//!
//! * **A TCP stream**: [`ZcStream`] (connect, or [`ZcListener::accept`]) — `AsyncRead`/
//!   `AsyncWrite` as tokio's `TcpStream`, plus [`ZcStream::send_zc`] (an owned buffer,
//!   given back after the kernel's completion), [`ZcStream::send_bytes`] (a `Bytes`, kept
//!   until the completion) and [`ZcStream::recv_zc`] (mapped pages where the kernel can).
//!   [`ZcStream::into_split`] gives a read half and a write half that keeps `send_zc`.
//! * **Cancelling a send** (a `select!`, a timeout): see [below](#cancelling-a-send).
//! * **An HTTP server**: [`crate::axum::serve`] serves an axum `Router` whose large `Bytes`
//!   bodies go zero-copy, in one call; [`ZcIo`] and [`ZcBody`] do the same for hyper
//!   (`examples/axum_large_body.rs`, `examples/hyper_server.rs`).
//! * **Messages over UDP**: [`ZcUdpSocket`] — whole messages up to 1 MiB (configurable,
//!   [`MsgConfig`]), GSO out, GRO in, every message delivered whole or reported lost by id
//!   ([`MsgEvent`]); [`ZcUdpSocket::send_mark`] lets the receiver report a lost tail too
//!   (`examples/udp_messages.rs`).
//! * **When zero-copy pays, what is counted**: [`ZcConfig`], [`Policy`], [`Stats`].
//! * The guide, with measurements: `docs/tokio.md` in the repository; the blocking
//!   library underneath: the [`zcnet`] crate.
//!
//! # Cancelling a send
//!
//! A buffer the kernel may still read is never freed by a dropped future: the stream keeps
//! it until the completion. And a send dropped part-way — only some of its bytes queued,
//! which TCP will deliver — is never silent: the stream records how far it got
//! ([`Cancelled`]), and refuses every later write with [`StreamError::CancelledSend`] until
//! [`ZcStream::take_cancelled`] has been called. Continue from `queued`, or close:
//!
//! ```no_run
//! # async fn f(s: &mut zcnet_tokio::ZcStream, msg: bytes::Bytes) -> std::io::Result<()> {
//! use std::time::Duration;
//! if tokio::time::timeout(Duration::from_millis(10), s.send_bytes(msg.clone())).await.is_err() {
//!     let from = s.take_cancelled().map_or(0, |c| c.queued);
//!     s.send_bytes(msg.slice(from..)).await?;
//! }
//! # Ok(()) }
//! ```
//!
//! # What it does
//!
//! tokio has no zero-copy send; the io_uring runtimes that do make you leave tokio. This
//! crate adds `MSG_ZEROCOPY` to a tokio TCP stream with the ownership rules that make it
//! safe (kernel Documentation/networking/msg_zerocopy.rst):
//!
//! * [`ZcStream::send_zc`] takes an owned buffer (anything [`zcnet::Lend`]: `Vec<u8>`,
//!   `Box<[u8]>`, `Arc<[u8]>`, `bytes::Bytes`, `bytes::BytesMut`, zcnet's `TxBuf`) and
//!   gives it back only after the kernel's completion, saying how many bytes the kernel
//!   copied anyway;
//! * [`ZcStream::send_bytes`] returns as soon as a `Bytes` is queued and keeps one
//!   reference until the completion: `Bytes` is immutable, so that is safe without
//!   copy-on-write;
//! * [`ZcStream::recv_zc`] lends received pages mapped with `TCP_ZEROCOPY_RECEIVE` where
//!   the kernel can map them, copies where it cannot, within a bounded window;
//! * `AsyncRead`/`AsyncWrite` keep copy semantics, a drop-in for `tokio::net::TcpStream`;
//! * [`ZcUdpSocket`]: zcnet's whole messages over UDP ([`zcnet_msg`]) — GSO batches out
//!   with `MSG_ZEROCOPY` loans, `UDP_GRO` in, every lost message reported by id;
//! * [`ZcIo`] and [`ZcBody`] (feature `hyper`): an unmodified hyper server sends large
//!   `Bytes` body frames zero-copy; [`crate::axum`] (feature `axum`) does it for axum.
//!
//! Whether a send goes zero-copy is zcnet's [`zcnet::Policy`] per operation, and every
//! byte is counted in zcnet's [`zcnet::Stats`] (copied, zero-copy, copied anyway by the
//! kernel, fallbacks by reason). The completion bookkeeping is zcnet's
//! ([`zcnet::zc::Completions`]); the syscalls are `zcnet-sys`'s. This crate has no `unsafe`.
//!
//! Features: `hyper` and `axum` (default) for the HTTP glue.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(unreachable_pub)]

#[cfg(feature = "axum")]
mod axum_serve;
mod cancel;
mod choice;
mod config;
mod conn;
mod driver;
#[cfg(feature = "hyper")]
mod hyper_io;
mod loan;
mod readiness;
mod rx;
mod send;
mod split;
mod stream;
mod udp;

/// An axum `Router` served with zero-copy response bodies (feature `axum`, on by default):
/// [`crate::axum::serve`] in one call, or its pieces — [`ZcListener`] as an
/// `axum::serve::Listener`, [`crate::axum::ZcMakeService`], [`crate::axum::ZcBodyLayer`].
#[cfg(feature = "axum")]
pub mod axum {
    pub use crate::axum_serve::{serve, ZcBodyLayer, ZcBodyService, ZcMakeService};
}
pub use cancel::{Cancelled, StreamError};
pub use config::ZcConfig;
#[cfg(feature = "hyper")]
pub use hyper_io::{Lender, ZcBody, ZcIo};
pub use loan::leaked_loans;
pub use rx::RxChunk;
pub use send::Sent;
pub use split::{OwnedReadHalf, OwnedWriteHalf, ReuniteError};
pub use stream::{ZcListener, ZcStream};
pub use udp::{MsgSent, ZcUdpSocket};
pub use zcnet::{Lend, Policy, Stats, StatsSnapshot};
pub use zcnet_msg::{
    LossReason, Lost, Message, MsgBuf, MsgConfig, MsgEvent, MsgStats, MsgStatsSnapshot, MsgTx,
    ReassemblyLimits,
};
