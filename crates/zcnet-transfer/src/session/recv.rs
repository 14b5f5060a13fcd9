//! The receiving end of a session: the handshake ([`ReceiverHandshake`]), then one handler
//! per kind of frame — `File`, `Put`, `Dir`, `Link`, `Range` — until `Bye`. Files that
//! fail a check are refused or acknowledged with the reason and the session goes on.

use super::super::auth;
use super::super::finish::{Finished, Finisher, Staged};
use super::super::handshake::{ReceiverHandshake, StreamRequest};
use super::super::landing::{LandingHash, LAND_STEP};
use super::super::ranges::{FileMeta, RangedFiles};
use super::super::sparse;
use super::super::store::{self, Incoming, Refusal, Store};
use super::super::tls::{ktls, Channel, TlsError, TlsLink};
use super::super::wire::{
    tls_preamble, Code, Features, Frame, MAX_CONTROL, SESSION_ID_LEN, STREAM_SIZE,
};
use super::range::{receive_range, RangeFrame};
use super::recv_channel::RecvChannel;
use super::{
    io_err, trailer_hash, unexpected, Entry, FileOutcome, Progress, RecvOptions, RecvSecurity,
    SessionReport, Tally, TransferError, MAX_LISTED_FAILURES, PUT_ACK_MESSAGE, STEP,
};
use std::io::{self, Write};
use std::net::TcpStream;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::thread::Scope;
use zcnet::stream::Receiver;

