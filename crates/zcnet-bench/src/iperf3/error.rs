//! What goes wrong speaking iperf3's protocol: a leaf, so every part of [`super`] can name it.

/// A malformed or unsupported message from an iperf3 peer.
#[derive(Debug, thiserror::Error)]
pub enum Iperf3Error {
    /// The connection failed or closed mid-message.
    #[error("{context}: {source}")]
    Io {
        /// What was being read or written.
        context: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The first 37 bytes were not a cookie (36 printable characters and a NUL).
    #[error("not an iperf3 cookie (36 printable characters and a NUL): {0}")]
    BadCookie(String),
    /// A state byte iperf3 does not define.
    #[error("unknown iperf3 state byte {0}")]
    UnknownState(i8),
    /// A JSON frame longer than the limit (`frame::MAX_FRAME`): its length, the limit.
    #[error("iperf3 JSON frame of {0} bytes is over the limit of {1}")]
    FrameTooLong(u32, u32),
    /// A JSON frame that does not parse, or is not an object.
    #[error("iperf3 JSON frame: {0}")]
    BadJson(String),
    /// A field missing or of the wrong type.
    #[error("iperf3 {what}: field {field:?} {problem}")]
    BadField {
        /// Which message.
        what: &'static str,
        /// Which field.
        field: &'static str,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A test this implementation does not run (UDP, SCTP, pacing, ...), by name.
    #[error("not supported by zcnet bench: {0}")]
    Unsupported(String),
    /// The peer reported an error: `SERVER_ERROR` with iperf3's error number and errno.
    #[error("the iperf3 server reported error {i_errno} (errno {errno})")]
    Remote {
        /// iperf3's `i_errno`.
        i_errno: i32,
        /// The server's `errno`.
        errno: i32,
    },
    /// A state that makes no sense at this point of the test.
    #[error("unexpected iperf3 state {got} while {during}")]
    Unexpected {
        /// The state received, by name.
        got: String,
        /// What the receiver was waiting for.
        during: &'static str,
    },
}

impl Iperf3Error {
    /// An I/O error with its context.
    pub fn io(context: &'static str) -> impl Fn(std::io::Error) -> Iperf3Error {
        move |source| Iperf3Error::Io { context, source }
    }
}
