#!/usr/bin/env bash
# bench/thesis_matrix on one factor at a tiny sample budget: every run finishes, the markdown
# has the factor's table with a row per value and a Δ single figure, and the charts exist.
# It never looks at the accuracies or timings.
# usage: thesis_matrix_smoke.sh THESIS_MATRIX TRAINER
set -euo pipefail
matrix=$1 trainer=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "FAILED: $*"
  exit 1
}
"$matrix" --factor local_updates --samples 2500 --model mlp --trainer "$trainer" \
  --output "$dir/docs/matrix.md" --runs "$dir/runs" || fail "thesis_matrix exited with $?"
md="$dir/docs/matrix.md"
cat "$md"
grep -q '^## Local updates' "$md" || fail "no local_updates table"
grep -Eq '^\| off \| 0\.[0-9]{4} \| [+-]0\.[0-9]{4} \|' "$md" || fail "no row for off"
grep -Eq '^\| on \| 0\.[0-9]{4} \| [+-]0\.[0-9]{4} \|' "$md" || fail "no row for on"
grep -q '^- \*\*local_updates\*\*: test accuracy is highest' "$md" || fail "no findings"
[ -s "$dir/docs/matrix/accuracy-local_updates.png" ] || fail "no accuracy chart"
runs=$(ls "$dir"/runs/*/report/report.json | wc -l)
[ "$runs" -eq 4 ] || fail "expected 4 runs' reports, found $runs"
echo "thesis_matrix smoke ok"
