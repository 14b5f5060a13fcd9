//! The sending end of a session: the handshake, then each [`Source`] by its kind — small
//! files as `Put`s in a window ([`Pipeline`]), larger ones by `sendfile` (from version 7
//! pipelined too), empty directories, symlinks, streams and ranges — then `Bye`.

use super::super::auth::{self, Role};
use super::super::digest::{hash_range, prefix_state};
use super::super::handshake::StreamRequest;
use super::super::sparse;
use super::super::tls::{ktls, Channel, TlsError, TlsLink, Trust};
use super::super::wire::{
    tls_preamble, Code, Features, Frame, AUTHENTICATED_FROM, ENCRYPTED_FROM, MAX_CONTROL, MAX_DATA,
    MIN_VERSION, SESSION_ID_LEN, STREAM_SIZE, VERSION,
};
use super::range::send_range;
use super::send_channel::SendChannel;
use super::{
    ack_outcome, io_err, join_hasher, ready_or_refuse, unexpected, Answer, Entry, FileOutcome,
    Progress, SendOptions, SendSecurity, SessionReport, Source, Tally, TransferError, FILES_AHEAD,
    MAX_WINDOW, PUT_THRESHOLD,
};
use super::{note_carrier, Carrier};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read};
use std::net::TcpStream;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use zcnet::stream::Sender;

/// `Put` bytes gathered before one write: small enough that the receiver starts on the
/// first files while the sender reads the next ones.
const BATCH: usize = 64 << 10;

