//! AF_XDP between two network namespaces (docs/lm-afxdp.md): an XSK in copy
//! mode on the receiving veth, fed by zcnet's XDP redirect program, gets UDP datagrams that an
//! ordinary socket in the other namespace sends; every payload byte is checked against the
//! pattern. The UMEM is far smaller than the traffic, so frames only keep arriving if every
//! chunk goes back on the FILL ring. Zero-copy bind is refused on veth and the errno is
//! asserted. Unaligned chunks place frames where the receiver posted them, which is what
//! Lightweight Messages' driver-level defragmentation needs: datagrams sent last-first land
//! with their payloads back to back and are read as one slice.

use std::net::{SocketAddrV4, UdpSocket};
use std::process::Command;
use std::time::Duration;
use zcnet_afxdp::wire::udp::{self as wire, UDP_FRAME_HLEN};
use zcnet_afxdp::{AttachMode, BindMode, RedirectProgram, XskConfig, XskError, XskSocket};
use zcnet_testbed::netns::VethPair;
use zcnet_testbed::pattern::pattern;
use zcnet_testbed::topo::veth_pair;

/// Destination port the redirect program steers to the XSK (the namespaces are the test's
/// own, so a fixed port cannot clash).
const PORT: u16 = 7700;
/// Longest wait for one frame.
const WAIT: Duration = Duration::from_secs(5);
/// `XDP_PACKET_HEADROOM`: where copy mode puts a frame in its chunk.
const XDP_HEADROOM: u64 = 256;

/// In namespace b: the XSK bound in copy mode to queue 0 of vzb, the program attached in
/// `attach` mode with the socket in its map, and every free frame on the FILL ring.
fn receiver(
    pair: &VethPair,
    config: XskConfig,
    attach: AttachMode,
) -> Result<(XskSocket, RedirectProgram), XskError> {
    pair.run_in_b(|| {
        let mut sock = XskSocket::new(config)?;
        let binding = sock.bind(pair.ifname_b(), 0, BindMode::Copy)?;
        assert!(
            !binding.zero_copy,
            "copy bind reports zero-copy: {binding:?}"
        );
        let mut prog = RedirectProgram::load(Some(PORT))?;
        prog.attach(pair.ifname_b(), attach)?;
        prog.insert(0, &sock)?;
        Ok((sock, prog))
    })
    .expect("enter b")
}

fn sender(pair: &VethPair) -> UdpSocket {
    pair.run_in_a(|| UdpSocket::bind((pair.addr_a(), 0)))
        .expect("enter a")
        .expect("bind in a")
}

/// Receives one frame and checks it is the datagram `from` sent to PORT with `want`.
fn recv_datagram(sock: &mut XskSocket, from: SocketAddrV4, to: SocketAddrV4, want: &[u8]) {
    let frame = sock.recv(WAIT).expect("recv").unwrap_or_else(|| {
        panic!(
            "no frame within {WAIT:?} for a {}-byte datagram",
            want.len()
        )
    });
    let udp = wire::parse_udp(&frame).expect("an IPv4 UDP frame");
    assert_eq!((udp.src, udp.dst), (from, to));
    assert_eq!(udp.payload.len(), want.len(), "payload length");
    if &frame[udp.payload.clone()] != want {
        let at = frame[udp.payload.clone()]
            .iter()
            .zip(want)
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        panic!(
            "payload of a {}-byte datagram differs at byte {at}",
            want.len()
        );
    }
}

fn local(sock: &UdpSocket) -> SocketAddrV4 {
    match sock.local_addr().expect("local_addr") {
        std::net::SocketAddr::V4(a) => a,
        other => panic!("not IPv4: {other}"),
    }
}

