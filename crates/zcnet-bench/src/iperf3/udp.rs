//! iperf3's UDP test on the wire, the pure half (`iperf_udp.c`): how a UDP stream is
//! connected, what each datagram carries, how the receiver counts loss, reordering and
//! jitter, and when a paced sender may send.
//!
//! * **Connecting a stream.** UDP has no accept, so iperf3 makes one: after
//!   `CREATE_STREAMS` the client sends, from a socket connected to the server's port, one
//!   4-byte datagram ([`CONNECT_MSG`], "6789" in the sender's byte order); the server, whose
//!   UDP socket is bound to the same port as its TCP listener, takes the peer's address
//!   from it, `connect`s that socket to the peer, binds a fresh socket to the port for the
//!   next stream, and answers [`CONNECT_REPLY`] ("9876"). With `-R` data may come before
//!   the reply; iperf3's client reads up to two blocks past it.
//! * **Each datagram** of `-l` bytes begins with the send time (seconds, microseconds:
//!   big-endian `u32`s) and the stream's packet number, starting at 1: a big-endian `u32`,
//!   or `u64` with `--udp-counters-64bit` ([`Header`]). The rest is payload.
//! * **The receiver** keeps the highest packet number seen; a jump counts the gap as lost,
//!   a packet numbered at or below it is out of order and takes one back from the lost
//!   count; jitter is RFC 1889's (§6.3.1, A.8) smoothed transit-time difference,
//!   `J += (|D| − J) / 16`, from the sender's stamp and the arrival time — clocks need not
//!   agree, only their rates ([`RecvCounters`]).
//! * **Pacing** (`-b`, bits per second per stream; 0 for unlimited): a sender may send
//!   while its average rate since the start is below the target (`iperf_check_throttle`),
//!   [`may_send`].

/// The client's "connect" datagram: `UDP_CONNECT_MSG`, "6789".
pub const CONNECT_MSG: u32 = 0x3637_3839;
/// The server's answer: `UDP_CONNECT_REPLY`, "9876".
pub const CONNECT_REPLY: u32 = 0x3938_3736;
/// What servers before 3.1 answered (`LEGACY_UDP_CONNECT_REPLY`): accepted too.
pub const LEGACY_CONNECT_REPLY: u32 = 987_654_321;
/// The largest UDP payload over IPv4 (`MAX_UDP_BLOCKSIZE`: 65535 − 8 − 20).
pub const MAX_UDP_BLOCKSIZE: u64 = 65_535 - 8 - 20;
/// The block when neither `-l` nor the control connection's MSS says (`DEFAULT_UDP_BLKSIZE`).
pub const DEFAULT_UDP_BLKSIZE: u64 = 1460;
/// iperf3's default `-b` for UDP: 1 Mbit/s (`UDP_RATE`, 1024 × 1024).
pub const DEFAULT_UDP_RATE: u64 = 1024 * 1024;

/// The bytes of the connect message (or its reply) as iperf3 writes them: an `unsigned int`
/// in the writer's own byte order.
pub fn word_bytes(w: u32) -> [u8; 4] {
    w.to_ne_bytes()
}

/// Whether four bytes are a server's reply, new or legacy.
pub fn is_reply(b: &[u8]) -> bool {
    b.len() >= 4 && {
        let w = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
        w == CONNECT_REPLY || w == LEGACY_CONNECT_REPLY
    }
}

/// What each datagram starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Send time: seconds since the epoch (truncated to 32 bits, as iperf3 does).
    pub sec: u32,
    /// Send time: microseconds.
    pub usec: u32,
    /// The stream's packet number, from 1.
    pub pcount: u64,
}

impl Header {
    /// Header bytes with 32-bit (`wide` false) or 64-bit packet numbers.
    pub fn len(wide: bool) -> usize {
        if wide {
            16
        } else {
            12
        }
    }

