//! The `file` paths: a file range sent with `sendfile`, `splice` or read+send, received into
//! a file range with `splice` or the receiver's own path plus `pwrite`, over loopback and a
//! veth pair at MTU 1500 and 9000, at non-zero (unaligned) offsets on both sides. Files are
//! compared by BLAKE3 hash, the bytes around the target range must be untouched, and the
//! stats must say the bytes went where the mode claims. Then the edges: a range past the end
//! of the file, a file or a peer that ends early, a stalled peer, leftovers of an earlier
//! receive, and files that refuse splice (procfs) — each a clear error or a counted
//! fallback.

mod common;

use common::{connect, listen, pattern, receiver_config, sender_config, veth_pair, Topo};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use zcnet::{Error, FallbackReason, FileRxMode, FileTxMode, RxPath, StatsSnapshot, TxPath};

const SIZES: [u64; 7] = [0, 1, 4095, 4096, 65537, (1 << 20) + 3, 64 << 20];
/// Where the range starts in the source file: not page-aligned, after bytes that must not be
/// sent.
const SRC_OFF: u64 = 4099;
/// Where the range lands in the destination file: not page-aligned, after bytes that must
/// survive.
const DST_OFF: u64 = 12_289;
/// Bytes after the range in the source file, which must not be sent either.
const SRC_TAIL: usize = 1000;

/// A directory on tmpfs (/dev/shm) when there is one, else the default temp dir; and whether
/// it is tmpfs (where every file call is supported, so no fallback may happen).
fn scratch_dir() -> (tempfile::TempDir, bool) {
    let on_tmpfs = |p: &str| {
        std::fs::read_to_string("/proc/self/mounts").is_ok_and(|m| {
            m.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 2 && f[1] == p && f[2] == "tmpfs"
            })
        })
    };
    if on_tmpfs("/dev/shm") {
        if let Ok(d) = tempfile::Builder::new()
            .prefix("zcnet-file-")
            .tempdir_in("/dev/shm")
        {
            return (d, true);
        }
    }
    let d = tempfile::Builder::new()
        .prefix("zcnet-file-")
        .tempdir()
        .unwrap();
    let tmp = on_tmpfs("/tmp") && d.path().starts_with("/tmp");
    (d, tmp)
}

fn create(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .unwrap()
}

/// `n` bytes of `fill`, written at the file's current end.
fn write_fill(f: &mut File, fill: u8, n: u64) {
    let block = vec![fill; 1 << 20];
    let mut left = n;
    while left > 0 {
        let k = left.min(block.len() as u64) as usize;
        f.write_all(&block[..k]).unwrap();
        left -= k as u64;
    }
}

/// A source file: `SRC_OFF` bytes of 0x5A, `size` pattern bytes, `SRC_TAIL` bytes of 0xA5.
struct Source {
    file: File,
    size: u64,
}

fn make_source(dir: &Path, size: u64) -> Source {
    let mut f = create(&dir.join(format!("src-{size}")));
    write_fill(&mut f, 0x5A, SRC_OFF);
    let mut pos = 0u64;
    while pos < size {
        let n = (size - pos).min(4 << 20) as usize;
        f.write_all(pattern(pos, n)).unwrap();
        pos += n as u64;
    }
    write_fill(&mut f, 0xA5, SRC_TAIL as u64);
    Source { file: f, size }
}

/// Whether `f[off..off+len]` holds the source's pattern bytes `0..len`, every byte compared.
fn holds_pattern(f: &File, off: u64, len: u64) -> bool {
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    while pos < len {
        let n = (len - pos).min(buf.len() as u64) as usize;
        f.read_exact_at(&mut buf[..n], off + pos).unwrap();
        if buf[..n] != *pattern(pos, n) {
            return false;
        }
        pos += n as u64;
    }
    true
}

/// Every byte of `f[off..off+len]` equals `fill`.
fn assert_filled(f: &File, off: u64, len: u64, fill: u8, what: &str) {
    let mut buf = vec![0u8; len as usize];
    f.read_exact_at(&mut buf, off).unwrap();
    if let Some(i) = buf.iter().position(|&b| b != fill) {
        panic!(
            "{what}: byte {} is {:#x}, want {fill:#x}",
            off + i as u64,
            buf[i]
        );
    }
}

