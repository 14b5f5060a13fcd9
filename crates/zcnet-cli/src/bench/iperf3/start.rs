//! `start` of iperf3's `-J` document (and the text lines that open a test), from the
//! control and data connections as they are.

use super::opts::Format;
use serde_json::Value;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use zcnet_bench::iperf3::output::{self, Connected, Role, Start};
use zcnet_bench::iperf3::{Cookie, TestParams};

/// What iperf3 calls `system_info`: `uname -a`'s fields from /proc.
fn system_info() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    format!(
        "Linux {} {} {} {}",
        read("/proc/sys/kernel/hostname"),
        read("/proc/sys/kernel/osrelease"),
        read("/proc/sys/kernel/version"),
        std::env::consts::ARCH
    )
}

/// A data connection as `start.connected` shows it: TCP or UDP.
pub(crate) struct Conn<'a> {
    fd: BorrowedFd<'a>,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
}

impl<'a> Conn<'a> {
    pub(crate) fn tcp(s: &'a TcpStream) -> Conn<'a> {
        Conn {
            fd: s.as_fd(),
            local: s.local_addr().ok(),
            peer: s.peer_addr().ok(),
        }
    }

    pub(crate) fn udp(s: &'a UdpSocket) -> Conn<'a> {
        Conn {
            fd: s.as_fd(),
            local: s.local_addr().ok(),
            peer: s.peer_addr().ok(),
        }
    }
}

/// `start`, and the lines iperf3 prints before the first interval.
pub(crate) fn start(
    role: Role,
    cookie: &Cookie,
    params: &TestParams,
    ctrl: &TcpStream,
    data: &[Conn<'_>],
    zcnet: Value,
    format: Format,
) -> (Value, String) {
    let connected: Vec<Connected> = data
        .iter()
        .map(|s| {
            let l = s.local;
            let r = s.peer;
            Connected {
                socket: s.fd.as_raw_fd(),
                local_host: l.map_or(String::new(), |a| a.ip().to_string()),
                local_port: l.map_or(0, |a| a.port()),
                remote_host: r.map_or(String::new(), |a| a.ip().to_string()),
                remote_port: r.map_or(0, |a| a.port()),
            }
        })
        .collect();
    let buf = |opt: i32| {
        data.first()
            .and_then(|s| zcnet_sys::raw::socket::get_int(s.fd, libc::SOL_SOCKET, opt).ok())
            .map_or(0, |v| v.max(0) as u64)
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mss = zcnet_sys::raw::socket::tcp_info(ctrl.as_fd()).map_or(0, |t| t.snd_mss);
    let s = Start {
        role: role.clone(),
        version: format!("zcnet {} (iperf 3 protocol)", env!("CARGO_PKG_VERSION")),
        system_info: system_info(),
        time: output::timestamp_text(now),
        timesecs: now,
        connected: connected.clone(),
        cookie: cookie.as_str().to_string(),
        tcp_mss_default: mss,
        sndbuf_actual: buf(libc::SO_SNDBUF),
        rcvbuf_actual: buf(libc::SO_RCVBUF),
        params: params.clone(),
        zcnet,
    };
    let mut text = String::new();
    if format == Format::Text {
        match &role {
            Role::Client { host, port } => {
                text += &format!("Connecting to host {host}, port {port}\n");
            }
            Role::Server { host, port } => {
                text += &format!("Accepted connection from {host}, port {port}\n");
            }
        }
        for c in &connected {
            text += &format!(
                "[{:>3}] local {} port {} connected to {} port {}\n",
                c.socket, c.local_host, c.local_port, c.remote_host, c.remote_port
            );
        }
        text += "[ ID] Interval           Transfer     Bitrate         Retr\n";
    }
    (output::start(&s), text)
}
