//! A `Sender`/`Receiver` pair on default configurations (the `auto` path on both ends) reads
//! no profile and writes no file: a library touches what its caller asks for, nothing else.
//!
//! The pair runs in a child process of this test whose `HOME` and `XDG_CONFIG_HOME` point at
//! an empty temporary directory holding one file: a valid profile for this host's loopback,
//! at the very place `zcnet tune` would write it, with a deliberately odd choice (zero-copy
//! sends, ten times cheaper than copy at every size). The child checks that neither end took
//! it (the sender never sends with `MSG_ZEROCOPY` and decides every send with "no profile";
//! the receiver runs its own trial, which a profile would have replaced), and that no clock
//! card appears under `/dev/shm/zcnet-*` while the connection is open; the parent checks that
//! nothing was added under `HOME`. Every byte is verified.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use zcnet::auto::Profile;
use zcnet::tuning::{Measurement, Spread};
use zcnet::{Listener, Receiver, ReceiverConfig, RxPath, Sender, SenderConfig, TxPath};
use zcnet_testbed::pattern::{pattern, Verifier};

/// Set in the child: where its `HOME` is (the parent's temporary directory).
const CHILD: &str = "ZCNET_TEST_NO_SIDE_EFFECTS_CHILD";
const TEST: &str = "default_configs_read_no_profile_and_write_no_file";
const SIZE: u64 = 8 << 20;
const OP: usize = 64 << 10;

fn row<P>(path: P, size: u64, median: f64) -> Measurement<P> {
    Measurement {
        path,
        size,
        touch: true,
        cpu_s_per_gib: Spread {
            median,
            lo: median * 0.99,
            hi: median * 1.01,
        },
        zc_fraction: Some(1.0),
    }
}

/// A profile valid for this host's loopback that sends every size with zero-copy (0.1
/// against copy's 1.0) and receives with copy.
fn odd_profile() -> Profile {
    let key = zcnet::tuning::host_key_for(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
    let mut tx = Vec::new();
    let mut rx = Vec::new();
    for size in [4 << 10, 64 << 10, 1 << 20, 4 << 20] {
        tx.push(row(TxPath::Copy, size, 1.0));
        tx.push(row(TxPath::Zerocopy, size, 0.1));
        rx.push(row(RxPath::Copy, size, 1.0));
    }
    let mut p = Profile::scripted(tx, rx);
    p.kernel = key.kernel;
    p.interface = key.interface;
    p.mtu = key.mtu;
    p
}

/// Every file and directory under `root`, relative to it.
fn tree(root: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            out.insert(p.strip_prefix(root).unwrap().to_path_buf());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(p);
            }
        }
    }
    out
}

/// Files under `/dev/shm/zcnet-*/` whose name carries `port` (a clock card names both ends'
/// addresses).
fn cards_naming(port: u16) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/dev/shm") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("zcnet-"))
        .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().contains(&format!("_{port}")))
        })
        .collect()
}

#[test]
fn default_configs_read_no_profile_and_write_no_file() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join(".config");
    let profile = odd_profile();
    let file = config
        .join("zcnet")
        .join(Profile::file_name(&profile.interface, profile.mtu));
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, profile.to_json()).unwrap();
    // The profile is one `zcnet tune` would have written, and one the explicit opt-in takes.
    Profile::parse(
        &std::fs::read_to_string(&file).unwrap(),
        &profile.host_key(),
    )
    .unwrap();
    let before = tree(home.path());

    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST, "--nocapture", "--test-threads", "1"])
        .env(CHILD, home.path())
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", &config)
        .env_remove("ZCNET_PROFILE")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the child failed:\n{text}");
    assert!(text.contains("1 passed"), "the child ran the pair:\n{text}");
    assert_eq!(tree(home.path()), before, "nothing added under HOME");
}

/// The pair, in the child, under the parent's `HOME`.
fn child() {
    let listener = Listener::bind(
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        &ReceiverConfig::default(),
    )
    .unwrap();
    let addr = listener.local_addr().unwrap();
    let rx = std::thread::spawn(move || {
        let mut r: Receiver = listener.accept().unwrap();
        let mut v = Verifier::default();
        let mut buf = vec![0u8; OP];
        loop {
            let n = r.recv_into(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            v.check(&buf[..n]);
        }
        (
            v.pos,
            r.profile_note().map(str::to_owned),
            r.stats().snapshot(),
        )
    });
    let cfg = SenderConfig::default();
    assert_eq!(cfg.path, TxPath::Auto, "the default is the auto path");
    let mut tx = Sender::connect(addr, &cfg).unwrap();
    assert_eq!(
        tx.profile_note(),
        None,
        "no profile looked for, none refused"
    );
    let mut pos = 0u64;
    let mut cards = Vec::new();
    while pos < SIZE {
        tx.send_slice(pattern(pos, OP)).unwrap();
        pos += OP as u64;
        if pos == SIZE / 2 {
            // Mid-stream, the connection open: a sender that publishes has its card now.
            cards = cards_naming(addr.port());
        }
    }
    let s = tx.finish().unwrap();
    let (got, rx_note, r) = rx.join().unwrap();
    assert_eq!(got, SIZE, "every byte arrived, in order");
    assert_eq!(rx_note, None);
    assert!(cards.is_empty(), "clock cards published: {cards:?}");
    // (a) The profile's odd choice was not taken, on either end.
    assert_eq!(s.tx_calls_zerocopy, 0, "{s:?}");
    assert!(s.auto_tx.decisions > 0, "{:?}", s.auto_tx);
    assert_eq!(
        s.auto_tx.chose_default_no_profile, s.auto_tx.decisions,
        "{:?}",
        s.auto_tx
    );
    assert_eq!(
        (
            r.auto_rx.decisions,
            r.auto_rx.chose_trial,
            r.auto_rx.peer_clock
        ),
        (1, 1, 0),
        "a receiver without a profile runs its own trial, without a card: {:?}",
        r.auto_rx
    );
}
