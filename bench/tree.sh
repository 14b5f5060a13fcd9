#!/usr/bin/env bash
# A tree of many small files through `zcnet send` → `zcnet recv` on loopback, wall time only.
#
#   bash bench/tree.sh [FILES=2000] [DIRS=20] [REPEAT=3] [BIN=target/debug/zcnet]
#
# FILES files of 4–5 KiB (random contents) in DIRS directories on tmpfs (/dev/shm), so the
# disk is out of the picture. Prints each run's wall time and the median; every received
# file is compared with its source. The receiver binds 127.0.0.1 on a free port.
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${1:-2000}
DIRS=${2:-20}
REPEAT=${3:-3}
Z=${4:-target/debug/zcnet}
Z=$(realpath "$Z")
work=$(mktemp -d /dev/shm/zcnet-tree.XXXXXX)
rpid=
cleanup() { [ -n "$rpid" ] && kill "$rpid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
python3 - "$work/src" "$FILES" "$DIRS" <<'PY'
import os, random, sys
root, n, d = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    p = os.path.join(root, f"d{i % d:03}")
    os.makedirs(p, exist_ok=True)
    with open(os.path.join(p, f"f{i:05}.bin"), "wb") as f:
        f.write(os.urandom(random.randint(4096, 5120)))
PY
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
times=()
for i in $(seq "$REPEAT"); do
  rm -rf "$work/dst"; mkdir "$work/dst"
  p=$(port)
  "$Z" recv --once --quiet --dir "$work/dst" --listen "127.0.0.1:$p" & rpid=$!
  for _ in $(seq 50); do ss -ltn "sport = :$p" | grep -q LISTEN && break; sleep 0.05; done
  t0=$(date +%s.%N)
  "$Z" send --quiet "$work/src" --to "127.0.0.1:$p"
  wait "$rpid"; rpid=
  t1=$(date +%s.%N)
  diff -r "$work/src" "$work/dst/src" >/dev/null || { echo "received tree differs!" >&2; exit 1; }
  t=$(echo "$t1 - $t0" | bc -l); times+=("$t")
  printf "run %d: %.3f s\n" "$i" "$t"
done
printf "%s\n" "${times[@]}" | sort -n | awk -v n="$FILES" -v z="$Z" '{a[NR]=$1} END{printf "median of %d: %.3f s for %d files (%s)\n", NR, a[int((NR+1)/2)], n, z}'
