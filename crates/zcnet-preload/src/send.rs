//! One interposed send call on a TCP socket: copied as the program made it, or cut by
//! [`crate::plan`] into copied pieces and write-protected zero-copy spans — with the
//! result the single call would have had.
//!
//! Result rules (tcp_sendmsg's, send(2)): the pieces go out in order, each one only if the
//! one before went out whole; the first error is returned only if nothing was sent, else
//! the count so far, as a short send. Only the first system call may raise `SIGPIPE`
//! (later ones add `MSG_NOSIGNAL`): the kernel raises it only for a call that sent nothing.

use crate::config::Mode;
use crate::globals::{config, cost, huge_cost, set_zc_ever};
use crate::huge;
use crate::plan::{plan, Segment};
use crate::sock::Sock;
use crate::stats::Reason;
use crate::table::{demote_after, forget, same_socket};
use std::io::IoSlice;
use std::sync::PoisonError;
use zcnet::cow::Ineligible;
use zcnet_sys::preload::{real, Errno, SendCall, SysResult};
use zcnet_sys::raw::zerocopy::MSG_ZEROCOPY;

/// Flags whose meaning only the program's own call keeps.
const REPLAY_ONLY: i32 = libc::MSG_OOB | libc::MSG_FASTOPEN;

/// Sends `call` on TCP socket `s`.
pub fn send(s: &Sock, call: SendCall<'_>) -> SysResult {
    s.counters.call();
    let fd = call.fd();
    let cfg = config();
    if cfg.mode == Mode::Copy {
        return forward(s, &call, None);
    }
    if call.flags() & MSG_ZEROCOPY != 0 {
        s.zc().app_errqueue = true;
        return forward(s, &call, Some(Reason::AppErrqueue));
    }
    let bufs = call.bufs();
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    if let Some(r) = decline(s, &call, total) {
        return forward(s, &call, Some(r));
    }
    let page = zcnet_sys::mem::page_size();
    let layout: Vec<(usize, usize)> = bufs
        .iter()
        .map(|b| (b.as_ptr() as usize, b.len()))
        .collect();
    let segments = plan(&layout, page, cfg.min_bytes);
    if !segments.iter().any(|s| matches!(s, Segment::Protected(_))) {
        return forward(s, &call, Some(Reason::Unaligned));
    }
    if let Some(c) = cost().filter(|c| cfg.mode == Mode::Auto && !c.protection_pays()) {
        // Only whole huge pages may be cheaper to protect than to copy here.
        let huge = segments.iter().all(|seg| match seg {
            Segment::Protected(p) => huge::backed(layout[p.buf].0 + p.off, p.len),
            Segment::Copy(_) => true,
        });
        if !(huge && c.huge_protection_pays(huge_cost())) {
            return forward(s, &call, Some(Reason::ProtectCostlier));
        }
    }
    if !same_socket(fd, s) {
        // Closed and reused where this library could not see it: not this socket.
        forget(fd);
        return call.forward();
    }
    if crate::rings::present() {
        return forward(s, &call, Some(Reason::IoUring));
    }
    if !s.enable_zerocopy(fd) || zcnet::cow::backend().is_err() {
        return forward(s, &call, Some(Reason::Unsupported));
    }
    let _order = s.sending.lock().unwrap_or_else(PoisonError::into_inner);
    let r = send_segments(s, &call, &segments);
    s.drain(fd, demote_after());
    r
}