/// Runs a whole session from the sending side: handshake, every source in order, goodbye.
/// A file the receiver refuses or fails to verify is reported and the session goes on; a
/// failure of the connection itself ends it.
pub fn send_session(
    tx: &mut Sender,
    sources: Vec<Source>,
    opts: &SendOptions,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<SessionReport, TransferError> {
    let mut chan = SendChannel::new(tx);
    let opened = handshake(&mut chan, opts, StreamRequest::Open(1))?;
    let mut report = entries(chan, opened.version, sources, opts, progress)?;
    report.trust = opened.trust;
    note_carrier(opened.carrier.as_ref(), &mut report);
    Ok(report)
}

/// A sender's connection past its handshake.
pub(crate) struct Opened {
    /// The session's protocol version.
    pub version: u16,
    /// From version 5, the session id the receiver answered with.
    pub session: Option<[u8; SESSION_ID_LEN]>,
    /// The TLS connection the session runs in, if it is encrypted.
    pub tls: Option<Arc<TlsLink>>,
    /// How the receiver's key was trusted, if it is encrypted.
    pub trust: Option<Trust>,
    /// Who makes its TLS records (the kernel, or rustls and why), if it is encrypted.
    pub carrier: Option<Carrier>,
}

/// The sender's handshake: `Hello`, the token's proof both ways, and from version 5 the
/// connection's place in its session (`stream`: `Open` or `Join`, sent right behind our
/// `Hello`/`Auth` so it costs no round trip of its own), all inside TLS when `opts` asks
/// for it ([`secure`]). Returns the session's version, from version 5 the session id the
/// receiver answered with, and the TLS connection.
pub(crate) fn send_handshake(
    tx: &mut Sender,
    opts: &SendOptions,
    stream: StreamRequest,
) -> Result<Opened, TransferError> {
    handshake(&mut SendChannel::new(tx), opts, stream)
}

/// Sends `sources` over a connection past its handshake (`opened`), then says goodbye.
pub(crate) fn send_entries(
    tx: &mut Sender,
    opened: &Opened,
    sources: Vec<Source>,
    opts: &SendOptions,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<SessionReport, TransferError> {
    let chan = SendChannel::with_tls(tx, opened.tls.clone());
    let mut report = entries(chan, opened.version, sources, opts, progress)?;
    report.trust = opened.trust.clone();
    note_carrier(opened.carrier.as_ref(), &mut report);
    Ok(report)
}

/// Starts TLS on a fresh connection when `security` asks for it, before any frame: sends the
/// `ClientHello`, checks the receiver's plaintext preamble ([`tls_preamble`]) byte for
/// byte, completes the handshake (the receiver's key checked as `Expect` says), then offers
/// the records to the kernel ([`ktls::offload`]): where it takes them the session goes on
/// in plaintext on the socket (the kernel encrypts, `sendfile` keeps working), else every
/// byte goes through the TLS connection and the fallback is counted with its reason.
/// Returns how the key was trusted, the channel's exporter value (the token's proofs are
/// bound to it; taken before the keys leave rustls) and who makes the records.
fn secure(
    chan: &mut SendChannel<'_>,
    security: &SendSecurity,
) -> Result<Option<(Trust, [u8; 32], Carrier)>, TransferError> {
    let SendSecurity::Tls(expect) = security else {
        return Ok(None);
    };
    let fd = chan
        .socket()
        .try_clone_to_owned()
        .map_err(|e| zcnet::Error::io("dup of the session's socket", e))?;
    let mut verdict: Option<TransferError> = None;
    let mut check = |s: &mut TcpStream| -> Result<(), TlsError> {
        read_preamble(s).map_err(|e| {
            verdict = Some(e);
            TlsError::Tls(rustls::Error::General("the receiver's preamble".into()))
        })
    };
    let ch = match Channel::connect_after(TcpStream::from(fd), expect.clone(), &mut check) {
        Ok(ch) => ch,
        Err(e) => return Err(verdict.take().unwrap_or(e.into())),
    };
    let trust = ch.trust().cloned().ok_or(TlsError::NoPeerKey)?;
    let binding = *ch.binding();
    let carrier = match ktls::offload(ch)? {
        // The duplicate descriptor goes; the socket, now the kernel's TLS, stays.
        ktls::Offload::Kernel(k) => Carrier::Kernel(k.cipher()),
        ktls::Offload::User(ch, why) => {
            chan.count_fallback(zcnet::FallbackReason::KtlsUnavailable);
            chan.encrypt(Arc::new(TlsLink::from_channel(*ch, true)?));
            Carrier::User(why.to_string())
        }
    };
    Ok(Some((trust, binding, carrier)))
}

/// Reads the receiver's first bytes where an encrypting receiver's preamble is due: `Ok`
/// for exactly [`tls_preamble`]; a receiver's `Hello` (it does not encrypt) or any other
/// refusal is an error that says so.
fn read_preamble(s: &mut TcpStream) -> Result<(), TransferError> {
    let expected = tls_preamble();
    let eof = |e: io::Error| -> TransferError {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            zcnet::Error::PeerClosed {
                op: "reading the receiver's first bytes",
            }
            .into()
        } else {
            zcnet::Error::io("reading the receiver's first bytes", e).into()
        }
    };
    let mut h = [0u8; 5];
    s.read_exact(&mut h).map_err(eof)?;
    let (ty, len) = Frame::check_header(h)?;
    if len > MAX_CONTROL {
        return Err(TransferError::Unexpected {
            expected: "the receiver's TLS preamble",
            got: "data",
        });
    }
    let mut p = vec![0u8; len];
    s.read_exact(&mut p).map_err(eof)?;
    if h[..] == expected[..5] && p[..] == expected[5..] {
        return Ok(());
    }
    match Frame::decode(ty, &p)? {
        Frame::Hello { version, .. } => Err(TransferError::NotEncrypted(format!(
            "the receiver does not encrypt: it runs with --plaintext, or is a zcnet older than protocol version {ENCRYPTED_FROM} (it speaks {version}); this sender sends only inside TLS (run both ends with --plaintext to send in the clear, on a network you trust)"
        ))),
        Frame::Refuse { message, .. } => Err(TransferError::Refused(message)),
        other => Err(unexpected("the receiver's TLS preamble", &other)),
    }
}

/// The receiver's `Hello`, read where the session begins (the receiver speaks first):
/// whether it asks for a token, its nonce and its version.
fn receiver_hello(chan: &mut SendChannel<'_>) -> Result<(bool, [u8; 32], u16), TransferError> {
    match chan.read_frame()? {
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
            Ok((auth, nonce, version))
        }
        Frame::Refuse { message, .. } => Err(TransferError::Refused(message)),
        other => Err(unexpected("hello", &other)),
    }
}

