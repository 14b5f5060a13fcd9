//! What the program must not see: readiness caused only by zero-copy completions waiting
//! in a socket's error queue (`POLLERR`, `EPOLLERR`, and `select`'s read and write sets,
//! which both include `POLLERR`). For each reported socket that sent zero-copy, the queue
//! is drained (protections lifted) and the socket polled again with a zero timeout: what it
//! reports then — a real error, a reset, data, room to write — is what the program sees.

use crate::kind::{cached, Kind};
use crate::table::{demote_after, epoll_target, known};
use zcnet_sys::preload::{real, FdSet};
use zcnet_sys::raw::socket::tcp_info;

/// `tcpi_state` of a closed socket (`TCP_CLOSE`, include/net/tcp_states.h).
const TCP_CLOSE: u8 = 7;

/// Drains `fd`'s completions if it is a socket that sent zero-copy; then its readiness for
/// `events` now (`None` if it is not such a socket). On a socket whose completions are
/// another process's (a forked child's view of its parent's sends), nothing is read:
/// `POLLERR` is dropped unless the socket is closed — without `IP_RECVERR` (which makes
/// the program read the queue itself, and is left alone) TCP sets a socket error only as
/// it closes the connection (`tcp_reset`, `tcp_write_err`, `tcp_done`), so an open
/// socket's `POLLERR` comes from its error queue.
fn recheck(fd: i32, events: i16) -> Option<i16> {
    if cached(fd) != Kind::Tcp {
        return None;
    }
    let s = known(fd)?;
    let foreign = s.foreign_owner().is_some();
    if !(s.zc_ever() || foreign) {
        return None;
    }
    let mut now = 0;
    // A completion may arrive between the drain and the poll: drain again while `POLLERR`
    // stays (a real error stays through any number of drains).
    for _ in 0..4 {
        s.drain(fd, demote_after());
        let mut p = [libc::pollfd {
            fd,
            events,
            revents: 0,
        }];
        real::poll(&mut p, 0).ok()?;
        now = p[0].revents;
        if foreign || now & libc::POLLERR == 0 {
            break;
        }
    }
    if foreign && now & libc::POLLERR != 0 && !s.zc().app_errqueue {
        let state = real::with_fd(fd, |b| tcp_info(b).ok().map(|i| i.state)).flatten();
        if state.is_some_and(|st| st != TCP_CLOSE) {
            now &= !libc::POLLERR;
            // The owner reads them at once: let it run before the program polls again.
            std::thread::yield_now();
        }
    }
    Some(now)
}

/// `poll`/`ppoll`'s result with completion-only `POLLERR`s removed.
pub fn poll(fds: &mut [libc::pollfd], mut ready: usize) -> usize {
    for p in fds.iter_mut() {
        if p.revents & libc::POLLERR == 0 {
            continue;
        }
        if let Some(now) = recheck(p.fd, p.events) {
            if p.revents != 0 && now == 0 {
                ready = ready.saturating_sub(1);
            }
            p.revents = now;
        }
    }
    ready
}

/// `epoll_wait`'s events with completion-only `EPOLLERR`s removed (and events left
/// empty dropped; a one-shot registration whose event is dropped is armed again).
pub fn epoll(epfd: i32, events: &mut [libc::epoll_event]) -> usize {
    let mut kept = 0;
    for i in 0..events.len() {
        let ev = events[i];
        let (bits, data) = (ev.events, ev.u64);
        let mut out = bits;
        if bits & libc::EPOLLERR as u32 != 0 {
            if let Some((fd, interest)) = epoll_target(epfd, data) {
                let asked = (interest & 0xffff) as i16;
                if let Some(now) = recheck(fd, asked) {
                    out = (now as u16 as u32)
                        & (interest | libc::EPOLLERR as u32 | libc::EPOLLHUP as u32);
                }
            }
        }
        if out != 0 {
            events[kept] = libc::epoll_event {
                events: out,
                u64: data,
            };
            kept += 1;
        } else if let Some((fd, interest)) = epoll_target(epfd, data) {
            // The kernel disarmed a one-shot registration for this event, which the program
            // never sees: arm it again, or the program would wait for it forever.
            if interest & libc::EPOLLONESHOT as u32 != 0 {
                let _ = real::epoll_modify(epfd, fd, interest, data);
            }
        }
    }
    kept
}

/// `select`'s sets with completion-only readiness removed.
pub fn select(
    nfds: i32,
    mut r: Option<&mut FdSet<'_>>,
    mut w: Option<&mut FdSet<'_>>,
    mut ready: usize,
) -> usize {
    for fd in 0..nfds.min(libc::FD_SETSIZE as i32) {
        let in_r = r.as_ref().is_some_and(|s| s.contains(fd));
        let in_w = w.as_ref().is_some_and(|s| s.contains(fd));
        if !(in_r || in_w) {
            continue;
        }
        let Some(now) = recheck(fd, libc::POLLIN | libc::POLLOUT) else {
            continue;
        };
        let readable = now & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0;
        let writable = now & (libc::POLLOUT | libc::POLLERR) != 0;
        if in_r && !readable {
            if let Some(s) = r.as_mut() {
                s.set(fd, false);
            }
            ready = ready.saturating_sub(1);
        }
        if in_w && !writable {
            if let Some(s) = w.as_mut() {
                s.set(fd, false);
            }
            ready = ready.saturating_sub(1);
        }
    }
    ready
}
