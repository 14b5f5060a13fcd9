//! `ZcStream` and `ZcListener` do what a `tokio::net::TcpStream`/`TcpListener` user reaches
//! for: bind by name, owned halves (the write half keeping `send_zc`/`send_bytes`), the
//! descriptor, readiness with `try_read`/`try_write`, addresses, `TCP_NODELAY`, and the
//! way back to a plain stream. Every transfer checks every byte.

mod common;

use bytes::Bytes;
use common::{bounded, pattern_vec, read_verified};
use std::os::fd::{AsFd, AsRawFd};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::TcpStream;
use zcnet_testbed::pattern::Verifier;
use zcnet_tokio::{Policy, ZcConfig, ZcListener, ZcStream};

/// A connected pair: the accepted side and the connecting side, both `ZcStream`s.
async fn zc_pair(config: ZcConfig) -> (ZcStream, ZcStream) {
    let l = ZcListener::bind_with("127.0.0.1:0", config.clone())
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    let (a, c) = tokio::join!(l.accept(), ZcStream::connect_with(addr, config));
    (a.unwrap().0, c.unwrap())
}

#[tokio::test]
async fn a_listener_binds_a_name_and_its_streams_know_their_addresses() {
    let l = ZcListener::bind("localhost:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    assert!(addr.ip().is_loopback(), "{addr}");
    assert_ne!(addr.port(), 0);
    assert!(l.as_fd().as_raw_fd() >= 0);
    assert_eq!(l.as_raw_fd(), l.as_fd().as_raw_fd());
    let (a, c) = tokio::join!(l.accept(), ZcStream::connect(addr));
    let (a, peer) = a.unwrap();
    let c = c.unwrap();
    assert_eq!(a.local_addr().unwrap(), addr);
    assert_eq!(a.peer_addr().unwrap(), peer);
    assert_eq!(c.peer_addr().unwrap(), addr);
    assert_eq!(c.local_addr().unwrap(), peer);
    // An address that is not one fails the way tokio's bind does.
    assert!(ZcListener::bind("no such host.invalid:0").await.is_err());
    // A tokio listener can be taken over, and given back.
    let tl = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let taddr = tl.local_addr().unwrap();
    let zl = ZcListener::try_from(tl).unwrap();
    assert_eq!(zl.local_addr().unwrap(), taddr);
    assert_eq!(zl.into_tokio().local_addr().unwrap(), taddr);
}

#[tokio::test]
async fn the_descriptor_and_nodelay_are_the_sockets_own() {
    let (a, c) = zc_pair(ZcConfig::new()).await;
    let fd = c.as_fd();
    assert_eq!(fd.as_raw_fd(), c.as_raw_fd());
    let sock = socket2::SockRef::from(&c);
    assert_eq!(
        sock.peer_addr().unwrap().as_socket(),
        Some(a.local_addr().unwrap())
    );
    c.set_nodelay(true).unwrap();
    assert!(sock.tcp_nodelay().unwrap());
    c.set_nodelay(false).unwrap();
    assert!(!sock.tcp_nodelay().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_halves_run_a_proxy_in_two_tasks_with_zero_copy_sends() {
    // client -> [proxy: read half ... write half] -> server, and back, each direction its
    // own task; the write halves send with send_bytes and send_zc.
    const LEN: usize = 8 << 20;
    let config = ZcConfig::new().policy(Policy::always());
    let (client_side, client) = zc_pair(config.clone()).await;
    let (server_side, server) = zc_pair(config).await;
    let client_side_fd = client_side.as_raw_fd();
    let (mut from_client, mut to_client) = client_side.into_split();
    assert_eq!(from_client.as_raw_fd(), client_side_fd);
    assert_eq!(to_client.as_fd().as_raw_fd(), client_side_fd);
    let (mut from_server, mut to_server) = server_side.into_split();
    // client -> server: read into fresh Bytes, forward with send_bytes.
    let up = tokio::spawn(async move {
        let mut n = 0u64;
        loop {
            let mut buf = vec![0u8; 256 << 10];
            let k = from_client.read(&mut buf).await.unwrap();
            if k == 0 {
                break;
            }
            buf.truncate(k);
            to_server.send_bytes(Bytes::from(buf)).await.unwrap();
            n += k as u64;
        }
        to_server.flush_loans().await.unwrap();
        to_server.shutdown().await.unwrap();
        (n, from_client, to_server)
    });
    // server -> client: send_zc gives the buffer back for the next read.
    let down = tokio::spawn(async move {
        let mut n = 0u64;
        let mut buf = vec![0u8; 256 << 10];
        loop {
            buf.resize(256 << 10, 0);
            let k = from_server.read(&mut buf).await.unwrap();
            if k == 0 {
                break;
            }
            buf.truncate(k);
            let (r, back) = to_client.send_zc(buf).await;
            r.unwrap();
            buf = back;
            n += k as u64;
        }
        to_client.shutdown().await.unwrap();
        (n, from_server, to_client)
    });
    let (mut client_r, mut client_w) = client.into_split();
    let (mut server_r, mut server_w) = server.into_split();
    let client_sends = tokio::spawn(async move {
        client_w
            .send_bytes(Bytes::from(pattern_vec(0, LEN)))
            .await
            .unwrap();
        client_w.flush_loans().await.unwrap();
        drop(client_w); // shuts the write side down, as tokio's half does
    });
    let server_sends = tokio::spawn(async move {
        let (r, _) = server_w.send_zc(pattern_vec(0, LEN)).await;
        r.unwrap();
        drop(server_w);
    });
    let at_server = bounded("server reads", read_verified(&mut server_r)).await;
    let at_client = bounded("client reads", read_verified(&mut client_r)).await;
    assert_eq!(at_server.unwrap(), LEN as u64, "every byte up, in order");
    assert_eq!(at_client.unwrap(), LEN as u64, "every byte down, in order");
    bounded("client", client_sends).await.unwrap();
    bounded("server", server_sends).await.unwrap();
    let (n_up, from_client, to_server) = bounded("up", up).await.unwrap();
    let (n_down, from_server, to_client) = bounded("down", down).await.unwrap();
    assert_eq!((n_up, n_down), (LEN as u64, LEN as u64));
    assert!(
        to_server.stats().snapshot().tx_bytes_zerocopy > 0,
        "the write half sent zero-copy"
    );
    // Halves of two streams come back; one stream's halves reunite.
    let e = from_client.reunite(to_server).unwrap_err();
    let (from_client, to_server) = (e.0, e.1);
    let client_side = from_client.reunite(to_client).expect("one stream's halves");
    assert_eq!(client_side.as_raw_fd(), client_side_fd, "the same socket");
    let server_side = from_server.reunite(to_server).expect("one stream's halves");
    assert!(server_side.local_addr().is_ok());
}

#[tokio::test]
async fn readiness_and_try_calls_move_bytes_like_tokios() {
    let (mut a, mut c) = zc_pair(ZcConfig::new()).await;
    let data = pattern_vec(0, 1 << 20);
    // Nothing to read yet: try_read says WouldBlock.
    let mut buf = vec![0u8; 64 << 10];
    assert_eq!(
        a.try_read(&mut buf).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock
    );
    let writer = async {
        let mut off = 0;
        while off < data.len() {
            c.writable().await.unwrap();
            match c.try_write(&data[off..]) {
                Ok(n) => off += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        c.shutdown().await.unwrap();
    };
    let reader = async {
        let mut v = Verifier::default();
        loop {
            let ready = a
                .ready(Interest::READABLE | Interest::WRITABLE)
                .await
                .unwrap();
            if !ready.is_readable() {
                assert!(ready.is_writable());
                a.readable().await.unwrap();
            }
            match a.try_read(&mut buf) {
                Ok(0) => break v.pos,
                Ok(n) => v.check(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
    };
    let ((), got) = bounded("try_read/try_write", async { tokio::join!(writer, reader) }).await;
    assert_eq!(got, data.len() as u64);
}

#[tokio::test]
async fn a_stream_goes_back_to_std_and_tokio_with_its_bytes_in_order() {
    let (a, c) = zc_pair(ZcConfig::new().policy(Policy::always())).await;
    let mut c = c;
    // A zero-copy send still in flight: into_std waits for its loan.
    c.send_bytes(Bytes::from(pattern_vec(0, 256 << 10)))
        .await
        .unwrap();
    let mut a = a;
    let mut head = vec![0u8; 256 << 10];
    a.read_exact(&mut head).await.unwrap();
    let std = bounded("into_std", c.into_std()).await.unwrap();
    assert!(std.peer_addr().is_ok(), "still connected");
    let mut plain = TcpStream::from_std(std).unwrap();
    plain
        .write_all(&pattern_vec(256 << 10, 256 << 10))
        .await
        .unwrap();
    let back = bounded("into_tokio", a.into_tokio()).await.unwrap();
    // The plain stream turns into a ZcStream again.
    let mut zc = ZcStream::try_from(plain).unwrap();
    zc.shutdown().await.unwrap();
    drop(zc);
    let mut v = Verifier::default();
    v.check(&head);
    let mut back = back;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = back.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        v.check(&buf[..n]);
    }
    assert_eq!(v.pos, 512 << 10, "every byte, through every conversion");
}
