//! zcnet-tokio: zero-copy TCP sends for tokio, on tokio's own reactor — no second runtime,
//! no thread per connection.
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
//! * [`ZcUdpSocket`]: zcnet's whole messages over UDP (`zcnet::msg`) — GSO batches out
//!   with `MSG_ZEROCOPY` loans, `UDP_GRO` in, every lost message reported by id;
//! * [`ZcIo`] and [`ZcBody`] (feature `hyper`): an unmodified hyper server sends large
//!   `Bytes` body frames zero-copy (`examples/hyper_server.rs`).
//!
//! Whether a send goes zero-copy is zcnet's [`zcnet::Policy`] per operation, and every
//! byte is counted in zcnet's [`zcnet::Stats`] (copied, zero-copy, copied anyway by the
//! kernel, fallbacks by reason). The completion bookkeeping is zcnet's
//! (`zcnet::zc::completion`); the syscalls are `zcnet-sys`'s. This crate has no `unsafe`.
//!
//! See `docs/tokio.md` for when it pays and what the host must allow.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

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
