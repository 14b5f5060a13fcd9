//! A sparse file stays sparse: its holes are found at the sender (`SEEK_DATA`/`SEEK_HOLE`)
//! and not sent, and the receiver leaves them unwritten — same bytes (BLAKE3), a few
//! allocated blocks, only the data on the wire. A version-3 receiver gets the whole file,
//! holes as zeros, and it still arrives right.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::time::Duration;
use zcnet::stream::Listener;
use zcnet::{ReceiverConfig, RxPath, SenderConfig, TxPath};
use zcnet_testbed::pattern::pattern;
use zcnet_transfer::session::{receive_session, send_session, RecvOptions, SendOptions, Source};
use zcnet_transfer::store::{Store, StoreOptions};

const MIB: u64 = 1 << 20;

fn hash(path: &Path) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    std::io::copy(&mut File::open(path).unwrap(), &mut h).unwrap();
    *h.finalize().as_bytes()
}

/// Sends `src` as `name` into `dst` with at most protocol `max_version`; returns the bytes
/// the receiver spliced from the socket into files.
fn send(src: &Path, dst: &Path, max_version: u16) -> u64 {
    let mut rc = ReceiverConfig::new(RxPath::Copy);
    rc.timeout = Some(Duration::from_secs(20));
    let listener = Listener::bind("127.0.0.1:0".parse().unwrap(), &rc).unwrap();
    let addr = listener.local_addr().unwrap();
    let dir = dst.to_path_buf();
    let h = std::thread::spawn(move || {
        let mut rx = listener.accept().unwrap();
        let mut store = Store::open(&dir, StoreOptions::default()).unwrap();
        let r = receive_session(&mut rx, &mut store, &RecvOptions::default(), &mut |_| {});
        (r, rx.stats().snapshot().rx_bytes_file)
    });
    let mut sc = SenderConfig::new(TxPath::Copy);
    sc.timeout = Some(Duration::from_secs(20));
    let mut tx = zcnet::Sender::connect(addr, &sc).unwrap();
    let mut o = SendOptions::default();
    o.verify = true;
    o.max_version = max_version;
    let sources = vec![Source::File {
        path: src.to_path_buf(),
        name: "sparse.img".into(),
    }];
    let sent = send_session(&mut tx, sources, &o, &mut |_| {}).unwrap();
    assert_eq!(sent.files[0].result, Ok(()));
    assert!(sent.files[0].verified);
    let (got, spliced) = h.join().unwrap();
    got.unwrap();
    spliced
}

#[cfg_attr(
    not(zcnet_has_holes),
    ignore = "needs a temp directory that keeps holes (TMPDIR on ext4, xfs, btrfs, tmpfs...)"
)]
#[test]
fn holes_are_neither_sent_nor_written_and_the_bytes_are_the_same() {
    let src = tempfile::tempdir().unwrap();
    let path = src.path().join("sparse.img");
    let f = File::create(&path).unwrap();
    // A hole first, two extents of data, a hole at the end: 64 MiB, 2.5 MiB of data.
    f.write_all_at(pattern(1, MIB as usize), 8 * MIB).unwrap();
    f.write_all_at(pattern(2, (3 * MIB / 2) as usize), 30 * MIB)
        .unwrap();
    f.set_len(64 * MIB).unwrap();
    drop(f);
    let data = 5 * MIB / 2;
    let allocated = std::fs::metadata(&path).unwrap().blocks() * 512;
    assert!(
        allocated <= 8 * MIB,
        "{} keeps no holes, though the build found the temp directory does",
        src.path().display()
    );

    let dst = tempfile::tempdir().unwrap();
    let spliced = send(&path, dst.path(), zcnet_transfer::wire::VERSION);
    let got = dst.path().join("sparse.img");
    assert_eq!(hash(&got), hash(&path), "the bytes differ");
    assert_eq!(std::fs::metadata(&got).unwrap().len(), 64 * MIB);
    // Only the data crossed (file systems round extents to their blocks).
    assert!(
        (data..=data + MIB).contains(&spliced),
        "{spliced} bytes were sent for {data} bytes of data"
    );
    let blocks = std::fs::metadata(&got).unwrap().blocks() * 512;
    assert!(
        blocks <= allocated + MIB,
        "the received file has {blocks} bytes allocated, the sent one {allocated}"
    );

    // A version-3 receiver: every byte, holes as zeros, still right.
    let dst3 = tempfile::tempdir().unwrap();
    let spliced = send(&path, dst3.path(), 3);
    assert_eq!(spliced, 64 * MIB);
    assert_eq!(hash(&dst3.path().join("sparse.img")), hash(&path));
}
