//! Both ends of a transfer session over a zcnet [`Sender`]/[`Receiver`] pair: the control
//! frames go through the copy paths (they are tiny), the file data through the `file`
//! paths — `sendfile` out of the page cache, `splice` into the partial file — so it never
//! passes through a user buffer on either side.
//!
//! Hashing stays off the data path: the sender hashes the file from the page cache on a
//! second thread while the data is being sent; the receiver hashes each range of the
//! partial file on a second thread as it lands, while it is still in cache
//! ([`super::landing`]; skipped with `--no-verify`).
//!
//! The code is split by role: `send` is the sending end (handshake, the window of `Put`s,
//! one function per kind of [`Source`]), `recv` the receiving end (handshake, then one
//! handler per kind of frame), `range` both ends of a large file's ranges (version 6). Every
//! byte either end reads or writes passes through its channel (`send_channel`,
//! `recv_channel`): what carries a session's bytes is decided there and nowhere else. What a
//! protocol version carries is decided once, by `wire::Features`.
//!
//! [`Sender`]: zcnet::stream::Sender
//! [`Receiver`]: zcnet::stream::Receiver

mod range;
mod recv;
mod recv_channel;
mod send;
mod send_channel;

pub use super::wire::PIPELINED_FILES;
pub(crate) use recv::{not_encrypted, receive_files_over, session_id};
pub use recv::{receive_files, receive_files_ranged, receive_session};
pub use send::send_session;
pub(crate) use send::{send_entries, send_handshake};

use super::handshake::HandshakeError;
use super::tls::{Expect, Identity, TlsError, Trust};
use super::wire::{Code, Frame, WireError, MAX_PUT, VERSION};
use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::Arc;

/// Bytes per `send_file`/`recv_to_file` call: progress is reported between calls.
const STEP: u64 = 16 << 20;

/// Files of at most this many bytes go as version-2 `Put`s: read into memory and written
/// with their header and trailer, many to one `send`. Larger ones go by `sendfile` after a
/// `Ready`, where one round trip per file is noise next to the data.
pub(crate) const PUT_THRESHOLD: u64 = 256 << 10;
const _: () = assert!(PUT_THRESHOLD <= MAX_PUT);

/// Outstanding `Put`s (sent, not yet acknowledged) by default.
pub const DEFAULT_WINDOW: usize = 64;

/// Most outstanding `Put`s a sender may have. The sender reads answers when its window is
/// full, and whenever the socket will not take more `Put`s it reads those that arrived into
/// a buffer of its own (the sending channel's), so the receiver never blocks for long
/// writing answers while the sender blocks writing files, whatever the socket buffers hold:
/// 128 acks of at most `PUT_ACK_MESSAGE` bytes of text are under 70 KiB, which that buffer
/// always has room for.
pub const MAX_WINDOW: usize = 128;

/// Longest message in a `Put`'s `Ack` (the sender knows the name it sent).
const PUT_ACK_MESSAGE: usize = 512;

/// `File`s (sent by `sendfile`) whose `Ack` a version-7 sender may wait for at once on one
/// stream, besides its window of `Put`s. Each holds an open partial file at the receiver and
/// its unsynced bytes in the page cache; two are enough for a file's `fsync` to overlap the
/// next one's data, a few more absorb one slow `fsync` among quick files.
pub const FILES_AHEAD: usize = 4;

