//! The transfer protocol's frames (specified in `docs/transfer-protocol.md`). Pure code: a
//! frame is encoded into bytes and decoded from a byte buffer with every length checked
//! against a limit, so a malformed or hostile peer produces a [`WireError`], never a panic,
//! an unbounded allocation or a silent truncation.
//!
//! Every frame is `type: u8, len: u32 (big-endian), payload: len bytes`. File *data* is not
//! framed: after the receiver's `Ready`, exactly `size - offset` raw bytes follow, so the
//! sender can `sendfile` them and the receiver can `splice` them (the FTP test's path).
//! Version 2 adds `Put`: a small file whose bytes and trailer follow its header at once, so
//! a tree of small files streams without a round trip per file.

/// First bytes of every `Hello` payload.
pub const MAGIC: &[u8; 6] = b"ZCNET\0";
/// Newest protocol version this build speaks (2: pipelined `Put` files; 3: `Dir` and `Link`,
/// so empty directories and symlinks arrive; 4: `StartSparse`, so holes are not sent; 5:
/// `Open`/`Join`, so one session runs over several connections; 6: `Range`, so one large
/// file runs over several connections; 7: a `File`'s `Ack` may come after the next files,
/// so a large file's checks, `fsync` and rename overlap the next file's data; 8: the token's
/// proofs cover the whole handshake, version included — [`AUTHENTICATED_FROM`]; 9: a sparse
/// file's `Trailer` carries the digest of its extents, not of its holes —
/// [`SPARSE_DIGEST_FROM`]; 10: the session runs inside TLS 1.3 unless both ends run in
/// plaintext — [`ENCRYPTED_FROM`]).
pub const VERSION: u16 = 10;
/// The first version in which a file sent with `StartSparse` is verified by its sparse
/// digest ([`crate::sparse::digest`]: the extent list and the extents' bytes), so its
/// holes cost neither end anything; before it the `Trailer` hash covers the holes as zeros,
/// which made a receiver hash every byte a peer claimed.
pub const SPARSE_DIGEST_FROM: u16 = 9;
/// The first version that runs a session inside TLS 1.3 (the receiver the TLS server, the
/// sender the client, right after the TCP connection opens). An encrypting receiver first
/// sends [`tls_preamble`] in plaintext — a `Refuse` an older or plaintext sender prints and
/// stops at, and that an encrypting sender checks byte for byte and then starts TLS behind —
/// and then serves senders of this version or later only, inside TLS. Both ends of a
/// plaintext session (`--plaintext` on both) speak every version as before.
pub const ENCRYPTED_FROM: u16 = 10;
/// What an encrypting receiver tells a sender that does not encrypt (its [`tls_preamble`]).
pub const ENCRYPTION_REQUIRED: &str = "this receiver requires encryption (TLS; zcnet protocol version 10 or later): upgrade zcnet at the sender, or run both ends with --plaintext on a network you trust";
/// Oldest version in which a token is accepted: from 8 the proofs cover both `Hello`s and the
/// `Open`/`Join` ([`crate::auth::transcript`]), so a version lowered on the way fails them.
/// Before it they covered the nonces only, and both ends refuse to prove a token in such a
/// session (a lowered `Hello` would otherwise pass unseen); without a token every version
/// from [`MIN_VERSION`] is served as before.
pub const AUTHENTICATED_FROM: u16 = 8;
/// Oldest version this build still speaks (1: one file at a time, `File`/`Ready`/`Start`).
pub const MIN_VERSION: u16 = 1;
/// The first version whose `File`s are pipelined: the sender sends the next file as soon as
/// a `File`'s trailer is out, and its `Ack` comes later, in order with the other answers
/// (the receiver finishes it on the thread that finishes `Put`s).
pub const PIPELINED_FILES: u16 = 7;

/// What a session's protocol version carries, decided once from the negotiated version so
/// the code that sends and receives asks for a feature by name and no `version >= N` is
/// scattered through it. [`VERSION`]'s documentation lists the versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Features {
    /// Small files go as `Put`s, pipelined (2).
    pub puts: bool,
    /// Empty directories and symlinks go as `Dir` and `Link` (3).
    pub tree_entries: bool,
    /// A file's holes are left out with `StartSparse` (4).
    pub sparse: bool,
    /// A session runs over several connections: `Open`/`Join`, answered by `Session` (5).
    pub streams: bool,
    /// A large file goes in `Range`s over a session's streams (6).
    pub ranges: bool,
    /// A `File`'s `Ack` comes in turn with the answers to the files after it
    /// ([`PIPELINED_FILES`]).
    pub pipelined_files: bool,
    /// A token's proofs cover the whole handshake ([`AUTHENTICATED_FROM`]).
    pub authenticated: bool,
    /// A sparse file is verified by its sparse digest ([`SPARSE_DIGEST_FROM`]).
    pub sparse_digest: bool,
    /// The session may run inside TLS 1.3 ([`ENCRYPTED_FROM`]); whether it does is both
    /// ends' choice (`--plaintext`), so a plaintext session of this version is in the clear.
    pub tls: bool,
}

