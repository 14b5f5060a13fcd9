//! What a stream keeps while the kernel still references a buffer's pages.
//!
//! A `MSG_ZEROCOPY` send returns before the kernel has read the pages; the buffer must stay
//! alive and unchanged until the error queue's completion covers every call that named it
//! (kernel Documentation/networking/msg_zerocopy.rst). So the buffer moves into a [`Loan`]
//! held by the stream's completion bookkeeping, never by a future: a caller that stops
//! waiting (a dropped `send_zc` future, a dropped stream) does not take the memory with it.
//! If the socket goes away with loans still referenced, they are leaked, never freed:
//! freeing would hand pages the kernel may still transmit to the allocator for reuse.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use tokio::sync::oneshot;
use zcnet::Lend;

static LEAKED: AtomicU64 = AtomicU64::new(0);

/// Buffers this process leaked because their socket was gone (or the runtime shut down)
/// before the kernel's completion said the pages were free: memory given up rather than
/// reused while the kernel might still read it.
pub fn leaked_loans() -> u64 {
    LEAKED.load(Relaxed)
}

/// A buffer back from the kernel and whether the notification that freed it said the
/// kernel copied the data anyway (`SO_EE_CODE_ZEROCOPY_COPIED`).
pub(crate) type Returned<B> = (B, bool);

/// A `send_zc` caller's buffer, to be handed back on completion.
pub(crate) struct Waiting<B> {
    pub(crate) buf: B,
    pub(crate) back: oneshot::Sender<Returned<B>>,
}

/// Type-erased [`Waiting`].
pub(crate) trait Deliver: Send {
    /// The completion came: give the buffer back, or drop it if nobody waits any more.
    fn deliver(self: Box<Self>, copied: bool);
}

impl<B: Send> Deliver for Waiting<B> {
    fn deliver(self: Box<Self>, copied: bool) {
        // Err: the future was dropped; the buffer is dropped here, after the completion.
        let _ = self.back.send((self.buf, copied));
    }
}

/// One buffer the kernel may still read.
pub(crate) enum Loan {
    /// Someone waits for it ([`crate::ZcStream::send_zc`]).
    Waiting(Box<dyn Deliver>),
    /// Nobody waits: dropped on completion (a cancelled `send_zc`).
    Held(Box<dyn Lend>),
    /// A `send_bytes` (or hyper body) `Bytes`, dropped on completion: no allocation per send.
    Bytes(bytes::Bytes),
    /// A `send_lent` message buffer, back to its pool on completion: no allocation per
    /// message.
    Msg(zcnet_msg::MsgBuf),
}

impl std::fmt::Debug for Loan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Loan::Waiting(_) => f.write_str("Loan::Waiting"),
            Loan::Held(b) => write!(f, "Loan::Held({} bytes)", b.bytes().len()),
            Loan::Bytes(b) => write!(f, "Loan::Bytes({} bytes)", b.len()),
            Loan::Msg(m) => write!(f, "Loan::Msg({} bytes)", m.wire_len()),
        }
    }
}

impl Loan {
    /// The kernel is done with the pages.
    pub(crate) fn release(self, copied: bool) {
        match self {
            Loan::Waiting(w) => w.deliver(copied),
            Loan::Held(b) => drop(b),
            Loan::Bytes(b) => drop(b),
            Loan::Msg(m) => drop(m),
        }
    }

    /// The socket is gone with this loan still referenced: give the memory up.
    pub(crate) fn leak(self) {
        LEAKED.fetch_add(1, Relaxed);
        std::mem::forget(self);
    }
}
