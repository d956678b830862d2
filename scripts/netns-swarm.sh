#!/usr/bin/env bash
# A private multi-host network on one Linux machine: N peer network namespaces, each with one
# interface (eth0, 10.213.0.<i+1>/24) on a veth pair into a bridge that lives in a namespace
# of its own, every link shaped both ways with tc's token bucket filter (tbf). Runs COMMAND
# with the namespaces in its environment, then removes everything it made, also when COMMAND
# fails, times out or the script is interrupted. The host's own network is never touched:
# no interface, address or route is added outside the namespaces this script creates.
#
#   netns-swarm.sh [--peers N] [--rate RATE] [--burst SIZE] [--latency TIME]
#                  [--congestion NAME] [--loopback] [--timeout SECONDS] -- COMMAND [ARGS...]
#
#   --peers N          peer namespaces (default 4, at most 250)
#   --rate RATE        tbf rate of every link, each direction (default 100mbit); a comma-
#                      separated list with one rate per peer gives peer i the i-th
#   --burst SIZE       tbf bucket size (default 128kb); a list as for --rate
#   --latency TIME     longest a packet may wait in the tbf queue (default 50ms)
#   --congestion NAME  TCP congestion control in every peer namespace (cubic, bbr, reno: one
#                      of net.ipv4.tcp_allowed_congestion_control); default: the host's
#   --loopback         bring each peer namespace's loopback interface up, for programs whose
#                      processes in one namespace talk to each other (mpirun and its ranks)
#   --timeout SECONDS  COMMAND is stopped (TERM, then KILL) after this long (default 600)
#
# COMMAND runs in the host's namespace with
#   HIVEMESH_NETNS_NAMES      the peer namespaces, space-separated (peer 0 first)
#   HIVEMESH_NETNS_ADDRESSES  their addresses, in the same order
#   HIVEMESH_NETNS_CONGESTION the TCP congestion control the peer namespaces use
# and starts peer i with: ip netns exec <i-th name> PROGRAM ...  A peer must listen on, and
# announce, its own address: its namespace's loopback interface is left down (unless
# --loopback), so peers reach each other only through the shaped links. Each run's names carry its process id, so runs
# side by side do not collide (their addresses are the same, on separate bridges).
#
# Needs root and ip netns (iproute2; veth, bridge and sch_tbf in the kernel). When they are
# not permitted it prints one line, "SKIP: netns test needs root and ip netns (<reason>)",
# and exits 77 (the SKIP_RETURN_CODE of integration:netns_swarm). Otherwise it exits with
# COMMAND's status (124 when the timeout stopped it).
# tests/integration/netns_swarm.sh uses it; by hand, for example:
#   sudo scripts/netns-swarm.sh --peers 2 -- bash -c 'set -- $HIVEMESH_NETNS_NAMES
#     ip netns exec "$1" ip -brief address; ip netns exec "$2" ip -brief address'
set -euo pipefail

peers=4 rate=100mbit burst=128kb latency=50ms limit=600 loopback=down congestion=
usage() {
  sed -n '/^#   netns-swarm.sh/,/^#   --timeout/p' "$0" | sed 's/^#//' >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case $1 in
    --peers) peers=${2:?}; shift 2 ;;
    --rate) rate=${2:?}; shift 2 ;;
    --burst) burst=${2:?}; shift 2 ;;
    --latency) latency=${2:?}; shift 2 ;;
    --congestion) congestion=${2:?}; shift 2 ;;
    --loopback) loopback=up; shift ;;
    --timeout) limit=${2:?}; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
