#!/usr/bin/env bash
# Two OS processes talk over loopback TCP; the server restarts with the same identity file
# on the same port and is reachable again at the same address.
set -euo pipefail
peer=$1
dir=$(mktemp -d)
server=""
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

start_server() { # port
  rm -f "$dir/address"
  "$peer" serve "$dir/identity" "$1" "$dir/address" &
  server=$!
  for _ in $(seq 300); do
    [ -s "$dir/address" ] && return 0
    kill -0 "$server" 2>/dev/null || { echo "server exited early"; exit 1; }
    sleep 0.1
  done
  echo "server did not start"
  exit 1
}

start_server 0
first_address=$(cat "$dir/address")
echo "server 1 at $first_address"
[ "$(stat -c %a "$dir/identity")" = 600 ] || { echo "identity file is not 0600"; exit 1; }
first=$("$peer" call "$first_address" 20)
echo "client 1: $first"

kill -TERM "$server"
wait "$server"
server=""
port=${first_address#*/tcp/}
port=${port%%/*}
start_server "$port"
second_address=$(cat "$dir/address")
echo "server 2 at $second_address"
[ "$first_address" = "$second_address" ] || { echo "the restarted server has another address"; exit 1; }
second=$("$peer" call "$second_address" 20)
echo "client 2: $second"
[ "$first" != "$second" ] || { echo "both answers came from one process"; exit 1; }
echo "two processes talked over TCP; the restarted peer was reachable again"
