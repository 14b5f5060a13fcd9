#!/usr/bin/env bash
# zcnet send --streams 1 against 2 against 4 in one sitting, runs interleaved (1 2 4 1 2 4 …):
# one 1 GiB file (split into ranges from protocol version 6) and a tree of 5000 files of
# 4–5 KiB in 50 directories. Prints each run's wall time (send start to the receiver's exit:
# `recv --once` ends after the last file is verified, fsynced and renamed) and both ends' CPU
# seconds (user + system, from /usr/bin/time), then the medians and each configuration's
# wall ratio against 1 stream.
#
#   bash bench/ranges.sh [REPEAT=3]
#
# BENCH_DIR=dir (default /dev/shm/zcnet-ranges: tmpfs, so the network path and the hashing
# are measured, not the disk; /var/tmp/... for the real disk) holds the sources (made once)
# and the receiving directory. NETNS=1 runs the receiver in a network namespace of its own
# across a veth pair (MTU ${MTU:-1500}) instead of loopback (needs root and `ip`; the pair is
# removed on exit). ZCNET=path uses that binary instead of building a release one. Every
# received file is counted; the transfer verifies each file's BLAKE3. CASES="one" or
# CASES="small" runs one of the two.
set -euo pipefail
REPEAT=${1:-3}
B=${BENCH_DIR:-/dev/shm/zcnet-ranges}
cd "$(dirname "$0")/.."
if [ -z "${ZCNET:-}" ]; then
  cargo build --release -q -p zcnet-cli
  ZCNET=$PWD/target/release/zcnet
fi
mkdir -p "$B"
python3 bench/trees.py "$B" small one
out=$(mktemp)
NS_A= NS_B=
cleanup() {
  rm -f "$out" "$out".s "$out".r
  rm -rf "$B/dst"
  if [ -n "$NS_A" ]; then ip netns del "$NS_A" 2>/dev/null || true; fi
  if [ -n "$NS_B" ]; then ip netns del "$NS_B" 2>/dev/null || true; fi
}
trap cleanup EXIT
IN_A=() IN_B=() LISTEN=127.0.0.1:0 HOST=127.0.0.1
if [ "${NETNS:-0}" = 1 ]; then
  NS_A=zcr-a-$$ NS_B=zcr-b-$$
  ip netns add "$NS_A"; ip netns add "$NS_B"
  ip link add zcra$$ type veth peer name zcrb$$
  ip link set zcra$$ netns "$NS_A"; ip link set zcrb$$ netns "$NS_B"
  ip -n "$NS_A" addr add 10.231.$(($$ % 250)).1/24 dev zcra$$
  ip -n "$NS_B" addr add 10.231.$(($$ % 250)).2/24 dev zcrb$$
  for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
  ip -n "$NS_A" link set zcra$$ mtu "${MTU:-1500}" up
  ip -n "$NS_B" link set zcrb$$ mtu "${MTU:-1500}" up
  IN_A=(ip netns exec "$NS_A") IN_B=(ip netns exec "$NS_B")
  HOST=10.231.$(($$ % 250)).2 LISTEN=$HOST:0
fi
for tree in ${CASES:-one small}; do
  want=$(find "$B/$tree" -type f | wc -l)
  for rep in $(seq "$REPEAT"); do
    for n in 1 2 4; do
      rm -rf "$B/dst"; mkdir -p "$B/dst"
      "${IN_B[@]}" /usr/bin/time -f "%U %S" -o "$out".r \
        "$ZCNET" recv --once -q --listen "$LISTEN" --dir "$B/dst" &
      rp=$!
      # This run's own listener (by the receiver's pid), never another one on the host.
      addr= zp=
      for _ in $(seq 100); do
        zp=${zp:-$(pgrep -P "$rp" -x zcnet || true)}
        if [ -n "$zp" ]; then
          addr=$("${IN_B[@]}" ss -ltnpH | grep "pid=$zp," | grep -o "$HOST:[0-9]*" | head -1 || true)
        fi
        [ -n "$addr" ] && break
        sleep 0.05
      done
      [ -n "$addr" ] || { echo "the receiver did not listen" >&2; exit 1; }
      t0=$(date +%s.%N)
      "${IN_A[@]}" /usr/bin/time -f "%U %S" -o "$out".s \
        timeout 300 "$ZCNET" send -q --streams "$n" --to "$addr" "$B/$tree"
      wait "$rp"
      t1=$(date +%s.%N)
      got=$(find "$B/dst" -type f | wc -l)
      [ "$got" = "$want" ] || { echo "$tree: $got of $want files arrived" >&2; exit 1; }
      s=$(awk '{print $1 + $2}' "$out".s); r=$(awk '{print $1 + $2}' "$out".r)
      echo "$tree $n $(echo "$t1 - $t0" | bc) $s $r" | tee -a "$out"
    done
  done
done
python3 - "$out" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    t, n, w, s, r = line.split()
    d[(t, int(n))].append((float(w), float(s), float(r)))
# Each repetition ran 1, 2 and 4 streams back to back: the ratio within a repetition is
# less disturbed by the load of the moment than a ratio of medians.
pairs = {(t, n): statistics.median(a[0] / b[0] for a, b in zip(d[(t, 1)], d[(t, n)]))
         for (t, n) in d}
for t in [c for c in ("one", "small") if (c, 1) in d]:
    base = statistics.median(x[0] for x in d[(t, 1)])
    for n in (1, 2, 4):
        m = [statistics.median(x[i] for x in d[(t, n)]) for i in range(3)]
        spread = max(x[0] for x in d[(t, n)]) - min(x[0] for x in d[(t, n)])
        print(f"{t} --streams {n}: wall {m[0]:.3f} s (spread {spread:.3f}), "
              f"sender CPU {m[1]:.2f} s, receiver CPU {m[2]:.2f} s, "
              f"wall ratio vs 1 stream {base / m[0]:.2f}x (median of per-repetition "
              f"ratios {pairs[(t, n)]:.2f}x)")
PY