[ $# -gt 0 ] || usage
if ! [[ $peers =~ ^[0-9]+$ && $peers -ge 1 && $peers -le 250 && $limit =~ ^[0-9]+$ &&
  $limit -ge 1 ]]; then
  usage
fi
IFS=, read -r -a rates <<< "$rate"
IFS=, read -r -a bursts <<< "$burst"
for list in "${#rates[@]}" "${#bursts[@]}"; do
  if [ "$list" != 1 ] && [ "$list" != "$peers" ]; then
    echo "netns-swarm: --rate and --burst take one value, or one per peer ($peers)" >&2
    exit 2
  fi
done
# Peer i's entry of a --rate or --burst list (the only one when it has one).
nth() {
  local i=$1
  shift
  [ $# -eq 1 ] && i=0
  local values=("$@")
  echo "${values[i]}"
}

skip() {
  echo "SKIP: netns test needs root and ip netns ($*)"
  exit 77
}
[ "$(id -u)" = 0 ] || skip "not root: uid $(id -u)"
if [ -n "$congestion" ]; then
  available=$(cat /proc/sys/net/ipv4/tcp_available_congestion_control 2> /dev/null || true)
  if ! [[ " ${available} " == *" ${congestion} "* ]]; then
    echo "netns-swarm: congestion control '${congestion}' is not available here" \
      "(available: ${available:-unknown})" >&2
    exit 2
  fi
  # Outside the host's namespace the kernel lets only the allowed ones be chosen (EPERM).
  allowed=$(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control 2> /dev/null || true)
  if ! [[ " ${allowed} " == *" ${congestion} "* ]]; then
    echo "netns-swarm: congestion control '${congestion}' may not be chosen in a network" \
      "namespace here (net.ipv4.tcp_allowed_congestion_control: ${allowed:-unknown}; add it" \
      "there to allow it)" >&2
    exit 2
  fi
fi
command -v ip > /dev/null || skip "no ip command (Debian: iproute2)"
command -v tc > /dev/null || skip "no tc command (Debian: iproute2)"

tag="hm$$"
bridge_ns="${tag}-br"
names=()
addresses=()
made=()    # namespaces this run created, removed by cleanup
child=""   # COMMAND's timeout process
errors=$(mktemp)

# Stops what still runs in our namespaces (only processes inside them: ours), then removes
# the namespaces; their veth pairs and the bridge go with them.
# shellcheck disable=SC2317 # called by the trap
cleanup() {
  local status=$? ns pids deadline
  trap - EXIT INT TERM
  if [ -n "$child" ] && kill -0 "$child" 2> /dev/null; then
    kill -TERM "$child" 2> /dev/null || true
  fi
  for signal in TERM KILL; do
    pids=""
    for ns in "${made[@]}"; do
      pids+=" $(ip netns pids "$ns" 2> /dev/null | tr '\n' ' ')"
    done
    [ -z "${pids// /}" ] && break
    # shellcheck disable=SC2086 # a list of process ids
    kill -"$signal" $pids 2> /dev/null || true
    deadline=$((SECONDS + 5))
    for _ in $(seq 50); do # up to 5 s
      [ "$SECONDS" -lt "$deadline" ] || break
      pids=""
      for ns in "${made[@]}"; do
        pids+="$(ip netns pids "$ns" 2> /dev/null)"
      done
      [ -z "$pids" ] && break
      sleep 0.1
    done
  done
  if [ -n "$child" ]; then
    wait "$child" 2> /dev/null || true
  fi
  for ns in "${made[@]}"; do
    ip netns del "$ns" 2> /dev/null || echo "netns-swarm: could not remove namespace $ns" >&2
  done
  rm -f "$errors"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Runs a setup step; its failure is a skip that names the step and the kernel's answer.
step() {
  "$@" 2> "$errors" || skip "$* failed: $(head -1 "$errors")"
}

add_namespace() {
  step ip netns add "$1"
  made+=("$1")
  step ip -n "$1" link set lo "${2:-down}"
}

add_namespace "$bridge_ns"
step ip -n "$bridge_ns" link add br0 type bridge
step ip -n "$bridge_ns" link set br0 up
for ((i = 0; i < peers; i++)); do
  ns="${tag}-p${i}"
  address="10.213.0.$((i + 1))"
  add_namespace "$ns" "$loopback"
  step ip -n "$bridge_ns" link add "b${i}" type veth peer name eth0 netns "$ns"
  step ip -n "$bridge_ns" link set "b${i}" master br0 up
  step ip -n "$ns" addr add "${address}/24" dev eth0
  step ip -n "$ns" link set eth0 up
  if [ -n "$congestion" ]; then
    # shellcheck disable=SC2016 # $1 expands in the namespace's shell
    step ip netns exec "$ns" bash -c 'echo "$1" > /proc/sys/net/ipv4/tcp_congestion_control' \
      _ "$congestion"
  fi
  # Both directions: the peer's egress, and the bridge's egress towards the peer.
  peer_rate=$(nth "$i" "${rates[@]}") peer_burst=$(nth "$i" "${bursts[@]}")
  step tc -n "$ns" qdisc add dev eth0 root tbf rate "$peer_rate" burst "$peer_burst" \
    latency "$latency"
  step tc -n "$bridge_ns" qdisc add dev "b${i}" root tbf rate "$peer_rate" burst "$peer_burst" \
    latency "$latency"
  names+=("$ns")
  addresses+=("$address")
done
echo "netns-swarm: ${peers} peers in ${names[0]}..${names[peers - 1]}" \
  "(${addresses[0]}..${addresses[peers - 1]}), bridge in ${bridge_ns}, tbf ${rate} each way"

congestion=$(ip netns exec "${names[0]}" cat /proc/sys/net/ipv4/tcp_congestion_control ||
  echo unknown)
echo "netns-swarm: TCP congestion control ${congestion} in the peer namespaces"
export HIVEMESH_NETNS_NAMES="${names[*]}" HIVEMESH_NETNS_ADDRESSES="${addresses[*]}"
export HIVEMESH_NETNS_CONGESTION="$congestion"
# In the background so that a signal reaches the trap at once (and COMMAND keeps our stdin).
exec 3<&0
timeout -k 10 "$limit" "$@" <&3 &
child=$!
status=0
wait "$child" || status=$?
child=""
exit "$status"
