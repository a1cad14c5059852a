"""What `flower-pfl bench` pays per cell in its three modes (docs/BENCHMARKS.md (a)).

One tiny matrix (FedAvg, MCLR, 4 clients, 3 rounds, 3,000 FMNIST images, ``--cells`` seeds)
run three times, each a fresh `flower-pfl bench` into its own folder:

1. ``--superlink per-cell``: every cell is a whole ``flower-pfl run`` (its own SuperLink and
   its own Ray instance) -- what a user pays per ``flower-pfl run``;
2. ``--superlink shared`` (the default): one SuperLink for the bench, one Ray per cell;
3. ``--superlink shared --ray shared``: one SuperLink and ONE Ray instance for the bench;
4. ``inprocess``: ``benchmarks/matrix_inprocess.py --jobs 1``, each cell one plain Python
   process (no SuperLink, no Ray; the same cells and classes) -- the bench's alternative
   when many short cells would pay the simulation's start each.

Per mode: the bench's wall time, each cell's wall time (``bench-cell.json``), its seconds
per round (``summary.json``), fixed cost per cell = cell wall - rounds x s/round, and the
peak of the summed PSS of every process of the bench: its process tree plus the shared Ray
instance (``ray start`` daemonizes; its processes name the bench's private TMPDIR).
Ratios are to the first mode of the same invocation (``--modes``).

    .venv/bin/python benchmarks/bench_modes.py [--cells 3]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim_overhead import peak_pss  # benchmarks/, this script's directory

from flower_pfl.running.procs import pids_naming, process_tree
from flower_pfl.running.rayhead import RAY_SHORT_TMP_DIR, RAY_SHORT_TMP_PREFIX

ROOT = Path(__file__).resolve().parent.parent

MODES = {"per-cell": ["--superlink", "per-cell"],
         "shared": ["--superlink", "shared"],
         "shared+ray": ["--superlink", "shared", "--ray", "shared"],
         "inprocess": None}


def matrix(path: Path, cells: int, rounds: int) -> None:
    path.write_text(yaml.safe_dump({
        "name": "modes",
        "set": {"rounds": rounds, "clients": 4, "fraction-fit": 1.0, "model": "mclr",
                "data": {"dataset": "fmnist", "partition": "pathological",
                         "subsample": 3000}},
        "strategies": ["fedavg"], "settings": {"tiny": {}},
        "seeds": list(range(cells)), "compare": "final"}))


def run_mode(mode: str, matrix_path: Path, work: Path) -> dict:
    tmp = work / f"tmp-{mode}"
    tmp.mkdir()
    out = work / f"out-{mode}"
    if MODES[mode] is None:
        cmd = [sys.executable, str(ROOT / "benchmarks" / "matrix_inprocess.py"),
               str(matrix_path), "--out", str(out), "--jobs", "1"]
    else:
        cmd = [sys.executable, "-m", "flower_pfl.cli", "bench", str(matrix_path), "--out",
               str(out), "--retries", "0", *MODES[mode]]
    env = dict(os.environ, TMPDIR=str(tmp))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    # The shared Ray instance daemonizes (re-parented to init) and its workers rename
    # themselves (`ray::ClientAppActor`); its temp dir is the private TMPDIR or, where that
    # path is too long for Ray's sockets, a new short one (flower_pfl.running.rayhead.ray_temp_dir).
    # Count every process naming one of those (gcs, raylet, agents) with its descendants.
    short = os.path.join(RAY_SHORT_TMP_DIR, RAY_SHORT_TMP_PREFIX + "*")
    ray_dirs_before = set(glob.glob(short))

    def processes() -> set[int]:
        names = [str(tmp), *(set(glob.glob(short)) - ray_dirs_before)]
        named = set().union(*(pids_naming(n) for n in names))
        return process_tree(proc.pid).union(*(process_tree(p) for p in named))

    with peak_pss(processes) as peak:
        output, _ = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{mode}: bench exited {proc.returncode}\n{output[-3000:]}")
    cells = []
    for cell_dir in sorted((out / "runs").glob("*/*/seed-*")):
        info = json.loads((cell_dir / "bench-cell.json").read_text())
        if info["status"] != "completed":
            raise RuntimeError(f"{mode}: {cell_dir} {info['status']}")
        rows = json.loads((cell_dir / "summary.json").read_text())["rounds"]
        per_round = statistics.median(b["elapsed_s"] - a["elapsed_s"]
                                      for a, b in zip(rows, rows[1:]))
        cells.append({"wall_s": info["wall_s"], "s_per_round": per_round,
                      "fixed_s": info["wall_s"] - len(rows) * per_round})
    return {"bench_wall_s": wall, "cells": cells,
            "fixed_s_median": statistics.median(c["fixed_s"] for c in cells),
            "fixed_s_first": cells[0]["fixed_s"],
            "fixed_s_later_median": statistics.median(c["fixed_s"] for c in cells[1:] or cells),
            "peak_pss_mb": peak["kb"] / 1024, "peak_processes": peak["procs"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    args = p.parse_args()
    print(f"load average before: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-modes-") as tmp:
        work = Path(tmp)
        mpath = work / "modes.yaml"
        matrix(mpath, args.cells, args.rounds)
        res = {}
        for mode in args.modes:
            res[mode] = run_mode(mode, mpath, work)
            print(f"{mode}: {json.dumps(res[mode])}", flush=True)
    base = res[args.modes[0]]
    print(f"load average after: {os.getloadavg()}")
    print("| mode | bench wall (s) | fixed cost per cell: first / later (median) (s) | "
          f"peak PSS, all processes (MB) | bench wall vs {args.modes[0]} |")
    print("|---|---|---|---|---|")
    for mode, r in res.items():
        print(f"| {mode} | {r['bench_wall_s']:.1f} | {r['fixed_s_first']:.1f} / "
              f"{r['fixed_s_later_median']:.1f} | {r['peak_pss_mb']:.0f} | "
              f"{r['bench_wall_s'] / base['bench_wall_s']:.2f} |")


if __name__ == "__main__":
    main()
