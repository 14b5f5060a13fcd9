//! What a side says about a test: the interval reporter (a thread sampling every stream's
//! live byte count and `TCP_INFO`), this side's [`Results`] for the exchange, zcnet's
//! figures (`zcnet` in the results and `end.zcnet` in `-J`), and iperf3's text lines.

use super::opts::{Format, Out};
use super::streams::{tcp_figures, Live, Running, StreamOut};
use serde_json::{json, Value};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use zcnet_bench::iperf3::output::{self, CpuPercent, StreamSpan, StreamTotal, UdpSpan, UdpTotal};
use zcnet_bench::iperf3::{Results, StreamResult};
use zcnet_bench::report::SystemCpuTimes;

const GIB: f64 = (1u64 << 30) as f64;

/// A stream as the interval reporter sees it.
pub(crate) struct Probe {
    pub socket: i32,
    pub sender: bool,
    pub main: bool,
    pub live: Arc<Live>,
    pub fd: Option<TcpStream>,
}

impl Probe {
    /// What the reporter samples of a running stream (its socket cloned, for `TCP_INFO`).
    pub(crate) fn of(r: &Running) -> Probe {
        Probe {
            socket: r.socket,
            sender: r.sender,
            main: r.main,
            live: r.live.clone(),
            fd: r.probe.as_ref().and_then(|s| s.try_clone().ok()),
        }
    }
}

/// Interval reports on a thread of their own, every `-i` seconds.
pub(crate) struct Reporter {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Vec<Value>>>,
}

impl Reporter {
    /// Starts reporting from `t0`; `every` = 0 reports nothing.
    pub(crate) fn spawn(
        t0: Instant,
        probes: Vec<Probe>,
        every: f64,
        main_is_sender: bool,
        format: Format,
        out: Arc<Out>,
    ) -> Reporter {
        let stop = Arc::new(AtomicBool::new(false));
        if every <= 0.0 {
            return Reporter { stop, handle: None };
        }
        let s = stop.clone();
        // Without a thread for it the test runs on, with no interval reports.
        let handle = std::thread::Builder::new()
            .name("iperf3-intervals".into())
            .spawn(move || {
                intervals(
                    t0,
                    &probes,
                    every,
                    main_is_sender,
                    &s,
                    |v, spans| match format {
                        Format::JsonStream => out.write(&(output::event("interval", v) + "\n")),
                        Format::Text => out.write(&interval_text(spans)),
                        Format::Json => {}
                    },
                )
            })
            .ok();
        Reporter { stop, handle }
    }

    /// Stops and returns every interval reported (with the last, partial one).
    pub(crate) fn finish(mut self) -> Vec<Value> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

fn intervals(
    t0: Instant,
    probes: &[Probe],
    every: f64,
    main_is_sender: bool,
    stop: &AtomicBool,
    mut emit: impl FnMut(&Value, &[StreamSpan]),
) -> Vec<Value> {
    let mut out = Vec::new();
    let mut prev_bytes = vec![0u64; probes.len()];
    let mut prev_udp = vec![(0u64, 0u64); probes.len()];
    let mut prev_retr: Vec<i64> = probes
        .iter()
        .map(|p| {
            p.fd.as_ref()
                .filter(|_| p.sender)
                .and_then(|f| tcp_figures(f.as_fd()))
                .map_or(0, |t| t.0)
        })
        .collect();
    let mut prev_t = 0.0f64;
    let mut k = 1u32;
    loop {
        let due = t0 + Duration::from_secs_f64(every * f64::from(k));
        let stopping = loop {
            if stop.load(Ordering::Relaxed) {
                break true;
            }
            let now = Instant::now();
            if now >= due {
                break false;
            }
            std::thread::sleep((due - now).min(Duration::from_millis(20)));
        };
        let now_t = t0.elapsed().as_secs_f64();
        // The last, partial interval only if it is more than a tenth of one long.
        if stopping && now_t - prev_t < every / 10.0 {
            break;
        }
        let spans: Vec<StreamSpan> = probes
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let b = p.live.bytes.load(Ordering::Relaxed);
                let tcp =
                    p.fd.as_ref()
                        .filter(|_| p.sender)
                        .and_then(|f| tcp_figures(f.as_fd()));
                let retransmits = tcp.map(|t| {
                    let d = t.0 - prev_retr[i];
                    prev_retr[i] = t.0;
                    d
                });
                let span = StreamSpan {
                    socket: p.socket,
                    sender: p.sender,
                    main: p.main,
                    start: prev_t,
                    end: now_t,
                    bytes: b.saturating_sub(prev_bytes[i]),
                    retransmits,
                    tcp: tcp.map(|t| t.1),
                    udp: p.live.udp.as_ref().map(|u| {
                        let (packets, lost) = (
                            u.packets.load(Ordering::Relaxed),
                            u.lost.load(Ordering::Relaxed),
                        );
                        let (pp, pl) = std::mem::replace(&mut prev_udp[i], (packets, lost));
                        UdpSpan {
                            packets: packets.saturating_sub(pp),
                            lost: lost.saturating_sub(pl),
                            jitter: f64::from_bits(u.jitter_bits.load(Ordering::Relaxed)),
                        }
                    }),
                };
                prev_bytes[i] = b;
                span
            })
            .collect();
        let v = output::interval(&spans, main_is_sender);
        emit(&v, &spans);
        out.push(v);
        prev_t = now_t;
        k += 1;
        if stopping {
            break;
        }
    }
    out
}

