//! The receiver's reassembly table: fragments in, whole messages or losses out, in bounded
//! memory and time. Pure code — no sockets, time passed in — so every order, loss and flood
//! can be tested deterministically.
//!
//! * A message reserves its total length on its first fragment (any fragment: each carries
//!   the total); each payload is copied to its offset; the message is delivered when every
//!   byte is there and never before. Which bytes are there is a set of ranges, so duplicates
//!   are recognised and never overwrite, and overlapping fragments are an inconsistency.
//! * Bounds: at most `max_messages` messages and `max_bytes` reserved bytes; a new message
//!   that would exceed either evicts the least recently active ones first. A message idle
//!   for `timeout` is lost. So a flood of first fragments with distinct ids holds at most
//!   the limits and each flooded message is reported lost ([`LossReason::Evicted`]).
//! * Ids count from 0 per sender session. Per session the table keeps a floor (every id
//!   below it delivered or reported), the ids resolved above it (as ranges), the ids in
//!   progress and a few marks "ids below N must have shown up by T". When a mark passes,
//!   the ids below N that never showed up are reported as one [`LossReason::Gap`] range: a
//!   wholly lost message is reported once a later one arrived and the reorder window passed.
//!   A loss at the very end of a stream has no later id: the sender's mark
//!   ([`super::wire::Mark`], sent by `MsgSender::send_mark` or `ZcUdpSocket::send_mark`) says
//!   how many ids it sent, and opens the same window for every one of them.
//! * Fragments of ids already delivered or reported are stale: counted, dropped.

use super::stats::MsgStats;
use super::wire::{decode_datagram, Datagram, Header, HeaderFault, Mark};
use super::{LossReason, Lost, Message, MsgEvent, ReassemblyLimits};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Instant;

/// Disjoint, non-adjacent, sorted half-open ranges of `u64`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Ranges(Vec<(u64, u64)>);

/// What inserting a range into [`Ranges`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Insert {
    /// None of it was there; it is now.
    New,
    /// All of it was there already; nothing changed.
    Duplicate,
    /// Part of it was there; nothing changed.
    Overlap,
}

impl Ranges {
    pub(crate) fn insert(&mut self, start: u64, end: u64) -> Insert {
        if start >= end {
            return Insert::Duplicate;
        }
        // First range that ends after `start`: the only candidate for an overlap.
        let j = self.0.partition_point(|r| r.1 <= start);
        if let Some(&(s, e)) = self.0.get(j) {
            if s < end {
                return if s <= start && end <= e {
                    Insert::Duplicate
                } else {
                    Insert::Overlap
                };
            }
        }
        let joins_left = j > 0 && self.0[j - 1].1 == start;
        let joins_right = self.0.get(j).is_some_and(|r| r.0 == end);
        match (joins_left, joins_right) {
            (true, true) => {
                self.0[j - 1].1 = self.0[j].1;
                self.0.remove(j);
            }
            (true, false) => self.0[j - 1].1 = end,
            (false, true) => self.0[j].0 = start,
            (false, false) => self.0.insert(j, (start, end)),
        }
        Insert::New
    }

    pub(crate) fn contains(&self, x: u64) -> bool {
        let j = self.0.partition_point(|r| r.1 <= x);
        self.0.get(j).is_some_and(|r| r.0 <= x)
    }

    /// The range containing `x`, if any.
    fn containing(&self, x: u64) -> Option<(u64, u64)> {
        let j = self.0.partition_point(|r| r.1 <= x);
        self.0.get(j).copied().filter(|r| r.0 <= x)
    }

    /// Start of the first range starting after `x`.
    fn next_start_after(&self, x: u64) -> Option<u64> {
        let j = self.0.partition_point(|r| r.0 <= x);
        self.0.get(j).map(|r| r.0)
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn first(&self) -> Option<(u64, u64)> {
        self.0.first().copied()
    }

    fn pop_first(&mut self) {
        self.0.remove(0);
    }

    fn nth_start(&self, i: usize) -> Option<u64> {
        self.0.get(i).map(|r| r.0)
    }
}

/// Resolved-id ranges kept per sender before the oldest gaps are reported early (so a
/// sender that leaves thousands of holes cannot grow the table).
const MAX_RESOLVED_RANGES: usize = 1024;
/// Gap marks kept per sender before neighbours are merged (merging only delays a report).
const MAX_MARKS: usize = 64;

/// One sender's session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct SeqKey {
    peer: SocketAddr,
    session: u32,
}

/// Id bookkeeping of one sender session.
#[derive(Debug)]
struct Seq {
    /// Every id below is delivered or reported lost.
    floor: u64,
    /// Ids at or above `floor` delivered or reported lost.
    resolved: Ranges,
    /// Ids being reassembled.
    pending: BTreeSet<u64>,
    /// One past the highest id seen.
    high: u64,
    /// `(n, t)`: ids below `n` that have not shown up by `t` are lost.
    marks: VecDeque<(u64, Instant)>,
    last_active: Instant,
}