/// A session that could not go on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransferError {
    /// The connection failed.
    #[error(transparent)]
    Net(#[from] zcnet::Error),
    /// The peer sent something malformed.
    #[error("malformed message from the peer: {0}")]
    Wire(#[from] WireError),
    /// The peer sent a well-formed frame at the wrong time.
    #[error("protocol error: expected {expected}, got {got}")]
    Unexpected {
        /// What we waited for.
        expected: &'static str,
        /// What came.
        got: &'static str,
    },
    /// The peer speaks another protocol version.
    #[error("protocol version mismatch: we speak {ours}, the peer {theirs}")]
    Version {
        /// Ours.
        ours: u16,
        /// Theirs.
        theirs: u16,
    },
    /// Authentication failed (wrong or missing token).
    #[error("authentication failed: {0}")]
    Auth(String),
    /// The receiver's side of the handshake failed.
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    /// A file being sent got shorter while it was sent.
    #[error("{name:?} shrank while being sent: only {got} of its {expected} bytes could be read; the receiver keeps no final file")]
    Shrank {
        /// The file.
        name: String,
        /// Its size when the send began.
        expected: u64,
        /// Bytes sent before the end.
        got: u64,
    },
    /// A file being sent got longer while it was sent: the bytes announced are only a prefix
    /// of it, so the session ends before its trailer rather than present that prefix as the
    /// whole file.
    #[error("{name:?} grew while being sent: {expected} bytes when the send began, {now} at its end; not sent, the receiver keeps no final file")]
    Grew {
        /// The file.
        name: String,
        /// Its size when the send began (the size announced).
        expected: u64,
        /// Its size after the announced bytes were sent.
        now: u64,
    },
    /// The peer refused the whole session.
    #[error("refused by the receiver: {0}")]
    Refused(String),
    /// A local file could not be read or written.
    #[error("{what}: {source}")]
    Io {
        /// What we were doing.
        what: String,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// The connection ended in the middle of a file.
    #[error("the connection ended after {got} of {expected} bytes of {name:?}")]
    Truncated {
        /// The file.
        name: String,
        /// Bytes announced.
        expected: u64,
        /// Bytes that arrived.
        got: u64,
    },
    /// The TLS channel failed: the receiver's key refused, a record altered on the way, the
    /// connection cut without `close_notify`, or a peer that does not speak TLS.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The receiver does not encrypt and this sender does not send in the clear.
    #[error("{0}")]
    NotEncrypted(String),
    /// One of a session's further streams (version 5) failed; the others went on.
    #[error("stream {stream}: {source}")]
    Stream {
        /// Which (0 is the connection that opened the session).
        stream: usize,
        /// Why.
        #[source]
        source: Box<TransferError>,
    },
    /// The session's deadline (`--session-deadline`) passed while the receiver was working
    /// on its own (hashing a file already there for `--resume`): it stopped there, and
    /// nothing it had not finished was presented as final.
    #[error("the session's deadline passed while {what}; stopped, nothing of it made final")]
    DeadlinePassed {
        /// What the receiver was doing.
        what: String,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> TransferError {
    let what = what.into();
    move |source| TransferError::Io { what, source }
}

/// Decrypts into `buf` from `link`; 0 at the end of the stream, whether or not the peer
/// sent `close_notify`: the transfer protocol's own framing (sizes, trailers, `Bye`) is what
/// tells a whole session from a cut one, as it does in plaintext, so a cut reads as the
/// same end (naming the file it cut) rather than as a TLS error.
fn tls_read(link: &super::tls::TlsLink, buf: &mut [u8]) -> Result<usize, TransferError> {
    match link.read(buf) {
        Err(TlsError::Truncated) => Ok(0),
        r => Ok(r?),
    }
}

/// Who makes an encrypted connection's TLS records, decided right after its handshake
/// ([`super::tls::ktls::hand_over`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Carrier {
    /// The kernel (kTLS), with this cipher: the session reads and writes plaintext on the
    /// socket, `sendfile` and `splice` included.
    Kernel(&'static str),
    /// rustls, in user space, for this reason (counted as the fallback `ktls_unavailable`).
    User(String),
}

/// Notes in `report` who made the records ([`SessionReport::ktls`] or
/// [`SessionReport::kernel_tls`]).
pub(crate) fn note_carrier(carrier: Option<&Carrier>, report: &mut SessionReport) {
    match carrier {
        Some(Carrier::Kernel(cipher)) => report.kernel_tls = Some(cipher),
        Some(Carrier::User(why)) => report.ktls = Some(why.clone()),
        None => {}
    }
}

/// What an outcome is about: a file's bytes, or a tree entry that carries none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// A regular file or a stream.
    File,
    /// An empty directory (`Dir`).
    Dir,
    /// A symlink (`Link`).
    Link,
}

/// How one file ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileOutcome {
    /// What was sent.
    pub entry: Entry,
    /// Name as sent.
    pub name: String,
    /// Bytes of data that crossed the wire for it.
    pub bytes: u64,
    /// `Ok` when the receiver verified and renamed it; the refusal otherwise.
    pub result: Result<(), (Code, String)>,
    /// A BLAKE3 hash of the whole file was checked (false with `--no-verify`).
    pub verified: bool,
}

/// What a session did.
#[derive(Debug, Clone, Default)]
pub struct SessionReport {
    /// Per file, in order (at a receiver, failures past [`MAX_LISTED_FAILURES`] only
    /// counted in [`Self::unlisted_failures`]).
    pub files: Vec<FileOutcome>,
    /// At a sender over TLS: how the receiver's key was trusted (pinned, known, or
    /// recorded now on first use); `None` in plaintext.
    pub trust: Option<Trust>,
    /// Over TLS: why the connection's records stayed in user space rather than in the
    /// kernel (kTLS), counted as the fallback `ktls_unavailable`; `None` in plaintext and
    /// where the kernel took them.
    pub ktls: Option<String>,
    /// Over TLS: the cipher the kernel runs where it took the connection's records (kTLS);
    /// `None` in plaintext and where they stayed in user space.
    pub kernel_tls: Option<&'static str>,
    /// Failed files a receiver counted without listing them: a peer can have files refused
    /// as fast as it can ask (a `Range` past the caps costs it a few dozen bytes), and a
    /// list of every one would grow without bound (100 MiB in 30 s of issue 40's stress).
    pub unlisted_failures: usize,
}

impl FileOutcome {
    /// An entry that failed before any of its data moved.
    fn failed(entry: Entry, name: impl Into<String>, code: Code, message: String) -> Self {
        FileOutcome {
            entry,
            name: name.into(),
            bytes: 0,
            result: Err((code, message)),
            verified: false,
        }
    }
}

/// Failed files a receiving session lists in its report; the rest are counted.
pub const MAX_LISTED_FAILURES: usize = 1024;

impl SessionReport {
    /// Data bytes moved.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }

    /// Files that failed.
    pub fn failures(&self) -> usize {
        self.files.iter().filter(|f| f.result.is_err()).count() + self.unlisted_failures
    }

    /// Keeps the first [`MAX_LISTED_FAILURES`] failures listed and counts the others.
    fn bound_failures(&mut self) {
        let mut kept = 0;
        let before = self.files.len();
        self.files.retain(|f| {
            let keep = f.result.is_ok() || kept < MAX_LISTED_FAILURES;
            kept += usize::from(f.result.is_err() && keep);
            keep
        });
        self.unlisted_failures += before - self.files.len();
    }
}

/// Progress events for the CLI's bars.
#[derive(Debug, Clone)]
pub enum Progress<'a> {
    /// A file starts: name, size (`None`: stream), bytes already there (resume).
    Start(&'a str, Option<u64>, u64),
    /// `n` more bytes of the current file moved.
    Bytes(u64),
    /// The current file ended.
    Done(&'a FileOutcome),
}

/// What to send.
pub enum Source {
    /// A regular file.
    File {
        /// Where it is.
        path: PathBuf,
        /// The relative name the receiver gets.
        name: String,
    },
    /// An empty directory of a tree (version 3; an older receiver cannot create one, and
    /// the sender reports it as not delivered).
    Dir {
        /// Where it is.
        path: PathBuf,
        /// The relative name the receiver gets.
        name: String,
    },
    /// A symlink of a tree, sent as a symlink (version 3), never followed.
    Link {
        /// The relative name the receiver gets.
        name: String,
        /// Its target, as `readlink(2)` gave it.
        target: String,
    },
    /// One range of a large file (version 6): `offset..offset+len` of a file of `size`
    /// bytes, a node of its BLAKE3 tree ([`super::ranges::split`]); the file is final once all its
    /// ranges landed, on whichever streams of the session ([`super::streams`] makes these).
    Range {
        /// Where the file is.
        path: PathBuf,
        /// The relative name the receiver gets.
        name: String,
        /// First byte.
        offset: u64,
        /// Bytes.
        len: u64,
        /// The whole file's size when it was split.
        size: u64,
    },
    /// A stream of unknown length (stdin).
    Stream {
        /// Where the bytes come from.
        reader: Box<dyn Read + Send>,
        /// The name the receiver gets.
        name: String,
    },
}

/// Sender-side options.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SendOptions {
    /// Pre-shared token, if the receiver asks for one.
    pub token: Option<Vec<u8>>,
    /// Send a BLAKE3 hash per file (`--no-verify` turns it off).
    pub verify: bool,
    /// Small files sent before the oldest one's `Ack` must be read (1 to [`MAX_WINDOW`];
    /// [`DEFAULT_WINDOW`] by default).
    pub window: usize,
    /// Newest protocol version to speak (the receiver's, if older, wins): 1 turns
    /// pipelining off.
    pub max_version: u16,
    /// Whether to encrypt, and which receiver to trust.
    pub security: SendSecurity,
}

/// How a sender protects its connections.
///
/// The library's default is [`SendSecurity::Plaintext`]: a TLS sender must be told whom to
/// trust (a pinned fingerprint or a known-hosts file), and the library picks no file and no
/// key of its own. The `zcnet` tool encrypts by default ([`SendSecurity::Tls`] with its
/// known-hosts file or `--fingerprint`).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub enum SendSecurity {
    /// TLS 1.3 (protocol version 10), the receiver's key checked as [`Expect`] says; a
    /// receiver that does not encrypt is refused.
    Tls(Expect),
    /// No encryption; only a receiver that runs in plaintext takes it (an encrypting one
    /// refuses it with [`super::wire::ENCRYPTION_REQUIRED`]).
    #[default]
    Plaintext,
}

/// How a receiver protects its connections.
///
/// The library's default is [`RecvSecurity::Plaintext`], as for [`SendSecurity`]; the
/// `zcnet` tool encrypts by default with the identity kept in its state directory.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub enum RecvSecurity {
    /// TLS 1.3 (protocol version 10) with this identity: senders that do not encrypt are
    /// told [`super::wire::ENCRYPTION_REQUIRED`] and refused.
    Tls(Arc<Identity>),
    /// No encryption; a sender that encrypts is refused.
    #[default]
    Plaintext,
}

