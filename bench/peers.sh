#!/usr/bin/env bash
# zcnet bench beside its peers, in one sitting, on the same topology (loopback):
#   iperf3 (default, and -Z: sendfile), netperf (TCP_STREAM, TCP_SENDFILE, -c -C), and
#   zcnet bench (copy→copy, zerocopy→copy, and the rest of its transmit paths).
# Rounds are interleaved (every tool once per round, ROUNDS rounds) and medians reported,
# because this machine's throughput swings by ±20-30 % from one minute to the next.
#
# CPU-s/GiB, per tool:
#   iperf3  — end.cpu_utilization_percent.{host,remote}_total are each process's
#             getrusage(RUSAGE_SELF) user+sys as a percentage of one CPU over the test, so
#             CPU-s = pct/100 × seconds, divided by the GiB received. snd = client (sender),
#             rcv = server (receiver).
#   netperf — service demand (us/KB, KB = 1024 B) from -c -C: CPU-s/GiB = SD × 1.048576.
#             netperf measures CPU from /proc/stat, i.e. the whole machine: on loopback
#             local and remote are the same machine, so each side's SD already covers both
#             ends; compare it with zcnet's "machine" column, not with snd+rcv.
#   zcnet   — worker threads' getrusage (snd, rcv) and /proc/stat (machine), from --json.
#
# Usage: bash bench/peers.sh            (root: installs iperf3/netperf with apt-get)
#   DUR=seconds per test (default 4), ROUNDS (default 3), SIZES (default "64K 1M": bytes per
#   send, every tool, one table each), PIN=split|same|none (default split:
#   every server on CPU 0, every client on CPU 1 — where the two ends run changes
#   CPU-s/GiB by up to 1.6× on loopback, so the tools must be compared with the same
#   placement; see docs/bench.md).
set -euo pipefail
cd "$(dirname "$0")/.."

DUR=${DUR:-4}
ROUNDS=${ROUNDS:-3}
SIZES=${SIZES:-${SIZE:-64K 1M}}; export SIZES
bytes_of() { case "$1" in *K) echo $(( ${1%K} * 1024 ));; *M) echo $(( ${1%M} * 1048576 ));; *) echo "$1";; esac; }
PIN=${PIN:-split}
SRV=(); CLI=()
if have_taskset=$(command -v taskset) && [ "$(nproc)" -ge 2 ]; then
  case "$PIN" in
    split) SRV=(taskset -c 0); CLI=(taskset -c 1) ;;
    same)  SRV=(taskset -c 0); CLI=(taskset -c 0) ;;
    none)  ;;
    *) echo "peers: PIN must be split, same or none" >&2; exit 2 ;;
  esac
else
  PIN=none
fi
OUT=$(mktemp -d /tmp/zcnet-peers.XXXXXX)
PIDS=()

cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

have() { command -v "$1" >/dev/null 2>&1; }

# --- install the peers from Debian, where they exist --------------------------------------
if [ "$(id -u)" = 0 ] && have apt-get; then
  apt-get update -qq >/dev/null 2>&1 || echo "peers: apt-get update failed; using what is installed" >&2
  for pkg in iperf3 netperf; do
    cand=$(apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/ {print $2}')
    if [ -z "$cand" ] || [ "$cand" = "(none)" ]; then
      echo "peers: $pkg has no candidate in this host's apt sources$( [ "$pkg" = netperf ] && echo ' (Debian ships netperf in non-free only, not main): its rows are skipped')" >&2
    elif ! dpkg -s "$pkg" >/dev/null 2>&1; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null 2>&1 \
        || echo "peers: installing $pkg failed" >&2
    fi
  done
fi
have python3 || { echo "peers: python3 is needed to read the JSON results" >&2; exit 1; }

# --- build zcnet ---------------------------------------------------------------------------
cargo build --release -q -p zcnet-cli
ZCNET=${CARGO_TARGET_DIR:-target}/release/zcnet

# --- servers, loopback only, killed on exit --------------------------------------------------
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.1; done; return 1; }

