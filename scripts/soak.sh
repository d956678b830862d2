#!/usr/bin/env bash
# The soak benchmark (not in CI): 4 peers of the example trainer train together on loopback for
# --minutes (default 30), each with --max-time of that length, while this script samples every
# peer's VmRSS and VmHWM (/proc/PID/status). At the end it prints per peer the RSS at the end
# of warm-up, the peak after it, the RSS at the end and the growth after warm-up,
#   (peak after warm-up - RSS at warm-up end) / RSS at warm-up end,
# and fails (exit 1) if a peer's growth reaches --max-growth (default 5%) or a peer or the
# trainer failed. Writes to --out (default soak-run/): rss.csv (every sample), summary.json,
# rss.png and rss-PEER.dat (gnuplot), trainer.log and the trainer's report/.
# usage: soak.sh [--minutes M] [--warmup-minutes W] [--interval S] [--max-growth P]
#                [--out DIR] [--no-build] [-- TRAINER-OPTIONS...]
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=30
# Warm-up is the first 5 minutes of the run, a generous margin: each peer's RSS climbs while it
# loads libtorch and the data set and forms its first groups; in our runs it then stayed
# within 3 MiB (about 1%) from the first minute on.
# Growth after that accumulates with time, which is what a soak looks for.
warmup_minutes=5
interval=10
max_growth=5
out=soak-run
build=yes
peers=4
trainer_args=()
usage() { sed -n '2,11s/^# \{0,1\}//p' "$0"; }
while [ $# -gt 0 ]; do
  case $1 in
    --minutes) minutes=$2; shift 2 ;;
    --warmup-minutes) warmup_minutes=$2; shift 2 ;;
    --interval) interval=$2; shift 2 ;;
    --max-growth) max_growth=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-build) build=no; shift ;;
    --) shift; trainer_args=("$@"); break ;;
    -h | --help) usage; exit 0 ;;
    *) echo "soak.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
number='^[0-9]+([.][0-9]+)?$'
for value in "$minutes" "$warmup_minutes" "$interval" "$max_growth"; do
  [[ $value =~ $number ]] || { echo "soak.sh: not a number: $value" >&2; exit 2; }
done
seconds=$(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 }')
warmup=$(awk -v m="$warmup_minutes" 'BEGIN { printf "%d", m * 60 }')
if [ "$seconds" -le 0 ] || [ "$warmup" -ge "$seconds" ]; then
  echo "soak.sh: the warm-up must be shorter than the run" >&2
  exit 2
fi

root=${HIVEMESH_BUILD_ROOT:-build}
trainer=${root}/release/examples/collaborative_trainer
if [ "$build" = yes ]; then
  export CCACHE_BASEDIR="${PWD}" CCACHE_NOHASHDIR=true
  scripts/build-release.sh collaborative_trainer
fi
[ -x "$trainer" ] || { echo "soak.sh: no trainer at $trainer" >&2; exit 1; }

# Only what an earlier soak wrote there: --out may name a directory that holds more.
mkdir -p "$out"
rm -rf "$out/report"
rm -f "$out"/{rss.csv,rss-*.dat,rss.gp,rss.png,summary.json,trainer.log,gnuplot.log}
csv=$out/rss.csv

