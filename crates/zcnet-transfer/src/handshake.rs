//! The receiver's side of the handshake as a state machine over bytes. Pure code: the
//! blocking session and the server's event loop both drive it, reading exactly the bytes it
//! asks for, so nothing past the handshake is ever read before the peer has proved itself.
//!
//! Before the proof only three frames are accepted, each with its exact length from the
//! header: `Hello` ([`HELLO_LEN`] bytes), `Auth` ([`AUTH_LEN`]) and `Open`/`Join`. Any
//! other header is refused before its payload is read, so an unauthenticated peer costs at
//! most `5 + HELLO_LEN` bytes of buffer, however large the frame it announces. With a token
//! the sender's proof is checked once its `Open`/`Join` is in, since it covers that too
//! ([`auth::transcript`]), and a sender below [`AUTHENTICATED_FROM`] is refused.

use super::auth::{self, Role};
use super::wire::{
    Code, Features, Frame, WireError, AUTHENTICATED_FROM, AUTH_LEN, ENCRYPTED_FROM, HELLO_LEN,
    MAX_STREAMS, MIN_VERSION, OPEN_LEN, SESSION_ID_LEN, T_AUTH, T_DIR, T_FILE, T_HELLO, T_JOIN,
    T_LINK, T_OPEN, T_PUT, VERSION,
};

/// Why a handshake failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// A malformed frame.
    #[error("malformed handshake: {0}")]
    Wire(#[from] WireError),
    /// A frame other than the one due, or with the wrong length (refused from its header).
    #[error("expected {expected}, got a frame of type {ty} and {len} bytes")]
    Unexpected {
        /// What was due.
        expected: &'static str,
        /// The type byte that came.
        ty: u8,
        /// Its announced length.
        len: usize,
    },
    /// The peer speaks a version we do not.
    #[error(
        "protocol version mismatch: we speak versions {MIN_VERSION} to {VERSION}, the peer {0}"
    )]
    Version(u16),
    /// The peer did not prove it knows the token.
    #[error("the sender did not prove it knows the token")]
    AuthFailed,
    /// An `Open` asking for no stream or for more than [`MAX_STREAMS`].
    #[error("a session of {0} streams (1 to {MAX_STREAMS})")]
    Streams(u16),
    /// The sender started TLS and this receiver runs in plaintext (`--plaintext`).
    #[error("the sender encrypts (its first bytes are a TLS ClientHello) and this receiver runs in plaintext (--plaintext): run both ends with --plaintext, or neither")]
    SenderEncrypts,
    /// The TLS handshake failed (a sender that does not encrypt, a key it refused, bytes
    /// that are not TLS).
    #[error("TLS: {0}")]
    Tls(String),
    /// A token is required and the sender chose a version whose proofs do not cover the
    /// handshake (below [`AUTHENTICATED_FROM`]).
    #[error("the sender chose protocol version {0}; with a token the receiver needs {AUTHENTICATED_FROM} or later")]
    TokenNeedsVersion(u16),
}

impl HandshakeError {
    /// The `Refuse` frame to send the peer before closing, if any.
    pub fn refusal(&self) -> Option<Frame> {
        let (code, message) = match self {
            HandshakeError::Version(v) => (
                Code::Version,
                format!("receiver speaks protocol versions {MIN_VERSION} to {VERSION}, sender {v}"),
            ),
            HandshakeError::AuthFailed => (Code::AuthFailed, "wrong or missing token".into()),
            HandshakeError::SenderEncrypts => (Code::Version, self.to_string()),
            HandshakeError::Streams(n) => (
                Code::Protocol,
                format!("a session has 1 to {MAX_STREAMS} streams, not {n}"),
            ),
            HandshakeError::TokenNeedsVersion(v) => (
                Code::Version,
                format!(
                    "this receiver requires a token, and proves it only in protocol version {AUTHENTICATED_FROM} or later (where the proofs cover the version and every field of the handshake); the sender speaks {v}: upgrade zcnet at the sender"
                ),
            ),
            _ => return None,
        };
        Some(Frame::Refuse { code, message })
    }
}

