//! The data-touching workload of the Solaris paper (§6.5, table 3): "tcp is modified to
//! write into every word of the write buffer before transmit, and to read from every word of
//! the data after it is received". Touching changes what zero-copy saves: the sender's
//! writes warm the cache a copying `send` then reads from, and a receiver that reads mapped
//! pages pays the cache misses the kernel's copy would otherwise have taken.

/// Writes every 8-byte word of `buf` (a trailing partial word byte by byte) with a value
/// derived from `seed`, so the compiler cannot elide the stores and every cache line is
/// dirtied as an application filling its buffer would.
pub fn write_words(buf: &mut [u8], seed: u64) {
    let mut chunks = buf.chunks_exact_mut(8);
    let mut x = seed;
    for w in &mut chunks {
        w.copy_from_slice(&x.to_ne_bytes());
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    }
    for b in chunks.into_remainder() {
        *b = x as u8;
    }
}

/// Reads every 8-byte word of `buf` (a trailing partial word byte by byte) and folds them
/// into a checksum the caller keeps (pass it to `std::hint::black_box`), so every cache line
/// of the received data is really loaded.
pub fn read_words(buf: &[u8]) -> u64 {
    let mut chunks = buf.chunks_exact(8);
    let mut acc = 0u64;
    for w in &mut chunks {
        let mut a = [0u8; 8];
        a.copy_from_slice(w);
        acc = acc.rotate_left(1) ^ u64::from_ne_bytes(a);
    }
    for &b in chunks.remainder() {
        acc = acc.rotate_left(1) ^ u64::from(b);
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_is_written_and_read() {
        for len in [0usize, 1, 7, 8, 9, 4096, 4099] {
            let mut buf = vec![0u8; len];
            write_words(&mut buf, 1);
            let nonzero_words = buf.chunks(8).filter(|w| w.iter().any(|&b| b != 0)).count();
            assert_eq!(nonzero_words, buf.chunks(8).count(), "len {len}");
            // Reading sees a change anywhere, the last byte included.
            if len > 0 {
                let before = read_words(&buf);
                buf[len - 1] ^= 0x80;
                assert_ne!(read_words(&buf), before, "len {len}");
            }
        }
        let (mut a, mut b) = (vec![0u8; 64], vec![0u8; 64]);
        write_words(&mut a, 1);
        write_words(&mut b, 2);
        assert_ne!(a, b, "the seed changes the contents");
    }
}