    /// Writes the header at the start of `buf` (at least [`Header::len`] bytes).
    pub fn write(&self, buf: &mut [u8], wide: bool) {
        buf[0..4].copy_from_slice(&self.sec.to_be_bytes());
        buf[4..8].copy_from_slice(&self.usec.to_be_bytes());
        if wide {
            buf[8..16].copy_from_slice(&self.pcount.to_be_bytes());
        } else {
            buf[8..12].copy_from_slice(&(self.pcount as u32).to_be_bytes());
        }
    }

    /// Reads a header; `None` for a datagram too short to hold one.
    pub fn read(buf: &[u8], wide: bool) -> Option<Header> {
        if buf.len() < Header::len(wide) {
            return None;
        }
        let u = |i: usize| u32::from_be_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
        let pcount = if wide {
            u64::from_be_bytes(buf[8..16].try_into().ok()?)
        } else {
            u64::from(u(8))
        };
        Some(Header {
            sec: u(0),
            usec: u(4),
            pcount,
        })
    }

    /// The send time in seconds.
    pub fn sent_at(&self) -> f64 {
        f64::from(self.sec) + f64::from(self.usec) * 1e-6
    }
}

/// A receiving stream's counters, as iperf3's `iperf_udp_recv` keeps them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RecvCounters {
    /// Bytes received.
    pub bytes: u64,
    /// Datagrams received.
    pub datagrams: u64,
    /// The highest packet number seen (iperf3's receiver-side `packet_count`, which it
    /// reports as the stream's packets).
    pub highest: u64,
    /// Lost: gaps in the numbering, less late arrivals (`cnt_error`).
    pub lost: u64,
    /// Datagrams numbered at or below the highest seen.
    pub out_of_order: u64,
    /// Smoothed jitter, seconds.
    pub jitter: f64,
    prev_transit: Option<f64>,
}

impl RecvCounters {
    /// Counts one datagram of `len` bytes with header `h`, arrived at `arrival` (seconds
    /// since the epoch, the clock the sender stamps with).
    pub fn on_datagram(&mut self, h: &Header, len: usize, arrival: f64) {
        self.bytes += len as u64;
        self.datagrams += 1;
        if h.pcount > self.highest {
            self.lost += h.pcount - 1 - self.highest;
            self.highest = h.pcount;
        } else {
            self.out_of_order += 1;
            self.lost = self.lost.saturating_sub(1);
        }
        let transit = arrival - h.sent_at();
        let prev = self.prev_transit.unwrap_or(transit);
        self.jitter += ((transit - prev).abs() - self.jitter) / 16.0;
        self.prev_transit = Some(transit);
    }
}

/// `lost_percent` as iperf3 computes it: lost over packets, 0 with no packets.
pub fn lost_percent(lost: u64, packets: u64) -> f64 {
    if packets > 0 {
        100.0 * lost as f64 / packets as f64
    } else {
        0.0
    }
}

/// Whether a stream paced at `rate` bits per second (0: unlimited) that has sent `sent`
/// bytes over `elapsed` seconds may send now: its average so far is below the target.
pub fn may_send(rate: u64, sent: u64, elapsed: f64) -> bool {
    rate == 0 || elapsed <= 0.0 || (sent as f64 * 8.0 / elapsed) < rate as f64
}