impl Seq {
    fn new(floor: u64, now: Instant) -> Seq {
        Seq {
            floor,
            resolved: Ranges::default(),
            pending: BTreeSet::new(),
            high: floor,
            marks: VecDeque::new(),
            last_active: now,
        }
    }

    fn is_resolved(&self, id: u64) -> bool {
        id < self.floor || self.resolved.contains(id)
    }

    fn resolve(&mut self, first: u64, count: u64) {
        let end = first.saturating_add(count);
        self.resolved.insert(first, end);
        let done: Vec<u64> = self.pending.range(first..end).copied().collect();
        for id in done {
            self.pending.remove(&id);
        }
        while let Some((s, e)) = self.resolved.first() {
            if s > self.floor {
                break;
            }
            self.floor = self.floor.max(e);
            self.resolved.pop_first();
        }
    }
}

/// One message being reassembled.
#[derive(Debug)]
struct Partial {
    buf: Vec<u8>,
    have: Ranges,
    received: usize,
    stamp: (Instant, u64),
}

/// Messages and bytes held by the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InFlight {
    /// Messages being reassembled.
    pub messages: usize,
    /// Bytes reserved for them.
    pub bytes: usize,
}

/// The bounded reassembly table (see the module docs).
#[derive(Debug)]
pub struct Reassembly {
    limits: ReassemblyLimits,
    max_message: usize,
    partials: HashMap<(SeqKey, u64), Partial>,
    /// Partials by last activity: the front is the next to time out or be evicted.
    lru: BTreeMap<(Instant, u64), (SeqKey, u64)>,
    seqs: HashMap<SeqKey, Seq>,
    /// Floors of forgotten sessions, so one heard again does not report its past as lost.
    graveyard: VecDeque<(SeqKey, u64)>,
    /// Earliest gap mark of any session.
    gap_deadline: Option<Instant>,
    bytes: usize,
    events: VecDeque<MsgEvent>,
    free: Vec<Vec<u8>>,
    tick: u64,
}

impl Reassembly {
    /// An empty table for messages of at most `max_message` bytes.
    pub fn new(limits: ReassemblyLimits, max_message: usize) -> Reassembly {
        Reassembly {
            limits,
            max_message,
            partials: HashMap::new(),
            lru: BTreeMap::new(),
            seqs: HashMap::new(),
            graveyard: VecDeque::new(),
            gap_deadline: None,
            bytes: 0,
            events: VecDeque::new(),
            free: Vec::new(),
            tick: 0,
        }
    }

    /// Messages and bytes being reassembled now.
    pub fn in_flight(&self) -> InFlight {
        InFlight {
            messages: self.partials.len(),
            bytes: self.bytes,
        }
    }

    /// Sender sessions tracked now.
    pub fn senders(&self) -> usize {
        self.seqs.len()
    }

    /// The next event, oldest first.
    pub fn pop_event(&mut self) -> Option<MsgEvent> {
        self.events.pop_front()
    }

    /// Events waiting.
    pub fn pending_events(&self) -> usize {
        self.events.len()
    }

