//! Real, unmodified programs from the distribution under `zcnet run`, sending zero-copy
//! under write protection (`--tx zerocopy`, forced): every transfer is checked by hashing
//! what arrived against what was sent, and the sender's stats must show the bytes took the
//! protected path. Each program runs twice: both ends on loopback, and server and client in
//! two network namespaces joined by a veth pair (root only). Each test skips, saying why,
//! when its program is not installed, namespaces are unavailable, or the library was not
//! built (`cargo test --workspace` builds it; `-p zcnet-cli` alone does not).

use serde_json::Value;
use std::io::Read;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use zcnet_testbed::netns::VethPair;

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
        zcnet_testbed::skip::skip(&format!("{tool} is not installed"));
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
        zcnet_testbed::skip::skip(&format!(
            "{} not built (cargo build -p zcnet-preload)",
            library().display()
        ));
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

/// Where a test's two ends run.
enum Net {
    /// Both on loopback, in this namespace.
    Loopback,
    /// The server in namespace `b`, the client in namespace `a`, joined by veth.
    Veth(VethPair),
}

impl Net {
    /// The veth pair, or `None` (saying why) without the rights to make namespaces.
    fn veth() -> Option<Net> {
        if let Err(why) = zcnet_testbed::netns::available() {
            zcnet_testbed::skip::skip(&why.to_string());
            return None;
        }
        Some(Net::Veth(VethPair::create(1500).unwrap()))
    }

    fn name(&self) -> &'static str {
        match self {
            Net::Loopback => "loopback",
            Net::Veth(_) => "veth",
        }
    }

    /// The server's address.
    fn ip(&self) -> Ipv4Addr {
        match self {
            Net::Loopback => Ipv4Addr::LOCALHOST,
            Net::Veth(p) => p.addr_b(),
        }
    }

    fn in_ns(ns: Option<&str>, prog: &str) -> Command {
        match ns {
            None => Command::new(prog),
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, prog]);
                c
            }
        }
    }

    /// `prog` on the server side.
    fn server(&self, prog: &str) -> Command {
        Net::in_ns(self.ns(true), prog)
    }

    /// `prog` on the client side.
    fn client(&self, prog: &str) -> Command {
        Net::in_ns(self.ns(false), prog)
    }

    fn ns(&self, server: bool) -> Option<&str> {
        match self {
            Net::Loopback => None,
            Net::Veth(p) if server => Some(p.name_b()),
            Net::Veth(p) => Some(p.name_a()),
        }
    }

    /// `zcnet run --tx tx --stats stats --` on the server side (`server`) or the client's.
    /// The library's per-boot cache (page costs, copying routes) goes beside the stats file,
    /// in the test's own directory, never into the user's `~/.config/zcnet`.
    fn run(&self, server: bool, tx: &str, stats: &Path) -> Command {
        let mut c = Net::in_ns(self.ns(server), ZCNET);
        let cache = stats.parent().map(|d| d.join("zcnet-cache"));
        if let Some(cache) = cache {
            c.env("ZCNET_PROFILE_DIR", cache);
        }
        c.env("ZCNET_PRELOAD", library())
            .args(["run", "--tx", tx, "--stats"])
            .arg(stats)
            .arg("--");
        c
    }

    /// Whether something listens on the server's `ip():port`, read from /proc/net/tcp of
    /// the server's namespace — without connecting, which a one-connection server
    /// (`socat`, `iperf3 -1`) would take as its client.
    fn listening(&self, port: u16) -> bool {
        let table = match self {
            Net::Loopback => std::fs::read_to_string("/proc/net/tcp").unwrap_or_default(),
            Net::Veth(p) => p
                .run_in_b(|| std::fs::read_to_string("/proc/thread-self/net/tcp"))
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default(),
        };
        listening_in(&table, self.ip(), port)
    }

    fn wait_listening(&self, port: u16, child: &mut Child) {
        let start = Instant::now();
        while !self.listening(port) {
            assert!(child.try_wait().unwrap().is_none(), "server exited early");
            if start.elapsed() >= Duration::from_secs(20) {
                panic!("server never listened"); // a hang guard, not a speed check
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Whether the /proc/net/tcp text `table` has a listener on `addr:port`.
fn listening_in(table: &str, addr: Ipv4Addr, port: u16) -> bool {
    let want = format!("{:08X}:{port:04X}", u32::from_le_bytes(addr.octets()));
    table.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && f[1] == want && f[3] == "0A"
    })
}

/// A file of `SIZE` pseudo-random bytes; its BLAKE3 hash.
fn data_file(dir: &Path) -> (PathBuf, blake3::Hash) {
    data_file_of(dir, SIZE)
}

/// A file of `size` pseudo-random bytes, written a MiB at a time; its BLAKE3 hash.
fn data_file_of(dir: &Path, size: usize) -> (PathBuf, blake3::Hash) {
    use std::io::Write;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let p = dir.join("big.bin");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&p).unwrap());
    let mut h = blake3::Hasher::new();
    let mut v = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(v.len());
        for c in v[..n].chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
        }
        f.write_all(&v[..n]).unwrap();
        h.update(&v[..n]);
        left -= n;
    }
    f.flush().unwrap();
    (p, h.finalize())
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

