#!/usr/bin/env bash
# The slow tier (`pytest -m slow`) as two pytest processes side by side, one per core.
#
# Most of a slow test's time is a federation's start-up and its waits (SuperLinks, Ray,
# SuperNodes in network namespaces, a node's heartbeat running out), so two halves overlap
# well on two cores. Half A is the deployment and namespace files and more (listed below;
# the halves took 697 / 811 s in CI on 2026-11-29 before the privacy and same-numbers files
# moved to A, then 669 / 790 s; the tuned-vs-stock deployment file, ~80 s, joined A after
# that run); half B is every
# other slow test -- a new slow file lands in B by itself, nothing is left out. The
# namespace tests pick random names and a random private /24 (tests/netns.py) and the
# federations free loopback ports, so the halves cannot meet.
#
#   bash scripts/slow_tier.sh [PYTEST ARGS...]   # e.g. -x, or --durations=0
#
# Exits non-zero when either half fails; both halves' output is printed, A first (B's time is
# read after A has ended). Ctrl-C or SIGTERM reaches both halves as a Ctrl-C.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
A=(tests/test_netns_deployment.py tests/test_deployment.py tests/test_ray_cluster.py
   tests/test_selffl.py tests/test_console.py tests/test_actor_death.py tests/test_api.py
   tests/test_privacy_run.py tests/test_privacy_sample.py tests/test_data_same_numbers.py
   tests/test_deploy_same_rows.py)
ignore=()
for f in "${A[@]}"; do ignore+=(--ignore="$f"); done
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
t0=$(date +%s)
"$PY" -m pytest -q -m slow -p no:cacheprovider "$@" "${A[@]}" > "$logs/a" 2>&1 & pa=$!
"$PY" -m pytest -q -m slow -p no:cacheprovider "$@" "${ignore[@]}" > "$logs/b" 2>&1 & pb=$!
# Interrupted: hand both halves a Ctrl-C, so their fixtures stop what they started (by PID)
trap 'kill -INT $pa $pb 2>/dev/null; wait $pa $pb; exit 130' INT TERM
wait $pa; echo $? > "$logs/a.rc"; echo $(( $(date +%s) - t0 )) > "$logs/a.s"
wait $pb; echo $? > "$logs/b.rc"; echo $(( $(date +%s) - t0 )) > "$logs/b.s"
rc=0
for half in a b; do
  echo "=== slow tier, half ${half^^} (exit $(cat "$logs/$half.rc"), $(cat "$logs/$half.s") s) ==="
  cat "$logs/$half"
  [ "$(cat "$logs/$half.rc")" = 0 ] || rc=1
done
exit $rc