/// How many more `len`-byte datagrams a paced stream may send at once to stay at `rate`
/// (at least 1 when [`may_send`] says yes; `max` when unlimited).
pub fn datagrams_due(rate: u64, sent: u64, elapsed: f64, len: u64, max: u64) -> u64 {
    if rate == 0 {
        return max;
    }
    if !may_send(rate, sent, elapsed) {
        return 0;
    }
    let allowed = (rate as f64 * elapsed / 8.0) as u64;
    (allowed.saturating_sub(sent) / len.max(1)).clamp(1, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_iperf3s_bytes() {
        let h = Header {
            sec: 0x0102_0304,
            usec: 999_999,
            pcount: 7,
        };
        let mut b = [0u8; 16];
        h.write(&mut b, false);
        assert_eq!(&b[..12], &[1, 2, 3, 4, 0, 0x0f, 0x42, 0x3f, 0, 0, 0, 7]);
        assert_eq!(Header::read(&b, false), Some(h));
        h.write(&mut b, true);
        assert_eq!(&b[8..16], &[0, 0, 0, 0, 0, 0, 0, 7]);
        assert_eq!(Header::read(&b, true), Some(h));
        assert_eq!(Header::read(&b[..11], false), None);
        assert_eq!(Header::read(&b[..15], true), None);
        // 32-bit numbers wrap as iperf3's do.
        let big = Header {
            pcount: (1 << 32) + 5,
            ..h
        };
        big.write(&mut b, false);
        assert_eq!(Header::read(&b, false).unwrap().pcount, 5);
    }

    #[test]
    fn the_connect_words_are_the_ascii_iperf3_uses() {
        assert_eq!(&CONNECT_MSG.to_be_bytes(), b"6789");
        assert_eq!(&CONNECT_REPLY.to_be_bytes(), b"9876");
        assert!(is_reply(&word_bytes(CONNECT_REPLY)));
        assert!(is_reply(&word_bytes(LEGACY_CONNECT_REPLY)));
        assert!(!is_reply(&word_bytes(CONNECT_MSG)));
        assert!(!is_reply(&[0x39, 0x38]));
    }

    fn at(pcount: u64, sent: f64) -> Header {
        Header {
            sec: sent as u32,
            usec: ((sent.fract()) * 1e6).round() as u32,
            pcount,
        }
    }

    #[test]
    fn gaps_count_as_lost_and_late_arrivals_take_them_back() {
        let mut c = RecvCounters::default();
        for p in [1, 2, 5, 3, 6] {
            c.on_datagram(&at(p, 100.0), 100, 100.001);
        }
        // 3 and 4 missing at 5; 3 arrives late (out of order, one loss fewer).
        assert_eq!(c.highest, 6);
        assert_eq!(c.lost, 1);
        assert_eq!(c.out_of_order, 1);
        assert_eq!(c.datagrams, 5);
        assert_eq!(c.bytes, 500);
        assert_eq!(lost_percent(c.lost, c.highest), 100.0 / 6.0);
        assert_eq!(lost_percent(0, 0), 0.0);
    }

    #[test]
    fn jitter_follows_rfc_1889() {
        let mut c = RecvCounters::default();
        // Sent every 10 ms; transit 1 ms, then 3 ms, then 1 ms.
        c.on_datagram(&at(1, 10.00), 100, 10.001);
        assert_eq!(c.jitter, 0.0, "the first datagram sets the reference");
        c.on_datagram(&at(2, 10.01), 100, 10.013);
        let j1 = 0.002 / 16.0;
        assert!((c.jitter - j1).abs() < 1e-9, "{}", c.jitter);
        c.on_datagram(&at(3, 10.02), 100, 10.021);
        let j2 = j1 + (0.002 - j1) / 16.0;
        assert!((c.jitter - j2).abs() < 1e-9, "{}", c.jitter);
    }

    #[test]
    fn pacing_holds_the_average_to_the_target() {
        // 1 Mbit/s = 125000 B/s: after 0.1 s, 12500 bytes are allowed.
        assert!(may_send(1_000_000, 0, 0.1));
        assert!(may_send(1_000_000, 12_000, 0.1));
        assert!(!may_send(1_000_000, 12_500, 0.1));
        assert_eq!(datagrams_due(1_000_000, 10_000, 0.1, 1000, 64), 2);
        assert_eq!(datagrams_due(1_000_000, 12_500, 0.1, 1000, 64), 0);
        // Behind by less than a datagram: one is still due.
        assert_eq!(datagrams_due(1_000_000, 12_400, 0.1, 1000, 64), 1);
        assert_eq!(datagrams_due(0, u64::MAX, 1.0, 1000, 64), 64);
        assert!(may_send(5, 1 << 40, 0.0));
    }
}
