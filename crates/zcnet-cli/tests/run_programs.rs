//! Real, unmodified programs from the distribution under `zcnet run`, sending zero-copy
//! under write protection (`--tx zerocopy`, forced): every transfer is checked by hashing
//! what arrived against what was sent, and the sender's stats must show the bytes took the
//! protected path. Each program runs twice: both ends on loopback, and server and client in
//! two network namespaces joined by a veth pair (root only), as two tests. A test whose
//! program, root or namespaces the build did not find is ignored, with why (`probe.rs`).

use serde_json::Value;
use std::io::Read;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use zcnet_testbed::netns::VethPair;

const ZCNET: &str = env!("CARGO_BIN_EXE_zcnet");
const SIZE: usize = 64 << 20;

/// Asserts `tool` is on PATH, for a test marked ignored without `zcnet_has_<tool>`: the
/// build found it, so a missing one is a failure, never a pass that ran nothing.
fn need(tool: &str) {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(found, "{tool}, which the build found on PATH, is not there");
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

/// Asserts the library is built: zcnet-preload is a dependency of this crate, so cargo
/// builds it (`deps/libzcnet_preload.so`) before this test.
fn need_library() {
    assert!(
        library().is_file(),
        "{} not built (cargo build -p zcnet-preload)",
        library().display()
    );
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
    /// The veth pair, for a test marked ignored without `zcnet_netns`.
    fn veth() -> Net {
        Net::Veth(zcnet_testbed::topo::veth_pair(1500))
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

/// Asserts the stats lines show `min` bytes sent zero-copy under protection. There is always
/// an engine: the automatic choice falls back from userfaultfd write-protect to mprotect,
/// which needs only /proc/self/pagemap. That it ran is read from the pages it protected, a
/// counter every line carries: the engine's own figures (`"engine"`) are only in a line the
/// library wrote itself, not in one `zcnet run` wrote from its board for a process a signal
/// ended.
fn assert_protected(lines: &[Value], min: u64, who: &str) {
    assert!(!lines.is_empty(), "{who}: no stats written");
    for l in lines {
        eprintln!("{who} (pid {}): {}", l["pid"], l["total"]);
    }
    let sum = |key: &str| -> u64 {
        lines
            .iter()
            .map(|l| l["total"][key].as_u64().unwrap_or(0))
            .sum()
    };
    let zc = sum("bytes_zerocopy");
    assert!(
        sum("pages_protected") > 0,
        "{who}: no page was write-protected: {}",
        lines[0]["total"]
    );
    assert!(
        zc >= min,
        "{who}: {zc} bytes zero-copy: {}",
        lines[0]["total"]
    );
}

#[cfg_attr(
    not(all(zcnet_has_curl, zcnet_has_python3)),
    ignore = "needs curl and python3 (apt-get install curl python3)"
)]
#[test]
fn curl_fetches_from_python_http_server_byte_for_byte() {
    curl_fetches_from_python_http_server_byte_for_byte_on(&Net::Loopback);
}

/// [`curl_fetches_from_python_http_server_byte_for_byte`] between two network namespaces.
#[cfg_attr(
    not(all(zcnet_netns, zcnet_has_curl, zcnet_has_python3)),
    ignore = "needs root and iproute2 (network namespaces), curl and python3 (apt-get install curl python3)"
)]
#[test]
fn curl_fetches_from_python_http_server_byte_for_byte_between_namespaces() {
    curl_fetches_from_python_http_server_byte_for_byte_on(&Net::veth());
}

fn curl_fetches_from_python_http_server_byte_for_byte_on(net: &Net) {
    need_library();
    need("curl");
    need("python3");
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
    curl_fetches_from_nginx_without_sendfile_byte_for_byte_on(&Net::Loopback);
}

/// [`curl_fetches_from_nginx_without_sendfile_byte_for_byte`] between two network namespaces.
#[cfg_attr(
    not(all(zcnet_netns, zcnet_has_curl, zcnet_has_nginx)),
    ignore = "needs root and iproute2 (network namespaces), curl and nginx (apt-get install curl nginx-light)"
)]
#[test]
fn curl_fetches_from_nginx_without_sendfile_byte_for_byte_between_namespaces() {
    curl_fetches_from_nginx_without_sendfile_byte_for_byte_on(&Net::veth());
}

fn curl_fetches_from_nginx_without_sendfile_byte_for_byte_on(net: &Net) {
    need_library();
    need("curl");
    need("nginx");
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
    curl_fetches_a_gibibyte_from_nginx_under_the_library_on_each_end_and_both_on(&Net::Loopback);
}

/// [`curl_fetches_a_gibibyte_from_nginx_under_the_library_on_each_end_and_both`] between two network namespaces.
#[cfg_attr(
    not(all(zcnet_netns, zcnet_has_curl, zcnet_has_nginx)),
    ignore = "needs root and iproute2 (network namespaces), curl and nginx (apt-get install curl nginx-light)"
)]
#[test]
fn curl_fetches_a_gibibyte_from_nginx_under_the_library_on_each_end_and_both_between_namespaces() {
    curl_fetches_a_gibibyte_from_nginx_under_the_library_on_each_end_and_both_on(&Net::veth());
}

fn curl_fetches_a_gibibyte_from_nginx_under_the_library_on_each_end_and_both_on(net: &Net) {
    need_library();
    need("curl");
    need("nginx");
    const GIB: u64 = 1 << 30;
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
    need_library();
    need("socat");
    socat_pipes_a_file(&Net::Loopback);
}

