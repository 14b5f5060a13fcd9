#!/usr/bin/env bash
# zcnet send/recv against `cat FILE | nc`, an rsync daemon and scp (to a private sshd), on
# loopback, same sitting.
# Prints throughput and CPU seconds of both ends (user+sys of each side's processes, from
# /usr/bin/time) and the machine's busy time from /proc/stat (softirq included).
#
#   bash bench/transfer.sh [SIZE_MIB=2048] [REPEAT=3]
#   bash bench/transfer.sh tree [FILES=5000] [DIRS=50] [REPEAT=3]
#   bash bench/transfer.sh mixed [FILES=300] [TOTAL_MIB=1024] [REPEAT=3]
#
# The tree mode moves FILES files of 4–5 KiB in DIRS directories: zcnet send/recv against
# `tar c | nc` → `nc | tar x` and an rsync daemon (`rsync -r`), each received tree compared
# with `diff -r`. The mixed mode does the same with FILES files whose sizes are drawn
# log-uniform from 1 B to 256 MiB (one in 20 empty), in 10 directories, redrawn while the
# total would pass TOTAL_MIB (fixed seed: the same tree every run). ZCNET=path uses that zcnet binary instead of building a release one;
# BENCH_DIR=dir works there instead of /dev/shm (e.g. a real disk: then the fsyncs count).
# Source and destination live on /dev/shm (tmpfs), so the disk is out of the picture and
# every tool reads a warm page cache. Servers bind 127.0.0.1 only and are stopped after each run.
# ZCNET_BASE=path adds rows for a second zcnet binary (with and without verification) in the
# same sitting, to compare two builds side by side. In file mode 'vs nc' is the bytes moved
# per CPU-second of both ends, over `cat | nc`'s (higher is better). TOOLS="zcnet nc" runs only
# those rows (of zcnet zcnet-plaintext zcnet-noverify nc rsync scp base base-noverify); a ratio to a row left out
# prints nan. The scp row (file mode only, not in the default set) copies with
# `scp -c aes128-gcm@openssh.com` to an sshd of its own on 127.0.0.1 (its own host and client
# keys and config under the run's directory, `Subsystem sftp`, which scp's SFTP mode needs);
# 'vs scp' is scp's both-ends CPU over the tool's: bytes per CPU-second, as many times scp's.
# scp's 'rcv cpu' is its sshd's, which includes the session's sshd and sftp-server (its
# children, reaped before it stops); 'system cpu' counts them too, and is the figure to quote
# on an otherwise idle machine. SEND_ARGS="--streams 2" passes options to every zcnet row's `send` (base rows too).
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=file
if [ "${1:-}" = tree ] || [ "${1:-}" = mixed ]; then MODE=$1; shift; fi
SIZE_MIB=${1:-2048}
REPEAT=${2:-3}
if [ $MODE = tree ]; then FILES=${1:-5000}; DIRS=${2:-50}; REPEAT=${3:-3}; fi
if [ $MODE = mixed ]; then FILES=${1:-300}; TOTAL_MIB=${2:-1024}; REPEAT=${3:-3}; fi

need=()
command -v nc >/dev/null || need+=(netcat-openbsd)
command -v rsync >/dev/null || need+=(rsync)
command -v bc >/dev/null || need+=(bc)
if [[ " ${TOOLS:-} " == *" scp "* ]]; then
  command -v scp >/dev/null || need+=(openssh-client)
  [ -x /usr/sbin/sshd ] || need+=(openssh-server)
fi
[ -x /usr/bin/time ] || need+=(time)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ -n "${ZCNET:-}" ]; then Z=$(realpath "$ZCNET"); else cargo build -q --release -p zcnet-cli; Z=$PWD/target/release/zcnet; fi

