//! `zcnet bench --proto udp` end to end: the built binary, `zcnet_msg` over real sockets,
//! real namespaces.
//!
//! What these prove: UDP message runs over loopback and two namespaces (stream and `--rr`,
//! 1 B to 1 MiB, copy and zero-copy, GRO on and off) report `messages_sent`,
//! `messages_received`, `messages_lost` with `received + lost == sent` and byte counts that
//! follow from them; the sink runs the message layer's sender; a client that sends wrong bytes
//! makes the server fail the run, while messages it never gets (a gap, a partial message, the
//! tail) are counted lost by reason and the run stands; a full window with no
//! acknowledgement sends on rather than hang, and an `rr` reply that comes after its trip
//! was given up is recognised and counted, not timed; a server that answers with wrong bytes (an echo of the
//! request) makes the client fail it, and a server that miscounts messages makes the client
//! fail with the numbers; paths of the other protocol are refused with a clear message.
//! Runs are tiny: nothing here asserts on speed.

mod common;

use common::{finite, require_netns, run_bounded, text, zcnet, Server};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::Output;
use std::time::{Duration, Instant};
use zcnet_bench::protocol::{
    self, Limit, Message, MessagePattern, Params, ProtocolError, UdpParams, REPLY_KEY,
};
use zcnet_bench::report::{Mode, SideReport};
use zcnet_msg::wire::{Header, Layout};
use zcnet_msg::{MsgConfig, MsgEvent, MsgReceiver, MsgSender, MsgTx};

fn bench(args: &[&str]) -> Output {
    run_bounded(zcnet().arg("bench").args(args), Duration::from_secs(240))
}

fn count(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("{k} is not a count in {v}"))
}

/// Checks every run of a `--json` report of a UDP message run and returns them.
fn udp_runs(out: &Output, want_runs: usize) -> Vec<serde_json::Value> {
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("stdout is one JSON value");
    let runs = v["runs"].as_array().expect("runs").clone();
    assert_eq!(runs.len(), want_runs, "{v}");
    for r in &runs {
        assert_eq!(r["transport"], "udp", "{r}");
        for k in [
            "seconds",
            "gbit_per_s",
            "cpu.sender.user",
            "cpu.sender.sys",
            "cpu.receiver.user",
            "cpu.receiver.sys",
            "cpu_s_per_gib",
            "sender_cpu_s_per_gib",
            "receiver_cpu_s_per_gib",
            "gbit_per_core",
            "zc_fraction_tx",
            "zc_fraction_rx",
        ] {
            finite(r, k);
        }
        let size = count(r, "size");
        let (sent, received, lost) = (
            count(r, "messages_sent"),
            count(r, "messages_received"),
            count(r, "messages_lost"),
        );
        assert!(sent > 0, "{r}");
        assert_eq!(received + lost, sent, "{r}");
        assert_eq!(count(r, "bytes_sent"), sent * size, "{r}");
        assert_eq!(count(r, "bytes_received"), received * size, "{r}");
        let zc = finite(r, "zc_fraction_tx");
        assert!((0.0..=1.0).contains(&zc), "{r}");
    }
    runs
}

/// Stream runs: every combination reports its messages; the receiver read datagrams and
/// verified messages; zero-copy loans went out as loans.
fn check_stream(runs: &[serde_json::Value]) {
    for r in runs {
        assert_eq!(r["mode"], "stream");
        let rx = &r["receiver_stats"]["msg"];
        assert!(count(rx, "datagrams_received") > 0, "{r}");
        assert!(count(r, "messages_received") > 0, "{r}");
        // What zcnet_msg itself counted agrees with the bench's ledger.
        assert_eq!(
            count(rx, "messages_received"),
            count(r, "messages_received"),
            "{r}"
        );
        let tx = &r["sender_stats"]["msg"];
        assert_eq!(count(tx, "messages_sent"), count(r, "messages_sent"), "{r}");
        if r["tx"] == "zerocopy" || r["tx"] == "uring" {
            assert_eq!(
                count(tx, "zerocopy_messages"),
                count(r, "messages_sent"),
                "{r}"
            );
        } else {
            assert_eq!(
                count(tx, "copied_messages"),
                count(r, "messages_sent"),
                "{r}"
            );
        }
        if r["rx"] == "gro" {
            assert_eq!(count(rx, "gro_refused"), 0, "{r}");
        }
    }
}

