//! Both ends of a transfer session over a zcnet [`Sender`]/[`Receiver`] pair: the control
//! frames go through the copy paths (they are tiny), the file data through the `file`
//! paths — `sendfile` out of the page cache, `splice` into the partial file — so it never
//! passes through a user buffer on either side.
//!
//! Hashing stays off the data path: the sender hashes the file from the page cache on a
//! second thread while the data is being sent; the receiver hashes each range of the
//! partial file on a second thread as it lands, while it is still in cache
//! ([`super::landing`]; skipped with `--no-verify`).

use super::auth::{self, Role};
use super::digest::{hash_range, prefix_state};
use super::finish::{Finished, Finisher, Staged};
use super::handshake::{HandshakeError, ReceiverHandshake, StreamRequest};
use super::landing::{LandingHash, LAND_STEP};
use super::ranges::{self, FileMeta, Landed, RangedFiles};
use super::sparse;
use super::store::{self, Refusal, Store};
use super::wire::{
    Code, Frame, WireError, AUTHENTICATED_FROM, MAX_CONTROL, MAX_DATA, MAX_PUT, MIN_VERSION,
    SESSION_ID_LEN, STREAM_SIZE, VERSION,
};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use zcnet::stream::{Receiver, Sender};

/// Bytes per `send_file`/`recv_to_file` call: progress is reported between calls.
const STEP: u64 = 16 << 20;

/// Files of at most this many bytes go as version-2 `Put`s: read into memory and written
/// with their header and trailer, many to one `send`. Larger ones go by `sendfile` after a
/// `Ready`, where one round trip per file is noise next to the data.
pub(crate) const PUT_THRESHOLD: u64 = 256 << 10;
const _: () = assert!(PUT_THRESHOLD <= MAX_PUT);

/// `Put` bytes gathered before one write: small enough that the receiver starts on the
/// first files while the sender reads the next ones.
const BATCH: usize = 64 << 10;

/// Outstanding `Put`s (sent, not yet acknowledged) by default.
pub const DEFAULT_WINDOW: usize = 64;

/// Most outstanding `Put`s a sender may have. The sender reads answers when its window is
/// full, and whenever the socket will not take more `Put`s it reads those that arrived into
/// a buffer of its own (`Answers`), so the receiver never blocks for long writing answers
/// while the sender blocks writing files, whatever the socket buffers hold: 128 acks of at
/// most `PUT_ACK_MESSAGE` bytes of text are under 70 KiB, which that buffer always has
/// room for.
pub const MAX_WINDOW: usize = 128;

/// Longest message in a `Put`'s `Ack` (the sender knows the name it sent).
const PUT_ACK_MESSAGE: usize = 512;

/// The first version whose `File`s are pipelined: the sender sends the next file as soon as
/// a `File`'s trailer is out, and its `Ack` comes later, in order with the other answers
/// (the receiver finishes it on the thread that finishes `Put`s).
pub const PIPELINED_FILES: u16 = 7;

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
    /// One of a session's further streams (version 5) failed; the others went on.
    #[error("stream {stream}: {source}")]
    Stream {
        /// Which (0 is the connection that opened the session).
        stream: usize,
        /// Why.
        #[source]
        source: Box<TransferError>,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> TransferError {
    let what = what.into();
    move |source| TransferError::Io { what, source }
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
    /// Failed files a receiver counted without listing them: a peer can have files refused
    /// as fast as it can ask (a `Range` past the caps costs it a few dozen bytes), and a
    /// list of every one would grow without bound (100 MiB in 30 s of issue 40's stress).
    pub unlisted_failures: usize,
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
    /// bytes, a node of its BLAKE3 tree ([`ranges::split`]); the file is final once all its
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
}

impl Default for SendOptions {
    fn default() -> Self {
        SendOptions {
            token: None,
            verify: false,
            window: DEFAULT_WINDOW,
            max_version: VERSION,
        }
    }
}

/// Receiver-side options.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RecvOptions {
    /// Require senders to prove this token.
    pub token: Option<Vec<u8>>,
}

// ---- control-frame I/O ------------------------------------------------------------------

fn sock_read_exact(tx: &Sender, buf: &mut [u8]) -> Result<(), TransferError> {
    let fd = tx.socket();
    let sock = socket2::SockRef::from(&fd);
    (&*sock).read_exact(buf).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            zcnet::Error::PeerClosed {
                op: "reading the receiver's answer",
            }
            .into()
        } else {
            zcnet::Error::io("reading the receiver's answer", e).into()
        }
    })
}

fn read_frame_from_sender_side(tx: &Sender) -> Result<Frame, TransferError> {
    let mut h = [0u8; 5];
    sock_read_exact(tx, &mut h)?;
    let (ty, len) = Frame::check_header(h)?;
    let mut p = vec![0u8; len];
    sock_read_exact(tx, &mut p)?;
    Ok(Frame::decode(ty, &p)?)
}

fn rx_read_exact(rx: &mut Receiver, buf: &mut [u8]) -> Result<bool, TransferError> {
    let mut off = 0;
    while off < buf.len() {
        let n = rx.recv_into(&mut buf[off..])?;
        if n == 0 {
            if off == 0 {
                return Ok(false);
            }
            return Err(zcnet::Error::PeerClosed {
                op: "reading a frame",
            }
            .into());
        }
        off += n;
    }
    Ok(true)
}

/// Reads one frame on the receiving side; `None` at a clean end of stream between frames.
fn read_frame_receiver_side(rx: &mut Receiver) -> Result<Option<Frame>, TransferError> {
    let mut h = [0u8; 5];
    if !rx_read_exact(rx, &mut h)? {
        return Ok(None);
    }
    let (ty, len) = Frame::check_header(h)?;
    let mut p = vec![0u8; len];
    if !rx_read_exact(rx, &mut p)? && len > 0 {
        return Err(zcnet::Error::PeerClosed {
            op: "reading a frame",
        }
        .into());
    }
    Ok(Some(Frame::decode(ty, &p)?))
}

fn reply(rx: &Receiver, f: &Frame) -> Result<(), TransferError> {
    reply_bytes(rx, &f.to_bytes())
}

fn reply_bytes(rx: &Receiver, bytes: &[u8]) -> Result<(), TransferError> {
    let fd = rx.socket();
    let sock = socket2::SockRef::from(&fd);
    (&*sock)
        .write_all(bytes)
        .map_err(|e| zcnet::Error::io("answering the sender", e).into())
}