impl Features {
    /// The features of a session of `version`.
    pub(crate) const fn of(version: u16) -> Features {
        Features {
            puts: version >= 2,
            tree_entries: version >= 3,
            sparse: version >= 4,
            streams: version >= 5,
            ranges: version >= 6,
            pipelined_files: version >= PIPELINED_FILES,
            authenticated: version >= AUTHENTICATED_FROM,
            sparse_digest: version >= SPARSE_DIGEST_FROM,
            tls: version >= ENCRYPTED_FROM,
        }
    }
}
/// The first bytes an encrypting receiver sends, in plaintext, before TLS: `Refuse{Version,
/// ENCRYPTION_REQUIRED}`. A sender that does not encrypt reads it where the receiver's
/// `Hello` is due and stops with the message; an encrypting sender reads exactly these bytes
/// and starts TLS. Nothing in them is trusted: whatever else comes there, an encrypting
/// sender stops, so a relay that rewrites them can only end the session.
pub fn tls_preamble() -> Vec<u8> {
    Frame::Refuse {
        code: Code::Version,
        message: ENCRYPTION_REQUIRED.into(),
    }
    .to_bytes()
}

/// Largest file a `Put` may carry: its bytes are read into memory before the receiver
/// decides, and a refused `Put`'s bytes are read and dropped.
pub const MAX_PUT: u64 = 1 << 20;
/// Longest relative file name accepted (bytes), as `PATH_MAX`.
pub const MAX_NAME: usize = 4096;
/// Longest human message in a frame.
pub const MAX_MESSAGE: usize = 4096;
/// Largest control-frame payload.
pub const MAX_CONTROL: usize = 64 * 1024;
/// Largest `Data` payload (stream mode only).
pub const MAX_DATA: usize = 4 << 20;
/// Payload length of a `Hello` frame: magic, version, auth flag, nonce.
pub const HELLO_LEN: usize = 6 + 2 + 1 + 32;
/// Payload length of an `Auth` frame: one HMAC-SHA256.
pub const AUTH_LEN: usize = 32;
/// Most data extents one `StartSparse` lists (its payload stays under [`MAX_CONTROL`]); a
/// file with more goes whole, holes as zeros.
pub const MAX_EXTENTS: usize = 4000;
/// `File.size` for a stream of unknown length (stdin): data comes in `Data` frames.
pub const STREAM_SIZE: u64 = u64::MAX;
/// Most connections one session may have (`Open`, version 5).
pub const MAX_STREAMS: u16 = 16;
/// Bytes of a session id (`Session`, `Join`): random, so a stranger cannot guess one.
pub const SESSION_ID_LEN: usize = 16;
/// Payload bytes of `Open`.
pub const OPEN_LEN: usize = 2;

/// Why a file or a session was refused; sent in `Refuse` and `Ack`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
#[non_exhaustive]
pub enum Code {
    /// Accepted / verified.
    Ok = 0,
    /// The name is absolute, has `..`, NUL, is too long, or would leave the directory.
    UnsafeName = 1,
    /// The target exists and `--overwrite` was not given.
    Exists = 2,
    /// The sender's byte cap (`--max-bytes`) would be exceeded.
    TooLarge = 3,
    /// The receiver failed to write (disk full, permissions…).
    Io = 4,
    /// Authentication failed.
    AuthFailed = 5,
    /// Protocol versions differ.
    Version = 6,
    /// The data's hash differs from the trailer's.
    HashMismatch = 7,
    /// Fewer or more bytes than announced.
    Length = 8,
    /// A frame out of order or malformed.
    Protocol = 9,
    /// The receiver is at a limit (sessions, connections from one address, failed
    /// authentications): try again later.
    Busy = 10,
    /// A `Join` named no session open for more streams (unknown, finished, or full).
    NoSession = 11,
}

