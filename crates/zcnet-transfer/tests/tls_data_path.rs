//! The encrypted data path (issue 45) over real loopback sockets: records sealed straight
//! into the loan buffers a `zcnet::Sender` sends (every byte checked at the receiver, on
//! the copy and the zero-copy path), and the hand-over of the keys to the kernel (kTLS):
//! each TLS 1.3 suite's secrets in the kernel's form, equal at both ends, and on a kernel
//! without the `tls` module the typed reason with the channel left working in user space.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use zcnet::{SenderConfig, TxPath};
use zcnet_sys::raw::ktls::KtlsError;
use zcnet_testbed::pattern::{pattern, Verifier};
use zcnet_transfer::tls::ktls::{self, Declined, Offload};
use zcnet_transfer::tls::{Channel, Expect, Identity, SealedSender, TlsError};

fn pair(id: Identity) -> (Channel, thread::JoinHandle<Channel>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr: SocketAddr = l.local_addr().unwrap();
    let fp = id.fingerprint();
    let h = thread::spawn(move || Channel::accept(l.accept().unwrap().0, &id).unwrap());
    let ch = Channel::connect(TcpStream::connect(addr).unwrap(), Expect::Pinned(fp)).unwrap();
    (ch, h)
}

fn identity() -> Identity {
    Identity::generate().unwrap()
}

#[test]
fn records_sealed_into_loan_buffers_arrive_whole_on_the_copy_and_zero_copy_paths() {
    const LEN: u64 = 20 << 20;
    for path in [TxPath::Copy, TxPath::Zerocopy] {
        let (ch, server) = pair(identity());
        let receiver = thread::spawn(move || {
            let mut ch = server.join().unwrap();
            let mut v = Verifier::default();
            let got = ch
                .recv_with(LEN, |b| {
                    v.check(b);
                    Ok(())
                })
                .unwrap();
            ch.write_all(b"k").unwrap();
            // The sender's close_notify comes behind the data: a clean end.
            let mut rest = [0u8; 1];
            assert_eq!(ch.read(&mut rest).unwrap(), 0);
            (got, v.pos)
        });
        let mut cfg = SenderConfig::new(path);
        cfg.buf_bytes = 256 << 10;
        let mut tx = SealedSender::new(ch, &cfg).unwrap();
        // Uneven pieces, so records and loan buffers never line up with them.
        let mut pos = 0u64;
        let mut piece = 1usize;
        while pos < LEN {
            let n = ((LEN - pos) as usize).min(piece);
            tx.send(pattern(pos, n)).unwrap();
            pos += n as u64;
            piece = (piece * 7 + 13) % (3 << 20) + 1;
        }
        assert_eq!(tx.sealed(), LEN);
        let mut ack = [0u8; 1];
        tx.read_exact(&mut ack).unwrap();
        assert_eq!(&ack, b"k");
        let st = tx.finish().unwrap();
        assert_eq!(receiver.join().unwrap(), (LEN, LEN), "{path:?}");
        // Every byte went from the loans: the ciphertext (plaintext plus 22 bytes per
        // record of at most 16 KiB), counted by the sender's paths.
        let sent = st.tx_bytes_zerocopy + st.tx_bytes_copy;
        let records = LEN.div_ceil(16 << 10);
        assert!(sent >= LEN + 22 * records, "{path:?}: {sent} bytes sent");
        if path == TxPath::Zerocopy {
            assert!(
                st.tx_bytes_zerocopy > 0 || !st.fallbacks.is_empty(),
                "the zerocopy path neither lent nor counted a fallback: {st:?}"
            );
        }
    }
}

#[test]
fn aes_128_gcm_is_chosen_when_both_ends_offer_every_suite() {
    let (c, s) = pair(identity());
    let s = s.join().unwrap();
    let want = Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    assert_eq!((c.suite(), s.suite()), (want, want));
}

