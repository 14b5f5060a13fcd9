//! The receiving end's connection. Every byte a receiving session reads or writes passes
//! through [`RecvChannel`]: the handshake's frames, control frames and `Put`s read ahead of
//! need, a `File`'s data spliced into its partial file, and the answers (the finishing
//! thread writes its `Ack`s on a duplicate of the same socket, [`RecvChannel::answer_sink`]; over TLS, through the one TLS connection).
//! What carries a session's bytes is decided here and nowhere else, so another carrier (an
//! encrypted channel) slots in at this one place.

use super::super::finish::AnswerSink;
use super::super::tls::{TlsError, TlsLink};
use super::super::wire::{Frame, MAX_CONTROL};
use super::tls_read;
use super::TransferError;
use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use zcnet::stream::Receiver;

/// A receiving session's connection and the frames read ahead on it.
pub(super) struct RecvChannel<'a> {
    rx: &'a mut Receiver,
    ahead: ReadAhead,
    /// The TLS connection every byte goes through, once the session is encrypted.
    tls: Option<Arc<TlsLink>>,
}

impl<'a> RecvChannel<'a> {
    pub(super) fn new(rx: &'a mut Receiver) -> Self {
        RecvChannel {
            rx,
            ahead: ReadAhead::new(),
            tls: None,
        }
    }

    /// A channel whose bytes go through `tls` (an encrypted session past its TLS
    /// handshake), or straight to the socket with `None`.
    pub(super) fn with_tls(rx: &'a mut Receiver, tls: Option<Arc<TlsLink>>) -> Self {
        let mut c = RecvChannel::new(rx);
        c.tls = tls;
        c
    }

    /// From here on every byte goes through `link`.
    pub(super) fn encrypt(&mut self, link: Arc<TlsLink>) {
        self.tls = Some(link);
    }

    /// Counts one operation that fell back for `reason`.
    pub(super) fn count_fallback(&self, reason: zcnet::FallbackReason) {
        self.rx.stats().fallback(reason, 0);
    }

