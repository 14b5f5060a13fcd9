//! `zcnet bench -s` / `-c` against the real `iperf3` from the distribution, on loopback:
//! an unmodified `iperf3 -c` against `zcnet bench -s`, and `zcnet bench -c` against an
//! unmodified `iperf3 -s` — forward, `-R`, `--bidir`, `-P 4`, and UDP (`-u`) both ways —
//! with both sides' `-J` reports parsed for exactly the fields k8s-netperf reads
//! (`end.sum_sent.retransmits`, `end.sum_received.bits_per_second`, `end.sum.lost_percent`;
//! `pkg/drivers/iperf.go`) and those pScheduler and
//! PerfKitBenchmarker read (`end.sum_sent` / `end.sum_received` bytes and rates,
//! `end.cpu_utilization_percent.host_total` / `remote_total`).
//!
//! What "agree" means: each quantity both reports carry is the same number in both (the
//! results exchange worked), and where zcnet receives it reports exactly the bytes the
//! sender says it sent (it drains to the sender's count, or to end of stream). Where
//! iperf3 receives, it counts only what it read before `TEST_END` (`iperf_tcp_recv` counts
//! in `TEST_RUNNING` only), so its count is at most the bytes sent. The payload is
//! iperf3's own (random bytes), which no one can check byte by byte; the counts are.
//!
//! Without `/usr/bin/iperf3` (or `iperf3` on `PATH`) every test here skips and says so.

mod common;

use common::zcnet;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn iperf3() -> Option<PathBuf> {
    let p = PathBuf::from("/usr/bin/iperf3");
    if p.exists() {
        return Some(p);
    }
    let out = Command::new("sh")
        .args(["-c", "command -v iperf3"])
        .output()
        .ok()?;
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!s.is_empty()).then(|| PathBuf::from(s))
}

/// iperf3's path, for a test marked ignored without `zcnet_has_iperf3`: the build found it
/// on PATH, so a missing one is a failure.
macro_rules! need_iperf3 {
    () => {
        iperf3().expect("iperf3, which the build found on PATH")
    };
}

/// A free loopback port (bound and released; iperf3 binds it right after).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits (bounded) until something listens on 127.0.0.1:`port` — read from
/// /proc/net/tcp, since connecting would use up a one-off server's only test.
fn wait_listening(port: u16) {
    let want = format!("0100007F:{port:04X}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        if tcp.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1] == want && f[3] == "0A"
        }) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing listens on port {port} after 10 s");
}

/// A server process killed (and reaped) if the test ends before it does — a failed
/// assertion must not leave a listening iperf3 or zcnet behind.
struct Running(Option<Child>);

