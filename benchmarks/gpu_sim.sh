#!/usr/bin/env bash
# Ray simulation with client-resources.num-gpus fractions (several ClientApp actors sharing
# one GPU) vs the same cell on the same machine's CPUs (docs/BENCHMARKS.md "GPU").
#
# The cell (FedAMP Table 3's): FedAMP, CNN, 62 clients, practical 3 groups (80% dominant
# classes), every client every round,
# 1 epoch of batch 32 at lr 0.05, 5 rounds (MODEL, ROUNDS: another model / round count), FMNIST from DATA_ROOT (its four IDX .gz files).
# Run 1 (gpu): device auto, num-cpus 1, num-gpus FRACTION per client; nvidia-smi's compute
# apps are sampled every 2 s into OUT/smi.csv beside `ps` of the ClientApp actors.
# Run 2 (cpu): the same cell with num-gpus 0 and device cpu (as many actors as cores).
# Prints seconds per round (median of round-to-round differences) of each and their ratio.
#
#   bash benchmarks/gpu_sim.sh DATA_ROOT OUT [FRACTION]     (python: $PYTHON or python3;
#   MODEL=resnet18 ROUNDS=3 for a model whose local epoch is GPU-sized)
set -uo pipefail
root=$(cd "$1" && pwd); out=$2; frac=${3:-0.1}
py=${PYTHON:-python3}
model=${MODEL:-cnn}; rounds=${ROUNDS:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 PYTHONUNBUFFERED=1

cell() {  # name device num-gpus
  cat > "$out/$1.yaml" <<EOF
strategy: fedamp
rounds: $rounds
clients: 62
fraction-fit: 1.0
eval-every: 1
model: $model
device: $2
seed: 0
output-dir: $out
run-name: $1
client-resources: {num-cpus: 1, num-gpus: $3}
data: {dataset: fmnist, partition: practical, groups: 3, dominant-share: 0.8, subsample: null, root: $root}
train: {epochs: 1, batch-size: 32, lr: 0.05}
EOF
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$py" -c "import torch, flwr, ray; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'flwr', flwr.__version__, 'ray', ray.__version__)"

cell gpu auto "$frac"
( while true; do
    ts=$(date +%s)
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader \
      | sed "s/^/$ts,/" >> "$out/smi.csv"
    ps -eo pid,args | grep "[r]ay::ClientAppActor" | sed "s/^/$ts /" >> "$out/actors.txt"
    sleep 2
  done ) &
poll=$!
(cd "$here" && "$py" -m flower_pfl.cli run --config "$out/gpu.yaml") > "$out/gpu.log" 2>&1
echo "gpu run exit $?"
kill $poll 2>/dev/null
cell cpu cpu 0
(cd "$here" && "$py" -m flower_pfl.cli run --config "$out/cpu.yaml") > "$out/cpu.log" 2>&1
echo "cpu run exit $?"

"$py" - "$out" <<'EOF'
import csv, json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
res = {}
for name in ("gpu", "cpu"):
    try:
        s = json.loads((out / name / "summary.json").read_text())
    except OSError as exc:
        print(name, "no summary:", exc); continue
    rows = s["rounds"]
    per = statistics.median(b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:]))
    res[name] = per
    print(f"{name}: status {s['status']}, s/round {per:.2f}, first round {rows[0]['elapsed_s']:.1f} s, "
          f"final mean {s['final']['personal_mean']:.4f}")
if len(res) == 2:
    print(f"cpu / gpu seconds per round = {res['cpu'] / res['gpu']:.2f}")
apps = {}
try:
    for row in csv.reader(open(out / "smi.csv")):
        apps.setdefault(row[0], set()).add(row[1].strip())
    print("most processes on the GPU at once:", max((len(v) for v in apps.values()), default=0))
except OSError:
    print("no smi.csv")
EOF