impl Code {
    fn from_u16(v: u16) -> Option<Code> {
        use Code::*;
        [
            Ok,
            UnsafeName,
            Exists,
            TooLarge,
            Io,
            AuthFailed,
            Version,
            HashMismatch,
            Length,
            Protocol,
            Busy,
            NoSession,
        ]
        .into_iter()
        .find(|c| *c as u16 == v)
    }
}

/// One protocol frame.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Frame {
    /// First frame each way. `auth` (receiver): a token is required.
    Hello {
        /// Protocol version.
        version: u16,
        /// Receiver: authentication required. Sender: ignored.
        auth: bool,
        /// Challenge for the peer (random).
        nonce: [u8; 32],
    },
    /// HMAC-SHA256 answer to the peer's challenge.
    Auth {
        /// The MAC.
        mac: [u8; 32],
    },
    /// A file (or stream) is about to be sent.
    File {
        /// Relative name with `/` separators.
        name: String,
        /// Bytes, or [`STREAM_SIZE`].
        size: u64,
        /// Permission bits (`st_mode & 0o7777`).
        mode: u32,
        /// Modification time, seconds since the epoch.
        mtime_s: i64,
        /// Nanoseconds part.
        mtime_ns: u32,
        /// A hash follows in the trailer (`--no-verify` clears it).
        verify: bool,
    },
    /// Receiver: send from `offset` (resume) — `prefix` is the hash of the bytes it has.
    Ready {
        /// First byte the receiver wants.
        offset: u64,
        /// BLAKE3 of bytes `0..offset` already on disk (resume only).
        prefix: Option<[u8; 32]>,
    },
    /// Receiver: this file (or the session) is refused.
    Refuse {
        /// Why.
        code: Code,
        /// For people.
        message: String,
    },
    /// Sender: data follows from `offset` (the receiver's resume offset if the prefix hash
    /// matched, else 0: the receiver then starts the file over).
    Start {
        /// First byte that follows.
        offset: u64,
    },
    /// Sender (version 4), instead of `Start` for a file with holes: data follows from
    /// `offset`, but only the bytes of `extents` (start, length), in order, back to back;
    /// the rest of the file from `offset` on is holes (zeros), which the receiver leaves
    /// unwritten. Extents are ascending, non-empty, apart, and inside `offset..size`.
    StartSparse {
        /// First byte of the file this covers (as `Start`'s).
        offset: u64,
        /// The data extents.
        extents: Vec<(u64, u64)>,
    },
    /// Sender (version 5), right after its `Hello` (and `Auth`): this connection opens a
    /// session that `streams` connections in all will carry.
    Open {
        /// Connections of the session, this one included (1 to [`MAX_STREAMS`]).
        streams: u16,
    },
    /// Sender (version 5), instead of `Open`: this connection is one more stream of the
    /// session the receiver named in its `Session` answer.
    Join {
        /// The session's id, from the receiver's `Session`.
        session: [u8; SESSION_ID_LEN],
    },
    /// Receiver (version 5): the answer to `Open` or `Join`.
    Session {
        /// The id further streams present in `Join`.
        id: [u8; SESSION_ID_LEN],
    },
    /// Stream-mode data.
    Data(Vec<u8>),
    /// End of stream-mode data.
    EndData,
    /// After the data: its BLAKE3 hash (`None` with `--no-verify`).
    Trailer {
        /// Hash of the whole file.
        hash: Option<[u8; 32]>,
    },
    /// Receiver: the file is final (or not).
    Ack {
        /// `Ok` when verified, synced and renamed.
        code: Code,
        /// Bytes in the final file.
        bytes: u64,
        /// For people.
        message: String,
    },
    /// Sender (version 2): a file of at most [`MAX_PUT`] bytes whose `size` raw bytes and
    /// `Trailer` follow at once, without waiting for `Ready`; the receiver answers with one
    /// `Ack` (its code says why a file was refused), in the order the files were sent.
    Put {
        /// Relative name with `/` separators.
        name: String,
        /// Bytes that follow (never [`STREAM_SIZE`]).
        size: u64,
        /// Permission bits (`st_mode & 0o7777`).
        mode: u32,
        /// Modification time, seconds since the epoch.
        mtime_s: i64,
        /// Nanoseconds part.
        mtime_ns: u32,
        /// A hash follows in the trailer.
        verify: bool,
    },
    /// Sender (version 3): create this directory (an empty one of the tree; directories
    /// with files come with their files' names). The receiver answers with one `Ack`, in
    /// order with the `Put`s before it.
    Dir {
        /// Relative name with `/` separators.
        name: String,
        /// Permission bits (`st_mode & 0o777`).
        mode: u32,
    },
    /// Sender (version 3): create a symlink `name` pointing to `target` (relative, staying
    /// inside the receive directory, else refused). One `Ack`, in order.
    Link {
        /// Relative name with `/` separators.
        name: String,
        /// The link's contents, as `readlink(2)` gave them.
        target: String,
    },
    /// Sender (version 6): one range of a large file, a node of its BLAKE3 tree below the
    /// root; answered like `File` (`Ready` at `offset`, or `Refuse`), then `Start{offset}`,
    /// exactly `len` raw bytes and a `Trailer` carrying the range's BLAKE3 chaining value.
    /// The file is final once all its ranges, on any of the session's streams, landed.
    Range {
        /// Relative name with `/` separators.
        name: String,
        /// The whole file's bytes.
        size: u64,
        /// Permission bits (`st_mode & 0o7777`).
        mode: u32,
        /// Modification time, seconds since the epoch.
        mtime_s: i64,
        /// Nanoseconds part.
        mtime_ns: u32,
        /// A chaining value follows in the trailer.
        verify: bool,
        /// First byte of the range.
        offset: u64,
        /// Bytes of the range.
        len: u64,
    },
    /// Sender: no more files (receiver answers with its own `Bye`).
    Bye,
    /// Sender: it could not go on with the current file (read error, file shrank…);
    /// the receiver discards the file's data.
    Abort {
        /// For people.
        message: String,
    },
}