impl Running {
    /// The child, for [`finish`]; the guard then owns nothing.
    fn take(&mut self) -> Child {
        self.0.take().expect("taken once")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Spawns `cmd` with its stdout and stderr captured, for [`finish`].
fn spawn_piped(cmd: &mut Command) -> Child {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `iperf3 -c 127.0.0.1 -p PORT`, for the options that follow.
fn iperf3_client(iperf3: &Path, port: u16) -> Command {
    let mut c = Command::new(iperf3);
    c.args(["-c", "127.0.0.1", "-p", &port.to_string()]);
    c
}

/// `zcnet bench -c 127.0.0.1 -p PORT`, for the options that follow.
fn zcnet_client(port: u16) -> Command {
    let mut c = zcnet();
    c.args(["bench", "-c", "127.0.0.1", "-p", &port.to_string()]);
    c
}

/// An unmodified one-off `iperf3 -s -1 -J` on a free loopback port, listening, and the port.
fn iperf3_server(iperf3: &Path) -> (Running, u16) {
    let port = free_port();
    let server = Running(Some(spawn_piped(Command::new(iperf3).args([
        "-s",
        "-1",
        "-J",
        "-B",
        "127.0.0.1",
        "-p",
        &port.to_string(),
    ]))));
    wait_listening(port);
    (server, port)
}

/// Runs `client` against a one-off `server` until both end (bounded); each must succeed.
/// Returns the client's stdout and the server's.
fn run_pair(
    client: &mut Command,
    client_name: &str,
    mut server: Running,
    server_name: &str,
) -> (String, String) {
    let (ok, out, err) = finish(spawn_piped(client), Duration::from_secs(60));
    assert!(ok, "{client_name} failed: {err}\n{out:.600}");
    let (sok, sout, serr) = finish(server.take(), Duration::from_secs(30));
    assert!(sok, "{server_name} failed: {serr}");
    (out, sout)
}

/// Waits (bounded) for a child; returns (success, stdout, stderr).
fn finish(mut child: Child, limit: Duration) -> (bool, String, String) {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "did not finish within {limit:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `zcnet bench -s -B 127.0.0.1:0 EXTRA…`, the port it announced on stderr, and the rest
/// of its stderr as it comes.
fn zcnet_server(extra: &[&str]) -> (Running, u16, Arc<Mutex<String>>) {
    let mut child = zcnet()
        .args(["bench", "-s", "-B", "127.0.0.1:0", "-J"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn zcnet bench -s");
    let mut line = String::new();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    err.read_line(&mut line)
        .expect("the server announces itself");
    let port = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("127.0.0.1:"))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    // Keep draining stderr so the server never blocks on a full pipe.
    let log = Arc::new(Mutex::new(String::new()));
    let l = log.clone();
    std::thread::spawn(move || {
        let mut line = String::new();
        while err.read_line(&mut line).unwrap_or(0) > 0 {
            eprint!("{line}");
            l.lock().unwrap().push_str(&line);
            line.clear();
        }
    });
    (Running(Some(child)), port, log)
}

fn parse(doc: &str, who: &str) -> Value {
    let v: Value = serde_json::from_str(doc)
        .unwrap_or_else(|e| panic!("{who}: -J output is not JSON ({e}): {doc:.400}"));
    assert!(
        v.get("error").is_none(),
        "{who} reported an error: {}",
        v["error"]
    );
    v
}

fn num(v: &Value, path: &[&str]) -> f64 {
    let mut cur = v;
    for k in path {
        cur = &cur[*k];
    }
    cur.as_f64()
        .unwrap_or_else(|| panic!("{} is not a number: {cur}", path.join(".")))
}

fn bytes(v: &Value, sum: &str) -> u64 {
    num(v, &["end", sum, "bytes"]) as u64
}

/// What k8s-netperf's iperf3 driver decodes (`pkg/drivers/iperf.go`, `IperfResult`:
/// `end.sum_sent.retransmits`, `end.sum_received.bits_per_second`, `end.sum.bits_per_second`
/// and `end.sum.lost_percent`), read as its Go decoder reads them: each absent (Go's zero
/// value) or a number, never anything else; the rate it reports (`sum_received`'s) positive;
/// for UDP the loss a percentage, and for TCP the retransmits a count.
fn check_k8s_netperf(v: &Value, udp: bool, who: &str) {
    for (sum, field) in [
        ("sum_sent", "retransmits"),
        ("sum_received", "bits_per_second"),
        ("sum", "bits_per_second"),
        ("sum", "lost_percent"),
    ] {
        let x = &v["end"][sum][field];
        assert!(
            x.is_null() || x.is_number(),
            "{who}: end.{sum}.{field} = {x}: k8s-netperf cannot decode it"
        );
    }
    assert!(
        num(v, &["end", "sum_received", "bits_per_second"]) > 0.0,
        "{who}"
    );
    if udp {
        let l = num(v, &["end", "sum", "lost_percent"]);
        assert!((0.0..=100.0).contains(&l), "{who}: lost_percent {l}");
        assert!(num(v, &["end", "sum", "bits_per_second"]) > 0.0, "{who}");
    } else {
        assert!(num(v, &["end", "sum_sent", "retransmits"]) >= 0.0, "{who}");
    }
}

/// The fields k8s-netperf, pScheduler and PerfKitBenchmarker read from a UDP test, present
/// and sane, with iperf3's UDP sums (`packets`, `lost_packets`, `jitter_ms`).
fn check_udp_consumer_fields(v: &Value, who: &str) {
    check_k8s_netperf(v, true, who);
    for sum in ["sum", "sum_sent", "sum_received"] {
        for f in ["bytes", "bits_per_second", "packets"] {
            assert!(num(v, &["end", sum, f]) > 0.0, "{who}: end.{sum}.{f}");
        }
        for f in ["lost_packets", "jitter_ms", "lost_percent"] {
            assert!(num(v, &["end", sum, f]) >= 0.0, "{who}: end.{sum}.{f}");
        }
    }
    for k in ["host_total", "remote_total"] {
        let c = num(v, &["end", "cpu_utilization_percent", k]);
        assert!(c.is_finite() && c >= 0.0, "{who}: {k} = {c}");
    }
    assert_eq!(v["start"]["test_start"]["protocol"], "UDP", "{who}");
}

/// The fields k8s-netperf, pScheduler and PerfKitBenchmarker read, present and sane.
fn check_consumer_fields(v: &Value, who: &str) {
    check_k8s_netperf(v, false, who);
    assert!(num(v, &["end", "sum_sent", "retransmits"]) >= 0.0, "{who}");
    assert!(num(v, &["end", "sum_sent", "bytes"]) > 0.0, "{who}");
    assert!(
        num(v, &["end", "sum_sent", "bits_per_second"]) > 0.0,
        "{who}"
    );
    assert!(num(v, &["end", "sum_received", "bytes"]) > 0.0, "{who}");
    assert!(
        num(v, &["end", "sum_received", "bits_per_second"]) > 0.0,
        "{who}"
    );
    for k in ["host_total", "remote_total"] {
        let c = num(v, &["end", "cpu_utilization_percent", k]);
        assert!(c.is_finite() && c >= 0.0, "{who}: {k} = {c}");
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Forward,
    Reverse,
    Bidir,
    Parallel4,
}

impl Mode {
    /// The iperf3 options: short runs (`-t 1`, or `-n`).
    fn args(self) -> &'static [&'static str] {
        match self {
            Mode::Forward => &["-t", "1"],
            Mode::Reverse => &["-R", "-n", "96M"],
            Mode::Bidir => &["--bidir", "-t", "1"],
            Mode::Parallel4 => &["-P", "4", "-n", "200M"],
        }
    }

    fn streams(self) -> usize {
        match self {
            Mode::Forward | Mode::Reverse => 1,
            Mode::Bidir => 2,
            Mode::Parallel4 => 4,
        }
    }
}

/// An unmodified `iperf3 -c` against `zcnet bench -s`.
fn iperf3_client_vs_zcnet_server(mode: Mode) {
    let iperf3 = need_iperf3!();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.json");
    let (server, port, _) = zcnet_server(&["-1", "--logfile", log.to_str().unwrap()]);
    let (out, _) = run_pair(
        iperf3_client(&iperf3, port).arg("-J").args(mode.args()),
        "iperf3 -c",
        server,
        "zcnet bench -s -1",
    );
    let c = parse(&out, "iperf3 -c");
    let s = parse(&std::fs::read_to_string(&log).unwrap(), "zcnet bench -s");
    check_consumer_fields(&c, "iperf3 -c");
    check_consumer_fields(&s, "zcnet bench -s");
    // Both reports carry the same numbers.
    let mut sums = vec!["sum_sent", "sum_received"];
    if mode == Mode::Bidir {
        sums.extend(["sum_sent_bidir_reverse", "sum_received_bidir_reverse"]);
    }
    for k in &sums {
        assert_eq!(bytes(&c, k), bytes(&s, k), "{k}: iperf3 -c vs zcnet -s");
    }
    // The server's CPU as each side reports it (iperf3 prints 15 significant digits).
    let (remote, host) = (
        num(&c, &["end", "cpu_utilization_percent", "remote_total"]),
        num(&s, &["end", "cpu_utilization_percent", "host_total"]),
    );
    assert!(
        (remote - host).abs() <= 1e-9 * host.abs().max(1.0),
        "{remote} vs {host}"
    );
    // zcnet receives the main direction except with -R: it drains to the sender's count.
    if mode != Mode::Reverse {
        assert_eq!(bytes(&s, "sum_received"), bytes(&s, "sum_sent"));
    } else {
        assert!(bytes(&c, "sum_received") <= bytes(&c, "sum_sent"));
        // iperf3 -n ends once it has received the count.
        assert!(bytes(&c, "sum_received") >= 96 << 20);
    }
    if mode == Mode::Parallel4 {
        assert!(bytes(&c, "sum_sent") >= 200 << 20);
    }
    assert_eq!(
        c["end"]["streams"].as_array().unwrap().len(),
        mode.streams()
    );
    assert_eq!(
        s["end"]["streams"].as_array().unwrap().len(),
        mode.streams()
    );
    // zcnet's own figures, under a key iperf3 does not use.
    let z = &s["end"]["zcnet"]["local"];
    assert!(num(z, &["cpu_s_per_gib"]) > 0.0, "{z}");
    assert_eq!(z["role"], "server");
    assert!(
        c["end"].get("zcnet").is_none(),
        "iperf3 knows nothing of zcnet"
    );
}

/// `zcnet bench -c` against an unmodified `iperf3 -s`.
fn zcnet_client_vs_iperf3_server(mode: Mode, stream_output: bool) {
    let iperf3 = need_iperf3!();
    let (server, port) = iperf3_server(&iperf3);
    // A -n run can end in a few tens of ms on a quiet machine; with -i 0.1 even that run's
    // last, partial interval is longer than a tenth of one, so an interval event is due.
    let json_flags: &[&str] = if stream_output {
        &["--json-stream", "-i", "0.1"]
    } else {
        &["-J"]
    };
    let (out, sout) = run_pair(
        zcnet_client(port).args(json_flags).args(mode.args()),
        "zcnet bench -c",
        server,
        "iperf3 -s",
    );
    let c = if stream_output {
        // One JSON object a line: start, intervals, end.
        let events: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert_eq!(events.first().unwrap()["event"], "start");
        assert_eq!(events.last().unwrap()["event"], "end");
        assert!(events.iter().any(|e| e["event"] == "interval"));
        serde_json::json!({"end": events.last().unwrap()["data"]})
    } else {
        parse(&out, "zcnet bench -c")
    };
    let s = parse(&sout, "iperf3 -s");
    check_consumer_fields(&c, "zcnet bench -c");
    // iperf3's server writes its report before the results exchange, so only what it
    // measured itself is in it: its received bytes (forward) or sent bytes (-R).
    match mode {
        Mode::Reverse => {
            assert_eq!(bytes(&c, "sum_sent"), bytes(&s, "sum_sent"));
            // zcnet reads to end of stream: every byte iperf3 sent.
            assert_eq!(bytes(&c, "sum_received"), bytes(&c, "sum_sent"));
            assert!(bytes(&c, "sum_received") >= 96 << 20);
        }
        _ => {
            assert_eq!(bytes(&c, "sum_received"), bytes(&s, "sum_received"));
            assert!(bytes(&c, "sum_received") <= bytes(&c, "sum_sent"));
        }
    }
    if mode == Mode::Bidir {
        assert_eq!(
            bytes(&c, "sum_sent_bidir_reverse"),
            bytes(&s, "sum_sent_bidir_reverse")
        );
        assert_eq!(
            bytes(&c, "sum_received_bidir_reverse"),
            bytes(&c, "sum_sent_bidir_reverse")
        );
    }
    if mode == Mode::Parallel4 {
        assert_eq!(
            bytes(&c, "sum_sent"),
            200 << 20,
            "-n is exact on zcnet's side"
        );
    }
    assert_eq!(
        c["end"]["streams"].as_array().unwrap().len(),
        mode.streams()
    );
    let z = &c["end"]["zcnet"];
    assert!(num(z, &["local", "cpu_s_per_gib"]) > 0.0, "{z}");
    assert!(z["remote"].is_null(), "iperf3 sends no zcnet figures");
}

#[cfg_attr(
    not(zcnet_has_iperf3),
    ignore = "needs iperf3 (apt-get install iperf3)"
)]
#[test]
fn iperf3_client_forward_against_zcnet_server() {
    iperf3_client_vs_zcnet_server(Mode::Forward);
}

#[cfg_attr(
    not(zcnet_has_iperf3),
    ignore = "needs iperf3 (apt-get install iperf3)"
)]
#[test]
fn iperf3_client_reverse_against_zcnet_server() {
    iperf3_client_vs_zcnet_server(Mode::Reverse);
}

#[cfg_attr(
    not(zcnet_has_iperf3),
    ignore = "needs iperf3 (apt-get install iperf3)"
)]
#[test]
fn iperf3_client_bidir_against_zcnet_server() {
    iperf3_client_vs_zcnet_server(Mode::Bidir);
}

