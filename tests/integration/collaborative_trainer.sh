#!/usr/bin/env bash
# collaborative_trainer end to end on loopback TCP, one scenario per call:
#   swarm    3 peers (mlp) reach test accuracy > 0.70 with identical final parameters, and
#            report.json has every field, attributed_fraction >= 0.95 for every peer
#   killed   the same with peer 2 killed mid-run: the others finish, the report shows it left
#   churn    peers replaced every few seconds: each replacement loads state first; the
#            last may still be joining when the run ends (then it is stopped, not_joined)
#            (these two do not check attributed_fraction: a peer that lives a few seconds
#            has fixed costs the swarm's peers amortise)
#   monitor  monitor --once --json against a running 2-peer swarm reports 2 peers and the run
#   errors   bad input gives a clear message and a non-zero exit
# usage: collaborative_trainer.sh TRAINER MONITOR CHECKER SCENARIO
set -euo pipefail
trainer=$1 monitor=$2 checker=$3 scenario=$4
dir=$(mktemp -d)
background=""
cleanup() {
  if [ -n "$background" ]; then
    kill "$background" 2>/dev/null || true
    wait "$background" 2>/dev/null || true
  fi
  rm -rf "$dir"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  for log in "$dir"/report/logs/*.log; do
    [ -s "$log" ] && { echo "--- $log"; tail -20 "$log"; }
  done
  exit 1
}

# A short MLP run; extra arguments are added.
train() {
  local status=0
  "$trainer" --model mlp --peers 3 --lr 0.006 --seed 3 --report "$dir/report" "$@" \
    > "$dir/out.txt" 2>&1 || status=$?
  [ "$status" -eq 0 ] || { cat "$dir/out.txt"; fail "the trainer exited with $status"; }
  tail -15 "$dir/out.txt"
}

# Runs the trainer with bad input: it must fail and say `expected`.
refuse() {
  local expected=$1
  shift
  if "$trainer" "$@" > "$dir/out.txt" 2>&1; then
    cat "$dir/out.txt"
    fail "accepted: $*"
  fi
  grep -q -- "$expected" "$dir/out.txt" || { cat "$dir/out.txt"; fail "no \"$expected\" for: $*"; }
  echo "refused as expected: $* -> $(grep -m1 -- "$expected" "$dir/out.txt")"
}

case $scenario in
swarm)
  train --epochs 15
  "$checker" "$dir/report/report.json" --min-accuracy 0.70 --finished 3 --same-parameters
  [ -s "$dir/report/metrics.csv" ] || fail "no metrics.csv"
  ;;
killed)
  train --epochs 40 --kill 2@3
  "$checker" "$dir/report/report.json" --min-accuracy 0.70 --finished 2 --live 2 \
    --killed 2 --min-attributed 0
  ;;
churn)
  train --epochs 30 --churn 2
  "$checker" "$dir/report/report.json" --min-accuracy 0.70 --finished 2 --live 3 \
    --replacements 1 --min-attributed 0
  ;;
monitor)
  "$trainer" --model mlp --peers 2 --epochs 1000 --max-time 60 --run-id monitored \
    --report "$dir/report" > "$dir/out.txt" 2>&1 &
  background=$!
  address=""
  for _ in $(seq 60); do
    address=$(sed -n 's/.*monitor --join \([^ ]*\).*/\1/p' "$dir/out.txt" | head -1)
    [ -n "$address" ] && break
    sleep 0.5
  done
  [ -n "$address" ] || { cat "$dir/out.txt"; fail "the trainer printed no address"; }
  for _ in $(seq 30); do
    "$monitor" --join "$address" --run-id monitored --once --json > "$dir/snapshot.json" \
      2> "$dir/monitor.err" || { cat "$dir/monitor.err"; fail "monitor failed"; }
    grep -q '"peers": 2' "$dir/snapshot.json" && break
    sleep 1
  done
  cat "$dir/snapshot.json"
  grep -q '"peers": 2' "$dir/snapshot.json" || fail "the monitor did not see 2 peers"
  grep -q '"run_id": "monitored"' "$dir/snapshot.json" || fail "wrong run id"
  ;;
errors)
  refuse "dataset-fashion-mnist" --data "$dir/nothing-here" --report "$dir/report"
  refuse "bad multiaddr" --join /ip4/127.0.0.1/tcp/notaport --report "$dir/report"
  refuse "no_peers\|could not be reached\|not reached\|bootstrap" --report "$dir/report" \
    --join /ip4/127.0.0.1/tcp/9/p2p/BgxkNGd8eJujXhKQbZAFfoMFK8CmvGX9YAmbft99hwjs \
    --join-timeout 2
  refuse "peers" --peers 0
  refuse "cannot write the report directory" --report /proc/hivemesh-report
  ;;
*)
  fail "unknown scenario $scenario"
  ;;
esac
echo "PASS: $scenario"
