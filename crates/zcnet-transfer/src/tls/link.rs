//! A session's TLS connection shared by the threads that use it: the session's own thread
//! reads (frames, file data) and writes, and at the receiver the finishing thread writes its
//! `Ack`s too. rustls's state is one value for both directions, so every write goes through
//! it under one lock; the reader never holds that lock while it waits for the socket (it
//! waits on the raw bytes' buffer alone), so a reader blocked on the peer never stops an
//! answer from going out.
//!
//! A writer that cannot send (the peer is not reading) can, at the sender, take in the
//! peer's bytes meanwhile ([`TlsLink::new`]'s `read_while_writing`): they wait as ciphertext
//! until the session reads them. That is what keeps a sender writing a window of files from
//! deadlocking against a receiver writing the answers to them, whatever the socket buffers
//! hold, as the plaintext sender does with its read-ahead buffer.

use super::channel::Channel;
use super::error::TlsError;
use super::BINDING_LEN;
use std::io::{self, BufRead, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::{Mutex, MutexGuard};

/// Raw (still encrypted) bytes read per `recv`.
const INBOX: usize = 256 << 10;

/// Most raw bytes a writer takes in while it cannot send: a window of answers is far less
/// (under 70 KiB of plaintext); a peer that sends more while not reading is out of step.
const INBOX_MAX: usize = 8 << 20;

/// Plaintext handed to rustls per call (16 records of 16 KiB), whose records then go out
/// in one `sendmsg` ([`DontWait`]'s vectored write): a system call per 256 KiB rather than
/// one per 16 KiB record.
pub(crate) const WRITE_CHUNK: usize = 256 << 10;

/// Ciphertext read from the socket and not yet given to rustls.
struct Inbox {
    buf: Vec<u8>,
    lo: usize,
    hi: usize,
    /// The socket reached its end.
    eof: bool,
}

impl Inbox {
    /// Room at the end, once what is held moves to the front.
    fn room(&mut self) -> &mut [u8] {
        if self.lo > 0 {
            self.buf.copy_within(self.lo..self.hi, 0);
            self.hi -= self.lo;
            self.lo = 0;
        }
        &mut self.buf[self.hi..]
    }
}

/// One end of a session's TLS connection, shared by its threads.
pub struct TlsLink {
    sock: TcpStream,
    conn: Mutex<rustls::Connection>,
    inbox: Mutex<Inbox>,
    read_while_writing: bool,
    binding: [u8; BINDING_LEN],
}

impl std::fmt::Debug for TlsLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsLink").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl TlsLink {
    /// A link over `sock` with rustls's state `conn`, its handshake done; `binding` is the
    /// session's exporter value. `read_while_writing`: a writer that cannot send takes in
    /// the peer's bytes meanwhile (only where one thread both reads and writes: the sender).
    pub fn new(
        conn: rustls::Connection,
        sock: TcpStream,
        binding: [u8; BINDING_LEN],
        read_while_writing: bool,
    ) -> TlsLink {
        TlsLink {
            sock,
            conn: Mutex::new(conn),
            inbox: Mutex::new(Inbox {
                buf: vec![0; INBOX],
                lo: 0,
                hi: 0,
                eof: false,
            }),
            read_while_writing,
            binding,
        }
    }

    /// The link of an established [`Channel`].
    pub fn from_channel(ch: Channel, read_while_writing: bool) -> Result<TlsLink, TlsError> {
        let binding = *ch.binding();
        let (conn, sock) = ch.into_parts()?;
        Ok(TlsLink::new(conn, sock, binding, read_while_writing))
    }

    /// The exporter value both ends share (what a token's proofs are bound to).
    pub fn binding(&self) -> &[u8; BINDING_LEN] {
        &self.binding
    }

    /// The socket underneath.
    pub fn socket(&self) -> &TcpStream {
        &self.sock
    }

    /// Encrypts `data` and sends it whole.
    pub fn write_all(&self, data: &[u8]) -> Result<(), TlsError> {
        let mut conn = lock(&self.conn);
        for chunk in data.chunks(WRITE_CHUNK) {
            conn.writer()
                .write_all(chunk)
                .map_err(|e| TlsError::io("encrypting", e))?;
            self.flush(&mut conn)?;
        }
        Ok(())
    }

    /// Sends what rustls has queued, without ever blocking in `send` itself: while the
    /// socket takes nothing, waits for room (and, at the sender, takes in the peer's bytes).
    fn flush(&self, conn: &mut rustls::Connection) -> Result<(), TlsError> {
        while conn.wants_write() {
            match conn.write_tls(&mut DontWait(&self.sock)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.wait_to_send()?,
                Err(e) => return Err(self.why_send_failed(conn, e)),
            }
        }
        Ok(())
    }

    /// Why a send failed: a peer that refused our records (it found one altered on the way,
    /// say) sends an alert before it closes, and that alert, when it has arrived, says more
    /// than the connection reset it caused.
    fn why_send_failed(&self, conn: &mut rustls::Connection, e: io::Error) -> TlsError {
        // Only where this thread is the one reader (the sender): elsewhere another thread
        // may be reading the socket.
        if !self.read_while_writing {
            return TlsError::io("sending", e);
        }
        let mut ib = lock(&self.inbox);
        loop {
            if ib.hi == ib.lo {
                let room = ib.room();
                match DontWaitRead(&self.sock).read(room) {
                    Ok(n) if n > 0 => ib.hi += n,
                    _ => break,
                }
            }
            let (lo, hi) = (ib.lo, ib.hi);
            match conn.read_tls(&mut &ib.buf[lo..hi]) {
                Ok(n) if n > 0 => ib.lo += n,
                _ => break,
            }
            if let Err(rustls::Error::AlertReceived(a)) = conn.process_new_packets() {
                return TlsError::PeerAlert(a);
            }
        }
        TlsError::io("sending", e)
    }

    /// Waits until the socket takes more bytes; meanwhile (at the sender) takes in what the
    /// peer sent. The socket's send timeout bounds the wait.
    fn wait_to_send(&self) -> Result<(), TlsError> {
        use rustix::event::{PollFd, PollFlags};
        let timeout = self
            .sock
            .write_timeout()
            .map_err(|e| TlsError::io("reading SO_SNDTIMEO", e))?;
        let limit = timeout.map(|t| {
            rustix::event::Timespec::try_from(t).unwrap_or(rustix::event::Timespec {
                tv_sec: i64::MAX,
                tv_nsec: 0,
            })
        });
        let mut inbox = self.read_while_writing.then(|| lock(&self.inbox));
        if let Some(ib) = inbox.as_mut() {
            if ib.room().is_empty() && ib.buf.len() < INBOX_MAX {
                let grown = (ib.buf.len() * 2).min(INBOX_MAX);
                ib.buf.resize(grown, 0);
            }
        }
        let mut flags = PollFlags::OUT;
        if inbox
            .as_mut()
            .is_some_and(|ib| !ib.eof && !ib.room().is_empty())
        {
            flags |= PollFlags::IN;
        }
        let mut fds = [PollFd::from_borrowed_fd(self.sock.as_fd(), flags)];
        let n = loop {
            match rustix::event::poll(&mut fds, limit.as_ref()) {
                Err(rustix::io::Errno::INTR) => continue,
                r => break r.map_err(|e| TlsError::io("waiting to send", e.into()))?,
            }
        };
        if n == 0 {
            return Err(TlsError::io(
                "sending",
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the peer took nothing for {:?}",
                        timeout.unwrap_or_default()
                    ),
                ),
            ));
        }
        let readable = fds[0]
            .revents()
            .intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR);
        if let (true, Some(ib)) = (readable, inbox.as_mut()) {
            let sock = socket2::SockRef::from(&self.sock);
            let room = ib.room();
            // `poll` said there are bytes (or an end): this `read` does not wait.
            match (&*sock).read(room) {
                Ok(0) => ib.eof = true,
                Ok(n) => ib.hi += n,
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(TlsError::io("reading", e)),
            }
        }
        Ok(())
    }

    /// Decrypts into `buf`; 0 only at the peer's `close_notify`. An altered record is
    /// [`TlsError::Tampered`], an end without `close_notify` [`TlsError::Truncated`].
    pub fn read(&self, buf: &mut [u8]) -> Result<usize, TlsError> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.take(|conn| conn.reader().read(buf))
    }

    /// Hands up to `want` decrypted bytes to `f` where rustls holds them (at most one
    /// record's plaintext, 16 KiB), without copying them out first: a hasher and a file
    /// write take them from there. Returns how many `f` took; 0 only at the peer's
    /// `close_notify` (or with `want` 0). Errors as [`Self::read`]'s, and `f`'s own; the
    /// bytes `f` refused stay unread.
    pub fn read_with<E: From<TlsError>>(
        &self,
        want: usize,
        mut f: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<usize, E> {
        if want == 0 {
            return Ok(0);
        }
        self.take(|conn| {
            let mut r = conn.reader();
            let b = r.fill_buf()?;
            let n = b.len().min(want);
            if n > 0 {
                if let Err(e) = f(&b[..n]) {
                    return Ok(Err(e));
                }
                r.consume(n);
            }
            Ok(Ok(n))
        })?
    }

    /// Runs `try_take` on rustls's state until it finds plaintext to take (rather than
    /// `WouldBlock`): decrypts what the inbox holds, and waits for the socket when it holds
    /// nothing, holding only the inbox's lock while it waits.
    fn take<T>(
        &self,
        mut try_take: impl FnMut(&mut rustls::Connection) -> io::Result<T>,
    ) -> Result<T, TlsError> {
        loop {
            {
                let mut conn = lock(&self.conn);
                match try_take(&mut conn) {
                    Ok(t) => return Ok(t),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        return Err(TlsError::Truncated)
                    }
                    Err(e) => return Err(TlsError::io("reading", e)),
                }
                let mut ib = lock(&self.inbox);
                if ib.hi > ib.lo || ib.eof {
                    let (lo, hi) = (ib.lo, ib.hi);
                    let n = conn
                        .read_tls(&mut &ib.buf[lo..hi])
                        .map_err(|e| TlsError::io("reading", e))?;
                    ib.lo += n;
                    drop(ib);
                    if let Err(e) = conn.process_new_packets() {
                        // Tell the peer why (the alert rustls queued), then fail.
                        let _ = conn.write_tls(&mut DontWait(&self.sock));
                        return Err(TlsError::from_rustls(e));
                    }
                    // A key update answered, say.
                    self.flush(&mut conn)?;
                    continue;
                }
            }
            // Nothing to decrypt: wait for the socket, holding only the raw bytes' buffer.
            let mut ib = lock(&self.inbox);
            if ib.hi > ib.lo || ib.eof {
                continue;
            }
            let room = ib.room();
            match (&self.sock).read(room) {
                Ok(0) => ib.eof = true,
                Ok(n) => ib.hi += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(TlsError::io(
                        "reading",
                        io::Error::new(
                            io::ErrorKind::TimedOut,
                            "no bytes from the peer within the receive timeout",
                        ),
                    ))
                }
                Err(e) => return Err(TlsError::io("reading", e)),
            }
        }
    }

    /// Reads exactly `buf.len()` bytes: `Ok(false)` at a clean end (`close_notify`) before
    /// the first, [`TlsError::Truncated`] at one after it.
    pub fn read_exact(&self, buf: &mut [u8]) -> Result<bool, TlsError> {
        let mut off = 0;
        while off < buf.len() {
            let n = self.read(&mut buf[off..])?;
            if n == 0 {
                if off == 0 {
                    return Ok(false);
                }
                return Err(TlsError::Truncated);
            }
            off += n;
        }
        Ok(true)
    }

    /// Sends `close_notify` (best effort): the peer's reads then end cleanly.
    pub fn close(&self) {
        let mut conn = lock(&self.conn);
        conn.send_close_notify();
        let _ = self.flush(&mut conn);
    }
}

/// `recv(MSG_DONTWAIT)`: a read that never waits.
struct DontWaitRead<'a>(&'a TcpStream);

impl Read for DontWaitRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.set_nonblocking(true)?;
        let r = (&*self.0).read(buf);
        self.0.set_nonblocking(false)?;
        r
    }
}

/// `send(MSG_DONTWAIT | MSG_NOSIGNAL)`: a write that never waits, for rustls's `write_tls`.
struct DontWait<'a>(&'a TcpStream);

impl Write for DontWait<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        socket2::SockRef::from(self.0).send_with_flags(buf, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
    }

    /// All the records rustls has queued in one `sendmsg` (its `write_tls` offers them as
    /// one slice per record; the default would send the first alone).
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        socket2::SockRef::from(self.0)
            .send_vectored_with_flags(bufs, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