/// Where the first difference from the pattern is (for a readable failure after a hash
/// mismatch).
fn first_wrong(f: &File, off: u64, len: u64) -> Option<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    while pos < len {
        let n = (len - pos).min(buf.len() as u64) as usize;
        f.read_exact_at(&mut buf[..n], off + pos).unwrap();
        if let Some(i) = buf[..n]
            .iter()
            .zip(pattern(pos, n))
            .position(|(a, b)| a != b)
        {
            return Some(pos + i as u64);
        }
        pos += n as u64;
    }
    None
}

/// One receive side: the receiver's path and how it writes the file.
#[derive(Debug, Clone, Copy)]
struct RxWay {
    path: RxPath,
    mode: FileRxMode,
}

const RX_WAYS: [RxWay; 4] = [
    RxWay {
        path: RxPath::Copy,
        mode: FileRxMode::Splice,
    },
    RxWay {
        path: RxPath::Mmap,
        mode: FileRxMode::Splice,
    },
    RxWay {
        path: RxPath::Copy,
        mode: FileRxMode::Write,
    },
    RxWay {
        path: RxPath::Mmap,
        mode: FileRxMode::Write,
    },
];

struct Outcome {
    tx: StatsSnapshot,
    rx: StatsSnapshot,
}

/// Sends `src`'s range with `tx_mode` and receives it into a fresh file (prefix of 0xC3 up to
/// `DST_OFF`) the `rx` way; checks the count, the end of stream, and the destination.
fn file_transfer(
    topo: Topo<'_>,
    dir: &Path,
    src: &Source,
    tx_mode: FileTxMode,
    rx: RxWay,
) -> Outcome {
    let what = format!("{tx_mode}->{}/{} size {}", rx.path, rx.mode, src.size);
    let dst_path = dir.join(format!(
        "dst-{tx_mode}-{}-{}-{}",
        rx.path, rx.mode, src.size
    ));
    let mut dst = create(&dst_path);
    write_fill(&mut dst, 0xC3, DST_OFF);
    let listener = listen(topo, &receiver_config(rx.path));
    let port = listener.local_addr().unwrap().port();
    let (txs, rxs) = std::thread::scope(|s| {
        let dst = &dst;
        let what = &what;
        let r = s.spawn(move || {
            let mut r = listener.accept().unwrap();
            let n = r
                .recv_to_file_with(dst, DST_OFF, src.size, rx.mode)
                .unwrap_or_else(|e| panic!("{what}: recv_to_file: {e}"));
            assert_eq!(n, src.size);
            // Exactly the range was taken from the stream: what follows is its end.
            assert!(r.recv().unwrap().is_none(), "bytes after the range");
            r.stats().snapshot()
        });
        let mut tx = connect(topo, port, &sender_config(TxPath::Copy));
        let n = tx
            .send_file_with(&src.file, SRC_OFF, src.size, tx_mode)
            .unwrap();
        assert_eq!(n, src.size);
        let txs = tx.finish().unwrap();
        (txs, r.join().unwrap())
    });
    let what = format!("{what}: destination");
    assert_eq!(
        dst.metadata().unwrap().len(),
        DST_OFF + src.size,
        "{what} size"
    );
    assert_filled(&dst, 0, DST_OFF, 0xC3, &what);
    if !holds_pattern(&dst, DST_OFF, src.size) {
        panic!(
            "{what}: the received range differs from the source; first wrong byte at range offset {:?}",
            first_wrong(&dst, DST_OFF, src.size)
        );
    }
    drop(dst);
    std::fs::remove_file(&dst_path).unwrap();
    Outcome { tx: txs, rx: rxs }
}