/// `python3 -m http.server ARGS…` with Python's SIGINT handler restored.
const HTTP_SERVER_WITH_SIGINT: &str = "import runpy, signal, sys; \
signal.signal(signal.SIGINT, signal.default_int_handler); \
sys.argv[0] = 'http.server'; runpy.run_module('http.server', run_name='__main__')";

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

/// `test` on loopback, then between two namespaces (if this process may make them).
fn both_nets(test: fn(&Net)) {
    test(&Net::Loopback);
    if let Some(net) = Net::veth() {
        test(&net);
    }
}

#[cfg_attr(
    not(all(zcnet_has_curl, zcnet_has_python3)),
    ignore = "needs curl and python3 (apt-get install curl python3)"
)]
#[test]
fn curl_fetches_from_python_http_server_byte_for_byte() {
    if !(library_built() && have("curl") && have("python3")) {
        return;
    }
    both_nets(|net| {
        let dir = tempfile::tempdir().unwrap();
        let (file, want) = data_file(dir.path());
        let (s_stats, c_stats) = (
            dir.path().join("server.jsonl"),
            dir.path().join("client.jsonl"),
        );
        let port = free_port();
        let mut server = net
            .run(true, "zerocopy", &s_stats)
            // SIGINT is how it exits normally (stats written at exit), but a shell starts
            // background jobs with SIGINT ignored and Python keeps an ignored SIGINT: put
            // Python's own handler back first, so the test works however it is started.
            .args([
                "python3",
                "-c",
                HTTP_SERVER_WITH_SIGINT,
                &port.to_string(),
                "--bind",
            ])
            .arg(net.ip().to_string())
            .arg("--directory")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        net.wait_listening(port, &mut server);
        let out = dir.path().join("got.bin");
        let st = net
            .run(false, "zerocopy", &c_stats)
            .args(["curl", "-sS", "--fail", "-o"])
            .arg(&out)
            .arg(format!(
                "http://{}:{port}/{}",
                net.ip(),
                file.file_name().unwrap().to_str().unwrap()
            ))
            .status()
            .unwrap();
        stop(server, "INT");
        assert!(st.success(), "curl ({}): {st}", net.name());
        assert_eq!(
            hash_of(&out),
            want,
            "the fetched file differs ({})",
            net.name()
        );
        let who = format!("python3 http.server ({})", net.name());
        assert_protected(&stats(&s_stats), SIZE as u64 / 2, &who);
        assert_eq!(stats(&c_stats).len(), 1, "curl wrote its stats");
    });
}

