//! `recv_zc` hands out every byte in order — mapped pages where the kernel can map them,
//! copies where it cannot — on loopback and across namespaces, mixed with `AsyncRead`, to
//! the end of the stream; and a reset is an error, not an end.

mod common;

use common::pattern_vec;
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use zcnet_testbed::pattern::Verifier;
use zcnet_testbed::topo::{veth_pair, Topo};
use zcnet_tokio::{ZcConfig, ZcStream};

/// A plain tokio sender from the topology's sending side, with `mss` if given, and the
/// receiving `ZcStream`.
async fn receiving_pair(topo: Topo<'_>, mss: Option<u32>) -> (TcpStream, ZcStream) {
    // The receiver's MSS is what it advertises: page-multiple segments arrive page-aligned.
    let l = topo.on_receiver(|| {
        let l = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        if let Some(m) = mss {
            l.set_tcp_mss(m).unwrap();
        }
        l.bind(&topo.receiver_addr(0).into()).unwrap();
        l.listen(8).unwrap();
        l.set_nonblocking(true).unwrap();
        std::net::TcpListener::from(l)
    });
    let l = tokio::net::TcpListener::from_std(l).unwrap();
    let addr: SocketAddr = l.local_addr().unwrap();
    let s = topo.on_sender(|| {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.connect(&addr.into()).unwrap();
        s.set_nonblocking(true).unwrap();
        std::net::TcpStream::from(s)
    });
    let (r, _) = l.accept().await.unwrap();
    (
        TcpStream::from_std(s).unwrap(),
        ZcStream::from_tokio(r, ZcConfig::new()).unwrap(),
    )
}

/// Sends with `MSG_ZEROCOPY`: on loopback and veth only such a sender's data arrives in
/// mappable pages (local delivery copies it into fresh order-0 pages; a plain `send`'s
/// data sits in compound pages that cannot be mapped).
async fn send_pattern_zc(s: TcpStream, total: u64) {
    let mut s = ZcStream::from_tokio(s, ZcConfig::new().policy(zcnet::Policy::always())).unwrap();
    let mut pos = 0;
    while pos < total {
        let n = (1u64 << 20).min(total - pos);
        s.send_bytes(pattern_vec(pos, n as usize).into())
            .await
            .unwrap();
        pos += n;
    }
    s.flush_loans().await.unwrap();
    s.shutdown().await.unwrap();
}

async fn send_pattern(mut s: TcpStream, total: u64) {
    let mut pos = 0;
    while pos < total {
        let n = (1u64 << 20).min(total - pos);
        s.write_all(&pattern_vec(pos, n as usize)).await.unwrap();
        pos += n;
    }
    s.shutdown().await.unwrap();
}

/// Receives to the end, alternating `recv_zc` and `read` when `mixed`; checks every byte.
async fn receive_all(r: &mut ZcStream, mixed: bool) -> (u64, u64) {
    let mut v = Verifier::default();
    let mut buf = vec![0u8; 100_000];
    let mut mapped_chunks = 0;
    let mut i = 0u64;
    loop {
        i += 1;
        if mixed && i.is_multiple_of(3) {
            let n = r.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            v.check(&buf[..n]);
            continue;
        }
        match r.recv_zc().await.unwrap() {
            None => break,
            Some(chunk) => {
                assert!(!chunk.is_empty());
                mapped_chunks += chunk.is_mapped() as u64;
                v.check(&chunk);
            }
        }
    }
    (v.pos, mapped_chunks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recv_zc_maps_a_zero_copy_senders_pages_on_loopback() {
    let total = 64u64 << 20;
    let (s, mut r) = receiving_pair(Topo::Loopback, None).await;
    let sender = tokio::spawn(send_pattern_zc(s, total));
    let (got, mapped_chunks) = receive_all(&mut r, false).await;
    sender.await.unwrap();
    assert_eq!(got, total);
    let st = r.stats().snapshot();
    assert_eq!(st.rx_bytes(), total, "{st}");
    assert!(
        mapped_chunks > 0 && st.rx_bytes_mapped > 0,
        "nothing mapped: {st}"
    );
    eprintln!(
        "loopback recv_zc from send_bytes: {st}; mapped {:.1}%",
        100.0 * st.rx_mapped_fraction()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recv_zc_stops_asking_when_nothing_maps_and_loses_nothing() {
    // A plain sender's data never maps on loopback: recv_zc demotes itself to recv.
    let total = 64u64 << 20;
    let (s, mut r) = receiving_pair(Topo::Loopback, None).await;
    let sender = tokio::spawn(send_pattern(s, total));
    let (got, _) = receive_all(&mut r, false).await;
    sender.await.unwrap();
    assert_eq!(got, total);
    let st = r.stats().snapshot();
    assert_eq!(st.rx_bytes(), total, "{st}");
    assert!(
        st.fallback_bytes(zcnet::FallbackReason::DemotedUnmapped) > 0,
        "{st}"
    );
    eprintln!("loopback recv_zc from a plain sender: {st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recv_zc_and_read_mixed_every_byte() {
    let total = 32u64 << 20;
    let (s, mut r) = receiving_pair(Topo::Loopback, None).await;
    let sender = tokio::spawn(send_pattern_zc(s, total));
    let (got, _) = receive_all(&mut r, true).await;
    sender.await.unwrap();
    assert_eq!(got, total);
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recv_zc_maps_pages_across_namespaces_with_a_page_multiple_mss() {
    let veth = veth_pair(9000);
    let mss = zcnet::policy::page_multiple_mss(9000, false, true, 4096).unwrap();
    let total = 64u64 << 20;
    let (s, mut r) = receiving_pair(Topo::Netns(&veth), Some(mss)).await;
    let sender = tokio::spawn(send_pattern_zc(s, total));
    let (got, mapped_chunks) = receive_all(&mut r, false).await;
    sender.await.unwrap();
    assert_eq!(got, total);
    let st = r.stats().snapshot();
    assert!(
        mapped_chunks > 0 && st.rx_bytes_mapped > 0,
        "nothing mapped: {st}"
    );
    eprintln!(
        "netns recv_zc (MSS {mss}): {st}; mapped {:.1}%",
        100.0 * st.rx_mapped_fraction()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_is_an_error_not_an_end() {
    let (s, mut r) = receiving_pair(Topo::Loopback, None).await;
    let mut s = s;
    s.write_all(&pattern_vec(0, 1 << 20)).await.unwrap();
    s.set_zero_linger().unwrap();
    drop(s);
    let mut v = Verifier::default();
    let err = loop {
        match r.recv_zc().await {
            Ok(Some(c)) => v.check(&c),
            Ok(None) => panic!("a reset reported as the end of the stream"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
}