/// Turns Nagle's algorithm off (`TCP_NODELAY`, tcp(7)). Every control frame is small and
/// the peer's next step waits for it: with Nagle on, a frame written while earlier bytes are
/// unacknowledged waits for the peer's delayed ACK (40 ms on Linux), which made a tree of
/// small files cost about that much per file.
fn no_delay(fd: std::os::fd::BorrowedFd<'_>) -> Result<(), TransferError> {
    socket2::SockRef::from(&fd)
        .set_tcp_nodelay(true)
        .map_err(|e| zcnet::Error::io("setsockopt(TCP_NODELAY)", e).into())
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

// ---- sender ------------------------------------------------------------------------------

/// Runs a whole session from the sending side: handshake, every source in order, goodbye.
/// A file the receiver refuses or fails to verify is reported and the session goes on; a
/// failure of the connection itself ends it.
pub fn send_session(
    tx: &mut Sender,
    sources: Vec<Source>,
    opts: &SendOptions,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<SessionReport, TransferError> {
    let (version, _) = send_handshake(tx, opts, StreamRequest::Open(1))?;
    send_entries(tx, version, sources, opts, progress)
}

/// The sender's handshake: `Hello`, the token's proof both ways, and from version 5 the
/// connection's place in its session (`stream`: `Open` or `Join`, sent right behind our
/// `Hello`/`Auth` so it costs no round trip of its own). Returns the session's version and,
/// from version 5, the session id the receiver answered with.
pub(crate) fn send_handshake(
    tx: &mut Sender,
    opts: &SendOptions,
    stream: StreamRequest,
) -> Result<(u16, Option<[u8; SESSION_ID_LEN]>), TransferError> {
    no_delay(tx.socket())?;
    // Handshake: the receiver speaks first.
    let (auth_required, rnonce, theirs) = match read_frame_from_sender_side(tx)? {
        Frame::Hello {
            version,
            auth,
            nonce,
        } => {
            if version < MIN_VERSION {
                return Err(TransferError::Version {
                    ours: VERSION,
                    theirs: version,
                });
            }
            (auth, nonce, version)
        }
        Frame::Refuse { message, .. } => return Err(TransferError::Refused(message)),
        other => return Err(unexpected("hello", &other)),
    };
    // The newest version both speak: a version-1 receiver is served one file at a time.
    let version = theirs.min(VERSION).min(opts.max_version).max(MIN_VERSION);
    if let (true, Some(_)) = (auth_required, &opts.token) {
        if version < AUTHENTICATED_FROM {
            // Before version 8 the proofs do not cover the version: a `Hello` lowered on
            // the way would pass unseen, so the token is not proved in such a session.
            return Err(TransferError::Auth(format!(
                "the receiver speaks protocol version {theirs} and this sender {version}; with a token both ends need version {AUTHENTICATED_FROM} or later, where the proofs cover the version and every field of the handshake (upgrade zcnet at the receiver)"
            )));
        }
    }
    let snonce = auth::nonce().map_err(io_err("reading random bytes"))?;
    let receiver_hello = Frame::Hello {
        version: theirs,
        auth: auth_required,
        nonce: rnonce,
    }
    .to_bytes();
    let sender_hello = Frame::Hello {
        version,
        auth: opts.token.is_some(),
        nonce: snonce,
    }
    .to_bytes();
    tx.send_slice(&sender_hello)?;
    if opts.token.is_some() && !auth_required {
        // The receiver must prove the token too: one that does not ask for it cannot, and
        // may be anyone listening on that address.
        return Err(TransferError::Auth(
            "the receiver did not ask for the token, so it cannot prove it knows it; refusing to send to it".into(),
        ));
    }
    let join = match stream {
        _ if version < 5 => None,
        StreamRequest::Open(n) => Some(Frame::Open { streams: n }),
        StreamRequest::Join(session) => Some(Frame::Join { session }),
        StreamRequest::Single => Some(Frame::Open { streams: 1 }),
    };
    let join_bytes = join.as_ref().map(Frame::to_bytes).unwrap_or_default();
    // Both proofs cover the handshake as this end saw and sent it (version 8).
    let transcript = auth::transcript(&receiver_hello, &sender_hello, &join_bytes);
    if auth_required {
        let token = opts.token.as_deref().ok_or_else(|| {
            TransferError::Auth("the receiver requires a token (--token or ZCNET_TOKEN)".into())
        })?;
        let mac = auth::prove(token, Role::Sender, &transcript);
        tx.send_slice(&Frame::Auth { mac }.to_bytes())?;
    }
    if !join_bytes.is_empty() {
        tx.send_slice(&join_bytes)?;
    }
    if let (true, Some(token)) = (auth_required, opts.token.as_deref()) {
        match read_frame_from_sender_side(tx)? {
            Frame::Auth { mac } if auth::verify(token, Role::Receiver, &transcript, &mac) => {}
            Frame::Auth { .. } => {
                return Err(TransferError::Auth(
                    "the receiver could not prove it knows the token".into(),
                ))
            }
            Frame::Refuse { message, .. } => return Err(TransferError::Auth(message)),
            other => return Err(unexpected("auth", &other)),
        }
    }
    if join.is_none() {
        return Ok((version, None));
    }
    match read_frame_from_sender_side(tx)? {
        Frame::Session { id } => Ok((version, Some(id))),
        Frame::Refuse { message, .. } => Err(TransferError::Refused(message)),
        other => Err(unexpected("session", &other)),
    }
}

/// Sends `sources` over a connection past its handshake, then says goodbye.
pub(crate) fn send_entries(
    tx: &mut Sender,
    version: u16,
    sources: Vec<Source>,
    opts: &SendOptions,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<SessionReport, TransferError> {
    let mut report = SessionReport::default();
    let mut pipe = Pipeline {
        pending: VecDeque::new(),
        files_out: 0,
        batch: Vec::new(),
        window: opts.window.clamp(1, MAX_WINDOW),
        answers: Answers::new(),
    };
    for src in sources {
        if let (true, Source::File { path, name }) = (version >= 2, &src) {
            match read_small(path)? {
                Small::Read(data, meta) => {
                    pipe.put(tx, name, data, &meta, opts, progress, &mut report)?;
                    continue;
                }
                Small::Changed { expected, got } => {
                    // Never announce a size the bytes do not have: this file fails here.
                    pipe.drain(tx, progress, &mut report)?;
                    let outcome = FileOutcome {
                        entry: Entry::File,
                        name: name.clone(),
                        bytes: 0,
                        result: Err((
                            Code::Length,
                            format!("{} changed size while being read ({expected} bytes, then {got}); not sent", path.display()),
                        )),
                        verified: false,
                    };
                    progress(Progress::Done(&outcome));
                    report.files.push(outcome);
                    continue;
                }
                Small::Large => {}
            }
        }
        if let (true, Source::File { path, name }) = (version >= PIPELINED_FILES, &src) {
            // Version 7: answers to earlier files may still be due; only the window of
            // files is bounded.
            pipe.flush(tx)?;
            while pipe.files_out >= FILES_AHEAD {
                pipe.settle_one(tx, progress, &mut report)?;
            }
            let sent = send_one_file(
                tx,
                path,
                name,
                opts,
                version,
                progress,
                &mut pipe,
                &mut report,
            )?;
            match sent {
                Sent::Refused(outcome) => {
                    progress(Progress::Done(&outcome));
                    report.files.push(outcome);
                }
                Sent::Trailer { bytes, verified } => pipe.push(name, bytes, verified, true),
            }
            continue;
        }
        // A large file or a stream waits for its own `Ready`: every answer before it first.
        pipe.drain(tx, progress, &mut report)?;
        if let Source::Range {
            path,
            name,
            offset,
            len,
            size,
        } = &src
        {
            // A range's outcome is its file's only with the others: the caller merges them.
            let o = send_range(tx, path, name, (*offset, *len, *size), opts, progress)?;
            report.files.push(o);
            continue;
        }
        let outcome = match src {
            Source::Range { .. } => unreachable!("sent above"),
            Source::Dir { path, name } => send_dir(tx, &path, &name, version)?,
            Source::Link { name, target } => send_link(tx, &name, target, version)?,
            Source::File { path, name } => {
                match send_one_file(
                    tx,
                    &path,
                    &name,
                    opts,
                    version,
                    progress,
                    &mut pipe,
                    &mut report,
                )? {
                    Sent::Refused(outcome) => outcome,
                    Sent::Trailer { bytes, verified } => {
                        ack_outcome(pipe.answers.frame(tx)?, &name, bytes, verified)?
                    }
                }
            }
            Source::Stream { reader, name } => send_stream(tx, reader, &name, opts, progress)?,
        };
        progress(Progress::Done(&outcome));
        report.files.push(outcome);
    }
    pipe.drain(tx, progress, &mut report)?;
    tx.send_slice(&Frame::Bye.to_bytes())?;
    match read_frame_from_sender_side(tx)? {
        Frame::Bye => Ok(report),
        other => Err(unexpected("bye", &other)),
    }
}

/// A small file read whole, or why it is not sent as a `Put`.
enum Small {
    /// Its bytes (at most [`PUT_THRESHOLD`]) and the metadata taken before reading them.
    Read(Vec<u8>, std::fs::Metadata),
    /// Larger than [`PUT_THRESHOLD`]: sent by `sendfile`.
    Large,
    /// Fewer or more bytes were read than its size said.
    Changed { expected: u64, got: u64 },
}

fn read_small(path: &std::path::Path) -> Result<Small, TransferError> {
    // The error's words are formatted only if there is an error (once per file otherwise:
    // a few percent of the sender's CPU on a tree of small files).
    let err = |what: &'static str| {
        move |source| TransferError::Io {
            what: format!("{what} {}", path.display()),
            source,
        }
    };
    let file = File::open(path).map_err(err("opening"))?;
    let meta = file.metadata().map_err(err("reading"))?;
    if meta.len() > PUT_THRESHOLD {
        return Ok(Small::Large);
    }
    // One `read` of one byte more than the size: a regular file returns fewer bytes than
    // asked only at its end (read(2)), so getting exactly its size ends the reading; one
    // more byte means it grew. Anything shorter reads on to the end.
    let mut data = vec![0u8; meta.len() as usize + 1];
    let got = loop {
        match (&file).read(&mut data) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => break r.map_err(err("reading"))?,
        }
    };
    data.truncate(got);
    if got as u64 != meta.len() && got > 0 {
        // Changed (or a short read): how long it is now, up to the limit.
        (&file)
            .take(PUT_THRESHOLD + 1 - got as u64)
            .read_to_end(&mut data)
            .map_err(err("reading"))?;
    }
    Ok(match data.len() as u64 {
        n if n == meta.len() => Small::Read(data, meta),
        n if n > PUT_THRESHOLD => Small::Large,
        n => Small::Changed {
            expected: meta.len(),
            got: n,
        },
    })
}

/// The sender's window of `Put`s: sent (or gathered in `batch`) and not yet acknowledged,
/// oldest first. The receiver answers in order, so the front is the next `Ack`'s file.
struct Pipeline {
    /// Per outstanding file, oldest first: name, bytes, whether a hash went with it, and
    /// whether it was a `File` (version 7) rather than a `Put`.
    pending: VecDeque<(String, u64, bool, bool)>,
    /// How many of `pending` are `File`s ([`FILES_AHEAD`] at most).
    files_out: usize,
    /// Encoded `Put`s not yet written.
    batch: Vec<u8>,
    window: usize,
    /// Answers read ahead: many `Ack`s per `recv`.
    answers: Answers,
}

impl Pipeline {
    #[allow(clippy::too_many_arguments)]
    fn put(
        &mut self,
        tx: &mut Sender,
        name: &str,
        data: Vec<u8>,
        meta: &std::fs::Metadata,
        opts: &SendOptions,
        progress: &mut dyn FnMut(Progress<'_>),
        report: &mut SessionReport,
    ) -> Result<(), TransferError> {
        let size = data.len() as u64;
        let hash = opts.verify.then(|| *blake3::hash(&data).as_bytes());
        Frame::Put {
            name: name.into(),
            size,
            mode: meta.mode() & 0o7777,
            mtime_s: meta.mtime(),
            mtime_ns: meta.mtime_nsec() as u32,
            verify: opts.verify,
        }
        .encode(&mut self.batch);
        self.batch.extend_from_slice(&data);
        Frame::Trailer { hash }.encode(&mut self.batch);
        progress(Progress::Bytes(size));
        self.push(name, size, hash.is_some(), false);
        if self.batch.len() >= BATCH {
            self.flush(tx)?;
        }
        if self.pending.len() >= self.window {
            // Full: read answers down to half the window, so the next batch carries many
            // files again instead of one file per answer.
            self.flush(tx)?;
            while self.pending.len() > self.window / 2 {
                self.settle_one(tx, progress, report)?;
            }
        }
        Ok(())
    }

    /// Writes the gathered `Put`s. While the socket will not take more, it reads whatever
    /// answers have arrived into [`Answers`] (they always fit there: a window's worth is
    /// under 70 KiB): otherwise, with socket buffers too small for a window's answers, the
    /// receiver could block writing answers nobody reads while this end blocks writing
    /// files it no longer reads — a deadlock no buffer size should be able to cause.
    fn flush(&mut self, tx: &mut Sender) -> Result<(), TransferError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let fd = tx.socket();
        let sock = socket2::SockRef::from(&fd);
        let timeout = sock
            .write_timeout()
            .map_err(|e| zcnet::Error::io("reading SO_SNDTIMEO", e))?;
        let mut off = 0;
        while off < self.batch.len() {
            match sock.send_with_flags(&self.batch[off..], libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
            {
                Ok(n) => off += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let readable = self.answers.wait(&sock, timeout)?;
                    if readable {
                        self.answers.take_in(&sock)?;
                    }
                }
                Err(e) => return Err(zcnet::Error::io("sending files", e).into()),
            }
        }
        tx.stats().add_tx_copy_bytes(off as u64);
        self.batch.clear();
        Ok(())
    }

    /// One more file whose `Ack` is due.
    fn push(&mut self, name: &str, bytes: u64, verified: bool, file: bool) {
        self.pending
            .push_back((name.to_string(), bytes, verified, file));
        self.files_out += usize::from(file);
    }

    /// The receiver's answer to a `File` just sent. From version 7 the `Ack`s of earlier
    /// files may come first (the receiver finishes them on another thread): they are
    /// settled on the way, in order. A refusal waits for every earlier answer, so the report
    /// stays in sending order.
    fn answer(
        &mut self,
        tx: &mut Sender,
        progress: &mut dyn FnMut(Progress<'_>),
        report: &mut SessionReport,
    ) -> Result<Answer, TransferError> {
        loop {
            match self.answers.frame(tx)? {
                Frame::Ready { offset, prefix } => return Ok(Ok((offset, prefix))),
                Frame::Refuse { code, message } => {
                    while !self.pending.is_empty() {
                        self.settle_one(tx, progress, report)?;
                    }
                    return Ok(Err((code, message)));
                }
                ack @ Frame::Ack { .. } if !self.pending.is_empty() => {
                    self.settle_with(ack, progress, report)?
                }
                other => return Err(unexpected("ready or refuse", &other)),
            }
        }
    }

    fn settle_one(
        &mut self,
        tx: &mut Sender,
        progress: &mut dyn FnMut(Progress<'_>),
        report: &mut SessionReport,
    ) -> Result<(), TransferError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let f = self.answers.frame(tx)?;
        self.settle_with(f, progress, report)
    }

    /// The oldest outstanding file's answer is `frame`.
    fn settle_with(
        &mut self,
        frame: Frame,
        progress: &mut dyn FnMut(Progress<'_>),
        report: &mut SessionReport,
    ) -> Result<(), TransferError> {
        let Some((name, bytes, verified, file)) = self.pending.pop_front() else {
            return Ok(());
        };
        self.files_out -= usize::from(file);
        let outcome = ack_outcome(frame, &name, bytes, verified)?;
        progress(Progress::Done(&outcome));
        report.files.push(outcome);
        Ok(())
    }

    /// Writes what is gathered and reads every outstanding answer.
    fn drain(
        &mut self,
        tx: &mut Sender,
        progress: &mut dyn FnMut(Progress<'_>),
        report: &mut SessionReport,
    ) -> Result<(), TransferError> {
        self.flush(tx)?;
        while !self.pending.is_empty() {
            self.settle_one(tx, progress, report)?;
        }
        if let Some(f) = self.answers.held()? {
            // Nothing is due from the receiver before our next frame.
            return Err(unexpected("nothing after the last answer", &f));
        }
        Ok(())
    }
}

/// The receiver's answers to a window of `Put`s (and, from version 7, of `File`s), read
/// ahead of need. Only those are ever outstanding while it is used (every other frame waits
/// for the window to drain), and the receiver says nothing unasked, so all it can hold is
/// their `Ack`s, a `File`'s `Ready` or `Refuse`, or a refusal that ends the session; after
/// the last, it must be empty.
struct Answers {
    buf: Vec<u8>,
    lo: usize,
    hi: usize,
}

impl Answers {
    fn new() -> Self {
        Answers {
            buf: vec![0; 2 * (5 + MAX_CONTROL)],
            lo: 0,
            hi: 0,
        }
    }

    fn fill(&mut self, tx: &Sender, n: usize) -> Result<(), TransferError> {
        while self.hi - self.lo < n {
            if self.buf.len() - self.lo < n {
                self.buf.copy_within(self.lo..self.hi, 0);
                self.hi -= self.lo;
                self.lo = 0;
            }
            let fd = tx.socket();
            let got = match (&*socket2::SockRef::from(&fd)).read(&mut self.buf[self.hi..]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => r.map_err(|e| zcnet::Error::io("reading the receiver's answer", e))?,
            };
            if got == 0 {
                return Err(zcnet::Error::PeerClosed {
                    op: "reading the receiver's answer",
                }
                .into());
            }
            self.hi += got;
        }
        Ok(())
    }

    fn frame(&mut self, tx: &Sender) -> Result<Frame, TransferError> {
        self.fill(tx, 5)?;
        let h: [u8; 5] = self.buf[self.lo..self.lo + 5].try_into().expect("5 bytes");
        let (ty, len) = Frame::check_header(h)?;
        if len > MAX_CONTROL {
            return Err(TransferError::Unexpected {
                expected: "an answer",
                got: "data",
            });
        }
        self.fill(tx, 5 + len)?;
        let f = Frame::decode(ty, &self.buf[self.lo + 5..self.lo + 5 + len]);
        self.lo += 5 + len;
        Ok(f?)
    }

    /// Room for more answers, once what is held moves to the front.
    fn room(&mut self) -> usize {
        if self.lo > 0 {
            self.buf.copy_within(self.lo..self.hi, 0);
            self.hi -= self.lo;
            self.lo = 0;
        }
        self.buf.len() - self.hi
    }

    /// Waits until `sock` takes more bytes (`false`) or, while there is room here, has
    /// answers to read (`true`); `timeout` (the socket's send timeout) bounds the wait.
    fn wait(
        &mut self,
        sock: &socket2::SockRef<'_>,
        timeout: Option<std::time::Duration>,
    ) -> Result<bool, TransferError> {
        use rustix::event::{PollFd, PollFlags};
        let mut flags = PollFlags::OUT;
        if self.room() > 0 {
            flags |= PollFlags::IN;
        }
        let mut fds = [PollFd::from_borrowed_fd(
            std::os::fd::AsFd::as_fd(&**sock),
            flags,
        )];
        let limit = timeout.map(|t| {
            rustix::event::Timespec::try_from(t).unwrap_or(rustix::event::Timespec {
                tv_sec: i64::MAX,
                tv_nsec: 0,
            })
        });
        let n = loop {
            match rustix::event::poll(&mut fds, limit.as_ref()) {
                Err(rustix::io::Errno::INTR) => continue,
                r => break r.map_err(|e| zcnet::Error::io("waiting to send", e.into()))?,
            }
        };
        if n == 0 {
            return Err(zcnet::Error::io(
                "sending files",
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the receiver took nothing for {:?}",
                        timeout.unwrap_or_default()
                    ),
                ),
            )
            .into());
        }
        let got = fds[0].revents();
        Ok(got.intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR))
    }

    /// Reads the answers that have arrived, without waiting.
    fn take_in(&mut self, sock: &socket2::SockRef<'_>) -> Result<(), TransferError> {
        let room = self.room();
        let hi = self.hi;
        // `poll` said there are bytes (or an end): this `read` does not wait.
        match (&**sock).read(&mut self.buf[hi..hi + room]) {
            Ok(0) => Err(zcnet::Error::PeerClosed {
                op: "reading the receiver's answer",
            }
            .into()),
            Ok(n) => {
                self.hi += n;
                Ok(())
            }
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted =>
            {
                Ok(())
            }
            Err(e) => Err(zcnet::Error::io("reading the receiver's answer", e).into()),
        }
    }

    /// A whole frame already read (the receiver spoke out of turn), if any.
    fn held(&mut self) -> Result<Option<Frame>, TransferError> {
        if self.lo == self.hi {
            return Ok(None);
        }
        if self.hi - self.lo < 5 {
            return Err(TransferError::Unexpected {
                expected: "nothing after the last answer",
                got: "bytes",
            });
        }
        let h: [u8; 5] = self.buf[self.lo..self.lo + 5].try_into().expect("5 bytes");
        let (ty, len) = Frame::check_header(h)?;
        if self.hi - self.lo < 5 + len {
            return Err(TransferError::Unexpected {
                expected: "nothing after the last answer",
                got: "bytes",
            });
        }
        Ok(Some(Frame::decode(
            ty,
            &self.buf[self.lo + 5..self.lo + 5 + len],
        )?))
    }
}

/// The receiver's answer to a `File`: where to start (and the hash of what it has), or why not.
type Answer = Result<(u64, Option<[u8; 32]>), (Code, String)>;

fn await_answer(tx: &Sender) -> Result<Answer, TransferError> {
    match read_frame_from_sender_side(tx)? {
        Frame::Ready { offset, prefix } => Ok(Ok((offset, prefix))),
        Frame::Refuse { code, message } => Ok(Err((code, message))),
        other => Err(unexpected("ready or refuse", &other)),
    }
}

fn await_ack(
    tx: &Sender,
    name: &str,
    bytes: u64,
    verified: bool,
) -> Result<FileOutcome, TransferError> {
    ack_outcome(read_frame_from_sender_side(tx)?, name, bytes, verified)
}

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

/// An empty directory: a `Dir` frame and its `Ack` (version 3), or a failure that says the
/// receiver is too old to create one.
fn send_dir(
    tx: &mut Sender,
    path: &std::path::Path,
    name: &str,
    version: u16,
) -> Result<FileOutcome, TransferError> {
    if version < 3 {
        return Ok(FileOutcome {
            entry: Entry::Dir,
            name: name.into(),
            bytes: 0,
            result: Err((
                Code::Version,
                format!("the receiver speaks protocol version {version}, which cannot create an empty directory (3 can); not created"),
            )),
            verified: false,
        });
    }
    let meta =
        std::fs::symlink_metadata(path).map_err(io_err(format!("reading {}", path.display())))?;
    tx.send_slice(
        &Frame::Dir {
            name: name.into(),
            mode: meta.mode() & 0o777,
        }
        .to_bytes(),
    )?;
    let mut o = await_ack(tx, name, 0, false)?;
    o.entry = Entry::Dir;
    Ok(o)
}

/// A symlink: a `Link` frame and its `Ack` (version 3), or a failure that says the receiver
/// is too old to create one.
fn send_link(
    tx: &mut Sender,
    name: &str,
    target: String,
    version: u16,
) -> Result<FileOutcome, TransferError> {
    if version < 3 {
        return Ok(FileOutcome {
            entry: Entry::Link,
            name: name.into(),
            bytes: 0,
            result: Err((
                Code::Version,
                format!("the receiver speaks protocol version {version}, which cannot create a symlink (3 can); not created"),
            )),
            verified: false,
        });
    }
    tx.send_slice(
        &Frame::Link {
            name: name.into(),
            target,
        }
        .to_bytes(),
    )?;
    let mut o = await_ack(tx, name, 0, false)?;
    o.entry = Entry::Link;
    Ok(o)
}

/// How far [`send_one_file`] took a file.
enum Sent {
    /// The receiver refused it before any data.
    Refused(FileOutcome),
    /// Its bytes and trailer are out; its `Ack` is due.
    Trailer {
        /// Bytes sent (from the offset it resumed at).
        bytes: u64,
        /// A hash went with it.
        verified: bool,
    },
}

/// One file by `sendfile`: `File`, the receiver's answer (read through `pipe`, which
/// settles the answers to earlier files that come first), `Start`, the bytes, `Trailer`.
/// The `Ack` is left to the caller: read at once, or from version 7 in turn with the rest.
#[allow(clippy::too_many_arguments)]
fn send_one_file(
    tx: &mut Sender,
    path: &std::path::Path,
    name: &str,
    opts: &SendOptions,
    version: u16,
    progress: &mut dyn FnMut(Progress<'_>),
    pipe: &mut Pipeline,
    report: &mut SessionReport,
) -> Result<Sent, TransferError> {
    let file = File::open(path).map_err(io_err(format!("opening {}", path.display())))?;
    let meta = file
        .metadata()
        .map_err(io_err(format!("reading {}", path.display())))?;
    let size = meta.len();
    tx.send_slice(
        &Frame::File {
            name: name.into(),
            size,
            mode: meta.mode() & 0o7777,
            mtime_s: meta.mtime(),
            mtime_ns: meta.mtime_nsec() as u32,
            verify: opts.verify,
        }
        .to_bytes(),
    )?;
    let (offer, prefix) = match pipe.answer(tx, progress, report)? {
        Ok(v) => v,
        Err(refused) => {
            return Ok(Sent::Refused(FileOutcome {
                entry: Entry::File,
                name: name.into(),
                bytes: 0,
                result: Err(refused),
                verified: false,
            }))
        }
    };
    // Resume only from a prefix that really is ours; its hash state is where the whole
    // file's hash goes on from, so the prefix is read once.
    let (start, kept) = match prefix {
        Some(p) if offer > 0 && offer <= size => match prefix_state(&file, offer) {
            Ok(mine) if *mine.finalize().as_bytes() == p => (offer, Some(mine)),
            _ => (0, None),
        },
        _ => (0, None),
    };
    // Holes are not sent (version 4): only the data extents, back to back.
    let extents = match version >= 4 {
        true => sparse::data_extents(&file, start, size)
            .map_err(io_err(format!("finding the holes of {}", path.display())))?,
        false => None,
    };
    let ranges = match extents {
        Some(extents) => {
            tx.send_slice(
                &Frame::StartSparse {
                    offset: start,
                    extents: extents.clone(),
                }
                .to_bytes(),
            )?;
            extents
        }
        None => {
            tx.send_slice(&Frame::Start { offset: start }.to_bytes())?;
            vec![(start, size - start)]
        }
    };
    progress(Progress::Start(name, Some(size), start));
    let hash = std::thread::scope(|s| -> Result<Option<[u8; 32]>, TransferError> {
        // The hash is computed from the page cache on another thread, off the data path.
        let hasher = opts.verify.then(|| {
            s.spawn(|| {
                let mut h = kept.unwrap_or_default();
                hash_range(&file, &mut h, start, size).map(|()| *h.finalize().as_bytes())
            })
        });
        let shrank = |got| TransferError::Shrank {
            name: name.into(),
            expected: size,
            got,
        };
        let mut done = start;
        for &(from, len) in &ranges {
            // A hole before this extent: counted, not sent.
            progress(Progress::Bytes(from - done));
            let (mut off, end) = (from, from + len);
            while off < end {
                let n = match tx.send_file(&file, off, (end - off).min(STEP)) {
                    Ok(n) => n,
                    Err(zcnet::Error::Truncated { got, .. }) => return Err(shrank(off + got)),
                    Err(zcnet::Error::RangeBeyondEof { .. }) => return Err(shrank(off)),
                    Err(e) => return Err(e.into()),
                };
                if n == 0 {
                    return Err(shrank(off));
                }
                off += n;
                progress(Progress::Bytes(n));
            }
            done = end;
        }
        progress(Progress::Bytes(size - done));
        // `sendfile` stops at the announced size, so a file appended to meanwhile would
        // arrive cut short yet verified (the hash covers the same prefix): fail it instead.
        let now = file
            .metadata()
            .map_err(io_err(format!("reading {}", path.display())))?
            .len();
        if now > size {
            return Err(TransferError::Grew {
                name: name.into(),
                expected: size,
                now,
            });
        }
        match hasher {
            None => Ok(None),
            Some(h) => h
                .join()
                .map_err(|_| io_err("hashing")(io::Error::other("hasher thread panicked")))?
                .map(Some)
                .map_err(io_err(format!("hashing {}", path.display()))),
        }
    })?;
    let verified = hash.is_some();
    tx.send_slice(&Frame::Trailer { hash }.to_bytes())?;
    Ok(Sent::Trailer {
        bytes: size - start,
        verified,
    })
}

fn send_stream(
    tx: &mut Sender,
    mut reader: Box<dyn Read + Send>,
    name: &str,
    opts: &SendOptions,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<FileOutcome, TransferError> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    tx.send_slice(
        &Frame::File {
            name: name.into(),
            size: STREAM_SIZE,
            mode: 0o644,
            mtime_s: now.as_secs() as i64,
            mtime_ns: now.subsec_nanos(),
            verify: opts.verify,
        }
        .to_bytes(),
    )?;
    if let Err(refused) = await_answer(tx)? {
        return Ok(FileOutcome {
            entry: Entry::File,
            name: name.into(),
            bytes: 0,
            result: Err(refused),
            verified: false,
        });
    }
    tx.send_slice(&Frame::Start { offset: 0 }.to_bytes())?;
    progress(Progress::Start(name, None, 0));
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; MAX_DATA.min(1 << 20)];
    let mut total = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err(format!("reading {name}"))(e)),
        };
        h.update(&buf[..n]);
        tx.send_slice(&Frame::Data(buf[..n].to_vec()).to_bytes())?;
        total += n as u64;
        progress(Progress::Bytes(n as u64));
    }
    tx.send_slice(&Frame::EndData.to_bytes())?;
    let hash = opts.verify.then(|| *h.finalize().as_bytes());
    let verified = hash.is_some();
    tx.send_slice(&Frame::Trailer { hash }.to_bytes())?;
    await_ack(tx, name, total, verified)
}

