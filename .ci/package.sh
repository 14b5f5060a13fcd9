#!/usr/bin/env bash
# Every crate packs into a .crate a registry would accept, and builds from it:
# `cargo package --workspace` packs each member and builds it from its tarball alone, the
# workspace's unpublished crates served by a local registry overlay (cargo >= 1.84).
# Prints every tarball's size and fails past crates.io's 10 MB limit.
#
#   bash .ci/package.sh            # what CI runs
#   bash .ci/package.sh --list     # also each tarball's file list
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
# --allow-dirty: CI may run on a tree with generated files beside the sources; what goes in
# is the include list of each crate, shown by --list.
cargo package --workspace --locked --allow-dirty
limit=$((10 * 1024 * 1024))
bad=0
for f in target/package/*.crate; do
  size=$(stat -c %s "$f")
  printf '%-36s %8d bytes  %5d files\n' "$(basename "$f")" "$size" "$(tar tzf "$f" | wc -l)"
  [ "${1:-}" = "--list" ] && tar tzf "$f" | sed 's/^/    /'
  if [ "$size" -ge "$limit" ]; then echo "$f: over crates.io's 10 MB limit" >&2; bad=1; fi
done
echo "package: $((SECONDS - start)) s"
exit $bad
