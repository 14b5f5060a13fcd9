//! The `TCP_ZEROCOPY_RECEIVE` receive path.
//!
//! One call maps as many whole pages as the kernel can at the end of the socket mapping's
//! used prefix, copies a small tail into the copybuf, and reports in `recv_skip_hint` how
//! many bytes after those cannot be mapped. The stream order is therefore: mapped bytes,
//! copybuf bytes, skip-hint bytes (read with `recv`, never discarded), and then the next
//! call. When the mapping window is used up, all of it is released with one
//! `madvise(MADV_DONTNEED)` — the batched release — and mapping starts over at its start.
//!
//! The kernel never blocks in this call, so an empty queue is waited for with `poll`. End of
//! stream is the `EIO` the kernel returns when a call makes no progress after the peer's FIN
//! (we always pass a length of at least one page, so that is the only way to get it); a
//! reset arrives as `zc.err`. See docs/measurements/kernel-findings.md §2.

use super::place::PlacedBuf;
use super::{copy::recv_some, Receive, RxChunk};
use crate::auto::{AutoStats, Demotion, Report};
use crate::error::{Error, Result};
use crate::path::FallbackReason;
use crate::path::RxPath;
use crate::stats::Stats;
use std::os::fd::BorrowedFd;
use std::time::Duration;
use zcnet_sys::raw::socket;
use zcnet_sys::raw::zcrecv::SocketMap;

/// Below this much free window, release the window before the next call: a call into a tiny
/// window maps little and costs as much.
const MIN_WINDOW: usize = 64 * 1024;
/// Under a page, so the kernel's "whole queue fits the copybuf" shortcut (which copies
/// instead of mapping) only triggers for a tail smaller than one page.
const COPYBUF: usize = 4095;
/// How long one `poll` waits before asking the kernel again (bounds the stall that a large
/// `SO_RCVLOWAT` could cause when the sender pauses below it).
const POLL_SLICE: Duration = Duration::from_millis(20);

/// Where the bytes of one step of the stream are.
#[derive(Debug, Clone, Copy)]
enum Loc {
    Mapped { off: usize, len: usize },
    Copybuf { start: usize, end: usize },
    Scratch { start: usize, end: usize },
}

impl Loc {
    fn scratch(r: std::ops::Range<usize>) -> Loc {
        Loc::Scratch {
            start: r.start,
            end: r.end,
        }
    }

    fn len(self) -> usize {
        match self {
            Loc::Mapped { len, .. } => len,
            Loc::Copybuf { start, end } | Loc::Scratch { start, end } => end - start,
        }
    }

    /// The same place without its first `n` bytes (`n` < `len()`).
    fn advance(self, n: usize) -> Loc {
        match self {
            Loc::Mapped { off, len } => Loc::Mapped {
                off: off + n,
                len: len - n,
            },
            Loc::Copybuf { start, end } => Loc::Copybuf {
                start: start + n,
                end,
            },
            Loc::Scratch { start, end } => Loc::Scratch {
                start: start + n,
                end,
            },
        }
    }
}

/// State of the mapping receive path on one socket.
#[derive(Debug)]
pub(crate) struct MmapRx {
    map: SocketMap,
    copybuf: Vec<u8>,
    copybuf_pending: (usize, usize),
    /// Where plain `recv`s land (unmappable bytes, forced or demoted copy), placed by the
    /// stream offset ([`super::place`]).
    scratch: PlacedBuf,
    skip: usize,
    leftover: Option<Loc>,
    eof: bool,
    timeout: Duration,
    /// On the `auto` path: demotion to plain `recv` while mapping keeps failing.
    auto: Option<AutoDemotion>,
    /// Set by `auto`'s cost check ([`MmapRx::set_copy`]): read with plain `recv`.
    forced_copy: bool,
}