work=$(mktemp -d "${BENCH_DIR:-/dev/shm}/zcnet-xfer.XXXXXX")
pids=()
cleanup() { for p in "${pids[@]:-}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
# zcnet encrypts by default (protocol 10): the receiver's key and the sender's known hosts
# live in the run's own state directory, not under $HOME ('zcnet-plaintext' is the row
# without TLS, both ends asking for it).
export XDG_STATE_HOME=${XDG_STATE_HOME:-$work/state}
src=$work/src.bin
if [ $MODE = tree ]; then
  src=$work/tree
  python3 - "$src" "$FILES" "$DIRS" <<'PY'
import os, random, sys
root, n, d = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    p = os.path.join(root, f"d{i % d:03}")
    os.makedirs(p, exist_ok=True)
    with open(os.path.join(p, f"f{i:05}.bin"), "wb") as f:
        f.write(os.urandom(random.randint(4096, 5120)))
PY
  check() { diff -r "$src" "$work/dst/tree" >/dev/null; }
elif [ $MODE = mixed ]; then
  src=$work/tree
  python3 - "$src" "$FILES" "$TOTAL_MIB" <<'PY'
import math, os, random, sys
root, n, cap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) << 20
rng = random.Random(16)
top = 256 << 20
total = 0
chunk = os.urandom(8 << 20)
for i in range(n):
    while True:
        size = 0 if rng.random() < 0.05 else int(math.exp(rng.uniform(0, math.log(top))))
        if total + size <= cap:
            break
    total += size
    p = os.path.join(root, f"d{i % 10}")
    os.makedirs(p, exist_ok=True)
    with open(os.path.join(p, f"f{i:04}.bin"), "wb") as f:
        left = size
        while left > 0:
            k = min(left, len(chunk))
            # a different slice each time, so no two files share their bytes
            off = rng.randrange(0, len(chunk) - k + 1)
            f.write(chunk[off:off + k])
            left -= k
print(f"mixed tree: {n} files, {total / 2**20:.0f} MiB", file=sys.stderr)
PY
  check() { diff -r "$src" "$work/dst/tree" >/dev/null; }
else
  head -c $((SIZE_MIB << 20)) /dev/urandom > "$src"
  check() { cmp -s "$src" "$(find "$work/dst" -type f | head -1)"; }
fi
mkdir -p "$work/dst"