#[cfg_attr(
    not(zcnet_has_iperf3),
    ignore = "needs iperf3 (apt-get install iperf3)"
)]
#[test]
fn iperf3_client_four_streams_against_zcnet_server() {
    iperf3_client_vs_zcnet_server(Mode::Parallel4);
}

#[cfg_attr(
    not(zcnet_has_iperf3),
    ignore = "needs iperf3 (apt-get install iperf3)"
)]
#[test]
fn zcnet_client_forward_against_iperf3_server() {
    zcnet_client_vs_iperf3_server(Mode::Forward, false);
}

#[cfg_attr(
    not(zcnet_has_iperf3),
    ignore = "needs iperf3 (apt-get install iperf3)"
)]
#[test]
fn zcnet_client_reverse_against_iperf3_server() {
    zcnet_client_vs_iperf3_server(Mode::Reverse, false);
}

#[cfg_attr(
    not(zcnet_has_iperf3),
    ignore = "needs iperf3 (apt-get install iperf3)"
)]
#[test]
fn zcnet_client_bidir_against_iperf3_server() {
    zcnet_client_vs_iperf3_server(Mode::Bidir, false);
}

#[cfg_attr(
    not(zcnet_has_iperf3),
    ignore = "needs iperf3 (apt-get install iperf3)"
)]
#[test]
fn zcnet_client_four_streams_against_iperf3_server_json_stream() {
    zcnet_client_vs_iperf3_server(Mode::Parallel4, true);
}

