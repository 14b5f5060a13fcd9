//! The sending end's connection. Every byte a sending session writes or reads passes
//! through [`SendChannel`]: control frames and batches of `Put`s by the copy path, file data
//! by `sendfile`, the receiver's answers read back (one frame at a time, or read ahead of
//! need while a window of `Put`s is out). What carries a session's bytes is decided here
//! and nowhere else, so another carrier (an encrypted channel) slots in at this one place.

use super::super::tls::TlsLink;
use super::super::wire::{Frame, MAX_CONTROL};
use super::{TransferError, STEP};
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use zcnet::stream::Sender;

/// File bytes read and encrypted per step over TLS.
const TLS_STEP: usize = 256 << 10;

/// A sending session's connection and the answers read ahead on it.
pub(super) struct SendChannel<'a> {
    tx: &'a mut Sender,
    /// Answers read ahead: many `Ack`s per `recv`.
    answers: Answers,
    /// The TLS connection every byte goes through, once the session is encrypted.
    tls: Option<Arc<TlsLink>>,
    /// File bytes on their way to be encrypted (TLS only).
    staging: Vec<u8>,
}

impl<'a> SendChannel<'a> {
    pub(super) fn new(tx: &'a mut Sender) -> Self {
        SendChannel {
            tx,
            answers: Answers::new(),
            tls: None,
            staging: Vec::new(),
        }
    }

    /// A channel whose bytes go through `tls` (an encrypted session past its TLS
    /// handshake), or straight to the socket with `None`.
    pub(super) fn with_tls(tx: &'a mut Sender, tls: Option<Arc<TlsLink>>) -> Self {
        let mut c = SendChannel::new(tx);
        c.tls = tls;
        c
    }

    /// From here on every byte goes through `link`.
    pub(super) fn encrypt(&mut self, link: Arc<TlsLink>) {
        self.tls = Some(link);
    }

    /// The TLS connection, if the session is encrypted.
    pub(super) fn tls(&self) -> Option<&Arc<TlsLink>> {
        self.tls.as_ref()
    }

    /// Counts one operation that fell back for `reason`.
    pub(super) fn count_fallback(&self, reason: zcnet::FallbackReason) {
        self.tx.stats().fallback(reason, 0);
    }