/// rr runs: round trips timed, both directions accounted for.
fn check_rr(runs: &[serde_json::Value]) {
    for r in runs {
        assert_eq!(r["mode"], "rr");
        let (sent, received, lost) = (
            count(r, "replies_sent"),
            count(r, "replies_received"),
            count(r, "replies_lost"),
        );
        assert_eq!(received + lost, sent, "{r}");
        assert_eq!(
            sent,
            count(r, "messages_received"),
            "one reply per request: {r}"
        );
        assert!(count(&r["latency"]["rtt"], "count") > 0, "{r}");
        let p50 = finite(r, "latency.rtt.p50_us");
        let p99 = finite(r, "latency.rtt.p99_us");
        assert!(p50 > 0.0 && p99 >= p50, "{r}");
    }
}

#[test]
fn udp_stream_over_loopback_counts_every_message() {
    let out = bench(&[
        "--proto",
        "udp",
        "--tx",
        "copy,zerocopy",
        "--rx",
        "copy,gro",
        "--size",
        "1472,64K",
        "--bytes",
        "2M",
        "--repeat",
        "1",
        "--json",
    ]);
    let runs = udp_runs(&out, 8);
    check_stream(&runs);
    // TCP-only fields are still there, the messages beside them.
    assert!(runs[0]["latency"]["send"]["count"].as_u64().unwrap() > 0);
}

#[test]
fn udp_one_byte_messages_stream() {
    let out = bench(&[
        "--proto", "udp", "--tx", "copy", "--rx", "gro", "--size", "1", "--bytes", "3000",
        "--repeat", "1", "--json",
    ]);
    let runs = udp_runs(&out, 1);
    check_stream(&runs);
    assert_eq!(count(&runs[0], "messages_sent"), 3000);
}

