//! Symlinks of a tree arrive as symlinks (protocol version 3's `Link`), never followed: the
//! sender sends one only if its target stays inside the tree (others skipped and counted);
//! the receiver creates one only if its target, resolved from the link's directory, stays
//! inside the receive directory, and never over an existing entry (a planted symlink is not
//! followed). Every regular file's hash is compared, also read through the links.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::Duration;
use zcnet::stream::Listener;
use zcnet::{ReceiverConfig, RxPath, SenderConfig, TxPath};
use zcnet_testbed::pattern::pattern;
use zcnet_transfer::session::{
    receive_session, send_session, Entry, RecvOptions, SendOptions, SessionReport, Source,
};
use zcnet_transfer::store::{Store, StoreOptions};
use zcnet_transfer::tree::{SkipKind, Walk};
use zcnet_transfer::wire::{Code, VERSION};

fn hash(path: &Path) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    std::io::copy(&mut File::open(path).unwrap(), &mut h).unwrap();
    *h.finalize().as_bytes()
}

fn transfer(dst: &Path, sources: Vec<Source>, max_version: u16) -> (SessionReport, SessionReport) {
    let mut rc = ReceiverConfig::new(RxPath::Copy);
    rc.timeout = Some(Duration::from_secs(20));
    let listener = Listener::bind("127.0.0.1:0".parse().unwrap(), &rc).unwrap();
    let addr = listener.local_addr().unwrap();
    let dir = dst.to_path_buf();
    let served = std::thread::spawn(move || {
        let mut rx = listener.accept().unwrap();
        let mut store = Store::open(&dir, StoreOptions::default()).unwrap();
        receive_session(&mut rx, &mut store, &RecvOptions::default(), &mut |_| {})
    });
    let mut sc = SenderConfig::new(TxPath::Copy);
    sc.timeout = Some(Duration::from_secs(20));
    let mut tx = zcnet::Sender::connect(addr, &sc).unwrap();
    let mut o = SendOptions::default();
    o.verify = true;
    o.max_version = max_version;
    let sent = send_session(&mut tx, sources, &o, &mut |_| {}).unwrap();
    (sent, served.join().unwrap().unwrap())
}

fn link(name: &str, target: &str) -> Source {
    Source::Link {
        name: name.into(),
        target: target.into(),
    }
}