impl Default for SendOptions {
    fn default() -> Self {
        SendOptions {
            token: None,
            verify: false,
            window: DEFAULT_WINDOW,
            max_version: VERSION,
            security: SendSecurity::Plaintext,
        }
    }
}

/// Receiver-side options.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RecvOptions {
    /// Require senders to prove this token.
    pub token: Option<Vec<u8>>,
    /// Whether to encrypt, and with which identity.
    pub security: RecvSecurity,
}

/// Where a session's outcomes go: the report it returns and the caller's progress callback,
/// told in the same order.
struct Tally<'p> {
    progress: &'p mut dyn FnMut(Progress<'_>),
    report: SessionReport,
}

impl<'p> Tally<'p> {
    fn new(progress: &'p mut dyn FnMut(Progress<'_>)) -> Self {
        Tally {
            progress,
            report: SessionReport::default(),
        }
    }

    /// A file starts: name, size (`None`: stream), bytes already there.
    fn start(&mut self, name: &str, size: Option<u64>, at: u64) {
        (self.progress)(Progress::Start(name, size, at));
    }

    /// `n` more bytes of the current file moved (or were skipped as a hole).
    fn bytes(&mut self, n: u64) {
        (self.progress)(Progress::Bytes(n));
    }

    /// An entry ended: told to the callback, then listed in the report.
    fn done(&mut self, outcome: FileOutcome) {
        (self.progress)(Progress::Done(&outcome));
        self.report.files.push(outcome);
    }

    /// A range's outcome: listed, not told (it is its file's only with the others, which
    /// the caller merges).
    fn range_done(&mut self, outcome: FileOutcome) {
        self.report.files.push(outcome);
    }
}

