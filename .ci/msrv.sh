#!/usr/bin/env bash
# The declared rust-version is a tested one. This machine kind has exactly one toolchain
# (rustup can fetch no other), so the declaration is that toolchain's version and the README's
# test job, which CI runs just before, is the MSRV job: this script fails if the two ever
# part. It also checks the lock file: every package built for Linux declares a rust-version
# no newer than ours (resolver 3 picks such versions; a hand-edited Cargo.lock could not).
# Should a machine's toolchain be newer, it installs the declared one and builds with it.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
[ -n "$msrv" ] || { echo "msrv: no rust-version in Cargo.toml" >&2; exit 1; }
cargo metadata --locked --format-version 1 --filter-platform x86_64-unknown-linux-gnu \
  | python3 -c '
import json, sys
msrv = tuple(int(x) for x in sys.argv[1].split("."))
meta = json.load(sys.stdin)
used = {n["id"] for n in meta["resolve"]["nodes"]}
bad = []
for p in meta["packages"]:
    rv = p.get("rust_version")
    if p["id"] in used and rv and tuple(int(x) for x in rv.split(".")[:2]) > msrv[:2]:
        bad.append("%s %s needs Rust %s" % (p["name"], p["version"], rv))
print(f"msrv: {len(used)} packages in the lock file, none needing more than {sys.argv[1]}" if not bad else "\n".join(bad))
sys.exit(1 if bad else 0)
' "$msrv"
have=$(rustc --version | sed -n 's/^rustc \([0-9]*\.[0-9]*\).*/\1/p')
if [ "$have" = "$msrv" ]; then
  echo "msrv $msrv: the test job's toolchain ($(rustc --version)) is the declared rust-version"
  exit 0
fi
echo "msrv: rustc is $have, the declared rust-version $msrv: building with $msrv"
rustup toolchain list | grep -q "^$msrv" || rustup toolchain install "$msrv" --profile minimal \
  || { echo "msrv: toolchain $msrv cannot be installed here; declare the version CI tests" >&2; exit 1; }
export CARGO_TARGET_DIR=target/msrv
cargo "+$msrv" check --workspace --all-targets --locked
cargo "+$msrv" test --locked -p zcnet-bench --lib
echo "msrv $msrv: $((SECONDS - start)) s"