/// nginx serving `dir` on `net.ip():port` from its own buffers (`sendfile off`: nginx reads
/// the file into its buffer and writes it from there, which is what the library interposes;
/// sendfile it leaves to the kernel). Under the library (`stats`) or not.
fn nginx(net: &Net, dir: &Path, port: u16, stats: Option<&Path>) -> Child {
    let d = dir.display();
    let name = format!("nginx-{port}");
    let conf = format!(
        "daemon off; master_process off; worker_processes 1; pid {d}/{name}.pid;\n\
         error_log {d}/{name}.log;\n\
         events {{ worker_connections 64; }}\n\
         http {{ access_log off; sendfile off; output_buffers 2 1m;\n\
           client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d};\n\
           uwsgi_temp_path {d}; scgi_temp_path {d};\n\
           server {{ listen {ip}:{port}; root {d}; }} }}\n",
        ip = net.ip()
    );
    let conf_path = dir.join(format!("{name}.conf"));
    std::fs::write(&conf_path, conf).unwrap();
    let mut cmd = match stats {
        Some(s) => {
            let mut c = net.run(true, "zerocopy", s);
            c.arg("nginx");
            c
        }
        None => net.server("nginx"),
    };
    let mut server = cmd
        .arg("-e")
        .arg(dir.join(format!("{name}.log")))
        .arg("-c")
        .arg(&conf_path)
        .spawn()
        .unwrap();
    net.wait_listening(port, &mut server);
    server
}

/// curl fetching `url` on the client side (under the library if `stats`), hashing what it
/// writes to its standard output as it arrives.
fn curl_hash(
    net: &Net,
    url: &str,
    stats: Option<&Path>,
) -> (std::process::ExitStatus, blake3::Hash, u64) {
    let mut cmd = match stats {
        Some(s) => {
            let mut c = net.run(false, "zerocopy", s);
            c.arg("curl");
            c
        }
        None => net.client("curl"),
    };
    let mut child = cmd
        .args(["-sS", "--fail", "-o", "-", url])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = out.read(&mut buf).unwrap();
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    (child.wait().unwrap(), h.finalize(), n)
}

#[cfg_attr(
    not(all(zcnet_has_curl, zcnet_has_nginx)),
    ignore = "needs curl and nginx (apt-get install curl nginx-light)"
)]
#[test]
fn curl_fetches_from_nginx_without_sendfile_byte_for_byte() {
    if !(library_built() && have("curl") && have("nginx")) {
        return;
    }
    both_nets(|net| {
        let dir = tempfile::tempdir().unwrap();
        let (file, want) = data_file(dir.path());
        let s_stats = dir.path().join("nginx.jsonl");
        let port = free_port();
        let server = nginx(net, dir.path(), port, Some(&s_stats));
        let url = format!(
            "http://{}:{port}/{}",
            net.ip(),
            file.file_name().unwrap().to_str().unwrap()
        );
        // curl alone, then curl under the library too; every fetch checked by hash.
        let c_stats = dir.path().join("curl.jsonl");
        let results = [
            curl_hash(net, &url, None),
            curl_hash(net, &url, Some(&c_stats)),
        ];
        stop(server, "QUIT");
        for (st, got, _) in results {
            assert!(st.success(), "curl ({}): {st}", net.name());
            assert_eq!(got, want, "the fetched file differs ({})", net.name());
        }
        let who = format!("nginx ({})", net.name());
        assert_protected(&stats(&s_stats), SIZE as u64 / 2, &who);
    });
}