fn interval_text(spans: &[StreamSpan]) -> String {
    let mut s = String::new();
    for sp in spans {
        s += &format!(
            "[{:>3}] {:>6.2}-{:<6.2} sec  {:>12}  {:>16}{}\n",
            sp.socket,
            sp.start,
            sp.end,
            output::bytes_text(sp.bytes),
            output::rate_text(bps(sp.bytes, sp.end - sp.start)),
            match sp.retransmits {
                Some(r) => format!("  {r:>4}"),
                None => String::new(),
            }
        );
    }
    if spans.len() > 1 {
        let (start, end) = (spans[0].start, spans[0].end);
        let bytes: u64 = spans.iter().map(|s| s.bytes).sum();
        s += &format!(
            "[SUM] {:>6.2}-{:<6.2} sec  {:>12}  {:>16}\n",
            start,
            end,
            output::bytes_text(bytes),
            output::rate_text(bps(bytes, end - start))
        );
    }
    s
}

fn bps(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 * 8.0 / seconds
    } else {
        0.0
    }
}

/// One side's whole-test measurements.
#[derive(Debug, Clone)]
pub(crate) struct Measured {
    pub outs: Vec<StreamOut>,
    /// From `TEST_START` to the end of the last stream.
    pub wall: f64,
    /// The whole machine's busy time over the test (`/proc/stat`).
    pub machine: Option<SystemCpuTimes>,
}

impl Measured {
    fn cpu(&self) -> (f64, f64) {
        self.outs
            .iter()
            .fold((0.0, 0.0), |(u, s), o| (u + o.cpu.user, s + o.cpu.sys))
    }

    fn bytes(&self, sender: bool) -> u64 {
        self.outs
            .iter()
            .filter(|o| o.sender == sender)
            .map(|o| o.bytes)
            .sum()
    }

    /// iperf3's `cpu_util`: percent of one CPU over the test — here the data threads' CPU
    /// (`RUSAGE_THREAD`), not the whole process, so a server running several tests at
    /// once reports each test's own.
    pub(crate) fn cpu_percent(&self) -> (f64, f64, f64) {
        let (u, s) = self.cpu();
        let w = self.wall.max(1e-9);
        (100.0 * (u + s) / w, 100.0 * u / w, 100.0 * s / w)
    }