#[cfg_attr(
    not(all(zcnet_has_socat, zcnet_netns)),
    ignore = "needs socat (apt-get install socat), root and iproute2 (network namespaces)"
)]
#[test]
fn socat_pipes_a_file_between_namespaces_byte_for_byte() {
    need_library();
    need("socat");
    socat_pipes_a_file(&Net::veth());
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
    iperf3_runs_and_both_ends_count_the_transfer_on(&Net::Loopback);
}

/// [`iperf3_runs_and_both_ends_count_the_transfer`] between two network namespaces.
#[cfg_attr(
    not(all(zcnet_netns, zcnet_has_iperf3)),
    ignore = "needs root and iproute2 (network namespaces), iperf3 (apt-get install iperf3)"
)]
#[test]
fn iperf3_runs_and_both_ends_count_the_transfer_between_namespaces() {
    iperf3_runs_and_both_ends_count_the_transfer_on(&Net::veth());
}

fn iperf3_runs_and_both_ends_count_the_transfer_on(net: &Net) {
    need_library();
    need("iperf3");
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
}

#[cfg_attr(
    not(all(zcnet_has_redis_server, zcnet_has_redis_cli, zcnet_has_redis_benchmark)),
    ignore = "needs redis (apt-get install redis-server redis-tools)"
)]
#[test]
fn redis_returns_large_values_byte_for_byte() {
    redis_returns_large_values_byte_for_byte_on(&Net::Loopback);
}

/// [`redis_returns_large_values_byte_for_byte`] between two network namespaces.
#[cfg_attr(
    not(all(
        zcnet_netns,
        zcnet_has_redis_server,
        zcnet_has_redis_cli,
        zcnet_has_redis_benchmark
    )),
    ignore = "needs root and iproute2 (network namespaces), redis (apt-get install redis-server redis-tools)"
)]
#[test]
fn redis_returns_large_values_byte_for_byte_between_namespaces() {
    redis_returns_large_values_byte_for_byte_on(&Net::veth());
}

fn redis_returns_large_values_byte_for_byte_on(net: &Net) {
    need_library();
    need("redis-server");
    need("redis-cli");
    need("redis-benchmark");
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
            "-h", &ip, "-p", &port, "-d", "1048576", "-n", "200", "-c", "4", "-t", "set,get", "-q",
        ])
        .output()
        .unwrap();
    assert!(bench.status.success(), "redis-benchmark ({at}): {bench:?}");
    stop(server, "TERM");
    let who = format!("redis-server ({at})");
    assert_protected(&stats(&s_stats), 40 << 20, &who);
}

#[cfg_attr(not(zcnet_has_rsync), ignore = "needs rsync (apt-get install rsync)")]
#[test]
fn rsync_daemon_transfers_a_file_byte_for_byte() {
    rsync_daemon_transfers_a_file_byte_for_byte_on(&Net::Loopback);
}

/// [`rsync_daemon_transfers_a_file_byte_for_byte`] between two network namespaces.
#[cfg_attr(
    not(all(zcnet_netns, zcnet_has_rsync)),
    ignore = "needs root and iproute2 (network namespaces), rsync (apt-get install rsync)"
)]
#[test]
fn rsync_daemon_transfers_a_file_byte_for_byte_between_namespaces() {
    rsync_daemon_transfers_a_file_byte_for_byte_on(&Net::veth());
}

fn rsync_daemon_transfers_a_file_byte_for_byte_on(net: &Net) {
    need_library();
    need("rsync");
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
}

/// `zcnet run` names a statically linked program (the loader will not preload into it),
/// and still runs it.
#[cfg_attr(
    not(zcnet_has_static_ldconfig),
    ignore = "needs a statically linked /sbin/ldconfig (glibc's)"
)]
#[test]
fn run_names_a_static_program_and_still_runs_it() {
    need_library();
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("s.jsonl");
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
}

/// `zcnet run` names a setuid program either way — not covered, or (run by its owner,
/// root) covered with no secure-execution mode.
#[cfg_attr(
    not(zcnet_has_setuid_program),
    ignore = "needs a setuid program (/usr/bin/passwd, /bin/su or /usr/bin/chfn)"
)]
#[test]
fn run_names_a_setuid_program() {
    need_library();
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("s.jsonl");
    let setuid = ["/usr/bin/passwd", "/bin/su", "/usr/bin/chfn"]
        .into_iter()
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| {
                std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o4000 != 0
            })
        })
        .expect("a setuid program, as the build found");
    let out = Net::Loopback
        .run(false, "auto", &stats)
        .args([setuid, "--help"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let as_owner = rustix::process::geteuid().is_root();
    assert!(
        err.contains(if as_owner {
            "no secure-execution mode"
        } else {
            "ignores LD_PRELOAD"
        }),
        "{err}"
    );
}

/// `zcnet run` of a program that is not there says so and fails.
#[test]
fn run_says_command_not_found() {
    need_library();
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("s.jsonl");
    let out = Net::Loopback
        .run(false, "auto", &stats)
        .arg("no-such-program-zcnet")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("command not found"));
}

/// The transmit modes of `zcnet run`.
const MODES: [&str; 4] = ["auto", "copy", "zerocopy", "cow"];

