//! Control messages as `recvmsg` leaves them, walked on bytes — the `CMSG_FIRSTHDR` /
//! `CMSG_NXTHDR` walk without `unsafe` — so every decoder above (error-queue completions,
//! UDP GRO segment sizes) shares one bounds-checked loop.

/// One control message: `(cmsg_level, cmsg_type, data)`.
pub type Message<'a> = (i32, i32, &'a [u8]);

/// The messages in `control`, in order. A truncated or malformed header ends the walk.
pub fn messages(control: &[u8]) -> impl Iterator<Item = Message<'_>> {
    let word = std::mem::size_of::<usize>();
    let hdr = std::mem::size_of::<libc::cmsghdr>();
    let align = move |n: usize| n.div_ceil(word) * word;
    let mut off = 0usize;
    std::iter::from_fn(move || {
        let head = control.get(off..off.checked_add(hdr)?)?;
        let len = usize::from_ne_bytes(head[..word].try_into().expect("a word"));
        let int_at = |o: usize| i32::from_ne_bytes(head[o..o + 4].try_into().expect("4 bytes"));
        let (level, kind) = (int_at(word), int_at(word + 4));
        if len < hdr || off.checked_add(len)? > control.len() {
            return None;
        }
        let data = control.get(off + align(hdr).min(len)..off + len)?;
        off += align(len);
        Some((level, kind, data))
    })
}

/// Encodes one control message as the kernel lays it out (for tests of the decoders).
#[cfg(test)]
pub fn encode(level: i32, kind: i32, data: &[u8]) -> Vec<u8> {
    let word = std::mem::size_of::<usize>();
    let len = std::mem::size_of::<libc::cmsghdr>() + data.len();
    let mut v = Vec::new();
    v.extend_from_slice(&len.to_ne_bytes()[..word]);
    v.extend_from_slice(&level.to_ne_bytes());
    v.extend_from_slice(&kind.to_ne_bytes());
    v.extend_from_slice(data);
    while v.len() % word != 0 {
        v.push(0);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_messages_in_order_and_stops_at_garbage() {
        let mut b = encode(1, 2, &[9; 5]);
        b.extend(encode(3, 4, &[]));
        let got: Vec<_> = messages(&b).collect();
        assert_eq!(got, vec![(1, 2, &[9u8; 5][..]), (3, 4, &[][..])]);
        let mut bad = encode(1, 2, &[0; 8]);
        bad[0] = 200; // length past the buffer
        assert_eq!(messages(&bad).count(), 0);
        assert_eq!(messages(&[1, 2, 3]).count(), 0);
    }
}
