#!/usr/bin/env bash
# Builds the Debian package (cargo-deb, installed when missing) and, with --install,
# installs it with dpkg and uses it from the installed paths only: `zcnet probe`,
# `zcnet bench --time 1`, `zcnet run -- curl` against a local HTTP server (the preload
# library found in /usr/lib/zcnet/ beside /usr/bin), and `man zcnet-send`.
#
#   bash .ci/deb.sh              # target/debian/zcnet_VERSION-1_ARCH.deb
#   bash .ci/deb.sh --install    # what CI runs (as root: it installs the package)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
command -v cargo-deb >/dev/null 2>&1 || cargo install --locked cargo-deb
# The release profile's binary and, as its dependency, the preload library (deps/).
cargo build --release --locked -p zcnet-cli
rm -rf target/release/manuals
target/release/zcnet manuals --out target/release/manuals >/dev/null
rm -rf target/debian
cargo deb -p zcnet-cli --no-build
deb=$(ls target/debian/*.deb)
echo "$deb: $(stat -c %s "$deb") bytes"
dpkg-deb --contents "$deb" | awk '{print "    " $1, $3, $6}'
echo "deb build: $((SECONDS - start)) s"
[ "${1:-}" = "--install" ] || exit 0

start=$SECONDS
# --path-include: slim images exclude /usr/share/man from every package; keep ours.
dpkg -i --path-include="/usr/share/man/man1/zcnet*" "$deb"
tmp=$(mktemp -d); srv=
cleanup() { [ -n "$srv" ] && kill "$srv" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
# From the installed paths only: nothing of the build tree on PATH or in ZCNET_PRELOAD.
zcnet=/usr/bin/zcnet
unset ZCNET_PRELOAD
(cd / && env -u ZCNET_PRELOAD "$zcnet" probe >/dev/null)
"$zcnet" bench --time 1 >"$tmp/bench.txt"
head -c 1048576 /dev/urandom >"$tmp/page.bin"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m http.server --bind 127.0.0.1 --directory "$tmp" "$port" >/dev/null 2>&1 & srv=$!
for _ in $(seq 50); do curl -fso /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
"$zcnet" run --stats "$tmp/stats.jsonl" -- curl -fsS -o "$tmp/got.bin" "http://127.0.0.1:$port/page.bin"
cmp "$tmp/page.bin" "$tmp/got.bin"
grep -q '"exe":"[^"]*curl"' "$tmp/stats.jsonl" || { echo "zcnet run: no stats line: the library was not preloaded" >&2; cat "$tmp/stats.jsonl" >&2; exit 1; }
command -v man >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq man-db; }
MANPAGER=cat MANWIDTH=80 man zcnet-send | grep -q -- '--to'
for page in zcnet zcnet-probe zcnet-bench zcnet-recv zcnet-tune zcnet-run; do
  MANPAGER=cat man -w "$page" >/dev/null
done
echo "deb install and use: $((SECONDS - start)) s"