/// A malformed frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Unknown frame type byte.
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    /// A length over its limit.
    #[error("{what} of {len} bytes exceeds the limit of {max}")]
    TooLong {
        /// Which field.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The payload ended inside a field, or had bytes left over.
    #[error("malformed {0} frame")]
    Malformed(&'static str),
    /// Not UTF-8 where text is required.
    #[error("{0} is not valid UTF-8")]
    BadUtf8(&'static str),
    /// Not a zcnet peer.
    #[error("not a zcnet peer (bad magic)")]
    BadMagic,
    /// Unknown status code.
    #[error("unknown status code {0}")]
    BadCode(u16),
}

pub(crate) const T_HELLO: u8 = 1;
pub(crate) const T_AUTH: u8 = 2;
pub(crate) const T_FILE: u8 = 3;
const T_READY: u8 = 4;
const T_REFUSE: u8 = 5;
const T_DATA: u8 = 6;
const T_END_DATA: u8 = 7;
const T_TRAILER: u8 = 8;
const T_ACK: u8 = 9;
const T_BYE: u8 = 10;
const T_ABORT: u8 = 11;
const T_START: u8 = 12;
pub(crate) const T_PUT: u8 = 13;
pub(crate) const T_DIR: u8 = 14;
pub(crate) const T_LINK: u8 = 15;
const T_START_SPARSE: u8 = 16;
pub(crate) const T_OPEN: u8 = 17;
pub(crate) const T_JOIN: u8 = 18;
pub(crate) const T_SESSION: u8 = 19;
pub(crate) const T_RANGE: u8 = 20;

fn put_str(out: &mut Vec<u8>, s: &str, max: usize) {
    let b = &s.as_bytes()[..s.len().min(max)];
    out.extend_from_slice(&(b.len() as u16).to_be_bytes());
    out.extend_from_slice(b);
}

impl Frame {
    /// Appends the encoded frame to `out`. Messages longer than [`MAX_MESSAGE`] are cut
    /// (they are for people); names longer than [`MAX_NAME`] must be refused before.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; 5]);
        let ty = self.encode_payload(out);
        let len = (out.len() - start - 5) as u32;
        out[start] = ty;
        out[start + 1..start + 5].copy_from_slice(&len.to_be_bytes());
    }

    /// Appends the frame's payload to `out`; its type.
    fn encode_payload(&self, out: &mut Vec<u8>) -> u8 {
        match self {
            Frame::Hello {
                version,
                auth,
                nonce,
            } => {
                out.extend_from_slice(MAGIC);
                out.extend_from_slice(&version.to_be_bytes());
                out.push(*auth as u8);
                out.extend_from_slice(nonce);
                T_HELLO
            }
            Frame::Auth { mac } => {
                out.extend_from_slice(mac);
                T_AUTH
            }
            Frame::File { .. } | Frame::Put { .. } | Frame::Range { .. } => {
                self.encode_file_frame(out)
            }
            Frame::Ready { offset, prefix } => {
                out.extend_from_slice(&offset.to_be_bytes());
                if let Some(h) = prefix {
                    out.extend_from_slice(h);
                }
                T_READY
            }
            Frame::Refuse { code, message } => {
                out.extend_from_slice(&(*code as u16).to_be_bytes());
                put_str(out, message, MAX_MESSAGE);
                T_REFUSE
            }
            Frame::Start { offset } => {
                out.extend_from_slice(&offset.to_be_bytes());
                T_START
            }
            Frame::StartSparse { offset, extents } => {
                out.extend_from_slice(&offset.to_be_bytes());
                let n = extents.len().min(MAX_EXTENTS);
                out.extend_from_slice(&(n as u32).to_be_bytes());
                for (o, l) in &extents[..n] {
                    out.extend_from_slice(&o.to_be_bytes());
                    out.extend_from_slice(&l.to_be_bytes());
                }
                T_START_SPARSE
            }
            Frame::Open { streams } => {
                out.extend_from_slice(&streams.to_be_bytes());
                T_OPEN
            }
            Frame::Join { session } => {
                out.extend_from_slice(session);
                T_JOIN
            }
            Frame::Session { id } => {
                out.extend_from_slice(id);
                T_SESSION
            }
            Frame::Data(d) => {
                out.extend_from_slice(&d[..d.len().min(MAX_DATA)]);
                T_DATA
            }
            Frame::EndData => T_END_DATA,
            Frame::Trailer { hash } => {
                if let Some(h) = hash {
                    out.extend_from_slice(h);
                }
                T_TRAILER
            }
            Frame::Ack {
                code,
                bytes,
                message,
            } => {
                out.extend_from_slice(&(*code as u16).to_be_bytes());
                out.extend_from_slice(&bytes.to_be_bytes());
                put_str(out, message, MAX_MESSAGE);
                T_ACK
            }
            Frame::Dir { name, mode } => {
                put_str(out, name, MAX_NAME);
                out.extend_from_slice(&mode.to_be_bytes());
                T_DIR
            }
            Frame::Link { name, target } => {
                put_str(out, name, MAX_NAME);
                put_str(out, target, MAX_NAME);
                T_LINK
            }
            Frame::Bye => T_BYE,
            Frame::Abort { message } => {
                put_str(out, message, MAX_MESSAGE);
                T_ABORT
            }
        }
    }

    /// The payload of a frame that announces a file (`File`, `Put`) or a range of one
    /// (`Range`): the file's name and metadata, then the range's place; its type.
    fn encode_file_frame(&self, out: &mut Vec<u8>) -> u8 {
        let (ty, header, range) = match self {
            Frame::File {
                name,
                size,
                mode,
                mtime_s,
                mtime_ns,
                verify,
            } => (T_FILE, (name, size, mode, mtime_s, mtime_ns, verify), None),
            Frame::Put {
                name,
                size,
                mode,
                mtime_s,
                mtime_ns,
                verify,
            } => (T_PUT, (name, size, mode, mtime_s, mtime_ns, verify), None),
            Frame::Range {
                name,
                size,
                mode,
                mtime_s,
                mtime_ns,
                verify,
                offset,
                len,
            } => (
                T_RANGE,
                (name, size, mode, mtime_s, mtime_ns, verify),
                Some((offset, len)),
            ),
            _ => unreachable!("only frames that announce a file come here"),
        };
        let (name, size, mode, mtime_s, mtime_ns, verify) = header;
        put_str(out, name, MAX_NAME);
        out.extend_from_slice(&size.to_be_bytes());
        out.extend_from_slice(&mode.to_be_bytes());
        out.extend_from_slice(&mtime_s.to_be_bytes());
        out.extend_from_slice(&mtime_ns.to_be_bytes());
        out.push(*verify as u8);
        if let Some((offset, len)) = range {
            out.extend_from_slice(&offset.to_be_bytes());
            out.extend_from_slice(&len.to_be_bytes());
        }
        ty
    }

    /// Encodes into a fresh vector.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode(&mut v);
        v
    }

    /// Checks a frame header (`type`, `len`) before its payload is read, so a hostile
    /// length is refused before any allocation.
    pub fn check_header(header: [u8; 5]) -> Result<(u8, usize), WireError> {
        let ty = header[0];
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        let max = match ty {
            T_DATA => MAX_DATA,
            T_HELLO..=T_LINK | T_START_SPARSE..=T_RANGE => MAX_CONTROL,
            _ => return Err(WireError::UnknownType(ty)),
        };
        if len > max {
            return Err(WireError::TooLong {
                what: "frame",
                len,
                max,
            });
        }
        Ok((ty, len))
    }

    /// Decodes one frame's payload of type `ty`.
    pub fn decode(ty: u8, p: &[u8]) -> Result<Frame, WireError> {
        let mut r = Reader { p, what: "frame" };
        let f = match ty {
            T_HELLO => {
                r.what = "hello";
                if r.take(6)? != MAGIC {
                    return Err(WireError::BadMagic);
                }
                let version = r.u16()?;
                let auth = r.flag()?;
                let nonce = r.arr32()?;
                Frame::Hello {
                    version,
                    auth,
                    nonce,
                }
            }
            T_AUTH => {
                r.what = "auth";
                Frame::Auth { mac: r.arr32()? }
            }
            T_FILE | T_PUT | T_RANGE => decode_file_frame(ty, &mut r)?,
            T_READY => {
                r.what = "ready";
                let offset = r.u64()?;
                let prefix = if r.p.is_empty() {
                    None
                } else {
                    Some(r.arr32()?)
                };
                Frame::Ready { offset, prefix }
            }
            T_REFUSE => {
                r.what = "refuse";
                Frame::Refuse {
                    code: r.code()?,
                    message: r.string("message", MAX_MESSAGE)?,
                }
            }
            T_START => {
                r.what = "start";
                Frame::Start { offset: r.u64()? }
            }
            T_START_SPARSE => {
                r.what = "start-sparse";
                Frame::StartSparse {
                    offset: r.u64()?,
                    extents: r.extents()?,
                }
            }
            T_OPEN => {
                r.what = "open";
                Frame::Open { streams: r.u16()? }
            }
            T_JOIN => {
                r.what = "join";
                Frame::Join {
                    session: r.take(SESSION_ID_LEN)?.try_into().expect("16 bytes"),
                }
            }
            T_SESSION => {
                r.what = "session";
                Frame::Session {
                    id: r.take(SESSION_ID_LEN)?.try_into().expect("16 bytes"),
                }
            }
            T_DATA => return Ok(Frame::Data(p.to_vec())),
            T_END_DATA => Frame::EndData,
            T_TRAILER => {
                r.what = "trailer";
                let hash = if r.p.is_empty() {
                    None
                } else {
                    Some(r.arr32()?)
                };
                Frame::Trailer { hash }
            }
            T_ACK => {
                r.what = "ack";
                Frame::Ack {
                    code: r.code()?,
                    bytes: r.u64()?,
                    message: r.string("message", MAX_MESSAGE)?,
                }
            }
            T_DIR => {
                r.what = "dir";
                Frame::Dir {
                    name: r.string("directory name", MAX_NAME)?,
                    mode: r.u32()?,
                }
            }
            T_LINK => {
                r.what = "link";
                Frame::Link {
                    name: r.string("link name", MAX_NAME)?,
                    target: r.string("link target", MAX_NAME)?,
                }
            }
            T_BYE => Frame::Bye,
            T_ABORT => {
                r.what = "abort";
                Frame::Abort {
                    message: r.string("message", MAX_MESSAGE)?,
                }
            }
            other => return Err(WireError::UnknownType(other)),
        };
        if !r.p.is_empty() {
            return Err(WireError::Malformed(r.what));
        }
        Ok(f)
    }

    /// Decodes the first frame in `buf`: `Ok(None)` if more bytes are needed, else the
    /// frame and how many bytes it used.
    pub fn parse(buf: &[u8]) -> Result<Option<(Frame, usize)>, WireError> {
        if buf.len() < 5 {
            return Ok(None);
        }
        let (ty, len) = Self::check_header(buf[..5].try_into().expect("5 bytes"))?;
        if buf.len() < 5 + len {
            return Ok(None);
        }
        Ok(Some((Self::decode(ty, &buf[5..5 + len])?, 5 + len)))
    }

    /// Short name for messages ("file", "ack", …).
    pub fn kind(&self) -> &'static str {
        match self {
            Frame::Hello { .. } => "hello",
            Frame::Auth { .. } => "auth",
            Frame::File { .. } => "file",
            Frame::Ready { .. } => "ready",
            Frame::Refuse { .. } => "refuse",
            Frame::Start { .. } => "start",
            Frame::StartSparse { .. } => "start-sparse",
            Frame::Open { .. } => "open",
            Frame::Join { .. } => "join",
            Frame::Session { .. } => "session",
            Frame::Data(_) => "data",
            Frame::EndData => "end-of-data",
            Frame::Trailer { .. } => "trailer",
            Frame::Ack { .. } => "ack",
            Frame::Put { .. } => "put",
            Frame::Range { .. } => "range",
            Frame::Dir { .. } => "dir",
            Frame::Link { .. } => "link",
            Frame::Bye => "bye",
            Frame::Abort { .. } => "abort",
        }
    }
}

