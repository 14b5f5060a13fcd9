//! Real, unmodified programs from the distribution under `zcnet run`, sending zero-copy
//! under write protection (`--tx zerocopy`, forced): every transfer is checked by hashing
//! what arrived against what was sent, and the sender's stats must show the bytes took the
//! protected path. Each test skips, saying why, when its program is not installed or the
//! library was not built (`cargo test --workspace` builds it; `-p zcnet-cli` alone does not).

use serde_json::Value;
use std::io::Read;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ZCNET: &str = env!("CARGO_BIN_EXE_zcnet");
const SIZE: usize = 64 << 20;

fn have(tool: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        eprintln!("SKIP: {tool} is not installed");
    }
    found
}

/// The library cargo built for this test (a dev-dependency: `target/<profile>/deps/`),
/// else the one beside `zcnet`.
fn library() -> PathBuf {
    let dir = Path::new(ZCNET).parent().unwrap();
    let deps = dir.join("deps/libzcnet_preload.so");
    if deps.is_file() {
        deps
    } else {
        dir.join("libzcnet_preload.so")
    }
}

fn library_built() -> bool {
    let ok = library().is_file();
    if !ok {
        eprintln!(
            "SKIP: {} not built (cargo build -p zcnet-preload)",
            library().display()
        );
    }
    ok
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether something listens on 127.0.0.1:`port`, read from /proc/net/tcp — without
/// connecting, which a one-connection server (`socat`, `iperf3 -1`) would take as its client.
fn listening(port: u16) -> bool {
    listening_in(
        &std::fs::read_to_string("/proc/net/tcp").unwrap_or_default(),
        Ipv4Addr::LOCALHOST,
        port,
    )
}

/// Whether the /proc/net/tcp text `table` has a listener on `addr:port`.
fn listening_in(table: &str, addr: Ipv4Addr, port: u16) -> bool {
    let want = format!("{:08X}:{port:04X}", u32::from_le_bytes(addr.octets()));
    Some(table).is_some_and(|t| {
        t.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1] == want && f[3] == "0A"
        })
    })
}

