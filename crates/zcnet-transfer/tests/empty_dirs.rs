//! Empty directories of a tree arrive (protocol version 3's `Dir`), with their permission
//! bits, under the receiver's name rules: a name leaving the directory or a symlink planted
//! under a directory's name is refused with the reason, and a version-2 receiver's session
//! reports each empty directory as not created while its files still arrive whole.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use zcnet::stream::Listener;
use zcnet::{ReceiverConfig, RxPath, SenderConfig, TxPath};
use zcnet_testbed::pattern::pattern;
use zcnet_transfer::session::{
    receive_session, send_session, Entry, RecvOptions, SendOptions, SessionReport, Source,
};
use zcnet_transfer::store::{Store, StoreOptions};
use zcnet_transfer::tree::Walk;
use zcnet_transfer::wire::Code;

fn hash(path: &Path) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    std::io::copy(&mut File::open(path).unwrap(), &mut h).unwrap();
    *h.finalize().as_bytes()
}

/// Sends `sources` to a fresh receiver in `dst` speaking at most `max_version`; returns
/// both reports.
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

/// root/a/f (a file), root/b/c/deep (empty, nested), root/empty (empty, mode 0o710),
/// root/only_fifo (holds only a FIFO, which is skipped).
fn make_tree(src: &Path) -> PathBuf {
    let root = src.join("root");
    std::fs::create_dir_all(root.join("a")).unwrap();
    File::create(root.join("a/f"))
        .unwrap()
        .write_all(pattern(9, 5000))
        .unwrap();
    std::fs::create_dir_all(root.join("b/c/deep")).unwrap();
    std::fs::create_dir(root.join("empty")).unwrap();
    std::fs::set_permissions(root.join("empty"), std::fs::Permissions::from_mode(0o710)).unwrap();
    std::fs::create_dir(root.join("only_fifo")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        root.join("only_fifo/pipe"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    root
}

fn walk(root: &Path) -> Walk {
    let mut w = Walk::new();
    w.add(root).unwrap();
    w
}

fn is_dir(p: &Path) -> bool {
    std::fs::symlink_metadata(p)
        .map(|m| m.file_type().is_dir())
        .unwrap_or(false)
}

#[test]
fn empty_directories_arrive_with_their_modes() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let root = make_tree(src.path());
    let w = walk(&root);
    let dirs: Vec<_> = w
        .sources
        .iter()
        .filter_map(|s| match s {
            Source::Dir { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(dirs, ["root/b/c/deep", "root/empty", "root/only_fifo"]);
    let (sent, got) = transfer(dst.path(), w.sources, zcnet_transfer::wire::VERSION);
    assert_eq!(sent.failures(), 0, "{:?}", sent.files);
    assert_eq!(got.failures(), 0, "{:?}", got.files);
    for r in [&sent, &got] {
        let n = r.files.iter().filter(|f| f.entry == Entry::Dir).count();
        assert_eq!(n, 3, "both ends report the directories as directories");
    }
    assert_eq!(hash(&dst.path().join("root/a/f")), hash(&root.join("a/f")));
    for d in ["root/b/c/deep", "root/empty", "root/only_fifo"] {
        assert!(
            is_dir(&dst.path().join(d)),
            "{d} must arrive as a directory"
        );
        assert_eq!(
            std::fs::read_dir(dst.path().join(d)).unwrap().count(),
            0,
            "{d}"
        );
    }
    let mode = std::fs::metadata(dst.path().join("root/empty"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o710);
    // Sent again: an existing directory is fine, the file is refused as existing.
    let (sent, _) = transfer(
        dst.path(),
        walk(&root).sources,
        zcnet_transfer::wire::VERSION,
    );
    let failed: Vec<_> = sent.files.iter().filter(|f| f.result.is_err()).collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].name, "root/a/f");
}

#[test]
fn a_version_2_receiver_is_told_nothing_and_each_empty_directory_is_reported() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let root = make_tree(src.path());
    let (sent, got) = transfer(dst.path(), walk(&root).sources, 2);
    assert_eq!(hash(&dst.path().join("root/a/f")), hash(&root.join("a/f")));
    assert_eq!(got.failures(), 0);
    let failed: Vec<_> = sent.files.iter().filter(|f| f.result.is_err()).collect();
    assert_eq!(failed.len(), 3, "{:?}", sent.files);
    for f in failed {
        let (code, msg) = f.result.as_ref().unwrap_err();
        assert_eq!(*code, Code::Version);
        assert!(msg.contains("cannot create an empty directory"), "{msg}");
        assert!(!dst.path().join(&f.name).exists(), "{}", f.name);
    }
}

#[test]
fn directory_names_obey_the_receiver_rules() {
    let src = tempfile::tempdir().unwrap();
    let outer = tempfile::tempdir().unwrap();
    let dst = outer.path().join("recv");
    std::fs::create_dir(&dst).unwrap();
    let elsewhere = outer.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    // A symlink planted where a directory is to be created, and one in its parent path.
    std::os::unix::fs::symlink(&elsewhere, dst.join("planted")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, dst.join("via")).unwrap();
    let d = src.path().to_path_buf();
    let dir = |name: &str| Source::Dir {
        path: d.clone(),
        name: name.into(),
    };
    let (sent, got) = transfer(
        &dst,
        vec![
            dir("../escape"),
            dir("/abs"),
            dir("planted"),
            dir("via/inner"),
            dir("fine/x"),
        ],
        zcnet_transfer::wire::VERSION,
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
            Some(Code::Exists),
            Some(Code::UnsafeName),
            None
        ],
        "{:?}",
        sent.files
    );
    assert_eq!(got.failures(), 4);
    assert!(!outer.path().join("escape").exists());
    assert!(is_dir(&dst.join("fine/x")));
    assert_eq!(
        std::fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "nothing written outside"
    );
}