/// Compiles `tests/programs/<name>.c` into `dir` with the system's C compiler (tests
/// that call it are ignored without `zcnet_has_cc`).
fn c_program(name: &str, dir: &Path) -> PathBuf {
    c_program_linked(name, name, &[], dir)
}

/// [`c_program`] built as `out` with `libs` after the source (what it links with).
fn c_program_linked(name: &str, out: &str, libs: &[&str], dir: &Path) -> PathBuf {
    need("cc");
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(format!("{name}.c"));
    let out = dir.join(out);
    let st = Command::new("cc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&out)
        .arg(&src)
        .args(libs)
        .status()
        .unwrap();
    assert!(st.success(), "cc {}: {st}", src.display());
    out
}

/// Byte `i` of what `tests/programs/*.c` send.
fn c_pattern(i: u64) -> u8 {
    ((i * 7) % 251) as u8
}

/// Accepts one connection on `l` and checks every byte against [`c_pattern`]; the count.
fn receive_pattern(l: TcpListener) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0u64;
        loop {
            let k = match c.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(k) => k,
            };
            for (i, b) in buf[..k].iter().enumerate() {
                assert_eq!(*b, c_pattern(n + i as u64), "byte {}", n + i as u64);
            }
            n += k as u64;
        }
        n
    })
}

/// A program that installs a strict seccomp filter itself (allowing `write` and `exit`,
/// killing for anything else) and then sends 8 MiB: the library must make no system call
/// of its own after the filter — it goes passive — in every mode, whether the filter
/// comes through `prctl` or `syscall(SYS_seccomp)`; every byte arrives, and `zcnet run`
/// says the library stepped aside.
#[cfg_attr(not(zcnet_has_cc), ignore = "needs a C compiler (apt-get install gcc)")]
#[test]
fn a_program_under_its_own_seccomp_filter_sends_in_every_mode() {
    need_library();
    let dir = tempfile::tempdir().unwrap();
    let prog = c_program("seccomp_send", dir.path());
    const SIZE: u64 = 8 << 20;
    for how in ["prctl", "syscall"] {
        for tx in MODES {
            let file = dir.path().join(format!("{how}-{tx}.jsonl"));
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port().to_string();
            let got = receive_pattern(l);
            let out = Net::Loopback
                .run(false, tx, &file)
                .arg(&prog)
                .args(["127.0.0.1", &port, &SIZE.to_string(), how])
                .env("ZCNET_LOCAL_ZEROCOPY", "1")
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{how}, {tx}: {}\n{err}", out.status);
            assert_eq!(got.join().unwrap(), SIZE, "{how}, {tx}: bytes received");
            assert!(err.contains("stepped aside"), "{how}, {tx}: {err}");
            let lines = stats(&file);
            assert!(
                lines
                    .iter()
                    .any(|l| l["passive"] == "seccomp_filter_installed"),
                "{how}, {tx}: {lines:?}"
            );
        }
    }
}

/// Asserts this process is root (sshd's privilege separation needs it), for a test marked
/// ignored without `zcnet_root`.
fn need_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "root, as the build found"
    );
}

/// A throwaway sshd on `net`: its own host key, a user key for the current user (root),
/// its own config in `dir`; under `zcnet run --tx tx`.
fn sshd(net: &Net, dir: &Path, port: u16, tx: &str, stats: &Path) -> Child {
    let keygen = |name: &str| {
        let st = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(dir.join(name))
            .status()
            .unwrap();
        assert!(st.success());
    };
    if !dir.join("host").exists() {
        keygen("host");
        keygen("user");
        std::fs::copy(dir.join("user.pub"), dir.join("authorized")).unwrap();
    }
    // Privilege separation chroots the pre-authentication child here.
    std::fs::create_dir_all("/run/sshd").unwrap();
    let d = dir.display();
    let conf = dir.join(format!("sshd-{port}.conf"));
    std::fs::write(
        &conf,
        format!(
            "Port {port}\nListenAddress {ip}\nHostKey {d}/host\nAuthorizedKeysFile {d}/authorized\n\
             PidFile none\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n\
             LogLevel ERROR\nSubsystem sftp internal-sftp\n",
            ip = net.ip()
        ),
    )
    .unwrap();
    let mut c = net
        .run(true, tx, stats)
        .arg(which("sshd"))
        .args(["-D", "-e", "-f"])
        .arg(&conf)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    net.wait_listening(port, &mut c);
    c
}

/// `name`'s path (sshd lives in /usr/sbin, which a user's PATH may lack).
fn which(name: &str) -> PathBuf {
    ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

fn ssh_opts(dir: &Path) -> Vec<String> {
    [
        "-i",
        &dir.join("user").display().to_string(),
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "LogLevel=ERROR",
        "-o",
        "ConnectTimeout=20",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The real sshd under `zcnet run`, in every mode: OpenSSH's pre-authentication child runs
/// under a seccomp filter that kills it for any system call it does not expect (a
/// `getsockopt` of the library's was enough: `SIGSYS`, no login). A login running a
/// command and an `scp` of a file through it must work, every byte checked, and `zcnet
/// run` must say where the library stepped aside.
#[cfg_attr(
    not(all(zcnet_root, zcnet_has_ssh, zcnet_has_scp, zcnet_has_sshd)),
    ignore = "needs root and OpenSSH (apt-get install openssh-server openssh-client)"
)]
#[test]
fn sshd_takes_a_login_and_an_scp_in_every_mode() {
    sshd_takes_a_login_and_an_scp_in_every_mode_on(&Net::Loopback);
}

/// [`sshd_takes_a_login_and_an_scp_in_every_mode`] between two network namespaces.
#[cfg_attr(
    not(all(zcnet_netns, zcnet_root, zcnet_has_ssh, zcnet_has_scp, zcnet_has_sshd)),
    ignore = "needs root, iproute2 (network namespaces) and OpenSSH (apt-get install openssh-server openssh-client)"
)]
#[test]
fn sshd_takes_a_login_and_an_scp_in_every_mode_between_namespaces() {
    sshd_takes_a_login_and_an_scp_in_every_mode_on(&Net::veth());
}