/// Each suite rustls offers: the kernel form of the secrets the sender sends with is the
/// receiver's receive form, and the other way round (same key, IV, sequence).
#[test]
fn each_suites_secrets_take_the_kernels_form_equal_at_both_ends() {
    use rustls::CipherSuite as S;
    for (suite, cipher) in [
        (S::TLS13_AES_128_GCM_SHA256, "AES-128-GCM"),
        (S::TLS13_AES_256_GCM_SHA384, "AES-256-GCM"),
        (S::TLS13_CHACHA20_POLY1305_SHA256, "ChaCha20-Poly1305"),
    ] {
        let id = identity();
        let fp = id.fingerprint();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let h = thread::spawn(move || Channel::accept(l.accept().unwrap().0, &id).unwrap());
        let c = Channel::connect_with_suites(
            TcpStream::connect(addr).unwrap(),
            Expect::Pinned(fp),
            &[suite],
        )
        .unwrap();
        let s = h.join().unwrap();
        assert_eq!((c.suite(), s.suite()), (Some(suite), Some(suite)));
        let (ctx, crx) = ktls::crypto_infos(&c.dangerous_extract_secrets().unwrap()).unwrap();
        let (stx, srx) = ktls::crypto_infos(&s.dangerous_extract_secrets().unwrap()).unwrap();
        assert_eq!(ctx, srx, "{cipher}");
        assert_eq!(crx, stx, "{cipher}");
        assert_ne!(ctx, crx, "{cipher}: each direction has its own key");
        assert_eq!(ctx.cipher_name(), cipher);
    }
}

/// Offloading tries `TCP_ULP "tls"` on the live socket first. Where the kernel has no `tls`
/// module (this machine: `tcp_available_ulp` lists only `mptcp`) the channel comes back
/// with the typed reason and still carries every byte in user space; where it has it, the
/// kernel encrypts and decrypts and the bytes arrive the same.
#[test]
fn offloading_to_the_kernel_falls_back_with_its_reason_or_runs_in_the_kernel() {
    const LEN: usize = 6 << 20;
    let (c, server) = pair(identity());
    let s = server.join().unwrap();
    let listed = zcnet_sys::raw::ktls::available_ulps().unwrap();
    match (ktls::offload(c).unwrap(), ktls::offload(s).unwrap()) {
        (Offload::User(mut c, why), Offload::User(mut s, why_s)) => {
            assert!(
                !listed.split_whitespace().any(|u| u == "tls"),
                "fell back although tls is listed: {why}"
            );
            for w in [&why, &why_s] {
                assert!(
                    matches!(w, Declined::Kernel(KtlsError::NoModule { .. })),
                    "{w}"
                );
                assert!(w.to_string().starts_with("kTLS unavailable:"), "{w}");
            }
            let h = thread::spawn(move || {
                let mut v = Verifier::default();
                s.recv_with(LEN as u64, |b| {
                    v.check(b);
                    Ok(())
                })
                .map(|n| (n, v.pos))
            });
            c.write_all(pattern(0, LEN)).unwrap();
            assert_eq!(h.join().unwrap().unwrap(), (LEN as u64, LEN as u64));
        }
        (Offload::Kernel(mut c), Offload::Kernel(mut s)) => {
            use std::io::{Read, Write};
            assert_eq!(c.cipher(), s.cipher());
            let h = thread::spawn(move || {
                let mut v = Verifier::default();
                let mut buf = vec![0u8; 1 << 20];
                while (v.pos as usize) < LEN {
                    let n = s.read(&mut buf).unwrap();
                    assert!(n > 0, "early end at {}", v.pos);
                    v.check(&buf[..n]);
                }
                v.pos
            });
            // Half written, half by sendfile from a file: the kernel encrypts both.
            c.write_all(pattern(0, LEN / 2)).unwrap();
            let mut f = tempfile::tempfile().unwrap();
            f.write_all(pattern(LEN as u64 / 2, LEN / 2)).unwrap();
            assert_eq!(c.send_file(&f, 0, LEN as u64 / 2).unwrap(), LEN as u64 / 2);
            assert_eq!(h.join().unwrap(), LEN as u64);
        }
        _ => panic!("the two ends of one loopback pair got different answers"),
    }
}

/// Bytes rustls (or the channel's read-ahead) already holds would never reach the kernel:
/// the offload is declined before the socket is touched, with that reason, and the channel
/// comes back whole — the held bytes and every later one still read through it.
#[test]
fn offloading_a_channel_that_holds_bytes_is_declined_and_the_channel_still_works() {
    const LEN: usize = 3 << 20;
    let (mut c, server) = pair(identity());
    // The server speaks first: the client's first read takes in more than it returns.
    let writer = thread::spawn(move || {
        let mut s = server.join().unwrap();
        s.write_all(pattern(0, LEN)).unwrap();
        s
    });
    let mut first = [0u8; 1];
    c.read_exact(&mut first).unwrap();
    let mut v = Verifier::default();
    v.check(&first);
    let Offload::User(c, why) = ktls::offload(c).unwrap() else {
        panic!("a channel holding bytes went to the kernel")
    };
    assert!(matches!(why, Declined::Held(_)), "{why}");
    assert!(why.to_string().starts_with("kTLS not attempted:"), "{why}");
    let mut c = *c;
    let got = c
        .recv_with(LEN as u64 - 1, |b| {
            v.check(b);
            Ok(())
        })
        .unwrap();
    assert_eq!((got, v.pos), (LEN as u64 - 1, LEN as u64));
    drop(writer.join().unwrap());
}