    /// The session's socket (for the TLS handshake, which runs on a duplicate of it).
    pub(super) fn socket(&self) -> std::os::fd::BorrowedFd<'_> {
        self.rx.socket()
    }

    /// Reads what the peer sent: from the socket, or decrypted from the TLS connection.
    fn recv(&mut self, buf: &mut [u8]) -> Result<usize, TransferError> {
        recv(self.rx, self.tls.as_deref(), buf)
    }

    /// Turns Nagle's algorithm off (see [`super::send_channel::no_delay`]).
    pub(super) fn no_delay(&self) -> Result<(), TransferError> {
        super::send_channel::no_delay(self.rx.socket())
    }

    /// Reads exactly `buf.len()` bytes straight from the socket: `false` at a clean end of
    /// stream before the first.
    pub(super) fn read_exact(&mut self, buf: &mut [u8]) -> Result<bool, TransferError> {
        let mut off = 0;
        while off < buf.len() {
            let n = self.recv(&mut buf[off..])?;
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

    /// Reads one frame straight from the socket, nothing beyond it (a `File`'s data follows
    /// its `Start` and is spliced from the socket); `None` at a clean end of stream between
    /// frames.
    pub(super) fn read_frame(&mut self) -> Result<Option<Frame>, TransferError> {
        let mut h = [0u8; 5];
        if !self.read_exact(&mut h)? {
            return Ok(None);
        }
        let (ty, len) = Frame::check_header(h)?;
        let mut p = vec![0u8; len];
        if !self.read_exact(&mut p)? && len > 0 {
            return Err(zcnet::Error::PeerClosed {
                op: "reading a frame",
            }
            .into());
        }
        Ok(Some(Frame::decode(ty, &p)?))
    }

    /// The next frame between files, through the read-ahead buffer; `None` at a clean end
    /// of stream between frames.
    pub(super) fn next_frame(&mut self) -> Result<Option<Frame>, TransferError> {
        self.ahead.frame(&mut From {
            rx: self.rx,
            tls: self.tls.as_deref(),
        })
    }

    /// Refuses bytes read ahead of a frame that must be answered first (`File`, `Range`):
    /// a peer out of step, whose bytes would be lost to the splice that reads the data.
    pub(super) fn nothing_ahead(&self, expected: &'static str) -> Result<(), TransferError> {
        if self.ahead.is_empty() {
            return Ok(());
        }
        Err(TransferError::Unexpected {
            expected,
            got: "bytes sent ahead of it",
        })
    }

    /// A `Put`'s `size` (≤ [`MAX_CONTROL`]) bytes and its trailer, held in the read-ahead
    /// buffer ([`ReadAhead::put_body`]); the bytes are [`Self::held`]`(range)`.
    #[allow(clippy::type_complexity)]
    pub(super) fn put_body(
        &mut self,
        size: usize,
    ) -> Result<Result<(Range<usize>, Option<Frame>), usize>, TransferError> {
        self.ahead.put_body(
            &mut From {
                rx: self.rx,
                tls: self.tls.as_deref(),
            },
            size,
        )
    }

    /// Bytes held in the read-ahead buffer, as [`Self::put_body`] placed them.
    pub(super) fn held(&self, range: Range<usize>) -> &[u8] {
        &self.ahead.buf[range]
    }

    /// Moves bytes read ahead to the front of `out`; how many.
    pub(super) fn take_ahead(&mut self, out: &mut [u8]) -> usize {
        self.ahead.take_into(out)
    }

    /// Splices up to `len` bytes from the socket into `file` at `offset`; how many came.
    pub(super) fn recv_to_file(
        &mut self,
        file: &File,
        offset: u64,
        len: u64,
    ) -> Result<u64, TransferError> {
        if self.tls.is_some() {
            return self.recv_to_file_tls(file, offset, len, None);
        }
        Ok(self.rx.recv_to_file(file, offset, len)?)
    }

    /// Whether the session's bytes come through TLS.
    pub(super) fn is_encrypted(&self) -> bool {
        self.tls.is_some()
    }

    /// [`Self::recv_to_file`] over TLS: decrypted in memory and written from there
    /// (`splice` cannot pass through a user-space record layer). Each record's plaintext is
    /// hashed (with `hash`) and written where rustls holds it, a `pwrite` per record of up
    /// to 16 KiB, rather than copied out into a buffer of ours first: the file is not read
    /// back to be verified, and no byte is copied in user space after rustls's own copy.
    pub(super) fn recv_to_file_tls(
        &mut self,
        file: &File,
        offset: u64,
        len: u64,
        mut hash: Option<&mut blake3::Hasher>,
    ) -> Result<u64, TransferError> {
        let link = self.tls.clone().expect("called over TLS");
        let mut got = 0u64;
        while got < len {
            let want = usize::try_from(len - got).unwrap_or(usize::MAX);
            let at = offset + got;
            let r = link.read_with(want, |b| -> Result<(), TransferError> {
                if let Some(h) = hash.as_deref_mut() {
                    h.update(b);
                }
                file.write_all_at(b, at)
                    .map_err(|e| zcnet::Error::io("writing the received file", e).into())
            });
            let n = match r {
                // An end without `close_notify`: as short as a clean one here.
                Err(TransferError::Tls(TlsError::Truncated)) => 0,
                r => r?,
            };
            if n == 0 {
                return Err(zcnet::Error::Truncated {
                    op: "the file being received",
                    expected: len,
                    got,
                }
                .into());
            }
            self.rx.stats().add_rx_copied_bytes(n as u64);
            got += n as u64;
        }
        Ok(got)
    }

    /// Whether each splice into a file reserves its space first (`fallocate`).
    pub(super) fn set_file_preallocate(&mut self, on: bool) {
        self.rx.set_file_preallocate(on);
    }

    /// Sends one frame to the sender.
    pub(super) fn reply(&self, f: &Frame) -> Result<(), TransferError> {
        self.reply_bytes(&f.to_bytes())
    }

    /// Sends bytes already encoded (frames) to the sender.
    pub(super) fn reply_bytes(&self, bytes: &[u8]) -> Result<(), TransferError> {
        if let Some(link) = &self.tls {
            link.write_all(bytes)?;
            self.rx.stats().add_tx_copy_bytes(bytes.len() as u64);
            return Ok(());
        }
        let fd = self.rx.socket();
        let sock = socket2::SockRef::from(&fd);
        (&*sock)
            .write_all(bytes)
            .map_err(|e| zcnet::Error::io("answering the sender", e).into())
    }

    /// Where the finishing thread writes its `Ack`s: a duplicate of the socket, or the
    /// session's one TLS connection (every write of an encrypted session goes through it).
    pub(super) fn answer_sink(&self) -> Result<AnswerSink, TransferError> {
        if let Some(link) = &self.tls {
            return Ok(AnswerSink::Tls(link.clone()));
        }
        Ok(AnswerSink::Socket(
            self.rx
                .socket()
                .try_clone_to_owned()
                .map_err(|e| zcnet::Error::io("dup of the session's socket", e))?,
        ))
    }
}

/// Reads what the peer sent into `buf`: from the socket, or decrypted from `tls`.
fn recv(rx: &mut Receiver, tls: Option<&TlsLink>, buf: &mut [u8]) -> Result<usize, TransferError> {
    match tls {
        Some(link) => {
            let n = tls_read(link, buf)?;
            rx.stats().add_rx_copied_bytes(n as u64);
            Ok(n)
        }
        None => Ok(rx.recv_into(buf)?),
    }
}

/// Where the read-ahead buffer reads from.
struct From<'r> {
    rx: &'r mut Receiver,
    tls: Option<&'r TlsLink>,
}

impl From<'_> {
    fn recv_into(&mut self, buf: &mut [u8]) -> Result<usize, TransferError> {
        recv(self.rx, self.tls, buf)
    }
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
    fn fill(&mut self, rx: &mut From<'_>, n: usize) -> Result<bool, TransferError> {
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
    fn fill_until_end(&mut self, rx: &mut From<'_>, n: usize) -> Result<bool, TransferError> {
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
        rx: &mut From<'_>,
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
    fn frame(&mut self, rx: &mut From<'_>) -> Result<Option<Frame>, TransferError> {
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