/// The first byte of a TLS record carrying a handshake message (RFC 8446 §5.1,
/// `ContentType.handshake`): what an encrypting sender sends first. No frame type has it.
const TLS_HANDSHAKE_RECORD: u8 = 22;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    HelloHeader,
    HelloBody,
    AuthHeader,
    AuthBody,
    StreamHeader,
    StreamBody,
    Done,
}

/// What a connection is to its session (version 5 on: the sender's `Open` or `Join`, right
/// after its `Hello` and `Auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamRequest {
    /// A session below version 5: one connection, no `Open`.
    Single,
    /// A new session of this many connections, this one the first.
    Open(u16),
    /// One more connection of the session with this id.
    Join([u8; SESSION_ID_LEN]),
}

/// A finished handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// Our `Auth` frame, to send before the session goes on (when a token is set).
    pub reply: Option<Vec<u8>>,
    /// The peer proved the token.
    pub authenticated: bool,
    /// The version the sender chose (from [`MIN_VERSION`] to [`VERSION`]).
    pub version: u16,
    /// What this connection is to its session.
    pub stream: StreamRequest,
}

/// The receiver's handshake in progress.
#[derive(Debug)]
pub struct ReceiverHandshake {
    token: Option<Vec<u8>>,
    rnonce: [u8; 32],
    snonce: [u8; 32],
    version: u16,
    buf: [u8; 5 + HELLO_LEN],
    have: usize,
    need: usize,
    phase: Phase,
    /// Our `Auth` reply, kept until the sender's `Open`/`Join` has been read.
    reply: Option<Vec<u8>>,
    /// The sender's `Hello` as it came (header and payload), for the transcript.
    sender_hello: Vec<u8>,
    /// The sender's proof, checked once its `Open`/`Join` is in.
    sender_mac: Option<[u8; 32]>,
    /// The TLS channel's exporter value the proofs are bound to, if any.
    binding: Option<[u8; 32]>,
    /// Oldest version served: [`ENCRYPTED_FROM`] inside TLS.
    min_version: u16,
}

impl ReceiverHandshake {
    /// A handshake that requires `token` when one is given.
    pub fn new(token: Option<Vec<u8>>) -> std::io::Result<Self> {
        Ok(ReceiverHandshake {
            token,
            rnonce: auth::nonce()?,
            snonce: [0; 32],
            version: VERSION,
            buf: [0; 5 + HELLO_LEN],
            have: 0,
            need: 5,
            phase: Phase::HelloHeader,
            reply: None,
            sender_hello: Vec::new(),
            sender_mac: None,
            binding: None,
            min_version: MIN_VERSION,
        })
    }

    /// A handshake run inside a TLS channel whose exporter value is `binding`: the token's
    /// proofs are bound to it ([`Self::bound_to_channel`]) and only senders of
    /// [`ENCRYPTED_FROM`] or later are served.
    pub fn over_tls(&mut self, binding: [u8; 32]) {
        self.binding = Some(binding);
        self.min_version = ENCRYPTED_FROM;
    }

    /// Binds the token's proofs to a TLS channel ([`crate::tls::Channel::binding`]): they
    /// then cover its exporter value too ([`auth::bound_transcript`]), so a sender that is
    /// not at the other end of this very TLS session fails them.
    pub fn bound_to_channel(mut self, binding: [u8; 32]) -> Self {
        self.binding = Some(binding);
        self
    }

    /// Our `Hello`, sent first.
    pub fn greeting(&self) -> Vec<u8> {
        Frame::Hello {
            version: VERSION,
            auth: self.token.is_some(),
            nonce: self.rnonce,
        }
        .to_bytes()
    }

    /// Where the next bytes go: exactly the bytes still missing from the current header or
    /// payload (never more, so a read into it cannot take bytes past the handshake).
    pub fn want(&mut self) -> &mut [u8] {
        &mut self.buf[self.have..self.need]
    }

