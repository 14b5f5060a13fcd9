//! The TLS 1.3 channel (issue 45) over real loopback sockets: who the sender trusts (a pinned
//! fingerprint, or the key recorded on first use), the token bound to the channel (a wrong
//! token fails both ways; a man in the middle terminating TLS on both sides fails it even
//! with the right token), tampering on the wire (a flipped ciphertext byte fails the read,
//! and no altered byte is ever delivered), and multi-MiB transfers with every byte checked.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::thread;
use zcnet_testbed::pattern::{pattern, Verifier};
use zcnet_transfer::auth::{self, Role};
use zcnet_transfer::handshake::{Accepted, HandshakeError, ReceiverHandshake};
use zcnet_transfer::tls::{Channel, Expect, Identity, Refusal, TlsError, Trust};
use zcnet_transfer::wire::{Frame, HELLO_LEN, VERSION};

fn listener() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

/// A receiver that accepts one connection with `id` and runs `then` on the channel.
fn serve<T: Send + 'static>(
    id: Identity,
    then: impl FnOnce(Channel) -> T + Send + 'static,
) -> (SocketAddr, thread::JoinHandle<Result<T, TlsError>>) {
    let (l, addr) = listener();
    let h = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        Channel::accept(s, &id).map(then)
    });
    (addr, h)
}

fn connect(addr: SocketAddr, expect: Expect) -> Result<Channel, TlsError> {
    Channel::connect(TcpStream::connect(addr).unwrap(), expect)
}

fn known_hosts(dir: &Path, host: &str) -> Expect {
    Expect::KnownHosts {
        file: dir.join("known_hosts"),
        host: host.into(),
    }
}

#[test]
fn a_pinned_fingerprint_is_accepted_and_any_other_key_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (id, _) = Identity::load_or_generate(&dir.path().join("r")).unwrap();
    let fp = id.fingerprint();
    let (addr, h) = serve(id, |mut ch| {
        let mut b = [0u8; 5];
        ch.read_exact(&mut b).map(|()| b)
    });
    let mut ch = connect(addr, Expect::Pinned(fp)).unwrap();
    assert_eq!(ch.trust(), Some(&Trust::Pinned(fp)));
    ch.write_all(b"hello").unwrap();
    assert_eq!(&h.join().unwrap().unwrap().unwrap(), b"hello");

    // Another receiver key (the pin is the first one's): refused at the sender with both
    // fingerprints, and the receiver learns it from the alert.
    let (other, _) = Identity::load_or_generate(&dir.path().join("other")).unwrap();
    let other_fp = other.fingerprint();
    let (addr, h) = serve(other, |_| ());
    let e = connect(addr, Expect::Pinned(fp)).unwrap_err();
    match &e {
        TlsError::Refused(Refusal::Pinned {
            expected,
            presented,
        }) => assert_eq!((*expected, *presented), (fp, other_fp)),
        e => panic!("{e}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains(&fp.to_string()) && msg.contains(&other_fp.to_string()),
        "{msg}"
    );
    let server = h.join().unwrap().unwrap_err();
    assert!(
        matches!(
            server,
            TlsError::PeerAlert(rustls::AlertDescription::CertificateUnknown)
        ),
        "{server}"
    );
}

