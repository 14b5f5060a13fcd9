//! What a cancelled send left on a stream, kept where the next write can see it.
//!
//! An async send of a whole buffer (`send_zc`, `send_bytes`, `send_copy`) takes several
//! `send(2)` calls when the socket's send buffer fills, and a `select!` or a timeout may drop
//! its future between two of them. The bytes already queued cannot be taken back: TCP will
//! deliver them. A caller who went on writing as if nothing, or everything, had been sent
//! would corrupt the stream without noticing — and nothing could tell them which it was.
//! So the future's guard records here how many bytes of its buffer were queued, and, if
//! that is short of the whole buffer, every later write on the stream fails with
//! [`StreamError::CancelledSend`] until the caller has read the record
//! ([`crate::ZcStream::take_cancelled`]) and so knows where to continue.
//!
//! A send cancelled after every byte was queued (a `send_zc` waiting for its completion)
//! is recorded too, without refusing writes: the caller still learns that nothing is left
//! to send; the next send clears that record.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

/// How far a cancelled send got: `queued` of its `len` bytes were queued on the socket, in
/// order and before anything sent after, and will reach the peer as any sent byte does.
/// The caller continues with the buffer's bytes from `queued` on (none if `queued == len`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Cancelled {
    /// Bytes of the buffer queued before the future was dropped.
    pub queued: usize,
    /// The buffer's length.
    pub len: usize,
}

impl Cancelled {
    /// Whether part of the buffer (possibly all of it) was not queued: the stream refuses
    /// writes until the record is taken.
    pub fn is_partial(&self) -> bool {
        self.queued < self.len
    }

    /// The range of the buffer still to send, `queued..len`.
    pub fn rest(&self) -> std::ops::Range<usize> {
        self.queued..self.len
    }
}

/// A write a stream refused; carried inside the `io::Error` the write returns (kind
/// `Other`: `err.get_ref()` and `downcast_ref::<StreamError>()` recover it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// An earlier send was cancelled after queuing only part of its buffer; writes are
    /// refused until [`crate::ZcStream::take_cancelled`] (or the write half's) has said how
    /// much, so that the stream never carries a gap or a repeat its writer did not choose.
    #[error(
        "an earlier send was cancelled with {queued} of its {len} bytes queued: \
         writes are refused until take_cancelled() says where to continue"
    )]
    CancelledSend {
        /// Bytes of that buffer queued before it was cancelled.
        queued: usize,
        /// That buffer's length.
        len: usize,
    },
}

impl From<StreamError> for std::io::Error {
    fn from(e: StreamError) -> std::io::Error {
        std::io::Error::other(e)
    }
}

/// No record.
const NONE: u8 = 0;
/// A record of a send that queued everything: writes go on.
const WHOLE: u8 = 1;
/// A record of a send cut short: writes are refused.
const PARTIAL: u8 = 2;

/// One stream's record of its last cancelled send.
#[derive(Debug, Default)]
pub(crate) struct Record {
    /// [`NONE`], [`WHOLE`] or [`PARTIAL`]: read without the lock by every write.
    state: AtomicU8,
    last: Mutex<Option<Cancelled>>,
}

impl Record {
    /// A send's future was dropped after queuing `queued` of `len` bytes.
    pub(crate) fn cancelled(&self, queued: usize, len: usize) {
        let c = Cancelled { queued, len };
        let mut last = self.lock();
        *last = Some(c);
        let state = if c.is_partial() { PARTIAL } else { WHOLE };
        self.state.store(state, Ordering::Release);
    }

    /// Before a write: an error while a cut-short send is unread; a whole one's record is
    /// cleared (it can no longer describe the latest send). One atomic load when clear.
    #[inline]
    pub(crate) fn check(&self) -> Result<(), StreamError> {
        if self.state.load(Ordering::Acquire) == NONE {
            return Ok(());
        }
        self.check_slow()
    }

    #[cold]
    fn check_slow(&self) -> Result<(), StreamError> {
        let mut last = self.lock();
        match *last {
            Some(c) if c.is_partial() => Err(StreamError::CancelledSend {
                queued: c.queued,
                len: c.len,
            }),
            _ => {
                *last = None;
                self.state.store(NONE, Ordering::Release);
                Ok(())
            }
        }
    }

    /// The record, cleared: writes are allowed again.
    pub(crate) fn take(&self) -> Option<Cancelled> {
        let mut last = self.lock();
        self.state.store(NONE, Ordering::Release);
        last.take()
    }

    /// The record, left in place.
    pub(crate) fn peek(&self) -> Option<Cancelled> {
        *self.lock()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Cancelled>> {
        self.last.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_record_refuses_writes_until_taken() {
        let r = Record::default();
        assert!(r.check().is_ok());
        r.cancelled(10, 100);
        let e = r.check().unwrap_err();
        assert_eq!(
            e,
            StreamError::CancelledSend {
                queued: 10,
                len: 100
            }
        );
        assert!(e.to_string().contains("10 of its 100 bytes"));
        assert!(r.check().is_err(), "still refused: nobody took it");
        assert_eq!(
            r.peek(),
            Some(Cancelled {
                queued: 10,
                len: 100
            })
        );
        let c = r.take().unwrap();
        assert_eq!(c.rest(), 10..100);
        assert!(r.check().is_ok());
        assert_eq!(r.take(), None);
    }

    #[test]
    fn a_whole_record_allows_writes_and_is_cleared_by_the_next_one() {
        let r = Record::default();
        r.cancelled(100, 100);
        assert_eq!(
            r.peek(),
            Some(Cancelled {
                queued: 100,
                len: 100
            })
        );
        assert!(r.check().is_ok());
        assert_eq!(r.peek(), None, "the next write clears it");
        r.cancelled(0, 5);
        assert!(r.check().is_err(), "nothing queued is cut short too");
    }
}