    /// Whether the handshake has finished.
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// Accounts for `n` bytes read into [`Self::want`]; the handshake's result once it ends.
    pub fn advance(&mut self, n: usize) -> Result<Option<Accepted>, HandshakeError> {
        self.have = (self.have + n).min(self.need);
        while self.have == self.need {
            match self.phase {
                Phase::HelloHeader => {
                    if self.binding.is_none() && self.buf[0] == TLS_HANDSHAKE_RECORD {
                        return Err(HandshakeError::SenderEncrypts);
                    }
                    self.expect_header(T_HELLO, HELLO_LEN, "hello")?;
                    self.phase = Phase::HelloBody;
                }
                Phase::HelloBody => {
                    match Frame::decode(T_HELLO, &self.buf[5..self.need])? {
                        Frame::Hello { version, nonce, .. } => {
                            // The sender picks the version (at most the one we offered in
                            // our `Hello`); any version we speak is served as it is.
                            if !(self.min_version..=VERSION).contains(&version) {
                                return Err(HandshakeError::Version(version));
                            }
                            if self.token.is_some() && !Features::of(version).authenticated {
                                return Err(HandshakeError::TokenNeedsVersion(version));
                            }
                            self.version = version;
                            self.snonce = nonce;
                            self.sender_hello = self.buf[..self.need].to_vec();
                        }
                        _ => unreachable!("decode(T_HELLO) gives a Hello"),
                    }
                    self.have = 0;
                    if self.token.is_none() {
                        if let Some(a) = self.proved() {
                            return Ok(Some(a));
                        }
                        continue;
                    }
                    self.need = 5;
                    self.phase = Phase::AuthHeader;
                }
                Phase::AuthHeader => {
                    if [T_FILE, T_PUT, T_DIR, T_LINK, T_OPEN, T_JOIN].contains(&self.buf[0]) {
                        // A sender without a token goes straight to its first file.
                        return Err(HandshakeError::AuthFailed);
                    }
                    self.expect_header(T_AUTH, AUTH_LEN, "auth")?;
                    self.phase = Phase::AuthBody;
                }
                Phase::AuthBody => {
                    // Checked with the `Open`/`Join` that follows (the proof covers it).
                    self.sender_mac = Some(self.buf[5..5 + AUTH_LEN].try_into().expect("32"));
                    self.have = 0;
                    if let Some(a) = self.proved() {
                        return Ok(Some(a));
                    }
                }
                Phase::StreamHeader => {
                    let ty = self.buf[0];
                    let len = if ty == T_JOIN {
                        SESSION_ID_LEN
                    } else {
                        OPEN_LEN
                    };
                    self.expect_header(
                        if ty == T_JOIN { T_JOIN } else { T_OPEN },
                        len,
                        "open or join",
                    )?;
                    self.phase = Phase::StreamBody;
                }
                Phase::StreamBody => {
                    let stream = match Frame::decode(self.buf[0], &self.buf[5..self.need])? {
                        Frame::Open { streams } if (1..=MAX_STREAMS).contains(&streams) => {
                            StreamRequest::Open(streams)
                        }
                        Frame::Open { streams } => return Err(HandshakeError::Streams(streams)),
                        Frame::Join { session } => StreamRequest::Join(session),
                        _ => unreachable!("the header was checked to be open or join"),
                    };
                    if let Some(token) = self.token.as_deref() {
                        let (ours, stream) = (self.greeting(), &self.buf[..self.need]);
                        let t = match &self.binding {
                            Some(b) => auth::bound_transcript(b, &ours, &self.sender_hello, stream),
                            None => auth::transcript(&ours, &self.sender_hello, stream),
                        };
                        let mac = self.sender_mac.ok_or(HandshakeError::AuthFailed)?;
                        if !auth::verify(token, Role::Sender, &t, &mac) {
                            return Err(HandshakeError::AuthFailed);
                        }
                        let mac = auth::prove(token, Role::Receiver, &t);
                        self.reply = Some(Frame::Auth { mac }.to_bytes());
                    }
                    return Ok(Some(self.finish(stream)));
                }
                Phase::Done => return Ok(None),
            }
        }
        Ok(None)
    }

    /// The sender is who it says: done below version 5, else its `Open`/`Join` is next.
    fn proved(&mut self) -> Option<Accepted> {
        if !Features::of(self.version).streams {
            return Some(self.finish(StreamRequest::Single));
        }
        self.need = 5;
        self.phase = Phase::StreamHeader;
        None
    }

