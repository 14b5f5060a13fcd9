//! Where the copying receive paths put what they read: at a page offset that follows the
//! stream, a fixed distance ([`SKEW`]) ahead of where the kernel holds the same bytes.
//!
//! Why: `recv`'s copy (`_copy_to_iter`, `rep movsb` here) runs at very different speeds
//! depending on where the destination sits relative to the source *within a page*. Over
//! veth, from a sender that copies into the socket's page fragments, the source page offset
//! of a stream byte follows the stream offset; a buffer that starts `d` bytes past a page
//! boundary and is refilled from its start by every `recv` then keeps the same relative
//! offset for the whole connection whenever the reads come back whole. With `d` in 8–24
//! every copy ran about twice as slow (the receiving thread 0.54–0.64 CPU-s/GiB against
//! 0.22–0.25 at 256 KiB, the pair 1.14–1.24 against 0.60–0.68; the 4K-aliasing band, where
//! the copy's loads wait on stores to addresses equal in their low 12 bits). And `d = 16`
//! is exactly where glibc puts a large `Vec` (a chunk of its own `mmap`, 16 bytes of header
//! past the page): the first copy receiver of every process landed there, later ones
//! wherever the heap left them — the two modes `copy → copy` showed between namespaces,
//! which no choice of path could explain (`git show 758b630:docs/measurements/auto.md`, "the receive
//! buffer's page offset").
//!
//! So each read is placed at `(stream offset + SKEW) mod page` of a page-aligned span: the
//! relative offset is the same for every read, whatever sizes the reads come back in, and
//! chosen outside the band. From a sender whose bytes do not follow the stream in memory (a
//! NIC's receive buffers, each packet in its own), the relative offset varies packet by
//! packet whatever the buffer does; placing costs nothing there.

use zcnet_sys::mem::page_size;

/// How far ahead of the stream offset, within a page, a read is placed. Over veth at 256 KiB
/// every distance measured from 32 to 2048 cost the same (0.60–0.68 CPU-s/GiB both ends,
/// medians of 9), 8 and 16 twice as much; at 16 KiB 1024 was among the cheapest. A quarter
/// page also keeps the band away when the kernel's bytes sit up to a few hundred bytes off
/// the stream offset (headers, a header read first).
pub(crate) const SKEW: usize = 1024;

/// A receive buffer of `len` usable bytes whose reads are placed by the stream offset.
#[derive(Debug)]
pub(crate) struct PlacedBuf {
    /// The usable length plus two pages: up to a page to the first boundary, up to a page
    /// of placement, and still the usable length.
    mem: Vec<u8>,
    /// Stream bytes consumed from the socket so far (by this buffer's reads or, told by
    /// [`PlacedBuf::advance`], by anyone else's).
    stream: u64,
}

impl PlacedBuf {
    /// A buffer for reads of up to `len` bytes (at least 1).
    pub(crate) fn new(len: usize) -> Self {
        PlacedBuf {
            mem: vec![0u8; len.max(1) + 2 * page_size()],
            stream: 0,
        }
    }

    /// Usable bytes per read.
    fn len(&self) -> usize {
        self.mem.len() - 2 * page_size()
    }

    /// Index in the buffer where the next read goes: its first page boundary, then the
    /// stream offset plus [`SKEW`] within a page.
    fn start(&self) -> usize {
        let page = page_size();
        let aligned = (page - (self.mem.as_ptr() as usize) % page) % page;
        aligned + ((self.stream + SKEW as u64) % page as u64) as usize
    }

    /// Reads with `read` into up to `max` bytes placed for the stream, counts what it read
    /// as consumed, and returns where the bytes are (for [`PlacedBuf::bytes`]).
    pub(crate) fn read<E>(
        &mut self,
        max: usize,
        read: impl FnOnce(&mut [u8]) -> Result<usize, E>,
    ) -> Result<std::ops::Range<usize>, E> {
        let (start, len) = (self.start(), self.len());
        let n = read(&mut self.mem[start..start + max.min(len)])?;
        self.advance(n as u64);
        Ok(start..start + n)
    }

    /// The bytes a [`PlacedBuf::read`] returned the range of (valid until the next read).
    pub(crate) fn bytes(&self, range: std::ops::Range<usize>) -> &[u8] {
        &self.mem[range]
    }

    /// Counts `n` stream bytes consumed elsewhere (mapped, read into a caller's buffer, by
    /// another receive path), so the next read is still placed by the stream offset.
    pub(crate) fn advance(&mut self, n: u64) {
        self.stream = self.stream.wrapping_add(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn page_offset(b: &PlacedBuf, at: usize) -> usize {
        (b.mem.as_ptr() as usize + at) % page_size()
    }

    #[test]
    fn each_read_lands_skew_ahead_of_the_stream_offset_within_a_page() {
        let page = page_size();
        let mut b = PlacedBuf::new(64 << 10);
        let mut stream = 0usize;
        // Reads of uneven sizes, and bytes consumed elsewhere in between.
        for (k, n) in [1usize, 1448, 4096, 65536, 7, 3000, 65536, 12345]
            .into_iter()
            .enumerate()
        {
            let r = b
                .read(usize::MAX, |space| {
                    assert_eq!(space.len(), 64 << 10, "a full read's room wherever placed");
                    Ok::<_, ()>(n.min(space.len()))
                })
                .unwrap();
            assert_eq!(page_offset(&b, r.start), (stream + SKEW) % page, "read {k}");
            stream += r.len();
            if k % 3 == 0 {
                b.advance(100);
                stream += 100;
            }
        }
    }

    #[test]
    fn a_read_never_exceeds_max_or_len() {
        let mut b = PlacedBuf::new(1000);
        let r = b.read(10, |s| Ok::<_, ()>(s.len())).unwrap();
        assert_eq!(r.len(), 10);
        let r = b.read(usize::MAX, |s| Ok::<_, ()>(s.len())).unwrap();
        assert_eq!(r.len(), 1000);
        // An error reads nothing and consumes nothing.
        let before = b.start();
        assert_eq!(b.read(10, |_| Err::<usize, _>("no")), Err("no"));
        assert_eq!(b.start(), before);
    }

    #[test]
    fn placed_reads_of_a_real_socket_return_every_byte_in_order() {
        let (mut tx, rx) = std::os::unix::net::UnixStream::pair().unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let sent = data.clone();
        let w = std::thread::spawn(move || {
            for c in sent.chunks(3331) {
                tx.write_all(c).unwrap();
            }
        });
        let mut b = PlacedBuf::new(8192);
        let mut got = Vec::new();
        let mut rx = rx;
        while got.len() < data.len() {
            let r = b
                .read(usize::MAX, |s| std::io::Read::read(&mut rx, s))
                .unwrap();
            assert!(!r.is_empty(), "EOF before every byte came");
            got.extend_from_slice(b.bytes(r));
        }
        w.join().unwrap();
        assert_eq!(got, data);
    }
}
