#!/usr/bin/env bash
# Every crate packs into a .crate a registry would accept. Prints every tarball's size and
# file count and fails past crates.io's 10 MB limit.
#
#   bash .ci/package.sh               # packs each member and builds it from its tarball alone,
#                                     # the workspace's unpublished crates served by a local
#                                     # registry overlay (cargo >= 1.84): minutes, before a release
#   bash .ci/package.sh --no-verify   # what CI runs: packs and checks the tarballs only
#   bash .ci/package.sh --list        # also each tarball's file list
#
# A crate built and tested from the tarballs, offline: .ci/from_tarballs.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
verify=() list=0
for a in "$@"; do
  case "$a" in
    --no-verify) verify=(--no-verify) ;;
    --list) list=1 ;;
    *) echo "package.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
# --allow-dirty: CI may run on a tree with generated files beside the sources; what goes in
# is the include list of each crate, shown by --list.
rm -f target/package/*.crate
cargo package --workspace --locked --allow-dirty "${verify[@]}"
limit=$((10 * 1024 * 1024))
bad=0
for f in target/package/*.crate; do
  size=$(stat -c %s "$f")
  printf '%-36s %8d bytes  %5d files\n' "$(basename "$f")" "$size" "$(tar tzf "$f" | wc -l)"
  [ "$list" = 1 ] && tar tzf "$f" | sed 's/^/    /'
  if [ "$size" -ge "$limit" ]; then echo "$f: over crates.io's 10 MB limit" >&2; bad=1; fi
done
echo "package: $((SECONDS - start)) s"
exit $bad