fn unexpected(expected: &'static str, got: &Frame) -> TransferError {
    TransferError::Unexpected {
        expected,
        got: got.kind(),
    }
}

/// The hash a file's trailer carries, from the frame read where the trailer is due; a
/// receiver that verifies refuses a trailer without one.
fn trailer_hash(frame: Option<Frame>, verify: bool) -> Result<Option<[u8; 32]>, TransferError> {
    let hash = match frame {
        Some(Frame::Trailer { hash }) => hash,
        Some(other) => return Err(unexpected("trailer", &other)),
        None => {
            return Err(zcnet::Error::PeerClosed {
                op: "waiting for the trailer",
            }
            .into())
        }
    };
    if verify && hash.is_none() {
        return Err(TransferError::Unexpected {
            expected: "a trailer with a hash",
            got: "trailer without hash",
        });
    }
    Ok(hash)
}

/// The receiver's answer to a `File` or `Range`: where to start (and the hash of what it
/// has), or why not.
type Answer = Result<(u64, Option<[u8; 32]>), (Code, String)>;

/// The answer `frame` where a `Ready` or a `Refuse` is due.
fn ready_or_refuse(frame: Frame) -> Result<Answer, TransferError> {
    match frame {
        Frame::Ready { offset, prefix } => Ok(Ok((offset, prefix))),
        Frame::Refuse { code, message } => Ok(Err((code, message))),
        other => Err(unexpected("ready or refuse", &other)),
    }
}

