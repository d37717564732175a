#!/usr/bin/env bash
# `make test`'s tiers, arranged to fit the 30-minute bar on two shared cores.
#
# The lab tier spends most of its time waiting (SSH round trips, engines and Prometheus coming
# up, scrape intervals, timed faults), and so do the component tests (measured: the component
# tier used 0.63 of one core over its run), so the lab runs beside the unit and component
# tiers. The real tier's vLLM engines keep both cores busy and its profiles are judged by how
# well they fit, so it runs alone, after both.
#
# The lab's output goes to .test-logs/lab.log while it runs (`tail -f` it) and is printed in
# full when it ends. The exit status is the first tier's that failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=(.venv/bin/python -m pytest)
mkdir -p .test-logs
lab_log=.test-logs/lab.log

echo "test: the lab tier runs in the background; its log: $lab_log"
"${PYTEST[@]}" -o cache_dir=.pytest_cache/lab --durations=12 tests/lab >"$lab_log" 2>&1 &
lab_pid=$!
# whatever ends this script ends the lab run it started (by its pid, nothing else)
trap 'kill "$lab_pid" 2>/dev/null' EXIT

"${PYTEST[@]}" tests/unit tests/component
quick=$?

wait "$lab_pid"
lab=$?
trap - EXIT
echo "================================ the lab tier =================================="
cat "$lab_log"

"${PYTEST[@]}" tests/real
real=$?

for rc in "$quick" "$lab" "$real"; do
  if [ "$rc" -ne 0 ]; then
    exit "$rc"
  fi
done
