//! The sender's state machine without the syscalls: ids, headers, GSO batches, the learned
//! batch size, and the counting. Pure code, so that the blocking [`super::MsgSender`] and an
//! asynchronous sender (zcnet-tokio's `ZcUdpSocket`) drive the same steps and put the same
//! bytes on the wire:
//!
//! 1. [`Framer::begin`] checks the length and numbers the message ([`Outgoing`]);
//! 2. [`Framer::stamp`] writes the headers into a [`MsgBuf`]'s holes, or
//!    [`Framer::headers`] lays them out for an interleaved iovec (copy sends);
//! 3. [`Framer::next_batch`] names the next fragments of one `sendmsg` and its GSO size; the
//!    caller makes the call and reports it with [`Framer::after`], which advances, or halves
//!    the batch for good when the kernel refused a multi-datagram call;
//! 4. [`Framer::finish`] counts the message.

use super::msgbuf::MsgBuf;
use super::stats::MsgStats;
use super::wire::{Header, Layout, HEADER_LEN};
use super::MsgError;
use std::io;
use std::ops::Range;
use std::sync::Arc;

/// How many datagrams go into one `sendmsg`, lowered for good when the kernel refuses.
#[derive(Debug, Clone, Copy)]
struct Batching {
    per_call: usize,
    gso: bool,
}

/// One message on its way: its id, length, and the first fragment not yet sent.
#[derive(Debug, Clone)]
pub struct Outgoing {
    id: u64,
    len: usize,
    next: usize,
    fragments: usize,
}

impl Outgoing {
    /// The message's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Its payload length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the message is empty (one header-only datagram).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its datagrams.
    pub fn fragments(&self) -> usize {
        self.fragments
    }

    /// The first fragment not sent yet.
    pub fn next_fragment(&self) -> usize {
        self.next
    }

    /// Every fragment is out.
    pub fn is_done(&self) -> bool {
        self.next >= self.fragments
    }
}

/// One `sendmsg`'s worth of an [`Outgoing`] message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// The fragments it carries.
    pub fragments: Range<usize>,
    /// Their bytes in the message's wire layout (headers included; see [`MsgBuf::wire`]).
    pub wire: Range<usize>,
    /// The `UDP_SEGMENT` size to pass, `None` for a single datagram.
    pub gso: Option<u16>,
}

/// The pure half of a message sender (see the module docs).
#[derive(Debug)]
pub struct Framer {
    layout: Layout,
    session: u32,
    next_id: u64,
    max_message: usize,
    batching: Batching,
    stats: Arc<MsgStats>,
}

impl Framer {
    /// A sender of datagrams laid out by `layout`, `per_call` datagrams per GSO send (GSO off
    /// when `gso` is false or `per_call` is 1), messages up to `max_message` bytes.
    pub fn new(
        layout: Layout,
        session: u32,
        max_message: usize,
        per_call: usize,
        gso: bool,
    ) -> Self {
        Framer {
            layout,
            session,
            next_id: 0,
            max_message,
            batching: Batching {
                per_call: per_call.max(1),
                gso: gso && per_call > 1,
            },
            stats: Arc::new(MsgStats::new()),
        }
    }

    /// The wire layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The session number in every header.
    pub fn session(&self) -> u32 {
        self.session
    }

    /// The id the next message gets.
    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// The session's mark now: every id below [`Framer::next_id`] has been numbered (and,
    /// once its send returned, handed to the kernel). Counted as sent.
    pub fn mark(&self) -> [u8; super::wire::HEADER_LEN] {
        self.stats.marks_sent(1);
        super::wire::Mark {
            session: self.session,
            sent: self.next_id,
        }
        .encode()
    }

    /// Largest message accepted.
    pub fn max_message(&self) -> usize {
        self.max_message
    }

    /// Datagrams per `sendmsg` now (1 once GSO is off).
    pub fn datagrams_per_call(&self) -> usize {
        if self.batching.gso {
            self.batching.per_call
        } else {
            1
        }
    }

    /// The message counters.
    pub fn stats(&self) -> &Arc<MsgStats> {
        &self.stats
    }

    /// Checks `len` against the maximum.
    pub fn check_len(&self, len: usize) -> Result<(), MsgError> {
        if len > self.max_message {
            return Err(MsgError::TooLarge {
                len,
                max: self.max_message,
            });
        }
        Ok(())
    }

