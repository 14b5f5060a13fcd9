//! `zcnet tune` end to end, tiny: it measures on loopback, writes a profile `auto` accepts on
//! this host, and `zcnet bench --tx auto` then decides by that profile (its JSON says so);
//! a foreign profile makes `zcnet send` warn, and the file still arrives intact. Nothing here
//! asserts on speed: the profile's numbers are whatever this noisy machine measured.

use std::io::{BufRead, BufReader, Read};
use std::process::Stdio;
use std::time::Duration;
use zcnet::auto::Profile;
use zcnet::tuning::host_key_for;
use zcnet::{RxPath, TxPath};
use zcnet_bench::report::Report;

mod common;
use common::{run_bounded, zcnet};

#[test]
fn tune_writes_a_profile_that_auto_then_uses() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_bounded(
        zcnet()
            .args([
                "tune",
                "--size",
                "64K,256K",
                "--repeat",
                "2",
                "--time",
                "0.05",
                "--recheck-time",
                "0.05",
                "--no-touch",
                "--dir",
            ])
            .arg(dir.path()),
        Duration::from_secs(120),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tune failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("auto takes"), "summary table: {stdout}");
    // The profile is this host's, named by interface and MTU, and `auto` would accept it.
    let key = host_key_for(std::net::Ipv4Addr::LOCALHOST.into()).unwrap();
    let path = dir.path().join(format!("profile-lo-mtu{}.json", key.mtu));
    assert!(stdout.contains(&path.display().to_string()), "{stdout}");
    assert!(path.with_extension("svg").exists(), "the plot");
    let text = std::fs::read_to_string(&path).unwrap();
    let p = Profile::parse(&text, &key).expect("tune's profile parses on this host");
    for tx in [TxPath::Copy, TxPath::Zerocopy, TxPath::Uring, TxPath::Cow] {
        let n = p.tx.iter().filter(|m| m.path == tx).count();
        assert_eq!(n, 2, "{tx}: one row per size");
    }
    for rx in [RxPath::Copy, RxPath::Mmap, RxPath::Uring] {
        assert_eq!(p.rx.iter().filter(|m| m.path == rx).count(), 2, "{rx}");
    }
    // Both ends on this host: every pair of copy/zerocopy/uring × copy/mmap/uring was
    // measured together, one row per pair and size, with the zero-copy share of each end.
    for tx in [TxPath::Copy, TxPath::Zerocopy, TxPath::Uring] {
        for rx in [RxPath::Copy, RxPath::Mmap, RxPath::Uring] {
            let rows: Vec<_> = p
                .pairs
                .iter()
                .filter(|m| m.tx == tx && m.rx == rx)
                .collect();
            assert_eq!(rows.len(), 2, "{tx}/{rx}: one row per size");
            assert!(rows
                .iter()
                .all(|m| m.zc_fraction_tx.is_some() && m.zc_fraction_rx.is_some()));
        }
    }
    // … and cow into copy (measured for the single-end table; a pair like any other).
    assert_eq!(p.pairs.iter().filter(|m| m.tx == TxPath::Cow).count(), 2);
    assert_eq!(p.pairs.len(), 20, "nothing but those pairs: {:?}", p.pairs);
    assert!(
        stdout.contains("pairs (auto → auto takes the cheapest)"),
        "{stdout}"
    );
    // A caller's file: sendfile and pread + send into each receive path, one row per
    // size, each sendfile row all zero-copy by the sender's count.
    for mode in [zcnet::FileTxMode::Sendfile, zcnet::FileTxMode::ReadSend] {
        for rx in [RxPath::Copy, RxPath::Mmap, RxPath::Uring] {
            let rows: Vec<_> = p
                .file
                .iter()
                .filter(|m| m.path.mode == mode && m.path.rx == rx)
                .collect();
            assert_eq!(rows.len(), 2, "{mode}/{rx}: one row per size");
            if mode == zcnet::FileTxMode::Sendfile {
                assert!(rows.iter().all(|m| m.zc_fraction == Some(1.0)), "{rows:?}");
            }
        }
    }
    assert_eq!(p.file.len(), 12, "{:?}", p.file);
    assert!(stdout.contains("file sends (untouched): 64K "), "{stdout}");
    // zcrx is refused here (no header split): a refused path is never a row.
    assert!(p.rx.iter().all(|m| m.path != RxPath::Zcrx));
    assert!(p.tx.iter().chain(p.tx.iter()).all(|m| !m.touch));
    // Every point re-checked was raced, and the race says what it found there.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let rechecked: usize = stderr
        .lines()
        .find_map(|l| l.strip_prefix("zcnet tune: re-checking "))
        .and_then(|l| l.split_whitespace().next())
        .map_or(0, |n| n.parse().expect("a count"));
    assert_eq!(
        stdout.matches("re-check race at ").count(),
        rechecked,
        "{stdout}\n{stderr}"
    );
    assert!(stdout
        .lines()
        .filter(|l| l.starts_with("re-check race at "))
        .all(|l| l.contains(" rounds, leader ")));

    // bench with `auto` on both ends, the profile given by $ZCNET_PROFILE.
    let out = run_bounded(
        zcnet()
            .args([
                "bench", "--tx", "auto", "--rx", "auto", "--size", "64K", "--bytes", "8M",
                "--repeat", "1", "--json",
            ])
            .env("ZCNET_PROFILE", &path),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Report = serde_json::from_slice(&out.stdout).expect("bench JSON");
    let run = &report.runs[0];
    assert_eq!(run.bytes_sent, run.bytes_received);
    let tx = run.sender_stats.auto;
    assert!(tx.decisions >= 8 * 1024 * 1024 / (64 * 1024), "{tx:?}");
    assert_eq!(
        tx.chose_default_no_profile, 0,
        "the profile was in force: {tx:?}"
    );
    let rx = run.receiver_stats.auto;
    assert_eq!(
        rx.decisions, 1,
        "one receive decision per connection: {rx:?}"
    );
    assert_eq!(rx.chose_default_no_profile, 0, "{rx:?}");
}

