#!/usr/bin/env bash
# Multi-host over Linux network namespaces: 4 peers, each in a network namespace of its own,
# on veth pairs into one bridge, every link shaped to 100 Mbit/s each way by tc tbf
# (scripts/netns-swarm.sh makes them and removes them at the end, also on failure). Over it:
#   1. the DHT: four dht_node processes; peer 1 puts a value, peers 2 and 0 a dictionary
#      subkey each, and peer 3 reads both; every node's routing table holds the other three;
#   2. an averaging round: four moshpit_swarm peers (--rank, --hosts) average 1,000,000
#      float32 each in one group of 4; every peer must then hold the exact mean (the oracle
#      of moshpit_swarm --check: rms from the mean at most 1e-5 of what it was before);
#   3. the example trainer (when given): four collaborative_trainer peers, peer 0 with
#      --listen, the others with --join <peer 0's address>, train the MLP for a few seconds
#      (--max-time); each must finish, its report in order and its epochs holding the other
#      peers' samples too, and at least two must have averaged with others.
# Every peer listens on and announces its namespace address (10.213.0.x); loopback is down in
# every namespace, so peers reach each other only over the shaped links, as separate hosts
# with --join do. The end checks each link's counters: the traffic went through eth0 and tbf.
# Needs root and ip netns; without them it prints one SKIP line and exits 77.
#   usage: netns_swarm.sh DHT_NODE MOSHPIT_SWARM [TRAINER REPORT_CHECKER]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ $# -lt 2 ] || [ $# -eq 3 ]; then
  echo "usage: $0 DHT_NODE MOSHPIT_SWARM [TRAINER REPORT_CHECKER]" >&2
  exit 2
fi
if [ -z "${HIVEMESH_NETNS_NAMES:-}" ]; then
  # The namespaces first; this script runs again inside scripts/netns-swarm.sh.
  exec bash "$here/../../scripts/netns-swarm.sh" --peers 4 --rate 100mbit --timeout 240 \
    -- bash "$0" "$@"
fi