fn check_stats(out: &Outcome, size: u64, tx_mode: FileTxMode, rx: RxWay, tmpfs: bool, what: &str) {
    let (t, r) = (&out.tx, &out.rx);
    assert_eq!(t.tx_bytes(), size, "{what}: sender total");
    assert_eq!(r.rx_bytes(), size, "{what}: receiver total");
    match tx_mode {
        FileTxMode::Sendfile | FileTxMode::Splice => {
            if tmpfs {
                assert_eq!(t.tx_bytes_file, size, "{what}: all from the page cache");
                assert_eq!(t.fallback_ops(FallbackReason::FileUnsupported), 0, "{what}");
                assert_eq!(t.tx_calls_file > 0, size > 0, "{what}: file calls");
            }
        }
        _ => {
            assert_eq!(t.tx_bytes_copy, size, "{what}: read+send copies");
            assert_eq!(t.tx_bytes_file, 0, "{what}");
        }
    }
    match rx.mode {
        FileRxMode::Splice => {
            if tmpfs {
                assert_eq!(r.rx_bytes_file, size, "{what}: all spliced");
                assert_eq!(r.fallback_ops(FallbackReason::FileUnsupported), 0, "{what}");
            }
        }
        _ => {
            assert_eq!(r.rx_bytes_file, 0, "{what}: nothing spliced");
            if rx.path == RxPath::Copy {
                assert_eq!(r.rx_bytes_copied, size, "{what}: recv copies");
            } else if size >= 4096 {
                assert!(r.rx_zc_calls >= 1, "{what}: used TCP_ZEROCOPY_RECEIVE");
            }
        }
    }
}

fn run_matrix(topo: Topo<'_>, label: &str) {
    let (dir, tmpfs) = scratch_dir();
    let mut summary = Vec::new();
    for size in SIZES {
        let src = make_source(dir.path(), size);
        for tx_mode in FileTxMode::ALL {
            for rx in RX_WAYS {
                let what = format!("{label} {tx_mode}->{}/{} size {size}", rx.path, rx.mode);
                eprintln!("case {what}");
                let out = file_transfer(topo, dir.path(), &src, tx_mode, rx);
                check_stats(&out, size, tx_mode, rx, tmpfs, &what);
                if size == 64 << 20 {
                    summary.push(format!(
                        "{what}: tx file {} B in {} calls, copy {} B; rx spliced {} B in {} calls, copied {} B, mapped {} B",
                        out.tx.tx_bytes_file,
                        out.tx.tx_calls_file,
                        out.tx.tx_bytes_copy,
                        out.rx.rx_bytes_file,
                        out.rx.rx_calls_file,
                        out.rx.rx_bytes_copied,
                        out.rx.rx_bytes_mapped
                    ));
                }
            }
        }
    }
    if !tmpfs {
        eprintln!("note: no tmpfs scratch dir; fallback counts not asserted");
    }
    for line in summary {
        println!("{line}");
    }
}