#[test]
fn trust_on_first_use_records_the_key_then_refuses_a_changed_one() {
    let dir = tempfile::tempdir().unwrap();
    let (id, _) = Identity::load_or_generate(&dir.path().join("r")).unwrap();
    let fp = id.fingerprint();
    let host = "receiver.example:9000";
    let (addr, h) = serve(id, |_| ());
    let ch = connect(addr, known_hosts(dir.path(), host)).unwrap();
    assert_eq!(ch.trust(), Some(&Trust::FirstUse(fp)));
    h.join().unwrap().unwrap();
    let recorded = std::fs::read_to_string(dir.path().join("known_hosts")).unwrap();
    assert_eq!(recorded, format!("{host} {fp}\n"));

    // The same key again: known.
    let (id, _) = Identity::load_or_generate(&dir.path().join("r")).unwrap();
    let (addr, h) = serve(id, |_| ());
    let ch = connect(addr, known_hosts(dir.path(), host)).unwrap();
    assert_eq!(ch.trust(), Some(&Trust::Known(fp)));
    h.join().unwrap().unwrap();

    // A new key under the same host name: refused loudly, with both fingerprints and the
    // file; the file is not changed.
    let (new, _) = Identity::load_or_generate(&dir.path().join("new")).unwrap();
    let new_fp = new.fingerprint();
    let (addr, h) = serve(new, |_| ());
    let e = connect(addr, known_hosts(dir.path(), host)).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(&e, TlsError::Refused(Refusal::Changed { known, presented, .. }) if (*known, *presented) == (fp, new_fp)),
        "{msg}"
    );
    for want in [
        "HAS CHANGED",
        &fp.to_string(),
        &new_fp.to_string(),
        dir.path().join("known_hosts").to_str().unwrap(),
    ] {
        assert!(msg.contains(want), "{want} missing from: {msg}");
    }
    assert!(h.join().unwrap().is_err());
    assert_eq!(
        std::fs::read_to_string(dir.path().join("known_hosts")).unwrap(),
        recorded
    );
    // The new key is first use under another name.
    let (new, _) = Identity::load_or_generate(&dir.path().join("new")).unwrap();
    let (addr, h) = serve(new, |_| ());
    let ch = connect(addr, known_hosts(dir.path(), "other:1")).unwrap();
    assert_eq!(ch.trust(), Some(&Trust::FirstUse(new_fp)));
    h.join().unwrap().unwrap();
}

/// The receiver's half of the transfer handshake over a channel, proofs bound to it: what
/// `session`/`server` run once wired (issue 45). Refusals go back to the sender.
fn receiver_handshake(ch: &mut Channel, token: &[u8]) -> Result<Accepted, HandshakeError> {
    let mut hs = ReceiverHandshake::new(Some(token.to_vec()))
        .unwrap()
        .bound_to_channel(*ch.binding());
    ch.write_all(&hs.greeting()).unwrap();
    let result = loop {
        let want = hs.want();
        let n = want.len();
        if ch.read_exact(want).is_err() {
            break Err(HandshakeError::AuthFailed);
        }
        match hs.advance(n) {
            Ok(Some(a)) => break Ok(a),
            Ok(None) => {}
            Err(e) => break Err(e),
        }
    };
    match &result {
        Ok(a) => ch.write_all(a.reply.as_ref().unwrap()).unwrap(),
        Err(e) => {
            if let Some(f) = e.refusal() {
                let _ = ch.write_all(&f.to_bytes());
            }
        }
    }
    result
}

fn read_frame(ch: &mut Channel) -> Result<Frame, String> {
    let mut head = [0u8; 5];
    ch.read_exact(&mut head).map_err(|e| e.to_string())?;
    let len = u32::from_be_bytes(head[1..].try_into().unwrap()) as usize;
    let mut body = vec![0u8; len];
    ch.read_exact(&mut body).map_err(|e| e.to_string())?;
    Frame::decode(head[0], &body).map_err(|e| e.to_string())
}

/// The sender's half (as `session::send_handshake` does it, with the bound transcript).
/// `Err` says why the sender gives up.
fn sender_handshake(ch: &mut Channel, token: &[u8]) -> Result<(), String> {
    let mut receiver_hello = [0u8; 5 + HELLO_LEN];
    ch.read_exact(&mut receiver_hello)
        .map_err(|e| e.to_string())?;
    let sender_hello = Frame::Hello {
        version: VERSION,
        auth: true,
        nonce: auth::nonce().unwrap(),
    }
    .to_bytes();
    let open = Frame::Open { streams: 1 }.to_bytes();
    let t = auth::bound_transcript(ch.binding(), &receiver_hello, &sender_hello, &open);
    let mac = auth::prove(token, Role::Sender, &t);
    let mut out = sender_hello.clone();
    out.extend(Frame::Auth { mac }.to_bytes());
    out.extend(&open);
    ch.write_all(&out).map_err(|e| e.to_string())?;
    match read_frame(ch)? {
        Frame::Auth { mac } if auth::verify(token, Role::Receiver, &t, &mac) => Ok(()),
        Frame::Auth { .. } => Err("the receiver could not prove it knows the token".into()),
        Frame::Refuse { message, .. } => Err(format!("refused: {message}")),
        f => Err(format!("unexpected {f:?}")),
    }
}

