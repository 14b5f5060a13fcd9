//! [`MsgBuf`]: a loaned message buffer laid out as the message goes on the wire, with a
//! hole for each datagram's header (Jin, Zhang, Tan, "Lightweight Messages", §3.1, Fig. 1),
//! so that every GSO batch is one contiguous range a `MSG_ZEROCOPY` send can take.

use super::wire::{Layout, HEADER_LEN};
use zcnet::TxBuf;

/// A loaned message buffer: pool storage laid out as the message will be on the wire, with a
/// [`HEADER_LEN`]-byte hole before every `segment − 28` payload bytes. The application writes
/// the payload into it once ([`MsgBuf::write_at`], [`MsgBuf::payload_mut`]); the headers are
/// filled in by `MsgSender::send`.
#[derive(Debug)]
pub struct MsgBuf {
    pub(crate) buf: TxBuf,
    pub(crate) len: usize,
    pub(crate) layout: Layout,
}

impl MsgBuf {
    /// Lays a message of `len` bytes out in `buf` (a [`zcnet::Pool`] buffer, page-aligned),
    /// one header hole per datagram of `layout`; `buf` back when it is too small.
    pub fn new(mut buf: TxBuf, len: usize, layout: Layout) -> Result<MsgBuf, TxBuf> {
        let wire = layout.wire_len(len);
        if wire > buf.capacity() {
            return Err(buf);
        }
        buf.set_len(wire);
        Ok(MsgBuf { buf, len, layout })
    }

    /// Makes it a message of `len` bytes (the payload bytes in place are kept where they
    /// still fit; a larger message's new bytes are whatever the storage held). False, and
    /// unchanged, when the storage is too small.
    pub fn resize(&mut self, len: usize) -> bool {
        let wire = self.layout.wire_len(len);
        if wire > self.buf.capacity() {
            return false;
        }
        self.buf.set_len(wire);
        self.len = len;
        true
    }

    /// The layout its holes are cut for.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The message as it goes on the wire: headers (once stamped) and payload.
    pub fn wire(&self) -> &[u8] {
        &self.buf
    }

    /// Gives the storage back.
    pub fn into_inner(self) -> TxBuf {
        self.buf
    }

    pub(crate) fn storage_mut(&mut self) -> &mut [u8] {
        self.buf.storage_mut()
    }

    /// Payload length of the message.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the message is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes on the wire: payload plus a header per datagram.
    pub fn wire_len(&self) -> usize {
        self.layout.wire_len(self.len)
    }

    /// The payload blocks, each with its offset in the message, for filling in place.
    pub fn payload_mut(&mut self) -> impl Iterator<Item = (usize, &mut [u8])> + '_ {
        let (seg, per) = (self.layout.segment(), self.layout.payload_per_datagram());
        let wire = self.wire_len();
        self.buf.storage_mut()[..wire]
            .chunks_mut(seg)
            .enumerate()
            .map(move |(i, c)| (i * per, &mut c[HEADER_LEN..]))
    }

    /// The payload blocks, each with its offset in the message.
    pub fn payload(&self) -> impl Iterator<Item = (usize, &[u8])> + '_ {
        let (seg, per) = (self.layout.segment(), self.layout.payload_per_datagram());
        // The TxBuf's selected range is the whole wire layout (set when the buffer is made).
        self.buf
            .chunks(seg)
            .enumerate()
            .map(move |(i, c)| (i * per, &c[HEADER_LEN..]))
    }

    /// Copies `data` into the message at `offset`, across the header holes. Panics if it
    /// does not fit in the message, as slice indexing does.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) {
        assert!(
            offset
                .checked_add(data.len())
                .is_some_and(|e| e <= self.len),
            "write of {} bytes at {offset} outside a message of {} bytes",
            data.len(),
            self.len
        );
        let (seg, per) = (self.layout.segment(), self.layout.payload_per_datagram());
        let storage = self.buf.storage_mut();
        let mut done = 0;
        while done < data.len() {
            let off = offset + done;
            let (i, within) = (off / per, off % per);
            let n = (per - within).min(data.len() - done);
            let at = i * seg + HEADER_LEN + within;
            storage[at..at + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
    }

    /// Copies the whole message in; `data` must be exactly [`MsgBuf::len`] bytes (panics
    /// otherwise).
    pub fn copy_from(&mut self, data: &[u8]) {
        assert_eq!(
            data.len(),
            self.len,
            "copy_from needs exactly the message length"
        );
        self.write_at(0, data);
    }

    /// The payload as one vector (a copy; for checks).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        for (_, p) in self.payload() {
            v.extend_from_slice(p);
        }
        v
    }
}

/// A stamped message is lent as its wire bytes, headers included: the kernel reads both.
impl zcnet::Lend for MsgBuf {
    fn bytes(&self) -> &[u8] {
        &self.buf
    }
}