#[test]
fn file_matrix_loopback() {
    run_matrix(Topo::Loopback, "lo");
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn file_matrix_netns_mtu_1500() {
    let pair = veth_pair(1500);
    run_matrix(Topo::Netns(&pair), "veth1500");
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn file_matrix_netns_mtu_9000() {
    let pair = veth_pair(9000);
    run_matrix(Topo::Netns(&pair), "veth9000");
}

/// Receiving into the middle of an existing, larger file: the bytes before and after the
/// range stay, the size does not change.
#[test]
fn overwriting_a_range_keeps_the_rest_of_the_file() {
    let (dir, _) = scratch_dir();
    let size = (1 << 20) + 3;
    let src = make_source(dir.path(), size);
    for rx in RX_WAYS {
        let path = dir.path().join(format!("ow-{}-{}", rx.path, rx.mode));
        let mut dst = create(&path);
        write_fill(&mut dst, 0xC3, DST_OFF + size + 5000);
        let total = dst.metadata().unwrap().len();
        let listener = listen(Topo::Loopback, &receiver_config(rx.path));
        let port = listener.local_addr().unwrap().port();
        std::thread::scope(|s| {
            let dst = &dst;
            let r = s.spawn(move || {
                let mut r = listener.accept().unwrap();
                r.recv_to_file_with(dst, DST_OFF, size, rx.mode).unwrap();
            });
            let mut tx = connect(Topo::Loopback, port, &sender_config(TxPath::Copy));
            tx.send_file(&src.file, SRC_OFF, size).unwrap();
            tx.finish().unwrap();
            r.join().unwrap();
        });
        let what = format!("overwrite {}/{}", rx.path, rx.mode);
        assert_eq!(dst.metadata().unwrap().len(), total, "{what}: size kept");
        assert_filled(&dst, 0, DST_OFF, 0xC3, &what);
        assert_filled(&dst, DST_OFF + size, 5000, 0xC3, &what);
        assert!(holds_pattern(&dst, DST_OFF, size), "{what}");
    }
}

/// One transfer of the transfer tool's shape over loopback: a `tx_path` sender sends
/// `header + body` pattern bytes; an `rx_path` receiver reads the first `header` with
/// `recv_into` (a loop: it may return less) and checks them, writes the next `body` into
/// `dst` at 0 with `mode`, and must then see the end of the stream. Returns the path the
/// receiver ran and its stats.
fn header_then_file(
    rx_path: RxPath,
    tx_path: TxPath,
    header: usize,
    dst: &File,
    body: u64,
    mode: FileRxMode,
) -> (RxPath, StatsSnapshot) {
    let listener = listen(Topo::Loopback, &receiver_config(rx_path));
    let port = listener.local_addr().unwrap().port();
    std::thread::scope(|s| {
        let r = s.spawn(move || {
            let mut r = listener.accept().unwrap();
            let mut head = vec![0u8; header];
            let mut got = 0;
            while got < header {
                let n = r.recv_into(&mut head[got..]).unwrap();
                assert!(n > 0, "stream ended in the header");
                got += n;
            }
            assert_eq!(&head[..], pattern(0, header), "header");
            r.recv_to_file_with(dst, 0, body, mode).unwrap();
            assert!(r.recv().unwrap().is_none(), "bytes after the body");
            (r.path(), r.stats().snapshot())
        });
        let mut tx = connect(Topo::Loopback, port, &sender_config(tx_path));
        common::send_pattern(&mut tx, header as u64 + body, 0);
        tx.finish().unwrap();
        r.join().unwrap()
    })
}

/// The transfer tool's shape: a header read with `recv_into` (which may leave the rest of a
/// chunk — mapped pages, copybuf, scratch — in the receiver), then the body to a file. The
/// held bytes must reach the file first, in order. The sender is `MSG_ZEROCOPY` so the mmap
/// receiver really maps (loopback's deferred copy lands in order-0 pages, docs/measurements/kernel-findings.md §2).
#[test]
fn bytes_an_earlier_receive_left_behind_go_to_the_file_first() {
    const HEADER: usize = 1000;
    const BODY: u64 = (4 << 20) + 17;
    let (dir, _) = scratch_dir();
    for rx in RX_WAYS {
        for zc_sender in [true, false] {
            let what = format!("leftover {}/{} zc sender {zc_sender}", rx.path, rx.mode);
            let path = dir
                .path()
                .join(format!("lo-{}-{}-{zc_sender}", rx.path, rx.mode));
            let dst = create(&path);
            let tx_path = if zc_sender {
                TxPath::Zerocopy
            } else {
                TxPath::Copy
            };
            let (_, rxs) = header_then_file(rx.path, tx_path, HEADER, &dst, BODY, rx.mode);
            assert_eq!(
                rxs.rx_bytes(),
                HEADER as u64 + BODY,
                "{what}: receiver total"
            );
            let mut v = common::Verifier { pos: HEADER as u64 };
            let mut buf = vec![0u8; 1 << 20];
            let mut pos = 0u64;
            while pos < BODY {
                let n = (BODY - pos).min(buf.len() as u64) as usize;
                dst.read_exact_at(&mut buf[..n], pos).unwrap();
                v.check(&buf[..n]);
                pos += n as u64;
            }
            assert_eq!(dst.metadata().unwrap().len(), BODY, "{what}: size");
            if rx.path == RxPath::Mmap && zc_sender {
                assert!(rxs.rx_bytes_mapped > 0, "{what}: nothing was mapped");
            }
            eprintln!(
                "{what}: mapped {} B, copied {} B, spliced {} B",
                rxs.rx_bytes_mapped, rxs.rx_bytes_copied, rxs.rx_bytes_file
            );
        }
    }
}

/// Whatever receive path the receiver was made with (including ones that cannot hand their
/// socket to splice, which then take the `Write` way, counted), a header read with
/// `recv_into` and then the body into a file come out whole and in order.
#[test]
fn every_receive_path_writes_the_file_in_order() {
    const HEADER: usize = 777;
    const BODY: u64 = (2 << 20) + 9;
    let (dir, _) = scratch_dir();
    for path in RxPath::ALL {
        for mode in FileRxMode::ALL {
            let dst = create(&dir.path().join(format!("every-{path}-{mode}")));
            let (used, rxs) = header_then_file(path, TxPath::Copy, HEADER, &dst, BODY, mode);
            let what = format!("asked {path}, got {used}, {mode}");
            let mut v = common::Verifier { pos: HEADER as u64 };
            let mut buf = vec![0u8; BODY as usize];
            dst.read_exact_at(&mut buf, 0).unwrap();
            v.check(&buf);
            assert_eq!(
                rxs.rx_bytes(),
                HEADER as u64 + BODY,
                "{what}: receiver total"
            );
            let fell_back = rxs.fallback_bytes(FallbackReason::FileUnsupported);
            eprintln!(
                "{what}: spliced {} B, file fallback {fell_back} B",
                rxs.rx_bytes_file
            );
            match (mode, used) {
                (FileRxMode::Splice, RxPath::Copy | RxPath::Mmap) => {
                    assert!(rxs.rx_bytes_file > 0, "{what}: spliced");
                    assert_eq!(fell_back, 0, "{what}");
                }
                (FileRxMode::Splice, _) => {
                    // Either the path handed its socket over, or every body byte that was
                    // not already held went the Write way and was counted.
                    assert!(rxs.rx_bytes_file > 0 || fell_back > 0, "{what}");
                }
                _ => assert_eq!(rxs.rx_bytes_file, 0, "{what}: nothing spliced"),
            }
        }
    }
}

/// A header sent with copy semantics, then the file: order is kept across the two.
#[test]
fn a_header_then_the_file_arrive_in_order() {
    let (dir, _) = scratch_dir();
    let size = 65537;
    let src = make_source(dir.path(), size);
    for tx_mode in FileTxMode::ALL {
        let dst = create(&dir.path().join(format!("hdr-{tx_mode}")));
        let listener = listen(Topo::Loopback, &receiver_config(RxPath::Copy));
        let port = listener.local_addr().unwrap().port();
        std::thread::scope(|s| {
            let dst = &dst;
            let r = s.spawn(move || {
                let mut r = listener.accept().unwrap();
                let mut head = [0u8; 5];
                let mut got = 0;
                while got < 5 {
                    got += r.recv_into(&mut head[got..]).unwrap();
                }
                assert_eq!(&head, b"HELLO");
                r.recv_to_file(dst, 0, size).unwrap();
            });
            let mut tx = connect(Topo::Loopback, port, &sender_config(TxPath::Copy));
            tx.send_slice(b"HELLO").unwrap();
            tx.send_file_with(&src.file, SRC_OFF, size, tx_mode)
                .unwrap();
            tx.finish().unwrap();
            r.join().unwrap();
        });
        assert!(holds_pattern(&dst, 0, size), "{tx_mode}");
    }
}

/// A range past the end of a regular file is refused before a byte goes out; the next,
/// valid range arrives alone.
#[test]
fn a_range_beyond_the_end_of_the_file_is_refused_before_sending() {
    let (dir, _) = scratch_dir();
    let src = make_source(dir.path(), 1000);
    let file_len = SRC_OFF + 1000 + SRC_TAIL as u64;
    for tx_mode in FileTxMode::ALL {
        let listener = listen(Topo::Loopback, &receiver_config(RxPath::Copy));
        let port = listener.local_addr().unwrap().port();
        std::thread::scope(|s| {
            let r = s.spawn(move || {
                let mut r = listener.accept().unwrap();
                common::recv_pattern(&mut r, 0)
            });
            let mut tx = connect(Topo::Loopback, port, &sender_config(TxPath::Copy));
            let e = tx
                .send_file_with(&src.file, file_len - 10, 11, tx_mode)
                .unwrap_err();
            assert!(
                matches!(e, Error::RangeBeyondEof { offset, len: 11, file_len: l } if offset == file_len - 10 && l == file_len),
                "{tx_mode}: {e}"
            );
            eprintln!("{tx_mode}: {e}");
            let e = tx
                .send_file_with(&src.file, u64::MAX - 5, 10, tx_mode)
                .unwrap_err();
            assert!(matches!(e, Error::UnsuitableFile(_)), "{tx_mode}: {e}");
            tx.send_file_with(&src.file, SRC_OFF, 1000, tx_mode)
                .unwrap();
            let stats = tx.finish().unwrap();
            assert_eq!(stats.tx_bytes(), 1000, "{tx_mode}: nothing else went out");
            assert_eq!(r.join().unwrap(), 1000, "{tx_mode}: received");
        });
    }
}

/// A file that ends before the range does although its size did not say so — here
/// /proc/version, whose `st_size` is 0 like every procfs file — is `Truncated`, with the
/// bytes that did go out, and the receiver sees exactly those.
#[test]
fn a_file_ending_early_is_truncated_not_short() {
    let content = std::fs::read("/proc/version").unwrap();
    let claimed = content.len() as u64 + 100;
    for tx_mode in FileTxMode::ALL {
        let file = File::open("/proc/version").unwrap();
        let listener = listen(Topo::Loopback, &receiver_config(RxPath::Copy));
        let port = listener.local_addr().unwrap().port();
        std::thread::scope(|s| {
            let r = s.spawn(move || {
                let mut r = listener.accept().unwrap();
                let mut got = Vec::new();
                while let Some(c) = r.recv().unwrap() {
                    got.extend_from_slice(&c);
                }
                got
            });
            let mut tx = connect(Topo::Loopback, port, &sender_config(TxPath::Copy));
            let e = tx.send_file_with(&file, 0, claimed, tx_mode).unwrap_err();
            eprintln!("{tx_mode}: {e}");
            assert!(
                matches!(e, Error::Truncated { expected, got, .. } if expected == claimed && got == content.len() as u64),
                "{tx_mode}: {e}"
            );
            tx.finish().unwrap();
            assert_eq!(
                r.join().unwrap(),
                content,
                "{tx_mode}: the bytes that went out"
            );
        });
    }
}

/// The peer closes after half the range: `Truncated` with the count, the half is in the file
/// at the right place, and the file we grew is cut back to it (no zero-filled tail).
#[test]
fn a_peer_closing_early_is_truncated_with_the_count() {
    let (dir, _) = scratch_dir();
    let size: u64 = (8 << 20) + 5;
    let half = size / 2;
    let src = make_source(dir.path(), size);
    for rx in RX_WAYS {
        let what = format!("early close {}/{}", rx.path, rx.mode);
        let path = dir.path().join(format!("trunc-{}-{}", rx.path, rx.mode));
        let mut dst = create(&path);
        write_fill(&mut dst, 0xC3, DST_OFF);
        let listener = listen(Topo::Loopback, &receiver_config(rx.path));
        let port = listener.local_addr().unwrap().port();
        let e = std::thread::scope(|s| {
            let dst = &dst;
            let r = s.spawn(move || {
                let mut r = listener.accept().unwrap();
                r.recv_to_file_with(dst, DST_OFF, size, rx.mode)
                    .unwrap_err()
            });
            let mut tx = connect(Topo::Loopback, port, &sender_config(TxPath::Copy));
            tx.send_file(&src.file, SRC_OFF, half).unwrap();
            tx.finish().unwrap();
            r.join().unwrap()
        });
        eprintln!("{what}: {e}");
        assert!(
            matches!(e, Error::Truncated { expected, got, .. } if expected == size && got == half),
            "{what}: {e}"
        );
        assert_eq!(
            dst.metadata().unwrap().len(),
            DST_OFF + half,
            "{what}: cut back"
        );
        assert_filled(&dst, 0, DST_OFF, 0xC3, &what);
        assert_eq!(
            first_wrong(&dst, DST_OFF, half),
            None,
            "{what}: the half that came"
        );
    }
}

/// A stalled peer ends in `Timeout`, on both sides and in every mode, never a hang.
#[test]
fn a_stalled_peer_times_out() {
    let (dir, _) = scratch_dir();
    let big = create(&dir.path().join("sparse"));
    big.set_len(256 << 20).unwrap();
    let short = Duration::from_millis(300);
    // Sender side: the receiver accepts and never reads.
    for tx_mode in FileTxMode::ALL {
        let listener = listen(Topo::Loopback, &receiver_config(RxPath::Copy));
        let port = listener.local_addr().unwrap().port();
        let mut cfg = sender_config(TxPath::Copy);
        cfg.timeout = Some(short);
        let held = std::thread::scope(|s| {
            let r = s.spawn(|| listener.accept().unwrap());
            let mut tx = connect(Topo::Loopback, port, &cfg);
            let rx = r.join().unwrap();
            let e = tx.send_file_with(&big, 0, 256 << 20, tx_mode).unwrap_err();
            eprintln!("sender {tx_mode}: {e}");
            assert!(matches!(e, Error::Timeout { .. }), "sender {tx_mode}: {e}");
            rx
        });
        drop(held);
    }
    // Receiver side: the sender connects and sends nothing.
    for rx in RX_WAYS {
        let mut rcfg = receiver_config(rx.path);
        rcfg.timeout = Some(short);
        let listener = listen(Topo::Loopback, &rcfg);
        let port = listener.local_addr().unwrap().port();
        let dst = create(&dir.path().join(format!("stall-{}-{}", rx.path, rx.mode)));
        let tx = connect(Topo::Loopback, port, &sender_config(TxPath::Copy));
        let mut r = listener.accept().unwrap();
        let e = r.recv_to_file_with(&dst, 0, 4096, rx.mode).unwrap_err();
        eprintln!("receiver {}/{}: {e}", rx.path, rx.mode);
        assert!(
            matches!(e, Error::Timeout { .. }),
            "receiver {}/{}: {e}",
            rx.path,
            rx.mode
        );
        assert_eq!(
            dst.metadata().unwrap().len(),
            0,
            "nothing arrived, nothing kept"
        );
        drop(tx);
    }
}

/// Forced fallback on the sending side: /proc/self/cmdline has no `splice_read`, so
/// `sendfile` and `splice` from it fail with `EINVAL` here (shown first, with the raw call);
/// `send_file` then sends it by pread+send, counts the fallback, and the bytes arrive whole.
#[test]
fn a_procfs_source_falls_back_to_read_send_and_is_counted() {
    const PROC: &str = "/proc/self/cmdline";
    let content = std::fs::read(PROC).unwrap();
    let len = content.len() as u64;
    assert!(len > 0);
    {
        let file = File::open(PROC).unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        match zcnet_sys::raw::splice::sendfile(c.as_fd(), file.as_fd(), 0, content.len()) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                eprintln!("sendfile({PROC}) → {e} (EINVAL): the kernel refuses, as expected");
            }
            // The fallback this test checks cannot be forced here: the test needs another
            // source, not a pass that checked nothing.
            other => panic!("sendfile({PROC}) did not fail with EINVAL here ({other:?})"),
        }
    }
    for tx_mode in [FileTxMode::Sendfile, FileTxMode::Splice] {
        let file = File::open(PROC).unwrap();
        let listener = listen(Topo::Loopback, &receiver_config(RxPath::Copy));
        let port = listener.local_addr().unwrap().port();
        let stats = std::thread::scope(|s| {
            let r = s.spawn(move || {
                let mut r = listener.accept().unwrap();
                let mut got = Vec::new();
                while let Some(c) = r.recv().unwrap() {
                    got.extend_from_slice(&c);
                }
                got
            });
            let mut tx = connect(Topo::Loopback, port, &sender_config(TxPath::Copy));
            assert_eq!(tx.send_file_with(&file, 0, len, tx_mode).unwrap(), len);
            let stats = tx.finish().unwrap();
            assert_eq!(r.join().unwrap(), content, "{tx_mode}: bytes");
            stats
        });
        eprintln!("{tx_mode} from {PROC}: fallbacks {:?}", stats.fallbacks);
        assert_eq!(
            stats.fallback_ops(FallbackReason::FileUnsupported),
            1,
            "{tx_mode}"
        );
        assert_eq!(
            stats.fallback_bytes(FallbackReason::FileUnsupported),
            len,
            "{tx_mode}"
        );
        assert_eq!(stats.tx_bytes_copy, len, "{tx_mode}");
        assert_eq!(stats.tx_bytes_file, 0, "{tx_mode}");
    }
}