/// Runs a whole session from the receiving side until the sender says goodbye: the
/// handshake ([`ReceiverHandshake`], reading nothing larger than handshake frames before the
/// proof), then [`receive_files`].
pub fn receive_session(
    rx: &mut Receiver,
    store: &mut Store,
    opts: &RecvOptions,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<SessionReport, TransferError> {
    let mut chan = RecvChannel::new(rx);
    let (version, carrier) = handshake(&mut chan, opts)?;
    let mut report = receive_on(chan, store, version, &RangedFiles::default(), progress)?;
    super::note_carrier(carrier.as_ref(), &mut report);
    Ok(report)
}

/// The receiver's handshake on a connection that serves one session: returns the version
/// the sender chose, and over TLS who makes its records.
fn handshake(
    chan: &mut RecvChannel<'_>,
    opts: &RecvOptions,
) -> Result<(u16, Option<super::Carrier>), TransferError> {
    chan.no_delay()?;
    let secured = secure(chan, &opts.security)?;
    let binding = secured.as_ref().map(|(b, _)| *b);
    let mut hs =
        ReceiverHandshake::new(opts.token.clone()).map_err(io_err("reading random bytes"))?;
    if let Some(b) = binding {
        hs.over_tls(b);
    }
    chan.reply_bytes(&hs.greeting())?;
    let accepted = loop {
        let want = hs.want();
        if !chan.read_exact(want)? {
            return Err(zcnet::Error::PeerClosed { op: "handshake" }.into());
        }
        let n = want.len();
        match hs.advance(n) {
            Ok(Some(a)) => break a,
            Ok(None) => {}
            Err(e) => {
                if let Some(f) = e.refusal() {
                    let _ = chan.reply(&f);
                }
                return Err(e.into());
            }
        }
    };
    if let Some(r) = &accepted.reply {
        chan.reply_bytes(r)?;
    }
    match accepted.stream {
        StreamRequest::Single => {}
        // One connection serves one session here: its id is never presented again, and
        // the sender's further streams are turned away (`server` joins them).
        StreamRequest::Open(_) => chan.reply(&Frame::Session { id: session_id()? })?,
        StreamRequest::Join(_) => {
            let message = "this receiver takes one connection per session; nothing to join";
            let _ = chan.reply(&Frame::Refuse {
                code: Code::NoSession,
                message: message.into(),
            });
            return Err(TransferError::Refused(message.into()));
        }
    }
    Ok((accepted.version, secured.map(|(_, c)| c)))
}

/// Starts TLS on a fresh connection when `security` asks for it, before any frame: sends
/// the plaintext preamble ([`tls_preamble`]: what a sender that does not encrypt prints and
/// stops at), then serves the TLS handshake with the receiver's identity, then offers the
/// records to the kernel ([`ktls::offload`]): where it takes them the session goes on in
/// plaintext on the socket (the kernel decrypts, `splice` keeps working), else every byte
/// goes through the TLS connection and the fallback is counted with its reason. Returns
/// the channel's exporter value (the token's proofs are bound to it; taken before the keys
/// leave rustls) and who makes the records.
fn secure(
    chan: &mut RecvChannel<'_>,
    security: &RecvSecurity,
) -> Result<Option<([u8; 32], super::Carrier)>, TransferError> {
    let RecvSecurity::Tls(identity) = security else {
        return Ok(None);
    };
    let fd = chan
        .socket()
        .try_clone_to_owned()
        .map_err(|e| zcnet::Error::io("dup of the session's socket", e))?;
    let mut stream = TcpStream::from(fd);
    stream
        .write_all(&tls_preamble())
        .map_err(|e| zcnet::Error::io("sending the TLS preamble", e))?;
    let ch = Channel::accept(stream, identity).map_err(not_encrypted)?;
    let binding = *ch.binding();
    let carrier = match ktls::offload(ch)? {
        // The duplicate descriptor goes; the socket, now the kernel's TLS, stays.
        ktls::Offload::Kernel(k) => super::Carrier::Kernel(k.cipher()),
        ktls::Offload::User(ch, why) => {
            chan.count_fallback(zcnet::FallbackReason::KtlsUnavailable);
            chan.encrypt(Arc::new(TlsLink::from_channel(*ch, false)?));
            super::Carrier::User(why.to_string())
        }
    };
    Ok(Some((binding, carrier)))
}

/// A TLS handshake the sender ended before it began: it does not encrypt (it read the
/// preamble's refusal and left), which says more than "the TLS handshake ended".
pub(crate) fn not_encrypted(e: TlsError) -> TransferError {
    match e {
        TlsError::HandshakeEof => TransferError::NotEncrypted(
            "the sender closed the connection instead of starting TLS: it does not encrypt (a zcnet older than protocol version 10, or one run with --plaintext), and was told this receiver requires encryption".into(),
        ),
        e => e.into(),
    }
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
    receive_on(RecvChannel::new(rx), store, version, ranged, progress)
}

/// [`receive_files_ranged`] for a connection whose handshake ran inside TLS (`tls`, the
/// server's), or in plaintext with `None`.
pub(crate) fn receive_files_over(
    rx: &mut Receiver,
    tls: Option<Arc<TlsLink>>,
    store: &mut Store,
    version: u16,
    ranged: &RangedFiles,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<SessionReport, TransferError> {
    receive_on(
        RecvChannel::with_tls(rx, tls),
        store,
        version,
        ranged,
        progress,
    )
}

fn receive_on(
    chan: RecvChannel<'_>,
    store: &mut Store,
    version: u16,
    ranged: &RangedFiles,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<SessionReport, TransferError> {
    std::thread::scope(|scope| {
        Receiving {
            scope,
            chan,
            store,
            ranged,
            features: Features::of(version),
            tally: Tally::new(progress),
            finisher: None,
            bound_at: 2 * MAX_LISTED_FAILURES,
            holes: sparse::HoleBudget::default(),
        }
        .run()
    })
}

/// A receiving session past its handshake: what every frame's handler shares.
struct Receiving<'a, 'scope, 'env> {
    /// Where the finishing thread runs.
    scope: &'scope Scope<'scope, 'env>,
    chan: RecvChannel<'a>,
    store: &'a mut Store,
    /// The files arriving by ranges, shared by the session's streams.
    ranged: &'a RangedFiles,
    /// What the session's version carries.
    features: Features,
    tally: Tally<'a>,
    /// The thread that checks, syncs, renames and answers `Put`s (and from version 7
    /// `File`s) in turn, started on first use.
    finisher: Option<Finisher>,
    /// The report's length at which its failures are next bounded: whenever it has doubled
    /// (so the cost per file stays constant), failures beyond the first ones are counted,
    /// not listed.
    bound_at: usize,
    /// Below version 9, the holes this session may still have hashed as zeros.
    holes: sparse::HoleBudget,
}

/// How the sender starts a `File`'s data after our `Ready`.
enum StartFrame {
    /// At this offset; with a sparse file's data extents (version 4).
    At(u64, Option<Vec<(u64, u64)>>),
    /// It gave up on the file, saying why.
    Abort(String),
}

impl Receiving<'_, '_, '_> {
    fn run(mut self) -> Result<SessionReport, TransferError> {
        loop {
            self.bound_report();
            let Some(frame) = self.chan.next_frame()? else {
                return Err(zcnet::Error::PeerClosed {
                    op: "waiting for the next file",
                }
                .into());
            };
            if !self.answered_in_turn(&frame) {
                // Every earlier answer goes out before whatever this frame asks for.
                if let Some(f) = self.finisher.take() {
                    report_finished(f.settle(), &mut self.tally)?;
                }
            }
            match frame {
                Frame::Bye => {
                    self.chan.reply(&Frame::Bye)?;
                    return Ok(self.tally.report);
                }
                Frame::File {
                    name,
                    size,
                    mode,
                    mtime_s,
                    mtime_ns,
                    verify,
                } => self.on_file(name, meta(size, mode, (mtime_s, mtime_ns), verify))?,
                Frame::Put {
                    name,
                    size,
                    mode,
                    mtime_s,
                    mtime_ns,
                    verify,
                } if self.features.puts => {
                    self.on_put(name, meta(size, mode, (mtime_s, mtime_ns), verify))?
                }
                Frame::Dir { name, mode } if self.features.tree_entries => {
                    let result = self.store.make_dir(&name, mode);
                    self.answer_entry(Entry::Dir, name, result)?;
                }
                Frame::Link { name, target } if self.features.tree_entries => {
                    let result = self.store.make_link(&name, &target);
                    self.answer_entry(Entry::Link, name, result)?;
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
                } if self.features.ranges => self.on_range(RangeFrame {
                    name,
                    meta: meta(size, mode, (mtime_s, mtime_ns), verify),
                    offset,
                    len,
                })?,
                other => return Err(unexpected("file or bye", &other)),
            }
        }
    }

    /// Bounds the report's list of failures whenever it has doubled.
    fn bound_report(&mut self) {
        let report = &mut self.tally.report;
        if report.files.len() >= self.bound_at {
            report.bound_failures();
            self.bound_at = (2 * report.files.len()).max(2 * MAX_LISTED_FAILURES);
        }
    }

    /// Whether `frame` is answered in turn by the finishing thread, after the files before
    /// it: a `Put`, and from version 7 a `File` (its `Ready` goes out at once, its `Ack`
    /// after those of the files before it).
    fn answered_in_turn(&self, frame: &Frame) -> bool {
        matches!(frame, Frame::Put { .. })
            || (self.features.pipelined_files && matches!(frame, Frame::File { .. }))
    }

    /// A `Put` (version 2): read whole, then finished in turn.
    fn on_put(&mut self, name: String, meta: FileMeta) -> Result<(), TransferError> {
        let staged = receive_put(&mut self.chan, self.store, name, meta)?;
        self.tally.bytes(meta.size);
        self.finish_in_turn(staged)
    }

    /// A `Range` (version 6): answered before any of its data, so nothing may come ahead.
    fn on_range(&mut self, range: RangeFrame) -> Result<(), TransferError> {
        self.chan
            .nothing_ahead("nothing before our answer to a range")?;
        receive_range(
            &mut self.chan,
            self.store,
            self.ranged,
            range,
            &mut self.tally,
        )
    }

    /// A `File`: `Ready` (or `Refuse`), `Start`, its data spliced into the partial file (a
    /// stream's in `Data` frames), `Trailer`; then checked, synced, renamed and answered at
    /// once or (version 7) in turn by the finishing thread.
    fn on_file(&mut self, name: String, meta: FileMeta) -> Result<(), TransferError> {
        // A `File` waits for its `Ready`: bytes behind it are a peer out of step (and would
        // be lost to the splice that reads the data).
        self.chan
            .nothing_ahead("nothing before our answer to a file")?;
        let announced = (meta.size != STREAM_SIZE).then_some(meta.size);
        let mut inc = match self.store.begin(&name, announced, meta.verify) {
            Ok(i) => i,
            Err(Refusal { message, .. }) if self.store.deadline_passed() => {
                // Hashing what is on disk (for `--resume`) ran into the session's deadline.
                let what = format!("hashing {name:?} to offer it for --resume ({message})");
                let _ = self.reply_beside(&Frame::Refuse {
                    code: Code::Busy,
                    message: format!("the session's deadline passed while {what}"),
                });
                return Err(TransferError::DeadlinePassed { what });
            }
            Err(Refusal { code, message }) => {
                self.reply_beside(&Frame::Refuse {
                    code,
                    message: message.clone(),
                })?;
                self.tally
                    .done(FileOutcome::failed(Entry::File, name, code, message));
                return Ok(());
            }
        };
        self.reply_beside(&Frame::Ready {
            offset: inc.offset(),
            prefix: inc.prefix(),
        })?;
        let (start, extents) = match self.read_start(announced, meta.verify)? {
            StartFrame::At(start, extents) => (start, extents),
            StartFrame::Abort(message) => {
                // As the protocol says: the file's data is discarded, its space released.
                inc.discard();
                self.tally.done(FileOutcome::failed(
                    Entry::File,
                    name,
                    Code::Io,
                    format!("the sender gave up: {message}"),
                ));
                return Ok(());
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
        self.tally.start(&name, announced, start);
        let (got, landed) = match announced {
            Some(size) => self.land_file(&mut inc, &name, size, start, extents, meta.verify)?,
            None => self.land_stream(&mut inc, &name, meta.verify)?,
        };
        let hash = trailer_hash(self.chan.read_frame()?, meta.verify)?;
        let began = match landed {
            Ok(()) => Ok(inc),
            Err(r) => {
                // Refused mid-stream (cap, disk): the bytes on disk are incomplete.
                inc.discard();
                Err(r)
            }
        };
        let staged = Staged {
            name,
            size: got,
            mode: meta.mode,
            mtime: meta.mtime,
            hash,
            began,
        };
        if self.features.pipelined_files {
            // Checked, synced, renamed and answered by the finishing thread, in turn,
            // while this one reads the next file.
            return self.finish_in_turn(staged);
        }
        self.finish_now(staged)
    }

    /// The frame that starts a `File`'s data after our `Ready`. Below version 9 a verified
    /// sparse file's holes are hashed as zeros, so they must fit the session's budget
    /// ([`sparse::HoleBudget`]) or the session ends before any is read.
    fn read_start(
        &mut self,
        announced: Option<u64>,
        verify: bool,
    ) -> Result<StartFrame, TransferError> {
        Ok(match self.chan.read_frame()? {
            Some(Frame::Start { offset }) => StartFrame::At(offset, None),
            Some(Frame::StartSparse { offset, extents })
                if self.features.sparse && announced.is_some() =>
            {
                let size = announced.unwrap_or(0);
                sparse::check_extents(&extents, offset, size)?;
                if verify && !self.features.sparse_digest {
                    if let Err(why) = self.holes.take(&extents, offset, size) {
                        let _ = self.reply_beside(&Frame::Refuse {
                            code: Code::Protocol,
                            message: why.clone(),
                        });
                        return Err(TransferError::Refused(why));
                    }
                }
                StartFrame::At(offset, Some(extents))
            }
            Some(Frame::Abort { message }) => StartFrame::Abort(message),
            Some(other) => return Err(unexpected("start", &other)),
            None => {
                return Err(zcnet::Error::PeerClosed {
                    op: "waiting for data",
                }
                .into())
            }
        })
    }

    /// A file's `size` bytes from `start` (or only its data `extents`, a sparse file's),
    /// spliced from the socket into the partial file and hashed as they land; how many
    /// arrived, and whether the file may be finished (a refusal if its length could not
    /// be set).
    fn land_file(
        &mut self,
        inc: &mut Incoming,
        name: &str,
        size: u64,
        start: u64,
        extents: Option<Vec<(u64, u64)>>,
        verify: bool,
    ) -> Result<(u64, Result<(), Refusal>), TransferError> {
        let dense = extents.is_none();
        let ranges = match extents {
            Some(x) => {
                // Holes stay unwritten: the space reserved for them goes back.
                sparse::unreserve(inc.file());
                x
            }
            None => vec![(start, size - start)],
        };
        // Verified as it lands; without a hasher (it could not start) the check reads the
        // file back instead. Up to version 8 holes read back as zeros, so the landing hash
        // may run over them once the data after them has landed; from 9 a sparse file's
        // hash is its digest, over the extents only, and the holes are never read.
        // Over TLS a dense file's bytes pass through memory on their way into it: they are
        // hashed there (`inline`), not read back from the file by a landing thread.
        let mut inline = None;
        let landing = if verify {
            let kept = inc.take_prefix_state();
            let resumes =
                |k: &Option<(u64, blake3::Hasher)>| matches!(k, Some((k, _)) if *k == start);
            if dense && self.chan.is_encrypted() && (start == 0 || resumes(&kept)) {
                inline = Some(match kept {
                    Some((k, h)) if k == start => h,
                    _ => blake3::Hasher::new(),
                });
                None
            } else if !dense && self.features.sparse_digest {
                // The kept prefix's hash (`start` is 0 or the offset we offered).
                let prefix = match kept {
                    Some((k, h)) if k == start => *h.finalize().as_bytes(),
                    _ => match inc.prefix() {
                        Some(p) if start > 0 => p,
                        _ => *blake3::hash(b"").as_bytes(),
                    },
                };
                inc.sparse_digest(start, prefix, ranges.clone());
                let head = sparse::digest_head(size, start, &prefix, &ranges);
                LandingHash::spans(inc.file(), start, ranges.clone(), head).ok()
            } else {
                match kept {
                    Some((kept, h)) if kept == start => LandingHash::resume(inc.file(), kept, h),
                    _ => LandingHash::start(inc.file()),
                }
                .ok()
            }
        } else {
            None
        };
        let step = if landing.is_some() || inline.is_some() {
            LAND_STEP
        } else {
            STEP
        };
        // The store reserved the whole file when it began. On tmpfs a second `fallocate`
        // per range walks every page again and zeroes the reserved ones (0.1 CPU-s/GiB at
        // the receiver); on ext4 it sets the size once per range instead of write by
        // write, which costs less than it saves.
        self.chan.set_file_preallocate(!inc.on_tmpfs());
        // The store reserved a first step of the space; the rest is reserved a step ahead
        // of the data as it lands (a sparse file's holes are left alone).
        let mut allocated = start.saturating_add(store::RESERVE_STEP).min(size);
        let (mut done, mut got) = (start, 0u64);
        for (from, len) in ranges {
            self.tally.bytes(from - done);
            let (mut off, end) = (from, from + len);
            while off < end {
                let want = (end - off).min(step);
                let r = match inline.as_mut() {
                    Some(h) => self.chan.recv_to_file_tls(inc.file(), off, want, Some(h)),
                    None => self.chan.recv_to_file(inc.file(), off, want),
                };
                let n = match r {
                    Ok(n) => n,
                    Err(TransferError::Net(zcnet::Error::Truncated { got: g, .. })) => {
                        return Err(TransferError::Truncated {
                            name: name.into(),
                            expected: size,
                            got: got + g,
                        })
                    }
                    Err(e) => return Err(e),
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
                self.tally.bytes(n);
            }
            done = end;
        }
        self.tally.bytes(size - done);
        let hashed = inline.map(|h| *h.finalize().as_bytes());
        Ok((got, set_length(inc, name, size, landing, hashed)))
    }

    /// A stream's data (`Data` frames up to `EndData`), written at the end of the partial
    /// file and hashed as it passes through memory; how many bytes arrived, and whether
    /// the file may be finished (a refusal past the cap or on a failed write).
    fn land_stream(
        &mut self,
        inc: &mut Incoming,
        name: &str,
        verify: bool,
    ) -> Result<(u64, Result<(), Refusal>), TransferError> {
        let mut res = Ok(());
        let mut got = 0u64;
        let mut landing = blake3::Hasher::new();
        loop {
            match self.chan.read_frame()? {
                Some(Frame::Data(d)) => {
                    if res.is_ok() {
                        res = self.store.charge(d.len() as u64).and_then(|_| {
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
                    self.tally.bytes(d.len() as u64);
                }
                Some(Frame::EndData) => {
                    if verify && res.is_ok() {
                        inc.landed_hash(got, *landing.finalize().as_bytes());
                    }
                    return Ok((got, res));
                }
                Some(other) => return Err(unexpected("data", &other)),
                None => {
                    return Err(TransferError::Truncated {
                        name: name.into(),
                        expected: u64::MAX,
                        got,
                    })
                }
            }
        }
    }

    /// Checks, syncs and renames a file on this thread and answers it (before version 7).
    fn finish_now(&mut self, staged: Staged) -> Result<(), TransferError> {
        let Staged {
            name,
            size: got,
            mode,
            mtime,
            hash,
            began,
        } = staged;
        let result = began.and_then(|inc| inc.finish(hash, mode, mtime));
        let (code, message, bytes) = match &result {
            Ok(len) => (Code::Ok, String::new(), *len),
            Err(r) => (r.code, r.message.clone(), got),
        };
        self.chan.reply(&Frame::Ack {
            code,
            bytes,
            message,
        })?;
        self.tally.done(FileOutcome {
            entry: Entry::File,
            name,
            bytes: got,
            verified: hash.is_some() && result.is_ok(),
            result: result.map(|_| ()).map_err(|r| (r.code, r.message)),
        });
        Ok(())
    }

    /// Hands `staged` to the session's finishing thread (started on first use), which
    /// answers it after every file handed over before it; reports the files it has
    /// finished so far.
    fn finish_in_turn(&mut self, staged: Staged) -> Result<(), TransferError> {
        if self.finisher.is_none() {
            let sock = self.chan.answer_sink()?;
            let f = Finisher::start(self.scope, sock, PUT_ACK_MESSAGE)
                .map_err(io_err("starting the thread that finishes files"))?;
            self.finisher = Some(f);
        }
        let f = self.finisher.as_mut().expect("started above");
        f.hand_over(staged)
            .map_err(|e| zcnet::Error::io("finishing files", e))?;
        report_finished(f.collect(), &mut self.tally)
    }

    /// Answers while a finishing thread may be writing `Ack`s on the same socket: never in
    /// the middle of its batch.
    fn reply_beside(&self, f: &Frame) -> Result<(), TransferError> {
        let _alone = self.finisher.as_ref().map(Finisher::writing);
        self.chan.reply(f)
    }

    /// The `Ack` for a `Dir` or a `Link` (no data), and its outcome in the report.
    fn answer_entry(
        &mut self,
        entry: Entry,
        name: String,
        result: Result<(), Refusal>,
    ) -> Result<(), TransferError> {
        let (code, message) = match &result {
            Ok(()) => (Code::Ok, String::new()),
            Err(r) => (r.code, r.message.clone()),
        };
        self.chan.reply(&Frame::Ack {
            code,
            bytes: 0,
            message,
        })?;
        self.tally.done(FileOutcome {
            entry,
            name,
            bytes: 0,
            verified: false,
            result: result.map_err(|r| (r.code, r.message)),
        });
        Ok(())
    }
}

/// A file's metadata as its frame announced it.
fn meta(size: u64, mode: u32, mtime: (i64, u32), verify: bool) -> FileMeta {
    FileMeta {
        size,
        mode,
        mtime,
        verify,
    }
}

/// Gives the landed file its whole length (a hole at its end is a length, not written)
/// and keeps the landing hash (or `hashed`, the hash of the bytes as they passed through
/// memory on their way in, all `size` of them) for the final check.
fn set_length(
    inc: &mut Incoming,
    name: &str,
    size: u64,
    landing: Option<LandingHash>,
    hashed: Option<[u8; 32]>,
) -> Result<(), Refusal> {
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
            if let Some(h) = hashed {
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

/// One version-2 `Put`: its bytes and trailer are read whatever the store decides (they are
/// on the wire already), then the file goes through the same rules as any other — hash
/// checked and written to its own `O_EXCL` partial file here ([`Store::put`]); fsync,
/// rename, directory fsync by the [`Finisher`], which only then sends the `Ack`.
fn receive_put(
    chan: &mut RecvChannel<'_>,
    store: &mut Store,
    name: String,
    meta: FileMeta,
) -> Result<Staged, TransferError> {
    let FileMeta {
        size,
        mode,
        mtime,
        verify,
    } = meta;
    let truncated = |name, got| TransferError::Truncated {
        name,
        expected: size,
        got,
    };
    // `Frame::decode` refused a `Put` over MAX_PUT from its header fields.
    let (hash, began) = if size as usize <= MAX_CONTROL {
        let (range, trailer) = match chan.put_body(size as usize)? {
            Ok(held) => held,
            Err(got) => return Err(truncated(name, got as u64)),
        };
        let hash = trailer_hash(trailer, verify)?;
        (hash, store.put(&name, chan.held(range), hash))
    } else {
        let mut data = vec![0u8; size as usize];
        let had = chan.take_ahead(&mut data);
        if !chan.read_exact(&mut data[had..])? && had < data.len() {
            return Err(truncated(name, had as u64));
        }
        let hash = trailer_hash(chan.next_frame()?, verify)?;
        (hash, store.put(&name, &data, hash))
    };
    Ok(Staged {
        name,
        size,
        mode,
        mtime,
        hash,
        began,
    })
}

/// Reports files the finishing thread is done with.
fn report_finished(
    finished: io::Result<Vec<Finished>>,
    tally: &mut Tally<'_>,
) -> Result<(), TransferError> {
    for f in finished.map_err(|e| zcnet::Error::io("finishing files", e))? {
        tally.done(FileOutcome {
            entry: Entry::File,
            name: f.name,
            bytes: f.size,
            verified: f.verified,
            result: f.result.map(|_| ()).map_err(|r| (r.code, r.message)),
        });
    }
    Ok(())
}
