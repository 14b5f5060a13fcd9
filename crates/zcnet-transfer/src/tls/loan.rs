//! Encrypting straight into the buffers a zero-copy sender lends to the kernel.
//!
//! [`SealedSender`] takes an established [`Channel`] and moves its socket into a
//! `zcnet::Sender`. Each piece of plaintext is sealed into TLS records by rustls and the
//! records are written by rustls's `write_tls` into the spare room of a pool buffer
//! ([`zcnet::TxBuf::spare_mut`], then [`zcnet::TxBuf::commit`]); a full buffer goes out by
//! [`zcnet::Sender::send`], so on the `zerocopy` and `uring` paths the kernel sends the
//! ciphertext from the buffer it was written into, with no copy into the socket.
//!
//! What rustls 0.23 itself does per record: it copies the plaintext into the record it
//! builds and seals it there (one copy and one AEAD pass, over at most 16 KiB, so the seal
//! reads bytes the copy left in cache), and `write_tls` copies the sealed record into our
//! buffer. Its unbuffered API (`WriteTraffic::encrypt` into a caller's buffer) stages the
//! record the same way and copies it out the same way, and has no RFC 8446 exporter, which
//! the token binding needs, so this uses the buffered connection.

use super::channel::Channel;
use super::error::TlsError;
use std::io::Write;
use std::net::TcpStream;
use zcnet::{Sender, SenderConfig, TxBuf};

/// Plaintext sealed per step: records go to the loan buffer while still in cache.
const SEAL_CHUNK: usize = 64 << 10;

fn zc_err(op: &'static str) -> impl FnOnce(zcnet::Error) -> TlsError {
    move |e| TlsError::Io {
        op: op.into(),
        source: e.into(),
    }
}

/// The sending end of a channel whose records are written into zero-copy loan buffers.
pub struct SealedSender {
    conn: rustls::Connection,
    tx: Sender,
    /// A second descriptor of the socket, for reading the peer's records.
    reader: std::io::BufReader<TcpStream>,
    /// The buffer being filled, sent once full or at [`SealedSender::flush`].
    filling: Option<TxBuf>,
    sealed: u64,
}

impl std::fmt::Debug for SealedSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedSender")
            .field("sealed", &self.sealed)
            .finish_non_exhaustive()
    }
}

impl SealedSender {
    /// Hands `channel`'s socket to a `zcnet::Sender` configured by `cfg` (its path decides
    /// whether the loans go zero-copy). Nothing of the channel is lost: rustls's state
    /// comes along.
    pub fn new(channel: Channel, cfg: &SenderConfig) -> Result<SealedSender, TlsError> {
        let (mut conn, stream) = channel.into_parts()?;
        conn.set_buffer_limit(None);
        let reader = std::io::BufReader::new(
            stream
                .try_clone()
                .map_err(|e| TlsError::io("duplicating the socket", e))?,
        );
        let tx = Sender::from_stream(stream, cfg).map_err(zc_err("adopting the socket"))?;
        Ok(SealedSender {
            conn,
            tx,
            reader,
            filling: None,
            sealed: 0,
        })
    }

    /// Encrypts `data` into loan buffers; full ones are sent at once, the last one waits for
    /// more data or [`SealedSender::flush`].
    pub fn send(&mut self, data: &[u8]) -> Result<(), TlsError> {
        for chunk in data.chunks(SEAL_CHUNK) {
            self.conn
                .writer()
                .write_all(chunk)
                .map_err(|e| TlsError::io("encrypting", e))?;
            self.drain()?;
            self.sealed += chunk.len() as u64;
        }
        Ok(())
    }

    /// Moves rustls's sealed records into loan buffers, sending each that fills.
    fn drain(&mut self) -> Result<(), TlsError> {
        while self.conn.wants_write() {
            let mut buf = match self.filling.take() {
                Some(b) => b,
                None => self.tx.buffer().map_err(zc_err("taking a loan buffer"))?,
            };
            let mut room: &mut [u8] = buf.spare_mut();
            let n = self
                .conn
                .write_tls(&mut room)
                .map_err(|e| TlsError::io("sealing into a loan buffer", e))?;
            buf.commit(n);
            if buf.is_full() {
                self.tx.send(buf).map_err(zc_err("sending"))?;
            } else {
                self.filling = Some(buf);
            }
        }
        Ok(())
    }

    /// Sends the buffer being filled and waits until the kernel has taken every byte.
    pub fn flush(&mut self) -> Result<(), TlsError> {
        self.drain()?;
        if let Some(b) = self.filling.take() {
            if !b.is_empty() {
                self.tx.send(b).map_err(zc_err("sending"))?;
            }
        }
        self.tx.flush().map_err(zc_err("flushing"))
    }

    /// Plaintext bytes sealed so far.
    pub fn sealed(&self) -> u64 {
        self.sealed
    }

    /// The sender's counters: which path carried the ciphertext.
    pub fn stats(&self) -> zcnet::stats::StatsSnapshot {
        self.tx.stats().snapshot()
    }

    /// Reads the peer's reply (records it sent back), `buf.len()` bytes exactly, after
    /// flushing what is sealed.
    pub fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), TlsError> {
        use std::io::Read;
        self.flush()?;
        let mut got = 0;
        while got < buf.len() {
            match self.conn.reader().read(&mut buf[got..]) {
                Ok(0) => return Err(TlsError::Truncated),
                Ok(n) => {
                    got += n;
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return Err(TlsError::Truncated)
                }
                Err(e) => return Err(TlsError::io("reading", e)),
            }
            self.conn
                .read_tls(&mut self.reader)
                .map_err(|e| TlsError::io("reading", e))?;
            if let Err(e) = self.conn.process_new_packets() {
                return Err(TlsError::from_rustls(e));
            }
        }
        Ok(())
    }

    /// Sends `close_notify` behind the data, flushes, and returns the counters.
    pub fn finish(mut self) -> Result<zcnet::stats::StatsSnapshot, TlsError> {
        self.conn.send_close_notify();
        self.flush()?;
        self.tx.finish().map_err(zc_err("finishing"))
    }
}
