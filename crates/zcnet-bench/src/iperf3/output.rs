//! iperf3's `-J` document and `--json-stream` events, built from what one side measured
//! (`iperf_print_intermediate` / `iperf_print_results` / `iperf_json_finish` in iperf3's
//! `iperf_api.c`; `JSONStream_Output` for the stream form, one `{"event","data"}` object a
//! line). Field names, nesting and units are iperf3's, so tools that parse `iperf3 -J`
//! (k8s-netperf reads `end.sum_sent.retransmits` and `end.sum_received.bits_per_second`;
//! pScheduler and PerfKitBenchmarker read `end.sum_sent`, `end.sum_received`,
//! `end.cpu_utilization_percent`) read ours unchanged. zcnet's own figures go under
//! `start.zcnet` and `end.zcnet`, keys iperf3 does not use.
//!
//! Sums: `sum_sent` / `sum_received` (and each interval's `sum`) cover the streams that
//! carry the test's main direction — client to server, or server to client with `-R`;
//! with `--bidir` the server-to-client streams are summed apart as `*_bidir_reverse`, as
//! iperf3 does.

use super::params::{Direction, TestParams};
use serde_json::{json, Map, Value};

/// One connection as `start.connected` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct Connected {
    /// The descriptor number (iperf3 shows it; streams are named by it in its text output).
    pub socket: i32,
    /// Local address.
    pub local_host: String,
    /// Local port.
    pub local_port: u16,
    /// Peer address.
    pub remote_host: String,
    /// Peer port.
    pub remote_port: u16,
}

/// Which end wrote the document.
#[derive(Debug, Clone, PartialEq)]
pub enum Role {
    /// `-c HOST`: `start.connecting_to`.
    Client {
        /// The host as given.
        host: String,
        /// The server's port.
        port: u16,
    },
    /// `-s`: `start.accepted_connection`.
    Server {
        /// The client's address.
        host: String,
        /// The client's control port.
        port: u16,
    },
}

/// What `start` says.
#[derive(Debug, Clone, PartialEq)]
pub struct Start {
    /// Client or server, and the peer.
    pub role: Role,
    /// `start.version`: ours names zcnet and the protocol it speaks.
    pub version: String,
    /// `start.system_info` (`uname -a`-like).
    pub system_info: String,
    /// `start.timestamp.time` (RFC 2822-like, UTC) and `.timesecs`.
    pub time: String,
    /// Seconds since the epoch.
    pub timesecs: u64,
    /// Data connections.
    pub connected: Vec<Connected>,
    /// The test's cookie.
    pub cookie: String,
    /// MSS of the control connection (`tcp_mss_default`).
    pub tcp_mss_default: u32,
    /// `SO_SNDBUF` and `SO_RCVBUF` of a data connection.
    pub sndbuf_actual: u64,
    /// See `sndbuf_actual`.
    pub rcvbuf_actual: u64,
    /// The test.
    pub params: TestParams,
    /// zcnet's additions (paths in use, …).
    pub zcnet: Value,
}

/// One stream over one interval (or the whole test).
#[derive(Debug, Clone, PartialEq)]
pub struct StreamSpan {
    /// The data connection's descriptor.
    pub socket: i32,
    /// Whether this side sends on it.
    pub sender: bool,
    /// Whether it carries the test's main direction (see the module's doc).
    pub main: bool,
    /// Seconds since the test started.
    pub start: f64,
    /// Seconds since the test started.
    pub end: f64,
    /// Bytes moved in the span.
    pub bytes: u64,
    /// Retransmits in the span, on a stream this side sends on.
    pub retransmits: Option<i64>,
    /// `tcpi_snd_cwnd × tcpi_snd_mss`, `tcpi_rtt`, `tcpi_rttvar`, `tcpi_pmtu`, on a
    /// sending stream.
    pub tcp: Option<TcpFigures>,
    /// A UDP stream's datagrams in the span (`None` for TCP).
    pub udp: Option<UdpSpan>,
}

/// A UDP stream's datagrams over one interval, as iperf3's interval records carry them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct UdpSpan {
    /// Datagrams sent (a sending stream) or the rise of the highest packet number seen (a
    /// receiving stream) in the span.
    pub packets: u64,
    /// Datagrams lost in the span (a receiving stream).
    pub lost: u64,
    /// Smoothed jitter at the span's end, seconds (a receiving stream).
    pub jitter: f64,
}

