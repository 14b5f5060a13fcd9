//! Handing a channel's record layer to the kernel (kTLS), where the kernel has the `tls`
//! module, so file data keeps going by `sendfile`/`splice` and is encrypted by the kernel
//! on its way out; elsewhere the channel stays in user space ([`super::SealedSender`]) and
//! the reason is returned for the caller to count.
//!
//! The order makes the fallback safe: `TCP_ULP "tls"` is tried first on the live socket —
//! the only step a kernel without the module refuses, and one that leaves the socket as it
//! was — and only then are rustls's traffic secrets taken out (which consumes the rustls
//! session) and set as `TLS_TX`/`TLS_RX`. Call it right after the handshake, before any
//! application data: bytes rustls has already read or still holds are refused
//! ([`TlsError::Tls`]), since the kernel would never see them.

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
    /// Still by rustls, in user space, because the kernel could not (the reason, to count).
    User(Box<Channel>, KtlsError),
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

/// Offers a session's socket to the kernel's TLS (`TCP_ULP "tls"`) right after its
/// handshake, and says why its records stay in user space — the kernel's reason (on a
/// kernel without the `tls` module: `ENOENT`, with what `tcp_available_ulp` lists), or,
/// where the kernel took the upper-layer protocol, that sessions do not hand their keys
/// over yet (the socket then carries bytes as before: the `tls` protocol passes them
/// through until keys are set). The caller counts it as a fallback.
pub fn attempt(sock: &TcpStream) -> String {
    match sys::attach_ulp(sock.as_fd()) {
        Err(why) => why.to_string(),
        Ok(()) => "the kernel took TCP_ULP tls, but transfer sessions keep their records in user space for now (their keys are not handed to the kernel yet)".into(),
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
/// back with the kernel's reason. An error means the session is lost (the kernel took the
/// upper-layer protocol and then refused the keys): the connection must be dropped.
pub fn offload(channel: Channel) -> Result<Offload, TlsError> {
    if let Err(why) = sys::attach_ulp(channel.socket().as_fd()) {
        return Ok(Offload::User(Box::new(channel), why));
    }
    let (conn, stream) = channel.into_parts()?;
    if conn.wants_write() {
        return Err(TlsError::Tls(rustls::Error::General(
            "kTLS: records still queued in user space".into(),
        )));
    }
    let secrets = conn.dangerous_extract_secrets().map_err(TlsError::Tls)?;
    let (tx, rx) = crypto_infos(&secrets)?;
    let cipher = tx.cipher_name();
    let fd = stream.as_fd();
    sys::set_keys(fd, Direction::Tx, &tx)
        .and_then(|()| sys::set_keys(fd, Direction::Rx, &rx))
        .map_err(|e| TlsError::Io {
            op: "kTLS keys after TCP_ULP tls was accepted".into(),
            source: io::Error::other(e),
        })?;
    Ok(Offload::Kernel(KernelTls { stream, cipher }))
}
