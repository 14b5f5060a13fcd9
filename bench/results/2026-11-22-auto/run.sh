#!/bin/bash
set -x
Z=${Z:-target/release/zcnet}
export XDG_CONFIG_HOME=${OUT:-/tmp/zcnet-auto}/xdg
mkdir -p $XDG_CONFIG_HOME/zcnet
S=4K,16K,64K,256K,1M,4M
for topo in "loopback" "netns 1500" "netns 9000"; do
  set -- $topo
  t=$1; mtu=$2; tag=$t$mtu
  if [ "$t" = loopback ]; then TOP="--topology loopback"; else TOP="--topology netns --mtu $mtu"; fi
  $Z tune $TOP > ${OUT:-/tmp/zcnet-auto}/q-tune-$tag.txt 2>&1
  $Z bench $TOP --tx copy,zerocopy,uring,cow,auto --rx copy --size $S --repeat 5 --time 0.3 --json > ${OUT:-/tmp/zcnet-auto}/q-$tag-tx.json 2>${OUT:-/tmp/zcnet-auto}/q-$tag-tx.err
  $Z bench $TOP --tx copy --rx copy,mmap,uring,auto --size $S --repeat 5 --time 0.3 --json > ${OUT:-/tmp/zcnet-auto}/q-$tag-rx.json 2>${OUT:-/tmp/zcnet-auto}/q-$tag-rx.err
done
echo done