/// The kernel half of `offloading_to_the_kernel_falls_back_with_its_reason_or_runs_in_the_kernel`
/// on its own: where the build found the `tls` ULP
/// loaded, both ends of a loopback pair are offloaded.
#[cfg_attr(
    not(zcnet_has_ktls),
    ignore = "needs the kernel's TLS ULP loaded (modprobe tls; tcp_available_ulp lists tls)"
)]
#[test]
fn where_the_tls_ulp_is_loaded_both_ends_run_in_the_kernel() {
    let (c, server) = pair(identity());
    let s = server.join().unwrap();
    match (ktls::offload(c).unwrap(), ktls::offload(s).unwrap()) {
        (Offload::Kernel(c), Offload::Kernel(s)) => assert_eq!(c.cipher(), s.cipher()),
        (Offload::User(_, why), _) | (_, Offload::User(_, why)) => {
            panic!("the tls ULP, which the build found, refused: {why}")
        }
    }
}

#[test]
fn a_peer_that_closes_during_the_handshake_is_a_typed_error() {
    // A peer that closes instead of answering the ClientHello: the handshake error, typed.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let h = thread::spawn(move || drop(l.accept().unwrap()));
    let e = Channel::connect(
        TcpStream::connect(addr).unwrap(),
        Expect::Pinned(identity().fingerprint()),
    )
    .unwrap_err();
    h.join().unwrap();
    assert!(
        matches!(e, TlsError::HandshakeEof | TlsError::Io { .. }),
        "{e}"
    );
}

/// A connection with records still queued to send (or plaintext not yet read) is declined
/// before `TCP_ULP` is tried, and handed back as it was: the kernel would never see them.
#[test]
fn a_connection_with_queued_records_or_unread_plaintext_is_handed_back() {
    use rustls::{ClientConnection, ServerConnection};
    use std::io::Write;
    let id = identity();
    let (ccfg, _) =
        zcnet_transfer::tls::client_config(Expect::Pinned(id.fingerprint()), &[]).unwrap();
    let mut c = ClientConnection::new(ccfg, "zcnet".try_into().unwrap()).unwrap();
    let mut s = ServerConnection::new(zcnet_transfer::tls::server_config(&id).unwrap()).unwrap();
    while c.is_handshaking() || s.is_handshaking() || c.wants_write() || s.wants_write() {
        let mut b = Vec::new();
        c.write_tls(&mut b).unwrap();
        s.read_tls(&mut &b[..]).unwrap();
        s.process_new_packets().unwrap();
        b.clear();
        s.write_tls(&mut b).unwrap();
        c.read_tls(&mut &b[..]).unwrap();
        c.process_new_packets().unwrap();
    }
    // Any connected socket: nothing may be done to it.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let sock = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    s.writer().write_all(b"queued").unwrap();
    let mut b = Vec::new();
    let s = match ktls::hand_over(s.into(), &sock).unwrap() {
        ktls::HandOver::User(conn, Declined::Held(why)) => {
            assert!(why.contains("records to send"), "{why}");
            conn
        }
        other => panic!("queued records not refused: {other:?}"),
    };
    let mut s = s;
    s.write_tls(&mut b).unwrap();
    c.read_tls(&mut &b[..]).unwrap();
    c.process_new_packets().unwrap();
    match ktls::hand_over(c.into(), &sock).unwrap() {
        ktls::HandOver::User(mut conn, Declined::Held(why)) => {
            assert!(why.contains("plaintext"), "{why}");
            let mut got = [0u8; 6];
            std::io::Read::read_exact(&mut conn.reader(), &mut got).unwrap();
            assert_eq!(&got, b"queued");
        }
        other => panic!("unread plaintext not refused: {other:?}"),
    }
}