/// A UDP interval's datagram fields: a sending side knows only its packets (iperf3's
/// sender intervals say no more), a receiving side its losses and jitter too.
fn udp_fields(m: &mut Map<String, Value>, u: &UdpSpan, sender: bool) {
    if sender {
        m.insert("packets".into(), json!(u.packets));
        return;
    }
    m.insert("jitter_ms".into(), json!(u.jitter * 1000.0));
    m.insert("lost_packets".into(), json!(u.lost));
    m.insert("packets".into(), json!(u.packets));
    m.insert(
        "lost_percent".into(),
        json!(super::udp::lost_percent(u.lost, u.packets)),
    );
}

/// What `TCP_INFO` says about a sending stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TcpFigures {
    /// Congestion window, bytes.
    pub snd_cwnd: u64,
    /// Smoothed RTT, µs.
    pub rtt: u64,
    /// RTT variance, µs.
    pub rttvar: u64,
    /// Path MTU.
    pub pmtu: u64,
}

fn bps(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 * 8.0 / seconds
    } else {
        0.0
    }
}

fn span_json(s: &StreamSpan) -> Value {
    let seconds = s.end - s.start;
    let mut v = json!({
        "socket": s.socket,
        "start": s.start,
        "end": s.end,
        "seconds": seconds,
        "bytes": s.bytes,
        "bits_per_second": bps(s.bytes, seconds),
    });
    let m = v.as_object_mut().expect("an object");
    if let Some(r) = s.retransmits {
        m.insert("retransmits".into(), json!(r));
    }
    if let Some(t) = s.tcp {
        m.insert("snd_cwnd".into(), json!(t.snd_cwnd));
        m.insert("rtt".into(), json!(t.rtt));
        m.insert("rttvar".into(), json!(t.rttvar));
        m.insert("pmtu".into(), json!(t.pmtu));
    }
    if let Some(u) = &s.udp {
        udp_fields(m, u, s.sender);
    }
    m.insert("omitted".into(), json!(false));
    m.insert("sender".into(), json!(s.sender));
    v
}

fn sum_of<'a>(spans: impl Iterator<Item = &'a StreamSpan>, sender: bool) -> Option<Value> {
    let spans: Vec<&StreamSpan> = spans.collect();
    if spans.is_empty() {
        return None;
    }
    let start = spans.iter().map(|s| s.start).fold(f64::INFINITY, f64::min);
    let end = spans.iter().map(|s| s.end).fold(0.0, f64::max);
    let bytes: u64 = spans.iter().map(|s| s.bytes).sum();
    let mut v = json!({
        "start": start,
        "end": end,
        "seconds": end - start,
        "bytes": bytes,
        "bits_per_second": bps(bytes, end - start),
    });
    let m = v.as_object_mut().expect("an object");
    let rt: Vec<i64> = spans.iter().filter_map(|s| s.retransmits).collect();
    if !rt.is_empty() {
        m.insert("retransmits".into(), json!(rt.iter().sum::<i64>()));
    }
    let udp: Vec<UdpSpan> = spans.iter().filter_map(|s| s.udp).collect();
    if !udp.is_empty() {
        // iperf3's interval sum: packets and losses summed, jitter averaged over streams.
        let sum = UdpSpan {
            packets: udp.iter().map(|u| u.packets).sum(),
            lost: udp.iter().map(|u| u.lost).sum(),
            jitter: udp.iter().map(|u| u.jitter).sum::<f64>() / udp.len() as f64,
        };
        udp_fields(m, &sum, sender);
    }
    m.insert("omitted".into(), json!(false));
    m.insert("sender".into(), json!(sender));
    Some(v)
}