/// 1 GiB from nginx to curl, with the library on the server, on the client, and on both
/// (two nginx, one under the library), on loopback and between namespaces: each fetch
/// hashed as it arrives against the file's hash. The file is generated, never kept.
#[cfg_attr(
    not(all(zcnet_has_curl, zcnet_has_nginx)),
    ignore = "needs curl and nginx (apt-get install curl nginx-light)"
)]
#[test]
fn curl_fetches_a_gibibyte_from_nginx_under_the_library_on_each_end_and_both() {
    if !(library_built() && have("curl") && have("nginx")) {
        return;
    }
    const GIB: u64 = 1 << 30;
    both_nets(|net| {
        let start = Instant::now();
        let dir = tempfile::tempdir().unwrap();
        let (file, want) = data_file_of(dir.path(), GIB as usize);
        let name = file.file_name().unwrap().to_str().unwrap();
        let s_stats = dir.path().join("nginx.jsonl");
        let (plain_port, lib_port) = (free_port(), free_port());
        let plain = nginx(net, dir.path(), plain_port, None);
        let under = nginx(net, dir.path(), lib_port, Some(&s_stats));
        let url = |port: u16| format!("http://{}:{port}/{name}", net.ip());
        let c_stats = dir.path().join("curl.jsonl");
        let results = [
            ("server", curl_hash(net, &url(lib_port), None)),
            ("client", curl_hash(net, &url(plain_port), Some(&c_stats))),
            ("both", curl_hash(net, &url(lib_port), Some(&c_stats))),
        ];
        stop(plain, "QUIT");
        stop(under, "QUIT");
        for (placement, (st, got, n)) in results {
            let at = format!("library on {placement}, {}", net.name());
            assert!(st.success(), "curl ({at}): {st}");
            assert_eq!(n, GIB, "bytes fetched ({at})");
            assert_eq!(got, want, "the fetched gibibyte differs ({at})");
        }
        let who = format!("nginx, 1 GiB twice ({})", net.name());
        assert_protected(&stats(&s_stats), GIB, &who);
        assert_eq!(stats(&c_stats).len(), 2, "curl wrote its stats twice");
        eprintln!(
            "1 GiB x 3 over {}: {:?} (shared machine)",
            net.name(),
            start.elapsed()
        );
    });
}

fn socat_pipes_a_file(net: &Net) {
    let dir = tempfile::tempdir().unwrap();
    let (file, want) = data_file(dir.path());
    let (r_stats, s_stats) = (dir.path().join("recv.jsonl"), dir.path().join("send.jsonl"));
    let out = dir.path().join("got.bin");
    let port = free_port();
    let ip = net.ip();
    let mut recv = net
        .run(true, "zerocopy", &r_stats)
        .args([
            "socat",
            "-u",
            &format!("TCP-LISTEN:{port},bind={ip},reuseaddr"),
        ])
        .arg(format!("CREATE:{}", out.display()))
        .spawn()
        .unwrap();
    net.wait_listening(port, &mut recv);
    // -b 1 MiB: socat reads into one buffer and writes it out, then reads into the same
    // buffer again while the previous write may still be in flight.
    let st = net
        .run(false, "zerocopy", &s_stats)
        .args(["socat", "-b", "1048576", "-u"])
        .arg(format!("OPEN:{}", file.display()))
        .arg(format!("TCP:{ip}:{port}"))
        .status()
        .unwrap();
    assert!(st.success(), "socat sender ({}): {st}", net.name());
    let start = Instant::now();
    while recv.try_wait().unwrap().is_none() {
        if start.elapsed() >= Duration::from_secs(30) {
            panic!("socat receiver did not finish"); // a hang guard, not a speed check
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        hash_of(&out),
        want,
        "the piped file differs ({})",
        net.name()
    );
    let who = format!("socat ({})", net.name());
    assert_protected(&stats(&s_stats), SIZE as u64 / 2, &who);
}

#[cfg_attr(not(zcnet_has_socat), ignore = "needs socat (apt-get install socat)")]
#[test]
fn socat_pipes_a_file_byte_for_byte() {
    if !(library_built() && have("socat")) {
        return;
    }
    socat_pipes_a_file(&Net::Loopback);
}

#[cfg_attr(
    not(all(zcnet_has_socat, zcnet_netns)),
    ignore = "needs socat (apt-get install socat), root and iproute2 (network namespaces)"
)]
#[test]
fn socat_pipes_a_file_between_namespaces_byte_for_byte() {
    if !(library_built() && have("socat")) {
        return;
    }
    if let Some(net) = Net::veth() {
        socat_pipes_a_file(&net);
    }
}

