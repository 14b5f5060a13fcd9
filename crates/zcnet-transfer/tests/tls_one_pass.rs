//! Over TLS each end hashes a file's bytes where they already pass through memory (issue
//! 45): the receiver hashes each step right after it was decrypted, so no landing thread
//! reads the partial file back — while in plaintext, where the bytes are spliced and never
//! pass through memory, one does. Alone in its binary: no other test's threads to see.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use zcnet::{ReceiverConfig, RxPath, SenderConfig, TxPath};
use zcnet_testbed::pattern::{pattern, Verifier};
use zcnet_transfer::session::{
    receive_session, send_session, RecvOptions, RecvSecurity, SendOptions, SendSecurity, Source,
};
use zcnet_transfer::store::{Store, StoreOptions};
use zcnet_transfer::tls::{Expect, Identity};

/// The landing thread's name as `/proc` shows it (15 bytes of "zcnet-landing-hash").
const LANDING: &str = "zcnet-landing-h";

fn landing_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.trim_end() == LANDING)
        .count()
}

/// Sends a 48 MiB file to an in-process receiver and says whether a landing thread was seen
/// while it ran; every byte is checked.
fn landing_seen(tls: bool) -> bool {
    const LEN: usize = 48 << 20;
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let path = src.path().join("big");
    let mut f = std::fs::File::create(&path).unwrap();
    let mut pos = 0;
    while pos < LEN {
        let n = (LEN - pos).min(4 << 20);
        std::io::Write::write_all(&mut f, pattern(pos as u64, n)).unwrap();
        pos += n;
    }
    drop(f);
    let id = Arc::new(Identity::generate().unwrap());
    let fp = id.fingerprint();
    let mut rcfg = ReceiverConfig::new(RxPath::Copy);
    rcfg.timeout = Some(Duration::from_secs(60));
    let listener = zcnet::stream::Listener::bind("127.0.0.1:0".parse().unwrap(), &rcfg).unwrap();
    let addr = listener.local_addr().unwrap();
    let d = dst.path().to_path_buf();
    let done = Arc::new(AtomicBool::new(false));
    let seen = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut seen = false;
            while !done.load(Ordering::Relaxed) {
                seen |= landing_threads() > 0;
                std::thread::sleep(Duration::from_micros(200));
            }
            seen
        })
    };
    let rx = std::thread::spawn(move || {
        let mut rx = listener.accept().unwrap();
        let mut store = Store::open(&d, StoreOptions::default()).unwrap();
        let mut o = RecvOptions::default();
        if tls {
            o.security = RecvSecurity::Tls(id);
        }
        receive_session(&mut rx, &mut store, &o, &mut |_| {})
    });
    let mut o = SendOptions::default();
    o.verify = true;
    if tls {
        o.security = SendSecurity::Tls(Expect::Pinned(fp));
    }
    let mut scfg = SenderConfig::new(TxPath::Copy);
    scfg.timeout = Some(Duration::from_secs(60));
    let mut tx = zcnet::Sender::connect(addr, &scfg).unwrap();
    let sources = vec![Source::File {
        path: path.clone(),
        name: "big".into(),
    }];
    let r = send_session(&mut tx, sources, &o, &mut |_| {}).unwrap();
    let got = rx.join().unwrap().unwrap();
    done.store(true, Ordering::Relaxed);
    let seen = seen.join().unwrap();
    assert_eq!(r.failures(), 0);
    assert!(r.files[0].verified && got.files[0].verified);
    assert_eq!(got.ktls.is_some(), tls && got.kernel_tls.is_none());
    check(&dst.path().join("big"), LEN);
    seen
}

fn check(path: &Path, len: usize) {
    let got = std::fs::read(path).unwrap();
    assert_eq!(got.len(), len);
    let mut v = Verifier::default();
    v.check(&got);
}

#[test]
fn over_tls_the_receiver_hashes_in_memory_and_reads_nothing_back() {
    // The watch works: in plaintext the landing thread hashes the spliced file back.
    assert!(landing_seen(false), "no landing thread seen in plaintext");
    let tls = landing_seen(true);
    let kernel = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp")
        .unwrap_or_default()
        .split_whitespace()
        .any(|u| u == "tls");
    // Where the kernel makes the records, the bytes are spliced as in plaintext.
    if !kernel {
        assert!(!tls, "a landing thread read the file back over TLS");
    }
}
