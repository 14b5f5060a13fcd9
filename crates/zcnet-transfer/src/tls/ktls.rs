//! Handing a channel's record layer to the kernel (kTLS), where the kernel has the `tls`
//! module, so file data keeps going by `sendfile`/`splice` and is encrypted by the kernel
//! on its way out; elsewhere the channel stays in user space and the reason is returned for
//! the caller to count. Every session offers its connection right after the TLS handshake
//! ([`hand_over`]); where the kernel takes it, the session reads and writes plaintext on
//! the socket exactly as an unencrypted one does.
//!
//! The order makes the fallback safe: bytes rustls still holds are refused first
//! ([`Declined::Held`]: the kernel would never see them) with the socket untouched; then
//! `TCP_ULP "tls"` is tried on the live socket — the only step a kernel without the module
//! refuses, and one that leaves the socket as it was — and only then are rustls's traffic
//! secrets taken out (which consumes the rustls session) and set as `TLS_TX`/`TLS_RX`.
//! Call it right after the handshake, before any application data: in the transfer
//! protocol the receiver speaks first inside TLS and only once its handshake is complete,
//! so neither end can have read the other's records by then. The exporter value the token
//! is bound to is taken before (the extraction consumes the session).

use super::channel::Channel;
use super::error::TlsError;
use rustls::{ConnectionTrafficSecrets, ExtractedSecrets};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use zcnet_sys::raw::ktls::{self as sys, CryptoInfo, Direction, KtlsError};

/// Where the records are made after [`offload`].
#[derive(Debug)]
pub enum Offload {
    /// By the kernel: the socket reads and writes plaintext, the wire carries TLS records.
    Kernel(KernelTls),
    /// Still by rustls, in user space, because the kernel could not take them (the
    /// reason, to count).
    User(Box<Channel>, Declined),
}

/// Why a connection's records stayed in user space.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Declined {
    /// The kernel refused (`TCP_ULP "tls"`: no module, no ULP support, not this socket).
    #[error(transparent)]
    Kernel(#[from] KtlsError),
    /// rustls still held bytes the kernel would never see (records queued to send,
    /// plaintext or records read ahead): the socket was left as it was.
    #[error("kTLS not attempted: {0}")]
    Held(&'static str),
}

/// What [`hand_over`] did with a connection.
#[derive(Debug)]
pub enum HandOver {
    /// The kernel makes and checks the records with this cipher; rustls's state is gone.
    Kernel(&'static str),
    /// rustls keeps the records (the connection as it was), for this reason.
    User(Box<rustls::Connection>, Declined),
}

/// Hands `conn`'s record layer to the kernel on `sock`, where `conn` has just completed
/// its handshake on it and nothing was read past the handshake. Take the exporter value
/// before (the secrets' extraction consumes the rustls session).
///
/// In order: bytes rustls still holds (queued records, plaintext not yet read) are
/// refused first, leaving the socket untouched; then `TCP_ULP "tls"`, the only step a
/// kernel without the module refuses, which leaves the socket as it was; only then are
/// the secrets taken out and set as `TLS_TX`/`TLS_RX`. An error means the connection is
/// lost (the kernel took the upper-layer protocol and then refused the keys): drop it.
pub fn hand_over(mut conn: rustls::Connection, sock: &TcpStream) -> Result<HandOver, TlsError> {
    if let Some(why) = held(&mut conn) {
        return Ok(HandOver::User(Box::new(conn), Declined::Held(why)));
    }
    if let Err(why) = sys::attach_ulp(sock.as_fd()) {
        return Ok(HandOver::User(Box::new(conn), why.into()));
    }
    let secrets = conn.dangerous_extract_secrets().map_err(TlsError::Tls)?;
    let (tx, rx) = crypto_infos(&secrets)?;
    let cipher = tx.cipher_name();
    let fd = sock.as_fd();
    sys::set_keys(fd, Direction::Tx, &tx)
        .and_then(|()| sys::set_keys(fd, Direction::Rx, &rx))
        .map_err(|e| TlsError::Io {
            op: "kTLS keys after TCP_ULP tls was accepted".into(),
            source: io::Error::other(e),
        })?;
    Ok(HandOver::Kernel(cipher))
}

/// What rustls holds that the kernel would never see, if anything.
fn held(conn: &mut rustls::Connection) -> Option<&'static str> {
    if conn.is_handshaking() {
        return Some("the TLS handshake is not complete");
    }
    if conn.wants_write() {
        return Some("rustls still holds records to send");
    }
    match conn.process_new_packets() {
        Ok(st) if st.plaintext_bytes_to_read() > 0 => {
            Some("rustls holds plaintext the peer sent that was not read yet")
        }
        Ok(st) if st.peer_has_closed() => Some("the peer has closed the TLS session"),
        Ok(_) => None,
        Err(_) => Some("rustls holds records it could not open"),
    }
}

/// A socket whose TLS records the kernel makes and checks.
#[derive(Debug)]
pub struct KernelTls {
    stream: TcpStream,
    cipher: &'static str,
}

impl KernelTls {
    /// The socket: writes (and `sendfile`/`splice` into it) are encrypted by the kernel,
    /// reads decrypted.
    pub fn socket(&self) -> &TcpStream {
        &self.stream
    }

    /// The cipher the kernel runs.
    pub fn cipher(&self) -> &'static str {
        self.cipher
    }

    /// Sends `len` bytes of `file` from `offset` by `sendfile(2)`: the kernel reads them
    /// from the page cache and encrypts them into records on their way out, so they never
    /// pass through user space. Returns the bytes sent (fewer only at the file's end).
    pub fn send_file(&self, file: &std::fs::File, offset: u64, len: u64) -> io::Result<u64> {
        let mut done = 0u64;
        while done < len {
            let want = usize::try_from(len - done).unwrap_or(usize::MAX);
            let n = zcnet_sys::raw::splice::sendfile(
                self.stream.as_fd(),
                file.as_fd(),
                offset + done,
                want,
            )?;
            if n == 0 {
                break;
            }
            done += n as u64;
        }
        Ok(done)
    }

    /// Ends the stream. The kernel sends no `close_notify` of its own: the transfer
    /// protocol's own end (`Bye`) marks the end, and a truncation is caught by it.
    pub fn shutdown(&self) -> io::Result<()> {
        self.stream.shutdown(std::net::Shutdown::Write)
    }
}