/// Two `iperf3 -c` at once against one `zcnet bench -s` (iperf3's own server would tell
/// the second `ACCESS_DENIED`): both complete, each with its own byte counts.
#[cfg_attr(
    not(zcnet_has_iperf3),
    ignore = "needs iperf3 (apt-get install iperf3)"
)]
#[test]
fn zcnet_server_takes_two_iperf3_clients_at_once() {
    let iperf3 = need_iperf3!();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.json");
    let (server, port, _) = zcnet_server(&["--logfile", log.to_str().unwrap()]);
    let clients: Vec<Child> = (0..2)
        .map(|_| spawn_piped(iperf3_client(&iperf3, port).args(["-J", "-t", "2"])))
        .collect();
    let docs: Vec<Value> = clients
        .into_iter()
        .map(|c| {
            let (ok, out, err) = finish(c, Duration::from_secs(60));
            assert!(ok, "iperf3 -c failed: {err}\n{out:.600}");
            parse(&out, "iperf3 -c")
        })
        .collect();
    drop(server);
    for d in &docs {
        check_consumer_fields(d, "iperf3 -c");
        assert_eq!(bytes(d, "sum_sent"), bytes(d, "sum_received"));
        // Each ran its full two seconds, side by side rather than one after the other.
        assert!(num(d, &["end", "sum_sent", "seconds"]) >= 1.9);
    }
    assert_ne!(
        docs[0]["start"]["cookie"], docs[1]["start"]["cookie"],
        "two tests"
    );
}

