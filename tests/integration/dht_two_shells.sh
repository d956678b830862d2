#!/usr/bin/env bash
# Two dht_node processes, as in two shells: B joins A, each reads what the other put
# (a plain value and a dictionary subkey), then both quit cleanly.
#   usage: dht_two_shells.sh <path to dht_node>
set -euo pipefail
node=$1
dir=$(mktemp -d)
pid_a=""
pid_b=""
cleanup() {
  exec 3>&- 4<&- 5>&- 6<&- 2>/dev/null || true
  for pid in $pid_a $pid_b; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$dir"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  for name in a b; do
    if [ -s "$dir/$name.err" ]; then
      echo "--- stderr of node $name:"
      cat "$dir/$name.err"
    fi
  done
  exit 1
}

# A node whose stdin and stdout are fifos held open by this script; `timeout` makes sure
# no node outlives a hung test.
mkfifo "$dir/a.in" "$dir/a.out" "$dir/b.in" "$dir/b.out"

timeout 60 "$node" <"$dir/a.in" >"$dir/a.out" 2>"$dir/a.err" &
pid_a=$!
exec 3>"$dir/a.in" 4<"$dir/a.out"

# ask <in fd> <out fd> <command>: sends one command, prints its one-line answer.
ask() {
  local line
  echo "$3" >&"$1"
  IFS= read -r -t 20 -u "$2" line || fail "no answer to \"$3\""
  echo "$line"
}

IFS= read -r -t 20 -u 4 first_a || fail "node A printed no address"
case $first_a in
  "listening /ip4/127.0.0.1/tcp/"*/p2p/*) ;;
  *) fail "unexpected first line of A: $first_a" ;;
esac
address_a=${first_a#listening }
echo "A: $address_a"

timeout 60 "$node" --bootstrap "$address_a" <"$dir/b.in" >"$dir/b.out" 2>"$dir/b.err" &
pid_b=$!
exec 5>"$dir/b.in" 6<"$dir/b.out"
IFS= read -r -t 20 -u 6 first_b || fail "node B printed no address"
echo "B: ${first_b#listening }"

# "ask" in a command substitution would run in a subshell whose fail() cannot end the
# script, so each answer is checked here.
expect() { # <in fd> <out fd> <command> <pattern> <who>
  local reply
  reply=$(ask "$1" "$2" "$3") || fail "$5: no answer to \"$3\""
  echo "$5> $3"
  echo "$reply"
  # shellcheck disable=SC2053
  [[ $reply == $4 ]] || fail "$5: \"$3\" answered \"$reply\", expected $4"
}

expect 5 6 "peers" "peers 1" B
expect 5 6 "put greeting hello" "ok [12]" B
expect 3 4 "get greeting" "value hello expires_in *" A
expect 3 4 "peers" "peers 1" A
expect 3 4 "put peers alice 1" "ok [12]" A
expect 5 6 "get peers" "dict*alice=1*" B
expect 5 6 "put peers bob 2" "ok [12]" B
expect 3 4 "get peers" "dict alice=1 bob=2" A
expect 3 4 "get nothing-here" "not_found" A
expect 3 4 "frobnicate" "error unknown command*" A

echo "quit" >&3
echo "quit" >&5
exec 3>&- 5>&-
status=0
wait "$pid_a" || status=$?
pid_a=""
[ "$status" = 0 ] || fail "node A exited with status $status"
wait "$pid_b" || status=$?
pid_b=""
[ "$status" = 0 ] || fail "node B exited with status $status"

# A bad address is a usage error (exit 2), not a crash.
status=0
timeout 20 "$node" --bootstrap /ip4/127.0.0.1/tcp/1 </dev/null >/dev/null 2>"$dir/usage.err" || status=$?
[ "$status" = 2 ] || fail "an address without /p2p/ gave exit status $status, not 2"

echo "two dht nodes exchanged a value and a dictionary; both quit cleanly"
