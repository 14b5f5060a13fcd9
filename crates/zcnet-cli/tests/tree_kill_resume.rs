//! A pipelined tree transfer cut by `kill -9` of either end, at points drawn at random,
//! leaves only verified final files (each one's bytes, mode and mtime equal to the
//! sender's) and `.partial` files; a rerun with `--resume` completes the tree — every file
//! right, no partial file left. The tree holds runs of large files, so a kill often lands
//! while several of them are sent and not yet answered (protocol 7), over one stream and
//! over two.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// The binary, with its TLS identity and known hosts in cargo's scratch space (never in
/// the developer's home).
fn zcnet() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_zcnet"));
    c.env(
        "XDG_STATE_HOME",
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("state"),
    );
    c
}

/// xorshift: reproducible from the seed printed by each test.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What each source file must arrive as: its BLAKE3, mode and mtime.
#[derive(Debug, Clone, PartialEq)]
struct Want {
    hash: [u8; 32],
    mode: u32,
    mtime: (i64, i64),
}

fn describe(p: &Path) -> Want {
    let data = std::fs::read(p).unwrap();
    let m = std::fs::metadata(p).unwrap();
    Want {
        hash: *blake3::hash(&data).as_bytes(),
        mode: m.mode() & 0o7777,
        mtime: (m.mtime(), m.mtime_nsec()),
    }
}

/// `small` files of 0 B to 20 KiB (sent as `Put`s) in three levels of directories and
/// `large` files of 1–3 MiB (sent by `sendfile`, resumable) among them, with assorted modes
/// and mtimes. Returns each file's name under `root` and what it must arrive as. With 21
/// or fewer files per large one they all share one directory (every 21st name), so the
/// walk sends them in a row.
fn make_tree(root: &Path, small: usize, large: usize, rng: &mut Rng) -> BTreeMap<String, Want> {
    let modes = [0o644, 0o600, 0o755, 0o640, 0o444];
    let mut want = BTreeMap::new();
    for i in 0..small + large {
        let name = format!("d{}/e{}/f{i:04}", i % 7, i % 3);
        let len = if large > 0 && i % ((small + large) / large) == 5 {
            (1 << 20) + rng.below(2 << 20) as usize
        } else {
            rng.below(20 << 10) as usize
        };
        let p = root.join(&name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let mut f = std::fs::File::create(&p).unwrap();
        f.write_all(&data).unwrap();
        let t = SystemTime::UNIX_EPOCH
            + Duration::new(
                1_500_000_000 + rng.below(1 << 28),
                rng.below(1_000_000_000) as u32,
            );
        f.set_modified(t).unwrap();
        drop(f);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(modes[i % modes.len()]))
            .unwrap();
        want.insert(name, describe(&p));
    }
    want
}

/// Every regular file under `dir`, by its path relative to `dir`.
fn files_under(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(p);
            } else {
                assert!(ft.is_file(), "only files and directories arrive: {p:?}");
                let rel = p.strip_prefix(dir).unwrap().to_string_lossy().to_string();
                out.push((rel, p));
            }
        }
    }
    out
}

/// Checks that `dst` holds only `.partial` files and final files equal to what was sent;
/// returns (finals, partials).
fn check_only_verified_finals(dst: &Path, want: &BTreeMap<String, Want>) -> (usize, usize) {
    let (mut finals, mut partials) = (0, 0);
    for (rel, p) in files_under(dst) {
        if rel.ends_with(".partial") {
            partials += 1;
            continue;
        }
        let w = want
            .get(&rel)
            .unwrap_or_else(|| panic!("{rel:?} is neither a partial file nor one that was sent"));
        assert_eq!(&describe(&p), w, "{rel:?} differs from the sender's file");
        finals += 1;
    }
    (finals, partials)
}

fn count_finals(dst: &Path) -> usize {
    files_under(dst)
        .iter()
        .filter(|(rel, _)| !rel.ends_with(".partial"))
        .count()
}

/// A child process that is killed if the test ends early (a failed assertion), so no
/// receiver is left listening.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `zcnet recv --once` on an ephemeral loopback port, with its address.
fn start_recv(dir: &Path, extra: &[&str]) -> (Reaped, String) {
    let mut child = zcnet()
        .args(["recv", "--once", "--listen", "127.0.0.1:0", "--dir"])
        .arg(dir)
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .rsplit(" on ")
        .next()
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    // Keep draining its stderr so it never blocks writing there.
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    (Reaped(child), addr)
}

/// Waits (bounded: a hang guard, not a speed check) for `child` to exit.
fn wait_bounded(child: &mut Child, what: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st.success();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what} did not exit");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A scratch directory on tmpfs when there is one: this test is about where a kill lands,
/// not about the disk, and a disk's fsyncs would make it slow.
fn scratch() -> tempfile::TempDir {
    match Path::new("/dev/shm").is_dir() {
        true => tempfile::tempdir_in("/dev/shm").unwrap(),
        false => tempfile::tempdir().unwrap(),
    }
}

fn seed() -> u64 {
    let s = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    (s ^ (s >> 29)) | 1
}

#[test]
fn kill_9_of_either_end_leaves_only_verified_finals_and_resume_completes_the_tree() {
    let seed = seed();
    eprintln!("seed {seed}");
    let mut rng = Rng(seed);
    let src = scratch();
    let root = src.path().join("tree");
    let want: BTreeMap<String, Want> = make_tree(&root, 600, 30, &mut rng)
        .into_iter()
        .map(|(k, v)| (format!("tree/{k}"), v))
        .collect();
    let mut landed_mid_way = 0;
    let rounds = [(false, "1"), (true, "1"), (false, "2"), (true, "2")];
    for (round, (kill_receiver, streams)) in rounds.into_iter().enumerate() {
        let dst = scratch();
        let (mut recv, addr) = start_recv(dst.path(), &["--resume"]);
        let mut send = Reaped(
            zcnet()
                .args(["send", "--quiet", "--streams", streams, "--to", &addr])
                .arg(&root)
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let at = want.len() / 8 + rng.below(want.len() as u64 / 2) as usize;
        let deadline = Instant::now() + Duration::from_secs(60);
        while count_finals(dst.path()) < at && send.0.try_wait().unwrap().is_none() {
            if Instant::now() >= deadline {
                panic!("hang guard: no progress");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let (victim, other) = if kill_receiver {
            (&mut recv.0, &mut send.0)
        } else {
            (&mut send.0, &mut recv.0)
        };
        let _ = victim.kill(); // SIGKILL
        let _ = victim.wait();
        wait_bounded(other, "the other end");
        let (finals, partials) = check_only_verified_finals(dst.path(), &want);
        eprintln!(
            "round {round}: {streams} stream(s), killed the {} after {at} files: {finals} final, {partials} partial",
            if kill_receiver { "receiver" } else { "sender" }
        );
        if finals < want.len() {
            landed_mid_way += 1;
        }

        // A rerun with --resume completes it: every file right, nothing partial left.
        let (mut recv, addr) = start_recv(dst.path(), &["--resume"]);
        let out = zcnet()
            .args(["send", "--quiet", "--streams", streams, "--to", &addr])
            .arg(&root)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the resumed run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            wait_bounded(&mut recv.0, "the receiver"),
            "the receiver failed"
        );
        let (finals, partials) = check_only_verified_finals(dst.path(), &want);
        assert_eq!(finals, want.len(), "every file arrived");
        assert_eq!(partials, 0, "no partial file is left behind");
    }
    assert!(
        landed_mid_way > 0,
        "no kill landed before the tree was complete"
    );
}
