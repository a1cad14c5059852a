"""A short ``flower-pfl run``'s wall time and the machine's CPU, in interleaved pairs: arm A
(Flower's behaviour for one of our cuts, or another copy of the project) against arm B (this
checkout as it is).  docs/BENCHMARKS.md (a), "Fixed cost".

The workload is a run that is mostly its fixed cost: FedAvg, FMNIST DNN, 20 clients with 2
classes each, 2 rounds, fraction-fit 0.2, 20,000 pooled images.  Each run starts once the
1-minute load average is below 0.5 (waits up to 3 minutes); A runs before B in every pair.
Per run: the wall time of the whole command and the machine's busy core-seconds over it
(``cpu_by_role.machine_busy_s``: /proc/stat's non-idle time, every process included).
Prints every pair and the paired 95% interval of B - A.

    .venv/bin/python benchmarks/fixed_cost.py --pairs 5 --off FLOWER_PFL_FLOWER_APP=1
    git archive REV | tar -x -C /tmp/rev && \\
        .venv/bin/python benchmarks/fixed_cost.py --pairs 5 --tree /tmp/rev [--tree-b /tmp/rev2]

``--tree-b``: arm B from another copy too (two ``git archive`` copies compare two revisions
alike: a checkout's own .venv and caches are in neither).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from cpu_by_role import machine_busy_s  # noqa: E402 - benchmarks/

from flower_pfl.reporting.stats import paired_interval  # noqa: E402

WORKLOAD = {"strategy": "fedavg", "rounds": 2, "clients": 20, "model": "dnn", "seed": 0,
            "eval-every": 1, "checkpoint-every": 0,
            "data": {"dataset": "fmnist", "partition": "pathological", "subsample": 20000},
            "train": {"epochs": 1, "batch-size": 10, "lr": 0.005}}


def wait_quiet(limit: float = 0.5, max_s: float = 180.0) -> float:
    deadline = time.time() + max_s
    while os.getloadavg()[0] >= limit and time.time() < deadline:
        time.sleep(5)
    return os.getloadavg()[0]


def one_run(tree: Path, config: Path, name: str, env: dict[str, str]) -> tuple[float, float]:
    """(wall s, machine core-s) of ``flower-pfl run`` from ``tree``."""
    cmd = [str(Path(sys.executable).parent / "flower-pfl"), "run", "--config", str(config),
           "--set", f"run-name={name}", "--quiet"]
    env = {**env, "PYTHONPATH": str(tree), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    busy, start = machine_busy_s(), time.perf_counter()
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    wall, core_s = time.perf_counter() - start, machine_busy_s() - busy
    if done.returncode != 0:
        raise SystemExit(f"{name} failed ({done.returncode}):\n{done.stdout[-2000:]}"
                         f"{done.stderr[-2000:]}")
    return wall, core_s


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--off", default=None, metavar="ENV=VALUE",
                   help="arm A: this checkout with this environment variable set")
    p.add_argument("--tree", default=None, help="arm A: this copy of the project")
    p.add_argument("--tree-b", default=None, help="arm B: this copy (default: this checkout)")
    args = p.parse_args()
    if (args.off is None) == (args.tree is None):
        p.error("give exactly one of --off ENV=VALUE and --tree DIR")
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLOWER_PFL_FLOWER_")}
    arm_a = (Path(args.tree).resolve() if args.tree else ROOT,
             dict(base, **dict([args.off.split("=", 1)])) if args.off else base)
    arm_b = (Path(args.tree_b).resolve() if args.tree_b else ROOT, base)
    label = args.off or f"tree {args.tree}"
    rows: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory(prefix="fixed-cost-") as tmp:
        config = Path(tmp) / "run.yaml"
        config.write_text(yaml.safe_dump(dict(WORKLOAD, **{"output-dir": str(Path(tmp) / "out")})))
        print(f"A: {label}   B: {arm_b[0]} as it is   ({args.pairs} pairs, A first)")
        print(f"{'pair':>4} {'arm':>3} {'load':>5} {'wall s':>7} {'core-s':>7}", flush=True)
        for i in range(1, args.pairs + 1):
            for arm, (tree, env) in (("A", arm_a), ("B", arm_b)):
                load = wait_quiet()
                wall, core_s = one_run(tree, config, f"{arm}-{i}", env)
                rows[arm].append((wall, core_s))
                print(f"{i:>4} {arm:>3} {load:>5.2f} {wall:>7.2f} {core_s:>7.1f}", flush=True)
    for k, name in ((0, "wall s"), (1, "machine core-s")):
        a = [r[k] for r in rows["A"]]
        b = [r[k] for r in rows["B"]]
        iv = paired_interval(b, a)
        span = "" if iv.half is None else f" [{iv.low:+.2f}, {iv.high:+.2f}]"
        print(f"{name}: A mean {sum(a) / len(a):.2f}, B mean {sum(b) / len(b):.2f}, "
              f"B - A {iv.mean:+.2f}{span} (95%, {iv.n} pairs), B / A "
              f"{sum(b) / sum(a):.2f}")


if __name__ == "__main__":
    main()