fn wait_listening(port: u16, child: &mut Child) {
    let start = Instant::now();
    while !listening(port) {
        assert!(child.try_wait().unwrap().is_none(), "server exited early");
        if start.elapsed() >= Duration::from_secs(20) {
            panic!("server never listened"); // a hang guard, not a speed check
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A file of `SIZE` pseudo-random bytes; its BLAKE3 hash.
fn data_file(dir: &Path) -> (PathBuf, blake3::Hash) {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut v = vec![0u8; SIZE];
    for c in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
    let p = dir.join("big.bin");
    std::fs::write(&p, &v).unwrap();
    (p, blake3::hash(&v))
}

fn hash_of(p: &Path) -> blake3::Hash {
    let mut h = blake3::Hasher::new();
    let mut f = std::fs::File::open(p).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    h.finalize()
}

fn zcnet_run(tx: &str, stats: &Path) -> Command {
    let mut c = Command::new(ZCNET);
    c.env("ZCNET_PRELOAD", library())
        .args(["run", "--tx", tx, "--stats"])
        .arg(stats)
        .arg("--");
    c
}

/// Stops a server so that it exits normally (its stats are written at exit).
fn stop(mut child: Child, signal: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("server did not stop on SIG{signal}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stats(p: &Path) -> Vec<Value> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Asserts the stats lines show `min` bytes sent zero-copy under protection (when the
/// write-protection engine could run there).
fn assert_protected(lines: &[Value], min: u64, who: &str) {
    assert!(!lines.is_empty(), "{who}: no stats written");
    for l in lines {
        eprintln!("{who} (pid {}): {}", l["pid"], l["total"]);
    }
    let zc: u64 = lines
        .iter()
        .map(|l| l["total"]["bytes_zerocopy"].as_u64().unwrap())
        .sum();
    if lines.iter().all(|l| l["engine"].is_null()) && zc == 0 {
        eprintln!("{who}: no write-protection engine ran; every send was copied (counted)");
        return;
    }
    assert!(
        zc >= min,
        "{who}: {zc} bytes zero-copy: {}",
        lines[0]["total"]
    );
}

#[test]
fn curl_fetches_from_python_http_server_byte_for_byte() {
    if !(library_built() && have("curl") && have("python3")) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (file, want) = data_file(dir.path());
    let (s_stats, c_stats) = (
        dir.path().join("server.jsonl"),
        dir.path().join("client.jsonl"),
    );
    let port = free_port();
    let mut server = zcnet_run("zerocopy", &s_stats)
        .args([
            "python3",
            "-m",
            "http.server",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--directory",
        ])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_listening(port, &mut server);
    let out = dir.path().join("got.bin");
    let st = zcnet_run("zerocopy", &c_stats)
        .args(["curl", "-sS", "--fail", "-o"])
        .arg(&out)
        .arg(format!(
            "http://127.0.0.1:{port}/{}",
            file.file_name().unwrap().to_str().unwrap()
        ))
        .status()
        .unwrap();
    stop(server, "INT");
    assert!(st.success(), "curl: {st}");
    assert_eq!(hash_of(&out), want, "the fetched file differs");
    assert_protected(&stats(&s_stats), SIZE as u64 / 2, "python3 http.server");
    assert_eq!(stats(&c_stats).len(), 1, "curl wrote its stats");
}

#[test]
fn curl_fetches_from_nginx_without_sendfile_byte_for_byte() {
    if !(library_built() && have("curl") && have("nginx")) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (file, want) = data_file(dir.path());
    let s_stats = dir.path().join("nginx.jsonl");
    let port = free_port();
    let d = dir.path().display();
    // sendfile off: nginx reads the file into its own buffer and writes it from there,
    // which is what the library interposes (sendfile it leaves to the kernel).
    let conf = format!(
        "daemon off; master_process off; worker_processes 1; pid {d}/nginx.pid;\n\
         error_log {d}/error.log;\n\
         events {{ worker_connections 64; }}\n\
         http {{ access_log off; sendfile off; output_buffers 2 1m;\n\
           client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d};\n\
           uwsgi_temp_path {d}; scgi_temp_path {d};\n\
           server {{ listen 127.0.0.1:{port}; root {d}; }} }}\n"
    );
    let conf_path = dir.path().join("nginx.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let mut server = zcnet_run("zerocopy", &s_stats)
        .args(["nginx", "-e"])
        .arg(dir.path().join("error.log"))
        .arg("-c")
        .arg(&conf_path)
        .spawn()
        .unwrap();
    wait_listening(port, &mut server);
    let out = dir.path().join("got.bin");
    // curl alone, then curl under the library too; every fetch checked by hash.
    let url = format!(
        "http://127.0.0.1:{port}/{}",
        file.file_name().unwrap().to_str().unwrap()
    );
    let c_stats = dir.path().join("curl.jsonl");
    let mut results = Vec::new();
    for under in [false, true] {
        let mut curl = if under {
            zcnet_run("zerocopy", &c_stats)
        } else {
            Command::new("curl")
        };
        if under {
            curl.arg("curl");
        }
        let st = curl
            .args(["-sS", "--fail", "-o"])
            .arg(&out)
            .arg(&url)
            .status()
            .unwrap();
        results.push((st, st.success().then(|| hash_of(&out))));
    }
    stop(server, "QUIT");
    for (st, got) in results {
        assert!(st.success(), "curl: {st}");
        assert_eq!(got, Some(want), "the fetched file differs");
    }
    assert_protected(&stats(&s_stats), SIZE as u64 / 2, "nginx");
}

#[test]
fn socat_pipes_a_file_byte_for_byte() {
    if !(library_built() && have("socat")) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (file, want) = data_file(dir.path());
    let (r_stats, s_stats) = (dir.path().join("recv.jsonl"), dir.path().join("send.jsonl"));
    let out = dir.path().join("got.bin");
    let port = free_port();
    let mut recv = zcnet_run("zerocopy", &r_stats)
        .args([
            "socat",
            "-u",
            &format!("TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr"),
        ])
        .arg(format!("CREATE:{}", out.display()))
        .spawn()
        .unwrap();
    wait_listening(port, &mut recv);
    // -b 1 MiB: socat reads into one buffer and writes it out, then reads into the same
    // buffer again while the previous write may still be in flight.
    let st = zcnet_run("zerocopy", &s_stats)
        .args(["socat", "-b", "1048576", "-u"])
        .arg(format!("OPEN:{}", file.display()))
        .arg(format!("TCP:127.0.0.1:{port}"))
        .status()
        .unwrap();
    assert!(st.success(), "socat sender: {st}");
    let start = Instant::now();
    while recv.try_wait().unwrap().is_none() {
        if start.elapsed() >= Duration::from_secs(30) {
            panic!("socat receiver did not finish"); // a hang guard, not a speed check
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(hash_of(&out), want, "the piped file differs");
    assert_protected(&stats(&s_stats), SIZE as u64 / 2, "socat");
}

/// iperf3 cannot be checked by hash: with `-F` its server writes what arrives to a file, but
/// even without the library that file differs from the one sent (its client sends whole
/// blocks after short reads). Both ends' byte counts are checked instead.
#[test]
fn iperf3_runs_and_both_ends_count_the_transfer() {
    if !(library_built() && have("iperf3")) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (s_stats, c_stats) = (
        dir.path().join("server.jsonl"),
        dir.path().join("client.jsonl"),
    );
    let port = free_port().to_string();
    let mut server = zcnet_run("zerocopy", &s_stats)
        .args(["iperf3", "-s", "-1", "-J", "-B", "127.0.0.1", "-p", &port])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_listening(port.parse().unwrap(), &mut server);
    let client = zcnet_run("zerocopy", &c_stats)
        .args([
            "iperf3",
            "-c",
            "127.0.0.1",
            "-p",
            &port,
            "-J",
            "-l",
            "1M",
            "-n",
            "256M",
        ])
        .output()
        .unwrap();
    assert!(client.status.success(), "iperf3 client: {}", client.status);
    let server = server.wait_with_output().unwrap();
    assert!(server.status.success(), "iperf3 server: {}", server.status);
    let c: Value = serde_json::from_slice(&client.stdout).unwrap();
    let s: Value = serde_json::from_slice(&server.stdout).unwrap();
    let sent = c["end"]["sum_sent"]["bytes"].as_u64().unwrap();
    let received = s["end"]["sum_received"]["bytes"].as_u64().unwrap();
    // iperf3's server stops counting when the test ends, a little before the last bytes
    // arrive (without the library too), and its data is random and unchecked: the counts
    // are what iperf3 can vouch for.
    assert!(sent >= 256 << 20, "sent {sent}");
    assert!(
        received <= sent && received >= sent / 2,
        "received {received} of {sent}"
    );
    // iperf3's send buffer is a private mapping of a temporary file, which the engine
    // refuses to protect (another mapping could change it): every byte is copied, and
    // counted as such.
    let lines = stats(&c_stats);
    assert_eq!(lines.len(), 1, "iperf3 -c wrote its stats");
    let t = &lines[0]["total"];
    let accounted = t["bytes_copy"].as_u64().unwrap() + t["bytes_zerocopy"].as_u64().unwrap();
    assert!(
        accounted >= sent,
        "stats account for {accounted} of {sent} bytes"
    );
    let refused = t["fallback_bytes"]["unprotectable"].as_u64().unwrap_or(0);
    assert!(
        t["bytes_zerocopy"].as_u64() > Some(0) || refused >= sent / 2,
        "neither zero-copy nor counted refusals: {t}"
    );
}

#[test]
fn redis_returns_large_values_byte_for_byte() {
    if !(library_built() && have("redis-server") && have("redis-cli") && have("redis-benchmark")) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s_stats = dir.path().join("redis.jsonl");
    let port = free_port().to_string();
    let mut server = zcnet_run("zerocopy", &s_stats)
        .args([
            "redis-server",
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_listening(port.parse().unwrap(), &mut server);
    // Four 8 MiB values stored and read back, each checked by hash.
    let (file, _) = data_file(dir.path());
    let data = std::fs::read(&file).unwrap();
    for (i, v) in data.chunks(8 << 20).take(4).enumerate() {
        let part = dir.path().join(format!("v{i}"));
        std::fs::write(&part, v).unwrap();
        let set = Command::new("redis-cli")
            .args(["-p", &port, "-x", "SET", &format!("k{i}")])
            .stdin(std::fs::File::open(&part).unwrap())
            .output()
            .unwrap();
        assert!(
            set.status.success() && set.stdout.starts_with(b"OK"),
            "SET: {set:?}"
        );
        let get = Command::new("redis-cli")
            .args(["-p", &port, "--raw", "GET", &format!("k{i}")])
            .output()
            .unwrap();
        assert!(get.status.success());
        // --raw ends the reply with a newline of its own.
        assert_eq!(
            blake3::hash(&get.stdout[..get.stdout.len() - 1]),
            blake3::hash(v),
            "value {i}"
        );
    }
    // Load with 1 MiB values from redis-benchmark (which checks nothing but completion).
    let bench = Command::new("redis-benchmark")
        .args([
            "-p", &port, "-d", "1048576", "-n", "200", "-c", "4", "-t", "set,get", "-q",
        ])
        .output()
        .unwrap();
    assert!(bench.status.success(), "redis-benchmark: {bench:?}");
    stop(server, "TERM");
    assert_protected(&stats(&s_stats), 32 << 20, "redis-server");
}

#[test]
fn rsync_daemon_transfers_a_file_byte_for_byte() {
    if !(library_built() && have("rsync")) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, want) = data_file(dir.path());
    let dest = dir.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    let (d_stats, c_stats) = (
        dir.path().join("daemon.jsonl"),
        dir.path().join("client.jsonl"),
    );
    let port = free_port().to_string();
    let conf = dir.path().join("rsyncd.conf");
    std::fs::write(
        &conf,
        format!(
            "use chroot = no\nuid = 0\ngid = 0\npid file = {d}/rsyncd.pid\n\
             [src]\npath = {d}\nread only = yes\n",
            d = dir.path().display()
        ),
    )
    .unwrap();
    let mut daemon = zcnet_run("zerocopy", &d_stats)
        .args([
            "rsync",
            "--daemon",
            "--no-detach",
            "--address",
            "127.0.0.1",
            "--port",
            &port,
        ])
        .arg(format!("--config={}", conf.display()))
        .spawn()
        .unwrap();
    wait_listening(port.parse().unwrap(), &mut daemon);
    // The daemon sends the file (it forks a sender per connection); the client receives.
    let st = zcnet_run("zerocopy", &c_stats)
        .args(["rsync", "-a", "--whole-file"])
        .arg(format!("rsync://127.0.0.1:{port}/src/big.bin"))
        .arg(&dest)
        .status()
        .unwrap();
    stop(daemon, "TERM");
    assert!(st.success(), "rsync: {st}");
    assert_eq!(
        hash_of(&dest.join("big.bin")),
        want,
        "the synced file differs"
    );
    let lines = stats(&d_stats);
    assert!(!lines.is_empty(), "the daemon's sender wrote no stats");
    for l in &lines {
        eprintln!("rsync daemon (pid {}): {}", l["pid"], l["total"]);
    }
    let sent: u64 = lines
        .iter()
        .map(|l| {
            l["total"]["bytes_copy"].as_u64().unwrap()
                + l["total"]["bytes_zerocopy"].as_u64().unwrap()
        })
        .sum();
    assert!(
        sent >= SIZE as u64,
        "the daemon's stats account for {sent} bytes"
    );
}

/// Across two network namespaces joined by veth (root): socat in namespace `a` sends a file
/// zero-copy under protection to socat in `b`.
#[test]
fn socat_pipes_a_file_between_namespaces_byte_for_byte() {
    if !(library_built() && have("socat")) {
        return;
    }
    if let Err(why) = zcnet_testbed::netns::available() {
        eprintln!("SKIP: {why}");
        return;
    }
    let pair = zcnet_testbed::netns::VethPair::create(1500).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (file, want) = data_file(dir.path());
    let (r_stats, s_stats) = (dir.path().join("recv.jsonl"), dir.path().join("send.jsonl"));
    let out = dir.path().join("got.bin");
    let port = free_port();
    let b = pair.addr_b();
    let in_ns = |name: &str| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", name, ZCNET])
            .env("ZCNET_PRELOAD", library());
        c
    };
    let mut recv = in_ns(pair.name_b())
        .args(["run", "--tx", "zerocopy", "--stats"])
        .arg(&r_stats)
        .args([
            "--",
            "socat",
            "-u",
            &format!("TCP-LISTEN:{port},bind={b},reuseaddr"),
        ])
        .arg(format!("CREATE:{}", out.display()))
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !pair
        .run_in_b(|| std::fs::read_to_string("/proc/thread-self/net/tcp").unwrap_or_default())
        .is_ok_and(|t| listening_in(&t, b, port))
    {
        assert!(recv.try_wait().unwrap().is_none(), "receiver exited early");
        if start.elapsed() >= Duration::from_secs(20) {
            panic!("receiver never listened"); // a hang guard, not a speed check
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let st = in_ns(pair.name_a())
        .args(["run", "--tx", "zerocopy", "--stats"])
        .arg(&s_stats)
        .args(["--", "socat", "-b", "1048576", "-u"])
        .arg(format!("OPEN:{}", file.display()))
        .arg(format!("TCP:{b}:{port}"))
        .status()
        .unwrap();
    assert!(st.success(), "socat sender: {st}");
    let start = Instant::now();
    while recv.try_wait().unwrap().is_none() {
        if start.elapsed() >= Duration::from_secs(30) {
            panic!("socat receiver did not finish"); // a hang guard, not a speed check
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(hash_of(&out), want, "the piped file differs");
    assert_protected(&stats(&s_stats), SIZE as u64 / 2, "socat across veth");
}

/// `zcnet run` names the programs the loader will not preload into, and still runs them.
#[test]
fn run_names_static_and_setuid_programs() {
    if !library_built() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("s.jsonl");
    let is_static = |p: &str| {
        std::fs::read(p).is_ok_and(|img| {
            img.starts_with(b"\x7fELF")
                && !img.windows(16).any(|w| w.starts_with(b"/lib64/ld-linux"))
        })
    };
    let mut checked = 0;
    if is_static("/sbin/ldconfig") {
        let out = zcnet_run("auto", &stats)
            .args(["/sbin/ldconfig", "--version"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && err.contains("statically linked"),
            "{err}"
        );
        checked += 1;
    }
    let setuid = ["/usr/bin/passwd", "/bin/su", "/usr/bin/chfn"]
        .into_iter()
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| {
                std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o4000 != 0
            })
        });
    if let Some(p) = setuid {
        let out = zcnet_run("auto", &stats)
            .args([p, "--help"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("setuid"), "{err}");
        checked += 1;
    }
    let out = zcnet_run("auto", &stats)
        .arg("no-such-program-zcnet")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("command not found"));
    if checked == 0 {
        eprintln!("SKIP (partly): no static ldconfig or setuid program on this host");
    }
}
