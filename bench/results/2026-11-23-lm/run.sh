#!/usr/bin/env bash
# Issue 8: plain UDP, GSO/GRO + MSG_ZEROCOPY and Lightweight Messages (copy-mode XSK on veth)
# side by side — latency and bandwidth per message size from one rr run and one stream run —
# and the transmit-only sink: GSO + zerocopy against GSO + copy in sender CPU-s/GiB.
# Run from the repository root as root, on a quiet machine (cargo build --release first).
set -euo pipefail
Z=${ZCNET:-target/release/zcnet}
D=$(dirname "$0")
SIZES=1,64,1472,4K,16K,64K,256K,1M
# NetPIPE: one request, one reply of the same size; p50/p99 round trip and bandwidth.
"$Z" bench --proto udp --topology netns --rr --tx plain,zerocopy,lm --rx copy,gro,lm \
    --size "$SIZES" --repeat 3 --time 0.5 --plot "$D/rr.svg" --json >"$D/rr.json"
# Streams: messages back to back, every byte verified at the receiver.
"$Z" bench --proto udp --topology netns --tx plain,zerocopy,lm --rx copy,gro,lm \
    --size "$SIZES" --repeat 3 --time 0.5 --plot "$D/stream.svg" --json >"$D/stream.json"
# The sink: transmit only, into a device that drops everything (zcnet::msg's sender, and
# the bench's raw GSO sender).
"$Z" bench --topology sink --proto udp --tx copy,zerocopy --size 64K,1M --repeat 5 --time 1 \
    --json >"$D/sink-msg.json"
"$Z" bench --topology sink --tx copy,zerocopy --size 63K --repeat 5 --time 1 \
    --json >"$D/sink-raw.json"
# The same from a cold ring (256 MiB of buffers, far beyond the caches), as in the shared
# kernel notes' sender-only experiment.
"$Z" bench --topology sink --tx copy,zerocopy --size 63K --ring 4096 --repeat 5 --time 1 \
    --json >"$D/sink-raw-cold.json"
"$Z" bench --topology sink --proto udp --tx copy,zerocopy --size 64K --ring 4096 --repeat 5 \
    --time 1 --json >"$D/sink-msg-cold.json"
"$Z" bench --topology sink --proto udp --tx copy,zerocopy --size 1M --ring 256 --repeat 5 \
    --time 1 --json >"$D/sink-msg-cold1m.json"
python3 "$D/tables.py" "$D" | tee "$D/tables.txt"
gzip -f "$D"/*.json
