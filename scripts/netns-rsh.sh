#!/usr/bin/env bash
# mpirun's remote shell across the namespaces of scripts/netns-swarm.sh:
#   netns-rsh.sh HOST COMMAND...
# runs COMMAND with /bin/sh in the peer namespace whose address is HOST (from
# HIVEMESH_NETNS_NAMES and HIVEMESH_NETNS_ADDRESSES, which netns-swarm.sh exports). bench_allreduce
# --link gives it to mpirun as plm_rsh_agent, so that each rank runs behind its own shaped link.
set -euo pipefail
host=${1:?usage: netns-rsh.sh HOST COMMAND...}
shift
read -r -a names <<< "${HIVEMESH_NETNS_NAMES:?not set: run under netns-swarm.sh}"
read -r -a addresses <<< "${HIVEMESH_NETNS_ADDRESSES:?not set: run under netns-swarm.sh}"
for i in "${!addresses[@]}"; do
  if [ "${addresses[$i]}" = "$host" ]; then
    exec ip netns exec "${names[$i]}" /bin/sh -c "$*"
  fi
done
echo "netns-rsh: no namespace has the address $host" >&2
exit 255
