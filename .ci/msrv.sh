#!/usr/bin/env bash
# The declared rust-version builds: every target of every crate type-checks with that
# toolchain, and the pure tests of zcnet-bench run with it (they pull in zcnet and
# zcnet-sys; a whole `cargo test --workspace` twice would double CI's time). The lock file
# is the workspace's: resolver 3 keeps it at versions this toolchain builds.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
[ -n "$msrv" ] || { echo "msrv: no rust-version in Cargo.toml" >&2; exit 1; }
rustup toolchain list | grep -q "^$msrv" || rustup toolchain install "$msrv" --profile minimal
export CARGO_TARGET_DIR=target/msrv
cargo "+$msrv" check --workspace --all-targets --locked
cargo "+$msrv" test --locked -p zcnet-bench --lib
echo "msrv $msrv: $((SECONDS - start)) s"
