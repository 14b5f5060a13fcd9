//! How one send call is cut into system calls: the page-aligned middle of a large buffer
//! goes out with `MSG_ZEROCOPY` under write protection; everything else — the unaligned
//! head and tail of such a buffer and every small buffer — is copied, adjacent copied
//! pieces in one call. And how a `sendmmsg` is cut into UDP GSO sends and forwarded parts
//! ([`gso_runs`]). Pure arithmetic, tested without a socket.

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

/// One message of a `sendmmsg`, as [`gso_runs`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Msg<'a> {
    /// Payload bytes.
    pub len: usize,
    /// Its iovec entries.
    pub iovs: usize,
    /// Destination (raw `sockaddr`), if named.
    pub name: Option<&'a [u8]>,
    /// Carries control messages.
    pub control: bool,
}

/// Messages sent by one system call: a GSO send of `seg`-byte datagrams, or (`None`) the
/// C library's `sendmmsg` of them as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// The messages.
    pub range: std::ops::Range<usize>,
    /// The GSO segment size.
    pub seg: Option<u16>,
}

/// Fewest datagrams worth one GSO send.
pub const GSO_MIN_RUN: usize = 4;
/// Most segments in one GSO send: `UDP_MAX_SEGMENTS` of kernels before 6.x (128 since).
pub const GSO_MAX_SEGMENTS: usize = 64;
/// Most payload in one GSO send: one IPv6 datagram's (the IPv4 limit is 20 bytes more).
pub const GSO_MAX_BYTES: usize = zcnet_sys::raw::udp_msg::MAX_UDP_PAYLOAD_V6;

/// Cuts `sendmmsg`'s messages into runs: at least [`GSO_MIN_RUN`] consecutive messages to
/// one destination, without control messages, each `seg` bytes long except the run's last
/// (at most `seg`), within the kernel's limits, become one GSO send — whose segmentation
/// gives back exactly those datagrams; the messages between such runs are forwarded
/// together.
pub fn gso_runs(msgs: &[Msg<'_>]) -> Vec<Run> {
    let mut out = Vec::new();
    let mut plain: Option<usize> = None;
    let mut i = 0;
    while i < msgs.len() {
        let first = msgs[i];
        let seg = first.len;
        let (mut j, mut bytes, mut iovs) = (i + 1, seg, first.iovs);
        let eligible = !first.control && seg > 0 && seg <= GSO_MAX_BYTES;
        if eligible {
            while j < msgs.len() && j - i < GSO_MAX_SEGMENTS {
                let m = msgs[j];
                if m.control
                    || m.name != first.name
                    || m.len == 0
                    || m.len > seg
                    || bytes + m.len > GSO_MAX_BYTES
                    || iovs + m.iovs > libc::UIO_MAXIOV as usize
                {
                    break;
                }
                bytes += m.len;
                iovs += m.iovs;
                j += 1;
                if m.len < seg {
                    break;
                }
            }
        }
        if eligible && j - i >= GSO_MIN_RUN {
            if let Some(p) = plain.take() {
                out.push(Run {
                    range: p..i,
                    seg: None,
                });
            }
            out.push(Run {
                range: i..j,
                seg: Some(seg as u16),
            });
            i = j;
        } else {
            plain.get_or_insert(i);
            i += 1;
        }
    }
    if let Some(p) = plain {
        out.push(Run {
            range: p..msgs.len(),
            seg: None,
        });
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

    fn m(len: usize, name: Option<&[u8]>) -> Msg<'_> {
        Msg {
            len,
            iovs: 1,
            name,
            control: false,
        }
    }

    #[test]
    fn equal_datagrams_to_one_peer_make_gso_runs_with_a_short_last() {
        let a: &[u8] = &[1, 2];
        let b: &[u8] = &[3, 4];
        let mut v: Vec<Msg<'_>> = (0..6).map(|_| m(1200, Some(a))).collect();
        v.push(m(100, Some(a))); // the short last of the run
        v.push(m(1200, Some(b))); // another peer: too short a run
        v.extend((0..4).map(|_| m(1200, Some(b))));
        let r = gso_runs(&v);
        assert_eq!(
            r,
            vec![
                Run {
                    range: 0..7,
                    seg: Some(1200)
                },
                Run {
                    range: 7..12,
                    seg: Some(1200)
                },
            ]
        );
    }

    #[test]
    fn larger_datagrams_control_messages_and_short_runs_are_forwarded_as_they_are() {
        let mut v = vec![m(500, None), m(500, None), m(900, None), m(500, None)];
        v.push(Msg {
            control: true,
            ..m(500, None)
        });
        v.extend((0..3).map(|_| m(500, None)));
        assert_eq!(
            gso_runs(&v),
            vec![Run {
                range: 0..8,
                seg: None
            }]
        );
    }

    #[test]
    fn runs_respect_the_kernels_segment_and_byte_limits_and_cover_every_message_once() {
        let v: Vec<Msg<'_>> = (0..300).map(|_| m(1000, None)).collect();
        let r = gso_runs(&v);
        let mut next = 0;
        for run in &r {
            assert_eq!(run.range.start, next);
            next = run.range.end;
            if run.seg.is_some() {
                assert!(run.range.len() <= GSO_MAX_SEGMENTS);
                assert!(run.range.len() * 1000 <= GSO_MAX_BYTES);
                assert!(run.range.len() >= GSO_MIN_RUN);
            }
        }
        assert_eq!(next, 300);
        assert_eq!(r[0].range, 0..GSO_MAX_SEGMENTS);
    }
}
