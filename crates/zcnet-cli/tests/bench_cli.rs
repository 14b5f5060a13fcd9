//! `zcnet bench` end to end: the built binary, real sockets, real namespaces.
//!
//! What these prove: the `--json` report has the documented fields with finite numbers and
//! equal byte counts at both ends; `--server` and `--client` work as separate processes;
//! the control protocol turns away a peer of another version and bad parameters with a
//! clear message on both sides; a server that miscounts makes the client fail loudly;
//! `--topology netns` leaves no namespace behind — after success, after an error, and
//! after Ctrl-C; the papers suite writes its report. Runs are tiny (a few MiB): nothing
//! here asserts on speed.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use zcnet_bench::protocol::{self, Message, ProtocolError};
use zcnet_bench::report::{Report, SideReport};

mod common;
use common::{finite, require_netns, run_bounded, text, zcnet, Server};

fn check_report_json(stdout: &[u8], want_runs: usize) -> Report {
    let v: serde_json::Value = serde_json::from_slice(stdout).expect("stdout is one JSON value");
    assert_eq!(v["schema"], 1);
    for k in ["kernel", "cpus"] {
        assert!(!v["host"][k].is_null(), "host.{k} missing");
    }
    let runs = v["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), want_runs);
    for r in runs {
        for k in ["tx", "rx", "topology", "size", "streams", "fallbacks"] {
            assert!(!r[k].is_null(), "{k} missing in {r}");
        }
        for k in [
            "bytes_sent",
            "bytes_received",
            "seconds",
            "gbit_per_s",
            "cpu.sender.user",
            "cpu.sender.sys",
            "cpu.receiver.user",
            "cpu.receiver.sys",
            "cpu.system.user",
            "cpu.system.sys",
            "cpu.system.softirq",
            "cpu_s_per_gib",
            "sender_cpu_s_per_gib",
            "receiver_cpu_s_per_gib",
            "gbit_per_core",
            "zc_fraction_tx",
            "zc_fraction_rx",
        ] {
            finite(r, k);
        }
        assert!(finite(r, "bytes_sent") > 0.0);
        assert_eq!(r["bytes_sent"], r["bytes_received"], "bytes differ: {r}");
        assert!(
            finite(r, "cpu.sender.user") + finite(r, "cpu.sender.sys") > 0.0,
            "no sender CPU: {r}"
        );
        assert!(
            finite(r, "cpu.receiver.user") + finite(r, "cpu.receiver.sys") > 0.0,
            "no receiver CPU: {r}"
        );
        let f = finite(r, "zc_fraction_tx");
        assert!((0.0..=1.0).contains(&f));
    }
    serde_json::from_value(v).expect("the report parses as the library's Report type")
}

#[test]
fn a_short_run_prints_the_documented_json_and_a_plot() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("sweep.svg");
    let out = run_bounded(
        zcnet()
            .args([
                "bench",
                "--tx",
                "copy,zerocopy",
                "--rx",
                "copy,mmap",
                "--size",
                "16K,64K",
                "--bytes",
                "8M",
                "--repeat",
                "1",
                "--json",
                "--plot",
            ])
            .arg(&svg),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let report = check_report_json(&out.stdout, 8);
    assert_eq!(report.summary.len(), 8);
    assert!(report
        .verdict
        .as_deref()
        .unwrap_or("")
        .starts_with("verdict:"));
    // The receive path of each run is the one asked for, and each byte was counted.
    for r in &report.runs {
        assert_eq!(r.bytes_sent, 8 << 20);
        assert_eq!(r.topology, "loopback");
    }
    let plot = std::fs::read_to_string(&svg).expect("plot written");
    assert!(
        plot.contains("<svg") && plot.contains("copy→mmap"),
        "{}",
        &plot[..200.min(plot.len())]
    );
}

#[test]
fn auto_against_the_best_pair_measures_one_pair_twice_beside_it() {
    // No profile of this machine's can change the plan.
    let args = [
        "bench",
        "--tx",
        "copy,auto",
        "--rx",
        "copy,auto",
        "--size",
        "64K",
        "--bytes",
        "4M",
        "--repeat",
        "2",
    ];
    let out = run_bounded(
        zcnet()
            .env("ZCNET_PROFILE", "/nonexistent/profile.json")
            .args(args)
            .arg("--json"),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    // Four pairs and the twin, per repeat; every run with equal byte counts at both ends.
    let report = check_report_json(&out.stdout, 10);
    let order: Vec<String> = report
        .runs
        .iter()
        .map(|r| {
            format!(
                "{}/{}{}",
                r.tx,
                r.rx,
                if r.label.is_empty() { "" } else { "²" }
            )
        })
        .collect();
    let one = [
        "copy/copy",
        "copy/auto",
        "auto/copy",
        "auto/auto",
        "copy/copy²",
    ];
    // The second repeat turns the pairs between the twins one place: no pair keeps its
    // place in the round.
    let two = [
        "copy/copy",
        "auto/copy",
        "auto/auto",
        "copy/auto",
        "copy/copy²",
    ];
    assert_eq!(
        order,
        [one, two].concat(),
        "interleaved, turned, the twin last"
    );
    assert!(report
        .runs
        .iter()
        .filter(|r| !r.label.is_empty())
        .all(|r| r.label == zcnet_bench::measure::TWIN && r.bytes_received == 4 << 20));
    // Its own summary row: the twin never joins its pair's.
    let cc = |label: &str| {
        report
            .summary
            .iter()
            .filter(|r| r.tx == "copy" && r.rx == "copy" && r.label == label)
            .count()
    };
    assert_eq!((cc(""), cc(zcnet_bench::measure::TWIN)), (1, 1));
    // The pair table is in the JSON too: auto → auto against copy → copy (the only pair of
    // single paths), with both repeats paired and the twin beside it; two repeats are
    // too few for an interval.
    let gaps = &report.pair_gaps;
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    let g = &gaps[0];
    assert_eq!(
        (g.size, g.best_pair.as_str(), g.auto_runs),
        (64 << 10, "copy/copy", 2)
    );
    assert!(g.paired_excess.is_some_and(f64::is_finite), "{g:?}");
    assert_eq!((g.excess_interval, g.paired_excess_interval), (None, None));
    let t = g.twin.as_ref().expect("the twin beside the gap");
    assert_eq!(t.pair, "copy/copy");

    // The table says how far the twin read from its pair, beside the comparison (with
    // `--pin`: `the_pinned_ends_are_said_in_the_heading`, which needs two CPUs).
    let out = run_bounded(
        zcnet()
            .env("ZCNET_PROFILE", "/nonexistent/profile.json")
            .args(args),
        Duration::from_secs(60),
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert!(stdout.contains("copy/copy"), "{stdout}");
    assert!(
        stdout.contains("the same pair measured twice read up to"),
        "{stdout}"
    );
}

/// With `--pin` the two ends run pinned apart, and the heading says so.
#[cfg_attr(not(zcnet_has_two_cpus), ignore = "needs two CPUs (--pin)")]
#[test]
fn the_pinned_ends_are_said_in_the_heading() {
    let out = run_bounded(
        zcnet()
            .env("ZCNET_PROFILE", "/nonexistent/profile.json")
            .args([
                "bench", "--tx", "copy", "--rx", "copy", "--size", "64K", "--bytes", "4M", "--pin",
            ]),
        Duration::from_secs(60),
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert!(stdout.contains("receivers pinned to CPU"), "{stdout}");
}

/// `--read-size` (netperf's `-M`) bounds every receive call: 8 MiB read 4 KiB at a time is
/// at least 2048 timed `recv` calls, every byte still counted at both ends, and the size is
/// in the report. Zero and UDP runs are refused before anything runs.
#[test]
fn the_read_size_bounds_every_receive_call() {
    let out = run_bounded(
        zcnet().args([
            "bench",
            "--tx",
            "copy",
            "--rx",
            "copy",
            "--size",
            "64K",
            "--read-size",
            "4K",
            "--bytes",
            "8M",
            "--repeat",
            "1",
            "--json",
        ]),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let report = check_report_json(&out.stdout, 1);
    let r = &report.runs[0];
    assert_eq!(r.read_size, Some(4096));
    assert_eq!(r.bytes_received, 8 << 20);
    let calls = r.latency.recv.as_ref().expect("receive calls timed").count;
    assert!(
        calls >= (8 << 20) / 4096,
        "{calls} receive calls for 8 MiB at 4 KiB"
    );
    for (args, want) in [
        (
            &["--read-size", "0"][..],
            "invalid value '0' for '--read-size",
        ),
        (&["--proto", "udp", "--read-size", "4K"][..], "TCP streams"),
    ] {
        let out = run_bounded(
            zcnet()
                .args(["bench", "--bytes", "1M", "--repeat", "1"])
                .args(args),
            Duration::from_secs(10),
        );
        assert!(!out.status.success(), "{args:?} ran");
        assert!(
            text(&out.stderr).contains(want),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn request_response_counts_both_directions() {
    let out = run_bounded(
        zcnet().args([
            "bench", "--rr", "--tx", "copy", "--rx", "copy", "--size", "100,8K", "--bytes", "200K",
            "--repeat", "1", "--json",
        ]),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let report = check_report_json(&out.stdout, 2);
    for r in &report.runs {
        let rtt = r.latency.rtt.expect("rr runs carry round-trip latency");
        assert_eq!(rtt.count, 200 * 1024 / r.size, "one round trip per request");
        assert!(rtt.p50_us > 0.0 && rtt.p99_us >= rtt.p50_us);
        assert_eq!(r.sender_stats.tx_bytes_copy, r.bytes_sent);
    }
}

#[test]
fn server_and_client_run_as_separate_processes() {
    let server = Server::start(&["--once"]);
    let out = run_bounded(
        zcnet().args([
            "bench",
            "--client",
            &server.addr,
            "--tx",
            "zerocopy",
            "--rx",
            "mmap",
            "--size",
            "64K",
            "--bytes",
            "8M",
            "--repeat",
            "1",
            "--streams",
            "2",
            "--json",
        ]),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let report = check_report_json(&out.stdout, 1);
    assert_eq!(report.runs[0].streams, 2);
    assert!(
        report.runs[0].cpu.server_system.is_some(),
        "the server reported its CPU"
    );
    let (ok, err) = server.finish();
    assert!(ok, "server stderr: {err}");
    assert!(
        err.contains("zerocopy→mmap"),
        "server logged the run: {err}"
    );
}

#[test]
fn a_peer_of_another_version_is_told_and_says_so() {
    // A client from the future reaches a real server ...
    let server = Server::start(&["--once"]);
    let mut c = TcpStream::connect(&server.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let params = protocol::Params {
        mode: zcnet_bench::report::Mode::Stream,
        tx: "copy".into(),
        rx: "copy".into(),
        size: 4096,
        streams: 1,
        ring: 8,
        touch: false,
        limit: protocol::Limit::Bytes(4096),
        read: None,
    };
    c.write_all(&protocol::encode_with_version(
        &Message::Hello { params },
        99,
    ))
    .unwrap();
    match protocol::read_message(&mut c) {
        Ok(Message::Reject { reason }) => {
            assert!(
                reason.contains("protocol version mismatch") && reason.contains("99"),
                "{reason}"
            )
        }
        other => panic!("expected a reject, got {other:?}"),
    }
    let (ok, err) = server.finish();
    assert!(!ok, "a rejected --once run is a failure");
    assert!(
        err.contains("protocol version mismatch"),
        "server stderr: {err}"
    );

    // ... and a client of this version meets a server from the future.
    let fake = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = fake.local_addr().unwrap().to_string();
    let t = std::thread::spawn(move || {
        let (mut s, _) = fake.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = protocol::read_frame(&mut s);
        let reject = Message::Reject {
            reason: "this server speaks protocol 99 only".into(),
        };
        s.write_all(&protocol::encode_with_version(&reject, 99))
            .unwrap();
    });
    let out = run_bounded(
        zcnet().args([
            "bench", "--client", &addr, "--tx", "copy", "--rx", "copy", "--size", "4K", "--bytes",
            "1M", "--repeat", "1",
        ]),
        Duration::from_secs(30),
    );
    t.join().unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("protocol version mismatch"), "{err}");
    assert!(
        err.contains("protocol 99 only"),
        "the server's reason is shown: {err}"
    );
}

#[test]
fn bad_parameters_are_rejected_on_both_sides() {
    let server = Server::start(&["--once"]);
    let out = run_bounded(
        zcnet().args([
            "bench",
            "--client",
            &server.addr,
            "--tx",
            "copy",
            "--rx",
            "carrier-pigeon",
            "--size",
            "4K",
            "--bytes",
            "1M",
            "--repeat",
            "1",
        ]),
        Duration::from_secs(30),
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("rejected the run") && err.contains("unknown receive path \"carrier-pigeon\""),
        "{err}"
    );
    let (ok, serr) = server.finish();
    assert!(!ok);
    assert!(
        serr.contains("unknown receive path \"carrier-pigeon\""),
        "{serr}"
    );
    // Bad numbers never leave the client.
    let out = run_bounded(
        zcnet().args(["bench", "--size", "4M..4K", "--repeat", "1"]),
        Duration::from_secs(10),
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("empty sweep"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_server_that_miscounts_fails_the_run_loudly() {
    let fake = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = fake.local_addr().unwrap().to_string();
    let t = std::thread::spawn(move || -> Result<(), ProtocolError> {
        let (mut c, _) = fake.accept()?;
        c.set_read_timeout(Some(Duration::from_secs(20)))?;
        let Message::Hello { params } = protocol::read_message(&mut c)? else {
            panic!("hello expected")
        };
        let data = TcpListener::bind("127.0.0.1:0")?;
        let port = data.local_addr()?.port();
        protocol::write_message(&mut c, &Message::Accept { data_port: port })?;
        let mut got = 0u64;
        for _ in 0..params.streams {
            let (mut d, _) = data.accept()?;
            let mut buf = vec![0u8; 1 << 16];
            loop {
                match d.read(&mut buf)? {
                    0 => break,
                    n => got += n as u64,
                }
            }
        }
        let _ = protocol::read_message(&mut c)?;
        let report = SideReport {
            bytes_received: got - 1,
            seconds: 0.1,
            ..Default::default()
        };
        protocol::write_message(&mut c, &Message::Result { report })
    });
    let out = run_bounded(
        zcnet().args([
            "bench", "--client", &addr, "--tx", "copy", "--rx", "copy", "--size", "4K", "--bytes",
            "1M", "--repeat", "1",
        ]),
        Duration::from_secs(30),
    );
    t.join().unwrap().unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("byte counts disagree") && err.contains("1048576") && err.contains("1048575"),
        "{err}"
    );
}

fn namespaces_of(pid: u32) -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let prefix = format!("zc-{pid}-");
    text(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

/// Runs `zcnet bench ARGS…` to its end and returns its pid with its output: the pid is in
/// the names of the namespaces it makes, which must be gone once it has exited.
fn bench_with_pid(args: &[&str]) -> (u32, Output) {
    let child = zcnet()
        .arg("bench")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    (pid, child.wait_with_output().unwrap())
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn netns_topology_leaves_no_namespace_behind() {
    require_netns();
    // After a successful run.
    let (pid, out) = bench_with_pid(&[
        "--topology",
        "netns",
        "--mtu",
        "9000",
        "--tx",
        "copy",
        "--rx",
        "mmap",
        "--size",
        "64K",
        "--bytes",
        "8M",
        "--repeat",
        "1",
        "--json",
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let report = check_report_json(&out.stdout, 1);
    assert_eq!(report.runs[0].topology, "netns");
    assert_eq!(report.runs[0].mtu, Some(9000));
    assert_eq!(namespaces_of(pid), Vec::<String>::new());

    // After an error while building them (veth refuses the MTU).
    let (pid, out) = bench_with_pid(&["--topology", "netns", "--mtu", "70000", "--repeat", "1"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("70000") || text(&out.stderr).contains("mtu"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(namespaces_of(pid), Vec::<String>::new());
    // After an error once they exist: the sink refuses a size UDP cannot carry only after
    // it has built the namespaces (the check needs the link's MTU).
    let (pid, out) = bench_with_pid(&["--topology", "sink", "--size", "1M", "--repeat", "1"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("UDP payload limit"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(namespaces_of(pid), Vec::<String>::new());
}

/// A 30-second copy → copy bench over a namespace pair, for the Ctrl-C tests to interrupt;
/// `piped`: its output is kept for the test to read, else thrown away.
fn spawn_netns_bench(piped: bool) -> std::process::Child {
    let out = || if piped { Stdio::piped() } else { Stdio::null() };
    zcnet()
        .args([
            "bench",
            "--topology",
            "netns",
            "--tx",
            "copy",
            "--rx",
            "copy",
        ])
        .args(["--size", "64K", "--time", "30", "--repeat", "1"])
        .stdout(out())
        .stderr(out())
        .spawn()
        .unwrap()
}

/// Sends SIGINT to `child` and waits (bounded: a hang guard, not a speed check) for it to exit.
fn interrupt(child: &mut std::process::Child) -> std::process::ExitStatus {
    // By the syscall, not the `kill` program (a machine with only Rust may have no procps).
    let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("a child's pid");
    rustix::process::kill_process(pid, rustix::process::Signal::INT).expect("kill -INT");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() >= deadline {
            panic!("hang guard: bench did not exit after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Ctrl-C at the first sign of a namespace: the availability probe's pair is being made or
/// dropped, or the run's pair is being made, by `ip` child processes still running. Nothing
/// may be left behind whichever step the signal lands in (a handler that only scanned
/// `/var/run/netns` missed a namespace whose `ip netns add` was still running).
#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn ctrl_c_while_namespaces_are_being_made_leaves_none() {
    require_netns();
    for round in 0..6u64 {
        let mut child = spawn_netns_bench(false);
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(20);
        while namespaces_of(pid).is_empty() {
            if Instant::now() >= deadline {
                panic!("hang guard: no namespace appeared");
            }
            assert!(child.try_wait().unwrap().is_none(), "bench exited early");
            std::thread::sleep(Duration::from_millis(1));
        }
        // Vary where the signal lands across the rounds: 0–25 ms after the first namespace.
        std::thread::sleep(Duration::from_millis(round * 5));
        let status = interrupt(&mut child);
        assert_eq!(status.code(), Some(130), "round {round}");
        // An `ip` started before the signal has ended by now if the handler waited for it.
        assert_eq!(namespaces_of(pid), Vec::<String>::new(), "round {round}");
    }
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn ctrl_c_removes_the_namespaces() {
    require_netns();
    let mut child = spawn_netns_bench(true);
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(20);
    while namespaces_of(pid).len() < 2 {
        if Instant::now() >= deadline {
            panic!("the namespaces never appeared"); // a hang guard, not a speed check
        }
        assert!(child.try_wait().unwrap().is_none(), "bench exited early");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Let the transfer start, then interrupt it.
    std::thread::sleep(Duration::from_millis(300));
    let status = interrupt(&mut child);
    assert_eq!(status.code(), Some(130));
    let out = child.wait_with_output().unwrap();
    assert!(
        text(&out.stderr).contains("interrupted"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(namespaces_of(pid), Vec::<String>::new());
}

#[test]
fn the_quick_papers_suite_writes_its_report() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_bounded(
        zcnet()
            .args(["bench", "--suite", "papers", "--quick", "--out"])
            .arg(dir.path()),
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let md = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    for title in [
        "Size sweep and crossover",
        "Data touching",
        "Ring depth",
        "Loaded system",
        "Loan vs copy",
        "File transfer (Solaris, FTP test)",
        "ping-pong",
    ] {
        assert!(md.contains(title), "{title} missing from report.md");
    }
    assert_eq!(md.matches("**The paper:**").count(), 7);
    assert!(md.contains("| sendfile | splice |"), "FTP table rows");
    for svg in ["crossover.svg", "ring.svg", "streams.svg", "rr.svg"] {
        let s = std::fs::read_to_string(dir.path().join(svg)).unwrap();
        assert!(s.contains("<svg"), "{svg}");
        assert!(md.contains(&format!("]({svg})")), "{svg} not linked");
    }
    let json = std::fs::read(dir.path().join("report.json")).unwrap();
    let r: Report = serde_json::from_slice(&json).unwrap();
    assert!(r.runs.iter().all(|r| r.bytes_sent == r.bytes_received));
}

/// The FTP experiment alone (`--only ftp`), tiny: a `--tx file` sender against every
/// receive path, without and with the receiver touching, each run moving every byte it
/// sent (all of it by sendfile; into the file by splice where the receiver is `file`),
/// and the whole-file table checked byte for byte by the suite itself.
#[test]
fn the_ftp_experiment_sends_a_file_to_every_receive_path() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_bounded(
        zcnet()
            .args([
                "bench", "--suite", "papers", "--quick", "--only", "ftp", "--out",
            ])
            .arg(dir.path()),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let md = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    assert_eq!(md.matches("**The paper:**").count(), 1, "only ftp ran");
    assert!(md.contains("File transfer (Solaris, FTP test)"));
    let json = std::fs::read(dir.path().join("report.json")).unwrap();
    let r: Report = serde_json::from_slice(&json).unwrap();
    let mut seen = Vec::new();
    for run in &r.runs {
        assert_eq!(run.tx, "file", "{}", run.label);
        assert!(run.bytes_sent > 0);
        assert_eq!(run.bytes_sent, run.bytes_received, "{}→{}", run.tx, run.rx);
        assert_eq!(
            run.sender_stats.tx_bytes_file, run.bytes_sent,
            "all by sendfile"
        );
        if run.rx == "file" {
            assert_eq!(run.receiver_stats.rx_bytes_file, run.bytes_received);
        }
        for x in [run.sender_cpu_s_per_gib, run.receiver_cpu_s_per_gib] {
            assert!(x.is_finite() && x > 0.0, "{}→{}: {x}", run.tx, run.rx);
        }
        let row = format!(
            "| file→{} | {} |",
            run.rx,
            if run.touch { "yes" } else { "no" }
        );
        assert!(md.contains(&row), "{row} missing from report.md");
        seen.push((run.rx.clone(), run.touch));
    }
    for rx in ["copy", "file"] {
        for touch in [false, true] {
            assert!(
                seen.contains(&(rx.to_string(), touch)),
                "{rx} touch={touch}"
            );
        }
    }
    assert_eq!(seen.len() % 2, 0, "each receiver with and without touching");
    assert!(md.contains("| sendfile | splice |"), "the whole-file table");
    // An experiment that does not exist is refused by name.
    let bad = run_bounded(
        zcnet()
            .args(["bench", "--suite", "papers", "--only", "nope", "--out"])
            .arg(dir.path()),
        Duration::from_secs(30),
    );
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("--only nope"),
        "{}",
        text(&bad.stderr)
    );
}
