//! A blocking TLS 1.3 connection over a `TcpStream`: the handshake, then records both ways.
//!
//! Reads fail loudly rather than return altered or cut bytes: a record whose tag does not
//! check is [`TlsError::Tampered`] (and the peer is told, with an alert, on the way out), a
//! connection that ends without `close_notify` is [`TlsError::Truncated`]; only a clean
//! `close_notify` reads as end of stream.

use super::config::{client_config, server_config};
use super::error::TlsError;
use super::fingerprint::Fingerprint;
use super::identity::Identity;
use super::trust::{Expect, Trust};
use super::{BINDING_LEN, EXPORTER_LABEL};
use rustls::pki_types::ServerName;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;

/// Bytes taken from the socket per `recv` once the handshake is done. rustls reads at most
/// 4 KiB per `read_tls` (it grows its buffer by that much), so reading it straight from the
/// socket costs four system calls per 16 KiB record; from this buffer, one per 256 KiB.
const READ_AHEAD: usize = 256 << 10;

/// Plaintext handed to rustls per call: it encrypts and queues it whole, so this bounds the
/// ciphertext queued before it goes to the socket (4 records of 16 KiB).
const WRITE_CHUNK: usize = 64 << 10;

/// What [`Channel::connect_after`] runs on the socket before its first read.
pub type BeforeRead<'a> = dyn FnMut(&mut TcpStream) -> Result<(), TlsError> + 'a;

/// One end of an established TLS channel.
pub struct Channel {
    conn: rustls::Connection,
    /// Read through a buffer after the handshake ([`READ_AHEAD`]); written directly.
    stream: BufReader<TcpStream>,
    binding: [u8; BINDING_LEN],
    trust: Option<Trust>,
    peer_closed: bool,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("suite", &self.suite())
            .field("trust", &self.trust)
            .finish_non_exhaustive()
    }
}

impl Channel {
    /// The sender's end: a TLS client over `stream` that trusts the receiver as `expect`
    /// says. A key that fails it ends the handshake with [`TlsError::Refused`] (and the
    /// receiver gets a `certificate_unknown` alert); a first meeting is recorded once the
    /// handshake has completed.
    pub fn connect(stream: TcpStream, expect: Expect) -> Result<Channel, TlsError> {
        Channel::connect_with_suites(stream, expect, &[])
    }

    /// [`Channel::connect`] offering only `suites` (all when empty).
    pub fn connect_with_suites(
        stream: TcpStream,
        expect: Expect,
        suites: &[rustls::CipherSuite],
    ) -> Result<Channel, TlsError> {
        Channel::connect_inner(stream, expect, suites, None)
    }

    /// [`Channel::connect`] that calls `before_read` on the socket once the client's first
    /// flight is out and before anything is read: the transfer protocol's sender reads the
    /// receiver's plaintext preamble there (`crate::wire::tls_preamble`), so the
    /// `ClientHello` costs no round trip of its own.
    pub fn connect_after(
        stream: TcpStream,
        expect: Expect,
        before_read: &mut BeforeRead<'_>,
    ) -> Result<Channel, TlsError> {
        Channel::connect_inner(stream, expect, &[], Some(before_read))
    }

    fn connect_inner(
        stream: TcpStream,
        expect: Expect,
        suites: &[rustls::CipherSuite],
        before_read: Option<&mut BeforeRead<'_>>,
    ) -> Result<Channel, TlsError> {
        let (cfg, verifier) = client_config(expect, suites)?;
        let name = ServerName::try_from(super::SERVER_NAME).expect("a valid DNS name");
        let conn = rustls::ClientConnection::new(cfg, name).map_err(TlsError::Tls)?;
        let mut ch = Channel::handshake(conn.into(), stream, before_read)?;
        ch.trust = Some(verifier.settle()?);
        Ok(ch)
    }

    /// The receiver's end: a TLS server over `stream` with `identity`.
    pub fn accept(stream: TcpStream, identity: &Identity) -> Result<Channel, TlsError> {
        Channel::accept_with(stream, server_config(identity)?)
    }

    /// [`Channel::accept`] with a configuration made once ([`super::config::server_config`]) for
    /// many connections.
    pub fn accept_with(
        stream: TcpStream,
        cfg: std::sync::Arc<rustls::ServerConfig>,
    ) -> Result<Channel, TlsError> {
        let conn = rustls::ServerConnection::new(cfg).map_err(TlsError::Tls)?;
        Channel::handshake(conn.into(), stream, None)
    }