/// Sends `count` datagrams cycling through `sizes`, `burst` at a time, receiving each
/// burst through the XSK before the next. Returns how many bytes were verified.
fn stream(pair: &VethPair, config: XskConfig, attach: AttachMode, sizes: &[usize], count: usize) {
    let (mut sock, _prog) = match receiver(pair, config, attach) {
        Ok(r) => r,
        Err(e) => panic!("AF_XDP receiver in copy mode on veth: {e}"),
    };
    let posted = sock.fill(0).expect("fill");
    assert_eq!(posted as u32, config.frame_count.min(config.fill_ring));
    let tx = sender(pair);
    let from = local(&tx);
    let to = SocketAddrV4::new(pair.addr_b(), PORT);
    // Bursts stay below the frames on the FILL ring, so nothing is dropped for want of one.
    let burst = (posted / 2).max(1);
    let mut pos = 0u64;
    let mut sent = 0;
    let mut bytes = 0u64;
    while sent < count {
        let n = burst.min(count - sent);
        let mut expect = Vec::with_capacity(n);
        for k in 0..n {
            let len = sizes[(sent + k) % sizes.len()];
            let payload = pattern(pos, len);
            pos += len as u64;
            assert_eq!(tx.send_to(payload, to).expect("send_to"), len);
            expect.push(payload);
        }
        for payload in expect {
            recv_datagram(&mut sock, from, to, payload);
            bytes += payload.len() as u64;
        }
        sent += n;
    }
    assert_eq!(bytes, pos);
    let stats = sock.statistics().expect("XDP_STATISTICS");
    assert_eq!(stats.rx_dropped, 0, "{stats:?}");
    assert_eq!(stats.rx_invalid_descs, 0, "{stats:?}");
    // Every chunk went back: all of the FILL ring's worth is with the kernel again.
    assert_eq!(sock.held_by_kernel(), posted, "chunks not re-posted");
    // Only the redirected port reached the XSK: nothing else is pending.
    assert!(sock
        .recv(Duration::from_millis(50))
        .expect("recv")
        .is_none());
}

