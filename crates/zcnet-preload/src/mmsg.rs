//! `sendmmsg` on UDP sockets: runs of datagrams that UDP GSO can carry as one send — same
//! destination, no control message, every one `seg` bytes but the last of the run (which
//! may be shorter) — go out as one `sendmsg` with `UDP_SEGMENT` (udp(7)), which the kernel
//! cuts back into exactly those datagrams: one pass down the stack for the run instead of
//! one per datagram (Willem de Bruijn, "Optimizing UDP for content delivery: GSO, pacing
//! and zerocopy", Linux Plumbers 2018). The payload is copied by the kernel as in the
//! program's own call, so the program may reuse its buffers at once.
//!
//! Everything else goes to the C library's `sendmmsg` as the program made it. The result is
//! `sendmmsg`'s: the number of messages sent, each sent one's `msg_len` set; an error only
//! if none went. A route or kernel that refuses GSO (`EINVAL`, `EIO`: no checksum offload,
//! a segment larger than the MTU) is remembered per descriptor and counted.

use crate::globals::udp;
use crate::kind::{cached, classify, remember, Kind};
use crate::plan::{gso_runs, Msg};
use zcnet_sys::preload::{Errno, MmsgCall, SysResult};

/// A `sendmmsg` call on any descriptor.
pub fn send(call: MmsgCall<'_>) -> SysResult {
    let fd = call.fd();
    let kind = match cached(fd) {
        // A descriptor this library did not see made is asked of the kernel only for a
        // call GSO could shorten.
        Kind::Unknown if call.msgs().len() > 1 => {
            let k = classify(fd);
            remember(fd, k);
            k
        }
        k => k,
    };
    let all = 0..call.msgs().len();
    if !matches!(kind, Kind::Udp | Kind::UdpNoGso) {
        return call.forward(all);
    }
    let c = udp();
    c.call();
    // MSG_MORE corks datagrams together: only the program's own call keeps that meaning.
    if kind == Kind::UdpNoGso || call.flags() & libc::MSG_MORE != 0 {
        let r = call.forward(all);
        if let Ok(k) = r {
            c.forwarded(k as u64);
        }
        return r;
    }
    let msgs: Vec<Msg<'_>> = call
        .msgs()
        .iter()
        .map(|m| Msg {
            len: m.len(),
            iovs: m.bufs.len(),
            name: m.name,
            control: m.control,
        })
        .collect();
    let mut gso_ok = true;
    let mut sent = 0usize;
    for mut run in gso_runs(&msgs) {
        if !gso_ok {
            run.seg = None;
        }
        let n = run.range.len();
        let r = match run.seg {
            Some(seg) => match call.send_gso(run.range.clone(), seg) {
                Ok(bytes) => {
                    c.gso(n as u64, bytes as u64);
                    Ok(n)
                }
                Err(Errno(libc::EINVAL | libc::EIO | libc::ENOPROTOOPT | libc::EOPNOTSUPP)) => {
                    // This route or kernel will not segment: never try again on this socket.
                    remember(fd, Kind::UdpNoGso);
                    gso_ok = false;
                    c.refused(n as u64);
                    call.forward(run.range.clone())
                }
                Err(e) => Err(e),
            },
            None => {
                let r = call.forward(run.range.clone());
                if let Ok(k) = r {
                    c.forwarded(k as u64);
                }
                r
            }
        };
        match r {
            Ok(k) => {
                sent += k;
                if k < n {
                    break;
                }
            }
            Err(e) if sent == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(sent)
}