#[test]
fn the_token_proofs_pass_over_one_channel_and_a_wrong_token_fails_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let (id, _) = Identity::load_or_generate(dir.path()).unwrap();
    let fp = id.fingerprint();
    let run = move |id: Identity, receiver_token: &'static [u8], sender_token: &'static [u8]| {
        let (addr, h) = serve(id, move |mut ch| {
            receiver_handshake(&mut ch, receiver_token)
        });
        let mut ch = connect(addr, Expect::Pinned(fp)).unwrap();
        let sent = sender_handshake(&mut ch, sender_token);
        (sent, h.join().unwrap().unwrap())
    };
    let id = || Identity::load_or_generate(dir.path()).unwrap().0;
    let (sent, got) = run(id(), b"right", b"right");
    assert_eq!(sent, Ok(()));
    assert!(got.unwrap().authenticated);
    // The sender has the wrong token: the receiver refuses its proof, the sender is told.
    let (sent, got) = run(id(), b"right", b"wrong");
    assert_eq!(got.unwrap_err(), HandshakeError::AuthFailed);
    let why = sent.unwrap_err();
    assert!(why.contains("wrong or missing token"), "{why}");
    // The receiver has the wrong token: it refuses the sender's proof (it cannot tell
    // which side is wrong), and the sender gets no proof from it.
    let (sent, got) = run(id(), b"wrong", b"right");
    assert_eq!(got.unwrap_err(), HandshakeError::AuthFailed);
    assert!(sent.is_err());
}

/// A receiver that answers with a proof under another token: the sender's own check
/// refuses it (the other direction of "both ways").
#[test]
fn a_receiver_proof_under_another_token_is_refused_by_the_sender() {
    let dir = tempfile::tempdir().unwrap();
    let (id, _) = Identity::load_or_generate(dir.path()).unwrap();
    let fp = id.fingerprint();
    let (addr, h) = serve(id, |mut ch| {
        // Accepts whatever the sender proves, and proves with the wrong token.
        let greeting = Frame::Hello {
            version: VERSION,
            auth: true,
            nonce: [9; 32],
        }
        .to_bytes();
        ch.write_all(&greeting).unwrap();
        let mut sender_hello = [0u8; 5 + HELLO_LEN];
        ch.read_exact(&mut sender_hello).unwrap();
        let mut auth_and_open = [0u8; 5 + 32 + 5 + 2];
        ch.read_exact(&mut auth_and_open).unwrap();
        let t =
            auth::bound_transcript(ch.binding(), &greeting, &sender_hello, &auth_and_open[37..]);
        let mac = auth::prove(b"not the token", Role::Receiver, &t);
        ch.write_all(&Frame::Auth { mac }.to_bytes()).unwrap();
    });
    let mut ch = connect(addr, Expect::Pinned(fp)).unwrap();
    let why = sender_handshake(&mut ch, b"the token").unwrap_err();
    assert!(why.contains("could not prove"), "{why}");
    h.join().unwrap().unwrap();
}

/// Reads one transfer-handshake frame from `from` and writes it to `to`, as it came.
fn relay_frame(from: &mut Channel, to: &mut Channel, len: usize) {
    let mut b = vec![0u8; len];
    from.read_exact(&mut b).unwrap();
    to.write_all(&b).unwrap();
}