/// iperf3 cannot be checked by hash: with `-F` its server writes what arrives to a file, but
/// even without the library that file differs from the one sent (its client sends whole
/// blocks after short reads). Both ends' byte counts are checked instead.
#[cfg_attr(
    not(zcnet_has_iperf3),
    ignore = "needs iperf3 (apt-get install iperf3)"
)]
#[test]
fn iperf3_runs_and_both_ends_count_the_transfer() {
    if !(library_built() && have("iperf3")) {
        return;
    }
    both_nets(|net| {
        let dir = tempfile::tempdir().unwrap();
        let (s_stats, c_stats) = (
            dir.path().join("server.jsonl"),
            dir.path().join("client.jsonl"),
        );
        let ip = net.ip().to_string();
        let port = free_port().to_string();
        let mut server = net
            .run(true, "zerocopy", &s_stats)
            .args(["iperf3", "-s", "-1", "-J", "-B", &ip, "-p", &port])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        net.wait_listening(port.parse().unwrap(), &mut server);
        let client = net
            .run(false, "zerocopy", &c_stats)
            .args([
                "iperf3", "-c", &ip, "-p", &port, "-J", "-l", "1M", "-n", "256M",
            ])
            .output()
            .unwrap();
        let at = net.name();
        assert!(
            client.status.success(),
            "iperf3 client ({at}): {}",
            client.status
        );
        let server = server.wait_with_output().unwrap();
        assert!(
            server.status.success(),
            "iperf3 server ({at}): {}",
            server.status
        );
        let c: Value = serde_json::from_slice(&client.stdout).unwrap();
        let s: Value = serde_json::from_slice(&server.stdout).unwrap();
        let sent = c["end"]["sum_sent"]["bytes"].as_u64().unwrap();
        let received = s["end"]["sum_received"]["bytes"].as_u64().unwrap();
        // iperf3's server stops counting when the test ends, a little before the last bytes
        // arrive (without the library too), and its data is random and unchecked: the counts
        // are what iperf3 can vouch for.
        assert!(sent >= 256 << 20, "sent {sent} ({at})");
        assert!(
            received <= sent && received >= sent / 2,
            "received {received} of {sent} ({at})"
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
            "stats account for {accounted} of {sent} bytes ({at})"
        );
        let refused = t["fallback_bytes"]["unprotectable"].as_u64().unwrap_or(0);
        assert!(
            t["bytes_zerocopy"].as_u64() > Some(0) || refused >= sent / 2,
            "neither zero-copy nor counted refusals ({at}): {t}"
        );
    });
}

