#!/usr/bin/env bash
# Fails when a file uses another layer's `detail` names. A layer's internals are its own:
# what two layers share lives in a public header of the lower one.
#   include/hivemesh/<layer>/... and tests/<layer>/... may use <layer>::detail;
#   hivemesh::detail belongs to core; net::tcp::detail and net::sim::detail to net;
#   bench/, examples/ and the other test folders use no detail names at all.
# Usage: detail_use.sh <source root>
set -euo pipefail
cd "$1"
status=0
while IFS=: read -r file line name; do
  case "$file" in
    include/hivemesh/*/*) own=${file#include/hivemesh/}; own=${own%%/*} ;;
    tests/*/*) own=${file#tests/}; own=${own%%/*} ;;
    *) own=none ;;
  esac
  layer=${name%%::detail::*}
  layer=${layer#hivemesh::}
  case "$layer" in
    hivemesh) layer=core ;;
    net::tcp | net::sim | tcp | sim) layer=net ;;
  esac
  if [ "$layer" != "$own" ]; then
    echo "${file}:${line}: ${name} is a detail of ${layer}, used from ${own}"
    status=1
  fi
done < <(grep -rnoE '\b(hivemesh::)?((core|tensor|compression|crypto|net|dht|averaging|optim)::)?((tcp|sim)::)?detail::[A-Za-z_0-9]+' \
           include tests bench examples --include='*.hpp' --include='*.ipp' --include='*.cpp' |
         grep -vE ':[0-9]+:detail::' || true)
if [ "$status" -eq 0 ]; then echo "no layer uses another layer's detail names"; fi
exit "$status"