fn handshake(
    chan: &mut SendChannel<'_>,
    opts: &SendOptions,
    stream: StreamRequest,
) -> Result<Opened, TransferError> {
    chan.no_delay()?;
    let secured = secure(chan, &opts.security)?;
    let (auth_required, rnonce, theirs) = receiver_hello(chan)?;
    // The newest version both speak: a version-1 receiver is served one file at a time.
    let version = theirs.min(VERSION).min(opts.max_version).max(MIN_VERSION);
    let features = Features::of(version);
    if secured.is_some() && !features.tls {
        return Err(TransferError::Version {
            ours: version,
            theirs,
        });
    }
    if auth_required && opts.token.is_some() && !features.authenticated {
        // Before version 8 the proofs do not cover the version: a `Hello` lowered on the
        // way would pass unseen, so the token is not proved in such a session.
        return Err(TransferError::Auth(format!(
            "the receiver speaks protocol version {theirs} and this sender {version}; with a token both ends need version {AUTHENTICATED_FROM} or later, where the proofs cover the version and every field of the handshake (upgrade zcnet at the receiver)"
        )));
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
    chan.send_bytes(&sender_hello)?;
    if opts.token.is_some() && !auth_required {
        // The receiver must prove the token too: one that does not ask for it cannot, and
        // may be anyone listening on that address.
        return Err(TransferError::Auth(
            "the receiver did not ask for the token, so it cannot prove it knows it; refusing to send to it".into(),
        ));
    }
    let join = match stream {
        _ if !features.streams => None,
        StreamRequest::Open(n) => Some(Frame::Open { streams: n }),
        StreamRequest::Join(session) => Some(Frame::Join { session }),
        StreamRequest::Single => Some(Frame::Open { streams: 1 }),
    };
    let join_bytes = join.as_ref().map(Frame::to_bytes).unwrap_or_default();
    // Both proofs cover the handshake as this end saw and sent it (version 8), and over TLS
    // the channel's exporter value too (version 10).
    let transcript = match &secured {
        Some((_, binding, _)) => {
            auth::bound_transcript(binding, &receiver_hello, &sender_hello, &join_bytes)
        }
        None => auth::transcript(&receiver_hello, &sender_hello, &join_bytes),
    };
    if auth_required {
        let token = opts.token.as_deref().ok_or_else(|| {
            TransferError::Auth("the receiver requires a token (--token or ZCNET_TOKEN)".into())
        })?;
        let mac = auth::prove(token, Role::Sender, &transcript);
        chan.send_frame(&Frame::Auth { mac })?;
    }
    if !join_bytes.is_empty() {
        chan.send_bytes(&join_bytes)?;
    }
    if let (true, Some(token)) = (auth_required, opts.token.as_deref()) {
        receiver_proof(chan, token, &transcript)?;
    }
    let session = match join {
        None => None,
        Some(_) => match chan.read_frame()? {
            Frame::Session { id } => Some(id),
            Frame::Refuse { message, .. } => return Err(TransferError::Refused(message)),
            other => return Err(unexpected("session", &other)),
        },
    };
    Ok(Opened {
        version,
        session,
        tls: chan.tls().cloned(),
        carrier: secured.as_ref().map(|(_, _, c)| c.clone()),
        trust: secured.map(|(t, _, _)| t),
    })
}

/// The receiver's proof that it knows `token`, over the handshake's `transcript`.
fn receiver_proof(
    chan: &mut SendChannel<'_>,
    token: &[u8],
    transcript: &[u8],
) -> Result<(), TransferError> {
    match chan.read_frame()? {
        Frame::Auth { mac } if auth::verify(token, Role::Receiver, transcript, &mac) => Ok(()),
        Frame::Auth { .. } => Err(TransferError::Auth(
            "the receiver could not prove it knows the token".into(),
        )),
        Frame::Refuse { message, .. } => Err(TransferError::Auth(message)),
        other => Err(unexpected("auth", &other)),
    }
}

/// A sending session past its handshake: its connection, what its version carries, the
/// window of files awaiting their answers, and where outcomes go.
struct Sending<'a> {
    chan: SendChannel<'a>,
    version: u16,
    features: Features,
    opts: &'a SendOptions,
    pipe: Pipeline,
    tally: Tally<'a>,
}