#[cfg_attr(
    not(all(zcnet_has_redis_server, zcnet_has_redis_cli, zcnet_has_redis_benchmark)),
    ignore = "needs redis (apt-get install redis-server redis-tools)"
)]
#[test]
fn redis_returns_large_values_byte_for_byte() {
    if !(library_built() && have("redis-server") && have("redis-cli") && have("redis-benchmark")) {
        return;
    }
    both_nets(|net| {
        let dir = tempfile::tempdir().unwrap();
        let s_stats = dir.path().join("redis.jsonl");
        let ip = net.ip().to_string();
        let port = free_port().to_string();
        let mut server = net
            .run(true, "zerocopy", &s_stats)
            .args([
                "redis-server",
                "--port",
                &port,
                "--bind",
                &ip,
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
            ])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        net.wait_listening(port.parse().unwrap(), &mut server);
        let at = net.name();
        // Four 8 MiB values and eight of 1 MiB stored and read back, each checked by hash.
        let (file, _) = data_file(dir.path());
        let data = std::fs::read(&file).unwrap();
        let values = data
            .chunks(8 << 20)
            .take(4)
            .chain(data[32 << 20..].chunks(1 << 20).take(8));
        for (i, v) in values.enumerate() {
            let part = dir.path().join(format!("v{i}"));
            std::fs::write(&part, v).unwrap();
            let set = net
                .client("redis-cli")
                .args(["-h", &ip, "-p", &port, "-x", "SET", &format!("k{i}")])
                .stdin(std::fs::File::open(&part).unwrap())
                .output()
                .unwrap();
            assert!(
                set.status.success() && set.stdout.starts_with(b"OK"),
                "SET ({at}): {set:?}"
            );
            let get = net
                .client("redis-cli")
                .args(["-h", &ip, "-p", &port, "--raw", "GET", &format!("k{i}")])
                .output()
                .unwrap();
            assert!(get.status.success());
            // --raw ends the reply with a newline of its own.
            assert_eq!(
                blake3::hash(&get.stdout[..get.stdout.len() - 1]),
                blake3::hash(v),
                "value {i} ({at})"
            );
        }
        // Load with 1 MiB values from redis-benchmark (which checks nothing but completion).
        let bench = net
            .client("redis-benchmark")
            .args([
                "-h", &ip, "-p", &port, "-d", "1048576", "-n", "200", "-c", "4", "-t", "set,get",
                "-q",
            ])
            .output()
            .unwrap();
        assert!(bench.status.success(), "redis-benchmark ({at}): {bench:?}");
        stop(server, "TERM");
        let who = format!("redis-server ({at})");
        assert_protected(&stats(&s_stats), 40 << 20, &who);
    });
}

#[cfg_attr(not(zcnet_has_rsync), ignore = "needs rsync (apt-get install rsync)")]
#[test]
fn rsync_daemon_transfers_a_file_byte_for_byte() {
    if !(library_built() && have("rsync")) {
        return;
    }
    both_nets(|net| {
        let dir = tempfile::tempdir().unwrap();
        let (_, want) = data_file(dir.path());
        let dest = dir.path().join("dest");
        std::fs::create_dir(&dest).unwrap();
        let (d_stats, c_stats) = (
            dir.path().join("daemon.jsonl"),
            dir.path().join("client.jsonl"),
        );
        let ip = net.ip();
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
        let mut daemon = net
            .run(true, "zerocopy", &d_stats)
            .args(["rsync", "--daemon", "--no-detach", "--address"])
            .arg(ip.to_string())
            .args(["--port", &port])
            .arg(format!("--config={}", conf.display()))
            .spawn()
            .unwrap();
        net.wait_listening(port.parse().unwrap(), &mut daemon);
        // The daemon sends the file (it forks a sender per connection: a socket open in
        // two processes, which the library copies on, counted); the client receives.
        let st = net
            .run(false, "zerocopy", &c_stats)
            .args(["rsync", "-a", "--whole-file"])
            .arg(format!("rsync://{ip}:{port}/src/big.bin"))
            .arg(&dest)
            .status()
            .unwrap();
        stop(daemon, "TERM");
        let at = net.name();
        assert!(st.success(), "rsync ({at}): {st}");
        assert_eq!(
            hash_of(&dest.join("big.bin")),
            want,
            "the synced file differs ({at})"
        );
        let lines = stats(&d_stats);
        assert!(!lines.is_empty(), "the daemon's sender wrote no stats");
        for l in &lines {
            eprintln!("rsync daemon ({at}, pid {}): {}", l["pid"], l["total"]);
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
            "the daemon's stats account for {sent} bytes ({at})"
        );
    });
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
        let out = Net::Loopback
            .run(false, "auto", &stats)
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
        let out = Net::Loopback
            .run(false, "auto", &stats)
            .args([p, "--help"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("setuid"), "{err}");
        checked += 1;
    }
    let out = Net::Loopback
        .run(false, "auto", &stats)
        .arg("no-such-program-zcnet")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("command not found"));
    if checked == 0 {
        zcnet_testbed::skip::skip_allowed(
            "partly: no static ldconfig or setuid program on this host",
        );
    }
}