IPERF_PORT=""
if have iperf3; then
  IPERF_PORT=$(free_port)
  "${SRV[@]}" iperf3 -s -B 127.0.0.1 -p "$IPERF_PORT" >/dev/null 2>&1 &
  PIDS+=($!)
  wait_port "$IPERF_PORT" || { echo "peers: iperf3 server did not start" >&2; IPERF_PORT=""; }
fi
NETPERF_PORT=""
if have netperf && have netserver; then
  NETPERF_PORT=$(free_port)
  "${SRV[@]}" netserver -D -L 127.0.0.1 -p "$NETPERF_PORT" >/dev/null 2>&1 &
  PIDS+=($!)
  wait_port "$NETPERF_PORT" || { echo "peers: netserver did not start" >&2; NETPERF_PORT=""; }
fi
ZC_PORT=$(free_port)
"${SRV[@]}" "$ZCNET" bench --server --bind "127.0.0.1:$ZC_PORT" >/dev/null 2>"$OUT/zcnet-server.log" &
PIDS+=($!)
wait_port "$ZC_PORT" || { echo "peers: zcnet server did not start" >&2; exit 1; }

# --- one round: every tool once --------------------------------------------------------------
# zcnet's transmit paths, as this build names them (TxPath::ALL via the error message).
ZC_TX=$("$ZCNET" bench --tx '?' 2>&1 | sed -n 's/.*known here: \([^)]*\)).*/\1/p' | tr -d ',' || true)
[ -n "$ZC_TX" ] || ZC_TX="copy zerocopy"
run_round() {
  local r=$1 SIZE SIZE_BYTES
  for SIZE in $SIZES; do
  SIZE_BYTES=$(bytes_of "$SIZE")
  if [ -n "$IPERF_PORT" ]; then
    timeout $((DUR + 20)) "${CLI[@]}" iperf3 -c 127.0.0.1 -p "$IPERF_PORT" -t "$DUR" -l "$SIZE" -J \
      >"$OUT/$SIZE-iperf3-default-$r.json" 2>/dev/null || true
    timeout $((DUR + 20)) "${CLI[@]}" iperf3 -c 127.0.0.1 -p "$IPERF_PORT" -t "$DUR" -l "$SIZE" -Z -J \
      >"$OUT/$SIZE-iperf3-Z-$r.json" 2>/dev/null || true
  fi
  if [ -n "$NETPERF_PORT" ]; then
    for t in TCP_STREAM TCP_SENDFILE; do
      timeout $((DUR + 20)) "${CLI[@]}" netperf -H 127.0.0.1 -p "$NETPERF_PORT" -l "$DUR" -t "$t" -c -C -P 0 \
        -- -m "$SIZE_BYTES" -o THROUGHPUT,LOCAL_SD,REMOTE_SD,LOCAL_CPU_UTIL,REMOTE_CPU_UTIL \
        >"$OUT/$SIZE-netperf-$t-$r.txt" 2>/dev/null || true
    done
  fi
  # zcnet: every transmit path (file included) into copy, with one hot buffer like
  # iperf3's; auto→auto as a user gets it; copy→copy with the default ring.
  for tx in $ZC_TX; do
    timeout $((DUR + 60)) "${CLI[@]}" "$ZCNET" bench --client "127.0.0.1:$ZC_PORT" --tx "$tx" --rx copy \
      --size "$SIZE" --time "$DUR" --repeat 1 --ring 1 --json \
      >"$OUT/$SIZE-zcnet-$tx-ring1-$r.json" 2>/dev/null || rm -f "$OUT/$SIZE-zcnet-$tx-ring1-$r.json"
  done
  # The file path as `iperf3 -Z` sends: one block of page cache, sent again and again
  # (`--file-window`); the `file` row above sends from a 64 MiB window, cache-cold.
  if [[ " $ZC_TX " == *" file "* ]]; then
    timeout $((DUR + 60)) "${CLI[@]}" "$ZCNET" bench --client "127.0.0.1:$ZC_PORT" --tx file --rx copy \
      --size "$SIZE" --time "$DUR" --repeat 1 --file-window "$SIZE" --json \
      >"$OUT/$SIZE-zcnet-file-block-$r.json" 2>/dev/null || rm -f "$OUT/$SIZE-zcnet-file-block-$r.json"
  fi
  timeout $((DUR + 60)) "${CLI[@]}" "$ZCNET" bench --client "127.0.0.1:$ZC_PORT" --tx auto --rx auto \
    --size "$SIZE" --time "$DUR" --repeat 1 --json \
    >"$OUT/$SIZE-zcnet-auto-autorx-$r.json" 2>/dev/null || rm -f "$OUT/$SIZE-zcnet-auto-autorx-$r.json"
  timeout $((DUR + 60)) "${CLI[@]}" "$ZCNET" bench --client "127.0.0.1:$ZC_PORT" --tx copy --rx copy \
    --size "$SIZE" --time "$DUR" --repeat 1 --json \
    >"$OUT/$SIZE-zcnet-copy-ringdefault-$r.json" 2>/dev/null || true
  done
}