fn entries<'a>(
    chan: SendChannel<'a>,
    version: u16,
    sources: Vec<Source>,
    opts: &'a SendOptions,
    progress: &'a mut dyn FnMut(Progress<'_>),
) -> Result<SessionReport, TransferError> {
    let mut s = Sending {
        chan,
        version,
        features: Features::of(version),
        opts,
        pipe: Pipeline::new(opts.window.clamp(1, MAX_WINDOW)),
        tally: Tally::new(progress),
    };
    for src in sources {
        s.source(src)?;
    }
    s.drain()?;
    s.chan.send_frame(&Frame::Bye)?;
    match s.chan.read_frame()? {
        Frame::Bye => {
            if let Some(link) = s.chan.tls() {
                link.close();
            }
            Ok(s.tally.report)
        }
        other => Err(unexpected("bye", &other)),
    }
}

impl Sending<'_> {
    /// Sends one source. Only a `File` may go while earlier answers are due; any other
    /// waits for its own answer, so every answer before it is read first.
    fn source(&mut self, src: Source) -> Result<(), TransferError> {
        if let Source::File { path, name } = src {
            return self.file(&path, &name);
        }
        self.drain()?;
        let outcome = match src {
            Source::File { .. } => unreachable!("sent above"),
            Source::Range {
                path,
                name,
                offset,
                len,
                size,
            } => {
                let (chan, opts) = (&mut self.chan, self.opts);
                let o = send_range(
                    chan,
                    &path,
                    &name,
                    (offset, len, size),
                    opts,
                    &mut self.tally,
                )?;
                // A range's outcome is its file's only with the others: the caller merges them.
                self.tally.range_done(o);
                return Ok(());
            }
            Source::Dir { path, name } => self.dir(&path, &name)?,
            Source::Link { name, target } => self.link(&name, target)?,
            Source::Stream { reader, name } => self.stream(reader, &name)?,
        };
        self.tally.done(outcome);
        Ok(())
    }

    /// Writes what is gathered and reads every outstanding answer.
    fn drain(&mut self) -> Result<(), TransferError> {
        self.pipe.drain(&mut self.chan, &mut self.tally)
    }

    /// A regular file: a `Put` when small (version 2), else by `sendfile`, its `Ack` read
    /// at once or (version 7) in turn with the others.
    fn file(&mut self, path: &Path, name: &str) -> Result<(), TransferError> {
        if self.features.puts {
            match read_small(path)? {
                Small::Read(data, meta) => {
                    let (chan, opts) = (&mut self.chan, self.opts);
                    return self
                        .pipe
                        .put(chan, name, data, &meta, opts, &mut self.tally);
                }
                Small::Changed { expected, got } => {
                    // Never announce a size the bytes do not have: this file fails here.
                    self.drain()?;
                    self.tally.done(FileOutcome::failed(
                        Entry::File,
                        name,
                        Code::Length,
                        format!("{} changed size while being read ({expected} bytes, then {got}); not sent", path.display()),
                    ));
                    return Ok(());
                }
                Small::Large => {}
            }
        }
        if self.features.pipelined_files {
            // Answers to earlier files may still be due; only the window of files is
            // bounded.
            self.pipe.flush(&mut self.chan)?;
            while self.pipe.files_out >= FILES_AHEAD {
                self.pipe.settle_one(&mut self.chan, &mut self.tally)?;
            }
            match self.send_one_file(path, name)? {
                Sent::Refused(outcome) => self.tally.done(outcome),
                Sent::Trailer { bytes, verified } => self.pipe.push(name, bytes, verified, true),
            }
            return Ok(());
        }
        self.drain()?;
        let outcome = match self.send_one_file(path, name)? {
            Sent::Refused(outcome) => outcome,
            Sent::Trailer { bytes, verified } => {
                ack_outcome(self.chan.answer()?, name, bytes, verified)?
            }
        };
        self.tally.done(outcome);
        Ok(())
    }

    /// An empty directory: a `Dir` frame and its `Ack` (version 3), or a failure that says
    /// the receiver is too old to create one.
    fn dir(&mut self, path: &Path, name: &str) -> Result<FileOutcome, TransferError> {
        if !self.features.tree_entries {
            return Ok(FileOutcome::failed(
                Entry::Dir,
                name,
                Code::Version,
                format!("the receiver speaks protocol version {}, which cannot create an empty directory (3 can); not created", self.version),
            ));
        }
        let meta = std::fs::symlink_metadata(path)
            .map_err(io_err(format!("reading {}", path.display())))?;
        self.chan.send_frame(&Frame::Dir {
            name: name.into(),
            mode: meta.mode() & 0o777,
        })?;
        let mut o = ack_outcome(self.chan.read_frame()?, name, 0, false)?;
        o.entry = Entry::Dir;
        Ok(o)
    }

    /// A symlink: a `Link` frame and its `Ack` (version 3), or a failure that says the
    /// receiver is too old to create one.
    fn link(&mut self, name: &str, target: String) -> Result<FileOutcome, TransferError> {
        if !self.features.tree_entries {
            return Ok(FileOutcome::failed(
                Entry::Link,
                name,
                Code::Version,
                format!("the receiver speaks protocol version {}, which cannot create a symlink (3 can); not created", self.version),
            ));
        }
        self.chan.send_frame(&Frame::Link {
            name: name.into(),
            target,
        })?;
        let mut o = ack_outcome(self.chan.read_frame()?, name, 0, false)?;
        o.entry = Entry::Link;
        Ok(o)
    }

    /// One file by `sendfile`: `File`, the receiver's answer (read through the pipeline,
    /// which settles the answers to earlier files that come first), `Start` (or
    /// `StartSparse`), the bytes, `Trailer`. The `Ack` is left to the caller: read at once,
    /// or from version 7 in turn with the rest.
    fn send_one_file(&mut self, path: &Path, name: &str) -> Result<Sent, TransferError> {
        let file = File::open(path).map_err(io_err(format!("opening {}", path.display())))?;
        let meta = file
            .metadata()
            .map_err(io_err(format!("reading {}", path.display())))?;
        let size = meta.len();
        self.chan.send_frame(&Frame::File {
            name: name.into(),
            size,
            mode: meta.mode() & 0o7777,
            mtime_s: meta.mtime(),
            mtime_ns: meta.mtime_nsec() as u32,
            verify: self.opts.verify,
        })?;
        let (offer, prefix) = match self.pipe.answer(&mut self.chan, &mut self.tally)? {
            Ok(v) => v,
            Err((code, message)) => {
                return Ok(Sent::Refused(FileOutcome::failed(
                    Entry::File,
                    name,
                    code,
                    message,
                )))
            }
        };
        let out = Outgoing {
            file: &file,
            path,
            name,
            size,
        };
        let (start, kept) = resume_point(&file, size, offer, prefix);
        let extents = self.announce_start(&out, start)?;
        self.tally.start(name, Some(size), start);
        // `StartSparse` went out exactly when the extents are not the whole rest of the file.
        let digest = self.features.sparse_digest && extents != [(start, size - start)];
        let hash = self.send_data(&out, start, kept, &extents, digest)?;
        let verified = hash.is_some();
        self.chan.send_frame(&Frame::Trailer { hash })?;
        Ok(Sent::Trailer {
            bytes: size - start,
            verified,
        })
    }

    /// `Start` at `start`, or from version 4 `StartSparse` with the data extents when the
    /// file has holes (they are not sent); the extents to send, back to back.
    fn announce_start(
        &mut self,
        out: &Outgoing<'_>,
        start: u64,
    ) -> Result<Vec<(u64, u64)>, TransferError> {
        let extents = match self.features.sparse {
            true => sparse::data_extents(out.file, start, out.size).map_err(io_err(format!(
                "finding the holes of {}",
                out.path.display()
            )))?,
            false => None,
        };
        Ok(match extents {
            Some(extents) => {
                self.chan.send_frame(&Frame::StartSparse {
                    offset: start,
                    extents: extents.clone(),
                })?;
                extents
            }
            None => {
                self.chan.send_frame(&Frame::Start { offset: start })?;
                vec![(start, out.size - start)]
            }
        })
    }

    /// Sends `extents` of the file by `sendfile` while a second thread hashes the whole
    /// file from the page cache (going on from the resumed prefix's state `kept`) — or with
    /// `digest` (a sparse file, version 9) only its extents, into its sparse digest; the hash
    /// when one was asked for. A file that shrank or grew meanwhile, or whose holes moved
    /// (data written into one would be in no hash), fails the session.
    fn send_data(
        &mut self,
        out: &Outgoing<'_>,
        start: u64,
        kept: Option<blake3::Hasher>,
        extents: &[(u64, u64)],
        digest: bool,
    ) -> Result<Option<[u8; 32]>, TransferError> {
        let Outgoing {
            file,
            path,
            name,
            size,
        } = *out;
        let shrank = |got| TransferError::Shrank {
            name: name.into(),
            expected: size,
            got,
        };
        // Over TLS the bytes pass through memory anyway (to be sealed): each chunk is hashed
        // there, right before it is sealed, rather than read from the page cache a second
        // time by a hashing thread — one pass over the file, not two. (A sparse file's digest
        // and a file whose holes are skipped keep the thread: the hash covers other bytes
        // than those sent.)
        if self.chan.tls().is_some() && !digest && extents == [(start, size - start)] {
            let mut h = self.opts.verify.then(|| kept.unwrap_or_default());
            let tally = &mut self.tally;
            self.chan.send_extent_tls(
                file,
                start,
                size,
                &shrank,
                &mut |n| tally.bytes(n),
                h.as_mut(),
            )?;
            self.check_not_grown(out)?;
            return Ok(h.map(|h| *h.finalize().as_bytes()));
        }
        std::thread::scope(|s| {
            // The hash is computed from the page cache on another thread, off the data path.
            let hasher = self.opts.verify.then(|| {
                s.spawn(|| {
                    let mut h = kept.unwrap_or_default();
                    if digest {
                        // `h` is the kept prefix's state (of no bytes from 0).
                        let prefix = *h.finalize().as_bytes();
                        return sparse::digest(file, size, start, &prefix, extents);
                    }
                    hash_range(file, &mut h, start, size).map(|()| *h.finalize().as_bytes())
                })
            });
            let mut done = start;
            for &(from, len) in extents {
                // A hole before this extent: counted, not sent.
                self.tally.bytes(from - done);
                let tally = &mut self.tally;
                self.chan
                    .send_extent(file, from, from + len, &shrank, &mut |n| tally.bytes(n))?;
                done = from + len;
            }
            self.tally.bytes(size - done);
            self.check_not_grown(out)?;
            if digest && self.opts.verify {
                let again = sparse::data_extents(file, start, size)
                    .map_err(io_err(format!("finding the holes of {}", path.display())))?;
                if again.as_deref() != Some(extents) {
                    return Err(io_err(format!("sending {}", path.display()))(
                        io::Error::other(
                            "its holes changed while it was sent (data written into a hole is in no hash); the receiver keeps no final file",
                        ),
                    ));
                }
            }
            join_hasher(hasher, path)
        })
    }

    /// `sendfile` stops at the announced size (and so does a read over TLS), so a file
    /// appended to meanwhile would arrive cut short yet verified (the hash covers the same
    /// prefix): fail it instead.
    fn check_not_grown(&self, out: &Outgoing<'_>) -> Result<(), TransferError> {
        let now = out
            .file
            .metadata()
            .map_err(io_err(format!("reading {}", out.path.display())))?
            .len();
        if now > out.size {
            return Err(TransferError::Grew {
                name: out.name.into(),
                expected: out.size,
                now,
            });
        }
        Ok(())
    }

    /// A stream of unknown length (stdin), in `Data` frames after its `Start`, hashed as it
    /// passes through memory.
    fn stream(
        &mut self,
        mut reader: Box<dyn Read + Send>,
        name: &str,
    ) -> Result<FileOutcome, TransferError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        self.chan.send_frame(&Frame::File {
            name: name.into(),
            size: STREAM_SIZE,
            mode: 0o644,
            mtime_s: now.as_secs() as i64,
            mtime_ns: now.subsec_nanos(),
            verify: self.opts.verify,
        })?;
        if let Err((code, message)) = ready_or_refuse(self.chan.read_frame()?)? {
            return Ok(FileOutcome::failed(Entry::File, name, code, message));
        }
        self.chan.send_frame(&Frame::Start { offset: 0 })?;
        self.tally.start(name, None, 0);
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
            self.chan.send_frame(&Frame::Data(buf[..n].to_vec()))?;
            total += n as u64;
            self.tally.bytes(n as u64);
        }
        self.chan.send_frame(&Frame::EndData)?;
        let hash = self.opts.verify.then(|| *h.finalize().as_bytes());
        let verified = hash.is_some();
        self.chan.send_frame(&Frame::Trailer { hash })?;
        ack_outcome(self.chan.read_frame()?, name, total, verified)
    }
}