/// `start`.
pub fn start(s: &Start) -> Value {
    let p = &s.params;
    let mut v = json!({
        "connected": s.connected.iter().map(|c| json!({
            "socket": c.socket,
            "local_host": c.local_host,
            "local_port": c.local_port,
            "remote_host": c.remote_host,
            "remote_port": c.remote_port,
        })).collect::<Vec<_>>(),
        "version": s.version,
        "system_info": s.system_info,
        "timestamp": {"time": s.time, "timesecs": s.timesecs},
    });
    let m = v.as_object_mut().expect("an object");
    match &s.role {
        Role::Client { host, port } => {
            m.insert("connecting_to".into(), json!({"host": host, "port": port}));
        }
        Role::Server { host, port } => {
            m.insert(
                "accepted_connection".into(),
                json!({"host": host, "port": port}),
            );
        }
    }
    m.insert("cookie".into(), json!(s.cookie));
    m.insert("tcp_mss_default".into(), json!(s.tcp_mss_default));
    m.insert("target_bitrate".into(), json!(p.bandwidth));
    m.insert("sock_bufsize".into(), json!(0));
    m.insert("sndbuf_actual".into(), json!(s.sndbuf_actual));
    m.insert("rcvbuf_actual".into(), json!(s.rcvbuf_actual));
    m.insert(
        "test_start".into(),
        json!({
            "protocol": if p.udp { "UDP" } else { "TCP" },
            "num_streams": p.parallel,
            "blksize": p.len,
            "omit": 0,
            "duration": if p.bytes > 0 { 0 } else { p.time },
            "bytes": p.bytes,
            "blocks": 0,
            "reverse": u8::from(p.direction == Direction::Reverse),
            "tos": 0,
            "target_bitrate": p.bandwidth,
        }),
    );
    if p.direction == Direction::Bidir {
        m.insert("test_start_bidir".into(), json!(1));
    }
    m.insert("zcnet".into(), s.zcnet.clone());
    v
}

/// One element of `intervals`.
pub fn interval(spans: &[StreamSpan], main_is_sender: bool) -> Value {
    let mut v = json!({"streams": spans.iter().map(span_json).collect::<Vec<_>>()});
    let m = v.as_object_mut().expect("an object");
    if let Some(s) = sum_of(spans.iter().filter(|s| s.main), main_is_sender) {
        m.insert("sum".into(), s);
    }
    if let Some(s) = sum_of(spans.iter().filter(|s| !s.main), !main_is_sender) {
        m.insert("sum_bidir_reverse".into(), s);
    }
    v
}

/// One stream's whole test, both ends' counts: what this side counted and what the peer
/// reported in the results exchange.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamTotal {
    /// The data connection's descriptor.
    pub socket: i32,
    /// Whether this side sends on it.
    pub sender: bool,
    /// Whether it carries the test's main direction.
    pub main: bool,
    /// Bytes the sending end sent.
    pub sent: u64,
    /// Bytes the receiving end received.
    pub received: u64,
    /// Seconds the sending end sent for.
    pub sender_seconds: f64,
    /// Seconds the receiving end received for.
    pub receiver_seconds: f64,
    /// Retransmits the sending end counted (`None`: it could not).
    pub retransmits: Option<i64>,
    /// A UDP stream's datagram counts (`None` for TCP).
    pub udp: Option<UdpTotal>,
}

/// A UDP stream's datagrams, both ends' counts together (iperf3's `packet_count` of each
/// end, `cnt_error`, `outoforder_packets`, `jitter`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct UdpTotal {
    /// Datagrams the sending end sent.
    pub sender_packets: u64,
    /// The highest packet number the receiving end saw.
    pub receiver_packets: u64,
    /// Datagrams lost, as the receiving end counted them.
    pub lost: u64,
    /// Datagrams that arrived out of order.
    pub out_of_order: u64,
    /// Smoothed jitter at the receiving end, seconds.
    pub jitter: f64,
}

impl UdpTotal {
    /// The packet count iperf3 reports: the sender's where known, else the receiver's.
    fn packets(&self) -> u64 {
        if self.sender_packets > 0 {
            self.sender_packets
        } else {
            self.receiver_packets
        }
    }
}

/// Percentages of one CPU, iperf3's `cpu_utilization_percent`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuPercent {
    /// This process: user + system.
    pub host_total: f64,
    /// This process: user.
    pub host_user: f64,
    /// This process: system.
    pub host_system: f64,
    /// The peer's process, as it reported.
    pub remote_total: f64,
    /// The peer: user.
    pub remote_user: f64,
    /// The peer: system.
    pub remote_system: f64,
}

fn end_record(
    socket: i32,
    seconds: f64,
    bytes: u64,
    sender: bool,
    retransmits: Option<i64>,
) -> Value {
    let mut v = json!({
        "socket": socket,
        "start": 0,
        "end": seconds,
        "seconds": seconds,
        "bytes": bytes,
        "bits_per_second": bps(bytes, seconds),
    });
    let m = v.as_object_mut().expect("an object");
    if let Some(r) = retransmits {
        m.insert("retransmits".into(), json!(r));
    }
    m.insert("sender".into(), json!(sender));
    v
}