/// `zcnet bench -c` against `zcnet bench -s`: the results exchange carries each side's
/// zcnet figures, so the report has both ends' CPU-s/GiB.
#[test]
fn zcnet_to_zcnet_reports_both_ends_cpu_per_gib() {
    let (server, port, _) = zcnet_server(&["-1", "--tx", "copy", "--rx", "copy"]);
    let (out, sout) = run_pair(
        zcnet_client(port)
            .arg("-J")
            .args(["-R", "-n", "64M", "-l", "64K", "--rx", "copy"]),
        "zcnet bench -c",
        server,
        "zcnet bench -s",
    );
    let c = parse(&out, "zcnet bench -c");
    let s = parse(&sout, "zcnet bench -s");
    assert_eq!(bytes(&c, "sum_sent"), bytes(&c, "sum_received"));
    assert_eq!(bytes(&c, "sum_sent"), bytes(&s, "sum_sent"));
    let z = &c["end"]["zcnet"];
    let (local, remote) = (
        num(z, &["local", "cpu_s_per_gib"]),
        num(z, &["remote", "cpu_s_per_gib"]),
    );
    assert!(local > 0.0 && remote > 0.0, "{z}");
    assert!((num(z, &["cpu_s_per_gib_both_ends"]) - (local + remote)).abs() < 1e-9);
    assert_eq!(z["remote"]["role"], "server");
    assert_eq!(z["remote"]["tx_path"], "copy");
    assert_eq!(c["start"]["test_start"]["blksize"], 65536);
}

/// What zcnet does not run is refused by name on the server and reported to the iperf3
/// client as an error, not run differently from what was asked.
#[cfg_attr(
    not(zcnet_has_iperf3),
    ignore = "needs iperf3 (apt-get install iperf3)"
)]
#[test]
fn zcnet_server_refuses_udp_bidir_by_name() {
    let iperf3 = need_iperf3!();
    let (mut server, port, log) = zcnet_server(&["-1"]);
    let client = spawn_piped(iperf3_client(&iperf3, port).args(["-u", "--bidir", "-t", "1"]));
    let (ok, out, err) = finish(client, Duration::from_secs(30));
    assert!(!ok, "iperf3 -u --bidir should fail against zcnet: {out}");
    assert!(
        (out.clone() + &err).contains("error"),
        "iperf3 says why: {out} {err}"
    );
    let (sok, _, _) = finish(server.take(), Duration::from_secs(30));
    assert!(!sok, "the refused test is the server's failure too");
    std::thread::sleep(Duration::from_millis(100)); // the stderr reader's last line
    let log = log.lock().unwrap().clone();
    assert!(
        log.contains("UDP tests with --bidir"),
        "the server names it: {log}"
    );
}

/// Each of iperf3's UDP counts, as both reports of one test carry them.
fn udp_counts(v: &Value, sum: &str) -> (u64, u64, u64) {
    (
        num(v, &["end", sum, "bytes"]) as u64,
        num(v, &["end", sum, "packets"]) as u64,
        num(v, &["end", sum, "lost_packets"]) as u64,
    )
}

