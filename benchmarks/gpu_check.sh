#!/usr/bin/env bash
# The GPU check: one command on a machine with one GPU, one markdown report on stdout
# (docs/BENCHMARKS.md "GPU").  Python side: benchmarks/gpu_check.py (cells, dry run, report).
#
#   bash benchmarks/gpu_check.sh             # on the GPU machine: <= 8 min, report on stdout
#   bash benchmarks/gpu_check.sh --dry-run   # anywhere: every command parses, every file is
#                                            # there, the plan printed; exit 1 on any problem
# Environment: PYTHON (default .venv/bin/python, else python3: torch, flwr, ray, this tree),
# DATA_ROOT (a folder with the four FMNIST IDX files, .gz or not; default the Debian
# package's), OUT (default a new /tmp/gpu-check.*), STRATEGY (fedavg), FRACTION (num-gpus
# per client, 0.1), RESIDENT (device-resident, auto), PORT (SuperLink, 19092), BUDGET
# (seconds for all steps, 460); SMOKE=1: the same steps at a tiny size, every cell on the
# CPU and no --gpu (the check's own machinery on a machine without a GPU; no GPU numbers).
#
# Steps, with a cap each (a step gets at most what is left of BUDGET) and the estimate from
# the earlier H200 runs (docs/BENCHMARKS.md "GPU": ~35 s of Ray start per simulation; the
# FedAMP cell's CNN 1.7 s/round and ResNet-18 36 s/round on the GPU, 62 s on 16 cores, for
# 20,000 images a round; a deployment ~30 s a round):
#   machine           GPU name, versions                           cap  15  est   5 s
#   sim-cnn-gpu       (a)+(c) CNN, 20 clients, 4 rounds, on the GPU  cap  80  est  45 s
#   sim-resnet18-gpu  (a)+(c) ResNet-18, 20 clients, 3 rounds        cap 110  est  75 s
#   deploy            (b) SuperLink + 2 SuperNodes --gpu 0, 2 rounds cap 110  est  80 s
#   sim-cnn-cpu       (c) the CNN cell on the cores                  cap  80  est  45 s
#   sim-resnet18-cpu  (c) the ResNet-18 cell on the cores            cap 120  est 100 s
#   epoch             (d) one local epoch in process, CPU vs CUDA    cap  50  est  30 s
# Estimated total ~6.5 min; BUDGET 460 s of steps + the report keeps it under 8 min.
# Every process started here is stopped by its PID (and its process group), also on failure.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dry=0
case "${1:-}" in
  --dry-run) dry=1 ;;
  "") ;;
  *) echo "usage: bash benchmarks/gpu_check.sh [--dry-run]" >&2; exit 2 ;;
esac
PY=${PYTHON:-$here/.venv/bin/python}
[[ -x $PY ]] || PY=$(command -v python3 || echo python3)
DATA_ROOT=${DATA_ROOT:-/usr/share/datasets/fashion-mnist}
OUT=${OUT:-$(mktemp -d /tmp/gpu-check.XXXXXX)}
BUDGET=${BUDGET:-460}
PORT=${PORT:-19092}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 PYTHONUNBUFFERED=1
export STRATEGY=${STRATEGY:-fedavg} FRACTION=${FRACTION:-0.1} RESIDENT=${RESIDENT:-auto}
FPL=("$PY" -m flower_pfl.cli)
HELPER=("$PY" "$here/benchmarks/gpu_check.py")
DEP=$OUT/deploy
LINK=127.0.0.1:$PORT
GPU_FLAG=(--gpu 0)
[[ ${SMOKE:-} == 1 ]] && GPU_FLAG=()

# ------------------------------------------------------------------ the plan: commands
cmd_machine=("${HELPER[@]}" machine "$OUT")
sim_cmd() { echo "${FPL[*]@Q} run --config ${OUT@Q}/$1.yaml --quiet --timeout $2"; }
cmd_certs=("${FPL[@]}" certs "$DEP/certs")
cmd_key0=("${FPL[@]}" node-key "$DEP/keys" client-0)
cmd_key1=("${FPL[@]}" node-key "$DEP/keys" client-1)
cmd_link=("${FPL[@]}" superlink --certs "$DEP/certs" --keys-dir "$DEP/keys" --address "$LINK"
          --workdir "$DEP/superlink")
node_cmd() {  # partition-id
  local a=("${FPL[@]}" supernode --superlink "$LINK" --ca "$DEP/certs/ca.crt"
           --key "$DEP/keys/client-$1.key" --partition-id "$1" --num-partitions 2
           --state-dir "$DEP/state-$1" "${GPU_FLAG[@]}" --port $((PORT + 20 + $1))
           --log "$DEP/supernode-$1.log")
  echo "${a[*]@Q}"
}
submit_cmd() { echo "${FPL[*]@Q} submit --superlink $LINK --ca ${DEP@Q}/certs/ca.crt --config ${OUT@Q}/deploy.yaml --results ${OUT@Q}/runs/deploy --quiet --timeout $1"; }
cmd_epoch=("${HELPER[@]}" epoch "$OUT" "$DATA_ROOT")