fn small_umem() -> XskConfig {
    // 32 frames for hundreds of datagrams: only a re-posting receiver keeps up.
    let mut c = XskConfig::default().with_frames(4096, 32);
    c.fill_ring = 32;
    c.completion_ring = 32;
    c.rx_ring = 32;
    c.tx_ring = 32;
    c
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn copy_mode_native_xdp_receives_every_size_up_to_the_mtu() {
    let pair = veth_pair(1500);
    let sizes = [1, 2, 17, 63, 64, 100, 512, 1000, 1471, 1472];
    stream(&pair, small_umem(), AttachMode::Native, &sizes, 400);
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn copy_mode_generic_xdp_receives_jumbo_frames_into_unaligned_chunks() {
    let pair = veth_pair(9000);
    // 3798 = 4096 - 256 (XDP headroom) - 42 (headers): the largest frame a 4 KiB chunk holds.
    let sizes = [1473, 2000, 3000, 3797, 3798, 9];
    stream(
        &pair,
        small_umem().with_unaligned(true),
        AttachMode::Generic,
        &sizes,
        120,
    );
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn zero_copy_bind_is_refused_on_veth_and_the_same_socket_then_binds_in_copy_mode() {
    let pair = veth_pair(1500);
    let setup = pair
        .run_in_b(|| -> Result<_, XskError> {
            let mut sock = XskSocket::new(small_umem())?;
            let zc = sock.bind(pair.ifname_b(), 0, BindMode::ZeroCopy);
            if let Ok(b) = zc {
                return Ok(Err(b));
            }
            let refused = zc.expect_err("checked above");
            // The refused socket stays unbound; PreferZeroCopy asks again, then binds it in
            // copy mode and says why.
            let binding = sock.bind(pair.ifname_b(), 0, BindMode::PreferZeroCopy)?;
            let mut prog = RedirectProgram::load(Some(PORT))?;
            prog.attach(pair.ifname_b(), AttachMode::Native)?;
            prog.insert(0, &sock)?;
            Ok(Ok((refused, binding, sock, prog)))
        })
        .expect("enter b")
        .expect("set up in b");
    let (refused, binding, mut sock, _prog) = match setup {
        Ok(s) => s,
        Err(b) => {
            // veth has no XSK zero-copy: a kernel whose veth took it needs this test changed.
            panic!("veth accepted XDP_ZEROCOPY here ({b:?}); the refusal cannot be checked");
        }
    };
    assert!(
        matches!(
            refused,
            XskError::Bind {
                mode: BindMode::ZeroCopy,
                ..
            }
        ),
        "{refused}"
    );
    assert_eq!(
        refused.raw_os_error(),
        Some(libc::EOPNOTSUPP),
        "veth has no XSK zero-copy: {refused}"
    );
    assert!(!binding.zero_copy);
    assert_eq!(binding.zero_copy_refused, Some(libc::EOPNOTSUPP));
    assert!(matches!(
        sock.bind(pair.ifname_b(), 0, BindMode::Copy),
        Err(XskError::AlreadyBound)
    ));
    sock.fill(0).expect("fill");
    let tx = sender(&pair);
    let to = SocketAddrV4::new(pair.addr_b(), PORT);
    let payload = pattern(12_345, 1200);
    tx.send_to(payload, to).expect("send_to");
    recv_datagram(&mut sock, local(&tx), to, payload);
}

/// Driver-level defragmentation (Jin, Zhang, Tan, "Lightweight Messages", §3.2) with unaligned chunks: the receiver posts,
/// for each fragment of a message, the chunk address that puts that fragment's payload
/// right in front of the next one's; the sender sends fragments last-first, so each
/// arriving frame's payload overwrites the headers of the one that arrived before it. After
/// the last frame the whole message is one contiguous region of the UMEM.
#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn unaligned_chunks_land_reverse_ordered_fragments_back_to_back() {
    let pair = veth_pair(1500);
    const FRAG: usize = 1472;
    const MSG: usize = 10 * FRAG + 333;
    let mut config = XskConfig::default()
        .with_frames(2048, 64)
        .with_unaligned(true);
    config.fill_ring = 32;
    let (mut sock, _prog) = receiver(&pair, config, AttachMode::Native).expect("receiver");
    // Fragment k's payload goes to msg_at + k * FRAG; its frame starts UDP_FRAME_HLEN
    // earlier and its chunk XDP_HEADROOM before that.
    let msg_at: u64 = 8192 + 100;
    let frags: Vec<(u64, usize)> = (0..MSG.div_ceil(FRAG))
        .map(|k| (msg_at + (k * FRAG) as u64, FRAG.min(MSG - k * FRAG)))
        .collect();
    let chunk_of = |payload_at: u64| payload_at - UDP_FRAME_HLEN as u64 - XDP_HEADROOM;
    // The kernel takes FILL entries in order: post the last fragment's chunk first.
    for &(at, _) in frags.iter().rev() {
        sock.fill_at(chunk_of(at)).expect("fill_at");
    }
    let tx = sender(&pair);
    let from = local(&tx);
    let to = SocketAddrV4::new(pair.addr_b(), PORT);
    let message = pattern(777, MSG);
    for &(at, len) in frags.iter().rev() {
        let off = (at - msg_at) as usize;
        tx.send_to(&message[off..off + len], to).expect("send_to");
        // The frame's headers lie under the next fragment's posted chunk: only its
        // placement is taken now.
        let placed = sock
            .recv_placed(WAIT)
            .expect("recv")
            .unwrap_or_else(|| panic!("fragment at {off} did not arrive"));
        assert_eq!(placed.chunk, chunk_of(at), "taken in FILL order");
        assert_eq!(
            placed.addr,
            placed.chunk + XDP_HEADROOM,
            "copy mode's headroom"
        );
        assert_eq!(placed.len as usize, UDP_FRAME_HLEN + len);
    }
    // The first fragment arrived last: its headers are intact, the others' are payload now.
    let first = sock
        .umem(
            chunk_of(msg_at) + XDP_HEADROOM,
            (UDP_FRAME_HLEN + FRAG) as u32,
        )
        .expect("first frame is ours");
    let udp = wire::parse_udp(first).expect("first fragment's headers");
    assert_eq!((udp.src, udp.dst), (from, to));
    assert_eq!(sock.held_by_kernel(), 0);
    let whole = sock
        .umem(msg_at, MSG as u32)
        .expect("the message region is ours");
    assert!(whole == message, "message not contiguous in the UMEM");
}

/// AF_XDP transmit in copy mode: frames built in the UMEM behind header room, sent from
/// namespace a, received by an ordinary UDP socket in b; completions give every frame back.
#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn copy_mode_transmit_reaches_a_udp_socket_and_completes() {
    let pair = veth_pair(1500);
    let mac = |side_ns: &str, ifname: &str| -> [u8; 6] {
        let out = Command::new("ip")
            .args(["-n", side_ns, "-o", "link", "show", ifname])
            .output()
            .expect("ip link show");
        let text = String::from_utf8_lossy(&out.stdout);
        let hex = text
            .split_whitespace()
            .skip_while(|w| *w != "link/ether")
            .nth(1)
            .unwrap_or_else(|| panic!("no MAC in {text:?}"));
        let bytes: Vec<u8> = hex
            .split(':')
            .map(|b| u8::from_str_radix(b, 16).expect("hex"))
            .collect();
        bytes.try_into().expect("6 bytes")
    };
    let src_mac = mac(pair.name_a(), pair.ifname_a());
    let dst_mac = mac(pair.name_b(), pair.ifname_b());
    let rx = pair
        .run_in_b(|| UdpSocket::bind((pair.addr_b(), 0)))
        .expect("enter b")
        .expect("bind in b");
    rx.set_read_timeout(Some(WAIT)).unwrap();
    let to = local(&rx);
    let from = SocketAddrV4::new(pair.addr_a(), 40_000);
    let mut sock = pair
        .run_in_a(|| -> Result<XskSocket, XskError> {
            let mut sock = XskSocket::new(small_umem())?;
            sock.bind(pair.ifname_a(), 0, BindMode::Copy)?;
            Ok(sock)
        })
        .expect("enter a")
        .expect("XSK in a");
    let sizes = [1usize, 100, 1000, 1472];
    let mut pos = 0u64;
    let mut buf = vec![0u8; 2048];
    for i in 0..200 {
        let len = sizes[i % sizes.len()];
        let payload = pattern(pos, len);
        pos += len as u64;
        let mut frame = loop {
            if let Some(f) = sock.tx_frame().expect("tx_frame") {
                break f;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let b = frame.buf_mut();
        b[UDP_FRAME_HLEN..UDP_FRAME_HLEN + len].copy_from_slice(payload);
        let n = wire::write_udp_headers(b, src_mac, dst_mac, from, to, len).expect("headers");
        frame.send(n as u32).expect("send");
        let (got, peer) = rx.recv_from(&mut buf).expect("datagram from the XSK");
        assert_eq!(peer, std::net::SocketAddr::V4(from));
        assert_eq!(&buf[..got], payload);
    }
    // Every frame comes back through the COMPLETION ring.
    for _ in 0..100 {
        sock.reap_completions();
        if sock.tx_in_flight() == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(sock.tx_in_flight(), 0);
    assert_eq!(sock.free_frames(), 32);
    let stats = sock.statistics().expect("statistics");
    assert_eq!(stats.tx_invalid_descs, 0, "{stats:?}");
}

#[cfg_attr(
    not(zcnet_root),
    ignore = "needs root (AF_XDP sockets need CAP_NET_RAW)"
)]
#[test]
fn bad_configurations_and_unbound_use_are_clear_errors() {
    let bad = XskConfig::default().with_frames(3000, 4);
    assert!(matches!(XskSocket::new(bad), Err(XskError::Config(_))));
    let mut rings = XskConfig::default();
    rings.rx_ring = 100;
    assert!(matches!(XskSocket::new(rings), Err(XskError::Config(_))));
    let mut sock = XskSocket::new(small_umem()).expect("an AF_XDP socket, as root");
    assert!(matches!(sock.fill(0), Err(XskError::NotBound)));
    assert!(matches!(sock.recv(Duration::ZERO), Err(XskError::NotBound)));
    // Outside the UMEM.
    assert!(sock.umem(32 * 4096 - 10, 11).is_err());
    assert_eq!(sock.umem(0, 4096).expect("free frame").len(), 4096);
    let e = sock
        .bind("zcnet-no-such-if", 0, BindMode::Copy)
        .expect_err("no such interface");
    assert_eq!(e.raw_os_error(), Some(libc::ENODEV), "{e}");
}
