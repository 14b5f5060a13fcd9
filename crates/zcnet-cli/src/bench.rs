//! `zcnet bench`: ttcp-style memory-to-memory transfers over loopback, every transmit path
//! against every receive path, reporting what the papers judged zero-copy by — CPU seconds
//! per GiB at both ends and system-wide (softirq included) — beside throughput and the share
//! of bytes that really went without a copy. Runs of one configuration are repeated and the
//! median is reported; compare rows of one run, not across runs (2 shared cores here).

use serde::Serialize;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Instant;
use zcnet::conn::Listener;
use zcnet::cpu::{thread_rusage, CpuSeconds, SystemCpu};
use zcnet::{Policy, ReceiverConfig, RxPath, Sender, SenderConfig, StatsSnapshot, TxPath};

/// Options of `zcnet bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Transmit paths: a comma-separated list, or `all`.
    #[arg(long, default_value = "all")]
    tx: String,
    /// Receive paths: a comma-separated list, or `all`.
    #[arg(long, default_value = "all")]
    rx: String,
    /// Bytes per send (suffixes K, M, G).
    #[arg(long, default_value = "256K", value_parser = parse_size)]
    size: u64,
    /// Bytes per run (suffixes K, M, G).
    #[arg(long, default_value = "512M", value_parser = parse_size)]
    bytes: u64,
    /// Runs per configuration; the median is reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Parses `4096`, `64K`, `1M`, `2G` (binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(format!("unknown size suffix in {s:?} (use K, M or G)")),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("not a size: {s:?} (examples: 4096, 64K, 1M)"))?;
    n.checked_mul(mult)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("size out of range: {s:?}"))
}

fn parse_list<T: std::str::FromStr<Err = String> + Copy>(
    s: &str,
    all: &[T],
) -> Result<Vec<T>, String> {
    if s == "all" {
        return Ok(all.to_vec());
    }
    s.split(',').map(|p| p.trim().parse()).collect()
}

#[derive(Debug, Clone, Serialize)]
struct Side {
    user: f64,
    sys: f64,
}

#[derive(Debug, Clone, Serialize)]
struct SystemSide {
    user: f64,
    sys: f64,
    softirq: f64,
}

#[derive(Debug, Clone, Serialize)]
struct Cpu {
    sender: Side,
    receiver: Side,
    system: SystemSide,
}

/// One measured transfer, in the schema `--json` prints.
#[derive(Debug, Clone, Serialize)]
struct Run {
    tx: TxPath,
    rx: RxPath,
    topology: &'static str,
    size: u64,
    streams: u32,
    bytes_sent: u64,
    bytes_received: u64,
    seconds: f64,
    gbit_per_s: f64,
    cpu: Cpu,
    /// System-wide busy CPU seconds (user+sys+irq+softirq) per GiB moved.
    cpu_s_per_gib: f64,
    sender_cpu_s_per_gib: f64,
    receiver_cpu_s_per_gib: f64,
    zc_fraction_tx: f64,
    zc_fraction_rx: f64,
    fallbacks: std::collections::BTreeMap<&'static str, u64>,
}

fn side(c: CpuSeconds) -> Side {
    Side {
        user: c.user,
        sys: c.sys,
    }
}