/// Why this call is copied whole; `None` to try zero-copy.
fn decline(s: &Sock, call: &SendCall<'_>, total: usize) -> Option<Reason> {
    let cfg = config();
    if call.has_extras() || call.flags() & REPLAY_ONLY != 0 {
        return Some(Reason::Flags);
    }
    if total < cfg.min_bytes.max(1) {
        return Some(Reason::TooSmall);
    }
    if s.shared() {
        return Some(Reason::Forked);
    }
    if crate::rings::found() {
        return Some(Reason::IoUring);
    }
    if s.zc().app_errqueue {
        return Some(Reason::AppErrqueue);
    }
    if cfg.mode != Mode::Zerocopy && s.demoted() {
        return Some(Reason::DemotedCopied);
    }
    if cfg.mode != Mode::Zerocopy && s.route_copies(call.fd()) {
        return Some(Reason::RouteCopies);
    }
    if cfg.mode == Mode::Auto {
        // Before the cost check: a program that talks only to this host never pays for
        // measuring protection (about 40 calls once per process), nor for protecting pages
        // the kernel will copy at delivery anyway (the same rule as zcnet's own `auto`).
        if !cfg.local_zerocopy && s.delivery_is_local(call.fd()) {
            return Some(Reason::LocalDelivery);
        }
        match cost() {
            None => return Some(Reason::Unsupported),
            // Below one huge page, only the 4 KiB cost can decide.
            Some(c)
                if !c.protection_pays() && !call.bufs().iter().any(|b| b.len() >= huge::HUGE) =>
            {
                return Some(Reason::ProtectCostlier)
            }
            Some(_) => {}
        }
        // A socket counts its faults only when the completions that end its protections
        // are read, which lags the sends: nginx (`pread` into the buffer it just sent) made
        // 28 protected sends on loopback, 7140 write faults and 0.23 s of fault handling,
        // before its socket's count showed one. The engine counts each fault as it resolves
        // it; a program that rewrote one buffer in flight rewrites the next ones too.
        if s.counters.faults_so_far() > 0
            || zcnet::cow::engine_stats().is_some_and(|e| e.faults > 0)
        {
            return Some(Reason::Rewritten);
        }
    }
    None
}

/// The program's call, unchanged; counted as copied (for `reason`, if it is a fallback).
fn forward(s: &Sock, call: &SendCall<'_>, reason: Option<Reason>) -> SysResult {
    let r = call.forward();
    if let Ok(n) = r {
        s.counters.copied(n as u64, reason);
    }
    r
}

fn send_segments(s: &Sock, call: &SendCall<'_>, segments: &[Segment]) -> SysResult {
    let fd = call.fd();
    let bufs = call.bufs();
    let mut total = 0usize;
    for (i, seg) in segments.iter().enumerate() {
        let flags = call.flags() | if i > 0 { libc::MSG_NOSIGNAL } else { 0 };
        let r = match seg {
            Segment::Copy(pieces) => {
                let v: Vec<IoSlice<'_>> = pieces
                    .iter()
                    .map(|p| IoSlice::new(&bufs[p.buf][p.off..p.off + p.len]))
                    .collect();
                let r = real::sendmsg_iov(fd, &v, flags);
                if let Ok(n) = r {
                    s.counters.copy_bytes(n as u64);
                }
                r
            }
            Segment::Protected(p) => protected(s, fd, &bufs[p.buf][p.off..p.off + p.len], flags),
        };
        match r {
            Ok(n) => {
                total += n;
                if n < seg.len() {
                    break;
                }
            }
            Err(e) if total == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(total)
}

/// Sends `span` zero-copy under write protection, or copies it (counted) where it cannot be
/// protected or the kernel refuses `MSG_ZEROCOPY` for want of locked memory.
fn protected(s: &Sock, fd: i32, span: &[u8], flags: i32) -> SysResult {
    let copy = |reason: Reason| {
        let r = real::send(fd, span, flags);
        if let Ok(n) = r {
            s.counters.copy_bytes(n as u64);
            s.counters.fallback(reason, n as u64);
        }
        r
    };
    let p = match zcnet::cow::protect(span) {
        Ok(p) => p,
        Err(Ineligible::Forked) => return copy(Reason::Forked),
        Err(Ineligible::Unavailable) => return copy(Reason::Unsupported),
        Err(_) => return copy(Reason::Unprotectable),
    };
    s.counters.protected(p.pages() as u64);
    match real::send(fd, span, flags | MSG_ZEROCOPY) {
        Ok(n) if n > 0 => {
            set_zc_ever();
            s.counters.zerocopy(n as u64);
            s.record(n, p, demote_after());
            Ok(n)
        }
        Err(Errno(libc::ENOBUFS)) => {
            s.counters.faults(p.release().faults);
            copy(Reason::Enobufs)
        }
        other => {
            // Nothing went out: the kernel holds no page of the span.
            s.counters.faults(p.release().faults);
            other
        }
    }
}