/// An unmodified `iperf3 -u -c` against `zcnet bench -s`: the test runs (iperf3 used to
/// be told "not implemented"), and both ends' `-J` reports carry the same datagram counts,
/// losses and `lost_percent` in every sum, the counts consistent with the bytes.
fn iperf3_udp_client_vs_zcnet_server(args: &[&str], len: u64) {
    let iperf3 = need_iperf3!();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.json");
    let (server, port, _) = zcnet_server(&["-1", "--logfile", log.to_str().unwrap()]);
    let (out, _) = run_pair(
        iperf3_client(&iperf3, port).args(["-J", "-u"]).args(args),
        "iperf3 -u -c",
        server,
        "zcnet bench -s -1",
    );
    let c = parse(&out, "iperf3 -u -c");
    let s = parse(&std::fs::read_to_string(&log).unwrap(), "zcnet bench -s");
    check_udp_consumer_fields(&c, "iperf3 -u -c");
    check_udp_consumer_fields(&s, "zcnet bench -s (UDP)");
    for sum in ["sum", "sum_sent", "sum_received"] {
        assert_eq!(udp_counts(&c, sum), udp_counts(&s, sum), "end.{sum}");
        let (a, b) = (
            num(&c, &["end", sum, "lost_percent"]),
            num(&s, &["end", sum, "lost_percent"]),
        );
        assert!((a - b).abs() < 1e-9, "end.{sum}.lost_percent {a} vs {b}");
    }
    let (sent_bytes, sent, _) = udp_counts(&c, "sum_sent");
    let (got_bytes, highest, lost) = udp_counts(&c, "sum_received");
    assert_eq!(sent_bytes, sent * len, "every datagram is -l bytes");
    assert!(highest <= sent && lost <= highest);
    assert_eq!(got_bytes % len, 0);
    let got = got_bytes / len;
    assert!(got <= sent, "{got} received of {sent} sent");
    // What is neither received nor counted lost is what was still in flight at the end.
    assert!(got + lost <= sent + 1, "{got} + {lost} vs {sent}");
    let lp = num(&c, &["end", "sum", "lost_percent"]);
    assert!(
        (lp - 100.0 * lost as f64 / sent as f64).abs() < 1e-9,
        "{lp}"
    );
    assert!(c["end"]["streams"][0]["udp"]["packets"].as_u64().is_some());
    // Interval records carry iperf3's datagram fields, as iperf3's own do: the sending end
    // its packets, the receiving end its losses and jitter too.
    let (sending, receiving) = if args.contains(&"-R") {
        (&s, &c)
    } else {
        (&c, &s)
    };
    assert!(sending["intervals"][0]["sum"]["packets"].is_number());
    let sum = &receiving["intervals"][0]["sum"];
    for f in ["packets", "lost_packets", "lost_percent", "jitter_ms"] {
        assert!(sum[f].is_number(), "intervals[0].sum.{f}: {sum}");
    }
    // zcnet's end counted its datagrams and calls.
    let z = &s["end"]["zcnet"]["local"]["udp"];
    assert!(
        num(z, &["datagrams"]) > 0.0 && num(z, &["syscalls"]) > 0.0,
        "{z}"
    );
}

#[cfg_attr(
    not(zcnet_has_iperf3),
    ignore = "needs iperf3 (apt-get install iperf3)"
)]
#[test]
fn iperf3_udp_client_against_zcnet_server() {
    iperf3_udp_client_vs_zcnet_server(&["-b", "50M", "-l", "1400", "-t", "1"], 1400);
}

#[cfg_attr(
    not(zcnet_has_iperf3),
    ignore = "needs iperf3 (apt-get install iperf3)"
)]
#[test]
fn iperf3_udp_client_reverse_two_streams_64bit_against_zcnet_server() {
    iperf3_udp_client_vs_zcnet_server(
        &[
            "-R",
            "-P",
            "2",
            "-b",
            "50M",
            "-l",
            "1200",
            "-t",
            "1",
            "--udp-counters-64bit",
        ],
        1200,
    );
}

/// `zcnet bench -c -u` against an unmodified `iperf3 -s`: iperf3 receives (or, with `-R`,
/// sends) the datagrams, and the counts each end measured itself are the same in both
/// reports (iperf3's server writes its report before the results exchange, so it has only
/// its own side's counts).
fn zcnet_udp_client_vs_iperf3_server(args: &[&str], reverse: bool) {
    let iperf3 = need_iperf3!();
    let (server, port) = iperf3_server(&iperf3);
    let (out, sout) = run_pair(
        zcnet_client(port).args(["-J", "-u"]).args(args),
        "zcnet bench -c -u",
        server,
        "iperf3 -s",
    );
    let c = parse(&out, "zcnet bench -c -u");
    let s = parse(&sout, "iperf3 -s (UDP)");
    check_udp_consumer_fields(&c, "zcnet bench -c -u");
    if reverse {
        // iperf3 sent: its count is the client's sum_sent, exactly.
        assert_eq!(udp_counts(&c, "sum_sent"), udp_counts(&s, "sum_sent"));
        let (_, sent, _) = udp_counts(&c, "sum_sent");
        let (_, highest, lost) = udp_counts(&c, "sum_received");
        assert!(highest <= sent && lost <= highest);
    } else {
        // iperf3 received: its counts are the client's sum_received, exactly.
        assert_eq!(
            udp_counts(&c, "sum_received"),
            udp_counts(&s, "sum_received")
        );
        let (_, sent, _) = udp_counts(&c, "sum_sent");
        let (_, _, lost) = udp_counts(&c, "sum_received");
        let lp = num(&c, &["end", "sum", "lost_percent"]);
        assert!(
            (lp - 100.0 * lost as f64 / sent as f64).abs() < 1e-9,
            "{lp}"
        );
        assert_eq!(
            num(&s, &["end", "sum_received", "lost_packets"]) as u64,
            lost
        );
    }
    let z = &c["end"]["zcnet"]["local"]["udp"];
    assert!(num(z, &["datagrams"]) > 0.0, "{z}");
    assert!(c["end"]["zcnet"]["remote"].is_null());
}