fn end_sum(streams: &[&StreamTotal], sent: bool) -> Value {
    let seconds = streams
        .iter()
        .map(|s| {
            if sent {
                s.sender_seconds
            } else {
                s.receiver_seconds
            }
        })
        .fold(0.0, f64::max);
    let bytes: u64 = streams
        .iter()
        .map(|s| if sent { s.sent } else { s.received })
        .sum();
    let rt: Vec<i64> = streams.iter().filter_map(|s| s.retransmits).collect();
    let retransmits = (sent && !rt.is_empty()).then(|| rt.iter().sum());
    let sender = streams.first().is_some_and(|s| s.sender);
    let mut v = end_record(0, seconds, bytes, sender, retransmits);
    v.as_object_mut().expect("an object").remove("socket");
    v
}

/// `end` of a UDP test (`iperf_print_results`, UDP branch): one `udp` record per stream,
/// from the sender's byte count and the receiver's loss and jitter, and three sums —
/// `sum` (the one k8s-netperf reads `lost_percent` from), `sum_sent` and `sum_received`.
fn end_udp(streams: &[StreamTotal]) -> Map<String, Value> {
    let main: Vec<&StreamTotal> = streams.iter().filter(|s| s.main).collect();
    let per_stream: Vec<Value> = main
        .iter()
        .map(|s| {
            let u = s.udp.unwrap_or_default();
            json!({"udp": {
                "socket": s.socket,
                "start": 0,
                "end": s.sender_seconds,
                "seconds": s.sender_seconds,
                "bytes": s.sent,
                "bits_per_second": bps(s.sent, s.sender_seconds),
                "jitter_ms": u.jitter * 1000.0,
                "lost_packets": u.lost,
                "packets": u.packets(),
                "lost_percent": super::udp::lost_percent(u.lost, u.sender_packets),
                "out_of_order": u.out_of_order,
                "sender": s.sender,
            }})
        })
        .collect();
    let n = main.len().max(1) as f64;
    let sender_time = main.iter().map(|s| s.sender_seconds).fold(0.0, f64::max);
    let receiver_time = main.iter().map(|s| s.receiver_seconds).fold(0.0, f64::max);
    let sent: u64 = main.iter().map(|s| s.sent).sum();
    let received: u64 = main.iter().map(|s| s.received).sum();
    let udp = |f: fn(&UdpTotal) -> u64| -> u64 {
        main.iter().map(|s| f(&s.udp.unwrap_or_default())).sum()
    };
    let total_packets = udp(UdpTotal::packets);
    let sender_packets = udp(|u| u.sender_packets);
    let receiver_packets = udp(|u| u.receiver_packets);
    let lost = udp(|u| u.lost);
    let jitter_ms = main
        .iter()
        .map(|s| s.udp.unwrap_or_default().jitter)
        .sum::<f64>()
        / n
        * 1000.0;
    let lost_percent = super::udp::lost_percent(lost, total_packets);
    let sender = main.first().is_some_and(|s| s.sender);
    let mut m = Map::new();
    m.insert("streams".into(), Value::Array(per_stream));
    m.insert(
        "sum".into(),
        json!({
            "start": 0, "end": receiver_time, "seconds": receiver_time,
            "bytes": sent, "bits_per_second": bps(sent, sender_time),
            "jitter_ms": jitter_ms, "lost_packets": lost, "packets": total_packets,
            "lost_percent": lost_percent, "sender": sender,
        }),
    );
    m.insert(
        "sum_sent".into(),
        json!({
            "start": 0, "end": sender_time, "seconds": sender_time,
            "bytes": sent, "bits_per_second": bps(sent, sender_time),
            "jitter_ms": 0.0, "lost_packets": 0, "packets": sender_packets,
            "lost_percent": 0.0, "sender": true,
        }),
    );
    m.insert(
        "sum_received".into(),
        json!({
            "start": 0, "end": receiver_time, "seconds": receiver_time,
            "bytes": received, "bits_per_second": bps(received, receiver_time),
            "jitter_ms": jitter_ms, "lost_packets": lost, "packets": receiver_packets,
            "lost_percent": lost_percent, "sender": false,
        }),
    );
    m
}