/// The `auto` receive path's online demotion of `mmap` (see `crate::auto::demotion`):
/// receive steps that found data but mapped none of it are bad reports; after
/// `crate::auto::demotion::DEMOTE_AFTER` of them in a row the path reads with plain `recv` and
/// retries after a back-off counted in receive steps.
#[derive(Debug)]
pub(crate) struct AutoDemotion {
    demotion: Demotion<RxPath>,
    steps: u64,
    /// Whether mapping nothing demotes: for a path a profile chose, always (the kernel's
    /// evidence overrides the profile); not for a trial's pick, which is judged by its cost.
    expected: bool,
}

impl AutoDemotion {
    pub(crate) fn new(expected: bool) -> Self {
        use crate::auto::demotion::{DEMOTE_AFTER, MAX_RETRY_AFTER_OPS, RETRY_AFTER_OPS};
        AutoDemotion {
            demotion: Demotion::new(DEMOTE_AFTER, RETRY_AFTER_OPS, MAX_RETRY_AFTER_OPS),
            steps: 0,
            expected,
        }
    }
}

impl MmapRx {
    pub(crate) fn new(map: SocketMap, scratch_bytes: usize, timeout: Duration) -> Self {
        MmapRx {
            map,
            copybuf: vec![0; COPYBUF],
            copybuf_pending: (0, 0),
            scratch: PlacedBuf::new(scratch_bytes.max(4096)),
            skip: 0,
            leftover: None,
            eof: false,
            timeout,
            auto: None,
            forced_copy: false,
        }
    }

    /// Puts this receiver under the `auto` path's online demotion.
    pub(crate) fn with_auto(mut self, auto: AutoDemotion) -> Self {
        self.auto = Some(auto);
        self
    }

    /// `auto`'s run-time check: while set, each step reads with plain `recv` (the copy path
    /// measured on this connection, or the fallback from a costlier mapping).
    pub(crate) fn set_copy(&mut self, copy: bool) {
        self.forced_copy = copy;
    }

    /// Whether bytes already taken off the socket wait here to be handed out (the rest of a
    /// chunk `recv_into` cut short, the copybuf tail): another reader of the socket must
    /// wait until they are.
    pub(crate) fn holds(&self) -> bool {
        self.leftover.is_some() || self.copybuf_pending.0 < self.copybuf_pending.1
    }

    /// Whether this step may try to map (always, unless `auto` demoted the path).
    fn admit(&mut self, stats: &Stats) -> bool {
        let Some(a) = self.auto.as_mut() else {
            return true;
        };
        let mut delta = AutoStats::default();
        a.steps += 1;
        let admit = a
            .demotion
            .admit(RxPath::Mmap, RxPath::Copy, a.steps, &mut delta);
        stats.add_auto_rx(&delta);
        admit.path == RxPath::Mmap
    }

    /// What a mapping step showed, for the `auto` demotion.
    fn report(&mut self, mapped: usize, found: bool, stats: &Stats) {
        let Some(a) = self.auto.as_mut() else {
            return;
        };
        let report = if mapped > 0 {
            Report::Good
        } else if found && a.expected {
            Report::Bad
        } else {
            return;
        };
        let mut delta = AutoStats::default();
        a.demotion.report(RxPath::Mmap, report, a.steps, &mut delta);
        if delta != AutoStats::default() {
            stats.add_auto_rx(&delta);
        }
    }

    fn bytes(&self, loc: Loc) -> &[u8] {
        match loc {
            Loc::Mapped { off, len } => self.map.slice(off, len),
            Loc::Copybuf { start, end } => &self.copybuf[start..end],
            Loc::Scratch { start, end } => self.scratch.bytes(start..end),
        }
    }

    /// One plain `recv` of up to `max` bytes into the scratch, placed by the stream offset;
    /// returns where the bytes are (empty at end of stream).
    fn read_scratch(
        &mut self,
        fd: BorrowedFd<'_>,
        max: usize,
        stats: &Stats,
    ) -> Result<std::ops::Range<usize>> {
        let timeout = self.timeout;
        self.scratch.read(max, |s| recv_some(fd, s, stats, timeout))
    }