    /// When [`Reassembly::expire`] next has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        let t = self
            .lru
            .keys()
            .next()
            .map(|&(last, _)| last + self.limits.timeout);
        match (t, self.gap_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Takes back a delivered message's buffer for a later message (a few are kept), which
    /// spares the page faults of a fresh allocation.
    pub fn recycle(&mut self, mut buf: Vec<u8>) {
        if self.free.len() < 4 && buf.capacity() <= self.max_message.max(64 << 10) {
            buf.clear();
            self.free.push(buf);
        }
    }

    /// One datagram from `peer`, complete.
    pub fn datagram(&mut self, peer: SocketAddr, d: &[u8], now: Instant, stats: &MsgStats) {
        stats.datagrams_received(1);
        match decode_datagram(d) {
            Err(e) => stats.garbage(e),
            Ok(Datagram::Fragment(h, payload)) => self.fragment(peer, h, payload, now, stats),
            Ok(Datagram::Mark(m)) => self.mark(peer, m, now, stats),
        }
    }

    /// A sender's mark: every id below `m.sent` was sent, so each that has not shown up
    /// within the reorder window is reported lost, as if a later id had arrived.
    fn mark(&mut self, peer: SocketAddr, m: Mark, now: Instant, stats: &MsgStats) {
        stats.marks_received(1);
        let sk = self.seq_for(peer, m.session, now, stats);
        self.extend(sk, m.sent, m.sent, now);
    }

    /// The first `prefix.len()` bytes of a datagram that did not fit the receive buffer: if
    /// its header is there and sound, its message is lost ([`LossReason::Truncated`]).
    pub fn truncated(&mut self, peer: SocketAddr, prefix: &[u8], now: Instant, stats: &MsgStats) {
        stats.datagrams_received(1);
        match Header::decode_prefix(prefix) {
            Err(e) => stats.garbage(e),
            Ok(h) => {
                let sk = self.seq_for(peer, h.session, now, stats);
                if self.seqs[&sk].is_resolved(h.id) {
                    stats.fragments_stale(1);
                } else {
                    self.see(sk, h.id, now);
                    self.lose(sk, h.id, LossReason::Truncated, stats);
                }
            }
        }
    }

    /// Reports what timed out by `now`: idle messages, and ids of gaps whose window passed.
    pub fn expire(&mut self, now: Instant, stats: &MsgStats) {
        while let Some((&(last, _), &(sk, id))) = self.lru.iter().next() {
            if last + self.limits.timeout > now {
                break;
            }
            self.lose(sk, id, LossReason::Timeout, stats);
        }
        if self.gap_deadline.is_some_and(|t| t <= now) {
            let keys: Vec<SeqKey> = self.seqs.keys().copied().collect();
            for sk in keys {
                while let Some(&(upto, t)) = self.seqs[&sk].marks.front() {
                    if t > now {
                        break;
                    }
                    self.seqs
                        .get_mut(&sk)
                        .expect("live session")
                        .marks
                        .pop_front();
                    self.report_missing(sk, upto, LossReason::Gap, stats);
                }
            }
            self.gap_deadline = self
                .seqs
                .values()
                .filter_map(|s| s.marks.front().map(|m| m.1))
                .min();
        }
    }

    fn fragment(
        &mut self,
        peer: SocketAddr,
        h: Header,
        payload: &[u8],
        now: Instant,
        stats: &MsgStats,
    ) {
        let sk = self.seq_for(peer, h.session, now, stats);
        if self.seqs[&sk].is_resolved(h.id) {
            stats.fragments_stale(1);
            return;
        }
        self.see(sk, h.id, now);
        if let Err(fault) = h.check(self.max_message) {
            let reason = match fault {
                HeaderFault::BadRange => {
                    stats.garbage_range(1);
                    LossReason::Inconsistent
                }
                HeaderFault::TooLarge => LossReason::TooLarge,
            };
            self.lose(sk, h.id, reason, stats);
            return;
        }
        let key = (sk, h.id);
        let total = h.total as usize;
        let range = h.range();
        if let Some(p) = self.partials.get_mut(&key) {
            if p.buf.len() != total {
                self.lose(sk, h.id, LossReason::Inconsistent, stats);
                return;
            }
            match p.have.insert(range.start as u64, range.end as u64) {
                Insert::Duplicate => {
                    stats.fragments_duplicate(1);
                    return;
                }
                Insert::Overlap => {
                    self.lose(sk, h.id, LossReason::Inconsistent, stats);
                    return;
                }
                Insert::New => {}
            }
            p.buf[range.clone()].copy_from_slice(payload);
            p.received += payload.len();
            let old = p.stamp;
            self.tick += 1;
            p.stamp = (now, self.tick);
            let done = p.received == total;
            self.lru.remove(&old);
            if done {
                self.complete(sk, h.id, stats);
            } else {
                self.lru.insert((now, self.tick), key);
            }
            return;
        }
        if range.len() == total {
            // The whole message in one datagram: no table entry needed.
            let mut data = self.free.pop().unwrap_or_default();
            data.clear();
            data.extend_from_slice(payload);
            self.deliver(sk, h.id, data, stats);
            return;
        }
        if total > self.limits.max_bytes {
            self.lose(sk, h.id, LossReason::TooLarge, stats);
            return;
        }
        self.make_room(total, stats);
        let mut buf = self.free.pop().unwrap_or_default();
        if buf.len() >= total {
            // Bytes of an earlier message stay until overwritten: none is delivered before
            // every byte of this one has arrived.
            buf.truncate(total);
        } else {
            buf.resize(total, 0);
        }
        buf[range.clone()].copy_from_slice(payload);
        let mut have = Ranges::default();
        have.insert(range.start as u64, range.end as u64);
        self.tick += 1;
        self.partials.insert(
            key,
            Partial {
                buf,
                have,
                received: payload.len(),
                stamp: (now, self.tick),
            },
        );
        self.lru.insert((now, self.tick), key);
        self.bytes += total;
        self.seqs
            .get_mut(&sk)
            .expect("live session")
            .pending
            .insert(h.id);
        stats.peak(self.partials.len(), self.bytes);
    }

    /// The session of `peer`/`session`, created (and another forgotten if over the limit).
    fn seq_for(
        &mut self,
        peer: SocketAddr,
        session: u32,
        now: Instant,
        stats: &MsgStats,
    ) -> SeqKey {
        let sk = SeqKey { peer, session };
        if let Some(s) = self.seqs.get_mut(&sk) {
            s.last_active = now;
            return sk;
        }
        let floor = self
            .graveyard
            .iter()
            .position(|(k, _)| *k == sk)
            .and_then(|i| self.graveyard.remove(i))
            .map_or(0, |(_, f)| f);
        while self.seqs.len() >= self.limits.max_senders {
            let Some(old) = self
                .seqs
                .iter()
                .min_by_key(|(_, s)| s.last_active)
                .map(|(k, _)| *k)
            else {
                break;
            };
            self.forget(old, stats);
        }
        self.seqs.insert(sk, Seq::new(floor, now));
        sk
    }

    /// Forgets a session: its open messages and its gaps are reported lost (evicted).
    fn forget(&mut self, sk: SeqKey, stats: &MsgStats) {
        stats.senders_evicted(1);
        let pending: Vec<u64> = self.seqs[&sk].pending.iter().copied().collect();
        for id in pending {
            self.lose(sk, id, LossReason::Evicted, stats);
        }
        let high = self.seqs[&sk].high;
        self.report_missing(sk, high, LossReason::Evicted, stats);
        let floor = self.seqs.remove(&sk).map_or(high, |s| s.floor.max(high));
        if self.graveyard.len() >= self.limits.max_senders {
            self.graveyard.pop_front();
        }
        self.graveyard.push_back((sk, floor));
    }

    /// Notes that `id` showed up; a jump past the highest id so far opens a gap window.
    fn see(&mut self, sk: SeqKey, id: u64, now: Instant) {
        self.extend(sk, id, id + 1, now);
    }

    /// Ids below `upto` must show up within the reorder window; `high` is one past the
    /// highest id known to exist (`upto + 1` for an id seen, `upto` for a mark).
    fn extend(&mut self, sk: SeqKey, upto: u64, high: u64, now: Instant) {
        let timeout = self.limits.timeout;
        let s = self.seqs.get_mut(&sk).expect("live session");
        if high <= s.high {
            return;
        }
        if upto > s.high {
            let deadline = now + timeout;
            match s.marks.back_mut() {
                // Close in time to the last mark: extend it (delays that mark's report by
                // at most timeout/8, never advances it).
                Some(back) if deadline.saturating_duration_since(back.1) < timeout / 8 => {
                    *back = (upto, deadline);
                }
                _ => s.marks.push_back((upto, deadline)),
            }
            if s.marks.len() > MAX_MARKS {
                let (first, second) = (s.marks[0], s.marks[1]);
                s.marks[1] = (second.0.max(first.0), second.1);
                s.marks.pop_front();
            }
            let front = s.marks.front().map(|m| m.1);
            self.gap_deadline = match (self.gap_deadline, front) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        s.high = high;
    }

    /// Reports every id below `upto` of `sk` that is neither resolved nor in progress as
    /// lost, in maximal ranges.
    fn report_missing(&mut self, sk: SeqKey, upto: u64, reason: LossReason, stats: &MsgStats) {
        let Some(s) = self.seqs.get_mut(&sk) else {
            return;
        };
        let mut cur = s.floor;
        let mut runs = Vec::new();
        while cur < upto {
            // Resolving may have moved the floor past ranges it absorbed.
            cur = cur.max(s.floor);
            if cur >= upto {
                break;
            }
            if let Some((_, e)) = s.resolved.containing(cur) {
                cur = e;
                continue;
            }
            if s.pending.contains(&cur) {
                cur += 1;
                continue;
            }
            let next_resolved = s.resolved.next_start_after(cur).unwrap_or(u64::MAX);
            let next_pending = s.pending.range(cur..).next().copied().unwrap_or(u64::MAX);
            let end = upto.min(next_resolved).min(next_pending);
            runs.push((cur, end - cur));
            s.resolve(cur, end - cur);
            cur = end;
        }
        for (id, count) in runs {
            stats.lost(reason, count);
            self.events.push_back(MsgEvent::Lost(Lost {
                from: sk.peer,
                session: sk.session,
                id,
                count,
                reason,
            }));
        }
    }

    /// Resolves `id`, and keeps the resolved ranges bounded.
    fn resolve(&mut self, sk: SeqKey, id: u64, stats: &MsgStats) {
        let s = self.seqs.get_mut(&sk).expect("live session");
        s.resolve(id, 1);
        if s.resolved.len() > MAX_RESOLVED_RANGES {
            let upto = s
                .resolved
                .nth_start(s.resolved.len() - MAX_RESOLVED_RANGES)
                .unwrap_or(s.floor);
            self.report_missing(sk, upto, LossReason::Gap, stats);
        }
    }

    /// Ends message `id` of `sk` as lost (whether or not it is in the table).
    fn lose(&mut self, sk: SeqKey, id: u64, reason: LossReason, stats: &MsgStats) {
        if let Some(p) = self.partials.remove(&(sk, id)) {
            self.lru.remove(&p.stamp);
            self.bytes -= p.buf.len();
            self.recycle(p.buf);
        }
        self.resolve(sk, id, stats);
        stats.lost(reason, 1);
        self.events.push_back(MsgEvent::Lost(Lost {
            from: sk.peer,
            session: sk.session,
            id,
            count: 1,
            reason,
        }));
    }

    fn complete(&mut self, sk: SeqKey, id: u64, stats: &MsgStats) {
        let p = self
            .partials
            .remove(&(sk, id))
            .expect("completed message is in the table");
        self.bytes -= p.buf.len();
        self.deliver(sk, id, p.buf, stats);
    }

    fn deliver(&mut self, sk: SeqKey, id: u64, data: Vec<u8>, stats: &MsgStats) {
        self.resolve(sk, id, stats);
        stats.messages_received(1);
        stats.bytes_received(data.len() as u64);
        self.events.push_back(MsgEvent::Message(Message {
            from: sk.peer,
            session: sk.session,
            id,
            data,
        }));
    }

    /// Evicts the least recently active messages until one of `total` bytes fits.
    fn make_room(&mut self, total: usize, stats: &MsgStats) {
        while self.partials.len() >= self.limits.max_messages
            || self.bytes + total > self.limits.max_bytes
        {
            let Some((_, &(sk, id))) = self.lru.iter().next() else {
                break;
            };
            self.lose(sk, id, LossReason::Evicted, stats);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Layout;
    use proptest::prelude::*;
    use std::time::Duration;

    fn peer() -> SocketAddr {
        "10.0.0.1:5000".parse().unwrap()
    }

    fn limits() -> ReassemblyLimits {
        ReassemblyLimits {
            max_messages: 8,
            max_bytes: 1 << 20,
            timeout: Duration::from_millis(100),
            max_senders: 4,
        }
    }

    /// Message `id`'s bytes: depend on the id, so a swapped message is caught.
    fn body(id: u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u64).wrapping_mul(31).wrapping_add(id * 101) as u8)
            .collect()
    }

    fn datagrams(session: u32, id: u64, data: &[u8], segment: usize) -> Vec<Vec<u8>> {
        let l = Layout::new(segment).unwrap();
        (0..l.fragments(data.len()))
            .map(|i| {
                let r = l.fragment(data.len(), i);
                let h = Header {
                    session,
                    id,
                    total: data.len() as u32,
                    offset: r.start as u32,
                    len: r.len() as u16,
                };
                let mut d = h.encode().to_vec();
                d.extend_from_slice(&data[r]);
                d
            })
            .collect()
    }

    fn drain(t: &mut Reassembly) -> Vec<MsgEvent> {
        std::iter::from_fn(|| t.pop_event()).collect()
    }

    fn delivered(ev: &[MsgEvent]) -> Vec<(u64, Vec<u8>)> {
        ev.iter()
            .filter_map(|e| match e {
                MsgEvent::Message(m) => Some((m.id, m.data.clone())),
                _ => None,
            })
            .collect()
    }

    fn lost(ev: &[MsgEvent]) -> Vec<(u64, u64, LossReason)> {
        ev.iter()
            .filter_map(|e| match e {
                MsgEvent::Lost(l) => Some((l.id, l.count, l.reason)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn ranges_merge_detect_duplicates_and_overlaps() {
        let mut r = Ranges::default();
        assert_eq!(r.insert(10, 20), Insert::New);
        assert_eq!(r.insert(30, 40), Insert::New);
        assert_eq!(r.insert(20, 30), Insert::New);
        assert_eq!(r.0, vec![(10, 40)]);
        assert_eq!(r.insert(15, 25), Insert::Duplicate);
        assert_eq!(r.insert(5, 11), Insert::Overlap);
        assert_eq!(r.insert(39, 41), Insert::Overlap);
        assert_eq!(r.insert(0, 10), Insert::New);
        assert_eq!(r.insert(41, 50), Insert::New);
        assert_eq!(r.0, vec![(0, 40), (41, 50)]);
        assert!(r.contains(0) && r.contains(39) && !r.contains(40) && r.contains(41));
        assert_eq!(r.next_start_after(0), Some(41));
        assert_eq!(r.containing(45), Some((41, 50)));
    }

    #[test]
    fn in_order_reversed_and_duplicated_fragments_make_whole_messages() {
        let s = MsgStats::new();
        let mut t = Reassembly::new(limits(), 1 << 20);
        let now = Instant::now();
        let a = body(0, 10_000);
        let b = body(1, 10_000);
        for d in datagrams(1, 0, &a, 1000) {
            t.datagram(peer(), &d, now, &s);
        }
        let mut rev = datagrams(1, 1, &b, 1000);
        rev.reverse();
        let dup = rev[3].clone();
        for d in rev {
            t.datagram(peer(), &d, now, &s);
        }
        t.datagram(peer(), &dup, now, &s); // stale now: message 1 is complete
        let ev = drain(&mut t);
        assert_eq!(delivered(&ev), vec![(0, a), (1, b)]);
        assert!(lost(&ev).is_empty());
        assert_eq!(t.in_flight(), InFlight::default());
        let snap = s.snapshot();
        assert_eq!(snap.fragments_stale, 1);
        assert_eq!(snap.messages_received, 2);
    }

    #[test]
    fn duplicate_before_completion_is_dropped_not_rewritten() {
        let s = MsgStats::new();
        let mut t = Reassembly::new(limits(), 1 << 20);
        let now = Instant::now();
        let a = body(0, 3000);
        let ds = datagrams(1, 0, &a, 1028);
        t.datagram(peer(), &ds[0], now, &s);
        t.datagram(peer(), &ds[0], now, &s);
        assert_eq!(t.in_flight().messages, 1);
        t.datagram(peer(), &ds[1], now, &s);
        t.datagram(peer(), &ds[2], now, &s);
        assert_eq!(delivered(&drain(&mut t)), vec![(0, a)]);
        assert_eq!(s.snapshot().fragments_duplicate, 1);
    }

    #[test]
    fn missing_fragment_times_out_and_whole_loss_is_a_gap() {
        let s = MsgStats::new();
        let mut t = Reassembly::new(limits(), 1 << 20);
        let t0 = Instant::now();
        // id 0 complete, id 1 missing a fragment, id 2 never sent, id 3 complete.
        for d in datagrams(1, 0, &body(0, 5000), 1000) {
            t.datagram(peer(), &d, t0, &s);
        }
        let ds = datagrams(1, 1, &body(1, 5000), 1000);
        for (i, d) in ds.iter().enumerate() {
            if i != 2 {
                t.datagram(peer(), d, t0, &s);
            }
        }
        for d in datagrams(1, 3, &body(3, 5000), 1000) {
            t.datagram(peer(), &d, t0, &s);
        }
        let ev = drain(&mut t);
        assert_eq!(delivered(&ev).len(), 2);
        assert!(
            lost(&ev).is_empty(),
            "nothing lost before the window passes"
        );
        assert_eq!(t.next_deadline(), Some(t0 + Duration::from_millis(100)));
        t.expire(t0 + Duration::from_millis(99), &s);
        assert!(drain(&mut t).is_empty());
        t.expire(t0 + Duration::from_millis(100), &s);
        let mut l = lost(&drain(&mut t));
        l.sort_by_key(|x| x.0);
        assert_eq!(
            l,
            vec![(1, 1, LossReason::Timeout), (2, 1, LossReason::Gap)]
        );
        // The late fragment of 1 is stale now, not a resurrection.
        t.datagram(peer(), &ds[2], t0 + Duration::from_millis(101), &s);
        assert!(drain(&mut t).is_empty());
        assert_eq!(s.snapshot().fragments_stale, 1);
        assert_eq!(t.next_deadline(), None);
    }

    #[test]
    fn a_mark_reveals_the_lost_tail_that_no_later_id_would() {
        let s = MsgStats::new();
        let mut t = Reassembly::new(limits(), 1 << 20);
        let t0 = Instant::now();
        let win = Duration::from_millis(100);
        // Ids 0..6 sent: 0 and 1 arrive, 2 arrives late (inside the window), 3..6 never.
        for id in 0..2 {
            for d in datagrams(1, id, &body(id, 3000), 1000) {
                t.datagram(peer(), &d, t0, &s);
            }
        }
        assert_eq!(delivered(&drain(&mut t)).len(), 2);
        t.expire(t0 + 10 * win, &s);
        assert!(
            drain(&mut t).is_empty(),
            "without a mark the tail is invisible"
        );
        let mark = Mark {
            session: 1,
            sent: 6,
        }
        .encode();
        let t1 = t0 + 10 * win;
        t.datagram(peer(), &mark, t1, &s);
        t.datagram(peer(), &mark, t1, &s);
        for d in datagrams(1, 2, &body(2, 3000), 1000) {
            t.datagram(peer(), &d, t1 + win / 2, &s);
        }
        assert_eq!(delivered(&drain(&mut t)), vec![(2, body(2, 3000))]);
        t.expire(t1 + win - Duration::from_millis(1), &s);
        assert!(drain(&mut t).is_empty(), "not before the window passed");
        t.expire(t1 + win, &s);
        assert_eq!(lost(&drain(&mut t)), vec![(3, 3, LossReason::Gap)]);
        // A repeated or older mark changes nothing; ids past it are new.
        let old = Mark {
            session: 1,
            sent: 4,
        }
        .encode();
        t.datagram(peer(), &mark, t1 + 2 * win, &s);
        t.datagram(peer(), &old, t1 + 2 * win, &s);
        t.expire(t1 + 4 * win, &s);
        assert!(drain(&mut t).is_empty());
        assert_eq!(s.snapshot().marks_received, 4);
        assert_eq!(s.snapshot().messages_lost, 3);
    }

    #[test]
    fn a_reordered_message_inside_the_window_is_not_a_gap() {
        let s = MsgStats::new();
        let mut t = Reassembly::new(limits(), 1 << 20);
        let t0 = Instant::now();
        for d in datagrams(1, 1, &body(1, 100), 1000) {
            t.datagram(peer(), &d, t0, &s);
        }
        for d in datagrams(1, 0, &body(0, 100), 1000) {
            t.datagram(peer(), &d, t0 + Duration::from_millis(50), &s);
        }
        t.expire(t0 + Duration::from_secs(1), &s);
        let ev = drain(&mut t);
        assert_eq!(delivered(&ev).len(), 2);
        assert!(lost(&ev).is_empty());
    }

    #[test]
    fn flood_of_first_fragments_stays_within_limits_and_is_reported() {
        let s = MsgStats::new();
        let mut lim = limits();
        lim.max_bytes = 200_000;
        let mut t = Reassembly::new(lim, 1 << 20);
        let t0 = Instant::now();
        for id in 0..5000u64 {
            let d = &datagrams(9, id, &body(id, 50_000), 1000)[0];
            t.datagram(peer(), d, t0, &s);
            let f = t.in_flight();
            assert!(f.messages <= 8 && f.bytes <= 200_000, "{f:?}");
        }
        let ev = drain(&mut t);
        let evicted: u64 = lost(&ev)
            .iter()
            .filter(|l| l.2 == LossReason::Evicted)
            .map(|l| l.1)
            .sum();
        assert_eq!(evicted, 5000 - 4, "4 of 50 000 bytes fit in 200 000");
        let snap = s.snapshot();
        assert!(snap.reassembly_peak_bytes <= 200_000);
        // A well-formed message afterwards is still delivered.
        let good = body(5000, 3000);
        for d in datagrams(9, 5000, &good, 1000) {
            t.datagram(peer(), &d, t0, &s);
        }
        assert_eq!(delivered(&drain(&mut t)), vec![(5000, good)]);
    }

    #[test]
    fn inconsistent_and_oversized_messages_are_lost_with_their_id() {
        let s = MsgStats::new();
        let mut t = Reassembly::new(limits(), 100_000);
        let t0 = Instant::now();
        let ds = datagrams(1, 0, &body(0, 5000), 1000);
        t.datagram(peer(), &ds[0], t0, &s);
        // Same id, other total length.
        let other = &datagrams(1, 0, &body(0, 6000), 1000)[1];
        t.datagram(peer(), other, t0, &s);
        // Overlapping range.
        let ds1 = datagrams(1, 1, &body(1, 5000), 1000);
        t.datagram(peer(), &ds1[0], t0, &s);
        let h = Header {
            session: 1,
            id: 1,
            total: 5000,
            offset: 500,
            len: 972,
        };
        let mut ov = h.encode().to_vec();
        ov.extend(vec![0u8; 972]);
        t.datagram(peer(), &ov, t0, &s);
        // Range past the end, and too large.
        let h = Header {
            session: 1,
            id: 2,
            total: 10,
            offset: 5,
            len: 10,
        };
        let mut bad = h.encode().to_vec();
        bad.extend([0u8; 10]);
        t.datagram(peer(), &bad, t0, &s);
        let big = &datagrams(1, 3, &body(3, 200_000), 1000)[0];
        t.datagram(peer(), big, t0, &s);
        let ev = drain(&mut t);
        assert_eq!(
            lost(&ev),
            vec![
                (0, 1, LossReason::Inconsistent),
                (1, 1, LossReason::Inconsistent),
                (2, 1, LossReason::Inconsistent),
                (3, 1, LossReason::TooLarge),
            ]
        );
        assert_eq!(t.in_flight(), InFlight::default());
        assert_eq!(s.snapshot().garbage_range, 1);
    }

    #[test]
    fn truncated_datagram_loses_its_message() {
        let s = MsgStats::new();
        let mut t = Reassembly::new(limits(), 1 << 20);
        let t0 = Instant::now();
        let ds = datagrams(1, 0, &body(0, 5000), 1000);
        t.datagram(peer(), &ds[0], t0, &s);
        t.truncated(peer(), &ds[1][..100], t0, &s);
        t.truncated(peer(), &ds[1][..10], t0, &s);
        assert_eq!(lost(&drain(&mut t)), vec![(0, 1, LossReason::Truncated)]);
        assert_eq!(s.snapshot().garbage_short, 1);
    }

    #[test]
    fn sessions_are_separate_and_bounded() {
        let s = MsgStats::new();
        let mut t = Reassembly::new(limits(), 1 << 20);
        let t0 = Instant::now();
        // Two sessions from one address: both start at id 0.
        for session in [1, 2] {
            for d in datagrams(session, 0, &body(0, 10), 1000) {
                t.datagram(peer(), &d, t0, &s);
            }
        }
        assert_eq!(delivered(&drain(&mut t)).len(), 2);
        // Six more senders with a partial message each: the oldest two are forgotten, their
        // partial messages reported lost.
        for session in 10..16u32 {
            let d = &datagrams(session, 5, &body(5, 3000), 1000)[0];
            let at = t0 + Duration::from_millis(u64::from(session));
            t.datagram(peer(), d, at, &s);
        }
        assert_eq!(t.senders(), 4);
        let l = lost(&drain(&mut t));
        assert_eq!(
            l.iter().filter(|x| x.2 == LossReason::Evicted).count(),
            2 + 2
        );
        assert_eq!(s.snapshot().senders_evicted, 4);
        // Sessions 1 and 2 were forgotten after delivering id 0; heard again, their id 1 is
        // not preceded by a phantom gap.
        for d in datagrams(1, 1, &body(1, 10), 1000) {
            t.datagram(peer(), &d, t0 + Duration::from_millis(20), &s);
        }
        t.expire(t0 + Duration::from_secs(5), &s);
        let ev = drain(&mut t);
        assert_eq!(delivered(&ev).len(), 1);
        assert!(
            !ev.iter()
                .any(|e| matches!(e, MsgEvent::Lost(l) if l.session == 1)),
            "{ev:?}"
        );
        // Sessions that began at id 5 have ids 0..5 reported as one gap each.
        assert!(ev.iter().any(|e| matches!(e, MsgEvent::Lost(l)
            if l.session == 15 && l.id == 0 && l.count == 5 && l.reason == LossReason::Gap)));
    }

    #[test]
    fn a_sender_leaving_many_holes_stays_bounded() {
        let s = MsgStats::new();
        let mut t = Reassembly::new(limits(), 1 << 20);
        let t0 = Instant::now();
        for k in 0..5000u64 {
            for d in datagrams(1, 2 * k + 1, &body(0, 1), 1000) {
                t.datagram(peer(), &d, t0, &s);
            }
        }
        let seq = &t.seqs.values().next().unwrap();
        assert!(seq.resolved.len() <= MAX_RESOLVED_RANGES + 1);
        assert!(seq.marks.len() <= MAX_MARKS);
        t.expire(t0 + Duration::from_secs(1), &s);
        let ev = drain(&mut t);
        assert_eq!(delivered(&ev).len(), 5000);
        let gaps: u64 = lost(&ev).iter().map(|l| l.1).sum();
        assert_eq!(gaps, 5000, "every even id reported once");
        assert_eq!(t.seqs.values().next().unwrap().floor, 10_000);
    }

    proptest! {
        /// Any interleaving of the fragments of several messages, with some datagrams
        /// dropped and some duplicated: every message is either delivered with exactly its
        /// bytes or reported lost exactly once, and the table ends empty.
        #[test]
        fn delivered_whole_or_reported_once(
            sizes in proptest::collection::vec(0usize..6000, 1..8),
            segment in 40usize..2000,
            drops in proptest::collection::vec(any::<bool>(), 0..200),
            order in any::<u64>(),
            dups in proptest::collection::vec(any::<u8>(), 0..20),
        ) {
            let s = MsgStats::new();
            let mut t = Reassembly::new(ReassemblyLimits {
                max_messages: 64, max_bytes: 1 << 20,
                timeout: Duration::from_millis(100), max_senders: 4,
            }, 1 << 20);
            let mut all = Vec::new();
            for (id, &n) in sizes.iter().enumerate() {
                for d in datagrams(3, id as u64, &body(id as u64, n), segment) {
                    all.push(d);
                }
            }
            let mut state = order | 1;
            for i in (1..all.len()).rev() {
                state ^= state << 13; state ^= state >> 7; state ^= state << 17;
                all.swap(i, (state % (i as u64 + 1)) as usize);
            }
            for &k in &dups {
                let d = all[k as usize % all.len()].clone();
                all.push(d);
            }
            let t0 = Instant::now();
            for (i, d) in all.iter().enumerate() {
                if !drops.get(i).copied().unwrap_or(false) {
                    t.datagram(peer(), d, t0, &s);
                }
            }
            t.expire(t0 + Duration::from_secs(1), &s);
            let ev = drain(&mut t);
            let mut seen = vec![0u32; sizes.len()];
            for e in &ev {
                match e {
                    MsgEvent::Message(m) => {
                        prop_assert_eq!(&m.data, &body(m.id, sizes[m.id as usize]));
                        seen[m.id as usize] += 1;
                    }
                    MsgEvent::Lost(l) => for id in l.ids() {
                        prop_assert!((id as usize) < sizes.len(), "phantom id {}", id);
                        seen[id as usize] += 1;
                    },
                }
            }
            // The highest ids may be lost without a trace (no later id reveals them), but
            // only if nothing of theirs arrived; everything else is accounted exactly once.
            let last_seen = ev.iter().map(|e| match e {
                MsgEvent::Message(m) => m.id,
                MsgEvent::Lost(l) => l.id + l.count - 1,
            }).max();
            for (id, &n) in seen.iter().enumerate() {
                if last_seen.is_some_and(|m| id as u64 <= m) {
                    prop_assert_eq!(n, 1, "id {} accounted {} times", id, n);
                } else {
                    prop_assert_eq!(n, 0);
                }
            }
            prop_assert_eq!(t.in_flight(), InFlight::default());
        }
    }
}