fn sshd_takes_a_login_and_an_scp_in_every_mode_on(net: &Net) {
    need_library();
    need_root();
    need("ssh");
    need("scp");
    assert!(which("sshd").is_file(), "sshd, as the build found");
    let dir = tempfile::tempdir().unwrap();
    let (file, want) = data_file_of(dir.path(), 16 << 20);
    for tx in MODES {
        let at = format!("{tx}, {}", net.name());
        let stats = dir.path().join(format!("sshd-{tx}.jsonl"));
        let port = free_port();
        let server = sshd(net, dir.path(), port, tx, &stats);
        let login = net
            .client("ssh")
            .args(ssh_opts(dir.path()))
            .args(["-p", &port.to_string()])
            .arg(format!("{}@{}", whoami(), net.ip()))
            .arg("echo logged-in-as-$(id -u)")
            .output()
            .unwrap();
        let got = dir.path().join(format!("got-{tx}.bin"));
        let scp = net
            .client("scp")
            .args(ssh_opts(dir.path()))
            .args(["-P", &port.to_string()])
            .arg(format!("{}@{}:{}", whoami(), net.ip(), file.display()))
            .arg(&got)
            .output()
            .unwrap();
        let err = stop_with_output(server, "TERM");
        assert!(
            login.status.success(),
            "ssh ({at}): {}\n{}\nsshd: {err}",
            login.status,
            String::from_utf8_lossy(&login.stderr)
        );
        let text = String::from_utf8_lossy(&login.stdout);
        assert!(text.starts_with("logged-in-as-"), "ssh ({at}): {text}");
        assert!(
            scp.status.success(),
            "scp ({at}): {}\n{}\nsshd: {err}",
            scp.status,
            String::from_utf8_lossy(&scp.stderr)
        );
        assert_eq!(hash_of(&got), want, "the copied file differs ({at})");
        assert!(err.contains("stepped aside"), "sshd ({at}): {err}");
    }
}

fn whoami() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Stops a server as [`stop`] does and returns what it wrote to its standard error.
fn stop_with_output(mut child: Child, signal: &str) -> String {
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    stop(child, signal);
    reader.join().unwrap()
}

/// Accepts one connection on `l` and checks the framed messages of
/// `tests/programs/threads_send.c`: every byte of every message, and each thread's
/// messages in order. Returns the messages received per thread.
fn receive_messages(l: TcpListener, threads: usize) -> std::thread::JoinHandle<Vec<u32>> {
    std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut seen = vec![0u32; threads];
        let mut head = [0u8; 12];
        loop {
            match c.read_exact(&mut head) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                Err(e) => panic!("reading a header: {e}"),
            }
            let word = |i: usize| u32::from_le_bytes(head[i * 4..i * 4 + 4].try_into().unwrap());
            let (t, seq, len) = (word(0) as usize, word(1), word(2) as usize);
            assert!(t < threads, "thread {t}");
            assert_eq!(seq, seen[t], "thread {t}'s messages in order");
            let mut body = vec![0u8; len];
            c.read_exact(&mut body).unwrap();
            for (i, b) in body.iter().enumerate() {
                let want = ((t * 31 + seq as usize * 7 + i) % 251) as u8;
                assert_eq!(*b, want, "thread {t}, message {seq}, byte {i}");
            }
            seen[t] += 1;
        }
        seen
    })
}

/// Four threads of one program take turns sending on one socket and rewrite their buffers
/// the moment each send returns (`--tx zerocopy`: write faults on pages in flight, which
/// the engine's handler thread resolves). That thread reads `/proc/self/pagemap` under its
/// lock; through the library's own `pread`, whose receive check takes the same lock, it
/// deadlocked (16 runs in 19). A hundred runs, each bounded, every byte checked.
#[cfg_attr(not(zcnet_has_cc), ignore = "needs a C compiler (apt-get install gcc)")]
#[test]
fn four_threads_sending_on_one_socket_never_hang() {
    need_library();
    let dir = tempfile::tempdir().unwrap();
    let prog = c_program("threads_send", dir.path());
    const THREADS: usize = 4;
    const MSGS: u32 = 8;
    const LEN: usize = 256 << 10;
    let file = dir.path().join("threads.jsonl");
    for run in 0..100 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port().to_string();
        let got = receive_messages(l, THREADS);
        let mut child = Net::Loopback
            .run(false, "zerocopy", &file)
            .arg(&prog)
            .args(["127.0.0.1", &port, &THREADS.to_string()])
            .args([MSGS.to_string(), LEN.to_string()])
            .spawn()
            .unwrap();
        let start = Instant::now();
        let st = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if start.elapsed() > Duration::from_secs(60) {
                // zcnet run relays SIGTERM to the program, whose default action ends it.
                let _ = Command::new("kill")
                    .args(["-TERM", &child.id().to_string()])
                    .status();
                std::thread::sleep(Duration::from_secs(2));
                let _ = child.kill();
                panic!("run {run}: the program hung"); // a hang guard, not a speed check
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        assert!(st.success(), "run {run}: {st}");
        assert_eq!(got.join().unwrap(), vec![MSGS; THREADS], "run {run}");
    }
    let lines = stats(&file);
    assert_eq!(lines.len(), 100, "one stats line per run");
    assert_protected(&lines, 1, "threads_send");
}

