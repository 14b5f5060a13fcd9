//! The window of pipelined files never deadlocks, however little the socket buffers hold
//! and however slowly the receiver's disk syncs: with the smallest buffers the kernel allows
//! on both ends (so a window's answers no longer fit in them), the largest window, long
//! refusal messages in the answers, and the receiver writing to the real disk (each batch's
//! `fsync`s wait for it), a tree still arrives whole and verified, each refusal in its place.

use std::fs::File;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;
use zcnet::{ReceiverConfig, RxPath, SenderConfig, TxPath};
use zcnet_testbed::pattern::pattern;
use zcnet_transfer::session::{
    receive_session, send_session, RecvOptions, SendOptions, Source, MAX_WINDOW,
};
use zcnet_transfer::store::{Store, StoreOptions};
use zcnet_transfer::wire::{Code, VERSION};

/// The smallest send and receive buffers the kernel gives (it raises a request of 1 to
/// its minimum, socket(7)).
fn tiny_buffers(s: &impl AsFd) {
    let s = socket2::SockRef::from(s);
    s.set_recv_buffer_size(1).unwrap();
    s.set_send_buffer_size(1).unwrap();
}

fn hash(path: &Path) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    std::io::copy(&mut File::open(path).unwrap(), &mut h).unwrap();
    *h.finalize().as_bytes()
}

#[test]
fn a_full_window_with_tiny_buffers_and_a_disk_that_syncs_slowly_still_finishes_verified() {
    // tempfile's default directory (/tmp) is on the real disk here; the test holds on tmpfs
    // too, with only the tiny buffers to stall the answers.
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    // Long names, so each refusal's answer carries a long message.
    let long = "n".repeat(200);
    let files: Vec<(String, PathBuf)> = (0..400)
        .map(|i| {
            let name = format!("d{}/{long}{i:04}", i % 4);
            let p = src.path().join(&name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            File::create(&p)
                .unwrap()
                .write_all(pattern(i as u64 + 7, 1000 + (i * 37) % 3000))
                .unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
            (name, p)
        })
        .collect();
    // Every third name is already at the receiver: refused as existing, with its name.
    for (name, _) in files.iter().step_by(3) {
        let p = dst.path().join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b"older").unwrap();
    }

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    tiny_buffers(&listener);
    let addr: SocketAddr = listener.local_addr().unwrap();
    let dir = dst.path().to_path_buf();
    let receiver = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        tiny_buffers(&s);
        let mut cfg = ReceiverConfig::new(RxPath::Copy);
        cfg.timeout = Some(Duration::from_secs(60)); // a hang guard: a deadlock fails here
        let mut rx = zcnet::Receiver::from_stream(s, &cfg).unwrap();
        tiny_buffers(&rx.socket());
        let mut store = Store::open(&dir, StoreOptions::default()).unwrap();
        receive_session(&mut rx, &mut store, &RecvOptions::default(), &mut |_| {})
    });

    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    tiny_buffers(&sock);
    sock.connect(&addr.into()).unwrap();
    let mut cfg = SenderConfig::new(TxPath::Copy);
    cfg.timeout = Some(Duration::from_secs(60)); // a hang guard, as above
    let mut tx = zcnet::Sender::from_stream(TcpStream::from(sock), &cfg).unwrap();
    tiny_buffers(&tx.socket());
    let mut o = SendOptions::default();
    o.verify = true;
    o.window = MAX_WINDOW;
    o.max_version = VERSION;
    let sources = files
        .iter()
        .map(|(n, p)| Source::File {
            path: p.clone(),
            name: n.clone(),
        })
        .collect();
    let sent = send_session(&mut tx, sources, &o, &mut |_| {}).expect("the sender finishes");
    let got = receiver.join().unwrap().expect("the receiver finishes");
    assert_eq!(sent.files.len(), files.len());
    assert_eq!(got.files.len(), files.len());
    for (i, (f, (name, p))) in sent.files.iter().zip(&files).enumerate() {
        assert_eq!(&f.name, name, "answers in sending order");
        let at = dst.path().join(name);
        if i % 3 == 0 {
            match &f.result {
                Err((Code::Exists, m)) => assert!(m.contains(&long), "{m}"),
                other => panic!("{name}: {other:?}"),
            }
            assert_eq!(std::fs::read(&at).unwrap(), b"older", "{name} was replaced");
        } else {
            assert_eq!(f.result, Ok(()), "{name}");
            assert!(f.verified);
            assert_eq!(hash(&at), hash(p), "{name}");
            assert_eq!(at.metadata().unwrap().mode() & 0o777, 0o640);
        }
    }
}