// ---- receiver ----------------------------------------------------------------------------

/// Runs a whole session from the receiving side until the sender says goodbye: the
/// handshake ([`ReceiverHandshake`], reading nothing larger than handshake frames before the
/// proof), then [`receive_files`].
pub fn receive_session(
    rx: &mut Receiver,
    store: &mut Store,
    opts: &RecvOptions,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<SessionReport, TransferError> {
    no_delay(rx.socket())?;
    let mut hs =
        ReceiverHandshake::new(opts.token.clone()).map_err(io_err("reading random bytes"))?;
    reply_bytes(rx, &hs.greeting())?;
    let accepted = loop {
        let want = hs.want();
        if !rx_read_exact(rx, want)? {
            return Err(zcnet::Error::PeerClosed { op: "handshake" }.into());
        }
        let n = want.len();
        match hs.advance(n) {
            Ok(Some(a)) => break a,
            Ok(None) => {}
            Err(e) => {
                if let Some(f) = e.refusal() {
                    let _ = reply(rx, &f);
                }
                return Err(e.into());
            }
        }
    };
    if let Some(r) = &accepted.reply {
        reply_bytes(rx, r)?;
    }
    match accepted.stream {
        StreamRequest::Single => {}
        // One connection serves one session here: its id is never presented again, and
        // the sender's further streams are turned away (`server` joins them).
        StreamRequest::Open(_) => reply(rx, &Frame::Session { id: session_id()? })?,
        StreamRequest::Join(_) => {
            let message = "this receiver takes one connection per session; nothing to join";
            let _ = reply(
                rx,
                &Frame::Refuse {
                    code: Code::NoSession,
                    message: message.into(),
                },
            );
            return Err(TransferError::Refused(message.into()));
        }
    }
    receive_files(rx, store, accepted.version, progress)
}

/// A fresh random session id (`Session`, version 5).
pub(crate) fn session_id() -> Result<[u8; SESSION_ID_LEN], TransferError> {
    let n = auth::nonce().map_err(io_err("reading random bytes"))?;
    Ok(n[..SESSION_ID_LEN].try_into().expect("32 >= 16"))
}

/// The file part of a receiving session, after the handshake. Files that fail a check are
/// refused or acknowledged with the reason and the session goes on; a connection that ends
/// inside a file leaves only its partial file (its reserved space released) and returns
/// [`TransferError::Truncated`].
///
/// `version` is the one the sender chose in its `Hello`: `Put`s are accepted from 2 on.
pub fn receive_files(
    rx: &mut Receiver,
    store: &mut Store,
    version: u16,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<SessionReport, TransferError> {
    receive_files_ranged(rx, store, version, &RangedFiles::default(), progress)
}

/// [`receive_files`] for one stream of a session whose streams share `ranged`, the files
/// arriving by ranges (version 6) over any of them.
pub fn receive_files_ranged(
    rx: &mut Receiver,
    store: &mut Store,
    version: u16,
    ranged: &RangedFiles,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<SessionReport, TransferError> {
    std::thread::scope(|scope| receive_files_in(scope, rx, store, version, ranged, progress))
}

fn receive_files_in<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    rx: &mut Receiver,
    store: &mut Store,
    version: u16,
    ranged: &RangedFiles,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<SessionReport, TransferError> {
    let mut report = SessionReport::default();
    let mut ahead = ReadAhead::new();
    let mut finisher: Option<Finisher> = None;
    // The list is bounded whenever it has doubled (so the cost per file stays constant):
    // failures beyond the first ones are counted, not listed.
    let mut bound_at = 2 * MAX_LISTED_FAILURES;
    loop {
        if report.files.len() >= bound_at {
            report.bound_failures();
            bound_at = (2 * report.files.len()).max(2 * MAX_LISTED_FAILURES);
        }
        let frame = match ahead.frame(rx)? {
            Some(f) => f,
            None => {
                return Err(zcnet::Error::PeerClosed {
                    op: "waiting for the next file",
                }
                .into())
            }
        };
        // From version 7 a `File` is answered in turn too: its `Ready` goes out at once,
        // its `Ack` after those of the files before it.
        let in_turn = matches!(frame, Frame::Put { .. })
            || (version >= PIPELINED_FILES && matches!(frame, Frame::File { .. }));
        if !in_turn {
            // Every earlier answer goes out before whatever this frame asks for.
            if let Some(f) = finisher.take() {
                report_finished(f.settle(), progress, &mut report)?;
            }
        }
        let (name, size, mode, mtime_s, mtime_ns, verify) = match frame {
            Frame::Bye => {
                reply(rx, &Frame::Bye)?;
                return Ok(report);
            }
            Frame::File {
                name,
                size,
                mode,
                mtime_s,
                mtime_ns,
                verify,
            } => (name, size, mode, mtime_s, mtime_ns, verify),
            Frame::Put {
                name,
                size,
                mode,
                mtime_s,
                mtime_ns,
                verify,
            } if version >= 2 => {
                let staged = receive_put(
                    rx,
                    &mut ahead,
                    store,
                    name,
                    size,
                    mode,
                    (mtime_s, mtime_ns),
                    verify,
                )?;
                progress(Progress::Bytes(size));
                finish_in_turn(scope, rx, &mut finisher, staged, progress, &mut report)?;
                continue;
            }
            Frame::Dir { name, mode } if version >= 3 => {
                let result = store.make_dir(&name, mode);
                answer_entry(rx, Entry::Dir, name, result, progress, &mut report)?;
                continue;
            }
            Frame::Link { name, target } if version >= 3 => {
                let result = store.make_link(&name, &target);
                answer_entry(rx, Entry::Link, name, result, progress, &mut report)?;
                continue;
            }
            Frame::Range {
                name,
                size,
                mode,
                mtime_s,
                mtime_ns,
                verify,
                offset,
                len,
            } if version >= 6 => {
                if !ahead.is_empty() {
                    return Err(TransferError::Unexpected {
                        expected: "nothing before our answer to a range",
                        got: "bytes sent ahead of it",
                    });
                }
                let meta = FileMeta {
                    size,
                    mode,
                    mtime: (mtime_s, mtime_ns),
                    verify,
                };
                receive_range(
                    rx,
                    store,
                    ranged,
                    name,
                    meta,
                    (offset, len),
                    progress,
                    &mut report,
                )?;
                continue;
            }
            other => return Err(unexpected("file or bye", &other)),
        };
        if !ahead.is_empty() {
            // A `File` waits for its `Ready`: bytes behind it are a peer out of step (and
            // would be lost to the splice that reads the data).
            return Err(TransferError::Unexpected {
                expected: "nothing before our answer to a file",
                got: "bytes sent ahead of it",
            });
        }
        let announced = (size != STREAM_SIZE).then_some(size);
        let mut inc = match store.begin(&name, announced, verify) {
            Ok(i) => i,
            Err(Refusal { code, message }) => {
                reply_beside(
                    rx,
                    finisher.as_ref(),
                    &Frame::Refuse {
                        code,
                        message: message.clone(),
                    },
                )?;
                let outcome = FileOutcome {
                    entry: Entry::File,
                    name,
                    bytes: 0,
                    result: Err((code, message)),
                    verified: false,
                };
                progress(Progress::Done(&outcome));
                report.files.push(outcome);
                continue;
            }
        };
        reply_beside(
            rx,
            finisher.as_ref(),
            &Frame::Ready {
                offset: inc.offset(),
                prefix: inc.prefix(),
            },
        )?;
        let mut extents = None;
        let start = match read_frame_receiver_side(rx)? {
            Some(Frame::Start { offset }) => offset,
            Some(Frame::StartSparse {
                offset,
                extents: list,
            }) if version >= 4 && announced.is_some() => {
                let size = announced.unwrap_or(0);
                sparse::check_extents(&list, offset, size)?;
                extents = Some(list);
                offset
            }
            Some(Frame::Abort { message }) => {
                // As the protocol says: the file's data is discarded, its space released.
                inc.discard();
                let outcome = FileOutcome {
                    entry: Entry::File,
                    name,
                    bytes: 0,
                    result: Err((Code::Io, format!("the sender gave up: {message}"))),
                    verified: false,
                };
                progress(Progress::Done(&outcome));
                report.files.push(outcome);
                continue;
            }
            Some(other) => return Err(unexpected("start", &other)),
            None => {
                return Err(zcnet::Error::PeerClosed {
                    op: "waiting for data",
                }
                .into())
            }
        };
        if start != inc.offset() {
            if start != 0 {
                return Err(TransferError::Unexpected {
                    expected: "start at the offered offset or at 0",
                    got: "start elsewhere",
                });
            }
            if let Err(r) = inc.restart() {
                return Err(io_err("restarting")(io::Error::other(r.message)));
            }
        }
        progress(Progress::Start(&name, announced, start));
        let mut got = 0u64;
        let data_result: Result<(), Refusal> = match announced {
            Some(size) => {
                let sparse_file = extents.is_some();
                let ranges = match extents {
                    Some(x) => {
                        // Holes stay unwritten: the space reserved for them goes back.
                        sparse::unreserve(inc.file());
                        x
                    }
                    None => vec![(start, size - start)],
                };
                // Verified as it lands; without a hasher (it could not start) the check
                // reads the file back instead. Holes read back as zeros, so the landing
                // hash may run over them once the data after them has landed.
                let landing = if verify {
                    match inc.take_prefix_state() {
                        Some((kept, h)) if kept == start => {
                            LandingHash::resume(inc.file(), kept, h)
                        }
                        _ => LandingHash::start(inc.file()),
                    }
                    .ok()
                } else {
                    None
                };
                let step = if landing.is_some() { LAND_STEP } else { STEP };
                // The store reserved the whole file when it began. On tmpfs a second
                // `fallocate` per range walks every page again and zeroes the reserved ones
                // (0.1 CPU-s/GiB at the receiver); on ext4 it sets the size once per range
                // instead of write by write, which costs less than it saves.
                rx.set_file_preallocate(!inc.on_tmpfs());
                // The store reserved a first step of the space; the rest is reserved a step
                // ahead of the data as it lands (a sparse file's holes are left alone).
                let dense = !sparse_file;
                let mut allocated = start.saturating_add(store::RESERVE_STEP).min(size);
                let mut done = start;
                for (from, len) in ranges {
                    progress(Progress::Bytes(from - done));
                    let (mut off, end) = (from, from + len);
                    while off < end {
                        let want = (end - off).min(step);
                        let n = match rx.recv_to_file(inc.file(), off, want) {
                            Ok(n) => n,
                            Err(zcnet::Error::Truncated { got: g, .. }) => {
                                return Err(TransferError::Truncated {
                                    name,
                                    expected: size,
                                    got: got + g,
                                })
                            }
                            Err(e) => return Err(e.into()),
                        };
                        off += n;
                        got += n;
                        if dense && off + store::RESERVE_STEP / 2 > allocated && allocated < size {
                            let to = off.saturating_add(store::RESERVE_STEP).min(size);
                            // Best effort: a full disk shows in the writes themselves.
                            let _ = inc.allocate(allocated, to - allocated);
                            allocated = to;
                        }
                        if let Some(l) = &landing {
                            l.landed(off);
                        }
                        progress(Progress::Bytes(n));
                    }
                    done = end;
                }
                progress(Progress::Bytes(size - done));
                // A hole at the end: the length, without writing it.
                let extend = match inc.file().metadata() {
                    Ok(m) if m.len() < size => inc.file().set_len(size),
                    Ok(_) => Ok(()),
                    Err(e) => Err(e),
                };
                match extend {
                    // Charged against the cap when the file began (its reservation).
                    Ok(()) => {
                        if let Some(Ok(h)) = landing.map(|l| l.finish(size)) {
                            inc.landed_hash(size, h);
                        }
                        Ok(())
                    }
                    Err(e) => Err(Refusal {
                        code: Code::Io,
                        message: format!("setting the length of {name:?}: {e}"),
                    }),
                }
            }
            None => {
                let mut res = Ok(());
                // A stream's bytes pass through memory here: hash them there.
                let mut landing = blake3::Hasher::new();
                loop {
                    match read_frame_receiver_side(rx)? {
                        Some(Frame::Data(d)) => {
                            if res.is_ok() {
                                res = store.charge(d.len() as u64).and_then(|_| {
                                    inc.file().write_all_at(&d, got).map_err(|e| Refusal {
                                        code: Code::Io,
                                        message: format!("writing {name:?}: {e}"),
                                    })
                                });
                            }
                            if verify {
                                landing.update(&d);
                            }
                            got += d.len() as u64;
                            progress(Progress::Bytes(d.len() as u64));
                        }
                        Some(Frame::EndData) => {
                            if verify && res.is_ok() {
                                inc.landed_hash(got, *landing.finalize().as_bytes());
                            }
                            break;
                        }
                        Some(other) => return Err(unexpected("data", &other)),
                        None => {
                            return Err(TransferError::Truncated {
                                name,
                                expected: u64::MAX,
                                got,
                            })
                        }
                    }
                }
                res
            }
        };
        let hash = trailer_hash(read_frame_receiver_side(rx)?, verify)?;
        let began = match data_result {
            Ok(()) => Ok(inc),
            Err(r) => {
                // Refused mid-stream (cap, disk): the bytes on disk are incomplete.
                inc.discard();
                Err(r)
            }
        };
        if version >= PIPELINED_FILES {
            // Checked, synced, renamed and answered by the finishing thread, in turn,
            // while this one reads the next file.
            let staged = Staged {
                name,
                size: got,
                mode,
                mtime: (mtime_s, mtime_ns),
                hash,
                began,
            };
            finish_in_turn(scope, rx, &mut finisher, staged, progress, &mut report)?;
            continue;
        }
        let result = began.and_then(|inc| inc.finish(hash, mode, (mtime_s, mtime_ns)));
        let (code, message, bytes) = match &result {
            Ok(len) => (Code::Ok, String::new(), *len),
            Err(r) => (r.code, r.message.clone(), got),
        };
        reply(
            rx,
            &Frame::Ack {
                code,
                bytes,
                message: message.clone(),
            },
        )?;
        let outcome = FileOutcome {
            entry: Entry::File,
            name,
            bytes: got,
            verified: hash.is_some() && result.is_ok(),
            result: result.map(|_| ()).map_err(|r| (r.code, r.message)),
        };
        progress(Progress::Done(&outcome));
        report.files.push(outcome);
    }
}

/// Hands `staged` to the session's finishing thread (started on first use), which answers
/// it after every file handed over before it; reports the files it has finished so far.
fn finish_in_turn<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    rx: &Receiver,
    finisher: &mut Option<Finisher>,
    staged: Staged,
    progress: &mut dyn FnMut(Progress<'_>),
    report: &mut SessionReport,
) -> Result<(), TransferError> {
    let f = match finisher {
        Some(f) => f,
        None => {
            let sock = rx
                .socket()
                .try_clone_to_owned()
                .map_err(|e| zcnet::Error::io("dup of the session's socket", e))?;
            finisher.insert(
                Finisher::start(scope, sock, PUT_ACK_MESSAGE)
                    .map_err(io_err("starting the thread that finishes files"))?,
            )
        }
    };
    f.hand_over(staged)
        .map_err(|e| zcnet::Error::io("finishing files", e))?;
    report_finished(f.collect(), progress, report)
}

/// [`reply`] while a finishing thread may be writing `Ack`s on the same socket: never in
/// the middle of its batch.
fn reply_beside(
    rx: &Receiver,
    finisher: Option<&Finisher>,
    f: &Frame,
) -> Result<(), TransferError> {
    let _alone = finisher.map(Finisher::writing);
    reply(rx, f)
}

/// The `Ack` for a `Dir` or a `Link` (no data), and its outcome in the report.
fn answer_entry(
    rx: &Receiver,
    entry: Entry,
    name: String,
    result: Result<(), Refusal>,
    progress: &mut dyn FnMut(Progress<'_>),
    report: &mut SessionReport,
) -> Result<(), TransferError> {
    let (code, message) = match &result {
        Ok(()) => (Code::Ok, String::new()),
        Err(r) => (r.code, r.message.clone()),
    };
    reply(
        rx,
        &Frame::Ack {
            code,
            bytes: 0,
            message,
        },
    )?;
    let outcome = FileOutcome {
        entry,
        name,
        bytes: 0,
        verified: false,
        result: result.map_err(|r| (r.code, r.message)),
    };
    progress(Progress::Done(&outcome));
    report.files.push(outcome);
    Ok(())
}

/// Frames read ahead of need, so a run of `Put`s costs a `recv` per socket buffer rather
/// than several per file. Only the frames between files and the `Put`s themselves go
/// through it: a `File`'s data is spliced from the socket, so bytes must never be held here
/// then — and they cannot be, since a sender waits for `Ready` after a `File` (a peer that
/// does not is refused).
struct ReadAhead {
    buf: Vec<u8>,
    lo: usize,
    hi: usize,
}

impl ReadAhead {
    fn new() -> Self {
        ReadAhead {
            buf: vec![0; 2 * (5 + MAX_CONTROL)],
            lo: 0,
            hi: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.lo == self.hi
    }

    /// Until `n` (≤ the buffer) bytes are held: `false` at a clean end of stream with none.
    fn fill(&mut self, rx: &mut Receiver, n: usize) -> Result<bool, TransferError> {
        if self.fill_until_end(rx, n)? {
            return Ok(true);
        }
        if self.is_empty() {
            return Ok(false);
        }
        Err(zcnet::Error::PeerClosed {
            op: "reading a frame",
        }
        .into())
    }

    /// Until `n` (≤ the buffer) bytes are held: `false` if the stream ends first.
    fn fill_until_end(&mut self, rx: &mut Receiver, n: usize) -> Result<bool, TransferError> {
        while self.hi - self.lo < n {
            if self.buf.len() - self.lo < n {
                self.buf.copy_within(self.lo..self.hi, 0);
                self.hi -= self.lo;
                self.lo = 0;
            }
            let got = rx.recv_into(&mut self.buf[self.hi..])?;
            if got == 0 {
                return Ok(false);
            }
            self.hi += got;
        }
        Ok(true)
    }

    /// A `Put`'s `size` (≤ [`MAX_CONTROL`]) bytes and the frame after them (its trailer;
    /// `None` at a clean end of stream there), both held in the buffer at once: the bytes
    /// are hashed and written from where `recv` put them, with no copy and no allocation
    /// per file. `Ok(Err(got))`: the stream ended `got` bytes into the data. The bytes
    /// stay valid until the next call that reads.
    #[allow(clippy::type_complexity)]
    fn put_body(
        &mut self,
        rx: &mut Receiver,
        size: usize,
    ) -> Result<Result<(std::ops::Range<usize>, Option<Frame>), usize>, TransferError> {
        debug_assert!(size <= MAX_CONTROL);
        if !self.fill_until_end(rx, size)? {
            return Ok(Err(self.hi - self.lo));
        }
        if !self.fill_until_end(rx, size + 5)? {
            if self.hi - self.lo == size {
                let at = self.lo;
                self.lo += size;
                return Ok(Ok((at..at + size, None)));
            }
            return Err(zcnet::Error::PeerClosed {
                op: "reading a frame",
            }
            .into());
        }
        let h: [u8; 5] = self.buf[self.lo + size..self.lo + size + 5]
            .try_into()
            .expect("5 bytes");
        let (ty, len) = Frame::check_header(h)?;
        if len > MAX_CONTROL {
            return Err(TransferError::Unexpected {
                expected: "a control frame",
                got: "data",
            });
        }
        // Fits: size + 5 + len ≤ 2 × (5 + MAX_CONTROL), the buffer's length.
        self.fill(rx, size + 5 + len)?;
        let at = self.lo;
        let f = Frame::decode(ty, &self.buf[at + size + 5..at + size + 5 + len])?;
        self.lo += size + 5 + len;
        Ok(Ok((at..at + size, Some(f))))
    }

    /// The next control frame; `None` at a clean end of stream between frames. A `Data`
    /// frame (the only kind allowed more than `MAX_CONTROL` bytes) is never due here and
    /// is refused from its header.
    fn frame(&mut self, rx: &mut Receiver) -> Result<Option<Frame>, TransferError> {
        if !self.fill(rx, 5)? {
            return Ok(None);
        }
        let h: [u8; 5] = self.buf[self.lo..self.lo + 5].try_into().expect("5 bytes");
        let (ty, len) = Frame::check_header(h)?;
        if len > MAX_CONTROL {
            return Err(TransferError::Unexpected {
                expected: "a control frame",
                got: "data",
            });
        }
        self.fill(rx, 5 + len)?;
        let f = Frame::decode(ty, &self.buf[self.lo + 5..self.lo + 5 + len])?;
        self.lo += 5 + len;
        Ok(Some(f))
    }

    /// Moves held bytes to the front of `out`; how many.
    fn take_into(&mut self, out: &mut [u8]) -> usize {
        let n = out.len().min(self.hi - self.lo);
        out[..n].copy_from_slice(&self.buf[self.lo..self.lo + n]);
        self.lo += n;
        n
    }
}

/// One version-2 `Put`: its bytes and trailer are read whatever the store decides (they are
/// on the wire already), then the file goes through the same rules as any other — hash
/// checked and written to its own `O_EXCL` partial file here ([`Store::put`]); fsync,
/// rename, directory fsync by the [`Finisher`], which only then sends the `Ack`.
#[allow(clippy::too_many_arguments)]
fn receive_put(
    rx: &mut Receiver,
    ahead: &mut ReadAhead,
    store: &mut Store,
    name: String,
    size: u64,
    mode: u32,
    mtime: (i64, u32),
    verify: bool,
) -> Result<Staged, TransferError> {
    // `Frame::decode` refused a `Put` over MAX_PUT from its header fields.
    if size as usize <= MAX_CONTROL {
        let (range, trailer) = match ahead.put_body(rx, size as usize)? {
            Ok(held) => held,
            Err(got) => {
                return Err(TransferError::Truncated {
                    name,
                    expected: size,
                    got: got as u64,
                })
            }
        };
        let hash = trailer_hash(trailer, verify)?;
        let began = store.put(&name, &ahead.buf[range], hash);
        return Ok(Staged {
            name,
            size,
            mode,
            mtime,
            hash,
            began,
        });
    }
    let mut data = vec![0u8; size as usize];
    let had = ahead.take_into(&mut data);
    if !rx_read_exact(rx, &mut data[had..])? && had < data.len() {
        return Err(TransferError::Truncated {
            name,
            expected: size,
            got: had as u64,
        });
    }
    let hash = trailer_hash(ahead.frame(rx)?, verify)?;
    let began = store.put(&name, &data, hash);
    Ok(Staged {
        name,
        size,
        mode,
        mtime,
        hash,
        began,
    })
}

/// The outcome of a finished `Put` in the report.
fn put_outcome(f: Finished) -> FileOutcome {
    FileOutcome {
        entry: Entry::File,
        name: f.name,
        bytes: f.size,
        verified: f.verified,
        result: f.result.map(|_| ()).map_err(|r| (r.code, r.message)),
    }
}

/// Reports files the finishing thread is done with.
fn report_finished(
    finished: io::Result<Vec<Finished>>,
    progress: &mut dyn FnMut(Progress<'_>),
    report: &mut SessionReport,
) -> Result<(), TransferError> {
    for f in finished.map_err(|e| zcnet::Error::io("finishing files", e))? {
        let o = put_outcome(f);
        progress(Progress::Done(&o));
        report.files.push(o);
    }
    Ok(())
}

// ---- ranges of a large file (version 6) --------------------------------------------------

/// Sends range `offset..offset+len` of the `size`-byte file at `path` (a node of its BLAKE3
/// tree): `Range`, the receiver's `Ready`, `Start`, the bytes by `sendfile`, and a `Trailer`
/// with the range's chaining value, hashed from the page cache on a second thread as the
/// bytes go. Its outcome is the range's; the file's is all of its ranges'.
fn send_range(
    tx: &mut Sender,
    path: &std::path::Path,
    name: &str,
    (offset, len, size): (u64, u64, u64),
    opts: &SendOptions,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<FileOutcome, TransferError> {
    let failed = |code, message: String| FileOutcome {
        entry: Entry::File,
        name: name.into(),
        bytes: 0,
        result: Err((code, message)),
        verified: false,
    };
    let file = File::open(path).map_err(io_err(format!("opening {}", path.display())))?;
    let meta = file
        .metadata()
        .map_err(io_err(format!("reading {}", path.display())))?;
    if meta.len() != size || !ranges::is_node(size, offset, len) {
        // Never announce a range of a file that is no longer the one split.
        return Ok(failed(
            Code::Length,
            format!(
                "{} changed size while being sent ({size} bytes, then {}); range {offset}+{len} not sent",
                path.display(),
                meta.len()
            ),
        ));
    }
    tx.send_slice(
        &Frame::Range {
            name: name.into(),
            size,
            mode: meta.mode() & 0o7777,
            mtime_s: meta.mtime(),
            mtime_ns: meta.mtime_nsec() as u32,
            verify: opts.verify,
            offset,
            len,
        }
        .to_bytes(),
    )?;
    let end = offset + len;
    let start = match await_answer(tx)? {
        Ok((at, None)) if at == offset => offset,
        // A rerun: the receiver has `offset..at`; go on from there only if it is ours.
        Ok((at, Some(theirs))) if at > offset && at <= end => {
            let mut h = blake3::Hasher::new();
            match hash_range(&file, &mut h, offset, at) {
                Ok(()) if *h.finalize().as_bytes() == theirs => at,
                _ => offset,
            }
        }
        Ok(_) => {
            return Err(TransferError::Unexpected {
                expected: "ready inside the range",
                got: "ready elsewhere",
            })
        }
        Err((code, message)) => return Ok(failed(code, message)),
    };
    tx.send_slice(&Frame::Start { offset: start }.to_bytes())?;
    let cv = std::thread::scope(|s| -> Result<Option<[u8; 32]>, TransferError> {
        let hasher = opts.verify.then(|| {
            s.spawn(|| {
                let mut h = ranges::range_hasher(offset);
                hash_range(&file, &mut h, offset, end).map(|()| {
                    use blake3::hazmat::HasherExt;
                    h.finalize_non_root()
                })
            })
        });
        let shrank = |got| TransferError::Shrank {
            name: name.into(),
            expected: size,
            got,
        };
        let mut off = start;
        while off < end {
            let n = match tx.send_file(&file, off, (end - off).min(STEP)) {
                Ok(n) => n,
                Err(zcnet::Error::Truncated { got, .. }) => return Err(shrank(off + got)),
                Err(zcnet::Error::RangeBeyondEof { .. }) => return Err(shrank(off)),
                Err(e) => return Err(e.into()),
            };
            if n == 0 {
                return Err(shrank(off));
            }
            off += n;
            progress(Progress::Bytes(n));
        }
        match hasher {
            None => Ok(None),
            Some(h) => h
                .join()
                .map_err(|_| io_err("hashing")(io::Error::other("hasher thread panicked")))?
                .map(Some)
                .map_err(io_err(format!("hashing {}", path.display()))),
        }
    })?;
    tx.send_slice(&Frame::Trailer { hash: cv }.to_bytes())?;
    await_ack(tx, name, end - start, cv.is_some())
}

/// Receives one range of a file arriving by ranges: claims it in the session's
/// [`RangedFiles`] (or refuses it), splices its bytes at their offset into the file's one
/// partial file, hashes them back from the page cache step by step as they land (while they
/// are still in cache), and answers with an `Ack` — for the range that completes the file,
/// once the file is final.
#[allow(clippy::too_many_arguments)]
fn receive_range(
    rx: &mut Receiver,
    store: &mut Store,
    ranged: &RangedFiles,
    name: String,
    meta: FileMeta,
    (offset, len): (u64, u64),
    progress: &mut dyn FnMut(Progress<'_>),
    report: &mut SessionReport,
) -> Result<(), TransferError> {
    let end_file = |code: Code,
                    message: String,
                    bytes: u64,
                    progress: &mut dyn FnMut(Progress<'_>),
                    report: &mut SessionReport| {
        let outcome = FileOutcome {
            entry: Entry::File,
            name: name.clone(),
            bytes,
            verified: code == Code::Ok && meta.verify,
            result: if code == Code::Ok {
                Ok(())
            } else {
                Err((code, message))
            },
        };
        progress(Progress::Done(&outcome));
        report.files.push(outcome);
    };
    let claim = match ranged.claim(store, &name, meta, offset, len) {
        Ok(c) => c,
        Err(Refusal { code, message }) => {
            reply(
                rx,
                &Frame::Refuse {
                    code,
                    message: message.clone(),
                },
            )?;
            end_file(code, message, 0, progress, report);
            return Ok(());
        }
    };
    let end = offset + len;
    // A rerun: the recorded bytes of this range, offered with their hash; hashed into the
    // range's chaining value from where they are read.
    let mut kept = None;
    if claim.resume_at() > offset {
        let (mut plain, mut tree) = (blake3::Hasher::new(), ranges::range_hasher(offset));
        let at = claim.resume_at();
        if hash_range(claim.file(), &mut plain, offset, at).is_ok()
            && hash_range(claim.file(), &mut tree, offset, at).is_ok()
        {
            kept = Some((at, *plain.finalize().as_bytes(), tree));
        }
    }
    reply(
        rx,
        &Frame::Ready {
            offset: kept.as_ref().map_or(offset, |k| k.0),
            prefix: kept.as_ref().map(|k| k.1),
        },
    )?;
    let mut hasher = meta.verify.then(|| ranges::range_hasher(offset));
    let start = match read_frame_receiver_side(rx)? {
        Some(Frame::Start { offset: o }) if o == offset => offset,
        Some(Frame::Start { offset: o }) if kept.as_ref().is_some_and(|k| k.0 == o) => {
            if meta.verify {
                hasher = kept.map(|k| k.2);
            }
            o
        }
        Some(Frame::Abort { message }) => {
            let landed = ranged.land(
                claim,
                Err(Refusal {
                    code: Code::Io,
                    message: format!("the sender gave up: {message}"),
                }),
            );
            if let Landed::Failed { refusal, first } = landed {
                if first {
                    end_file(refusal.code, refusal.message, 0, progress, report);
                }
            }
            return Ok(());
        }
        Some(other) => return Err(unexpected("start at the range's offset", &other)),
        None => {
            return Err(zcnet::Error::PeerClosed {
                op: "waiting for data",
            }
            .into())
        }
    };
    let mut hashing: Result<(), io::Error> = Ok(());
    let mut off = start;
    let mut recorded = start;
    while off < end {
        let n = match rx.recv_to_file(claim.file(), off, (end - off).min(LAND_STEP)) {
            Ok(n) => n,
            Err(zcnet::Error::Truncated { got, .. }) => {
                return Err(TransferError::Truncated {
                    name,
                    expected: len,
                    got: off - offset + got,
                })
            }
            Err(e) => return Err(e.into()),
        };
        if let (Some(h), Ok(())) = (&mut hasher, &hashing) {
            hashing = hash_range(claim.file(), h, off, off + n);
        }
        off += n;
        progress(Progress::Bytes(n));
        if claim.recorded() && off - recorded >= ranges::JOURNAL_STEP && off < end {
            // Best effort: without the record a rerun sends these bytes again.
            let _ = claim.record(off);
            recorded = off;
        }
    }
    let theirs = trailer_hash(read_frame_receiver_side(rx)?, meta.verify)?;
    let arrived = match hashing {
        Ok(()) => {
            use blake3::hazmat::HasherExt;
            Ok((hasher.map(|h| h.finalize_non_root()), theirs))
        }
        Err(e) => Err(Refusal::io("hashing a range of", &name, e)),
    };
    let (code, message, bytes) = match ranged.land(claim, arrived) {
        Landed::Range => (Code::Ok, String::new(), len),
        Landed::Final(n) => {
            end_file(Code::Ok, String::new(), n, progress, report);
            (Code::Ok, String::new(), n)
        }
        Landed::Failed { refusal, first } => {
            if first {
                end_file(refusal.code, refusal.message.clone(), 0, progress, report);
            }
            (refusal.code, refusal.message, 0)
        }
    };
    reply(
        rx,
        &Frame::Ack {
            code,
            bytes,
            message,
        },
    )
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
