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
#   batchnorm  2 peers train the CNN with BatchNorm on a few hundred samples and end with
#            identical parameters and BatchNorm statistics
#   resume   4 peers saving checkpoints every epoch are all killed (SIGKILL) mid-run; started
#            again with --resume, each continues from its checkpoint's epoch, and the run ends
#            within 0.02 test accuracy of an uninterrupted one with the same options
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
batchnorm)
  "$trainer" --model cnn-bn --peers 2 --batch-size 32 --target-batch-size 128 \
    --max-samples 640 --seed 3 --report "$dir/report" > "$dir/out.txt" 2>&1 ||
    { cat "$dir/out.txt"; fail "the trainer failed"; }
  tail -5 "$dir/out.txt"
  "$checker" "$dir/report/report.json" --min-accuracy 0.2 --finished 2 --same-parameters \
    --same-buffers --min-attributed 0
  ;;
resume)
  options=(--model mlp --peers 4 --epochs 40 --lr 0.006 --seed 3)
  "$trainer" "${options[@]}" --report "$dir/straight" > "$dir/straight.txt" 2>&1 ||
    { cat "$dir/straight.txt"; fail "the uninterrupted run failed"; }
  "$trainer" "${options[@]}" --report "$dir/report" --checkpoint "$dir/ckpt" \
    --checkpoint-every 1 > "$dir/out.txt" 2>&1 &
  background=$!
  # Once every peer has saved epoch 15 of 40: SIGKILL to the four, nothing else. The epoch is
  # the u64 after the magic, the version, run_id "fashion-mnist" and "adam" (docs/architecture.md).
  saved_epoch() { od -An -tu8 -j37 -N8 "$1" 2>/dev/null | tr -d ' ' || true; }
  ready() {
    local file epoch
    for rank in 0 1 2 3; do
      file="$dir/ckpt/peer-$rank.ckpt"
      epoch=$(saved_epoch "$file")
      [ -n "$epoch" ] && [ "$epoch" -ge 15 ] || return 1
    done
  }
  for _ in $(seq 1200); do
    ready && break
    sleep 0.1
  done
  ready || fail "the peers did not save epoch 15"
  killed=0
  for cmdline in /proc/[0-9]*/cmdline; do
    if tr '\0' ' ' < "$cmdline" 2>/dev/null | grep -q -- "--report $dir/report .*--worker"; then
      pid=${cmdline#/proc/}
      kill -KILL "${pid%/cmdline}" 2>/dev/null && killed=$((killed + 1))
    fi
  done
  [ "$killed" -eq 4 ] || fail "killed $killed peers, not 4"
  wait "$background" || true
  background=""
  for rank in 0 1 2 3; do echo "peer $rank saved epoch $(saved_epoch "$dir/ckpt/peer-$rank.ckpt")"; done
  rm -rf "$dir/report"
  "$trainer" "${options[@]}" --report "$dir/report" --checkpoint "$dir/ckpt" --resume \
    > "$dir/out.txt" 2>&1 || { cat "$dir/out.txt"; fail "the resumed run failed"; }
  tail -5 "$dir/out.txt"
  "$checker" "$dir/report/report.json" --finished 4 --resumed --min-attributed 0 \
    --near-accuracy "$dir/straight/report.json" --within 0.02
  ;;
errors)
  refuse "--resume needs --checkpoint" --resume --report "$dir/report"
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