/// The payload of a frame that announces a file (`File`, `Put`) or a range of one
/// (`Range`), of type `ty`: the file's name and metadata, then the range's place. A `Put`
/// over [`MAX_PUT`] is refused from these fields, before its bytes are read.
fn decode_file_frame(ty: u8, r: &mut Reader<'_>) -> Result<Frame, WireError> {
    r.what = match ty {
        T_PUT => "put",
        T_RANGE => "range",
        _ => "file",
    };
    let name = r.string("file name", MAX_NAME)?;
    let (size, mode) = (r.u64()?, r.u32()?);
    let (mtime_s, mtime_ns, verify) = (r.u64()? as i64, r.u32()?, r.flag()?);
    Ok(match ty {
        T_PUT if size > MAX_PUT => {
            return Err(WireError::TooLong {
                what: "put",
                len: usize::try_from(size).unwrap_or(usize::MAX),
                max: MAX_PUT as usize,
            })
        }
        T_PUT => Frame::Put {
            name,
            size,
            mode,
            mtime_s,
            mtime_ns,
            verify,
        },
        T_RANGE => Frame::Range {
            name,
            size,
            mode,
            mtime_s,
            mtime_ns,
            verify,
            offset: r.u64()?,
            len: r.u64()?,
        },
        _ => Frame::File {
            name,
            size,
            mode,
            mtime_s,
            mtime_ns,
            verify,
        },
    })
}