impl Read for KernelTls {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.read(buf)
    }
}

impl Write for KernelTls {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The kernel's form of one direction's secrets.
pub fn crypto_info(seq: u64, secrets: &ConnectionTrafficSecrets) -> Result<CryptoInfo, TlsError> {
    let bad = |what: &str| TlsError::Tls(rustls::Error::General(format!("kTLS: {what}")));
    Ok(match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv } => CryptoInfo::aes_gcm_128(
            key.as_ref()
                .try_into()
                .map_err(|_| bad("AES-128 key length"))?,
            iv.as_ref().try_into().map_err(|_| bad("IV length"))?,
            seq,
        ),
        ConnectionTrafficSecrets::Aes256Gcm { key, iv } => CryptoInfo::aes_gcm_256(
            key.as_ref()
                .try_into()
                .map_err(|_| bad("AES-256 key length"))?,
            iv.as_ref().try_into().map_err(|_| bad("IV length"))?,
            seq,
        ),
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => CryptoInfo::chacha20_poly1305(
            key.as_ref()
                .try_into()
                .map_err(|_| bad("ChaCha20 key length"))?,
            iv.as_ref().try_into().map_err(|_| bad("IV length"))?,
            seq,
        ),
        _ => return Err(bad("a cipher the kernel is not given")),
    })
}

/// Both directions' kernel forms, (tx, rx).
pub fn crypto_infos(s: &ExtractedSecrets) -> Result<(CryptoInfo, CryptoInfo), TlsError> {
    Ok((crypto_info(s.tx.0, &s.tx.1)?, crypto_info(s.rx.0, &s.rx.1)?))
}

/// Moves `channel`'s records into the kernel if it can take them, else gives the channel
/// back with the reason ([`hand_over`]; bytes the channel read ahead are refused before
/// anything is tried). An error means the session is lost (the kernel took the upper-layer
/// protocol and then refused the keys): the connection must be dropped.
pub fn offload(channel: Channel) -> Result<Offload, TlsError> {
    if channel.holds_read_ahead() {
        return Ok(Offload::User(
            Box::new(channel),
            Declined::Held("the peer's records are already read ahead in user space"),
        ));
    }
    let binding = *channel.binding();
    let trust = channel.trust().cloned();
    let (conn, stream) = channel.into_parts()?;
    match hand_over(conn, &stream)? {
        HandOver::Kernel(cipher) => Ok(Offload::Kernel(KernelTls { stream, cipher })),
        HandOver::User(conn, why) => Ok(Offload::User(
            Box::new(Channel::from_parts(*conn, stream, binding, trust)),
            why,
        )),
    }
}