launcher=
worker_pids=()
cleanup() {
  # The peers stop on SIGTERM (and on their launcher's death); SIGKILL whatever is left.
  local pid
  for pid in $launcher "${worker_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 50); do
    local alive=no
    for pid in $launcher "${worker_pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=yes; done
    [ $alive = no ] && return 0
    sleep 0.2
  done
  for pid in $launcher "${worker_pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now() { awk -v s="$EPOCHREALTIME" -v t0="$started" 'BEGIN { printf "%.1f", s - t0 }'; }

# No --listen or --join: the launcher's peers listen on 127.0.0.1 and bootstrap from peer 0.
# --epochs 0 lifts the epoch limit, so --max-time alone ends the run.
started=$EPOCHREALTIME
"$trainer" --peers "$peers" --epochs 0 --max-time "$seconds" --report "$out/report" \
  "${trainer_args[@]}" >"$out/trainer.log" 2>&1 &
launcher=$!

# The launcher starts peer 0, then the others once it listens; each has --rank N in its
# command line.
declare -A pid_of=()
for _ in $(seq 600); do
  for pid in $(pgrep -P "$launcher" || true); do
    rank=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | sed -n '/^--rank$/{n;p;q}' || true)
    [ -n "$rank" ] && pid_of[$rank]=$pid
  done
  [ ${#pid_of[@]} -ge "$peers" ] && break
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.1
done
if [ ${#pid_of[@]} -lt "$peers" ]; then
  echo "soak.sh: the trainer started ${#pid_of[@]} of $peers peers; see $out/trainer.log" >&2
  exit 1
fi
for rank in $(seq 0 $((peers - 1))); do worker_pids+=("${pid_of[$rank]}"); done
echo "soak: $peers peers (pids ${worker_pids[*]}) train for $minutes min," \
  "warm-up $warmup_minutes min, RSS every $interval s -> $out/"

echo "time_s,peer,pid,rss_kib,hwm_kib" >"$csv"
# The launcher evaluates and writes its report after the peers end: allow it 10 minutes.
deadline=$((seconds + 600))
while kill -0 "$launcher" 2>/dev/null; do
  t=$(now)
  for rank in "${!pid_of[@]}"; do
    # A peer that has exited (or is a zombie) has no VmRSS line.
    awk -v t="$t" -v rank="$rank" -v pid="${pid_of[$rank]}" '
      /^VmRSS:/ { rss = $2 } /^VmHWM:/ { hwm = $2 }
      END { if (rss != "") printf "%s,%s,%s,%s,%s\n", t, rank, pid, rss, hwm }' \
      "/proc/${pid_of[$rank]}/status" 2>/dev/null >>"$csv" || true
  done
  if awk -v t="$t" -v d="$deadline" 'BEGIN { exit !(t > d) }'; then
    echo "soak.sh: the trainer is still running after $deadline s; stopping it" >&2
    exit 1
  fi
  sleep "$interval"
done
wait "$launcher" && trainer_status=0 || trainer_status=$?
launcher=
elapsed=$(now)
# Peer 0 writes a snapshot every epoch (thousands of 200 kB files in a long run); the report
# has been written from them.
rm -rf "$out/report/snapshots"

# Per peer: the RSS at the last sample inside the warm-up, the peak after it, the last RSS,
# and how long the peer was seen (a peer alive much less than --max-time died early).
awk -F, -v warmup="$warmup" -v seconds="$seconds" -v interval="$interval" \
  -v max_growth="$max_growth" -v trainer_status="$trainer_status" -v elapsed="$elapsed" \
  -v minutes="$minutes" -v warmup_minutes="$warmup_minutes" -v json="$out/summary.json" '
  NR == 1 { next }
  {
    p = $2; t = $1 + 0; rss = $4 + 0
    if (!(p in first)) { first[p] = t; peak[p] = 0; n++ }
    last[p] = t; end_rss[p] = rss; hwm[p] = $5 + 0
    if (t <= warmup) warm[p] = rss
    else if (rss > peak[p]) peak[p] = rss
  }
  END {
    failed = trainer_status != 0
    printf "\n%-5s %14s %14s %14s %14s %10s %9s  %s\n", "peer", "warm-up MiB", "peak after MiB",
           "end MiB", "VmHWM MiB", "growth %", "alive s", "verdict"
    peers_json = ""
    for (p = 0; p < n; p++) {
      verdict = "ok"
      growth = -1
      if (!(p in warm) || peak[p] == 0) verdict = "no samples after warm-up"
      else {
        growth = 100 * (peak[p] - warm[p]) / warm[p]
        if (growth >= max_growth) verdict = "grew"
      }
      # The last sample may fall up to an interval before the exit.
      alive = last[p] - first[p]
      if (alive < seconds - 2 * interval - 5) verdict = "died early"
      if (verdict != "ok") failed = 1
      printf "%-5d %14.1f %14.1f %14.1f %14.1f %10.2f %9.0f  %s\n", p, warm[p] / 1024,
             peak[p] / 1024, end_rss[p] / 1024, hwm[p] / 1024, growth, alive, verdict
      separator = p ? "," : ""
      peers_json = peers_json sprintf("%s\n    {\"peer\": %d, \"warmup_rss_kib\": %d, " \
        "\"peak_after_warmup_kib\": %d, \"end_rss_kib\": %d, \"vm_hwm_kib\": %d, " \
        "\"growth_percent\": %.3f, \"seconds_alive\": %.1f, \"verdict\": \"%s\"}",
        separator, p, warm[p], peak[p], end_rss[p], hwm[p], growth, alive, verdict)
    }
    if (n == 0) failed = 1
    printf "{\n  \"minutes\": %s,\n  \"warmup_minutes\": %s,\n  \"interval_seconds\": %s,\n" \
           "  \"max_growth_percent\": %s,\n  \"elapsed_seconds\": %s,\n" \
           "  \"trainer_status\": %d,\n  \"passed\": %s,\n  \"peers\": [%s\n  ]\n}\n",
           minutes, warmup_minutes, interval, max_growth, elapsed, trainer_status,
           failed ? "false" : "true", peers_json > json
    if (trainer_status != 0) printf "the trainer exited with status %d\n", trainer_status
    exit failed
  }' "$csv" && passed=yes || passed=no

if command -v gnuplot >/dev/null; then
  # One data file per peer: the CSV interleaves the peers, which would break their lines.
  for rank in $(seq 0 $((peers - 1))); do
    awk -F, -v r="$rank" 'NR > 1 && $2 == r { print $1 / 60, $4 / 1024 }' "$csv" \
      >"$out/rss-$rank.dat"
  done
  {
    echo "set terminal pngcairo size 900,540 noenhanced"
    echo "set output '$out/rss.png'"
    echo "set grid"
    echo "set key outside right"
    echo "set title 'RSS of each peer ($minutes min, warm-up $warmup_minutes min)'"
    echo "set xlabel 'minutes'"
    echo "set ylabel 'RSS (MiB)'"
    echo "set arrow from $warmup_minutes, graph 0 to $warmup_minutes, graph 1 nohead dashtype 2"
    echo -n "plot"
    for rank in $(seq 0 $((peers - 1))); do
      [ "$rank" -gt 0 ] && echo -n ","
      echo -n " '$out/rss-$rank.dat' using 1:2 with lines title 'peer $rank'"
    done
    echo
  } >"$out/rss.gp"
  gnuplot "$out/rss.gp" 2>"$out/gnuplot.log" ||
    echo "soak.sh: gnuplot failed; see $out/gnuplot.log" >&2
fi

echo "run: ${elapsed} s; samples: $out/rss.csv, summary: $out/summary.json"
[ "$passed" = yes ] || { echo "soak: FAILED" >&2; exit 1; }
echo "soak: passed (growth after warm-up under ${max_growth}% for every peer)"