/// `end`.
pub fn end(
    streams: &[StreamTotal],
    cpu: CpuPercent,
    congestion: (Option<&str>, Option<&str>),
    zcnet: Value,
) -> Value {
    if streams.iter().any(|s| s.udp.is_some()) {
        let mut m = end_udp(streams);
        m.insert("cpu_utilization_percent".into(), cpu_json(&cpu));
        m.insert("zcnet".into(), zcnet);
        return Value::Object(m);
    }
    let per_stream: Vec<Value> = streams
        .iter()
        .map(|s| {
            json!({
                "sender": end_record(s.socket, s.sender_seconds, s.sent, s.sender, s.retransmits),
                "receiver": end_record(s.socket, s.receiver_seconds, s.received, s.sender, None),
            })
        })
        .collect();
    let mut m = Map::new();
    m.insert("streams".into(), Value::Array(per_stream));
    let main: Vec<&StreamTotal> = streams.iter().filter(|s| s.main).collect();
    let reverse: Vec<&StreamTotal> = streams.iter().filter(|s| !s.main).collect();
    if !main.is_empty() {
        m.insert("sum_sent".into(), end_sum(&main, true));
        m.insert("sum_received".into(), end_sum(&main, false));
    }
    if !reverse.is_empty() {
        m.insert("sum_sent_bidir_reverse".into(), end_sum(&reverse, true));
        m.insert(
            "sum_received_bidir_reverse".into(),
            end_sum(&reverse, false),
        );
    }
    m.insert("cpu_utilization_percent".into(), cpu_json(&cpu));
    if let Some(c) = congestion.0 {
        m.insert("sender_tcp_congestion".into(), json!(c));
    }
    if let Some(c) = congestion.1 {
        m.insert("receiver_tcp_congestion".into(), json!(c));
    }
    m.insert("zcnet".into(), zcnet);
    Value::Object(m)
}

fn cpu_json(cpu: &CpuPercent) -> Value {
    json!({
        "host_total": cpu.host_total,
        "host_user": cpu.host_user,
        "host_system": cpu.host_system,
        "remote_total": cpu.remote_total,
        "remote_user": cpu.remote_user,
        "remote_system": cpu.remote_system,
    })
}

/// The whole `-J` document; `error` as iperf3 adds it when a test fails.
pub fn document(start: Value, intervals: Vec<Value>, end: Value, error: Option<&str>) -> Value {
    let mut v = json!({"start": start, "intervals": intervals, "end": end});
    if let Some(e) = error {
        v.as_object_mut()
            .expect("an object")
            .insert("error".into(), json!(e));
    }
    v
}

/// One `--json-stream` line: `{"event":NAME,"data":DATA}`, no newline.
pub fn event(name: &str, data: &Value) -> String {
    json!({"event": name, "data": data}).to_string()
}

/// iperf3's human-readable rate: `9.42 Gbits/sec`.
pub fn rate_text(bits_per_second: f64) -> String {
    let (v, unit) = scale(bits_per_second, 1000.0);
    format!("{v:.2} {unit}bits/sec")
}

/// iperf3's human-readable size: `1.10 GBytes`.
pub fn bytes_text(bytes: u64) -> String {
    let (v, unit) = scale(bytes as f64, 1024.0);
    format!("{v:.2} {unit}Bytes")
}

fn scale(mut v: f64, step: f64) -> (f64, &'static str) {
    for unit in ["", "K", "M", "G"] {
        if v < step {
            return (v, unit);
        }
        v /= step;
    }
    (v, "T")
}

