//! Lending your own memory: any owned, immutable-while-lent buffer can be sent zero-copy,
//! not only a [`crate::TxBuf`] from zcnet's pool — so an in-memory shard, a `Vec` you built,
//! or one `Arc<[u8]>` shared by many connections goes out without first being copied into
//! pool buffers.
//!
//! The buffer is moved in and kept until the kernel's `MSG_ZEROCOPY` completion says its
//! pages are free; then zcnet drops it. For an `Arc` (or `bytes::Bytes`, with the `bytes`
//! feature) that only releases one reference, so the same immutable bytes can be lent to
//! many senders at once and the caller gets sole ownership back (`Arc::try_unwrap`) once
//! every sender has flushed. A sender dropped with loans still in flight leaks them rather
//! than free memory the kernel may still read.

use crate::buf::TxBuf;
use std::ops::Deref;
use std::sync::Arc;

/// Memory that can be lent to the kernel for a zero-copy send.
///
/// The contract (not a memory-safety one: the kernel holds its own page references) is that
/// the bytes [`Lend::bytes`] returns stay the same while the loan is held — which owned,
/// immutable types give for free. The bytes on the wire are the bytes at the time of the
/// send only if nothing writes them before the completion.
pub trait Lend: Send + 'static {
    /// The bytes to send.
    fn bytes(&self) -> &[u8];
}

impl Lend for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl Lend for Box<[u8]> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl Lend for Arc<[u8]> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl Lend for Arc<Vec<u8>> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl Lend for &'static [u8] {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl Lend for TxBuf {
    fn bytes(&self) -> &[u8] {
        self
    }
}

#[cfg(feature = "bytes")]
impl Lend for bytes::Bytes {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// A `BytesMut` moved in cannot be written while lent: the loan owns it.
#[cfg(feature = "bytes")]
impl Lend for bytes::BytesMut {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// A mapped file (feature `memmap2`): the page cache's own pages go to the kernel, no copy
/// and no read into a buffer first. `memmap2::Mmap::map` is `unsafe` for the caller because
/// a file truncated or rewritten while mapped breaks `&[u8]`'s promise; the same contract
/// holds for as long as the loan does.
#[cfg(feature = "memmap2")]
impl Lend for memmap2::Mmap {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// One mapping lent to many senders at once.
#[cfg(feature = "memmap2")]
impl Lend for Arc<memmap2::Mmap> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// A loan a transmit path holds until its completion: a pool buffer, or the caller's own.
#[derive(Debug)]
pub(crate) enum Lent {
    /// A [`TxBuf`]: back to its pool when dropped.
    Pool(TxBuf),
    /// The caller's memory: dropped when done.
    Owned(Owned),
}

/// A caller's buffer behind the [`Lend`] trait.
pub(crate) struct Owned(pub(crate) Box<dyn Lend>);

impl std::fmt::Debug for Owned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Owned({} bytes)", self.0.bytes().len())
    }
}

impl Lent {
    /// The socket is gone with this loan still referenced: never recycle memory the kernel
    /// may still read. A pool buffer is unmapped and counted as retired; the caller's
    /// memory is leaked.
    pub(crate) fn retire(self) {
        match self {
            Lent::Pool(b) => b.retire(),
            Lent::Owned(o) => std::mem::forget(o),
        }
    }
}

impl Deref for Lent {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Lent::Pool(b) => b,
            Lent::Owned(o) => o.0.bytes(),
        }
    }
}