#[test]
fn a_man_in_the_middle_terminating_tls_on_both_sides_fails_the_token_proof() {
    let dir = tempfile::tempdir().unwrap();
    let (id, _) = Identity::load_or_generate(&dir.path().join("r")).unwrap();
    let (receiver_addr, receiver) = serve(id, |mut ch| receiver_handshake(&mut ch, b"token"));
    // The proxy: TLS server to the sender with a key of its own, TLS client to the real
    // receiver; it relays every handshake frame unchanged.
    let (proxy_id, _) = Identity::load_or_generate(&dir.path().join("proxy")).unwrap();
    let proxy_kh = dir.path().join("proxy");
    let (proxy_addr, proxy) = serve(proxy_id, move |mut to_sender| {
        let mut to_receiver = connect(
            receiver_addr,
            Expect::KnownHosts {
                file: proxy_kh.join("kh"),
                host: "r".into(),
            },
        )
        .unwrap();
        relay_frame(&mut to_receiver, &mut to_sender, 5 + HELLO_LEN);
        relay_frame(
            &mut to_sender,
            &mut to_receiver,
            5 + HELLO_LEN + 5 + 32 + 5 + 2,
        );
        // The receiver's answer: a refusal (its header says how long).
        let mut head = [0u8; 5];
        to_receiver.read_exact(&mut head).unwrap();
        let len = u32::from_be_bytes(head[1..].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len];
        to_receiver.read_exact(&mut body).unwrap();
        to_sender.write_all(&head).unwrap();
        to_sender.write_all(&body).unwrap();
        head[0]
    });
    // The sender meets the proxy first (trust on first use records the proxy's key: what
    // TOFU cannot catch, and the token must).
    let mut ch = connect(proxy_addr, known_hosts(dir.path(), "r")).unwrap();
    assert!(matches!(ch.trust(), Some(Trust::FirstUse(_))));
    let why = sender_handshake(&mut ch, b"token").unwrap_err();
    assert!(why.contains("wrong or missing token"), "{why}");
    assert_eq!(
        receiver.join().unwrap().unwrap().unwrap_err(),
        HandshakeError::AuthFailed
    );
    assert_eq!(
        proxy.join().unwrap().unwrap(),
        5 // Refuse
    );
}

/// A TCP proxy copying both ways, flipping the byte at `flip` of the sender-to-receiver
/// stream.
fn flipping_proxy(upstream: SocketAddr, flip: u64) -> (SocketAddr, thread::JoinHandle<()>) {
    let (l, addr) = listener();
    let h = thread::spawn(move || {
        let (down, _) = l.accept().unwrap();
        let up = TcpStream::connect(upstream).unwrap();
        let (mut d2, mut u2) = (down.try_clone().unwrap(), up.try_clone().unwrap());
        let back = thread::spawn(move || {
            let _ = std::io::copy(&mut u2, &mut d2);
            let _ = d2.shutdown(std::net::Shutdown::Write);
        });
        let (mut down, mut up) = (down, up);
        let mut pos = 0u64;
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match down.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if (pos..pos + n as u64).contains(&flip) {
                buf[(flip - pos) as usize] ^= 0x01;
            }
            pos += n as u64;
            if up.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = up.shutdown(std::net::Shutdown::Write);
        let _ = back.join();
    });
    (addr, h)
}

#[test]
fn a_flipped_ciphertext_byte_fails_the_read_at_both_ends_and_no_altered_byte_is_delivered() {
    const LEN: usize = 4 << 20;
    let dir = tempfile::tempdir().unwrap();
    let (id, _) = Identity::load_or_generate(dir.path()).unwrap();
    let fp = id.fingerprint();
    let (receiver_addr, receiver) = serve(id, |mut ch| {
        let mut v = Verifier::default();
        let got = ch.recv_with(LEN as u64, |b| {
            v.check(b);
            Ok(())
        });
        (got, v.pos)
    });
    // 1 MiB into the stream: past the handshake, inside a data record.
    let (proxy_addr, proxy) = flipping_proxy(receiver_addr, 1 << 20);
    let mut ch = connect(proxy_addr, Expect::Pinned(fp)).unwrap();
    let sent = ch.write_all(pattern(0, LEN)).and_then(|()| {
        let mut ack = [0u8; 1];
        ch.read_exact(&mut ack)
    });
    let (got, delivered) = receiver.join().unwrap().unwrap();
    let e = got.unwrap_err();
    assert!(matches!(e, TlsError::Tampered(_)), "{e}");
    assert!(e.to_string().contains("changed on the way"), "{e}");
    // Every byte delivered was checked against the pattern (the Verifier panics on a wrong
    // one), and delivery stopped before the altered record.
    assert!(delivered < 1 << 20, "{delivered}");
    // The sender fails too: the receiver's alert, or the connection dropped under it.
    let e = sent.unwrap_err();
    assert!(
        matches!(
            e,
            TlsError::PeerAlert(rustls::AlertDescription::BadRecordMac) | TlsError::Io { .. }
        ),
        "{e}"
    );
    // The proxy copies until the sender's side closes.
    drop(ch);
    proxy.join().unwrap();
}