    /// The session's socket (for the TLS handshake, which runs on a duplicate of it).
    pub(super) fn socket(&self) -> std::os::fd::BorrowedFd<'_> {
        self.tx.socket()
    }

    /// Turns Nagle's algorithm off (`TCP_NODELAY`, tcp(7)). Every control frame is small
    /// and the peer's next step waits for it: with Nagle on, a frame written while earlier
    /// bytes are unacknowledged waits for the peer's delayed ACK (40 ms on Linux), which
    /// made a tree of small files cost about that much per file.
    pub(super) fn no_delay(&self) -> Result<(), TransferError> {
        no_delay(self.tx.socket())
    }

    /// Sends one frame by the copy path.
    pub(super) fn send_frame(&mut self, f: &Frame) -> Result<(), TransferError> {
        self.send_bytes(&f.to_bytes())
    }

    /// Sends bytes already encoded (frames) by the copy path.
    pub(super) fn send_bytes(&mut self, bytes: &[u8]) -> Result<(), TransferError> {
        if let Some(link) = &self.tls {
            link.write_all(bytes)?;
            self.tx.stats().add_tx_copy_bytes(bytes.len() as u64);
            return Ok(());
        }
        Ok(self.tx.send_slice(bytes)?)
    }

    /// Sends `from..end` of `file` by `sendfile`, [`STEP`] bytes a call, telling `sent` each
    /// call's bytes; a file that ends before `end` is the error `shrank(where it ended)`.
    pub(super) fn send_extent(
        &mut self,
        file: &File,
        from: u64,
        end: u64,
        shrank: &dyn Fn(u64) -> TransferError,
        sent: &mut dyn FnMut(u64),
    ) -> Result<(), TransferError> {
        if self.tls.is_some() {
            return self.send_extent_tls(file, from, end, shrank, sent, None);
        }
        let mut off = from;
        while off < end {
            let n = match self.tx.send_file(file, off, (end - off).min(STEP)) {
                Ok(n) => n,
                Err(zcnet::Error::Truncated { got, .. }) => return Err(shrank(off + got)),
                Err(zcnet::Error::RangeBeyondEof { .. }) => return Err(shrank(off)),
                Err(e) => return Err(e.into()),
            };
            if n == 0 {
                return Err(shrank(off));
            }
            off += n;
            sent(n);
        }
        Ok(())
    }

    /// [`Self::send_extent`] over TLS: the file's bytes are read into memory and encrypted
    /// from there (`sendfile` cannot pass through a user-space record layer); with `hash`,
    /// each chunk is hashed there too, while it is in cache, right before it is sealed.
    pub(super) fn send_extent_tls(
        &mut self,
        file: &File,
        from: u64,
        end: u64,
        shrank: &dyn Fn(u64) -> TransferError,
        sent: &mut dyn FnMut(u64),
        mut hash: Option<&mut blake3::Hasher>,
    ) -> Result<(), TransferError> {
        let link = self.tls.clone().expect("called over TLS");
        if self.staging.is_empty() {
            self.staging = vec![0; TLS_STEP];
        }
        let mut off = from;
        while off < end {
            let want = (end - off).min(TLS_STEP as u64) as usize;
            let n = match file.read_at(&mut self.staging[..want], off) {
                Ok(0) => return Err(shrank(off)),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(zcnet::Error::io("reading the file being sent", e).into()),
            };
            if let Some(h) = hash.as_deref_mut() {
                h.update(&self.staging[..n]);
            }
            link.write_all(&self.staging[..n])?;
            self.tx.stats().add_tx_copy_bytes(n as u64);
            off += n as u64;
            sent(n as u64);
        }
        Ok(())
    }

    /// Reads exactly one frame straight from the socket, nothing beyond it: an answer where
    /// no other can be due (the handshake, a lone round trip, `Bye`).
    pub(super) fn read_frame(&mut self) -> Result<Frame, TransferError> {
        let mut h = [0u8; 5];
        self.read_exact(&mut h)?;
        let (ty, len) = Frame::check_header(h)?;
        let mut p = vec![0u8; len];
        self.read_exact(&mut p)?;
        Ok(Frame::decode(ty, &p)?)
    }

    fn read_exact(&self, buf: &mut [u8]) -> Result<(), TransferError> {
        if let Some(link) = &self.tls {
            if !read_exact_tls(link, buf)? {
                return Err(zcnet::Error::PeerClosed {
                    op: "reading the receiver's answer",
                }
                .into());
            }
            return Ok(());
        }
        let fd = self.tx.socket();
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

    /// The next answer to the window of pipelined files, through the read-ahead buffer.
    pub(super) fn answer(&mut self) -> Result<Frame, TransferError> {
        let from = From {
            tx: self.tx,
            tls: self.tls.as_deref(),
        };
        self.answers.frame(&from)
    }

    /// A whole frame read ahead (the receiver spoke out of turn), if any.
    pub(super) fn held(&mut self) -> Result<Option<Frame>, TransferError> {
        self.answers.held()
    }

    /// Writes gathered `Put`s. While the socket will not take more, it reads whatever
    /// answers have arrived into the read-ahead buffer (they always fit there: a window's
    /// worth is under 70 KiB): otherwise, with socket buffers too small for a window's
    /// answers, the receiver could block writing answers nobody reads while this end
    /// blocks writing files it no longer reads — a deadlock no buffer size should be able
    /// to cause.
    pub(super) fn send_batch(&mut self, batch: &[u8]) -> Result<(), TransferError> {
        if self.tls.is_some() {
            // The link takes in the receiver's answers while it cannot send.
            return self.send_bytes(batch);
        }
        let fd = self.tx.socket();
        let sock = socket2::SockRef::from(&fd);
        let timeout = sock
            .write_timeout()
            .map_err(|e| zcnet::Error::io("reading SO_SNDTIMEO", e))?;
        let mut off = 0;
        while off < batch.len() {
            match sock.send_with_flags(&batch[off..], libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) {
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
        self.tx.stats().add_tx_copy_bytes(off as u64);
        Ok(())
    }
}

/// Reads exactly `buf.len()` bytes from `link`: `false` at an end of stream first.
fn read_exact_tls(link: &TlsLink, buf: &mut [u8]) -> Result<bool, TransferError> {
    let mut off = 0;
    while off < buf.len() {
        let n = super::tls_read(link, &mut buf[off..])?;
        if n == 0 {
            return Ok(false);
        }
        off += n;
    }
    Ok(true)
}

/// Turns Nagle's algorithm off on `fd` (see [`SendChannel::no_delay`]).
pub(super) fn no_delay(fd: std::os::fd::BorrowedFd<'_>) -> Result<(), TransferError> {
    socket2::SockRef::from(&fd)
        .set_tcp_nodelay(true)
        .map_err(|e| zcnet::Error::io("setsockopt(TCP_NODELAY)", e).into())
}

/// Where answers are read from: the socket, or the TLS connection over it.
struct From<'a> {
    tx: &'a Sender,
    tls: Option<&'a TlsLink>,
}

impl From<'_> {
    fn read(&self, buf: &mut [u8]) -> Result<usize, TransferError> {
        if let Some(link) = self.tls {
            let n = super::tls_read(link, buf)?;
            self.tx.stats().add_rx_copied_bytes(n as u64);
            return Ok(n);
        }
        let fd = self.tx.socket();
        match (&*socket2::SockRef::from(&fd)).read(buf) {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => self.read(buf),
            Err(e) => Err(zcnet::Error::io("reading the receiver's answer", e).into()),
        }
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

    fn fill(&mut self, from: &From<'_>, n: usize) -> Result<(), TransferError> {
        while self.hi - self.lo < n {
            if self.buf.len() - self.lo < n {
                self.buf.copy_within(self.lo..self.hi, 0);
                self.hi -= self.lo;
                self.lo = 0;
            }
            let got = from.read(&mut self.buf[self.hi..])?;
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

    fn frame(&mut self, from: &From<'_>) -> Result<Frame, TransferError> {
        self.fill(from, 5)?;
        let h: [u8; 5] = self.buf[self.lo..self.lo + 5].try_into().expect("5 bytes");
        let (ty, len) = Frame::check_header(h)?;
        if len > MAX_CONTROL {
            return Err(TransferError::Unexpected {
                expected: "an answer",
                got: "data",
            });
        }
        self.fill(from, 5 + len)?;
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
