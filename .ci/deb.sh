#!/usr/bin/env bash
# Builds the Debian package with cargo-deb (installed when missing) and, with --install,
# installs it with dpkg and uses it from the installed paths only: `zcnet probe`,
# `zcnet bench --time 1` (one pair), `zcnet run -- curl` against a local HTTP server (the preload
# library found in /usr/lib/zcnet/ beside /usr/bin), and `man zcnet-send`.
#
#   bash .ci/deb.sh                                # target/debian/zcnet_VERSION-1_ARCH.deb, release profile
#   bash .ci/deb.sh --install                      # the same, then installed and used (root)
#   bash .ci/deb.sh --from-test-build --install    # what CI runs
#
# --from-test-build packs the binary and library that `cargo test --workspace` has just built
# (stripped, as cargo-deb strips a release build) instead of building the release profile
# (fat LTO, one codegen unit: minutes CI does not have). Everything else, the package's
# layout, manuals, completions and dependencies, is the release package's.
set -euo pipefail
cd "$(dirname "$0")/.."
from_test=0 install=0
for a in "$@"; do
  case "$a" in
    --from-test-build) from_test=1 ;;
    --install) install=1 ;;
    *) echo "deb.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
start=$SECONDS
# Without default features cargo-deb leaves xz to the system's xz-utils and builds without
# a C library: about a third fewer crates to compile.
command -v cargo-deb >/dev/null 2>&1 || cargo install --locked cargo-deb --no-default-features
if [ "$from_test" = 1 ]; then
  built=target/debug
  [ -x "$built/zcnet" ] && [ -f "$built/deps/libzcnet_preload.so" ] \
    || { echo "deb.sh: run cargo test --workspace first (no $built/zcnet)" >&2; exit 1; }
  # A target dir of its own whose release/ holds what cargo-deb's assets name.
  export CARGO_TARGET_DIR=target/deb-from-test
  rm -rf "$CARGO_TARGET_DIR"
  mkdir -p "$CARGO_TARGET_DIR/release/deps"
  strip -o "$CARGO_TARGET_DIR/release/zcnet" "$built/zcnet"
  strip -o "$CARGO_TARGET_DIR/release/deps/libzcnet_preload.so" "$built/deps/libzcnet_preload.so"
  out=$CARGO_TARGET_DIR
else
  # The release profile's binary and, as its dependency, the preload library (deps/).
  cargo build --release --locked -p zcnet-cli
  out=target
fi
rm -rf "$out/release/manuals"
"$out/release/zcnet" manuals --out "$out/release/manuals" >/dev/null
rm -rf "$out/debian"
cargo deb -p zcnet-cli --no-build
deb=$(ls "$out"/debian/*.deb)
echo "$deb: $(stat -c %s "$deb") bytes"
dpkg-deb --contents "$deb" | awk '{print "    " $1, $3, $6}'
echo "deb build: $((SECONDS - start)) s"
[ "$install" = 1 ] || exit 0

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
# One pair for a second (the default runs every transmit × receive path: minutes).
"$zcnet" bench --time 1 --tx auto --rx auto -l 64K >"$tmp/bench.txt"
grep -q '^verdict:' "$tmp/bench.txt" || { echo "zcnet bench: no verdict" >&2; cat "$tmp/bench.txt" >&2; exit 1; }
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
# And it leaves as it came: nothing of it after `dpkg -r`.
dpkg -r zcnet >/dev/null
for f in /usr/bin/zcnet /usr/lib/zcnet/libzcnet_preload.so /usr/share/man/man1/zcnet-send.1.gz; do
  [ ! -e "$f" ] || { echo "deb.sh: $f still there after dpkg -r" >&2; exit 1; }
done
echo "deb install, use and removal: $((SECONDS - start)) s"