/// Forced fallback on the receiving side: /proc/self/mem takes `pwrite` at any address of
/// our own memory but has no `splice_write`, so splicing into it fails with `EINVAL` (shown
/// first). `recv_to_file` writes what is already in the pipe and the rest by recv+pwrite,
/// counts the fallback, and every byte lands in the target buffer.
#[test]
fn a_procfs_sink_falls_back_to_recv_write_and_is_counted() {
    const SIZE: usize = (1 << 20) + 3;
    let mem = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")
        .unwrap();
    {
        let probe = vec![0u8; 16];
        let pipe = zcnet_sys::raw::splice::Pipe::new().unwrap();
        File::from(pipe.write_end().try_clone_to_owned().unwrap())
            .write_all(b"0123456789abcdef")
            .unwrap();
        let addr = probe.as_ptr() as u64;
        match zcnet_sys::raw::splice::splice(
            pipe.read_end(),
            None,
            mem.as_fd(),
            Some(addr),
            16,
            zcnet_sys::raw::splice::SpliceFlags::empty(),
        ) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                eprintln!("splice(pipe → /proc/self/mem) → {e} (EINVAL): no splice_write");
            }
            // As above: the fallback cannot be forced with this sink.
            other => panic!("splice into /proc/self/mem did not fail with EINVAL ({other:?})"),
        }
        std::hint::black_box(&probe);
    }
    for rx_path in RxPath::ALL {
        let mut target = vec![0u8; SIZE];
        let addr = target.as_mut_ptr() as u64;
        let listener = listen(Topo::Loopback, &receiver_config(rx_path));
        let port = listener.local_addr().unwrap().port();
        let stats = std::thread::scope(|s| {
            let mem = &mem;
            let r = s.spawn(move || {
                let mut r = listener.accept().unwrap();
                r.recv_to_file_with(mem, addr, SIZE as u64, FileRxMode::Splice)
                    .unwrap();
                assert!(r.recv().unwrap().is_none());
                r.stats().snapshot()
            });
            let mut tx = connect(Topo::Loopback, port, &sender_config(TxPath::Copy));
            common::send_pattern(&mut tx, SIZE as u64, 0);
            tx.finish().unwrap();
            r.join().unwrap()
        });
        // The kernel wrote `target` behind the compiler's back: make it assume so.
        std::hint::black_box(&mut target);
        let mut v = common::Verifier::default();
        v.check(&target);
        eprintln!("{rx_path} into /proc/self/mem: {:?}", stats.fallbacks);
        assert_eq!(
            stats.fallback_ops(FallbackReason::FileUnsupported),
            1,
            "{rx_path}"
        );
        assert_eq!(
            stats.fallback_bytes(FallbackReason::FileUnsupported),
            SIZE as u64,
            "{rx_path}"
        );
        assert_eq!(stats.rx_bytes_file, 0, "{rx_path}");
        assert_eq!(stats.rx_bytes(), SIZE as u64, "{rx_path}");
    }
}

/// An `O_APPEND` destination is refused: `pwrite` there appends whatever the offset.
#[test]
fn an_append_only_destination_is_refused() {
    let (dir, _) = scratch_dir();
    let path: PathBuf = dir.path().join("append");
    let f = OpenOptions::new()
        .append(true)
        .create(true)
        .open(&path)
        .unwrap();
    let listener = listen(Topo::Loopback, &receiver_config(RxPath::Copy));
    let port = listener.local_addr().unwrap().port();
    let _tx = connect(Topo::Loopback, port, &sender_config(TxPath::Copy));
    let mut r = listener.accept().unwrap();
    let e = r.recv_to_file(&f, 0, 10).unwrap_err();
    assert!(matches!(e, Error::UnsuitableFile(_)), "{e}");
}