"${HELPER[@]}" configs "$OUT" "$DATA_ROOT" || { echo "gpu_check: cannot write the YAMLs" >&2; exit 1; }
{
  echo "${cmd_machine[*]@Q}"
  for s in sim-cnn-gpu sim-resnet18-gpu; do sim_cmd $s 100; done
  echo "${cmd_certs[*]@Q}"; echo "${cmd_key0[*]@Q}"; echo "${cmd_key1[*]@Q}"
  echo "${cmd_link[*]@Q}"; node_cmd 0; node_cmd 1; submit_cmd 100
  for s in sim-cnn-cpu sim-resnet18-cpu; do sim_cmd $s 100; done
  echo "${cmd_epoch[*]@Q}"
} > "$OUT/plan.txt"

if (( dry )); then
  echo "gpu_check --dry-run: python $PY, DATA_ROOT $DATA_ROOT, OUT $OUT"
  echo "plan ($OUT/plan.txt; YAMLs beside it):"
  sed 's/^/  /' "$OUT/plan.txt"
  echo "checks:"
  "${HELPER[@]}" check "$OUT/plan.txt"
  exit $?
fi

# ---------------------------------------------------------------------------- running
if [[ ${SMOKE:-} != 1 ]] && { ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; }; then
  echo "gpu_check: no GPU here (nvidia-smi); on a CPU-only machine run --dry-run" >&2
  exit 1
fi
T0=$(date +%s)
PIDS=()
stop_pid() {  # PID: SIGTERM to it (it stops what it started), then its process group killed
  local pid=$1 i
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -KILL -- "-$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}
forget() {  # PID: no longer ours to stop
  local keep=() p
  for p in "${PIDS[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
  PIDS=("${keep[@]}")
}
cleanup() { local p; for p in "${PIDS[@]}"; do stop_pid "$p"; done; PIDS=(); }
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM
start_bg() {  # LOG CMD...: started in its own session; its PID appended to PIDS
  local log=$1; shift
  setsid "$@" > "$log" 2>&1 &
  PIDS+=($!)
}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$(date +%s.%N)" "$4" >> "$OUT/steps.tsv"; }
step() {  # NAME CAP CMDLINE (shell-quoted): run it, stopped by PID at min(CAP, what is left)
  local name=$1 cap=$2 line=$3 l start pid rc
  l=$(left); (( cap > l )) && cap=$l
  start=$(date +%s.%N)
  if (( cap < 15 )); then record "$name" 125 "$start" "$cap"; return; fi
  line=${line//@TIMEOUT@/$((cap - 10))}
  eval "start_bg ${OUT@Q}/$name.log $line"
  pid=${PIDS[-1]}
  local waited=0
  while kill -0 "$pid" 2>/dev/null && (( waited < cap )); do sleep 1; waited=$((waited + 1)); done
  if kill -0 "$pid" 2>/dev/null; then stop_pid "$pid"; rc=124; else wait "$pid"; rc=$?; fi
  forget "$pid"
  record "$name" "$rc" "$start" "$cap"
  echo "gpu_check: $name exit $rc after $(( $(date +%s) - ${start%.*} )) s" >&2
}

# GPU memory and compute processes, every second, for the whole check
[[ ${SMOKE:-} == 1 ]] || start_bg "$OUT/smi.err" bash -c 'while :; do
  m=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  n=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -c .)
  echo "$(date +%s.%N),${m// /},$n" >> "$0/smi.csv"; sleep 1; done' "$OUT"

step machine 15 "${cmd_machine[*]@Q}"
sim_line() { sim_cmd "$1" @TIMEOUT@; }
step sim-cnn-gpu 80 "$(sim_line sim-cnn-gpu)"
step sim-resnet18-gpu 110 "$(sim_line sim-resnet18-gpu)"

# (b) the deployment: certificates and keys, SuperLink, 2 SuperNodes on GPU 0, submit
dstart=$(date +%s.%N)
mkdir -p "$DEP"
"${cmd_certs[@]}" > "$DEP/certs.out" 2>&1 && "${cmd_key0[@]}" >> "$DEP/certs.out" 2>&1 &&
  "${cmd_key1[@]}" >> "$DEP/certs.out" 2>&1
drc=$?
if (( drc == 0 )); then
  start_bg "$DEP/superlink.out" "${cmd_link[@]}"
  link_pid=${PIDS[-1]}
  for i in $(seq 1 60); do grep -q "SuperLink ready" "$DEP/superlink.out" && break; sleep 1; done
  eval "start_bg ${DEP@Q}/supernode-0.out $(node_cmd 0)"; n0=${PIDS[-1]}
  eval "start_bg ${DEP@Q}/supernode-1.out $(node_cmd 1)"; n1=${PIDS[-1]}
  dcap=$(( 110 - ($(date +%s) - ${dstart%.*}) ))
  step deploy-submit "$dcap" "$(submit_cmd @TIMEOUT@)"
  drc=$(tail -1 "$OUT/steps.tsv" | cut -f2)
  for p in "$n0" "$n1" "$link_pid"; do stop_pid "$p"; forget "$p"; done
fi
record deploy "$drc" "$dstart" 110

step sim-cnn-cpu 80 "$(sim_line sim-cnn-cpu)"
step sim-resnet18-cpu 120 "$(sim_line sim-resnet18-cpu)"
step epoch 50 "${cmd_epoch[*]@Q}"
cleanup

"${HELPER[@]}" report "$OUT"
echo
echo "Total time: $(( $(date +%s) - T0 )) s (budget 480 s)"
