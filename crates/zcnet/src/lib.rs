//! zcnet: zero-copy network I/O for Linux.
//!
//! The library moves bytes between application buffers and TCP sockets with as few CPU copies
//! as the kernel allows, and falls back to copying whenever a fast path's conditions fail —
//! always counting the fallback in [`Stats`], never hiding it.
//!
//! * Transmit: [`Sender`] over the `copy` path (`send(2)`) or the `zerocopy` path
//!   (`MSG_ZEROCOPY` with completions read from the socket error queue).
//! * Receive: [`Receiver`] over the `copy` path (`recv(2)`) or the `mmap` path
//!   (`TCP_ZEROCOPY_RECEIVE` into a mapping of the socket).
//! * Files: [`Sender::send_file`] (`sendfile(2)`, or `splice(2)` file → pipe → socket) and
//!   [`Receiver::recv_to_file`] (`splice(2)` socket → pipe → file), with read+send and
//!   recv+pwrite as counted fallbacks.
//!
//! Ownership is the API (see `docs/ARCHITECTURE.md`): [`Sender::send`] takes a [`TxBuf`] by
//! value and the buffer goes back to its [`Pool`] only when the kernel's completion covers it;
//! [`Sender::send_slice`] keeps copy semantics. [`Receiver::recv`] lends an [`RxChunk`] whose
//! mapped pages are released when it is dropped.
//!
//! `unsafe` code lives in [`sys`] only.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod bench;
pub mod buf;
pub mod completion;
pub mod conn;
pub mod cow;
pub mod cpu;
pub mod error;
pub mod netns;
pub mod policy;
pub mod probe;
pub mod rx;
pub mod stats;
pub mod sys;
pub mod transfer;
pub mod tx;

pub use buf::{Pool, TxBuf};
pub use conn::{Receiver, ReceiverConfig, Sender, SenderConfig};
pub use error::Error;
pub use policy::Policy;
pub use rx::file::FileRxMode;
pub use rx::{RxChunk, RxPath};
pub use stats::{FallbackReason, Stats, StatsSnapshot};
pub use tx::file::FileTxMode;
pub use tx::TxPath;
