#!/usr/bin/env bash
# The library crates' public APIs against the last release, by cargo-semver-checks: a
# breaking change without a major (0.x: minor) version bump fails.
#
# Why it does not simply run `cargo semver-checks check-release --workspace --baseline-rev`:
# that builds each crate's rustdoc twice in a target directory of its own, so every
# dependency (ring's C included) is checked fourteen times: 427 s here. Instead the rustdoc
# JSON is made here and the tool is given the two JSON files per crate: the release's in a
# target directory of its own (its lock file pins older dependencies), this tree's in the
# workspace's, where CI's clippy and doc steps have already checked every dependency, so
# only our crates are documented. Both with the crates' default features, as CI builds
# them.
#
# The tool itself is 416 crates. Built with its own profile (fat LTO, one codegen unit) it
# took 968 CPU-s here, 1,056 with opt-level 1; unoptimised, 441. Its checks of our crates
# take seconds either way (zcnet: 3.1 s against 0.3 s), so it is built unoptimised. CI runs
# `--prepare` (the tool and the release's JSON) niced in the background while its tests run,
# and `--check` (this tree's JSON and the checks) after them.
#
# The baseline is the release's tag; a clone without tags falls back to the tag's commit
# (the first release, v0.1.0, is 93a4d74). Binary-only zcnet-cli has no API and is skipped;
# zcnet-afxdp and zcnet-msg, split out of zcnet after v0.1.0, have no release to compare
# with yet (add them here once they have one).
#
#   bash .ci/semver.sh              # both steps
#   bash .ci/semver.sh --prepare    # the tool and the release's JSON
#   bash .ci/semver.sh --check      # this tree's JSON, and the checks
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
mode=${1:-all}
root=$PWD
target=${CARGO_TARGET_DIR:-$root/target}
tools=$target/ci-tools
build=$target/semver-build   # the release's target directory: no lock shared with CI's build
json=$target/semver-json
crates=(zcnet-sys zcnet zcnet-tokio zcnet-transfer zcnet-bench zcnet-preload zcnet-testbed)
export PATH="$tools/bin:$PATH"
version=0.51.0

mkdir -p "$json"
# rustdoc's JSON output is unstable: RUSTC_BOOTSTRAP for rustdoc alone (set for all of
# cargo, build scripts such as anyhow's would take this toolchain for a nightly).
cat > "$json/rustdoc" <<EOF
#!/bin/sh
RUSTC_BOOTSTRAP=1 exec $(rustup which rustdoc 2>/dev/null || command -v rustdoc) "\$@"
EOF
chmod +x "$json/rustdoc"

# The JSON of each crate of the workspace at $1 (a directory), built in target directory
# $2, into $3.
rustdoc_json() {
  local dir=$1 tdir=$2 out=$3 c
  for c in "${crates[@]}"; do
    (cd "$dir" && RUSTDOC="$json/rustdoc" CARGO_TARGET_DIR="$tdir" \
      cargo rustdoc --quiet --locked -p "$c" --lib -- \
        -Z unstable-options --output-format json --cap-lints allow)
    mv "$tdir/doc/${c//-/_}.json" "$out/"
  done
}


check() {
  local c f t=$SECONDS
  rm -rf "$json/current" && mkdir -p "$json/current"
  rustdoc_json "$root" "$target" "$json/current"
  echo "semver: rustdoc JSON of this tree's ${#crates[@]} crates in $((SECONDS - t)) s"
  t=$SECONDS
  for c in "${crates[@]}"; do
    f=${c//-/_}.json
    echo "semver: $c"
    cargo semver-checks check-release --baseline-rustdoc "$json/base/$f" \
      --current-rustdoc "$json/current/$f"
  done
  echo "semver: checks in $((SECONDS - t)) s"
}
if [ "$mode" = --check ]; then
  check
  exit 0
fi

if ! cargo-semver-checks --version 2>/dev/null | grep -q "$version"; then
  t=$SECONDS
  cargo install --quiet --locked cargo-semver-checks --version "$version" --root "$tools" \
    --target-dir "$target/ci-tools-build" --config 'profile.release.opt-level=0' \
    --config 'profile.release.lto=false' --config 'profile.release.debug=0' \
    --config 'profile.release.incremental=false'
  rm -rf "$target/ci-tools-build"
  echo "semver: cargo-semver-checks $version installed in $((SECONDS - t)) s"
fi

baseline=v0.1.0
if ! git rev-parse -q --verify "$baseline^{commit}" >/dev/null; then
  git fetch -q --tags origin 2>/dev/null || true
fi
if ! git rev-parse -q --verify "$baseline^{commit}" >/dev/null; then
  baseline=93a4d74
fi

t=$SECONDS
rm -rf "$json/base" "$json/src" && mkdir -p "$json/base" "$json/src"
git archive "$baseline" | tar -x -C "$json/src"
rustdoc_json "$json/src" "$build" "$json/base"
rm -rf "$json/src"
echo "semver: rustdoc JSON of $baseline's ${#crates[@]} crates in $((SECONDS - t)) s"
[ "$mode" = --prepare ] || check
echo "semver: against $baseline, $mode: $((SECONDS - start)) s"
