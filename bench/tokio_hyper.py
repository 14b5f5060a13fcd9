#!/usr/bin/env python3
"""The hyper example against the same server on a plain tokio TcpStream, side by side.

    cargo build --release -p zcnet-tokio --example hyper_server
    python3 bench/tokio_hyper.py [RUNS]          # default 5; needs curl

Each run starts `hyper_server --requests 1` four times in turn (`--plain`, `--copy`, the
default `auto`, `--always`) on loopback, fetches its 1 GiB body with curl (discarded), and takes
the server's process CPU (its own `getrusage(RUSAGE_SELF)` line) and the CPU of server
and curl together (this script's `RUSAGE_CHILDREN` delta: both ends, since on loopback
either end may pay the receive processing). Rows are interleaved; medians are printed with
the median of per-run ratios to the plain server; a second plain row shows the spread of
two identical configurations. `PIN=1` runs server and curl on CPU 1 (`taskset`), `PIN=split`
the server on CPU 0 and curl on CPU 1. On loopback the receive processing runs in softirq
in whichever end's context it lands, so the server's own CPU is bimodal (0.10 or 0.42
CPU-s/GiB for the very same plain server): the server+curl sum is the figure to compare. The machine this runs on is usually shared:
compare rows of one table only.
"""
import re
import resource
import statistics
import subprocess
import os
import sys
import time
from pathlib import Path

BIN = Path(__file__).resolve().parent.parent / "target/release/examples/hyper_server"
MODES = [
    ("plain TcpStream", ["--plain"]),
    ("plain TcpStream again (spread)", ["--plain"]),
    ("ZcStream --copy (no zero-copy)", ["--copy"]),
    ("ZcStream auto (default)", []),
    ("ZcStream --always", ["--always"]),
]
UNIT = {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# PIN=1: server and curl on CPU 1; PIN=split: server on CPU 0, curl on CPU 1.
PIN_MODE = os.environ.get("PIN", "")
PIN_SERVER = {"1": ["taskset", "-c", "1"], "split": ["taskset", "-c", "0"]}.get(PIN_MODE, [])
PIN_CURL = {"1": ["taskset", "-c", "1"], "split": ["taskset", "-c", "1"]}.get(PIN_MODE, [])


def one(port, flags):
    before = children_cpu()
    server = subprocess.Popen(
        [*PIN_SERVER, str(BIN), "--addr", f"127.0.0.1:{port}", "--requests", "1", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(0.5)
    curl = subprocess.run(
        [*PIN_CURL, "curl", "-s", "-o", "/dev/null", "-w", "%{size_download}", f"http://127.0.0.1:{port}/"],
        capture_output=True, text=True, check=True)
    out, _ = server.communicate(timeout=300)
    both = children_cpu() - before
    gib = int(curl.stdout) / 2**30
    m = re.search(r"user: ([0-9.]+)(\D+?), sys: ([0-9.]+)(\D+?)[,}]", out)
    if not m or gib == 0:
        sys.exit(f"no CPU line or no body from the server:\n{out}")
    server_cpu = float(m.group(1)) * UNIT[m.group(2).strip()] + float(m.group(3)) * UNIT[m.group(4).strip()]
    stats = next((l for l in out.splitlines() if "sent" in l), "")
    return server_cpu / gib, both / gib, stats


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    res = {name: [] for name, _ in MODES}
    port = 18180
    for _ in range(runs):
        for name, flags in MODES:
            port += 1
            res[name].append(one(port, flags))
    pinned = {"1": ", server and curl on CPU 1", "split": ", server on CPU 0, curl on CPU 1"}.get(PIN_MODE, "")
    print(f"hyper_server, 1 GiB to curl on loopback{pinned}, {runs} interleaved runs (shared machine)\n")
    print("Ratios are medians of per-run ratios to that run's first plain row; the second plain")
    print("row is the spread of two identical configurations in the same sitting.\n")
    print("| server | server CPU-s/GiB (runs) | median | × plain | server+curl CPU-s/GiB | × plain |")
    print("|---|---|---:|---:|---:|---:|")
    base = res[MODES[0][0]]
    for name, _ in MODES:
        s = [r[0] for r in res[name]]
        b = [r[1] for r in res[name]]
        ratio = statistics.median(x[0] / p[0] for x, p in zip(res[name], base))
        ratio_both = statistics.median(x[1] / p[1] for x, p in zip(res[name], base))
        print(f"| {name} | {', '.join(f'{x:.3f}' for x in s)} | {statistics.median(s):.3f} | "
              f"{ratio:.2f} | {statistics.median(b):.3f} | {ratio_both:.2f} |")
    for name, _ in MODES[2:]:
        print(f"\n{name}, last run: {res[name][-1][2]}")


if __name__ == "__main__":
    main()
