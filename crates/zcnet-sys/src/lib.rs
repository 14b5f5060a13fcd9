//! zcnet-sys: the only crate of zcnet with `unsafe` code. It decides nothing.
//!
//! Two kinds of module live here, and nothing else:
//!
//! * [`raw`] — thin, typed forwards to one syscall each (the rustix style): they take
//!   `BorrowedFd`s, return `io::Result`, retry nothing, and carry the kernel ABI constants and
//!   structs that libc lacks (Debian's uapi headers are older than the kernels we run on).
//!   Where rustix has the call, the wrapper forwards to rustix.
//! * The owners of memory the kernel touches, whose safety depends on lifetimes that only a
//!   type can enforce: [`mem`] (page-aligned, pre-faulted buffers), [`uring`] (SEND_ZC rings,
//!   provided-buffer rings, the zero-copy receive area), [`xsk`] (AF_XDP UMEM and rings) and
//!   [`cow`] (write protection of pages in flight: the userfaultfd and SIGSEGV engines).
//! * [`board`] — the file every process of one `zcnet run` maps shared, where the preload
//!   library keeps its counters; [`reentry`] — which threads run zcnet's own code, whose C
//!   calls an interposer must pass straight to the C library.
//! * With feature `tokio`, `reactor`: an owned descriptor registered with tokio's reactor
//!   (tokio made that registration `unsafe`; for an `OwnedFd` it is sound by construction).
//!
//! Policy (when to retry, when to fall back, what to count) lives in the `zcnet` crate, which
//! is `#![forbid(unsafe_code)]`.
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]
#![warn(unreachable_pub)]

pub mod board;
pub mod cow;
pub mod mem;
#[doc(hidden)]
pub mod peak_alloc;
#[cfg(feature = "preload")]
pub mod preload;
pub mod raw;
#[cfg(feature = "tokio")]
pub mod reactor;
pub mod reentry;
#[doc(hidden)]
pub mod testing;
pub mod uring;
pub mod xsk;