#[cfg_attr(
    not(zcnet_has_iperf3),
    ignore = "needs iperf3 (apt-get install iperf3)"
)]
#[test]
fn zcnet_udp_client_against_iperf3_server() {
    zcnet_udp_client_vs_iperf3_server(&["-b", "50M", "-l", "1400", "-t", "1"], false);
}

#[cfg_attr(
    not(zcnet_has_iperf3),
    ignore = "needs iperf3 (apt-get install iperf3)"
)]
#[test]
fn zcnet_udp_client_reverse_two_streams_64bit_against_iperf3_server() {
    zcnet_udp_client_vs_iperf3_server(
        &[
            "-R",
            "-P",
            "2",
            "-b",
            "50M",
            "-l",
            "1200",
            "-t",
            "1",
            "--udp-counters-64bit",
        ],
        true,
    );
}

/// `zcnet bench -c -u` against `zcnet bench -s`: both ends are zcnet (GSO out, GRO in), the
/// counts agree, and `-b 0` (unlimited, what k8s-netperf passes) runs.
#[test]
fn zcnet_udp_to_zcnet_unlimited_rate() {
    let (server, port, _) = zcnet_server(&["-1"]);
    let (out, sout) = run_pair(
        zcnet_client(port).args(["-J", "-u", "-b", "0", "-l", "1400", "-n", "20M"]),
        "zcnet bench -c -u -b 0",
        server,
        "zcnet bench -s",
    );
    let c = parse(&out, "zcnet bench -c -u");
    let s = parse(&sout, "zcnet bench -s (UDP)");
    check_udp_consumer_fields(&c, "zcnet bench -c -u -b 0");
    for sum in ["sum", "sum_sent", "sum_received"] {
        assert_eq!(udp_counts(&c, sum), udp_counts(&s, sum), "end.{sum}");
    }
    // -n is exact on the sending side: whole datagrams up to the count.
    let (bytes, packets, _) = udp_counts(&c, "sum_sent");
    assert_eq!(packets, (20u64 << 20).div_ceil(1400));
    assert_eq!(bytes, packets * 1400);
    let z = &c["end"]["zcnet"]["local"]["udp"];
    assert_eq!(z["gso"], true, "{z}");
    assert!(
        num(z, &["syscalls"]) < num(z, &["datagrams"]),
        "GSO sends several datagrams a call: {z}"
    );
    assert_eq!(s["end"]["zcnet"]["local"]["udp"]["gro"], true);
}

/// `zcnet bench -c -Z` (iperf3's sendfile flag = zcnet's `--tx file`) against `iperf3 -s`:
/// every byte goes from the page cache by `sendfile`, and the report says so.
#[cfg_attr(
    not(zcnet_has_iperf3),
    ignore = "needs iperf3 (apt-get install iperf3)"
)]
#[test]
fn zcnet_client_sendfile_against_iperf3_server() {
    let iperf3 = need_iperf3!();
    let (server, port) = iperf3_server(&iperf3);
    let (out, sout) = run_pair(
        zcnet_client(port).arg("-J").args(["-Z", "-n", "64M"]),
        "zcnet bench -c -Z",
        server,
        "iperf3 -s",
    );
    let c = parse(&out, "zcnet bench -c -Z");
    let s = parse(&sout, "iperf3 -s");
    check_consumer_fields(&c, "zcnet bench -c -Z");
    assert_eq!(bytes(&c, "sum_sent"), 64 << 20);
    assert_eq!(bytes(&c, "sum_received"), bytes(&s, "sum_received"));
    let z = &c["end"]["zcnet"]["local"];
    assert_eq!(z["tx_path"], "file");
    assert_eq!(z["file_bytes"]["tx"], 64u64 << 20, "{z}");
    assert_eq!(num(z, &["zero_copy_share", "tx"]), 1.0);
}