/// A server stopped by `SIGTERM`, which it does not catch (python's `http.server`), runs no
/// exit handler: the library's own line is never written. `zcnet run` stays its parent,
/// relays the signal, and writes the line from the counters the library kept on its board.
#[cfg_attr(
    not(all(zcnet_has_curl, zcnet_has_python3)),
    ignore = "needs curl and python3"
)]
#[test]
fn python_http_server_stopped_by_sigterm_has_its_stats_written() {
    need_library();
    need("curl");
    need("python3");
    let net = Net::Loopback;
    let dir = tempfile::tempdir().unwrap();
    let (file, want) = data_file(dir.path());
    let s_stats = dir.path().join("server.jsonl");
    let port = free_port();
    let mut server = net
        .run(true, "zerocopy", &s_stats)
        .args(["python3", "-m", "http.server", &port.to_string(), "--bind"])
        .arg(net.ip().to_string())
        .arg("--directory")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    net.wait_listening(port, &mut server);
    let url = format!(
        "http://{}:{port}/{}",
        net.ip(),
        file.file_name().unwrap().to_str().unwrap()
    );
    let (st, got, _) = curl_hash(&net, &url, None);
    let pid = server.id();
    stop(server, "TERM");
    assert!(st.success(), "curl: {st}");
    assert_eq!(got, want, "the fetched file differs");
    let lines = stats(&s_stats);
    assert_eq!(lines.len(), 1, "one line for the server: {lines:?}");
    assert_eq!(lines[0]["ended"], "signal 15", "{}", lines[0]);
    assert_ne!(lines[0]["pid"], pid, "the program's pid, not zcnet run's");
    assert_protected(&lines, SIZE as u64 / 2, "python3 http.server, SIGTERM");
}

/// A program that ends with `_exit` (no exit handler runs) still has its line.
#[cfg_attr(not(zcnet_has_python3), ignore = "needs python3")]
#[test]
fn a_program_ending_with_underscore_exit_has_its_stats_written() {
    need_library();
    need("python3");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.jsonl");
    const N: u64 = 8 << 20;
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let got = receive_pattern(l);
    let script = format!(
        "import os, socket\n\
         period = bytes((i * 7) % 251 for i in range(251))\n\
         data = (period * ({N} // 251 + 1))[:{N}]\n\
         s = socket.create_connection(('127.0.0.1', {port}))\n\
         s.sendall(data)\n\
         os._exit(0)\n"
    );
    let st = Net::Loopback
        .run(false, "zerocopy", &file)
        .args(["python3", "-c", &script])
        .status()
        .unwrap();
    assert!(st.success(), "{st}");
    assert_eq!(got.join().unwrap(), N);
    let lines = stats(&file);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let t = &lines[0]["total"];
    let sent = t["bytes_copy"].as_u64().unwrap() + t["bytes_zerocopy"].as_u64().unwrap();
    assert!(sent >= N, "{t}");
    assert!(
        lines[0]["ended"].as_str().unwrap().contains("_exit"),
        "{}",
        lines[0]
    );
}

/// A copy of `/usr/bin/id` in `dir` with `mode`, or with file capabilities `caps` (setcap).
fn special_copy(dir: &Path, name: &str, mode: u32, caps: Option<&str>) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::copy("/usr/bin/id", &p).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    if let Some(c) = caps {
        let st = Command::new("setcap").arg(c).arg(&p).status().unwrap();
        assert!(st.success(), "setcap {c}");
    }
    p
}

/// Coverage is judged as the loader will see it (`AT_SECURE`) and confirmed after the
/// start: a setuid-root program run by root is covered — said before and confirmed after,
/// never "the loader ignores LD_PRELOAD" — and a program with file capabilities run by an
/// unprivileged user is not, and `zcnet run` says so.
#[cfg_attr(
    not(all(zcnet_root, zcnet_has_setcap, zcnet_has_setpriv)),
    ignore = "needs root, setcap and setpriv (apt-get install libcap2-bin util-linux)"
)]
#[test]
fn coverage_of_setuid_and_file_capability_programs_is_said_as_it_is() {
    need_library();
    need_root();
    need("setcap");
    need("setpriv");
    let dir = tempfile::tempdir().unwrap();
    let stats_file = dir.path().join("s.jsonl");
    let suid = special_copy(dir.path(), "id-setuid", 0o4755, None);
    let out = Net::Loopback
        .run(false, "auto", &stats_file)
        .arg(&suid)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("ignores LD_PRELOAD"), "{err}");
    assert!(err.contains("confirmed: the library loaded"), "{err}");
    // An unprivileged user: the directory and the copy must be reachable by it.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let capped = special_copy(
        dir.path(),
        "id-caps",
        0o755,
        Some("cap_net_bind_service+ep"),
    );
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(ZCNET)
        .env("ZCNET_PRELOAD", library())
        .args(["run", "--tx", "auto", "--"])
        .arg(&capped)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {err}", out.status);
    assert!(err.contains("file capabilities"), "{err}");
    assert!(err.contains("runs without zcnet"), "{err}");
}