fn one_run(tx: TxPath, rx: RxPath, size: u64, bytes: u64) -> Result<Run, String> {
    let rcfg = ReceiverConfig::new(rx);
    let listener = Listener::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0), &rcfg)
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let mut scfg = SenderConfig::new(tx);
    scfg.policy = Policy::always();
    scfg.buf_size = size as usize;
    scfg.pool_buffers = ((16 << 20) / size).clamp(4, 256) as usize;
    let sys0 = SystemCpu::now().ok_or("cannot read /proc/stat")?;
    let start = Instant::now();
    let (sent, rcvd) = std::thread::scope(|s| {
        let r = s.spawn(|| -> Result<(u64, CpuSeconds, StatsSnapshot), String> {
            let mut rxc = listener.accept().map_err(|e| e.to_string())?;
            let t0 = thread_rusage().map_err(|e| e.to_string())?;
            let mut n = 0u64;
            while let Some(chunk) = rxc.recv().map_err(|e| e.to_string())? {
                n += chunk.len() as u64;
            }
            let t1 = thread_rusage().map_err(|e| e.to_string())?;
            Ok((n, CpuSeconds::between(t0, t1), rxc.stats().snapshot()))
        });
        let t = s.spawn(|| -> Result<(u64, CpuSeconds, StatsSnapshot), String> {
            let t0 = thread_rusage().map_err(|e| e.to_string())?;
            let mut txc = Sender::connect(addr, &scfg).map_err(|e| e.to_string())?;
            let mut pos = 0u64;
            while pos < bytes {
                let mut b = txc.buffer().map_err(|e| e.to_string())?;
                let n = (b.capacity() as u64).min(bytes - pos).min(size) as usize;
                b.set_len(n);
                txc.send(b).map_err(|e| e.to_string())?;
                pos += n as u64;
            }
            let st = txc.finish().map_err(|e| e.to_string())?;
            let t1 = thread_rusage().map_err(|e| e.to_string())?;
            Ok((pos, CpuSeconds::between(t0, t1), st))
        });
        (
            t.join()
                .unwrap_or_else(|_| Err("sender thread panicked".into())),
            r.join()
                .unwrap_or_else(|_| Err("receiver thread panicked".into())),
        )
    });
    let seconds = start.elapsed().as_secs_f64();
    let sys = SystemCpu::now()
        .ok_or("cannot read /proc/stat")?
        .since(&sys0);
    let (bytes_sent, scpu, sst) = sent?;
    let (bytes_received, rcpu, rst) = rcvd?;
    if bytes_sent != bytes_received {
        return Err(format!(
            "{tx}->{rx}: sent {bytes_sent} bytes but received {bytes_received}"
        ));
    }
    let gib = bytes_received as f64 / (1u64 << 30) as f64;
    let mut fallbacks = std::collections::BTreeMap::new();
    for (reason, _, b) in sst.fallbacks.iter().chain(rst.fallbacks.iter()) {
        *fallbacks.entry(reason.name()).or_insert(0) += b;
    }
    Ok(Run {
        tx,
        rx,
        topology: "loopback",
        size,
        streams: 1,
        bytes_sent,
        bytes_received,
        seconds,
        gbit_per_s: bytes_received as f64 * 8.0 / seconds / 1e9,
        cpu: Cpu {
            sender: side(scpu),
            receiver: side(rcpu),
            system: SystemSide {
                user: sys.user,
                sys: sys.sys + sys.irq,
                softirq: sys.softirq,
            },
        },
        cpu_s_per_gib: sys.busy() / gib,
        sender_cpu_s_per_gib: scpu.total() / gib,
        receiver_cpu_s_per_gib: rcpu.total() / gib,
        zc_fraction_tx: sst.tx_zerocopy_fraction(),
        zc_fraction_rx: rst.rx_mapped_fraction(),
        fallbacks,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[derive(Serialize)]
struct Host {
    kernel: String,
    cpus: usize,
}

#[derive(Serialize)]
struct Report {
    schema: u32,
    host: Host,
    runs: Vec<Run>,
}

/// Runs the benchmark.
pub fn run(args: &Args) -> Result<(), String> {
    let txs = parse_list(&args.tx, &TxPath::ALL)?;
    let rxs = parse_list(&args.rx, &RxPath::ALL)?;
    if args.repeat == 0 {
        return Err("--repeat must be at least 1".into());
    }
    let mut runs = Vec::new();
    let mut rows = Vec::new();
    for &tx in &txs {
        for &rx in &rxs {
            let mut set = Vec::new();
            for _ in 0..args.repeat {
                set.push(one_run(tx, rx, args.size, args.bytes)?);
            }
            let m = |f: fn(&Run) -> f64| median(set.iter().map(f).collect());
            rows.push((
                tx,
                rx,
                m(|r| r.gbit_per_s),
                m(|r| r.sender_cpu_s_per_gib),
                m(|r| r.receiver_cpu_s_per_gib),
                m(|r| r.cpu_s_per_gib),
                m(|r| r.zc_fraction_tx),
                m(|r| r.zc_fraction_rx),
            ));
            runs.extend(set);
        }
    }
    if args.json {
        let report = Report {
            schema: 1,
            host: Host {
                kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default(),
                cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            },
            runs,
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    println!(
        "loopback, {} B per send, {} per run, median of {}; CPU in seconds per GiB moved",
        args.size,
        human(args.bytes),
        args.repeat
    );
    println!(
        "{:<9} {:<5} {:>8} {:>9} {:>9} {:>11} {:>7} {:>8}",
        "tx", "rx", "Gbit/s", "snd cpu", "rcv cpu", "system cpu", "tx zc%", "rx map%"
    );
    for r in &rows {
        println!(
            "{:<9} {:<5} {:>8.1} {:>9.3} {:>9.3} {:>11.3} {:>7.1} {:>8.1}",
            r.0.name(),
            r.1.name(),
            r.2,
            r.3,
            r.4,
            r.5,
            r.6 * 100.0,
            r.7 * 100.0
        );
    }
    if let Some(best) = rows.iter().min_by(|a, b| a.5.total_cmp(&b.5)) {
        println!(
            "verdict: {} -> {} moves a GiB for the least CPU here ({:.3} CPU-s/GiB system-wide at {} B sends); \
             \"tx zc%\" is the share the kernel did not copy anyway.",
            best.0, best.1, best.5, args.size
        );
    }
    Ok(())
}

fn human(n: u64) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n => format!("{n} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes_and_reject_nonsense() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert!(parse_size("0").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("K").is_err());
        assert!(parse_size("99999999999G").is_err());
    }

    #[test]
    fn path_lists_parse() {
        assert_eq!(
            parse_list("all", &TxPath::ALL).unwrap(),
            TxPath::ALL.to_vec()
        );
        assert_eq!(
            parse_list("zerocopy", &TxPath::ALL).unwrap(),
            vec![TxPath::Zerocopy]
        );
        assert!(parse_list::<RxPath>("mmap,bogus", &RxPath::ALL)
            .unwrap_err()
            .contains("bogus"));
    }

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn a_short_run_moves_every_byte_and_measures_cpu() {
        let r = one_run(TxPath::Zerocopy, RxPath::Mmap, 64 << 10, 16 << 20).unwrap();
        assert_eq!(r.bytes_sent, 16 << 20);
        assert_eq!(r.bytes_received, 16 << 20);
        assert!(r.seconds > 0.0 && r.gbit_per_s.is_finite());
        assert!(r.cpu.sender.user + r.cpu.sender.sys >= 0.0);
        let json = serde_json::to_value(&r).unwrap();
        for k in [
            "tx",
            "rx",
            "bytes_sent",
            "cpu",
            "cpu_s_per_gib",
            "zc_fraction_tx",
        ] {
            assert!(json.get(k).is_some(), "{k} missing");
        }
    }
}