#[test]
fn udp_rr_over_loopback_from_one_byte_to_one_mib() {
    let out = bench(&[
        "--proto",
        "udp",
        "--rr",
        "--tx",
        "copy,zerocopy",
        "--rx",
        "gro",
        "--size",
        "1,1M",
        "--time",
        "0.2",
        "--repeat",
        "1",
        "--json",
    ]);
    let runs = udp_runs(&out, 4);
    check_rr(&runs);
    let table = bench(&[
        "--proto", "udp", "--rr", "--tx", "copy", "--rx", "copy", "--size", "1472", "--bytes",
        "20K", "--repeat", "1",
    ]);
    assert!(table.status.success(), "{}", text(&table.stderr));
    let t = text(&table.stdout);
    assert!(t.contains("rtt p50 µs") && t.contains("loss%"), "{t}");
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn udp_over_two_namespaces() {
    require_netns();
    let out = bench(&[
        "--topology",
        "netns",
        "--proto",
        "udp",
        "--tx",
        "copy,zerocopy",
        "--rx",
        "copy,gro",
        "--size",
        "1473,1M",
        "--bytes",
        "3M",
        "--repeat",
        "1",
        "--json",
    ]);
    let runs = udp_runs(&out, 8);
    check_stream(&runs);
    for r in &runs {
        assert_eq!(r["topology"], "netns");
        assert_eq!(r["mtu"], 1500);
        // 1473 bytes do not fit one 1472-byte datagram: every message is two or more.
        assert!(
            count(&r["sender_stats"]["msg"], "datagrams_sent") >= 2 * count(r, "messages_sent"),
            "{r}"
        );
    }
    let out = bench(&[
        "--topology",
        "netns",
        "--proto",
        "udp",
        "--rr",
        "--tx",
        "zerocopy",
        "--rx",
        "gro",
        "--size",
        "1,1M",
        "--time",
        "0.2",
        "--repeat",
        "1",
        "--json",
    ]);
    check_rr(&udp_runs(&out, 2));
    let table = bench(&[
        "--topology",
        "netns",
        "--proto",
        "udp",
        "--tx",
        "copy",
        "--rx",
        "gro",
        "--size",
        "64K",
        "--bytes",
        "1M",
        "--repeat",
        "1",
    ]);
    assert!(table.status.success(), "{}", text(&table.stderr));
    let t = text(&table.stdout);
    assert!(t.contains("msgs/s") && t.contains("loss%"), "{t}");
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn lm_over_two_namespaces_streams_and_ping_pongs_in_place() {
    require_netns();
    // One sweep: lm pairs only with lm, the others with each other.
    let out = bench(&[
        "--topology",
        "netns",
        "--proto",
        "udp",
        "--tx",
        "plain,lm",
        "--rx",
        "copy,lm",
        "--size",
        "1473,1M",
        "--bytes",
        "3M",
        "--repeat",
        "1",
        "--json",
    ]);
    let runs = udp_runs(&out, 4);
    for r in &runs {
        assert_eq!(
            r["tx"] == "lm",
            r["rx"] == "lm",
            "lm paired with another path: {r}"
        );
        if r["tx"] == "plain" {
            // The baseline: no GSO, one datagram per sendmsg.
            let tx = &r["sender_stats"]["msg"];
            assert_eq!(count(tx, "gso_calls"), 0, "{r}");
            assert_eq!(count(tx, "send_calls"), count(tx, "datagrams_sent"), "{r}");
            continue;
        }
        assert_eq!(count(r, "messages_lost"), 0, "{r}");
        let (tx, rx) = (&r["sender_stats"]["msg"], &r["receiver_stats"]["msg"]);
        // Both ends on AF_XDP: sent through the TX ring, assembled in the UMEM.
        assert_eq!(count(tx, "sent_xsk"), count(r, "messages_sent"), "{r}");
        assert_eq!(
            count(rx, "received_in_place"),
            count(r, "messages_received"),
            "{r}"
        );
        assert_eq!(count(rx, "xsk_rx_in_place"), 1, "{r}");
        // Nothing out of place on the control port (late ENDMEs are expected, not odd).
        assert_eq!(count(rx, "control_ignored"), 0, "{r}");
        // veth binds copy mode: every byte is a counted fallback, on both ends.
        for side in ["sender", "receiver"] {
            assert_eq!(
                count(&r["fallbacks"][side]["xsk_copy_mode"], "bytes"),
                count(r, "bytes_sent"),
                "{side}: {r}"
            );
        }
        // 1473 bytes are two fragments of 1448.
        if count(r, "size") == 1473 {
            assert_eq!(
                count(tx, "fragments_sent"),
                2 * count(r, "messages_sent"),
                "{r}"
            );
        }
    }
    let out = bench(&[
        "--topology",
        "netns",
        "--proto",
        "udp",
        "--rr",
        "--tx",
        "lm",
        "--rx",
        "lm",
        "--size",
        "1,64K",
        "--time",
        "0.2",
        "--repeat",
        "1",
        "--json",
    ]);
    let runs = udp_runs(&out, 2);
    check_rr(&runs);
    for r in &runs {
        // Both ends sent and received through one LmSocket each.
        for side in ["sender_stats", "receiver_stats"] {
            let m = &r[side]["msg"];
            assert!(
                count(m, "sent_xsk") > 0 && count(m, "received_in_place") > 0,
                "{r}"
            );
        }
    }
}

#[test]
fn lm_on_loopback_takes_the_kernel_path_and_says_so() {
    // AF_XDP frames sent on lo never reach the host's own stack: both ends fall back, every
    // byte still verified, the fallback counted, the table marks the run.
    let out = bench(&[
        "--proto", "udp", "--tx", "lm", "--rx", "lm", "--size", "64K", "--bytes", "1M", "--repeat",
        "1", "--json",
    ]);
    let runs = udp_runs(&out, 1);
    let r = &runs[0];
    assert_eq!(count(r, "messages_lost"), 0, "{r}");
    for side in ["sender", "receiver"] {
        assert_eq!(
            count(&r["fallbacks"][side]["xsk_unavailable"], "bytes"),
            count(r, "bytes_sent"),
            "{side}: {r}"
        );
    }
    assert_eq!(
        count(&r["receiver_stats"]["msg"], "received_kernel"),
        count(r, "messages_received")
    );
    let table = bench(&[
        "--proto", "udp", "--tx", "lm", "--rx", "lm", "--size", "64K", "--bytes", "1M", "--repeat",
        "1",
    ]);
    assert!(table.status.success(), "{}", text(&table.stderr));
    assert!(
        text(&table.stdout).contains("lm not supported here"),
        "{}",
        text(&table.stdout)
    );
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn udp_into_the_sink_runs_the_message_sender() {
    require_netns();
    let out = bench(&[
        "--topology",
        "sink",
        "--proto",
        "udp",
        "--tx",
        "copy,zerocopy,uring",
        "--size",
        "64K",
        "--bytes",
        "4M",
        "--repeat",
        "1",
        "--json",
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3);
    for r in runs {
        assert_eq!(r["rx"], "none");
        assert_eq!(count(r, "messages_sent"), 64);
        assert_eq!(count(r, "messages_received"), 64);
        let tx = &r["sender_stats"]["msg"];
        // The message layer's GSO batches: 1472-byte datagrams, 44 to a call.
        assert!(count(tx, "gso_calls") > 0, "{r}");
        let zc = finite(r, "zc_fraction_tx");
        if r["tx"] == "zerocopy" || r["tx"] == "uring" {
            // Nothing is delivered locally: the kernel does not copy the loaned pages.
            assert!(zc > 0.0, "{r}");
        } else {
            assert_eq!(zc, 0.0, "{r}");
        }
    }
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces): one case is the sink topology"
)]
#[test]
fn paths_of_the_other_protocol_are_refused() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--proto", "udp", "--tx", "file", "--rx", "gro"],
            "transmit path \"file\" is not a UDP message path",
        ),
        (
            &["--proto", "udp", "--tx", "copy", "--rx", "mmap"],
            "receive path \"mmap\" is not a UDP message path",
        ),
        (
            &["--proto", "tcp", "--tx", "copy", "--rx", "gro"],
            "add --proto udp",
        ),
        (&["--tx", "copy", "--rx", "gro"], "add --proto udp"),
        (
            &[
                "--proto",
                "udp",
                "--tx",
                "copy",
                "--rx",
                "gro",
                "--streams",
                "2",
            ],
            "one sender",
        ),
        (
            &[
                "--proto", "udp", "--tx", "copy", "--rx", "gro", "--size", "32M",
            ],
            "above the limit",
        ),
        (
            &[
                "--proto", "udp", "--tx", "copy", "--rx", "gro", "--size", "0",
            ],
            "",
        ),
        (
            &["--proto", "udp", "--tx", "lm", "--rx", "gro"],
            "pairs only with lm",
        ),
        (
            &["--proto", "udp", "--topology", "sink", "--tx", "lm"],
            "admit Lightweight Messages",
        ),
    ];
    for (args, want) in cases {
        let out = bench(&[args, &["--bytes", "64K", "--repeat", "1"][..]].concat());
        assert!(!out.status.success(), "{args:?} should fail");
        let err = text(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

fn params(mode: Mode, size: u64, messages: u64) -> Params {
    Params {
        mode,
        tx: "copy".into(),
        rx: "gro".into(),
        size,
        streams: 1,
        ring: 2,
        touch: false,
        limit: Limit::Bytes(size * messages),
        read: None,
    }
}

/// A crafted client's hello for `p` to a real server; returns the control connection and
/// the server's data port.
fn hello_udp(server: &Server, p: Params) -> (TcpStream, u16) {
    let mut c = TcpStream::connect(&server.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    protocol::write_message(
        &mut c,
        &Message::HelloUdp {
            params: p,
            udp: UdpParams::default(),
        },
    )
    .unwrap();
    let port = protocol::read_accept(protocol::read_message(&mut c)).unwrap();
    (c, port)
}

/// A crafted client's `Done`: what it says it sent, which may be more than it did.
fn send_done(c: &mut TcpStream, messages_sent: u64, bytes_sent: u64) {
    protocol::write_message(
        c,
        &Message::Done {
            report: SideReport {
                messages_sent,
                bytes_sent,
                ..Default::default()
            },
        },
    )
    .unwrap();
}

/// The server's answer to `Done`, past the acknowledgements it may still be sending.
fn after_acks(c: &mut TcpStream) -> Result<Message, ProtocolError> {
    loop {
        match protocol::read_message(c) {
            Ok(Message::Ack { .. }) => continue,
            other => return other,
        }
    }
}

#[test]
fn a_client_sending_wrong_bytes_fails_the_run_at_the_server() {
    let server = Server::start(&["--once"]);
    let (mut c, port) = hello_udp(&server, params(Mode::Stream, 65536, 1));
    let data: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut tx = MsgSender::connect(data, &MsgConfig::new(MsgTx::Copy)).unwrap();
    // A whole, well-formed message of the right size — with the wrong bytes.
    tx.send_slice(&vec![0u8; 65536]).unwrap();
    send_done(&mut c, 1, 65536);
    let reason = match after_acks(&mut c) {
        Ok(Message::Error { reason }) => reason,
        other => panic!("expected an error, got {other:?}"),
    };
    assert!(
        reason.contains("message 0 from the client is not what was sent")
            && reason.contains("differs at byte"),
        "{reason}"
    );
    let (ok, err) = server.finish();
    assert!(!ok, "a failed --once run is a failure");
    assert!(err.contains("not what was sent"), "server stderr: {err}");
}

/// A fake server on its thread, and its control address.
struct Fake {
    addr: String,
    thread: std::thread::JoinHandle<Result<(), ProtocolError>>,
}

impl Fake {
    /// Runs `zcnet bench --client` against it with `args` (bounded), then joins it: the fake's
    /// own checks and protocol errors fail the test.
    fn client(self, args: &[&str]) -> Output {
        let out = run_bounded(
            zcnet().args(["bench", "--client", &self.addr]).args(args),
            Duration::from_secs(60),
        );
        self.thread.join().unwrap().unwrap();
        out
    }
}

/// A fake server: accepts a UDP message run, then `serve(control, hello, data socket)`.
fn fake_server(
    serve: impl FnOnce(TcpStream, Params, UdpParams, UdpSocket) -> Result<(), ProtocolError>
        + Send
        + 'static,
) -> Fake {
    let fake = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = fake.local_addr().unwrap().to_string();
    let t = std::thread::spawn(move || -> Result<(), ProtocolError> {
        let (mut c, _) = fake.accept()?;
        c.set_read_timeout(Some(Duration::from_secs(20)))?;
        let Message::HelloUdp { params, udp } = protocol::read_message(&mut c)? else {
            panic!("hello_udp expected")
        };
        let data = UdpSocket::bind("127.0.0.1:0")?;
        let port = data.local_addr()?.port();
        protocol::write_message(&mut c, &Message::Accept { data_port: port })?;
        serve(c, params, udp, data)
    });
    Fake { addr, thread: t }
}

/// The client's `Done`, as a fake server reads it.
fn read_done(c: &mut TcpStream) -> Result<SideReport, ProtocolError> {
    match protocol::read_message(c)? {
        Message::Done { report } => Ok(report),
        other => panic!("done expected, got {other:?}"),
    }
}

/// A fake `rr` server's ends: its receiver on the data socket, its sender to the client's
/// reply port.
fn reply_ends(udp: &UdpParams, data: UdpSocket) -> (MsgReceiver, MsgSender) {
    let cfg = MsgConfig::new(MsgTx::Copy);
    let rx = MsgReceiver::from_socket(data, &cfg).unwrap();
    let port = udp.reply_port.expect("an rr hello carries the reply port");
    let tx = MsgSender::connect(format!("127.0.0.1:{port}").parse().unwrap(), &cfg).unwrap();
    (rx, tx)
}

#[test]
fn a_server_that_miscounts_messages_fails_the_client() {
    // It receives nothing, and claims one message fewer than the client sent, none lost.
    let fake = fake_server(|mut c, _params, _udp, _data| {
        let client = read_done(&mut c)?;
        let report = SideReport {
            messages_received: client.messages_sent - 1,
            bytes_received: client.bytes_sent - 65536,
            seconds: 0.1,
            ..Default::default()
        };
        protocol::write_message(&mut c, &Message::Result { report })
    });
    let out = fake.client(&[
        "--proto", "udp", "--tx", "copy", "--rx", "gro", "--size", "64K", "--bytes", "1M",
        "--repeat", "1",
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("disagree")
            && err.contains("sent 16 messages")
            && err.contains("received 15")
            && err.contains("lost 0"),
        "{err}"
    );
}

#[test]
fn a_server_that_echoes_the_request_fails_the_client() {
    // NetPIPE's lazy answer: the request's bytes sent back. A reply must be the reply.
    let fake = fake_server(|mut c, params, udp, data| {
        let (mut rx, mut tx) = reply_ends(&udp, data);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if Instant::now() >= deadline {
                panic!("no request came"); // a hang guard, not a speed check
            }
            if let Some(MsgEvent::Message(m)) = rx.recv(Duration::from_millis(100)).unwrap() {
                assert_eq!(m.len() as u64, params.size);
                tx.send_slice(&m).unwrap();
                break;
            }
        }
        // The client gives up and says why.
        match protocol::read_message(&mut c)? {
            Message::Error { .. } => Ok(()),
            other => panic!("error expected, got {other:?}"),
        }
    });
    let out = fake.client(&[
        "--proto", "udp", "--rr", "--tx", "copy", "--rx", "gro", "--size", "1472", "--bytes",
        "14720", "--repeat", "1",
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("the reply to request 0 is not what the server must send")
            && err.contains("differs at byte"),
        "{err}"
    );
}

#[test]
fn lost_messages_are_counted_by_reason_and_the_tail_inferred() {
    // A crafted client writes the wire format itself, with the run's pattern, and leaves
    // out what a network would lose: message 2 whole (a gap, revealed by later ids), the
    // last two fragments of message 4 (a timeout), and message 6 (at the end: only the
    // client's count reveals it).
    const SIZE: usize = 4000;
    let server = Server::start(&["--once"]);
    let (mut c, port) = hello_udp(&server, params(Mode::Stream, SIZE as u64, 7));
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.connect(format!("127.0.0.1:{port}")).unwrap();
    let pattern = MessagePattern::new(SIZE);
    let layout = Layout::new(1472).unwrap();
    assert_eq!(layout.fragments(SIZE), 3);
    let send = |id: u64, frags: std::ops::Range<usize>| {
        let body = pattern.expected(id);
        for i in frags {
            let r = layout.fragment(SIZE, i);
            let h = Header {
                session: 0xBEEF,
                id,
                total: SIZE as u32,
                offset: r.start as u32,
                len: r.len() as u16,
            };
            let mut d = h.encode().to_vec();
            d.extend_from_slice(&body[r]);
            sock.send(&d).unwrap();
        }
    };
    for id in [0, 1, 3, 5] {
        send(id, 0..3);
    }
    send(4, 0..1);
    send_done(&mut c, 7, 7 * SIZE as u64);
    let report = match after_acks(&mut c) {
        Ok(Message::Result { report }) => report,
        other => panic!("expected a result, got {other:?}"),
    };
    assert_eq!(report.messages_received, 4, "{report:?}");
    assert_eq!(report.bytes_received, 4 * SIZE as u64);
    assert_eq!(report.messages_lost, 3, "{report:?}");
    let m = &report.stats.msg;
    assert_eq!(
        (m["lost_gap"], m["lost_timeout"], m["lost_tail"]),
        (1, 1, 1),
        "{m:?}"
    );
    let (ok, err) = server.finish();
    assert!(ok, "losses are counted, not a failure: {err}");
}

#[test]
fn a_full_window_without_acks_sends_on_and_counts_the_stalls() {
    // A server that reads nothing and acknowledges nothing: the client's window (4 messages
    // of 1 MiB) fills, waits out the stall time, and sends one more each time — it never
    // hangs. The server then owns up to having received none of them.
    let fake = fake_server(|mut c, _params, _udp, _data| {
        let client = read_done(&mut c)?;
        let report = SideReport {
            messages_lost: client.messages_sent,
            seconds: 0.1,
            ..Default::default()
        };
        protocol::write_message(&mut c, &Message::Result { report })
    });
    let out = fake.client(&[
        "--proto", "udp", "--tx", "copy", "--rx", "gro", "--size", "1M", "--bytes", "6M",
        "--repeat", "1", "--json",
    ]);
    let runs = udp_runs(&out, 1);
    let r = &runs[0];
    assert_eq!(
        (count(r, "messages_sent"), count(r, "messages_lost")),
        (6, 6)
    );
    assert_eq!(count(&r["sender_stats"]["msg"], "window_stalls"), 2, "{r}");
    assert_eq!(finite(r, "gbit_per_s"), 0.0);
}

#[test]
fn an_rr_reply_that_comes_too_late_is_counted_not_timed() {
    // The server answers request 0 only after request 1 arrived: the client has given up on
    // trip 0 by then (counted lost), recognises the late reply by its bytes, and times
    // trip 1 alone.
    const SIZE: u64 = 1472;
    let fake = fake_server(|mut c, params, udp, data| {
        let (mut rx, mut tx) = reply_ends(&udp, data);
        let pattern = MessagePattern::new(params.size as usize);
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut got = 0;
        while got < 2 {
            if Instant::now() >= deadline {
                panic!("requests did not come"); // a hang guard, not a speed check
            }
            if let Some(MsgEvent::Message(m)) = rx.recv(Duration::from_millis(100)).unwrap() {
                assert!(pattern.matches(&m, m.id), "request {} verified", m.id);
                got += 1;
            }
        }
        tx.send_slice(&pattern.expected(REPLY_KEY)).unwrap();
        tx.send_slice(&pattern.expected(1 | REPLY_KEY)).unwrap();
        let client = read_done(&mut c)?;
        assert_eq!(client.messages_sent, 2);
        let report = SideReport {
            messages_received: 2,
            bytes_received: 2 * SIZE,
            messages_sent: 2,
            bytes_sent: 2 * SIZE,
            seconds: 0.1,
            ..Default::default()
        };
        protocol::write_message(&mut c, &Message::Result { report })
    });
    let out = fake.client(&[
        "--proto", "udp", "--rr", "--tx", "copy", "--rx", "gro", "--size", "1472", "--bytes",
        "2944", "--repeat", "1", "--json",
    ]);
    let runs = udp_runs(&out, 1);
    let r = &runs[0];
    assert_eq!(
        (
            count(r, "replies_sent"),
            count(r, "replies_received"),
            count(r, "replies_lost")
        ),
        (2, 2, 0),
        "{r}"
    );
    let m = &r["sender_stats"]["msg"];
    assert_eq!(
        (count(m, "trips_lost"), count(m, "late_replies")),
        (1, 1),
        "{r}"
    );
    assert_eq!(count(&r["latency"]["rtt"], "count"), 1, "{r}");
}