/// A program sends 8 MiB zero-copy, then `exec`s a new image on the same socket, which
/// watches it for half a second and sends a little more. The old image's completions are
/// its own library's to read: before `exec` it settles them, so the new image sees no
/// `POLLERR` on its healthy socket; the old image's line is written (by `zcnet run`, as
/// `"ended": "exec"`) beside the new one's.
#[cfg_attr(not(zcnet_has_python3), ignore = "needs python3")]
#[test]
fn exec_leaves_no_completion_and_no_lost_stats_behind() {
    need_library();
    need("python3");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.jsonl");
    const N: u64 = 8 << 20;
    const TAIL: u64 = 1 << 20;
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let got = receive_pattern(l);
    let child = format!(
        "import os, select, socket, sys\n\
         fd = int(sys.argv[1])\n\
         p = select.poll()\n\
         p.register(fd, select.POLLIN)\n\
         err = any(e & select.POLLERR for _, e in p.poll(500))\n\
         s = socket.socket(fileno=fd)\n\
         period = bytes((i * 7) % 251 for i in range(251))\n\
         start = {N} % 251\n\
         rot = period[start:] + period[:start]\n\
         s.sendall((rot * ({TAIL} // 251 + 1))[:{TAIL}])\n\
         s.close()\n\
         print('POLLERR' if err else 'clean')\n"
    );
    let script = format!(
        "import os, socket, sys\n\
         period = bytes((i * 7) % 251 for i in range(251))\n\
         data = (period * ({N} // 251 + 1))[:{N}]\n\
         s = socket.create_connection(('127.0.0.1', {port}))\n\
         s.sendall(data)\n\
         os.set_inheritable(s.fileno(), True)\n\
         os.execv(sys.executable, [sys.executable, '-c', {child:?}, str(s.fileno())])\n"
    );
    let out = Net::Loopback
        .run(false, "zerocopy", &file)
        .args(["python3", "-c", &script])
        .env("ZCNET_LOCAL_ZEROCOPY", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(got.join().unwrap(), N + TAIL, "bytes received");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "clean");
    let lines = stats(&file);
    assert!(
        lines.iter().any(|l| l["ended"] == "exec"
            && l["total"]["bytes_copy"].as_u64().unwrap()
                + l["total"]["bytes_zerocopy"].as_u64().unwrap()
                >= N),
        "the old image's line: {lines:?}"
    );
}