struct Reader<'a> {
    p: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.p.len() < n {
            return Err(WireError::Malformed(self.what));
        }
        let (a, b) = self.p.split_at(n);
        self.p = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    fn flag(&mut self) -> Result<bool, WireError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(WireError::Malformed(self.what)),
        }
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn arr32(&mut self) -> Result<[u8; 32], WireError> {
        Ok(self.take(32)?.try_into().expect("32"))
    }
    fn code(&mut self) -> Result<Code, WireError> {
        let v = self.u16()?;
        Code::from_u16(v).ok_or(WireError::BadCode(v))
    }
    /// A `StartSparse`'s extents: a count (at most [`MAX_EXTENTS`]), then as many
    /// (offset, length) pairs.
    fn extents(&mut self) -> Result<Vec<(u64, u64)>, WireError> {
        let n = self.u32()? as usize;
        if n > MAX_EXTENTS {
            return Err(WireError::TooLong {
                what: "extent list",
                len: n,
                max: MAX_EXTENTS,
            });
        }
        // The count is the peer's word: room only for the extents the payload holds.
        let mut extents = Vec::with_capacity(n.min(self.p.len() / 16));
        for _ in 0..n {
            extents.push((self.u64()?, self.u64()?));
        }
        Ok(extents)
    }
    fn string(&mut self, what: &'static str, max: usize) -> Result<String, WireError> {
        let len = self.u16()? as usize;
        if len > max {
            return Err(WireError::TooLong { what, len, max });
        }
        let b = self.take(len)?;
        String::from_utf8(b.to_vec()).map_err(|_| WireError::BadUtf8(what))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Each feature starts at the version `VERSION`'s documentation gives it and stays on
    /// after it; the oldest version has none, the newest all.
    #[test]
    fn each_feature_starts_at_its_documented_version() {
        let first = |on: fn(Features) -> bool| {
            (MIN_VERSION..=VERSION)
                .find(|&v| on(Features::of(v)))
                .filter(|&v| (v..=VERSION).all(|w| on(Features::of(w))))
        };
        assert_eq!(first(|f| f.puts), Some(2));
        assert_eq!(first(|f| f.tree_entries), Some(3));
        assert_eq!(first(|f| f.sparse), Some(4));
        assert_eq!(first(|f| f.streams), Some(5));
        assert_eq!(first(|f| f.ranges), Some(6));
        assert_eq!(first(|f| f.pipelined_files), Some(PIPELINED_FILES));
        assert_eq!(first(|f| f.authenticated), Some(AUTHENTICATED_FROM));
        assert_eq!(first(|f| f.sparse_digest), Some(SPARSE_DIGEST_FROM));
        assert_eq!(first(|f| f.tls), Some(ENCRYPTED_FROM));
    }

    fn samples() -> Vec<Frame> {
        vec![
            Frame::Open { streams: 4 },
            Frame::Join { session: [9; 16] },
            Frame::Session { id: [3; 16] },
            Frame::Hello {
                version: VERSION,
                auth: true,
                nonce: [7; 32],
            },
            Frame::Auth { mac: [1; 32] },
            Frame::File {
                name: "dir/ä b.txt".into(),
                size: 12345,
                mode: 0o644,
                mtime_s: -5,
                mtime_ns: 999,
                verify: true,
            },
            Frame::File {
                name: "stdin".into(),
                size: STREAM_SIZE,
                mode: 0o600,
                mtime_s: 1,
                mtime_ns: 0,
                verify: false,
            },
            Frame::Ready {
                offset: 0,
                prefix: None,
            },
            Frame::Ready {
                offset: 4096,
                prefix: Some([9; 32]),
            },
            Frame::Refuse {
                code: Code::UnsafeName,
                message: "no".into(),
            },
            Frame::Start { offset: 77 },
            Frame::StartSparse {
                offset: 4096,
                extents: vec![(4096, 10), (1 << 40, 3)],
            },
            Frame::StartSparse {
                offset: 0,
                extents: vec![(7, 1); MAX_EXTENTS],
            },
            Frame::Data(vec![1, 2, 3]),
            Frame::EndData,
            Frame::Trailer { hash: None },
            Frame::Trailer {
                hash: Some([3; 32]),
            },
            Frame::Ack {
                code: Code::Ok,
                bytes: 5,
                message: String::new(),
            },
            Frame::Put {
                name: "d/small".into(),
                size: MAX_PUT,
                mode: 0o600,
                mtime_s: 3,
                mtime_ns: 4,
                verify: true,
            },
            Frame::Dir {
                name: "a/empty".into(),
                mode: 0o750,
            },
            Frame::Range {
                name: "big".into(),
                size: 1 << 40,
                mode: 0o640,
                mtime_s: -5,
                mtime_ns: 6,
                verify: true,
                offset: 1 << 30,
                len: 1 << 30,
            },
            Frame::Link {
                name: "a/l".into(),
                target: "../b".into(),
            },
            Frame::Bye,
            Frame::Abort {
                message: "file shrank".into(),
            },
        ]
    }

    #[test]
    fn every_frame_round_trips() {
        for f in samples() {
            let b = f.to_bytes();
            let (g, used) = Frame::parse(&b).unwrap().unwrap();
            assert_eq!(g, f);
            assert_eq!(used, b.len());
            assert_eq!(Frame::parse(&b[..b.len() - 1]).unwrap_or(None), None);
        }
    }

    #[test]
    fn hostile_headers_are_refused_before_allocation() {
        assert_eq!(
            Frame::check_header([T_FILE, 0xff, 0xff, 0xff, 0xff]),
            Err(WireError::TooLong {
                what: "frame",
                len: u32::MAX as usize,
                max: MAX_CONTROL
            })
        );
        assert_eq!(
            Frame::check_header([200, 0, 0, 0, 0]),
            Err(WireError::UnknownType(200))
        );
        let mut hello = Frame::Hello {
            version: 1,
            auth: false,
            nonce: [0; 32],
        }
        .to_bytes();
        hello[5] = b'X';
        assert_eq!(Frame::parse(&hello), Err(WireError::BadMagic));
    }

    #[test]
    fn trailing_bytes_and_bad_text_are_malformed() {
        let mut b = Frame::Bye.to_bytes();
        b[4] = 1;
        b.push(0);
        assert_eq!(Frame::parse(&b), Err(WireError::Malformed("frame")));
        let mut f = Frame::Abort {
            message: "ab".into(),
        }
        .to_bytes();
        let n = f.len();
        f[n - 1] = 0xff;
        assert_eq!(Frame::parse(&f), Err(WireError::BadUtf8("message")));
    }

    proptest! {
        /// Arbitrary bytes never panic the decoder, and whatever it accepts re-encodes to
        /// exactly the bytes it consumed (no silent normalisation).
        #[test]
        fn decoder_is_total_and_exact(bytes in proptest::collection::vec(any::<u8>(), 0..300),
                                      ty in 0u8..15) {
            let mut b = vec![ty];
            b.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
            b.extend_from_slice(&bytes);
            if let Ok(Some((f, used))) = Frame::parse(&b) {
                prop_assert_eq!(f.to_bytes(), b[..used].to_vec());
            }
        }
    }
}
