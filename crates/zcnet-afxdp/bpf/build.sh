#!/usr/bin/env bash
# Compiles zcnet-afxdp's XDP programs (*.c here) into the objects committed beside them, which
# crates/zcnet-afxdp embeds with include_bytes: a build of it needs no clang.
#
#   bash crates/zcnet-afxdp/bpf/build.sh          # rebuild NAME.o from NAME.c
#   bash crates/zcnet-afxdp/bpf/build.sh --check  # rebuild into a temp dir, fail if any differs
#
# CI runs --check, so a source changed without its object (or an object not made from its
# source) fails there. CLANG names another compiler (e.g. clang-14). The objects are the
# same whatever the checkout's path: the compile runs here with relative paths and
# -fdebug-prefix-map, so DWARF/BTF carry "./NAME.c", not an absolute directory.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
clang="${CLANG:-clang}"
command -v "$clang" >/dev/null || { echo "bpf/build.sh: $clang not found (apt-get install clang)" >&2; exit 1; }

compile() { # SRC OUT
  # -O2: the verifier wants each bounds check kept next to the load it guards.
  # -g:  BTF, which the .maps section's map definitions need (aya reads it).
  (cd "$here" && "$clang" -O2 -g -Wall -Werror -target bpf \
     -fdebug-prefix-map="$here"=. -c "$1" -o "$2")
}

if [ "${1:-}" = "--check" ]; then
  tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
  bad=0
  for src in "$here"/*.c; do
    name="$(basename "$src" .c)"
    compile "$name.c" "$tmp/$name.o"
    if ! cmp -s "$tmp/$name.o" "$here/$name.o"; then
      echo "bpf/$name.o does not match bpf/$name.c as compiled by $("$clang" --version | head -1)" >&2
      bad=1
    fi
  done
  if [ $bad -ne 0 ]; then
    echo "regenerate with: bash crates/zcnet-afxdp/bpf/build.sh, and commit the objects" >&2
    exit 1
  fi
  echo "BPF objects match their sources ($("$clang" --version | head -1))"
else
  for src in "$here"/*.c; do
    name="$(basename "$src" .c)"
    compile "$name.c" "$name.o"
    echo "built bpf/$name.o ($(stat -c %s "$here/$name.o") bytes)"
  done
fi