    fn handshake(
        mut conn: rustls::Connection,
        mut stream: TcpStream,
        mut before_read: Option<&mut BeforeRead<'_>>,
    ) -> Result<Channel, TlsError> {
        while conn.is_handshaking() {
            while conn.wants_write() {
                conn.write_tls(&mut stream)
                    .map_err(|e| TlsError::io("sending the TLS handshake", e))?;
            }
            if !conn.is_handshaking() {
                break;
            }
            if let Some(f) = before_read.take() {
                f(&mut stream)?;
            }
            let n = conn
                .read_tls(&mut stream)
                .map_err(|e| TlsError::io("reading the TLS handshake", e))?;
            if n == 0 {
                return Err(TlsError::HandshakeEof);
            }
            if let Err(e) = conn.process_new_packets() {
                // Tell the peer why (the alert rustls queued), then fail with our reason.
                let _ = conn.write_tls(&mut stream);
                return Err(match e {
                    rustls::Error::InvalidMessage(_) => TlsError::NotTls(e),
                    e => TlsError::from_rustls(e),
                });
            }
        }
        while conn.wants_write() {
            conn.write_tls(&mut stream)
                .map_err(|e| TlsError::io("sending the TLS handshake", e))?;
        }
        // Writes are bounded by `WRITE_CHUNK` here, not by rustls's 64 KB limit (which would
        // take a chunk's ciphertext only in part).
        conn.set_buffer_limit(None);
        let binding = conn
            .export_keying_material([0u8; BINDING_LEN], EXPORTER_LABEL, None)
            .map_err(TlsError::Tls)?;
        Ok(Channel {
            conn,
            stream: BufReader::with_capacity(READ_AHEAD, stream),
            binding,
            trust: None,
            peer_closed: false,
        })
    }

    /// The exporter value both ends of this TLS session share (RFC 8446 §7.5, label
    /// [`EXPORTER_LABEL`]): what the token's proofs are bound to.
    pub fn binding(&self) -> &[u8; BINDING_LEN] {
        &self.binding
    }

    /// At the sender: how the receiver's key was trusted. `None` at the receiver.
    pub fn trust(&self) -> Option<&Trust> {
        self.trust.as_ref()
    }

    /// At the sender: the receiver's key.
    pub fn peer_fingerprint(&self) -> Option<Fingerprint> {
        match self.trust.as_ref()? {
            Trust::Pinned(f) | Trust::Known(f) | Trust::FirstUse(f) => Some(*f),
        }
    }

    /// The negotiated cipher suite, as rustls names it.
    pub fn suite(&self) -> Option<rustls::CipherSuite> {
        self.conn.negotiated_cipher_suite().map(|s| s.suite())
    }

    /// The socket underneath.
    pub fn socket(&self) -> &TcpStream {
        self.stream.get_ref()
    }

    /// Encrypts `data` and sends it whole.
    pub fn write_all(&mut self, data: &[u8]) -> Result<(), TlsError> {
        for chunk in data.chunks(WRITE_CHUNK) {
            self.conn
                .writer()
                .write_all(chunk)
                .map_err(|e| TlsError::io("encrypting", e))?;
            self.flush_tls()?;
        }
        Ok(())
    }

    fn flush_tls(&mut self) -> Result<(), TlsError> {
        while self.conn.wants_write() {
            self.conn
                .write_tls(self.stream.get_mut())
                .map_err(|e| TlsError::io("sending", e))?;
        }
        Ok(())
    }

    /// Reads and decrypts more records until some plaintext is there; `Ok(false)` at the
    /// peer's `close_notify`.
    fn fill(&mut self) -> Result<bool, TlsError> {
        loop {
            match self.conn.reader().fill_buf() {
                Ok(b) if !b.is_empty() => return Ok(true),
                Ok(_) => {
                    self.peer_closed = true;
                    return Ok(false);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    return Err(TlsError::Truncated)
                }
                Err(e) => return Err(TlsError::io("reading", e)),
            }
            let n = self
                .conn
                .read_tls(&mut self.stream)
                .map_err(|e| TlsError::io("reading", e))?;
            let processed = self.conn.process_new_packets();
            if let Err(e) = processed {
                let _ = self.conn.write_tls(self.stream.get_mut());
                return Err(TlsError::from_rustls(e));
            }
            // A key update answered, say.
            self.flush_tls()?;
            // At EOF (`n == 0`) the next look ends the loop: rustls reports a
            // `close_notify` as a clean end and anything else as `UnexpectedEof`.
            let _ = n;
        }
    }

