#!/usr/bin/env bash
# Builds and tests crates as a registry user would get them: every .crate that
# `.ci/package.sh` left in target/package/ unpacked side by side in a scratch workspace,
# the workspace's crates taken from those directories instead of crates.io (a [patch] in
# the scratch's .cargo/config.toml, which also reaches the nested builds cargo install
# does), offline. Not run by CI (it builds everything once more); run it before a release.
#
#   bash .ci/from_tarballs.sh DIR "cargo test -p zcnet-bench"   # any cargo command
#
# DIR is created (or reused): DIR/zcnet-0.1.0/, DIR/zcnet-cli-0.1.0/, …
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$1"; shift
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
members=() patch=()
for f in "${PACKAGE_DIR:-$root/target/package}"/*.crate; do
  name="$(basename "$f" .crate)"          # zcnet-cli-0.1.0
  crate="${name%-*}"                      # zcnet-cli
  rm -rf "${dir:?}/$name"
  tar xzf "$f" -C "$dir"
  members+=("\"$name\"")
  patch+=("$crate = { path = \"$dir/$name\" }")
done
{
  echo "[workspace]"
  echo "resolver = \"3\""
  echo "members = [$(IFS=,; echo "${members[*]}")]"
} >"$dir/Cargo.toml"
mkdir -p "$dir/.cargo"
{
  echo "[patch.crates-io]"
  printf '%s\n' "${patch[@]}"
} >"$dir/.cargo/config.toml"
# The workspace's lock file: the versions CI tested, no index needed.
cp "$root/Cargo.lock" "$dir/Cargo.lock"
cd "$dir"
echo "+ $*" >&2
CARGO_NET_OFFLINE=true CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$dir/target}" eval "$@"
