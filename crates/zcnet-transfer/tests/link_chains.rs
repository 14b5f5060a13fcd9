//! Symlinks the receiver creates resolve inside the receive directory as the file system
//! resolves them, not only as they are spelled: a chain of links that each look inside
//! on their own (`q -> .` then `p -> q/q/q/../../..`) is refused, sent through the protocol;
//! a link through one already there that leads outside is refused; and for random chains, in
//! random order, with the kernel's `openat2` and with the walk that stands in for it, no link
//! in the directory ever resolves outside (checked with `std::fs::canonicalize`, and for
//! dangling links with a resolution of their own, as far as they exist).

use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::time::Duration;
use zcnet::stream::Listener;
use zcnet::{ReceiverConfig, RxPath, SenderConfig, TxPath};
use zcnet_transfer::resolve::{kernel_resolution, Resolution};
use zcnet_transfer::session::{
    receive_session, send_session, RecvOptions, SendOptions, SessionReport, Source,
};
use zcnet_transfer::store::{Store, StoreOptions};
use zcnet_transfer::wire::{Code, VERSION};

/// One session of `sources` into `dst` through the protocol; the sender's report.
fn transfer(dst: &Path, sources: Vec<Source>) -> SessionReport {
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
    o.max_version = VERSION;
    let sent = send_session(&mut tx, sources, &o, &mut |_| {}).unwrap();
    served.join().unwrap().unwrap();
    sent
}

fn link(name: &str, target: &str) -> Source {
    Source::Link {
        name: name.into(),
        target: target.into(),
    }
}

/// Every symlink under `dir` (not following any), by its path.
fn symlinks(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let ft = e.file_type().unwrap();
            if ft.is_symlink() {
                out.push(e.path());
            } else if ft.is_dir() {
                todo.push(e.path());
            }
        }
    }
    out
}

/// Where the link at `at` leads, followed as far as the names exist, by a resolution of the
/// test's own (std::fs only, lexical on canonical paths): `Err` names the first place
/// outside `root` it reaches; a loop (more than 40 links) ends it inside.
fn follow(root: &Path, at: &Path) -> Result<PathBuf, PathBuf> {
    let mut cur = at.parent().unwrap().canonicalize().unwrap();
    let mut todo: Vec<String> = std::fs::read_link(at)
        .unwrap()
        .to_str()
        .unwrap()
        .split('/')
        .rev()
        .map(String::from)
        .collect();
    if std::fs::read_link(at).unwrap().is_absolute() {
        return Err(PathBuf::from("/"));
    }
    let mut links = 0;
    while let Some(c) = todo.pop() {
        match c.as_str() {
            "" | "." => {}
            ".." => {
                cur.pop();
            }
            name => {
                let p = cur.join(name);
                match std::fs::symlink_metadata(&p) {
                    Ok(m) if m.file_type().is_symlink() => {
                        links += 1;
                        if links > 40 {
                            return Ok(cur);
                        }
                        let t = std::fs::read_link(&p).unwrap();
                        if t.is_absolute() {
                            return Err(t);
                        }
                        todo.extend(t.to_str().unwrap().split('/').rev().map(String::from));
                    }
                    Ok(m) if m.is_dir() => cur = p,
                    _ => return Ok(cur),
                }
            }
        }
        if !cur.starts_with(root) {
            return Err(cur);
        }
    }
    Ok(cur)
}

/// No symlink under `dir` leads outside it: neither whole (`canonicalize`) nor as far as
/// its names exist ([`follow`]).
fn assert_all_inside(dir: &Path, context: &str) {
    let root = dir.canonicalize().unwrap();
    for l in symlinks(dir) {
        if let Ok(p) = std::fs::canonicalize(&l) {
            assert!(
                p.starts_with(&root),
                "{context}: {} -> {:?} resolves to {} (outside {})",
                l.display(),
                std::fs::read_link(&l).unwrap(),
                p.display(),
                root.display()
            );
        }
        if let Err(out) = follow(&root, &l) {
            panic!(
                "{context}: {} -> {:?} reaches {} (outside {})",
                l.display(),
                std::fs::read_link(&l).unwrap(),
                out.display(),
                root.display()
            );
        }
    }
}