#[test]
fn a_multi_mib_transfer_arrives_whole_both_ways() {
    const LEN: u64 = 24 << 20;
    let dir = tempfile::tempdir().unwrap();
    let (id, _) = Identity::load_or_generate(dir.path()).unwrap();
    let fp = id.fingerprint();
    let (addr, h) = serve(id, |mut ch| {
        let mut v = Verifier::default();
        let got = ch
            .recv_with(LEN, |b| {
                v.check(b);
                Ok(())
            })
            .unwrap();
        // And back, through `read`/`write_all`.
        let mut back = vec![0u8; 3 << 20];
        let mut reply = Verifier::default();
        for _ in 0..2 {
            ch.read_exact(&mut back).unwrap();
            reply.check(&back);
        }
        ch.write_all(pattern(0, 6 << 20)).unwrap();
        // The sender's close_notify: a clean end.
        assert_eq!(ch.read(&mut back).unwrap(), 0);
        assert!(ch.peer_closed());
        ch.close().unwrap();
        (got, v.pos)
    });
    let mut ch = connect(addr, Expect::Pinned(fp)).unwrap();
    let mut pos = 0u64;
    while pos < LEN {
        let n = (LEN - pos).min(5 << 20) as usize;
        ch.write_all(pattern(pos, n)).unwrap();
        pos += n as u64;
    }
    ch.write_all(pattern(0, 6 << 20)).unwrap();
    let mut back = vec![0u8; 6 << 20];
    ch.read_exact(&mut back).unwrap();
    Verifier::default().check(&back);
    ch.close().unwrap();
    assert_eq!(h.join().unwrap().unwrap(), (LEN, LEN));
}

#[test]
fn a_connection_cut_without_close_notify_reads_as_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let (id, _) = Identity::load_or_generate(dir.path()).unwrap();
    let fp = id.fingerprint();
    let (addr, h) = serve(id, |mut ch| {
        let mut b = vec![0u8; 2 << 20];
        ch.read_exact(&mut b)
    });
    let mut ch = connect(addr, Expect::Pinned(fp)).unwrap();
    ch.write_all(pattern(0, 1 << 20)).unwrap();
    // The sender's socket closes under it: no close_notify.
    ch.socket().shutdown(std::net::Shutdown::Both).unwrap();
    drop(ch);
    let e = h.join().unwrap().unwrap().unwrap_err();
    assert!(matches!(e, TlsError::Truncated), "{e}");
}

/// A peer without encryption is told apart from a broken one: a plaintext zcnet receiver's
/// `Hello` at a sender expecting TLS, and a plaintext `Hello` at a TLS receiver, both end
/// the handshake with "does not speak TLS", never a session in the clear.
#[test]
fn a_peer_speaking_the_protocol_in_plaintext_is_refused_as_not_tls() {
    let hello = Frame::Hello {
        version: VERSION,
        auth: false,
        nonce: [7; 32],
    }
    .to_bytes();
    let (l, addr) = listener();
    let h = thread::spawn({
        let hello = hello.clone();
        move || {
            let (mut s, _) = l.accept().unwrap();
            s.write_all(&hello).unwrap();
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
        }
    });
    let e = connect(
        addr,
        Expect::Pinned(zcnet_transfer::tls::Fingerprint([0; 32])),
    )
    .unwrap_err();
    assert!(matches!(e, TlsError::NotTls(_)), "{e}");
    assert!(e.to_string().contains("does not speak TLS"), "{e}");
    h.join().unwrap();

    let (addr, h) = serve(Identity::generate().unwrap(), |_| ());
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&hello).unwrap();
    let e = h.join().unwrap().unwrap_err();
    assert!(matches!(e, TlsError::NotTls(_)), "{e}");
}