    /// Advances the stream by one step.
    fn next(&mut self, fd: BorrowedFd<'_>, stats: &Stats) -> Result<Option<Loc>> {
        let d = crate::call::deadline(self.timeout);
        let mut hup = false;
        loop {
            if self.eof {
                return Ok(None);
            }
            let (s, e) = self.copybuf_pending;
            if s < e {
                self.copybuf_pending = (0, 0);
                return Ok(Some(Loc::Copybuf { start: s, end: e }));
            }
            if self.skip > 0 {
                let r = self.read_scratch(fd, self.skip, stats)?;
                let n = r.len();
                if n == 0 {
                    self.eof = true;
                    return Ok(None);
                }
                self.skip -= n;
                stats.fallback(FallbackReason::Unmappable, n as u64);
                return Ok(Some(Loc::scratch(r)));
            }
            if self.map.remaining() < MIN_WINDOW {
                let n = self
                    .map
                    .release_all()
                    .map_err(|e| Error::io("madvise(MADV_DONTNEED)", e))?;
                stats.add_rx_release_calls(1);
                stats.add_rx_released_bytes(n as u64);
            }
            if self.forced_copy {
                // `auto`'s cost check sent this step to copy: plain recv, counted there.
                let r = self.read_scratch(fd, usize::MAX, stats)?;
                if r.is_empty() {
                    self.eof = true;
                    return Ok(None);
                }
                return Ok(Some(Loc::scratch(r)));
            }
            if !self.admit(stats) {
                // Demoted: plain recv (blocking up to the timeout) until the retry.
                let r = self.read_scratch(fd, usize::MAX, stats)?;
                if r.is_empty() {
                    self.eof = true;
                    return Ok(None);
                }
                stats.fallback(FallbackReason::DemotedUnmapped, r.len() as u64);
                return Ok(Some(Loc::scratch(r)));
            }
            let want = self.map.remaining();
            let out = match self.map.receive(fd, want, &mut self.copybuf) {
                Ok(o) => o,
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EIO) => {
                        // No progress and the peer's FIN is in: end of stream.
                        self.eof = true;
                        return Ok(None);
                    }
                    _ => return Err(Error::io("getsockopt(TCP_ZEROCOPY_RECEIVE)", e)),
                },
            };
            stats.add_rx_zc_calls(1);
            if out.err != 0 {
                // The kernel stores sock_error(), a negative errno.
                return Err(Error::io(
                    "TCP_ZEROCOPY_RECEIVE",
                    std::io::Error::from_raw_os_error(out.err.abs()),
                ));
            }
            // Mapped and copybuf bytes leave the socket too: later plain reads are placed
            // by the stream offset after them.
            self.scratch.advance((out.mapped + out.copied) as u64);
            if out.copied > 0 {
                self.copybuf_pending = (0, out.copied);
                stats.add_rx_copied_bytes(out.copied as u64);
                stats.fallback(FallbackReason::Copybuf, out.copied as u64);
            }
            self.skip = out.skip_hint;
            self.report(out.mapped, out.copied > 0 || out.skip_hint > 0, stats);
            if out.mapped > 0 {
                stats.add_rx_mapped_bytes(out.mapped as u64);
                let off = self.map.mapped_end() - out.mapped;
                return Ok(Some(Loc::Mapped {
                    off,
                    len: out.mapped,
                }));
            }
            stats.add_rx_zc_empty_calls(1);
            if out.copied > 0 || out.skip_hint > 0 {
                continue;
            }
            if hup {
                // The peer is gone but the kernel neither mapped nor reported EOF (a reset
                // whose error was already consumed): let recv give the definitive answer.
                let r = self.read_scratch(fd, usize::MAX, stats)?;
                if r.is_empty() {
                    self.eof = true;
                    return Ok(None);
                }
                stats.fallback(FallbackReason::Unmappable, r.len() as u64);
                return Ok(Some(Loc::scratch(r)));
            }
            // Nothing queued: wait for data (a non-blocking socket does not: nothing was
            // taken off it, so the next call goes on from here).
            d.check(fd, "recv (TCP_ZEROCOPY_RECEIVE)", 0)?;
            let slice = d.slice(POLL_SLICE);
            match socket::poll(
                fd,
                zcnet_sys::raw::socket::PollFlags::IN | zcnet_sys::raw::socket::PollFlags::RDHUP,
                Some(slice),
            ) {
                Ok(ev) => {
                    hup = ev.intersects(
                        zcnet_sys::raw::socket::PollFlags::HUP
                            | zcnet_sys::raw::socket::PollFlags::RDHUP
                            | zcnet_sys::raw::socket::PollFlags::ERR,
                    )
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(Error::io("poll", e)),
            }
        }
    }
}

