//! Errors that reach the caller: only when the I/O itself failed. Declined fast paths are
//! not errors; they are fallbacks counted in [`crate::Stats`].

use std::io;
use std::time::Duration;

/// A failed send, receive or set-up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A syscall failed; `op` names what we were doing.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The peer closed the connection while we were sending (`EPIPE`).
    #[error("{op}: the peer closed the connection")]
    PeerClosed {
        /// What was being done.
        op: &'static str,
    },
    /// The peer reset the connection (`ECONNRESET`).
    #[error("{op}: the connection was reset by the peer")]
    Reset {
        /// What was being done.
        op: &'static str,
    },
    /// The call's timeout ran out: the config's, or the `SO_SNDTIMEO`/`SO_RCVTIMEO` a
    /// wrapped socket came with. It bounds the whole call (every syscall and wait in it),
    /// not each step. A send says how much of it went out first, so the caller resumes
    /// from there instead of sending those bytes twice.
    #[error("{op}: timed out after {after:?} ({queued} bytes of this call queued)")]
    Timeout {
        /// What was being done.
        op: &'static str,
        /// How long the call ran before it gave up: the timeout, plus the moment it took
        /// to notice.
        after: Duration,
        /// Bytes of this call the kernel took before time ran out (always 0 for a receive,
        /// an accept or a wait for completions).
        queued: u64,
    },
    /// The socket is non-blocking (`O_NONBLOCK`, set by the caller) and the call would have
    /// had to wait: `queued` bytes of this call went out first (always 0 for a receive).
    /// Try again when the socket is ready (poll it through `AsFd`), from byte `queued` on:
    /// every path, receive and send, stops without losing or repeating a byte.
    #[error("{op}: the non-blocking socket would block ({queued} bytes of this call queued)")]
    WouldBlock {
        /// What was being done.
        op: &'static str,
        /// Bytes of this call the kernel took before it would have blocked.
        queued: u64,
    },
    /// No transmit buffer came back to the pool in time: the kernel still holds every one,
    /// typically because the receiver stopped reading.
    #[error("no transmit buffer came back within {0:?}: all are still held by the kernel (is the receiver reading?)")]
    PoolExhausted(Duration),
    /// A loaned buffer is larger than the pool's buffers or from another pool.
    #[error("buffer does not belong to this sender's pool")]
    ForeignBuffer,
    /// The kernel reported a completion range that matches no call in flight.
    #[error("inconsistent zero-copy completion: {0}")]
    Completion(#[from] RangeError),
    /// A stream or a file ended before the requested range was complete: the peer closed
    /// early (receive), or the file was shorter than it claimed or was truncated under us
    /// (send). `got` bytes did go through; never a silently short transfer.
    #[error("{op} ended after {got} of {expected} bytes")]
    Truncated {
        /// What ended early ("the file being sent", "the stream").
        op: &'static str,
        /// Bytes asked for.
        expected: u64,
        /// Bytes that went through before the end.
        got: u64,
    },
    /// A file range that goes past the end of the file; nothing was sent.
    #[error("file range {offset}..{} is beyond the end of the file ({file_len} bytes)", offset.saturating_add(*len))]
    RangeBeyondEof {
        /// First byte asked for.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// The file's size.
        file_len: u64,
    },
    /// The socket cannot carry a zcnet stream: `from_stream` takes a connected TCP socket
    /// (IPv4 or IPv6) and refuses anything else (a Unix-domain stream, a datagram socket)
    /// rather than copy through it silently.
    #[error("unsuitable socket: {0}")]
    UnsuitableSocket(String),
    /// The file cannot be used as asked (opened `O_APPEND`, where positional writes append;
    /// an offset past the largest `off_t`).
    #[error("unsuitable file: {0}")]
    UnsuitableFile(&'static str),
}

impl Error {
    /// A timed-out operation's error, with nothing of it queued yet (public for the
    /// transports built on this crate's pool and policy: zcnet-msg's senders).
    pub fn timeout(op: &'static str, after: Duration) -> Error {
        Error::Timeout {
            op,
            after,
            queued: 0,
        }
    }

    /// Bytes of the failed call that went out first, where the error says so
    /// ([`Error::Timeout`], [`Error::WouldBlock`]).
    pub fn queued(&self) -> Option<u64> {
        match self {
            Error::Timeout { queued, .. } | Error::WouldBlock { queued, .. } => Some(*queued),
            _ => None,
        }
    }

    /// This error with `queued` set to the bytes a whole call queued: paths count only
    /// their own last syscall, the API counts the call.
    pub(crate) fn with_queued(self, n: u64) -> Error {
        match self {
            Error::Timeout { op, after, .. } => Error::Timeout {
                op,
                after,
                queued: n,
            },
            Error::WouldBlock { op, .. } => Error::WouldBlock { op, queued: n },
            e => e,
        }
    }

    /// Classifies an OS error from operation `op`.
    pub fn io(op: &'static str, e: io::Error) -> Error {
        match e.raw_os_error() {
            Some(libc::EPIPE) => Error::PeerClosed { op },
            Some(libc::ECONNRESET) => Error::Reset { op },
            _ => Error::Io { op, source: e },
        }
    }
}

/// Shorthand.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// For callers in `io::Result` code (an `io::Write` impl, a `?` in a function returning
/// `io::Result`): the kind says what happened, and the zcnet error rides along as the
/// source, so nothing is lost. An OS error keeps its own kind (and errno).
impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        let kind = match &e {
            Error::Io { source, .. } => source.kind(),
            Error::PeerClosed { .. } => io::ErrorKind::BrokenPipe,
            Error::Reset { .. } => io::ErrorKind::ConnectionReset,
            Error::Timeout { .. } => io::ErrorKind::TimedOut,
            Error::WouldBlock { .. } => io::ErrorKind::WouldBlock,
            // Every buffer is still the kernel's: try again once the peer reads.
            Error::PoolExhausted(_) => io::ErrorKind::WouldBlock,
            Error::ForeignBuffer
            | Error::RangeBeyondEof { .. }
            | Error::UnsuitableFile(_)
            | Error::UnsuitableSocket(_) => io::ErrorKind::InvalidInput,
            Error::Truncated { .. } => io::ErrorKind::UnexpectedEof,
            Error::Completion(_) => io::ErrorKind::Other,
        };
        match e {
            Error::Io { source, .. } if source.raw_os_error().is_some() => source,
            e => io::Error::new(kind, e),
        }
    }
}

/// A notification that does not fit the calls in flight: a kernel or bookkeeping bug that
/// must be reported, not papered over.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "completion range {lo}..={hi} is outside the calls in flight (oldest {oldest}, next {next})"
)]
pub struct RangeError {
    /// First id of the offending range.
    pub lo: u32,
    /// Last id of the offending range.
    pub hi: u32,
    /// Oldest outstanding id (low 32 bits).
    pub oldest: u32,
    /// Next id to be assigned (low 32 bits).
    pub next: u32,
}