/// After each send the program has the kernel write into the buffer it just sent —
/// `getrandom`, `fread`, `readv`/`preadv`, `recvmsg` — while the send may be in flight
/// (its pages write-protected, where a kernel write fails with `EFAULT`). Every call must
/// succeed whole and leave what it read, in every mode; the stream arrives as sent.
#[cfg_attr(not(zcnet_has_cc), ignore = "needs a C compiler (apt-get install gcc)")]
#[test]
fn kernel_writes_into_a_buffer_just_sent_succeed_in_every_mode() {
    need_library();
    let dir = tempfile::tempdir().unwrap();
    let prog = c_program("kernel_writes", dir.path());
    const ROUNDS: u64 = 16;
    for tx in MODES {
        let file = dir.path().join(format!("{tx}.jsonl"));
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port().to_string();
        let got = receive_pattern(l);
        let out = Net::Loopback
            .run(false, tx, &file)
            .arg(&prog)
            .args(["127.0.0.1", &port, &ROUNDS.to_string()])
            .env("ZCNET_LOCAL_ZEROCOPY", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{tx}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(got.join().unwrap(), ROUNDS << 20, "{tx}: bytes received");
    }
}

/// After each send the program has an `io_uring` read fill the buffer it just sent
/// (`uring_reads.c`). The read runs in the kernel, where no interposer sees it: against a
/// page still write-protected it completed with `-EFAULT`. The library must find the ring —
/// by its set-up call (liburing's `io_uring_queue_init`, `syscall(SYS_io_uring_setup)`) or,
/// for a statically linked liburing, by its mapping before the first protection — let go
/// of every page in flight and protect nothing more. Every read completes whole, in every
/// mode; the stream arrives as sent. In `zerocopy`, the line names how the ring was found,
/// and a ring made after sends went out protected found pages still held and let them go.
#[cfg_attr(
    not(all(zcnet_has_cc, zcnet_has_liburing)),
    ignore = "needs a C compiler and liburing (apt-get install gcc liburing-dev)"
)]
#[test]
fn io_uring_reads_into_a_buffer_just_sent_succeed_in_every_mode() {
    need_library();
    let dir = tempfile::tempdir().unwrap();
    let shared = c_program_linked("uring_reads", "uring_shared", &["-luring"], dir.path());
    let fixed = c_program_linked(
        "uring_reads",
        "uring_static",
        &["-Wl,-Bstatic", "-luring", "-Wl,-Bdynamic"],
        dir.path(),
    );
    const ROUNDS: u64 = 8;
    // (program, when the ring is made, how, how the library must find it)
    let cases = [
        (&shared, "before", "liburing", "setup_call"),
        (&shared, "after", "liburing", "setup_call"),
        (&shared, "after", "syscall", "setup_call"),
        (&fixed, "before", "liburing", "mapping"),
    ];
    for (prog, when, how, found) in cases {
        for tx in MODES {
            let who = format!("{} {when} {how}, {tx}", prog.display());
            // A directory per run: no run learns a copying route from an earlier one.
            let run_dir = dir.path().join(format!(
                "{}-{when}-{how}-{tx}",
                prog.file_name().unwrap().to_string_lossy()
            ));
            std::fs::create_dir(&run_dir).unwrap();
            let file = run_dir.join("stats.jsonl");
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port().to_string();
            let got = receive_pattern(l);
            let out = Net::Loopback
                .run(false, tx, &file)
                .arg(prog)
                .args(["127.0.0.1", &port, &ROUNDS.to_string(), when, how])
                .env("ZCNET_LOCAL_ZEROCOPY", "1")
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{who}: {}\n{err}", out.status);
            // One read per round from the one that made the ring on.
            let reads = if when == "before" {
                ROUNDS
            } else {
                ROUNDS - ROUNDS / 2 + 1
            };
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                format!("{reads} reads"),
                "{who}"
            );
            assert_eq!(got.join().unwrap(), ROUNDS << 20, "{who}: bytes received");
            if tx == "zerocopy" {
                let lines = stats(&file);
                assert_eq!(lines.len(), 1, "{who}: {lines:?}");
                let ring = &lines[0]["io_uring"];
                assert_eq!(ring["found"], found, "{who}: {lines:?}");
                assert_eq!(ring["errors"], 0, "{who}: {lines:?}");
                let total = &lines[0]["total"];
                // Every send once the ring exists is copied, for it (whole 1 MiB writes
                // on a blocking socket).
                let sends_after = if when == "before" {
                    ROUNDS
                } else {
                    ROUNDS - ROUNDS / 2
                };
                assert_eq!(
                    total["fallback_bytes"]["io_uring"],
                    sends_after << 20,
                    "{who}: {lines:?}"
                );
                // Before it, in `after`, they went out protected (whether the last one's
                // pages were still held when the ring came depends on when its completion
                // was read: `pages` says, and a read into them would have failed).
                let before_ring = (ROUNDS - sends_after) << 20;
                assert_eq!(total["bytes_zerocopy"], before_ring, "{who}: {lines:?}");
                assert!(
                    ring["pages"].as_u64() <= Some(before_ring / 4096),
                    "{who}: {lines:?}"
                );
            }
        }
    }
}

/// The six lines of Python: a fresh 8 MiB of `os.urandom` sent and dropped, again
/// and again. malloc hands the memory just freed — still in flight, so still
/// write-protected — to the next `getrandom`, which failed with `EFAULT` (`OSError:
/// [Errno 14] Bad address`). Every mode; what arrives is what was sent (SHA-256 on both
/// ends).
#[cfg_attr(not(zcnet_has_python3), ignore = "needs python3")]
#[test]
fn python_sending_fresh_random_buffers_in_a_loop_never_gets_efault() {
    need_library();
    need("python3");
    let dir = tempfile::tempdir().unwrap();
    for tx in MODES {
        let file = dir.path().join(format!("{tx}.jsonl"));
        let port = free_port();
        let mut recv = Command::new("python3")
            .arg("-c")
            .arg(format!(
                "import hashlib, socket\n\
                 l = socket.create_server(('127.0.0.1', {port}))\n\
                 c, _ = l.accept()\n\
                 h = hashlib.sha256()\n\
                 while True:\n\
                 \x20   b = c.recv(1 << 20)\n\
                 \x20   if not b: break\n\
                 \x20   h.update(b)\n\
                 print(h.hexdigest())\n"
            ))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        Net::Loopback.wait_listening(port, &mut recv);
        let out = Net::Loopback
            .run(false, tx, &file)
            .args(["python3", "-c"])
            .arg(format!(
                "import hashlib, os, socket\n\
                 s = socket.create_connection(('127.0.0.1', {port}))\n\
                 h = hashlib.sha256()\n\
                 for _ in range(12):\n\
                 \x20   data = os.urandom(8 << 20)\n\
                 \x20   h.update(data)\n\
                 \x20   s.sendall(data)\n\
                 \x20   del data\n\
                 s.close()\n\
                 print(h.hexdigest())\n"
            ))
            .env("ZCNET_LOCAL_ZEROCOPY", "1")
            .output()
            .unwrap();
        let got = recv.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{tx}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&got.stdout).trim(),
            "{tx}: what arrived differs"
        );
    }
}