    /// What zcnet adds about this side: paths, CPU seconds per GiB, zero-copy shares,
    /// bytes the kernel copied anyway, fallbacks, `auto`'s decisions.
    pub(crate) fn zcnet(&self, role: &str, tx: zcnet::TxPath, rx: zcnet::RxPath) -> Value {
        let (user, sys) = self.cpu();
        let (sent, received) = (self.bytes(true), self.bytes(false));
        let mut stats = zcnet_bench::report::SideStats::default();
        let (mut tx_file, mut rx_file) = (0u64, 0u64);
        let mut tx_in_effect: Vec<String> = Vec::new();
        let mut rx_in_effect: Vec<String> = Vec::new();
        for o in &self.outs {
            stats.merge(&o.stats);
            let (list, file) = if o.sender {
                (&mut tx_in_effect, &mut tx_file)
            } else {
                (&mut rx_in_effect, &mut rx_file)
            };
            *file += o.file_bytes;
            if !list.contains(&o.path) {
                list.push(o.path.clone());
            }
        }
        let share = |zc: u64, total: u64| {
            if total == 0 {
                Value::Null
            } else {
                json!(zc as f64 / total as f64)
            }
        };
        let moved = sent + received;
        let udp_outs: Vec<_> = self.outs.iter().filter_map(|o| o.udp).collect();
        let udp = if udp_outs.is_empty() {
            Value::Null
        } else {
            json!({
                "datagrams": udp_outs.iter().map(|u| u.datagrams).sum::<u64>(),
                "syscalls": udp_outs.iter().map(|u| u.calls).sum::<u64>(),
                "gso": udp_outs.iter().any(|u| u.gso),
                "gro": udp_outs.iter().any(|u| u.gro),
            })
        };
        json!({
            "udp": udp,
            "role": role,
            "tx_path": tx.name(),
            "rx_path": rx.name(),
            "tx_paths_in_effect": tx_in_effect,
            "rx_paths_in_effect": rx_in_effect,
            "bytes_sent": sent,
            "bytes_received": received,
            "seconds": self.wall,
            "cpu_s": {"user": user, "sys": sys},
            "cpu_s_per_gib": if moved > 0 { json!((user + sys) / (moved as f64 / GIB)) } else { Value::Null },
            "zero_copy_share": {
                "tx": share(stats.tx_bytes_zerocopy.saturating_sub(stats.tx_bytes_zc_copied) + tx_file, sent),
                "rx": share(stats.rx_bytes_mapped, received),
            },
            "copied_anyway_bytes": stats.tx_bytes_zc_copied,
            "file_bytes": {"tx": tx_file, "rx": rx_file},
            "fallbacks": stats.fallbacks,
            "auto": stats.auto,
            "machine_cpu_s": self.machine,
            "cpu_note": "cpu_s: this side's data threads (RUSAGE_THREAD; softirq work a thread triggers is charged to it on tick-based accounting); machine_cpu_s: all of /proc/stat over the test, other tenants included",
        })
    }

    /// This side's results for the exchange.
    pub(crate) fn results(&self, zcnet: Value) -> Results {
        let (t, u, s) = self.cpu_percent();
        let sends = self.outs.iter().any(|o| o.sender);
        Results {
            cpu_util_total: t,
            cpu_util_user: u,
            cpu_util_system: s,
            sender_has_retransmits: if sends { 1 } else { -1 },
            congestion_used: self.outs.iter().find_map(|o| o.congestion.clone()),
            streams: self
                .outs
                .iter()
                .map(|o| StreamResult {
                    id: o.id,
                    bytes: o.bytes,
                    retransmits: if o.sender {
                        o.retransmits.unwrap_or(-1)
                    } else {
                        -1
                    },
                    start_time: 0.0,
                    end_time: o.seconds,
                    jitter: o.udp.map_or(0.0, |u| u.jitter),
                    errors: o.udp.map_or(0, |u| u.lost),
                    packets: o.udp.map_or(0, |u| u.packets),
                })
                .collect(),
            server_output_json: None,
            zcnet: Some(zcnet),
        }
    }
}

/// Both ends' counts per stream: ours, and the peer's from its results.
pub(crate) fn totals(ours: &Measured, peer: &Results) -> Vec<StreamTotal> {
    ours.outs
        .iter()
        .map(|o| {
            let p = peer.stream(o.id);
            let p_bytes = p.map_or(0, |p| p.bytes);
            let p_seconds = p.map_or(0.0, |p| p.end_time - p.start_time);
            let udp = o.udp.map(|u| {
                let (pj, pe, pp) = p.map_or((0.0, 0, 0), |p| (p.jitter, p.errors, p.packets));
                if o.sender {
                    UdpTotal {
                        sender_packets: u.packets,
                        receiver_packets: pp,
                        lost: pe,
                        out_of_order: 0,
                        jitter: pj,
                    }
                } else {
                    UdpTotal {
                        sender_packets: pp,
                        receiver_packets: u.packets,
                        lost: u.lost,
                        out_of_order: u.out_of_order,
                        jitter: u.jitter,
                    }
                }
            });
            if o.sender {
                StreamTotal {
                    socket: o.socket,
                    sender: true,
                    main: o.main,
                    sent: o.bytes,
                    received: p_bytes,
                    sender_seconds: o.seconds,
                    receiver_seconds: p_seconds,
                    retransmits: o.retransmits,
                    udp,
                }
            } else {
                StreamTotal {
                    socket: o.socket,
                    sender: false,
                    main: o.main,
                    sent: p_bytes,
                    received: o.bytes,
                    sender_seconds: p_seconds,
                    receiver_seconds: o.seconds,
                    retransmits: p.map(|p| p.retransmits).filter(|&r| r >= 0),
                    udp,
                }
            }
        })
        .collect()
}

