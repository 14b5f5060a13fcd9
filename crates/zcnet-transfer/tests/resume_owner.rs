//! `--resume` offers a partial file's prefix hash only to a sender that proved the token
//! the partial file was started under. Without a token the owner of a partial file is only
//! an address, which anyone behind it shares (another user of the host, a NAT): such a
//! sender is offered offset 0 and no hash — it learns nothing of the partial file, whose
//! bytes are dropped and whose name is reused for the new data — and the file arrives whole
//! and byte-exact. With a token the legitimate rerun resumes: only the tail crosses the wire.
//!
//! Raw frames through [`Frame`] for the sender without a token, `zcnet`'s own sender for the
//! token's holder, against a `--once --resume` receiver ([`serve_once`]) over loopback from
//! 127.0.0.41.

use socket2::{Domain, SockAddr, Socket, Type};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;
use zcnet::{SenderConfig, TxPath};
use zcnet_testbed::pattern::pattern;
use zcnet_transfer::session::{send_session, SendOptions, Source};
use zcnet_transfer::store::{SenderId, Store, StoreOptions};
use zcnet_transfer::wire::{Code, Frame, VERSION};

mod common;
use common::{once_cfg, serve_once};

const MIB: usize = 1 << 20;

fn from() -> IpAddr {
    "127.0.0.41".parse().unwrap()
}

fn connect_from(from: IpAddr, to: SocketAddr) -> TcpStream {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.bind(&SockAddr::from(SocketAddr::new(from, 0))).unwrap();
    s.connect(&SockAddr::from(to)).unwrap();
    let t: TcpStream = s.into();
    t.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    t.set_nodelay(true).unwrap();
    t
}

fn read_frame(s: &mut TcpStream) -> Option<Frame> {
    let mut h = [0u8; 5];
    s.read_exact(&mut h).ok()?;
    let (ty, len) = Frame::check_header(h).ok()?;
    let mut p = vec![0; len];
    s.read_exact(&mut p).ok()?;
    Frame::decode(ty, &p).ok()
}

/// The owner tag a receiver gives `sender`'s partial files in `dir`.
fn owner(dir: &Path, sender: &SenderId) -> String {
    Store::open_for(dir, StoreOptions::default(), None, sender)
        .unwrap()
        .owner()
        .to_string()
}

/// Leaves what an interrupted session of `sender` would have: the first `kept` bytes of
/// `data` in a resumable partial file of `name`.
fn seed_partial(dir: &Path, sender: &SenderId, name: &str, data: &[u8], kept: usize) {
    let o = owner(dir, sender);
    std::fs::write(
        dir.join(format!("{name}.{o}.0000beef.partial")),
        &data[..kept],
    )
    .unwrap();
}

fn partials(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".partial"))
        .collect()
}

#[test]
fn without_a_token_a_sender_from_the_owners_address_is_offered_no_prefix_hash() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(41, 3 * MIB).to_vec();
    let by_address = SenderId {
        address: Some(from()),
        token: None,
    };
    // Someone's interrupted transfer from this address: its first MiB is there.
    seed_partial(dir.path(), &by_address, "secret", &data, MIB);

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut cfg = once_cfg();
    cfg.store.resume = true;
    let server = serve_once(listener, dir.path(), cfg);

    // Another sender from the same address, without a token (there is none to prove).
    let mut s = connect_from(from(), addr);
    assert!(matches!(read_frame(&mut s), Some(Frame::Hello { .. })));
    let mut hello = Frame::Hello {
        version: VERSION,
        auth: false,
        nonce: [4; 32],
    }
    .to_bytes();
    hello.extend(Frame::Open { streams: 1 }.to_bytes());
    s.write_all(&hello).unwrap();
    assert!(matches!(read_frame(&mut s), Some(Frame::Session { .. })));
    s.write_all(
        &Frame::File {
            name: "secret".into(),
            size: data.len() as u64,
            mode: 0o644,
            mtime_s: 1_700_000_000,
            mtime_ns: 0,
            verify: true,
        }
        .to_bytes(),
    )
    .unwrap();
    let ready = read_frame(&mut s);
    println!("the receiver answered a sender without the token with {ready:?}");
    match ready {
        Some(Frame::Ready {
            offset: 0,
            prefix: None,
        }) => {}
        other => panic!("a sender without the token learnt of the partial file: {other:?}"),
    }
    // It sends the whole file, which arrives byte-exact.
    let mut rest = Frame::Start { offset: 0 }.to_bytes();
    rest.extend(&data);
    rest.extend(
        Frame::Trailer {
            hash: Some(*blake3::hash(&data).as_bytes()),
        }
        .to_bytes(),
    );
    s.write_all(&rest).unwrap();
    match read_frame(&mut s) {
        Some(Frame::Ack {
            code: Code::Ok,
            bytes,
            ..
        }) => assert_eq!(bytes, data.len() as u64),
        other => panic!("{other:?}"),
    }
    s.write_all(&Frame::Bye.to_bytes()).unwrap();
    assert!(matches!(read_frame(&mut s), Some(Frame::Bye)));
    let report = server.join().unwrap().unwrap().unwrap();
    assert_eq!(report.files[0].result, Ok(()));
    assert_eq!(std::fs::read(dir.path().join("secret")).unwrap(), data);
    // The old partial file's bytes were dropped, its name reused: nothing is left over.
    assert_eq!(partials(dir.path()), Vec::<String>::new());
}

#[test]
fn the_tokens_holder_resumes_and_only_the_tail_crosses_the_wire() {
    let dir = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    let data = pattern(42, 3 * MIB).to_vec();
    let path = src.path().join("mine");
    std::fs::write(&path, &data).unwrap();
    let token = b"the holder's token".to_vec();
    let holder = SenderId {
        address: Some(from()),
        token: Some(token.clone()),
    };
    seed_partial(dir.path(), &holder, "mine", &data, MIB);

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut cfg = once_cfg();
    cfg.store.resume = true;
    cfg.token = Some(token.clone());
    let server = serve_once(listener, dir.path(), cfg);

    let mut sc = SenderConfig::new(TxPath::Copy);
    sc.timeout = Some(Duration::from_secs(20));
    let mut tx = zcnet::Sender::from_stream(connect_from(from(), addr), &sc).unwrap();
    let mut o = SendOptions::default();
    o.verify = true;
    o.token = Some(token);
    let sent = send_session(
        &mut tx,
        vec![Source::File {
            path: path.clone(),
            name: "mine".into(),
        }],
        &o,
        &mut |_| {},
    )
    .unwrap();
    server.join().unwrap().unwrap().unwrap();
    assert_eq!(sent.files[0].result, Ok(()));
    assert!(sent.files[0].verified);
    assert_eq!(
        sent.files[0].bytes,
        2 * MIB as u64,
        "only the tail crossed the wire"
    );
    assert_eq!(std::fs::read(dir.path().join("mine")).unwrap(), data);
    assert_eq!(partials(dir.path()), Vec::<String>::new());
}
