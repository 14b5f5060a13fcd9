//! How one send call is cut into system calls: the page-aligned middle of a large buffer
//! goes out with `MSG_ZEROCOPY` under write protection; everything else — the unaligned
//! head and tail of such a buffer and every small buffer — is copied, adjacent copied
//! pieces in one call. Pure arithmetic, tested without a socket.

/// A byte range of one of the call's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Index of the buffer.
    pub buf: usize,
    /// Offset in it.
    pub off: usize,
    /// Length.
    pub len: usize,
}

/// One system call of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Copied pieces, sent with one `sendmsg`.
    Copy(Vec<Piece>),
    /// A page-aligned span sent zero-copy under protection.
    Protected(Piece),
}

impl Segment {
    /// Bytes in the segment.
    pub fn len(&self) -> usize {
        match self {
            Segment::Copy(p) => p.iter().map(|p| p.len).sum(),
            Segment::Protected(p) => p.len,
        }
    }

    /// Whether it carries no byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Cuts buffers `(address, length)` into segments: each buffer's whole pages, if they
/// make at least `min_span` bytes, form a protected segment.
pub fn plan(bufs: &[(usize, usize)], page: usize, min_span: usize) -> Vec<Segment> {
    let mut out = Vec::new();
    let mut copy: Vec<Piece> = Vec::new();
    let push_copy = |copy: &mut Vec<Piece>, p: Piece| {
        if p.len > 0 {
            copy.push(p);
        }
    };
    for (i, &(addr, len)) in bufs.iter().enumerate() {
        let head = (addr.next_multiple_of(page) - addr).min(len);
        let mid = (len - head) / page * page;
        if mid >= min_span.max(page) {
            push_copy(
                &mut copy,
                Piece {
                    buf: i,
                    off: 0,
                    len: head,
                },
            );
            if !copy.is_empty() {
                out.push(Segment::Copy(std::mem::take(&mut copy)));
            }
            out.push(Segment::Protected(Piece {
                buf: i,
                off: head,
                len: mid,
            }));
            push_copy(
                &mut copy,
                Piece {
                    buf: i,
                    off: head + mid,
                    len: len - head - mid,
                },
            );
        } else {
            push_copy(
                &mut copy,
                Piece {
                    buf: i,
                    off: 0,
                    len,
                },
            );
        }
    }
    if !copy.is_empty() {
        out.push(Segment::Copy(copy));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: usize = 4096;

    #[test]
    fn an_unaligned_large_buffer_is_head_span_tail() {
        let s = plan(&[(P * 10 + 100, P * 20)], P, P);
        assert_eq!(
            s,
            vec![
                Segment::Copy(vec![Piece {
                    buf: 0,
                    off: 0,
                    len: P - 100
                }]),
                Segment::Protected(Piece {
                    buf: 0,
                    off: P - 100,
                    len: P * 19
                }),
                Segment::Copy(vec![Piece {
                    buf: 0,
                    off: P * 20 - 100,
                    len: 100
                }]),
            ]
        );
    }

    #[test]
    fn small_buffers_merge_into_one_copied_call() {
        let s = plan(&[(P + 1, 10), (8 * P, P * 4), (3, 7)], P, P * 8);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].len(), 10 + P * 4 + 7);
    }

    #[test]
    fn every_byte_is_planned_once_in_order() {
        for &(addr, len, min) in &[
            (0, 0, P),
            (5, P * 3, P),
            (P, P * 2, P * 2),
            (P - 1, P + 2, P),
        ] {
            let bufs = [(addr, len), (addr + 7, len / 2 + 1)];
            let mut next = vec![0usize; bufs.len()];
            for seg in plan(&bufs, P, min) {
                let pieces = match seg {
                    Segment::Copy(p) => p,
                    Segment::Protected(p) => {
                        assert_eq!((bufs[p.buf].0 + p.off) % P, 0);
                        assert_eq!(p.len % P, 0);
                        vec![p]
                    }
                };
                for p in pieces {
                    assert_eq!(p.off, next[p.buf]);
                    next[p.buf] += p.len;
                }
            }
            assert_eq!(next, bufs.iter().map(|b| b.1).collect::<Vec<_>>());
        }
    }
}