/// An unmodified `iperf3 -c` against `zcnet bench -s --rx file`: the server splices every
/// stream into a page-cache file (`Receiver::recv_to_file`). iperf3's timer stops its
/// senders wherever it falls, not on a `-l` boundary (and `-l 100000` is no page multiple),
/// so the server must count the last, partial piece too: every count agrees across both
/// reports, and every received byte went into the file.
#[cfg_attr(
    not(zcnet_has_iperf3),
    ignore = "needs iperf3 (apt-get install iperf3)"
)]
#[test]
fn iperf3_client_against_zcnet_server_receiving_into_a_file() {
    let iperf3 = need_iperf3!();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.json");
    let (server, port, _) = zcnet_server(&[
        "-1",
        "--rx",
        "file",
        "--file-dir",
        dir.path().to_str().unwrap(),
        "--logfile",
        log.to_str().unwrap(),
    ]);
    let (out, _) = run_pair(
        iperf3_client(&iperf3, port)
            .arg("-J")
            .args(["-t", "1", "-P", "2", "-l", "100000"]),
        "iperf3 -c",
        server,
        "zcnet bench -s -1 --rx file",
    );
    let c = parse(&out, "iperf3 -c");
    let s = parse(
        &std::fs::read_to_string(&log).unwrap(),
        "zcnet bench -s --rx file",
    );
    check_consumer_fields(&c, "iperf3 -c");
    check_consumer_fields(&s, "zcnet bench -s --rx file");
    let sent = bytes(&c, "sum_sent");
    assert!(sent > 0);
    assert_eq!(
        bytes(&s, "sum_sent"),
        sent,
        "the server has the client's count"
    );
    assert_eq!(
        bytes(&s, "sum_received"),
        sent,
        "every byte sent was received"
    );
    assert_eq!(
        bytes(&c, "sum_received"),
        sent,
        "iperf3 reads the server's count"
    );
    let z = &s["end"]["zcnet"]["local"];
    assert_eq!(z["rx_path"], "file", "{z}");
    assert_eq!(z["rx_paths_in_effect"], serde_json::json!(["file"]), "{z}");
    assert_eq!(
        z["file_bytes"]["rx"], sent,
        "every byte spliced into the file: {z}"
    );
    assert_eq!(z["bytes_received"], sent, "{z}");
    assert_eq!(s["end"]["streams"].as_array().unwrap().len(), 2);
    // The receive files were unnamed: nothing left in --file-dir but the log.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, [std::ffi::OsString::from("server.json")]);
}

/// `zcnet bench -c -R --rx file` against an unmodified `iperf3 -s`, time-limited: iperf3's
/// server stops sending when the client's timer says so, mid-piece; zcnet splices what
/// arrives into a file and reads to end of stream, so it has every byte iperf3 says it sent.
#[cfg_attr(
    not(zcnet_has_iperf3),
    ignore = "needs iperf3 (apt-get install iperf3)"
)]
#[test]
fn zcnet_client_receiving_into_a_file_against_iperf3_server() {
    let iperf3 = need_iperf3!();
    let (server, port) = iperf3_server(&iperf3);
    let (out, sout) = run_pair(
        zcnet_client(port)
            .arg("-J")
            .args(["-R", "-t", "1", "-P", "2", "--rx", "file"]),
        "zcnet bench -c -R --rx file",
        server,
        "iperf3 -s",
    );
    let c = parse(&out, "zcnet bench -c -R --rx file");
    let s = parse(&sout, "iperf3 -s");
    check_consumer_fields(&c, "zcnet bench -c -R --rx file");
    let sent = bytes(&s, "sum_sent");
    assert!(sent > 0);
    assert_eq!(bytes(&c, "sum_sent"), sent, "the client has iperf3's count");
    assert_eq!(
        bytes(&c, "sum_received"),
        sent,
        "every byte sent was received"
    );
    let z = &c["end"]["zcnet"]["local"];
    assert_eq!(z["rx_path"], "file", "{z}");
    assert_eq!(
        z["file_bytes"]["rx"], sent,
        "every byte spliced into the file: {z}"
    );
    let per_stream: u64 = c["end"]["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|st| st["receiver"]["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(per_stream, sent);
}

/// The container image's `iperf3` (packaging/docker/iperf3-shim.sh, `zcnet bench` under
/// iperf3's name) driven with the command k8s-netperf's iperf3 driver runs in a client pod
/// (`-P`, `-c`, `-J`, `-t`, `-l`, `-p`, `--logfile=FILE`), against an unmodified
/// `iperf3 -s`: the log file holds a report k8s-netperf decodes, with the server's count.
#[cfg_attr(
    not(zcnet_has_iperf3),
    ignore = "needs iperf3 (apt-get install iperf3)"
)]
#[test]
fn image_iperf3_shim_runs_the_k8s_netperf_client_command() {
    let iperf3 = need_iperf3!();
    let shim = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/docker/iperf3-shim.sh");
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_zcnet")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("iperf3.json");
    let (server, port) = iperf3_server(&iperf3);
    let (out, sout) = run_pair(
        Command::new("sh").arg(&shim).env("PATH", &path).args([
            "-P",
            "2",
            "-c",
            "127.0.0.1",
            "-J",
            "-t",
            "1",
            "-l",
            "65536",
            "-p",
            &port.to_string(),
            &format!("--logfile={}", log.display()),
        ]),
        "iperf3 (the image's shim)",
        server,
        "iperf3 -s",
    );
    assert!(
        out.trim().is_empty(),
        "the report goes to the log file: {out:.300}"
    );
    let c = parse(
        &std::fs::read_to_string(&log).unwrap(),
        "the shim's log file",
    );
    let s = parse(&sout, "iperf3 -s");
    check_k8s_netperf(&c, false, "the shim's log file");
    assert_eq!(c["end"]["streams"].as_array().unwrap().len(), 2);
    assert_eq!(bytes(&c, "sum_received"), bytes(&s, "sum_received"));
    assert!(
        c["end"]["zcnet"].is_object(),
        "zcnet's own figures ride along"
    );
}
