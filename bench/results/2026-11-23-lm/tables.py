#!/usr/bin/env python3
"""Tables for issue 8 from run.sh's JSON: medians over repeats, per transport and size."""
import gzip
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

D = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
LABEL = {
    ("plain", "copy"): "plain UDP",
    ("plain", "gro"): "plain+GRO",
    ("zerocopy", "copy"): "GSO+zc",
    ("zerocopy", "gro"): "GSO/GRO+zc",
    ("lm", "lm"): "LM",
    ("copy", "none"): "GSO copy",
    ("zerocopy", "none"): "GSO zerocopy",
}
KEEP = ["plain UDP", "GSO/GRO+zc", "LM"]


def size_name(n):
    for unit, k in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return str(n)


def groups(path):
    f = D / path
    text = f.read_text() if f.exists() else gzip.decompress((D / (path + ".gz")).read_bytes())
    runs = json.loads(text)["runs"]
    g = defaultdict(list)
    for r in runs:
        g[(LABEL.get((r["tx"], r["rx"]), f'{r["tx"]}->{r["rx"]}'), r["size"])].append(r)
    return g


def med(rs, f):
    vals = [f(r) for r in rs]
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else float("nan")


def rr():
    g = groups("rr.json")
    sizes = sorted({s for _, s in g})
    print("NetPIPE ping-pong over netns (veth, MTU 1500), median of 3 runs of 0.5 s")
    print("round trip p50 / p99 in µs, bandwidth = 2 × size / p50 round trip in Mbit/s")
    head = f'{"size":>6} ' + " ".join(f"{k:>28}" for k in KEEP)
    print(head)
    for s in sizes:
        cells = []
        for k in KEEP:
            rs = g.get((k, s), [])
            p50 = med(rs, lambda r: r["latency"]["rtt"]["p50_us"])
            p99 = med(rs, lambda r: r["latency"]["rtt"]["p99_us"])
            bw = 2 * s * 8 / p50 if p50 == p50 and p50 > 0 else float("nan")
            cells.append(f"{p50:8.1f} /{p99:8.1f} {bw:9.1f}")
        print(f"{size_name(s):>6} " + " ".join(f"{c:>28}" for c in cells))
    print()


def stream():
    g = groups("stream.json")
    sizes = sorted({s for _, s in g})
    print("Streams over netns (veth, MTU 1500), median of 3 runs of 0.5 s; every byte verified")
    print("Gbit/s, sender + receiver worker CPU-s/GiB, loss %")
    head = f'{"size":>6} ' + " ".join(f"{k:>26}" for k in KEEP)
    print(head)
    for s in sizes:
        cells = []
        for k in KEEP:
            rs = g.get((k, s), [])
            gb = med(rs, lambda r: r["gbit_per_s"])
            snd = med(rs, lambda r: r["sender_cpu_s_per_gib"])
            rcv = med(rs, lambda r: r["receiver_cpu_s_per_gib"])
            loss = med(rs, lambda r: 100.0 * r["messages_lost"] / max(r["messages_sent"], 1))
            cells.append(f"{gb:6.2f} {snd:6.2f}+{rcv:6.2f} {loss:4.1f}")
        print(f"{size_name(s):>6} " + " ".join(f"{c:>26}" for c in cells))
    print()


def sink():
    for path, what in (
        ("sink-msg.json", "zcnet::msg's sender, default ring"),
        ("sink-raw.json", "the raw GSO sender, default ring"),
        ("sink-msg-cold.json", "zcnet::msg's sender, 4096 × 64K ring"),
        ("sink-msg-cold1m.json", "zcnet::msg's sender, 256 × 1M ring"),
        ("sink-raw-cold.json", "the raw GSO sender, 4096 × 63K ring"),
    ):
        g = groups(path)
        print(f"Sink (transmit only, {what}), median of 5 runs of 1 s: sender CPU-s/GiB")
        for s in sorted({s for _, s in g}):
            c = med(g.get(("GSO copy", s), []), lambda r: r["sender_cpu_s_per_gib"])
            z = med(g.get(("GSO zerocopy", s), []), lambda r: r["sender_cpu_s_per_gib"])
            zf = med(g.get(("GSO zerocopy", s), []), lambda r: r["zc_fraction_tx"])
            print(
                f"  {size_name(s):>4}: copy {c:.3f}  zerocopy {z:.3f}  ratio zc/copy {z / c:.2f}"
                f"  (zc share of bytes {zf:.2f})"
            )
        print()


def ratios():
    """LM and GSO/GRO+zc against plain UDP, per size, from the same runs (the numbers to
    quote: absolute times on this shared 2-vCPU VM move from run to run, ratios less)."""
    rr_g, st_g = groups("rr.json"), groups("stream.json")
    sizes = sorted({s for _, s in st_g})
    print("Ratios to plain UDP, same sweep (below 1: less time or CPU than plain UDP)")
    print(f'{"size":>6} {"LM rr p50":>10} {"LM CPU/GiB":>11} {"LM Gbit/s":>10}'
          f' {"GSO rr p50":>11} {"GSO CPU/GiB":>12} {"GSO Gbit/s":>11}')

    def cpu(rs):
        return med(rs, lambda r: r["sender_cpu_s_per_gib"] + r["receiver_cpu_s_per_gib"])

    for s in sizes:
        p50 = {k: med(rr_g.get((k, s), []), lambda r: r["latency"]["rtt"]["p50_us"]) for k in KEEP}
        c = {k: cpu(st_g.get((k, s), [])) for k in KEEP}
        g = {k: med(st_g.get((k, s), []), lambda r: r["gbit_per_s"]) for k in KEEP}
        base = "plain UDP"

        def q(d, k):
            return d[k] / d[base] if d[base] else float("nan")

        print(f"{size_name(s):>6} {q(p50, 'LM'):10.2f} {q(c, 'LM'):11.2f} {q(g, 'LM'):10.2f}"
              f" {q(p50, 'GSO/GRO+zc'):11.2f} {q(c, 'GSO/GRO+zc'):12.2f} {q(g, 'GSO/GRO+zc'):11.2f}")
    print()


rr()
stream()
ratios()
sink()