/// `end`, with `end.zcnet` = this side, the peer's own figures where the peer is zcnet,
/// and CPU-s/GiB of both ends together.
pub(crate) fn end(ours: &Measured, peer: &Results, local_zcnet: Value) -> Value {
    let (t, u, s) = ours.cpu_percent();
    let cpu = CpuPercent {
        host_total: t,
        host_user: u,
        host_system: s,
        remote_total: peer.cpu_util_total,
        remote_user: peer.cpu_util_user,
        remote_system: peer.cpu_util_system,
    };
    let local_cong = ours.outs.iter().find_map(|o| o.congestion.clone());
    let we_send = ours.outs.iter().any(|o| o.sender && o.main);
    let (snd, rcv) = if we_send {
        (local_cong.clone(), peer.congestion_used.clone())
    } else {
        (peer.congestion_used.clone(), local_cong.clone())
    };
    let per_gib = |v: &Value| v.get("cpu_s_per_gib").and_then(Value::as_f64);
    let both = match (per_gib(&local_zcnet), peer.zcnet.as_ref().and_then(per_gib)) {
        (Some(a), Some(b)) => json!(a + b),
        _ => Value::Null,
    };
    let zc = json!({
        "local": local_zcnet,
        "remote": peer.zcnet.clone().unwrap_or(Value::Null),
        "cpu_s_per_gib_both_ends": both,
    });
    output::end(
        &totals(ours, peer),
        cpu,
        (snd.as_deref(), rcv.as_deref()),
        zc,
    )
}

/// iperf3's closing lines: per stream and summed, sender and receiver, then zcnet's.
pub(crate) fn end_text(end: &Value) -> String {
    let mut s = String::from("- - - - - - - - - - - - - - - - - - - - - - - - -\n");
    s += "[ ID] Interval           Transfer     Bitrate         Retr\n";
    let line = |id: String, r: &Value, who: &str| {
        let secs = r["seconds"].as_f64().unwrap_or(0.0);
        format!(
            "[{id:>3}] {:>6.2}-{:<6.2} sec  {:>12}  {:>16}  {:>4}  {who}\n",
            0.0,
            secs,
            output::bytes_text(r["bytes"].as_u64().unwrap_or(0)),
            output::rate_text(r["bits_per_second"].as_f64().unwrap_or(0.0)),
            r.get("retransmits")
                .and_then(Value::as_i64)
                .map_or(String::new(), |x| x.to_string()),
        )
    };
    for st in end["streams"].as_array().into_iter().flatten() {
        let id = st["sender"]["socket"].to_string();
        s += &line(id.clone(), &st["sender"], "sender");
        s += &line(id, &st["receiver"], "receiver");
    }
    for (k, who) in [
        ("sum_sent", "sender"),
        ("sum_received", "receiver"),
        ("sum_sent_bidir_reverse", "sender (reverse)"),
        ("sum_received_bidir_reverse", "receiver (reverse)"),
    ] {
        if let Some(v) = end.get(k) {
            s += &line("SUM".into(), v, who);
        }
    }
    let z = &end["zcnet"];
    let side = |v: &Value, name: &str| -> String {
        if v.is_null() {
            return format!("zcnet {name}: (an iperf3 peer: no zcnet figures)\n");
        }
        format!(
            "zcnet {name}: tx {} rx {}  CPU {:.3} s user + {:.3} s sys = {} CPU-s/GiB  zero-copy tx {} rx {}  copied anyway {}  fallbacks {}\n",
            v["tx_paths_in_effect"],
            v["rx_paths_in_effect"],
            v["cpu_s"]["user"].as_f64().unwrap_or(0.0),
            v["cpu_s"]["sys"].as_f64().unwrap_or(0.0),
            v["cpu_s_per_gib"].as_f64().map_or("-".into(), |x| format!("{x:.3}")),
            v["zero_copy_share"]["tx"].as_f64().map_or("-".into(), |x| format!("{:.0}%", x * 100.0)),
            v["zero_copy_share"]["rx"].as_f64().map_or("-".into(), |x| format!("{:.0}%", x * 100.0)),
            v["copied_anyway_bytes"],
            v["fallbacks"],
        )
    };
    s += &side(&z["local"], "here");
    s += &side(&z["remote"], "peer");
    if let Some(b) = z["cpu_s_per_gib_both_ends"].as_f64() {
        s += &format!("zcnet both ends: {b:.3} CPU-s/GiB\n");
    }
    s
}
