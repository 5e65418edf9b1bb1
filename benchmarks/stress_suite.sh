#!/usr/bin/env bash
# Run the default test suite N times while K busy loops hold the CPU, and print pass/fail and the
# wall time of each run: the suite must not flake on a loaded machine (issue 16).
#   benchmarks/stress_suite.sh [N=5] [K=2] [extra pytest args...]
# Example: benchmarks/stress_suite.sh 3 2 tests/slack   (three runs of tests/slack under 2 loops)
# Each run's output is kept in .stress/run-<i>.log; the script exits 1 if any run failed.
set -u
cd "$(dirname "$0")/.."
runs=${1:-5}
loops=${2:-2}
shift $(( $# > 2 ? 2 : $# ))
py=.venv/bin/python
[ -x "$py" ] || { echo "no $py: run 'make .venv/bin/.installed' first" >&2; exit 2; }
mkdir -p .stress
pids=()
stop_loops() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; }
trap stop_loops EXIT INT TERM
for _ in $(seq 1 "$loops"); do
  python3 -c 'while True: pass' &
  pids+=("$!")
done
failed=0
for i in $(seq 1 "$runs"); do
  start=$(date +%s)
  "$py" -m pytest -p no:cacheprovider "$@" > ".stress/run-$i.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  summary=$(grep -E '(passed|failed|error)' ".stress/run-$i.log" | tail -1)
  if [ "$rc" -eq 0 ]; then verdict=PASS; else verdict=FAIL; failed=$((failed + 1)); fi
  printf 'run %d/%d under %d busy loops: %s in %dm%02ds (%s)\n' \
    "$i" "$runs" "$loops" "$verdict" $((secs / 60)) $((secs % 60)) "$summary"
  [ "$rc" -eq 0 ] || grep -E '^(FAILED|ERROR) tests/' ".stress/run-$i.log" | sed 's/^/    /'
done
echo "$((runs - failed))/$runs runs passed"
[ "$failed" -eq 0 ]
