#!/usr/bin/env bash
# The library crates' public APIs against the last release, by cargo-semver-checks: a
# breaking change without a major (0.x: minor) version bump fails. The baseline is the
# release's tag; a clone without tags falls back to the tag's commit (the first release,
# v0.1.0, is 93a4d74). Binary-only zcnet-cli has no API and is skipped by the tool.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
command -v cargo-semver-checks >/dev/null 2>&1 || cargo install --locked cargo-semver-checks
baseline=v0.1.0
if ! git rev-parse -q --verify "$baseline^{commit}" >/dev/null; then
  git fetch -q --tags origin 2>/dev/null || true
fi
if ! git rev-parse -q --verify "$baseline^{commit}" >/dev/null; then
  baseline=93a4d74
fi
cargo semver-checks check-release --workspace --baseline-rev "$baseline"
echo "semver-checks against $baseline: $((SECONDS - start)) s"