busy() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
tck=$(getconf CLK_TCK)
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
# run_pair NAME SERVER_CMD CLIENT_CMD: both under /usr/bin/time; prints "wall snd_cpu rcv_cpu sys_cpu"
run_pair() {
  local srv=$2 cli=$3 b0 b1 t0 t1 p=${p:-0}
  rm -rf "$work/dst"/* "$work"/*.time
  /usr/bin/time -f "%U %S" -o "$work/srv.time" bash -c "$srv" >/dev/null 2>&1 & local sp=$!
  pids+=("$sp")
  sleep 0.3
  b0=$(busy); t0=$(date +%s.%N)
  /usr/bin/time -f "%U %S" -o "$work/cli.time" bash -c "$cli"
  if [ "${4:-}" = kill ]; then t1=$(date +%s.%N); b1=$(busy); sleep 0.2; eval "$stopcmd" || true; fi
  wait "$sp" || true
  [ "${4:-}" = kill ] || { t1=$(date +%s.%N); b1=$(busy); }
  local cs rs
  cs=$(tail -1 "$work/cli.time" | awk '{print $1+$2}'); rs=$(tail -1 "$work/srv.time" | awk '{print $1+$2}')
  check || { echo "$1: received data differs!" >&2; exit 1; }
  echo "$(echo "$t1 - $t0" | bc -l) $cs $rs $(echo "($b1 - $b0) / $tck" | bc -l)"
}

median() { sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
# $1 / $2; nan when either is empty (its row was left out of TOOLS)
ratio() { if [ -n "$1" ] && [ -n "$2" ]; then echo "$1 / $2" | bc -l; else echo nan; fi; }

declare -A rows
read -ra tools <<< "${TOOLS:-zcnet zcnet-plaintext zcnet-noverify nc rsync}"
if [ -n "${ZCNET_BASE:-}" ]; then B=$(realpath "$ZCNET_BASE"); [ -n "${TOOLS:-}" ] || tools+=(base base-noverify); fi
for i in $(seq "$REPEAT"); do
  for t in "${tools[@]}"; do
    p=$(port)
    case $t in
      zcnet) r=$(run_pair $t "$Z recv --once --quiet --dir $work/dst --listen 127.0.0.1:$p" "$Z send --quiet ${SEND_ARGS:-} $src --to 127.0.0.1:$p");;
      zcnet-plaintext) r=$(run_pair $t "$Z recv --plaintext --once --quiet --dir $work/dst --listen 127.0.0.1:$p" "$Z send --plaintext --quiet ${SEND_ARGS:-} $src --to 127.0.0.1:$p");;
      zcnet-noverify) r=$(run_pair $t "$Z recv --once --quiet --dir $work/dst --listen 127.0.0.1:$p" "$Z send --quiet ${SEND_ARGS:-} --no-verify $src --to 127.0.0.1:$p");;
      base) r=$(run_pair $t "$B recv --once --quiet --dir $work/dst --listen 127.0.0.1:$p" "$B send --quiet ${SEND_ARGS:-} $src --to 127.0.0.1:$p");;
      base-noverify) r=$(run_pair $t "$B recv --once --quiet --dir $work/dst --listen 127.0.0.1:$p" "$B send --quiet ${SEND_ARGS:-} --no-verify $src --to 127.0.0.1:$p");;
      nc)
        if [ $MODE != file ]; then
          r=$(run_pair $t "nc -l 127.0.0.1 $p | tar x -C $work/dst" "tar c -C $work tree | nc -N 127.0.0.1 $p")
        else
          r=$(run_pair $t "nc -l 127.0.0.1 $p > $work/dst/out" "cat $src | nc -N 127.0.0.1 $p")
        fi;;
      rsync)
        cat > "$work/rsyncd.conf" <<CONF
use chroot = no
uid = 0
gid = 0
[dst]
path = $work/dst
read only = no
CONF
        stopcmd="pkill -f -- '^rsync --daemon.*--port=$p '"
        r=$(run_pair $t "exec rsync --daemon --no-detach --address=127.0.0.1 --port=$p --config=$work/rsyncd.conf " "rsync -r --whole-file $src rsync://127.0.0.1:$p/dst/" kill);;
      scp)
        [ $MODE = file ] || { echo "the scp row is for file mode only" >&2; exit 2; }
        sshdir=$work/ssh
        if [ ! -d "$sshdir" ]; then
          mkdir -p "$sshdir" /run/sshd
          ssh-keygen -q -t ed25519 -N '' -f "$sshdir/host_key"
          ssh-keygen -q -t ed25519 -N '' -f "$sshdir/client_key"
          cp "$sshdir/client_key.pub" "$sshdir/authorized_keys"
        fi
        cat > "$sshdir/sshd_config" <<CONF
ListenAddress 127.0.0.1
Port $p
HostKey $sshdir/host_key
AuthorizedKeysFile $sshdir/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Ciphers aes128-gcm@openssh.com
Subsystem sftp /usr/lib/openssh/sftp-server
PidFile $sshdir/sshd.pid
CONF
        # sshd renames its process ("sshd: ... [listener]"), so it is stopped by its pid file
        stopcmd="kill \$(cat $sshdir/sshd.pid)"
        r=$(run_pair $t "exec /usr/sbin/sshd -D -e -f $sshdir/sshd_config" "scp -q -c aes128-gcm@openssh.com -i $sshdir/client_key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -P $p $src $(id -un)@127.0.0.1:$work/dst/" kill);;
    esac
    echo "$t: $r" >&2; rows[$t]+="$r"$'\n'
  done
done

if [ $MODE = tree ]; then
  printf "%-15s %9s %9s %9s %10s %12s %10s\n" tool "wall s" "snd cpu" "rcv cpu" "both cpu" "system cpu" "vs nc"
  ncwall=$(echo "${rows[nc]:-}" | awk 'NF{print $1}' | median)
  for t in "${tools[@]}"; do
    d=${rows[$t]}
    wall=$(echo "$d" | awk 'NF{print $1}' | median)
    snd=$(echo "$d" | awk 'NF{print $2}' | median)
    rcv=$(echo "$d" | awk 'NF{print $3}' | median)
    sys=$(echo "$d" | awk 'NF{print $4}' | median)
    printf "%-15s %9.3f %9.2f %9.2f %10.2f %12.2f %9.2fx\n" "$t" "$wall" "$snd" "$rcv" "$(echo "$snd + $rcv" | bc -l)" "$sys" "$(ratio "$wall" "$ncwall")"
  done
  echo "($FILES files of 4-5 KiB in $DIRS directories in ${BENCH_DIR:-/dev/shm}, loopback, median of $REPEAT; CPU in seconds; 'vs nc' is wall time over tar|nc's; zcnet: $Z)"
  exit 0
fi
if [ $MODE = mixed ]; then
  printf "%-15s %9s %9s %9s %10s %12s %10s %10s\n" tool "wall s" "snd cpu" "rcv cpu" "both cpu" "system cpu" "vs nc" "vs rsync"
  ncwall=$(echo "${rows[nc]:-}" | awk 'NF{print $1}' | median)
  rswall=$(echo "${rows[rsync]:-}" | awk 'NF{print $1}' | median)
  for t in "${tools[@]}"; do
    d=${rows[$t]}
    wall=$(echo "$d" | awk 'NF{print $1}' | median)
    snd=$(echo "$d" | awk 'NF{print $2}' | median)
    rcv=$(echo "$d" | awk 'NF{print $3}' | median)
    sys=$(echo "$d" | awk 'NF{print $4}' | median)
    printf "%-15s %9.3f %9.2f %9.2f %10.2f %12.2f %9.2fx %9.2fx\n" "$t" "$wall" "$snd" "$rcv" "$(echo "$snd + $rcv" | bc -l)" "$sys" "$(ratio "$wall" "$ncwall")" "$(ratio "$wall" "$rswall")"
  done
  echo "(mixed tree: $FILES files of 0 B to 256 MiB, log-uniform, at most $TOTAL_MIB MiB in all, in ${BENCH_DIR:-/dev/shm}, loopback, median of $REPEAT; CPU in seconds; 'vs' columns are wall time over that tool's; zcnet: $Z)"
  exit 0
fi
gib=$(echo "$SIZE_MIB / 1024" | bc -l)
printf "%-15s %9s %9s %9s %10s %12s %14s %9s %9s\n" tool Gbit/s "snd cpu" "rcv cpu" "both cpu" "system cpu" "GiB/CPU-s" "vs nc" "vs scp"
scpboth=
if [ -n "${rows[scp]:-}" ]; then
  scpboth=$(echo "$(echo "${rows[scp]}" | awk 'NF{print $2}' | median) + $(echo "${rows[scp]}" | awk 'NF{print $3}' | median)" | bc -l)
fi
ncboth=
if [ -n "${rows[nc]:-}" ]; then
  ncboth=$(echo "$(echo "${rows[nc]}" | awk 'NF{print $2}' | median) + $(echo "${rows[nc]}" | awk 'NF{print $3}' | median)" | bc -l)
fi
for t in "${tools[@]}"; do
  d=${rows[$t]}
  wall=$(echo "$d" | awk 'NF{print $1}' | median)
  snd=$(echo "$d" | awk 'NF{print $2}' | median)
  rcv=$(echo "$d" | awk 'NF{print $3}' | median)
  sys=$(echo "$d" | awk 'NF{print $4}' | median)
  both=$(echo "$snd + $rcv" | bc -l)
  printf "%-15s %9.2f %9.2f %9.2f %10.2f %12.2f %14.2f %8.2fx %8.2fx\n" "$t" \
    "$(echo "$gib * 8 * 1.073741824 / $wall" | bc -l)" "$snd" "$rcv" "$both" "$sys" "$(echo "$gib / $sys" | bc -l)" \
    "$(ratio "$ncboth" "$both")" "$(ratio "$scpboth" "$both")"
done
echo "($SIZE_MIB MiB file in ${BENCH_DIR:-/dev/shm}, loopback, median of $REPEAT; CPU in seconds; 'system cpu' is /proc/stat busy time incl. softirq; 'vs nc' is nc's median both-ends CPU over the tool's; 'vs scp' is scp's both-ends CPU over the tool's; zcnet: $Z)"