    /// Decrypts into `buf`; 0 only at the peer's `close_notify`.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize, TlsError> {
        if buf.is_empty() || !self.fill()? {
            return Ok(0);
        }
        self.conn
            .reader()
            .read(buf)
            .map_err(|e| TlsError::io("reading", e))
    }

    /// Reads exactly `buf.len()` bytes; a clean end before that is [`TlsError::Truncated`].
    pub fn read_exact(&mut self, mut buf: &mut [u8]) -> Result<(), TlsError> {
        while !buf.is_empty() {
            let n = self.read(buf)?;
            if n == 0 {
                return Err(TlsError::Truncated);
            }
            buf = &mut buf[n..];
        }
        Ok(())
    }

    /// Hands decrypted bytes to `f` where rustls holds them, without copying them out first
    /// (a hasher or a file write takes them from there), until `f` has taken `len` bytes.
    /// (rustls 0.23 copies each record into its read buffer, decrypts it there and copies
    /// the plaintext into a buffer of its own: those are the copies on this side.)
    /// `f` is called once per piece. Ends early only at the peer's `close_notify`, returning
    /// how many bytes `f` got.
    pub fn recv_with(
        &mut self,
        len: u64,
        mut f: impl FnMut(&[u8]) -> io::Result<()>,
    ) -> Result<u64, TlsError> {
        let mut got = 0u64;
        while got < len {
            if !self.fill()? {
                break;
            }
            let mut r = self.conn.reader();
            let b = r.fill_buf().map_err(|e| TlsError::io("reading", e))?;
            let n = b.len().min((len - got) as usize);
            f(&b[..n]).map_err(|e| TlsError::Io {
                op: "taking received bytes".into(),
                source: e,
            })?;
            r.consume(n);
            got += n as u64;
        }
        Ok(got)
    }

    /// Whether the peer has sent `close_notify`.
    pub fn peer_closed(&self) -> bool {
        self.peer_closed
    }

    /// Sends `close_notify` (the peer's reads then end cleanly) and shuts the socket's write
    /// half.
    pub fn close(mut self) -> Result<(), TlsError> {
        self.conn.send_close_notify();
        self.flush_tls()?;
        let _ = self.stream.get_ref().shutdown(std::net::Shutdown::Write);
        Ok(())
    }

    /// The session's traffic secrets and next sequence numbers, for a record layer that
    /// takes over (the kernel's: [`super::ktls::offload`]); consumes the channel. Secret
    /// key material: never log it.
    pub fn dangerous_extract_secrets(self) -> Result<rustls::ExtractedSecrets, TlsError> {
        self.conn.dangerous_extract_secrets().map_err(TlsError::Tls)
    }

    /// Whether bytes were read from the socket and not yet given to rustls.
    pub(super) fn holds_read_ahead(&self) -> bool {
        !self.stream.buffer().is_empty()
    }

    /// A channel again from [`Self::into_parts`]'s pieces (rustls's state kept whole).
    pub(super) fn from_parts(
        conn: rustls::Connection,
        stream: TcpStream,
        binding: [u8; BINDING_LEN],
        trust: Option<Trust>,
    ) -> Channel {
        Channel {
            conn,
            stream: BufReader::with_capacity(READ_AHEAD, stream),
            binding,
            trust,
            peer_closed: false,
        }
    }

    /// rustls's state and the socket, for another record layer or another writer. Bytes
    /// already read from the socket and not yet given to rustls would be lost: refused.
    pub(super) fn into_parts(self) -> Result<(rustls::Connection, TcpStream), TlsError> {
        if !self.stream.buffer().is_empty() {
            return Err(TlsError::Tls(rustls::Error::General(
                "the peer's records are already read ahead in user space".into(),
            )));
        }
        Ok((self.conn, self.stream.into_inner()))
    }
}

impl Read for Channel {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Channel::read(self, buf).map_err(io::Error::other)
    }
}

impl Write for Channel {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf).map_err(io::Error::other)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.flush_tls().map_err(io::Error::other)
    }
}