#[test]
fn a_foreign_profile_is_refused_loudly_and_the_transfer_still_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let key = host_key_for(std::net::Ipv4Addr::LOCALHOST.into()).unwrap();
    let foreign = format!(
        r#"{{"schema": 1, "zcnet": "0.1.0", "kernel": "not-{}", "interface": "lo",
            "mtu": {}, "topology": "loopback", "created": 0,
            "tx": [{{"path": "copy", "size": 4096, "touch": true,
                    "cpu_s_per_gib": {{"median": 1.0, "lo": 1.0, "hi": 1.0}}}}],
            "rx": [{{"path": "copy", "size": 4096, "touch": true,
                    "cpu_s_per_gib": {{"median": 1.0, "lo": 1.0, "hi": 1.0}}}}]}}"#,
        key.kernel, key.mtu
    );
    let profile = dir.path().join("foreign.json");
    std::fs::write(&profile, foreign).unwrap();
    let src = dir.path().join("data.bin");
    let data: Vec<u8> = (0..3_000_017u32).map(|i| (i * 7 % 253) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    let into = dir.path().join("in");
    std::fs::create_dir(&into).unwrap();

    // Port 0; the first stderr line says where it listens.
    let mut recv = zcnet()
        .args(["recv", "--once", "--listen", "127.0.0.1:0", "--dir"])
        .arg(&into)
        .env("ZCNET_PROFILE", &profile)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut recv_err = BufReader::new(recv.stderr.take().unwrap());
    let mut line = String::new();
    recv_err.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .rsplit(' ')
        .next()
        .expect("receiving into DIR on ADDR")
        .to_string();
    assert!(addr.starts_with("127.0.0.1:"), "{line}");
    let out = run_bounded(
        zcnet()
            .args(["send", "--to", &addr])
            .arg(&src)
            .env("ZCNET_PROFILE", &profile),
        Duration::from_secs(60),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "send failed: {stderr}");
    assert!(
        stderr.contains("warning") && stderr.contains("refused") && stderr.contains("not-"),
        "send names the refused profile: {stderr}"
    );
    let mut rest = String::new();
    recv_err.read_to_string(&mut rest).unwrap();
    assert!(recv.wait().unwrap().success(), "{rest}");
    assert!(
        rest.contains("warning") && rest.contains("refused"),
        "recv names the refused profile too: {rest}"
    );
    assert_eq!(std::fs::read(into.join("data.bin")).unwrap(), data);
}