/// The three chains of issue 40, each into a directory of its own three levels down, sent
/// as a sender sends links: the first link of each is made, the second refused as an unsafe
/// name, and nothing in the directory resolves outside.
#[test]
fn the_three_chains_are_refused_at_their_second_link() {
    let deep = format!("{}{}", "r/".repeat(20), "../".repeat(19) + "..");
    let chains: [(&str, Vec<Source>); 3] = [
        ("q", vec![link("q", "."), link("p", "q/q/q/../../..")]),
        ("d1/up", vec![link("d1/up", ".."), link("esc", "d1/up/..")]),
        ("r", vec![link("r", "."), link("deep", &deep)]),
    ];
    for (first, chain) in chains {
        let outer = tempfile::tempdir().unwrap();
        let dst = outer.path().join("a/b/recv");
        std::fs::create_dir_all(&dst).unwrap();
        let sent = transfer(&dst, chain);
        let results: Vec<_> = sent
            .files
            .iter()
            .map(|f| {
                eprintln!("{first}: {} -> {:?}", f.name, f.result);
                f.result.as_ref().err().map(|e| e.0)
            })
            .collect();
        assert_all_inside(&dst, first);
        assert_eq!(results, [None, Some(Code::UnsafeName)], "{:?}", sent.files);
        let msg = &sent.files[1].result.as_ref().unwrap_err().1;
        assert!(msg.contains("'..' after a name"), "{msg}");
        assert!(std::fs::symlink_metadata(dst.join(first))
            .unwrap()
            .is_symlink());
    }
}

/// A link already in the directory that leads outside (planted, or made by an older
/// receiver) is not a way out for a new one: a target through it is refused, by its
/// resolution, though its spelling has no `..` at all.
#[test]
fn a_target_through_an_escaping_link_already_there_is_refused() {
    let outer = tempfile::tempdir().unwrap();
    let dst = outer.path().join("recv");
    std::fs::create_dir_all(dst.join("d")).unwrap();
    std::fs::create_dir_all(outer.path().join("secret")).unwrap();
    std::os::unix::fs::symlink("..", dst.join("d/up")).unwrap();
    std::os::unix::fs::symlink("d/up/..", dst.join("old")).unwrap();
    let sent = transfer(
        &dst,
        vec![
            link("new", "old/secret"),
            link("d/new", "up/old"),
            link("fine", "d/up/d"),
        ],
    );
    let codes: Vec<_> = sent
        .files
        .iter()
        .map(|f| f.result.as_ref().err().map(|e| e.0))
        .collect();
    assert_eq!(
        codes,
        [Some(Code::UnsafeName), Some(Code::UnsafeName), None],
        "{:?}",
        sent.files
    );
    let msg = &sent.files[0].result.as_ref().unwrap_err().1;
    assert!(msg.contains("leaves the receive directory"), "{msg}");
    assert!(std::fs::symlink_metadata(dst.join("new")).is_err());
}

/// The resolutions to try: the walk always, and the kernel's where the build found
/// `openat2` (`zcnet_has_openat2`; without it the kernel half is
/// `the_kernel_half_runs_where_the_build_found_openat2`, ignored with why).
fn resolutions() -> Vec<Resolution> {
    if cfg!(zcnet_has_openat2) {
        assert_eq!(
            kernel_resolution(),
            Resolution::Kernel,
            "openat2, which the build found"
        );
        vec![Resolution::Kernel, Resolution::Walk]
    } else {
        vec![Resolution::Walk]
    }
}

#[cfg_attr(
    not(zcnet_has_openat2),
    ignore = "needs openat2 (Linux 5.6): the kernel half of the link-chain tests"
)]
#[test]
fn the_kernel_half_runs_where_the_build_found_openat2() {
    assert_eq!(resolutions(), [Resolution::Kernel, Resolution::Walk]);
}

/// Directories a link may be made in (made as real directories beforehand, or on the way).
const PLACES: [&str; 4] = ["", "a", "a/b", "c"];
/// Names links get.
const NAMES: [&str; 4] = ["l0", "l1", "l2", "l3"];
/// What targets are made of.
const PARTS: [&str; 9] = ["..", "..", ".", "a", "b", "c", "l0", "l1", "l2"];

fn chain() -> impl Strategy<Value = Vec<(usize, usize, Vec<usize>)>> {
    proptest::collection::vec(
        (
            0..PLACES.len(),
            0..NAMES.len(),
            proptest::collection::vec(0..PARTS.len(), 1..8),
        ),
        1..14,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Random links in random order, each made if the receiver takes it: afterwards no
    /// link in the directory leads outside, by either resolution.
    #[test]
    fn no_chain_of_links_resolves_outside(ops in chain()) {
        for how in resolutions() {
            let outer = tempfile::tempdir().unwrap();
            let dst = outer.path().join("x/y/recv");
            std::fs::create_dir_all(dst.join("a/b")).unwrap();
            std::fs::create_dir_all(dst.join("c")).unwrap();
            let mut store = Store::open(&dst, StoreOptions::default()).unwrap();
            store.resolve_by(how);
            let mut made = Vec::new();
            for (place, name, parts) in &ops {
                let target: Vec<&str> = parts.iter().map(|&i| PARTS[i]).collect();
                let target = target.join("/");
                let name = match PLACES[*place] {
                    "" => NAMES[*name].to_string(),
                    p => format!("{p}/{}", NAMES[*name]),
                };
                if store.make_link(&name, &target).is_ok() {
                    made.push(format!("{name} -> {target}"));
                }
            }
            assert_all_inside(&dst, &format!("{how:?}, made {made:?}"));
        }
    }
}
