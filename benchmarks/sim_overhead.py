"""A simulation round vs the same work in a plain PyTorch loop (docs/BENCHMARKS.md (a)).

Workload (the issue's): FedAvg, FMNIST, DNN, pathological 2 classes per client, 20 clients,
all sampled every round, batch 10, 1 local epoch, ``--rounds`` rounds, every client
evaluates every round (global-model evaluation off, so each client evaluates one model).

1. ``plain``: one process, no Flower: per round, per client, the model gets the global
   arrays, runs the same ``training.train`` on the same local data and ``training.evaluate``
   on its local test split; the server averages (sample-weighted). Seconds per round =
   median over rounds 2.., and the process' peak RSS.
2. ``sim``: ``flower-pfl run`` on the same YAML (Ray simulation, SuperLink). Seconds per
   round from the run's rounds.csv (median of round-to-round differences), the wall time of
   the whole command, fixed cost = wall - rounds x s/round, and the peak of the summed
   PSS (/proc/<pid>/smaps_rollup) of the launcher and every process it started, sampled every
   0.5 s, minus the launcher's PSS before the run started.
3. ``inprocess``: the same YAML through ``flower_pfl.running.inprocess`` in one child process (the
   engine of benchmarks/matrix_inprocess.py: the same Strategy and NumPyClient classes and
   Flower messages, direct calls instead of SuperLink + Ray), measured as ``sim`` is.

    .venv/bin/python benchmarks/sim_overhead.py --rounds 5 [--subsample 20000] \
        [--arms plain sim inprocess]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def workload(rounds: int, subsample: int | None, out: Path, lr: float = 0.05) -> dict:
    return {"strategy": "fedavg", "rounds": rounds, "clients": 20, "fraction-fit": 1.0,
            "min-fit-clients": 20, "eval-every": 1, "eval-global": False, "model": "dnn",
            "seed": 0, "output-dir": str(out), "run-name": "sim",
            "data": {"dataset": "fmnist", "partition": "pathological", "classes-per-client": 2,
                     "subsample": subsample},
            "train": {"epochs": 1, "batch-size": 10, "lr": lr}}


def plain(tree: dict, threads: int = 1, pids: list[int] | None = None) -> dict:
    """The plain loop on ``threads`` torch threads over the clients ``pids`` (default: all).
    Per round: ``work_s`` (every client's training, then every client's evaluation of the
    new global model) and ``avg_s`` (the server's sample-weighted average); ``round_s`` is
    their sum and ``s_per_round`` its median over rounds 2..."""
    import numpy as np
    import torch

    from flower_pfl import config
    from flower_pfl.learning.client_data import load_client_data
    from flower_pfl.learning.models import (
        get_arrays,
        initial_arrays,
        model_for,
        resolve_device,
        set_arrays,
    )
    from flower_pfl.learning.training import TrainSpec, evaluate, train

    torch.set_num_threads(threads)  # 1: as one Ray actor with num-cpus 1
    cfg = config.validate(dict(tree), source="plain")
    device = resolve_device("cpu")
    spec = TrainSpec.from_config(cfg)
    pids = list(range(cfg["clients"])) if pids is None else list(pids)
    data = {pid: load_client_data(cfg.values, pid) for pid in pids}
    global_arrays = initial_arrays(cfg)
    work, avg = [], []
    for rnd in range(1, cfg["rounds"] + 1):
        t0 = time.perf_counter()
        uploads, weights = [], []
        for pid, d in data.items():
            model = model_for(cfg)
            set_arrays(model, global_arrays)
            gen = torch.Generator().manual_seed(1000 * rnd + pid)
            train(model, d.x_train, d.y_train, spec, gen, device)
            uploads.append(get_arrays(model))
            weights.append(d.num_train)
        t1 = time.perf_counter()
        w = np.asarray(weights, dtype=np.float64) / sum(weights)
        global_arrays = [sum(wi * u[k] for wi, u in zip(w, uploads)).astype(np.float32)
                         for k in range(len(global_arrays))]
        t2 = time.perf_counter()
        accs = []
        for _pid, d in data.items():
            model = model_for(cfg)
            set_arrays(model, global_arrays)
            accs.append(evaluate(model, d.x_test, d.y_test, device)[1])
        work.append(t1 - t0 + time.perf_counter() - t2)
        avg.append(t2 - t1)
    times = [a + b for a, b in zip(work, avg)]
    return {"s_per_round": statistics.median(times[1:]), "round_s": times, "work_s": work,
            "avg_s": avg, "final_mean": float(np.mean(accs)), "threads": threads,
            "clients": len(pids),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


@contextmanager
def peak_pss(pids, interval_s: float = 0.5) -> Iterator[dict]:
    """While the block runs, sample the summed PSS of the processes ``pids()`` names every
    ``interval_s``; the yielded dict holds the peak (``kb``) and how many processes then."""
    peak = {"kb": 0, "procs": 0}
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            now = pids()
            total = sum(_pss_kb(p) for p in now)
            if total > peak["kb"]:
                peak.update(kb=total, procs=len(now))
            time.sleep(interval_s)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join()


def sim(tree: dict, out: Path, engine: str = "flwr") -> dict:
    from flower_pfl.running.procs import process_tree

    tree = dict(tree, **{"run-name": "sim" if engine == "flwr" else engine})
    env = dict(os.environ)
    if engine == "flwr":  # `flower-pfl run` of THIS checkout (python -m from its root)
        path = out / "sim.yaml"
        path.write_text(yaml.safe_dump(tree))
        cmd = [sys.executable, "-m", "flower_pfl.cli", "run", "--config", str(path),
               "--quiet"]
    else:  # matrix_inprocess.py's child: one process, one torch thread (as one Ray actor)
        (out / engine).mkdir(exist_ok=True)
        (out / engine / "cell.yaml").write_text(yaml.safe_dump(tree))
        env["OMP_NUM_THREADS"] = "1"
        cmd = [sys.executable, str(ROOT / "benchmarks" / "matrix_inprocess.py"), "--cell",
               str(out / engine), "--started", repr(time.time())]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, env=env)
    time.sleep(0.3)
    idle_kb = _pss_kb(proc.pid)
    with peak_pss(lambda: process_tree(proc.pid)) as peak:
        output, _ = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(output[-2000:])
    summary = json.loads((out / tree["run-name"] / "summary.json").read_text())
    rows = summary["rounds"]
    diffs = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:])]
    per_round = statistics.median(diffs)
    return {"s_per_round": per_round, "wall_s": wall,
            "fixed_s": wall - len(rows) * per_round,
            "first_round_elapsed_s": rows[0]["elapsed_s"],
            "final_mean": summary["final"]["personal_mean"],
            "peak_pss_all_mb": peak["kb"] / 1024, "launcher_idle_pss_mb": idle_kb / 1024,
            "peak_processes": peak["procs"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--subsample", type=int, default=None)
    p.add_argument("--arms", nargs="+", choices=("plain", "sim", "inprocess"),
                   default=["plain", "sim"])
    args = p.parse_args()
    print(f"load average before: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="sim-overhead-") as tmp:
        tree = workload(args.rounds, args.subsample, Path(tmp))
        res = {}
        for arm in args.arms:
            res[arm] = plain(tree) if arm == "plain" else sim(
                tree, Path(tmp), "flwr" if arm == "sim" else "inprocess")
            print(f"{arm}:", json.dumps(res[arm]), flush=True)
    print(f"load average after: {os.getloadavg()}")
    for arm in ("sim", "inprocess"):
        if arm in res and "plain" in res:
            print(f"{arm}: round / plain loop round = "
                  f"{res[arm]['s_per_round'] / res['plain']['s_per_round']:.2f}; fixed cost per "
                  f"run {res[arm]['fixed_s']:.1f} s; all processes peak PSS "
                  f"{res[arm]['peak_pss_all_mb']:.0f} MB (plain process peak RSS "
                  f"{res['plain']['peak_rss_mb']:.0f} MB)")
    if "sim" in res and "inprocess" in res:
        i, f = res["inprocess"], res["sim"]
        print(f"inprocess / sim: fixed cost {i['fixed_s'] / f['fixed_s']:.2f}, "
              f"peak PSS {i['peak_pss_all_mb'] / f['peak_pss_all_mb']:.2f}")


if __name__ == "__main__":
    main()