    /// Numbers a message of `len` bytes. Once begun the id is used: a message interrupted
    /// by an error is reported lost by the receiver.
    #[inline]
    pub fn begin(&mut self, len: usize) -> Result<Outgoing, MsgError> {
        self.check_len(len)?;
        let id = self.next_id;
        self.next_id += 1;
        Ok(Outgoing {
            id,
            len,
            next: 0,
            fragments: self.layout.fragments(len),
        })
    }

    /// Fragment `i`'s header.
    pub fn header(&self, out: &Outgoing, i: usize) -> Header {
        let r = self.layout.fragment(out.len, i);
        Header {
            session: self.session,
            id: out.id,
            total: out.len as u32,
            offset: r.start as u32,
            len: r.len() as u16,
        }
    }

    /// Writes every header of `out` into `buf`'s holes and selects its wire bytes. `buf`
    /// must be laid out by this framer's layout for `out`'s length.
    pub fn stamp(&self, out: &Outgoing, buf: &mut MsgBuf) -> Result<(), MsgError> {
        if buf.layout() != self.layout || buf.len() != out.len {
            return Err(MsgError::Config(format!(
                "a {}-byte buffer of segment {} cannot carry a {}-byte message of segment {}",
                buf.len(),
                buf.layout().segment(),
                out.len,
                self.layout.segment()
            )));
        }
        let seg = self.layout.segment();
        let storage = buf.storage_mut();
        for i in 0..out.fragments {
            self.header(out, i).encode_into(&mut storage[i * seg..]);
        }
        Ok(())
    }

    /// Every header of `out`, back to back ([`HEADER_LEN`] bytes each), into `into`.
    pub fn headers(&self, out: &Outgoing, into: &mut Vec<u8>) {
        into.clear();
        for i in 0..out.fragments {
            into.extend_from_slice(&self.header(out, i).encode());
        }
    }