echo "peers: $ROUNDS rounds of ${DUR}s tests, sizes $SIZES, loopback, placement $PIN; raw results in $OUT" >&2
for r in $(seq "$ROUNDS"); do
  echo "peers: round $r/$ROUNDS" >&2
  run_round "$r"
done

# --- one table -------------------------------------------------------------------------------
python3 - "$OUT" "$ROUNDS" "$PIN" "$ZC_TX" "$SIZES" <<'PY'
import glob, json, os, statistics, sys
out, rounds, pin, zc_tx, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].split(), sys.argv[5].split()
GIB = 2**30

def med(v):
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else None

def rng(v):
    v = [x for x in v if x is not None]
    return (min(v), max(v)) if len(v) > 1 else None

def fmt(x, p=3):
    return "-" if x is None else f"{x:.{p}f}"

placement = {"split": "servers on CPU 0, clients on CPU 1", "same": "everything on CPU 0", "none": "placement left to the scheduler"}[pin]
for size in sizes:
    rows = []  # (tool, test, [gbit], [snd], [rcv], [machine], note)

    def iperf(name, label, note):
        g, s, r = [], [], []
        for f in sorted(glob.glob(f"{out}/{size}-iperf3-{name}-*.json")):
            try:
                e = json.load(open(f))["end"]
                c = e["cpu_utilization_percent"]
                secs = e["sum_sent"]["seconds"]
                gib = e["sum_received"]["bytes"] / GIB
                g.append(e["sum_received"]["bits_per_second"] / 1e9)
                s.append(c["host_total"] / 100 * secs / gib)
                r.append(c["remote_total"] / 100 * secs / gib)
            except Exception:
                pass
        if g:
            rows.append(("iperf3", label, g, s, r, [None], note))

    def netperf(test, label, note):
        g, m = [], []
        for f in sorted(glob.glob(f"{out}/{size}-netperf-{test}-*.txt")):
            try:
                vals = [float(x) for x in open(f).read().strip().split(",")[:3]]
                g.append(vals[0] / 1e3)          # 10^6 bits/s -> Gbit/s
                m.append(vals[1] * 1.048576)     # local SD us/KB -> CPU-s/GiB (whole machine)
            except Exception:
                pass
        if g:
            rows.append(("netperf", label, g, [None], [None], m, note))

    def zcnet(tx, ring, label, note):
        g, s, r, m = [], [], [], []
        for f in sorted(glob.glob(f"{out}/{size}-zcnet-{tx}-{ring}-*.json")):
            try:
                run = json.load(open(f))["runs"][0]
                g.append(run["gbit_per_s"]); s.append(run["sender_cpu_s_per_gib"])
                r.append(run["receiver_cpu_s_per_gib"]); m.append(run["cpu_s_per_gib"])
            except Exception:
                pass
        if g:
            rows.append(("zcnet", label, g, s, r, m, note))

    iperf("default", "TCP, send()", "process CPU (getrusage), one hot buffer")
    iperf("Z", "TCP, -Z sendfile", "process CPU")
    netperf("TCP_STREAM", "TCP_STREAM", "machine CPU from service demand")
    netperf("TCP_SENDFILE", "TCP_SENDFILE", "machine CPU from service demand")
    for tx in zc_tx:
        zcnet(tx, "ring1", f"{tx}→copy, ring 1", "worker threads; one hot buffer like iperf3" if tx != "file" else "worker threads; sendfile from a 64 MiB page-cache file")
    zcnet("file", "block", "file→copy, one block", "worker threads; sendfile of one block again and again, as iperf3 -Z")
    zcnet("auto", "autorx", "auto→auto", "worker threads; what a user gets (profile if tuned)")
    zcnet("copy", "ringdefault", "copy→copy, ring 16 MiB", "a ring of buffers (cache-cold source)")

    print(f"\nloopback, {size} per send, {placement}, medians of {rounds} interleaved rounds (min–max of snd+rcv in brackets)")
    print(f"{'tool':<8} {'test':<24} {'Gbit/s':>7} {'snd':>7} {'rcv':>7} {'snd+rcv':>16} {'machine':>8}  note")
    res = {}
    for tool, test, g, s, r, m, note in rows:
        sr = [a + b for a, b in zip(s, r) if a is not None and b is not None]
        span = rng(sr)
        srs = fmt(med(sr)) + (f" [{span[0]:.3f}–{span[1]:.3f}]" if span else "")
        print(f"{tool:<8} {test:<24} {fmt(med(g),1):>7} {fmt(med(s)):>7} {fmt(med(r)):>7} {srs:>16} {fmt(med(m)):>8}  {note}")
        res[(tool, test)] = med(sr)
    print("CPU columns: CPU-seconds per GiB received (snd = sending side, rcv = receiving side); lower is better.")
    def ratio(a_key, b_key, goal, label=None):
        a, b = res.get(a_key), res.get(b_key)
        if a and b:
            # Efficiency ratio: GiB per CPU-second of a over b = b / a (CPU-s/GiB).
            said = f"goal ≥ {goal}" if goal else "for reference"
            print(f"{label or a_key[1] + ' vs ' + b_key[0] + ' ' + b_key[1]}: {a:.3f} vs {b:.3f} CPU-s/GiB, efficiency {b/a:.2f}× ({said})")
    ratio(("zcnet", "copy→copy, ring 1"), ("iperf3", "TCP, send()"), "0.95")
    # Like for like: both send one hot block of page cache by sendfile. The 64 MiB window's
    # row is shown against it too, as the cache-cold case (no goal).
    ratio(("zcnet", "file→copy, one block"), ("iperf3", "TCP, -Z sendfile"), "1.00")
    ratio(("zcnet", "file→copy, ring 1"), ("iperf3", "TCP, -Z sendfile"), None,
          "file→copy from a 64 MiB window (cache-cold) vs iperf3 -Z")
    zc = {k: v for k, v in res.items() if k[0] == "zcnet" and v}
    peers = {k: v for k, v in res.items() if k[0] != "zcnet" and v}
    if zc and peers:
        bz, bp = min(zc, key=zc.get), min(peers, key=peers.get)
        print(f"best zcnet row {bz[1]} ({zc[bz]:.3f}) vs best peer row {bp[0]} {bp[1]} ({peers[bp]:.3f}): efficiency {peers[bp]/zc[bz]:.2f}× (goal ≥ 1.00)")
    if not any(t == "netperf" for t, *_ in rows):
        print("netperf: not installed (Debian has it in non-free only), so no netperf rows.")
PY