/// The outcome of a file from the `Ack` (`frame`) due for it.
fn ack_outcome(
    frame: Frame,
    name: &str,
    bytes: u64,
    verified: bool,
) -> Result<FileOutcome, TransferError> {
    match frame {
        Frame::Ack { code, message, .. } => Ok(FileOutcome {
            entry: Entry::File,
            name: name.into(),
            bytes,
            verified: verified && code == Code::Ok,
            result: if code == Code::Ok {
                Ok(())
            } else {
                Err((code, message))
            },
        }),
        // Where an `Ack` is due a `Refuse` is the whole session's (a receiver at a limit
        // refuses after the sender's `Hello`, and a pipelined sender reads nothing before
        // its first window is out).
        Frame::Refuse { message, .. } => Err(TransferError::Refused(message)),
        other => Err(unexpected("ack", &other)),
    }
}

/// What the thread hashing `path` beside the data found (`None`: no hash was asked for).
fn join_hasher<T>(
    hasher: Option<std::thread::ScopedJoinHandle<'_, io::Result<T>>>,
    path: &std::path::Path,
) -> Result<Option<T>, TransferError> {
    match hasher {
        None => Ok(None),
        Some(h) => h
            .join()
            .map_err(|_| io_err("hashing")(io::Error::other("hasher thread panicked")))?
            .map(Some)
            .map_err(io_err(format!("hashing {}", path.display()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_lists_the_first_failures_and_counts_the_rest() {
        let outcome = |i: usize, ok: bool| FileOutcome {
            entry: Entry::File,
            name: format!("f{i}"),
            bytes: 1,
            result: if ok {
                Ok(())
            } else {
                Err((Code::Busy, "busy".into()))
            },
            verified: false,
        };
        let mut r = SessionReport::default();
        for i in 0..3000 {
            r.files.push(outcome(i, i % 300 == 0));
        }
        r.bound_failures();
        assert_eq!(r.failures(), 2990);
        assert_eq!(r.files.iter().filter(|f| f.result.is_ok()).count(), 10);
        assert_eq!(r.files.len(), 10 + MAX_LISTED_FAILURES);
        assert_eq!(r.unlisted_failures, 2990 - MAX_LISTED_FAILURES);
        // In their order, the first failures kept.
        assert_eq!(r.files[1].name, "f1");
    }
}