    /// The iovec of fragments `r` of a copy send: header, payload, header, payload, …
    /// (`headers` from [`Framer::headers`], `data` the whole message).
    pub fn interleave<'a>(
        &self,
        headers: &'a [u8],
        data: &'a [u8],
        r: Range<usize>,
    ) -> Vec<io::IoSlice<'a>> {
        r.flat_map(|i| {
            [
                io::IoSlice::new(&headers[i * HEADER_LEN..(i + 1) * HEADER_LEN]),
                io::IoSlice::new(&data[self.layout.fragment(data.len(), i)]),
            ]
        })
        .collect()
    }

    /// The next `sendmsg` of `out`, or `None` when every fragment is out.
    #[inline]
    pub fn next_batch(&self, out: &Outgoing) -> Option<Batch> {
        if out.is_done() {
            return None;
        }
        let i = out.next;
        let j = (i + self.datagrams_per_call()).min(out.fragments);
        let wire =
            self.layout.wire_range(out.len, i).start..self.layout.wire_range(out.len, j - 1).end;
        Some(Batch {
            fragments: i..j,
            wire,
            gso: (j - i > 1).then_some(self.layout.segment() as u16),
        })
    }

    /// Reports how `batch`'s call went. `Ok(Some(bytes))`: sent, `out` advanced, counted.
    /// `Ok(None)`: try again (interrupted, or the kernel refused a GSO batch —
    /// `EINVAL`/`EMSGSIZE`/`EIO` — and the batch size is now halved for good, counted;
    /// at one datagram GSO is off, as quinn-udp lowers its `max_gso_segments`). `Err`: any
    /// other error, `out` unchanged, for the caller to act on (`EAGAIN`, `ENOBUFS`, ...).
    #[inline]
    pub fn after(
        &mut self,
        out: &mut Outgoing,
        batch: &Batch,
        result: io::Result<usize>,
    ) -> io::Result<Option<usize>> {
        let n = batch.fragments.len();
        match result {
            Ok(bytes) => {
                self.stats.send_calls(1);
                if n > 1 {
                    self.stats.gso_calls(1);
                }
                out.next = batch.fragments.end;
                Ok(Some(bytes))
            }
            Err(e) => match e.raw_os_error() {
                Some(libc::EINTR) => Ok(None),
                Some(errno @ (libc::EINVAL | libc::EMSGSIZE | libc::EIO)) if n > 1 => {
                    self.stats.gso_fallbacks(1);
                    self.stats.set_gso_errno(errno);
                    self.batching.per_call = (n / 2).max(1);
                    if self.batching.per_call == 1 {
                        self.batching.gso = false;
                        self.stats.set_gso_disabled();
                    }
                    Ok(None)
                }
                _ => Err(e),
            },
        }
    }

    /// Counts a message whose every fragment is out.
    #[inline]
    pub fn finish(&self, out: &Outgoing, zerocopy: bool) {
        if zerocopy {
            self.stats.zerocopy_messages(1);
        } else {
            self.stats.copied_messages(1);
        }
        self.stats.messages_sent(1);
        self.stats.bytes_sent(out.len as u64);
        self.stats.datagrams_sent(out.fragments as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Header as H;

    fn framer(seg: usize, per: usize) -> Framer {
        Framer::new(Layout::new(seg).unwrap(), 7, 1 << 20, per, true)
    }

    #[test]
    fn batches_tile_the_message_and_carry_gso_only_when_several() {
        let mut f = framer(100, 4);
        let mut out = f.begin(1000).unwrap();
        assert_eq!(out.fragments(), 14);
        let mut seen = Vec::new();
        while let Some(b) = f.next_batch(&out) {
            let bytes = b.wire.len();
            assert_eq!(b.gso.is_some(), b.fragments.len() > 1);
            assert_eq!(f.after(&mut out, &b, Ok(bytes)).unwrap(), Some(bytes));
            seen.push(b.fragments);
        }
        assert_eq!(seen, vec![0..4, 4..8, 8..12, 12..14]);
        f.finish(&out, false);
        let s = f.stats().snapshot();
        assert_eq!((s.send_calls, s.gso_calls, s.datagrams_sent), (4, 4, 14));
        assert_eq!(f.begin(1).unwrap().id(), 1);
    }

    #[test]
    fn a_refused_batch_halves_for_good_then_gso_goes_off() {
        let mut f = framer(100, 4);
        let mut out = f.begin(1000).unwrap();
        let b = f.next_batch(&out).unwrap();
        let refused = io::Error::from_raw_os_error(libc::EIO);
        assert_eq!(f.after(&mut out, &b, Err(refused)).unwrap(), None);
        assert_eq!(out.next_fragment(), 0);
        assert_eq!(f.next_batch(&out).unwrap().fragments, 0..2);
        let b = f.next_batch(&out).unwrap();
        let refused = io::Error::from_raw_os_error(libc::EMSGSIZE);
        assert_eq!(f.after(&mut out, &b, Err(refused)).unwrap(), None);
        assert_eq!(f.datagrams_per_call(), 1);
        assert_eq!(f.next_batch(&out).unwrap().gso, None);
        let again = io::Error::from_raw_os_error(libc::EAGAIN);
        let b = f.next_batch(&out).unwrap();
        assert!(f.after(&mut out, &b, Err(again)).is_err());
        let s = f.stats().snapshot();
        assert_eq!((s.gso_fallbacks, s.gso_disabled), (2, 1));
    }

    #[test]
    fn stamped_headers_and_interleaved_headers_decode_the_same() {
        let f = framer(64, 8);
        let mut fr = framer(64, 8);
        let out = fr.begin(100).unwrap();
        let mut hs = Vec::new();
        f.headers(&out, &mut hs);
        let data: Vec<u8> = (0..100u8).collect();
        let iov = f.interleave(&hs, &data, 0..out.fragments());
        let wire: Vec<u8> = iov.iter().flat_map(|s| s.to_vec()).collect();
        assert_eq!(wire.len(), f.layout().wire_len(100));
        let mut off = 0;
        for i in 0..out.fragments() {
            let r = f.layout().wire_range(100, i);
            let (h, p) = H::decode(&wire[r.clone()]).unwrap();
            assert_eq!((h.session, h.id, h.offset as usize), (7, 0, off));
            assert_eq!(p, &data[off..off + p.len()]);
            off += p.len();
        }
        assert_eq!(off, 100);
    }

    #[test]
    fn too_large_is_refused_before_an_id_is_used() {
        let mut f = Framer::new(Layout::new(100).unwrap(), 1, 10, 4, true);
        assert!(matches!(
            f.begin(11),
            Err(MsgError::TooLarge { len: 11, max: 10 })
        ));
        assert_eq!(f.next_id(), 0);
    }
}