/// Under `zcnet run`, the stats lines add up to what the program sent, however it makes
/// children: the zcnet-preload test `fork_exec_stats.py` (a parent sending before and after
/// children made by `subprocess` — `vfork` + `execve` — by `fork` + `execv`, and a fork that
/// only exits; some send on connections of their own, some nothing), in every mode. The
/// lines come from the library (normal exits) and from `zcnet run`'s board (the images
/// replaced by `exec`): a child counts only what it sent itself, and one that sent nothing
/// has no line. Before, a `vfork` child's `exec` marked its parent's slot as replaced, and a
/// forked child that exited normally wrote its parent's counters as its own.
#[cfg_attr(not(zcnet_has_python3), ignore = "needs python3")]
#[test]
fn children_made_by_fork_vfork_and_exec_count_only_their_own_sends() {
    need_library();
    need("python3");
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../zcnet-preload/tests/fork_exec_stats.py");
    for tx in ["copy", "zerocopy", "auto"] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("s.jsonl");
        let out = Net::Loopback
            .run(false, tx, &file)
            .env("ZCNET_LOCAL_ZEROCOPY", "1")
            .arg("python3")
            .arg(&script)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{tx}: {}\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let sent: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("ok sent "))
            .and_then(|l| l.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{tx}: {text}"));
        let each: Vec<(u64, u64, String)> = stats(&file)
            .iter()
            .map(|l| {
                let t = &l["total"];
                (
                    l["pid"].as_u64().unwrap(),
                    t["bytes_copy"].as_u64().unwrap() + t["bytes_zerocopy"].as_u64().unwrap(),
                    l["ended"].as_str().unwrap_or("exit").to_string(),
                )
            })
            .collect();
        assert_eq!(
            each.iter().map(|(_, b, _)| b).sum::<u64>(),
            sent,
            "{tx}: the lines add up to what was sent: {each:?}"
        );
        assert_eq!(
            each.len(),
            3,
            "{tx}: one line per sending process: {each:?}"
        );
        assert!(
            each.iter().all(|(_, _, e)| e != "exec"),
            "{tx}: no image that sent was replaced by exec: {each:?}"
        );
    }
}

/// Every way a program replaces its image settles its sends first and keeps its stats:
/// `exec_variants.c` sends 8 MiB (`zerocopy`, rewriting the buffer at once), then execs
/// itself through each of the C library's entry points — `execve`, `execv`, `execvp`,
/// `execvpe`, `fexecve`, and the C-variadic `execl`, `execlp`, `execle` (with arguments
/// both in registers and on the stack) — or starts `true` with `posix_spawn`. The new
/// image watches the socket it inherited for half a second and sends the stream's last
/// MiB: it must see no `POLLERR` (the old image's completions were read by the old
/// image's library before the exec) and get the environment its caller passed. Every
/// byte arrives as sent, the lines add up to them, and the old image's line says
/// `"ended": "exec"`. glibc's `execl`, `execlp`, `execle` and `fexecve` reach the kernel
/// through its internal `execve`, unseen: the library defines them itself (the `execl`
/// ones on x86-64 and aarch64 only; elsewhere they are not run here). `posix_spawn`
/// replaces no image that sent (its child runs in the caller's memory until its own
/// internal `execve`): the program's line is written at its normal exit.
#[cfg_attr(not(zcnet_has_cc), ignore = "needs a C compiler (apt-get install gcc)")]
#[test]
fn every_exec_variant_leaves_no_completion_and_keeps_the_old_images_stats() {
    let dir = tempfile::tempdir().unwrap();
    let prog = c_program("exec_variants", dir.path());
    need_library();
    const LEN: u64 = 8 << 20;
    // As in exec_variants.c.
    const TAIL: u64 = 1 << 20;
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // Elsewhere than on x86-64 and aarch64 the library leaves the variadic `execl*` to the
    // C library.
    let execs: Vec<&str> = [
        "execve", "execv", "execvp", "execvpe", "execl", "execlp", "execle", "fexecve",
    ]
    .into_iter()
    .filter(|v| {
        cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) || !v.starts_with("execl")
    })
    .collect();
    let with_env = ["execve", "execvpe", "execle", "fexecve"];
    let mut failed = Vec::new();
    for v in execs.iter().chain(&["posix_spawn"]) {
        let file = dir.path().join(format!("{v}.jsonl"));
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let got = receive_pattern(l);
        let out = Net::Loopback
            .run(false, "zerocopy", &file)
            .env("ZCNET_LOCAL_ZEROCOPY", "1")
            .env("PATH", &path)
            .arg(&prog)
            .args([v.to_string(), port.to_string(), LEN.to_string()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{v}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let exec = execs.contains(v);
        let total = if exec { LEN + TAIL } else { LEN };
        assert_eq!(got.join().unwrap(), total, "{v}: bytes received");
        let lines = stats(&file);
        let sent: u64 = lines.iter().map(sent_by).sum();
        assert_eq!(sent, total, "{v}: {lines:?}");
        if !exec {
            assert_eq!(lines.len(), 1, "{v}: {lines:?}");
            assert!(lines[0]["written_by"].is_null(), "{v}: {}", lines[0]);
            continue;
        }
        let via = if with_env.contains(v) { v } else { "-" };
        let watched = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let old: Vec<_> = lines.iter().filter(|l| l["ended"] == "exec").collect();
        // Every variant is run before any is judged, so that one failure shows them all.
        let ok = watched == format!("clean {via}")
            && lines.len() == 2
            && old.len() == 1
            && sent_by(old[0]) == LEN;
        if !ok {
            let each: Vec<_> = lines.iter().map(|l| (&l["ended"], sent_by(l))).collect();
            failed.push(format!(
                "{v}: new image: {watched:?}; lines (ended, sent): {each:?}"
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The bytes a stats line counts as sent, copied or zero-copy.
fn sent_by(line: &Value) -> u64 {
    let t = &line["total"];
    t["bytes_copy"].as_u64().unwrap() + t["bytes_zerocopy"].as_u64().unwrap()
}