/// A file being sent by `sendfile`: what the steps of [`Sending::send_one_file`] share.
#[derive(Clone, Copy)]
struct Outgoing<'f> {
    file: &'f File,
    path: &'f Path,
    name: &'f str,
    /// Its size when the send began (the size announced).
    size: u64,
}

/// Where to start sending a file of `size` bytes the receiver answered with `offer` and the
/// hash of the `prefix` it has: there only if that prefix really is ours, with its hash
/// state (where the whole file's hash goes on from, so the prefix is read once); else at 0.
fn resume_point(
    file: &File,
    size: u64,
    offer: u64,
    prefix: Option<[u8; 32]>,
) -> (u64, Option<blake3::Hasher>) {
    match prefix {
        Some(p) if offer > 0 && offer <= size => match prefix_state(file, offer) {
            Ok(mine) if *mine.finalize().as_bytes() == p => (offer, Some(mine)),
            _ => (0, None),
        },
        _ => (0, None),
    }
}

/// How far [`Sending::send_one_file`] took a file.
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
}

impl Pipeline {
    fn new(window: usize) -> Self {
        Pipeline {
            pending: VecDeque::new(),
            files_out: 0,
            batch: Vec::new(),
            window,
        }
    }

    /// One small file as a `Put` (header, bytes, trailer), gathered into the batch.
    fn put(
        &mut self,
        chan: &mut SendChannel<'_>,
        name: &str,
        data: Vec<u8>,
        meta: &std::fs::Metadata,
        opts: &SendOptions,
        tally: &mut Tally<'_>,
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
        tally.bytes(size);
        self.push(name, size, hash.is_some(), false);
        if self.batch.len() >= BATCH {
            self.flush(chan)?;
        }
        if self.pending.len() >= self.window {
            // Full: read answers down to half the window, so the next batch carries many
            // files again instead of one file per answer.
            self.flush(chan)?;
            while self.pending.len() > self.window / 2 {
                self.settle_one(chan, tally)?;
            }
        }
        Ok(())
    }