    fn finish(&mut self, stream: StreamRequest) -> Accepted {
        self.phase = Phase::Done;
        Accepted {
            reply: self.reply.take(),
            authenticated: self.token.is_some(),
            version: self.version,
            stream,
        }
    }

    fn expect_header(
        &mut self,
        ty: u8,
        len: usize,
        expected: &'static str,
    ) -> Result<(), HandshakeError> {
        let got_ty = self.buf[0];
        let got_len = u32::from_be_bytes(self.buf[1..5].try_into().expect("4")) as usize;
        if got_ty != ty || got_len != len {
            return Err(HandshakeError::Unexpected {
                expected,
                ty: got_ty,
                len: got_len,
            });
        }
        self.need = 5 + len;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(
        hs: &mut ReceiverHandshake,
        mut bytes: &[u8],
    ) -> Result<Option<Accepted>, HandshakeError> {
        loop {
            let w = hs.want();
            let n = w.len().min(bytes.len());
            if n == 0 {
                return Ok(None);
            }
            w[..n].copy_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if let Some(a) = hs.advance(n)? {
                assert!(bytes.is_empty(), "the handshake read past its end");
                return Ok(Some(a));
            }
        }
    }

    fn sender_hello(version: u16, nonce: [u8; 32]) -> Vec<u8> {
        Frame::Hello {
            version,
            auth: true,
            nonce,
        }
        .to_bytes()
    }

    #[test]
    fn a_sender_with_the_token_is_accepted_and_gets_our_proof() {
        let mut hs = ReceiverHandshake::new(Some(b"t".to_vec())).unwrap();
        match Frame::parse(&hs.greeting()).unwrap().unwrap().0 {
            Frame::Hello { auth, .. } => assert!(auth),
            f => panic!("{f:?}"),
        };
        let snonce = [5; 32];
        let open = Frame::Open { streams: 1 }.to_bytes();
        let t = auth::transcript(&hs.greeting(), &sender_hello(VERSION, snonce), &open);
        let mut bytes = sender_hello(VERSION, snonce);
        bytes.extend(
            Frame::Auth {
                mac: auth::prove(b"t", Role::Sender, &t),
            }
            .to_bytes(),
        );
        bytes.extend(&open);
        // One byte at a time: the machine never asks for more than is due.
        let mut got = None;
        for b in &bytes {
            assert!(hs.want().len() <= 5 + HELLO_LEN);
            hs.want()[0] = *b;
            if let Some(a) = hs.advance(1).unwrap() {
                got = Some(a);
            }
        }
        let a = got.expect("accepted");
        assert!(a.authenticated && hs.is_done());
        let (f, _) = Frame::parse(&a.reply.unwrap()).unwrap().unwrap();
        let Frame::Auth { mac } = f else { panic!() };
        assert!(auth::verify(b"t", Role::Receiver, &t, &mac));
    }

    /// A sender's proof over the handshake as it saw it (`seen`: our `Hello` as it arrived
    /// there), for `open`.
    fn proof_bytes(seen: &[u8], snonce: [u8; 32], open: &Frame) -> Vec<u8> {
        let open = open.to_bytes();
        let t = auth::transcript(seen, &sender_hello(VERSION, snonce), &open);
        let mut bytes = sender_hello(VERSION, snonce);
        bytes.extend(
            Frame::Auth {
                mac: auth::prove(b"t", Role::Sender, &t),
            }
            .to_bytes(),
        );
        bytes.extend(open);
        bytes
    }

    #[test]
    fn a_handshake_changed_on_the_way_fails_the_proof() {
        let open = Frame::Open { streams: 2 };
        // Our `Hello` lowered to version 5 on its way to the sender.
        let mut hs = ReceiverHandshake::new(Some(b"t".to_vec())).unwrap();
        let Frame::Hello { auth, nonce, .. } = Frame::parse(&hs.greeting()).unwrap().unwrap().0
        else {
            panic!()
        };
        let lowered = Frame::Hello {
            version: 5,
            auth,
            nonce,
        }
        .to_bytes();
        let e = feed(&mut hs, &proof_bytes(&lowered, [3; 32], &open)).unwrap_err();
        assert_eq!(e, HandshakeError::AuthFailed);
        // The sender's `Open` changed on its way to us.
        let mut hs = ReceiverHandshake::new(Some(b"t".to_vec())).unwrap();
        let mut bytes = proof_bytes(&hs.greeting(), [3; 32], &open);
        let n = bytes.len();
        bytes[n - 1] = 16;
        assert_eq!(feed(&mut hs, &bytes), Err(HandshakeError::AuthFailed));
        // Unchanged, it passes.
        let mut hs = ReceiverHandshake::new(Some(b"t".to_vec())).unwrap();
        let bytes = proof_bytes(&hs.greeting(), [3; 32], &open);
        let a = feed(&mut hs, &bytes).unwrap().unwrap();
        assert_eq!(a.stream, StreamRequest::Open(2));
        // A sender that chose a version before the proofs covered the handshake is refused
        // with the reason, before any proof.
        for v in [1, 4, 7] {
            let mut hs = ReceiverHandshake::new(Some(b"t".to_vec())).unwrap();
            let e = feed(&mut hs, &sender_hello(v, [3; 32])).unwrap_err();
            assert_eq!(e, HandshakeError::TokenNeedsVersion(v));
            let Some(Frame::Refuse { code, message }) = e.refusal() else {
                panic!()
            };
            assert_eq!(code, Code::Version);
            assert!(message.contains("upgrade zcnet at the sender"), "{message}");
        }
    }

    #[test]
    fn a_proof_bound_to_another_channel_or_to_none_fails() {
        let open = Frame::Open { streams: 1 }.to_bytes();
        let bound = |hs: &ReceiverHandshake, binding: Option<[u8; 32]>| {
            let hello = sender_hello(VERSION, [3; 32]);
            let t = match binding {
                Some(b) => auth::bound_transcript(&b, &hs.greeting(), &hello, &open),
                None => auth::transcript(&hs.greeting(), &hello, &open),
            };
            let mut bytes = hello;
            bytes.extend(
                Frame::Auth {
                    mac: auth::prove(b"t", Role::Sender, &t),
                }
                .to_bytes(),
            );
            bytes.extend(&open);
            bytes
        };
        let fresh = || {
            ReceiverHandshake::new(Some(b"t".to_vec()))
                .unwrap()
                .bound_to_channel([1; 32])
        };
        let mut hs = fresh();
        let bytes = bound(&hs, Some([1; 32]));
        let a = feed(&mut hs, &bytes).unwrap().unwrap();
        // Our proof is bound too: the sender checks it over the same bound transcript.
        let (f, _) = Frame::parse(&a.reply.unwrap()).unwrap().unwrap();
        let Frame::Auth { mac } = f else { panic!() };
        let t = auth::bound_transcript(&[1; 32], &hs.greeting(), &bytes[..5 + HELLO_LEN], &open);
        assert!(auth::verify(b"t", Role::Receiver, &t, &mac));
        for other in [Some([2; 32]), None] {
            let mut hs = fresh();
            let bytes = bound(&hs, other);
            assert_eq!(feed(&mut hs, &bytes), Err(HandshakeError::AuthFailed));
        }
    }

    #[test]
    fn wrong_missing_or_oversized_answers_are_refused_from_the_header() {
        let mut hs = ReceiverHandshake::new(Some(b"t".to_vec())).unwrap();
        let mut bytes = sender_hello(VERSION, [1; 32]);
        bytes.extend(Frame::Auth { mac: [0; 32] }.to_bytes());
        bytes.extend(Frame::Open { streams: 1 }.to_bytes());
        assert_eq!(feed(&mut hs, &bytes), Err(HandshakeError::AuthFailed));
        assert!(HandshakeError::AuthFailed.refusal().is_some());

        let mut hs = ReceiverHandshake::new(Some(b"t".to_vec())).unwrap();
        let mut bytes = sender_hello(VERSION, [1; 32]);
        bytes.extend(
            Frame::File {
                name: "x".into(),
                size: 1,
                mode: 0o644,
                mtime_s: 0,
                mtime_ns: 0,
                verify: true,
            }
            .to_bytes(),
        );
        assert_eq!(feed(&mut hs, &bytes), Err(HandshakeError::AuthFailed));

        // A 4 MiB Data frame where the Hello is due: refused from its 5-byte header.
        let mut hs = ReceiverHandshake::new(None).unwrap();
        let e = feed(&mut hs, &[6, 0, 0x40, 0, 0]).unwrap_err();
        assert!(matches!(e, HandshakeError::Unexpected { ty: 6, len, .. } if len == 4 << 20));
        // A Hello announcing more than a Hello's length is refused as well.
        let mut hs = ReceiverHandshake::new(None).unwrap();
        let e = feed(&mut hs, &[T_HELLO, 0, 0, 1, 0]).unwrap_err();
        assert!(matches!(e, HandshakeError::Unexpected { .. }));
        // Another version.
        let mut hs = ReceiverHandshake::new(None).unwrap();
        assert_eq!(
            feed(&mut hs, &sender_hello(VERSION + 1, [0; 32])),
            Err(HandshakeError::Version(VERSION + 1))
        );
    }

    #[test]
    fn without_a_token_the_hello_and_open_are_enough() {
        let mut hs = ReceiverHandshake::new(None).unwrap();
        assert_eq!(feed(&mut hs, &sender_hello(VERSION, [0; 32])), Ok(None));
        let a = feed(&mut hs, &Frame::Open { streams: 2 }.to_bytes())
            .unwrap()
            .unwrap();
        assert!(!a.authenticated && a.reply.is_none());
        assert_eq!(a.version, VERSION);
        assert_eq!(a.stream, StreamRequest::Open(2));
        // Version 4: no `Open`, the session is one connection.
        let mut hs = ReceiverHandshake::new(None).unwrap();
        let a = feed(&mut hs, &sender_hello(4, [0; 32])).unwrap().unwrap();
        assert_eq!(a.stream, StreamRequest::Single);
    }

    #[test]
    fn joins_are_read_and_bad_stream_counts_or_frames_refused() {
        let mut bytes = sender_hello(VERSION, [0; 32]);
        bytes.extend(Frame::Join { session: [4; 16] }.to_bytes());
        let mut hs = ReceiverHandshake::new(None).unwrap();
        let a = feed(&mut hs, &bytes).unwrap().unwrap();
        assert_eq!(a.stream, StreamRequest::Join([4; 16]));
        for n in [0, MAX_STREAMS + 1] {
            let mut bytes = sender_hello(VERSION, [0; 32]);
            bytes.extend(Frame::Open { streams: n }.to_bytes());
            let mut hs = ReceiverHandshake::new(None).unwrap();
            let e = feed(&mut hs, &bytes).unwrap_err();
            assert_eq!(e, HandshakeError::Streams(n));
            assert!(e.refusal().is_some());
        }
        // A file where the `Open` is due is refused from its header.
        let mut bytes = sender_hello(VERSION, [0; 32]);
        bytes.extend(Frame::Bye.to_bytes());
        let mut hs = ReceiverHandshake::new(None).unwrap();
        assert!(matches!(
            feed(&mut hs, &bytes),
            Err(HandshakeError::Unexpected { .. })
        ));
        // A `Join` without the token's proof, where one is required.
        let mut bytes = sender_hello(VERSION, [0; 32]);
        bytes.extend(Frame::Join { session: [4; 16] }.to_bytes());
        let mut hs = ReceiverHandshake::new(Some(b"t".to_vec())).unwrap();
        assert_eq!(feed(&mut hs, &bytes), Err(HandshakeError::AuthFailed));
    }

    #[test]
    fn a_version_1_sender_is_served_as_version_1_and_0_is_refused() {
        let mut hs = ReceiverHandshake::new(None).unwrap();
        let a = feed(&mut hs, &sender_hello(1, [0; 32])).unwrap().unwrap();
        assert_eq!(a.version, 1);
        let mut hs = ReceiverHandshake::new(None).unwrap();
        let e = feed(&mut hs, &sender_hello(0, [0; 32])).unwrap_err();
        assert_eq!(e, HandshakeError::Version(0));
        let Some(Frame::Refuse { code, message }) = e.refusal() else {
            panic!("a version refusal is told to the peer")
        };
        assert_eq!(code, Code::Version);
        assert!(
            message.contains(&format!("versions 1 to {VERSION}")),
            "{message}"
        );
    }
}