/// `start.timestamp.time` as iperf3 writes it (`strftime("%a, %d %b %Y %H:%M:%S %Z")`, in
/// UTC): `Wed, 25 Nov 2026 02:45:32 UTC`.
pub fn timestamp_text(secs: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's `civil_from_days`).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{}, {:02} {} {} {:02}:{:02}:{:02} UTC",
        DAYS[(days % 7) as usize],
        d,
        MONTHS[(m - 1) as usize],
        y,
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamps_read_as_iperf3s() {
        assert_eq!(timestamp_text(0), "Thu, 01 Jan 1970 00:00:00 UTC");
        assert_eq!(
            timestamp_text(1_627_834_976),
            "Sun, 01 Aug 2021 16:22:56 UTC"
        );
        assert_eq!(timestamp_text(951_782_400), "Tue, 29 Feb 2000 00:00:00 UTC");
    }

    use super::*;

    fn total(socket: i32, sender: bool, main: bool, sent: u64, received: u64) -> StreamTotal {
        StreamTotal {
            socket,
            sender,
            main,
            sent,
            received,
            sender_seconds: 2.0,
            receiver_seconds: 2.5,
            retransmits: sender.then_some(3),
            udp: None,
        }
    }

    #[test]
    fn a_udp_end_has_iperf3s_sums_and_the_loss_k8s_netperf_reads() {
        let udp = |sender_packets, receiver_packets, lost| UdpTotal {
            sender_packets,
            receiver_packets,
            lost,
            out_of_order: 1,
            jitter: 0.002,
        };
        let streams = [
            StreamTotal {
                udp: Some(udp(1000, 1000, 10)),
                ..total(5, true, true, 1_000_000, 990_000)
            },
            StreamTotal {
                udp: Some(udp(3000, 2990, 20)),
                ..total(6, true, true, 3_000_000, 2_970_000)
            },
        ];
        let e = end(&streams, CpuPercent::default(), (None, None), json!({}));
        assert_eq!(e["sum"]["packets"], 4000);
        assert_eq!(e["sum"]["lost_packets"], 30);
        assert_eq!(e["sum"]["lost_percent"], 0.75);
        assert_eq!(e["sum"]["bytes"], 4_000_000);
        assert!((e["sum"]["jitter_ms"].as_f64().unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(e["sum_sent"]["packets"], 4000);
        assert_eq!(e["sum_sent"]["lost_percent"], 0.0);
        assert_eq!(e["sum_received"]["packets"], 3990);
        assert_eq!(e["sum_received"]["bytes"], 3_960_000);
        assert_eq!(e["sum_received"]["lost_percent"], 0.75);
        assert_eq!(
            e["sum_received"]["bits_per_second"],
            3_960_000.0 * 8.0 / 2.5
        );
        assert_eq!(e["sum_sent"]["bits_per_second"], 4_000_000.0 * 8.0 / 2.0);
        let s0 = &e["streams"][0]["udp"];
        assert_eq!(s0["packets"], 1000);
        assert_eq!(s0["lost_percent"], 1.0);
        assert_eq!(s0["out_of_order"], 1);
        assert_eq!(s0["sender"], true);
        assert!(e["cpu_utilization_percent"]["host_total"].is_number());
    }

    #[test]
    fn end_has_the_fields_k8s_netperf_and_pscheduler_read() {
        let streams = [
            total(5, true, true, 1000, 1000),
            total(6, true, true, 3000, 2000),
        ];
        let cpu = CpuPercent {
            host_total: 50.0,
            host_user: 10.0,
            host_system: 40.0,
            remote_total: 30.0,
            remote_user: 5.0,
            remote_system: 25.0,
        };
        let e = end(&streams, cpu, (Some("cubic"), None), json!({"x": 1}));
        assert_eq!(e["sum_sent"]["bytes"], 4000);
        assert_eq!(e["sum_sent"]["retransmits"], 6);
        assert_eq!(e["sum_sent"]["bits_per_second"], 4000.0 * 8.0 / 2.0);
        assert_eq!(e["sum_sent"]["sender"], true);
        assert_eq!(e["sum_received"]["bytes"], 3000);
        assert_eq!(e["sum_received"]["bits_per_second"], 3000.0 * 8.0 / 2.5);
        assert!(e["sum_received"].get("retransmits").is_none());
        assert_eq!(e["cpu_utilization_percent"]["host_total"], 50.0);
        assert_eq!(e["cpu_utilization_percent"]["remote_total"], 30.0);
        assert_eq!(e["streams"][1]["sender"]["bytes"], 3000);
        assert_eq!(e["streams"][1]["receiver"]["bytes"], 2000);
        assert_eq!(e["sender_tcp_congestion"], "cubic");
        assert!(e.get("sum_sent_bidir_reverse").is_none());
        assert_eq!(e["zcnet"]["x"], 1);
    }

    #[test]
    fn bidir_sums_the_reverse_streams_apart() {
        let streams = [
            total(5, true, true, 100, 100),
            total(6, false, false, 700, 690),
        ];
        let e = end(&streams, CpuPercent::default(), (None, None), json!({}));
        assert_eq!(e["sum_sent"]["bytes"], 100);
        assert_eq!(e["sum_sent_bidir_reverse"]["bytes"], 700);
        assert_eq!(e["sum_received_bidir_reverse"]["bytes"], 690);
        assert_eq!(e["sum_sent_bidir_reverse"]["sender"], false);
        // Retransmits belong to the sending end: the reverse streams' were the peer's.
        assert!(e["sum_sent_bidir_reverse"].get("retransmits").is_none());
    }

    #[test]
    fn intervals_and_events_have_iperf3s_shape() {
        let spans = [
            StreamSpan {
                socket: 5,
                sender: false,
                main: true,
                start: 1.0,
                end: 2.0,
                bytes: 125_000_000,
                retransmits: None,
                tcp: None,
                udp: None,
            },
            StreamSpan {
                socket: 7,
                sender: false,
                main: true,
                start: 1.0,
                end: 2.0,
                bytes: 125_000_000,
                retransmits: None,
                tcp: None,
                udp: None,
            },
        ];
        let i = interval(&spans, false);
        assert_eq!(i["streams"].as_array().unwrap().len(), 2);
        assert_eq!(i["sum"]["bytes"], 250_000_000);
        assert_eq!(i["sum"]["bits_per_second"], 2e9);
        assert_eq!(i["sum"]["sender"], false);
        assert!(i.get("sum_bidir_reverse").is_none());
        let line = event("interval", &i);
        let back: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back["event"], "interval");
        assert_eq!(back["data"], i);
        assert!(!line.contains('\n'));
    }

    #[test]
    fn start_names_the_role_and_the_test() {
        let s = Start {
            role: Role::Server {
                host: "127.0.0.1".into(),
                port: 40000,
            },
            version: "zcnet".into(),
            system_info: "Linux".into(),
            time: "t".into(),
            timesecs: 1,
            connected: vec![],
            cookie: "c".into(),
            tcp_mss_default: 0,
            sndbuf_actual: 1,
            rcvbuf_actual: 2,
            params: TestParams {
                direction: Direction::Reverse,
                ..TestParams::default()
            },
            zcnet: json!({}),
        };
        let v = start(&s);
        assert_eq!(v["accepted_connection"]["port"], 40000);
        assert_eq!(v["test_start"]["reverse"], 1);
        assert_eq!(v["test_start"]["duration"], 10);
        assert_eq!(v["test_start"]["blksize"], 131072);
    }

    #[test]
    fn human_units_follow_iperf3() {
        assert_eq!(rate_text(9.42e9), "9.42 Gbits/sec");
        assert_eq!(bytes_text(1_181_116_006), "1.10 GBytes");
        assert_eq!(bytes_text(512), "512.00 Bytes");
    }

    #[test]
    fn udp_intervals_carry_iperf3s_datagram_fields() {
        let span = |socket, packets, lost, jitter| StreamSpan {
            socket,
            sender: false,
            main: true,
            start: 0.0,
            end: 1.0,
            bytes: packets * 1000,
            retransmits: None,
            tcp: None,
            udp: Some(UdpSpan {
                packets,
                lost,
                jitter,
            }),
        };
        let i = interval(&[span(5, 100, 4, 0.001), span(6, 300, 0, 0.003)], false);
        assert_eq!(i["streams"][0]["packets"], 100);
        assert_eq!(i["streams"][0]["lost_percent"], 4.0);
        assert_eq!(i["streams"][0]["jitter_ms"], 1.0);
        assert_eq!(i["sum"]["packets"], 400);
        assert_eq!(i["sum"]["lost_packets"], 4);
        assert_eq!(i["sum"]["lost_percent"], 1.0);
        assert!((i["sum"]["jitter_ms"].as_f64().unwrap() - 2.0).abs() < 1e-9);
        // A sending side's records carry its packets only, as iperf3's do.
        let sent = StreamSpan {
            sender: true,
            ..span(5, 100, 0, 0.0)
        };
        let i = interval(&[sent], true);
        assert_eq!(i["streams"][0]["packets"], 100);
        assert_eq!(i["sum"]["packets"], 100);
        assert!(i["sum"].get("lost_packets").is_none());
        assert!(i["streams"][0].get("jitter_ms").is_none());
    }
}