dht_node=$1 moshpit=$2 trainer=${3:-} checker=${4:-}
read -r -a names <<< "$HIVEMESH_NETNS_NAMES"
read -r -a addresses <<< "$HIVEMESH_NETNS_ADDRESSES"
peers=${#names[@]}
dir=$(mktemp -d)
background=() # every process started here
cleanup() {
  local pid
  for pid in "${background[@]}"; do
    kill "$pid" 2> /dev/null || true
  done
  for pid in "${background[@]}"; do
    wait "$pid" 2> /dev/null || true
  done
  rm -rf "$dir"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  local log
  for log in "$dir"/*.err "$dir"/*.log "$dir"/trainer*/logs/*.log; do
    if [ -s "$log" ]; then
      echo "--- ${log#"$dir"/}"
      tail -20 "$log"
    fi
  done
  exit 1
}

# run_in <i> PROGRAM ARGS...: runs a program in peer i's namespace, for at most 180 s. Only
# in a subshell (`run_in ... &` or `$(run_in ...)`): it execs, so that $! is timeout's pid
# (and killing it stops the program; ip netns exec execs the program in turn).
run_in() {
  local i=$1
  shift
  exec timeout -k 5 180 ip netns exec "${names[i]}" "$@"
}

# Waits for background process <pid>; fails unless it exits with 0.
finished() { # pid what
  local status=0
  wait "$1" || status=$?
  [ "$status" = 0 ] || fail "$2 exited with status $status"
}

# A process whose stdin and stdout are fifos held open here: fds input[i] and output[i].
input=() output=()
start_talking() { # i name PROGRAM ARGS...
  local i=$1 name=$2 fd
  shift 2
  mkfifo "$dir/$name.in" "$dir/$name.out"
  run_in "$i" "$@" < "$dir/$name.in" > "$dir/$name.out" 2> "$dir/$name.err" &
  background+=("$!")
  exec {fd}> "$dir/$name.in"
  input[i]=$fd
  exec {fd}< "$dir/$name.out"
  output[i]=$fd
}

close_fd() { # fd
  local fd=$1
  exec {fd}>&-
}

# The next line from peer i (at most `seconds`), in $line.
line=""
next_line() { # i seconds what
  local status=0
  IFS= read -r -t "$2" -u "${output[$1]}" line || status=$?
  [ "$status" -le 128 ] || fail "peer $1: no $3 within $2 s"
  [ "$status" = 0 ] || fail "peer $1: its output ended before $3"
}

# ---- 1. the DHT ----------------------------------------------------------------------------
echo "== DHT: store on one namespace, get from another (at ${SECONDS} s)"
dht_pids=()
first=""
for ((i = 0; i < peers; i++)); do
  args=(--listen "${addresses[i]}:0")
  [ -n "$first" ] && args+=(--bootstrap "$first")
  start_talking "$i" "dht$i" "$dht_node" "${args[@]}"
  dht_pids+=("${background[-1]}")
  next_line "$i" 20 "address"
  case $line in
    "listening /ip4/${addresses[i]}/tcp/"*/p2p/*) ;;
    *) fail "peer $i: expected to listen at ${addresses[i]}, said: $line" ;;
  esac
  echo "peer $i: $line"
  [ -n "$first" ] || first=${line#listening }
done

ask() { # i command pattern
  echo "${2}" >&"${input[$1]}"
  next_line "$1" 20 "answer to \"$2\""
  echo "peer $1> $2: $line"
  # shellcheck disable=SC2053 # a glob pattern
  [[ $line == $3 ]] || fail "peer $1: \"$2\" answered \"$line\", expected $3"
}
# The routing tables fill from the bootstrap: every node should learn the other three.
for ((i = 0; i < peers; i++)); do
  for attempt in $(seq 20); do
    echo "peers" >&"${input[i]}"
    next_line "$i" 20 "answer to \"peers\""
    [ "$line" = "peers $((peers - 1))" ] && break
    [ "$attempt" = 20 ] && fail "peer $i: $line after 10 s, expected peers $((peers - 1))"
    sleep 0.5
  done
  echo "peer $i> peers: $line"
done
ask 1 "put greeting hello-over-veth" "ok [1-4]"
ask 2 "put members two 2" "ok [1-4]"
ask 0 "put members zero 0" "ok [1-4]"
ask 3 "get greeting" "value hello-over-veth expires_in *"
ask 3 "get members" "dict two=2 zero=0"
ask 2 "get greeting" "value hello-over-veth expires_in *"
for ((i = 0; i < peers; i++)); do
  echo "quit" >&"${input[i]}"
  close_fd "${input[i]}"
done
for ((i = 0; i < peers; i++)); do
  finished "${dht_pids[i]}" "dht_node $i"
  close_fd "${output[i]}"
done

# ---- 2. an averaging round -----------------------------------------------------------------
elements=1000000
echo "== averaging: ${peers} moshpit_swarm peers, ${elements} float32 each, one group" \
  "(at ${SECONDS} s)"
hosts=$(IFS=,; echo "${addresses[*]}")
avg_pids=()
for ((i = 0; i < peers; i++)); do
  start_talking "$i" "avg$i" "$moshpit" --rank "$i" --peers "$peers" --group "$peers" \
    --rounds 1 --elements "$elements" --hosts "$hosts" --base-port 29500
  avg_pids+=("${background[-1]}")
done
for ((i = 0; i < peers; i++)); do
  next_line "$i" 60 "\"ready\""
  [ "$line" = "ready 1" ] || fail "peer $i: expected ready 1, said: $line"
done
for ((i = 0; i < peers; i++)); do
  echo "go" >&"${input[i]}"
done
results=""
for ((i = 0; i < peers; i++)); do
  next_line "$i" 90 "round result"
  echo "peer $i: $line"
  results+="$line"$'\n'
done
for ((i = 0; i < peers; i++)); do
  close_fd "${input[i]}" # the end of the rounds: each peer leaves
done
for ((i = 0; i < peers; i++)); do
  finished "${avg_pids[i]}" "moshpit_swarm rank $i"
  close_fd "${output[i]}"
done
# Rank r started with r + pattern(i): the mean is (peers - 1) / 2 + pattern(i) everywhere.
verdict=$(awk -v peers="$peers" -v elements="$elements" '
  function field(name,   k) { for (k = 1; k < NF; k++) if ($k == name) return $(k + 1); return "" }
  NF == 0 { next }
  {
    n++
    if (field("error") != "") bad = bad " rank " field("rank") " failed (error " field("error") ")"
    if (field("group") + 0 != peers + 0) bad = bad " rank " field("rank") " grouped " field("group")
    if (field("fraction") + 0 != 1) bad = bad " rank " field("rank") " averaged " field("fraction")
    squares += field("squares"); sent += field("sent")
    if (field("seconds") + 0 > slowest) slowest = field("seconds")
  }
  END {
    if (n != peers) bad = bad " " n " results"
    rms = sqrt(squares / (peers * elements)); before = sqrt((peers * peers - 1) / 12)
    if (!(rms <= 1e-5 * before)) bad = bad " rms from the mean " rms
    printf "%s|rms from the mean %.3g (before: %.4g), %.1f MB sent in all, slowest %.2f s\n",
      bad, rms, before, sent / 1e6, slowest
  }' <<< "$results")
[ -z "${verdict%%|*}" ] || fail "averaging:${verdict%%|*}"
echo "averaged to the exact mean: ${verdict#*|}"

# ---- 3. the example trainer ----------------------------------------------------------------
if [ -n "$trainer" ]; then
  echo "== trainer: ${peers} collaborative_trainer peers, one per namespace, --join over veth" \
    "(at ${SECONDS} s)"
  # Peer 0's address is known before it starts: its identity file is made first (dht_node
  # --client prints the PeerId). So every peer starts at once and the others' bootstrap
  # retries until peer 0 listens; none waits on another's start-up (loading the data set),
  # and all train together until --max-time.
  client=$(run_in 0 "$dht_node" --identity "$dir/peer0.key" --client < /dev/null)
  join="/ip4/${addresses[0]}/tcp/31337/p2p/${client#client }"
  echo "peer 0 will listen at $join"
  # Matchmaking starts 3 s before an epoch's estimated end, so that a peer slowed down by a
  # busy machine still finds the others' group.
  train=(--model mlp --run-id netns --seed 3 --lr 0.006 --epochs 0 --max-time 12
    --batch-size 32 --target-batch-size 512 --matchmaking-time 3 --join-timeout 60)
  train_pids=()
  for ((i = 0; i < peers; i++)); do
    args=(--listen "/ip4/${addresses[i]}/tcp/31337" --report "$dir/trainer$i")
    if [ "$i" = 0 ]; then
      args+=(--identity "$dir/peer0.key")
    else
      args+=(--join "$join")
    fi
    run_in "$i" "$trainer" "${train[@]}" "${args[@]}" > "$dir/trainer$i.log" 2>&1 &
    background+=("$!")
    train_pids+=("$!")
  done
  for ((i = 0; i < peers; i++)); do
    finished "${train_pids[i]}" "trainer peer $i"
    echo "trainer peer $i exited at ${SECONDS} s"
  done
  grep -q "collaborative_trainer --join $join\$" "$dir/trainer0.log" ||
    fail "trainer peer 0 did not listen at $join"
  # Each peer finished, and its epochs hold others' samples too (--in-swarm): it trained in
  # the swarm it joined. Rounds averaged with others: at least two peers must have some (a
  # peer slowed down by a busy machine may miss every group of a short run).
  averaging=0
  for ((i = 0; i < peers; i++)); do
    report="$dir/trainer$i/report.json"
    "$checker" "$report" --finished 1 --min-attributed 0 --in-swarm > "$dir/check.txt" ||
      { cat "$dir/check.txt"; fail "trainer peer $i: report"; }
    averaged=$(sed -n 's/.*"rounds_averaged": \([0-9]*\).*/\1/p' "$report" | head -1)
    [ "${averaged:-0}" -ge 1 ] && averaging=$((averaging + 1))
    echo "peer $i: $(tail -1 "$dir/check.txt"), ${averaged:-0} rounds averaged with others;" \
      "$(grep -m1 '^test accuracy' "$dir/trainer$i.log")"
  done
  [ "$averaging" -ge 2 ] || fail "only ${averaging} trainer peers averaged with another"
else
  echo "== trainer: not built (it needs libtorch and Fashion-MNIST): not run"
fi

# ---- the links -----------------------------------------------------------------------------
echo "== traffic per namespace (at ${SECONDS} s)"
stats() { # i interface counter
  ip netns exec "${names[$1]}" cat "/sys/class/net/$2/statistics/$3"
}
for ((i = 0; i < peers; i++)); do
  lo_state=$(ip -n "${names[i]}" -o link show lo | grep -o 'state [A-Z]*')
  eth_sent=$(stats "$i" eth0 tx_bytes)
  lo_sent=$(stats "$i" lo tx_packets)
  tbf_sent=$(tc -n "${names[i]}" -s qdisc show dev eth0 | sed -n 's/^ *Sent \([0-9]*\) bytes.*/\1/p')
  echo "peer $i ${addresses[i]}: eth0 sent ${eth_sent} bytes (${tbf_sent} through tbf)," \
    "lo ${lo_state}, ${lo_sent} packets"
  if [ "$lo_state" != "state DOWN" ] || [ "$lo_sent" != 0 ]; then
    fail "peer $i used loopback"
  fi
  [ "$tbf_sent" -ge 1000000 ] || fail "peer $i: only ${tbf_sent} bytes through tbf"
done
echo "PASS: DHT, averaging${trainer:+ and trainer} across ${peers} network namespaces" \
  "in ${SECONDS} s"