impl Receive for MmapRx {
    fn recv<'a>(&'a mut self, fd: BorrowedFd<'_>, stats: &Stats) -> Result<Option<RxChunk<'a>>> {
        if let Some(loc) = self.leftover.take() {
            return Ok(Some(RxChunk::new(
                self.bytes(loc),
                matches!(loc, Loc::Mapped { .. }),
            )));
        }
        Ok(self
            .next(fd, stats)?
            .map(|loc| RxChunk::new(self.bytes(loc), matches!(loc, Loc::Mapped { .. }))))
    }

    fn recv_into(&mut self, fd: BorrowedFd<'_>, buf: &mut [u8], stats: &Stats) -> Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.forced_copy
            && self.leftover.is_none()
            && self.copybuf_pending.0 >= self.copybuf_pending.1
            && self.skip == 0
            && !self.eof
        {
            // Nothing held: straight into the caller's buffer, as the copy path reads.
            let n = recv_some(fd, buf, stats, self.timeout)?;
            self.scratch.advance(n as u64);
            self.eof = n == 0;
            return Ok(n);
        }
        let loc = match self.leftover.take() {
            Some(loc) => loc,
            None => match self.next(fd, stats)? {
                Some(loc) => loc,
                None => return Ok(0),
            },
        };
        let src = self.bytes(loc);
        let n = src.len().min(buf.len());
        buf[..n].copy_from_slice(&src[..n]);
        if n < src.len() {
            self.leftover = Some(loc.advance(n));
        }
        Ok(n)
    }

    /// What `recv_into` left over comes first, then the copybuf tail of the last call; the
    /// skip-hint bytes are still in the socket, in order, so they are not "held".
    fn take_buffered(
        &mut self,
        max: usize,
        sink: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<usize> {
        if max == 0 {
            return Ok(0);
        }
        if let Some(loc) = self.leftover {
            let n = loc.len().min(max);
            sink(&self.bytes(loc)[..n])?;
            self.leftover = (n < loc.len()).then(|| loc.advance(n));
            return Ok(n);
        }
        let (s, e) = self.copybuf_pending;
        if s < e {
            let n = (e - s).min(max);
            sink(&self.copybuf[s..s + n])?;
            self.copybuf_pending = if s + n < e { (s + n, e) } else { (0, 0) };
            return Ok(n);
        }
        Ok(0)
    }

    fn socket_handover_ok(&self) -> bool {
        true
    }

    fn socket_bytes_taken(&mut self, n: u64) {
        self.scratch.advance(n);
        self.skip = self
            .skip
            .saturating_sub(usize::try_from(n).unwrap_or(usize::MAX));
    }

    /// Mapped receive plus write: the next step of the stream (mapped pages, copybuf or
    /// scratch) is lent to `sink` in place, so a mapped page reaches the file with one copy,
    /// the kernel's, into the page cache.
    fn recv_lend(
        &mut self,
        fd: BorrowedFd<'_>,
        _scratch: &mut [u8],
        max: usize,
        stats: &Stats,
        sink: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<usize> {
        if max == 0 {
            return Ok(0);
        }
        let held = self.take_buffered(max, sink)?;
        if held > 0 {
            return Ok(held);
        }
        match self.next(fd, stats)? {
            None => Ok(0),
            Some(loc) => {
                self.leftover = Some(loc);
                self.take_buffered(max, sink)
            }
        }
    }
}