#[test]
fn links_inside_the_tree_arrive_as_links_and_others_are_skipped() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let root = src.path().join("root");
    std::fs::create_dir_all(root.join("sub/deep")).unwrap();
    File::create(root.join("a.txt"))
        .unwrap()
        .write_all(pattern(4, 3000))
        .unwrap();
    File::create(root.join("sub/deep/b"))
        .unwrap()
        .write_all(pattern(5, 400 << 10))
        .unwrap();
    let sym = |t: &str, at: &str| std::os::unix::fs::symlink(t, root.join(at)).unwrap();
    sym("a.txt", "in");
    sym("../a.txt", "sub/up");
    sym("deep/b", "sub/down");
    sym("./sub/./deep", "dirlink");
    sym("../outside", "out");
    sym("sub/../../x", "sneaky");
    sym("/etc/passwd", "abs");
    let mut w = Walk::new();
    w.add(&root).unwrap();
    assert_eq!(w.skipped_of(SkipKind::SymlinkOutside), 3, "{:?}", w.skipped);
    let links: Vec<(String, String)> = w
        .sources
        .iter()
        .filter_map(|s| match s {
            Source::Link { name, target } => Some((name.clone(), target.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(links.len(), 4, "{links:?}");
    let note = w.summary().unwrap();
    assert!(
        note.contains("3 symlink(s) pointing outside the tree"),
        "{note}"
    );
    let (sent, got) = transfer(dst.path(), w.sources, VERSION);
    assert_eq!(sent.failures(), 0, "{:?}", sent.files);
    assert_eq!(got.failures(), 0, "{:?}", got.files);
    for r in [&sent, &got] {
        let n = r.files.iter().filter(|f| f.entry == Entry::Link).count();
        assert_eq!(n, 4, "both ends report the links as links");
    }
    let d = dst.path();
    for (name, target) in &links {
        let p = d.join(name);
        assert!(
            std::fs::symlink_metadata(&p)
                .unwrap()
                .file_type()
                .is_symlink(),
            "{name} must be a symlink"
        );
        assert_eq!(std::fs::read_link(&p).unwrap().to_str().unwrap(), target);
    }
    assert_eq!(hash(&d.join("root/a.txt")), hash(&root.join("a.txt")));
    assert_eq!(
        hash(&d.join("root/sub/deep/b")),
        hash(&root.join("sub/deep/b"))
    );
    // Through the links: the same bytes.
    assert_eq!(hash(&d.join("root/in")), hash(&root.join("a.txt")));
    assert_eq!(hash(&d.join("root/sub/up")), hash(&root.join("a.txt")));
    assert_eq!(
        hash(&d.join("root/sub/down")),
        hash(&root.join("sub/deep/b"))
    );
    assert_eq!(
        hash(&d.join("root/dirlink/b")),
        hash(&root.join("sub/deep/b"))
    );
    for skipped in ["root/out", "root/sneaky", "root/abs"] {
        assert!(
            std::fs::symlink_metadata(d.join(skipped)).is_err(),
            "{skipped}"
        );
    }
}

#[test]
fn the_receiver_creates_only_links_that_stay_inside_and_never_over_an_entry() {
    let outer = tempfile::tempdir().unwrap();
    let dst = outer.path().join("recv");
    std::fs::create_dir(&dst).unwrap();
    let elsewhere = outer.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, dst.join("planted")).unwrap();
    File::create(dst.join("file")).unwrap();
    let (sent, got) = transfer(
        &dst,
        vec![
            link("abs", "/etc"),
            link("up", "../elsewhere"),
            link("d/e/up2", "../../../elsewhere"),
            link("d/e/ok", "../../file"),
            link("planted", "file"),
            link("file", "d"),
            link("planted/x", "y"),
            link("../escape", "file"),
            link("empty", ""),
        ],
        VERSION,
    );
    let codes: Vec<_> = sent
        .files
        .iter()
        .map(|f| f.result.as_ref().err().map(|e| e.0))
        .collect();
    assert_eq!(
        codes,
        [
            Some(Code::UnsafeName),
            Some(Code::UnsafeName),
            Some(Code::UnsafeName),
            None,
            Some(Code::Exists),
            Some(Code::Exists),
            Some(Code::UnsafeName),
            Some(Code::UnsafeName),
            Some(Code::UnsafeName),
        ],
        "{:?}",
        sent.files
    );
    assert_eq!(got.failures(), 8);
    let msg = &sent.files[1].result.as_ref().unwrap_err().1;
    assert!(msg.contains("leaves"), "{msg}");
    let msg = &sent.files[0].result.as_ref().unwrap_err().1;
    assert!(msg.contains("absolute"), "{msg}");
    assert_eq!(
        std::fs::read_link(dst.join("d/e/ok")).unwrap().to_str(),
        Some("../../file")
    );
    // The planted link still points where it did, and nothing was made through it.
    assert_eq!(std::fs::read_link(dst.join("planted")).unwrap(), elsewhere);
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    assert!(!outer.path().join("escape").exists());
    assert!(std::fs::symlink_metadata(dst.join("up")).is_err());
}

#[test]
fn a_version_2_receiver_gets_no_link_and_each_one_is_reported() {
    let dst = tempfile::tempdir().unwrap();
    let (sent, got) = transfer(dst.path(), vec![link("l", "x")], 2);
    assert_eq!(got.files.len(), 0);
    let (code, msg) = sent.files[0].result.as_ref().unwrap_err();
    assert_eq!(*code, Code::Version);
    assert!(msg.contains("cannot create a symlink"), "{msg}");
    assert!(std::fs::symlink_metadata(dst.path().join("l")).is_err());
}
