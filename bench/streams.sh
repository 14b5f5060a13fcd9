#!/usr/bin/env bash
# zcnet send --streams 1 against --streams N in one sitting, loopback, runs interleaved:
# a tree of 5000 files of 4–5 KiB in 50 directories, and 1 GiB of large files (8 × 128 MiB).
# Prints each run's wall time (send start to the receiver's exit: `recv --once` ends after
# the last stream's files are verified, fsynced and renamed) and the medians.
#
#   bash bench/streams.sh [N=4] [REPEAT=5]
#
# BENCH_DIR=dir (default /var/tmp/zcnet-streams: a real disk, so fsyncs count; /dev/shm for
# tmpfs) holds the trees (made once) and the receiving directory. ZCNET=path uses that
# binary instead of building a release one. Every received tree is counted file by file;
# the transfer verifies each file's BLAKE3.
set -euo pipefail
N=${1:-4}
REPEAT=${2:-5}
B=${BENCH_DIR:-/var/tmp/zcnet-streams}
cd "$(dirname "$0")/.."
if [ -z "${ZCNET:-}" ]; then
  cargo build --release -q -p zcnet-cli
  ZCNET=$PWD/target/release/zcnet
fi
mkdir -p "$B"
python3 bench/trees.py "$B" small big
out=$(mktemp)
trap 'rm -f "$out"; rm -rf "$B/dst"' EXIT
for tree in small big; do
  want=$(find "$B/$tree" -type f | wc -l)
  for rep in $(seq "$REPEAT"); do
    for n in 1 "$N"; do
      rm -rf "$B/dst"; mkdir -p "$B/dst"
      "$ZCNET" recv --once -q --listen 127.0.0.1:0 --dir "$B/dst" &
      rp=$!
      addr=
      for _ in $(seq 100); do
        addr=$(ss -ltnpH | grep "pid=$rp," | grep -o '127.0.0.1:[0-9]*' | head -1 || true)
        [ -n "$addr" ] && break
        sleep 0.05
      done
      t0=$(date +%s.%N)
      "$ZCNET" send -q --streams "$n" --to "$addr" "$B/$tree"
      wait "$rp"
      t1=$(date +%s.%N)
      got=$(find "$B/dst" -type f | wc -l)
      [ "$got" = "$want" ] || { echo "$tree: $got of $want files arrived" >&2; exit 1; }
      echo "$tree $n $(echo "$t1 - $t0" | bc)" | tee -a "$out"
    done
  done
done
python3 - "$out" "$N" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    t, n, w = line.split()
    d[(t, int(n))].append(float(w))
n = int(sys.argv[2])
for t in ("small", "big"):
    a, b = statistics.median(d[(t, 1)]), statistics.median(d[(t, n)])
    print(f"{t}: --streams 1 median {a:.3f} s, --streams {n} median {b:.3f} s, ratio {a / b:.2f}x")
PY
