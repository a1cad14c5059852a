#!/usr/bin/env bash
# A `flower-pfl run` attached to an existing Ray cluster: a head and a worker node started with
# `ray start` on this machine (1 CPU each), RAY_ADDRESS pointing at the head, so the
# ClientApp actors spread over both nodes. Prints which node (raylet log) hosted each actor,
# then stops ONLY this cluster's processes, by PID (never `ray stop`: it would end every Ray
# process on the machine, other users' simulations included).
#   benchmarks/ray_cluster.sh [config.yaml]        (docs/BENCHMARKS.md (d))
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RAY=$(dirname "$PY")/ray
TMP=$(mktemp -d /tmp/flower-pfl-raycluster-XXXX)
PORT=$($PY -c 'import socket; s=socket.socket(); s.bind(("",0)); print(s.getsockname()[1])')
IP=$($PY -c 'import ray._private.services as s; print(s.get_node_ip_address())')
CFG=${1:-$TMP/run.yaml}
if [ -z "${1:-}" ]; then
  cat > "$CFG" <<EOF
strategy: fedavg
rounds: 3
clients: 4
fraction-fit: 1.0
model: mclr
output-dir: $TMP/out
run-name: cluster
data: {dataset: fmnist, partition: dirichlet, subsample: 3000}
EOF
fi
ours() { pgrep -f -- "$TMP" || true; }  # every process of this cluster names its temp dir
cleanup() { for p in $(ours); do kill "$p" 2>/dev/null || true; done; sleep 3
            if grep -qs ":$PORT" /tmp/ray/ray_current_cluster; then rm -f /tmp/ray/ray_current_cluster; fi
            for p in $(ours); do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
export RAY_DISABLE_USAGE_STATS=1
$RAY start --head --node-ip-address="$IP" --port="$PORT" --num-cpus=1 --num-gpus=0 \
  --include-dashboard=false --temp-dir="$TMP/ray" --disable-usage-stats >"$TMP/head.log" 2>&1
$RAY start --address="$IP:$PORT" --node-ip-address="$IP" --num-cpus=1 --num-gpus=0 \
  >"$TMP/worker.log" 2>&1
RAYLETS=$(pgrep -f -- "raylet.*$TMP" | tr '\n' ' ')
echo "cluster: head + worker at $IP:$PORT; raylets (one per node): $RAYLETS"
RAY_ADDRESS="$IP:$PORT" $PY -c "import ray; ray.init(); print('cluster CPUs:', ray.cluster_resources().get('CPU'), 'nodes:', len([n for n in ray.nodes() if n['Alive']]))"
START=$(date +%s.%N)
RAY_ADDRESS="$IP:$PORT" $PY -m flower_pfl.cli run --config "$CFG" --quiet
END=$(date +%s.%N)
# which node ran which ClientApp actor: each node's raylet log lists the actors it hosted
LOGS="$TMP/ray/session_latest/logs"
for f in "$LOGS"/raylet*.out; do
  node=$(grep -om1 "node_id=[0-9a-f]*" "$f" | cut -c9-20)
  pids=$(grep -o "ClientAppActor.__init__ pid=[0-9]*" "$f" | sort -u | sed 's/.*pid=//' | tr '\n' ' ')
  echo "node $node ($(basename "$f")): ClientAppActor pids: ${pids:-none}"
done
echo "wall: $($PY -c "print(round($END - $START, 1))") s"
$PY - "$TMP" <<'EOF'
import json, pathlib, sys
for s in pathlib.Path(sys.argv[1]).rglob("summary.json"):
    d = json.loads(s.read_text()); print("status", d["status"], "rounds", len(d["rounds"]),
                                          "final personalized mean", round(d["final"]["personal_mean"], 4))
EOF