    /// Writes the gathered `Put`s ([`SendChannel::send_batch`], which reads the answers
    /// that arrive meanwhile).
    fn flush(&mut self, chan: &mut SendChannel<'_>) -> Result<(), TransferError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        chan.send_batch(&self.batch)?;
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
        chan: &mut SendChannel<'_>,
        tally: &mut Tally<'_>,
    ) -> Result<Answer, TransferError> {
        loop {
            match chan.answer()? {
                Frame::Ready { offset, prefix } => return Ok(Ok((offset, prefix))),
                Frame::Refuse { code, message } => {
                    while !self.pending.is_empty() {
                        self.settle_one(chan, tally)?;
                    }
                    return Ok(Err((code, message)));
                }
                ack @ Frame::Ack { .. } if !self.pending.is_empty() => {
                    self.settle_with(ack, tally)?
                }
                other => return Err(unexpected("ready or refuse", &other)),
            }
        }
    }

    fn settle_one(
        &mut self,
        chan: &mut SendChannel<'_>,
        tally: &mut Tally<'_>,
    ) -> Result<(), TransferError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let f = chan.answer()?;
        self.settle_with(f, tally)
    }

    /// The oldest outstanding file's answer is `frame`.
    fn settle_with(&mut self, frame: Frame, tally: &mut Tally<'_>) -> Result<(), TransferError> {
        let Some((name, bytes, verified, file)) = self.pending.pop_front() else {
            return Ok(());
        };
        self.files_out -= usize::from(file);
        tally.done(ack_outcome(frame, &name, bytes, verified)?);
        Ok(())
    }

    /// Writes what is gathered and reads every outstanding answer.
    fn drain(
        &mut self,
        chan: &mut SendChannel<'_>,
        tally: &mut Tally<'_>,
    ) -> Result<(), TransferError> {
        self.flush(chan)?;
        while !self.pending.is_empty() {
            self.settle_one(chan, tally)?;
        }
        if let Some(f) = chan.held()? {
            // Nothing is due from the receiver before our next frame.
            return Err(unexpected("nothing after the last answer", &f));
        }
        Ok(())
    }
}
