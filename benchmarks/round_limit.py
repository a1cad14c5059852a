"""A simulation round against the machine's limit, two one-thread workers (BENCHMARKS.md (a)).

Workload (issue 42's): FMNIST DNN, pathological 2 classes per client, 20 clients all
sampled every round, batch 10, 1 local epoch, lr 0.005, ``--rounds`` rounds, every client
evaluates every round (global evaluation off).  From one invocation, one arm after another:

* ``plain-1t`` / ``plain-2t``: ``sim_overhead.plain`` (no Flower: per client, the model
  gets the global arrays, trains, uploads; the server averages; every client evaluates) in
  a child process on 1 / 2 torch threads;
* ``limit``: two such children at once, one thread each, each with half of the clients;
  per round the slower child's work (training + evaluation) plus the 1-thread loop's
  averaging of all 20 uploads -- what two single-thread workers could do on 2 cores;
* one ``flower-pfl run`` per strategy (``--strategies``, default fedavg fedamp fedprox;
  FedProx with its default mu = 1), measured by ``sim_memory.run_arm``: seconds per round
  (median of the round-to-round differences), wall time, fixed cost (wall - rounds x
  s/round) and memory above idle (peak MemTotal - MemAvailable - the idle baseline) and
  the summed PSS of all its processes, and the core-seconds per round of every role
  (``cpu_by_role.CpuClock``: the actors, the ServerApp's process, the SuperLink, Ray's
  daemons, ... and what stayed idle).

Prints the per-arm table and the ratios with their goals: FedAvg / limit <= 1.3,
FedAMP / FedAvg <= 1.15, FedProx / FedAvg <= 1.05, memory above idle <= 1.8 GB.  Run it
alone on a quiet machine (the load average is printed before and after):

    .venv/bin/python benchmarks/round_limit.py --rounds 5 [--flower-engine] [--tree DIR] [--json F]

``--flower-engine`` adds, per strategy, an arm ``NAME-flower`` with Flower's own engine
behaviour (``FLOWER_PFL_FLOWER_TICK=1``: the engine's 0.1 s tick and the waiting threads'
10 ms looks, flower_pfl/tuned/engine_wakeup.py; ``FLOWER_PFL_FLOWER_POOL=1``: one message per
actor at a time, flower_pfl/tuned/actor_queue.py) -- before and after in one invocation.
``--tree DIR`` runs the simulation arms from another copy of the project (a snapshot of
an older revision: before and after, each from its own invocation).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from cpu_by_role import CpuClock, table  # noqa: E402 - benchmarks/
from sim_memory import idle_baseline, run_arm  # noqa: E402 - benchmarks/
from sim_overhead import plain, workload  # noqa: E402 - benchmarks/

GOALS = {"fedavg / limit": 1.3, "fedamp / fedavg": 1.15, "fedprox / fedavg": 1.05}
MEMORY_GOAL_MB = 1800
#: the processes' PSS every 4th memory sample (2 s): the sampler's own CPU is a 2-core
#: machine's too (~5% of it at every sample, benchmarks/cpu_by_role.py's "benchmark" row)
PSS_EVERY = 4
LR = 0.005


def start_plain(tree_path: Path, threads: int, pids: list[int] | None) -> subprocess.Popen:
    """A child process running ``plain`` (this script's ``--plain``) on ``threads``."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    spec = json.dumps({"tree": str(tree_path), "threads": threads, "pids": pids})
    return subprocess.Popen([sys.executable, __file__, "--plain", spec], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"plain loop failed:\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


#: the switches that keep Flower's own engine behaviour (``--flower-engine`` arms)
FLOWER_ENGINE = ("FLOWER_PFL_FLOWER_TICK", "FLOWER_PFL_FLOWER_POOL")


@contextlib.contextmanager
def flower_engine(keep: bool):
    """The runs started inside keep Flower's engine behaviour (:data:`FLOWER_ENGINE`)."""
    if not keep:
        yield
        return
    os.environ.update({key: "1" for key in FLOWER_ENGINE})
    try:
        yield
    finally:
        for key in FLOWER_ENGINE:
            del os.environ[key]


def limit_of(workers: list[dict], averaging: list[float]) -> dict:
    """Per round: the slower worker's work + the server's averaging of all uploads."""
    rounds = [max(w["work_s"][r] for w in workers) + averaging[r]
              for r in range(len(averaging))]
    return {"s_per_round": statistics.median(rounds[1:]), "round_s": rounds,
            "workers_s_per_round": [statistics.median(w["work_s"][1:]) for w in workers]}


def ratios(res: dict) -> dict[str, float]:
    out = {}
    if "fedavg" in res and "limit" in res:
        out["fedavg / limit"] = res["fedavg"]["s_per_round"] / res["limit"]["s_per_round"]
    for name in ("fedamp", "fedprox"):
        if name in res and "fedavg" in res:
            out[f"{name} / fedavg"] = res[name]["s_per_round"] / res["fedavg"]["s_per_round"]
    for name in list(res):  # after / before, where --flower-engine ran the before
        if f"{name}-flower" in res:
            out[f"{name} / {name}-flower"] = (res[name]["s_per_round"]
                                              / res[f"{name}-flower"]["s_per_round"])
    return out


def report(res: dict, load: tuple) -> None:
    print(f"\n{'arm':<12}{'s/round':>9}{'/ limit':>9}{'wall s':>8}{'fixed s':>9}"
          f"{'above idle MB':>15}{'PSS MB':>8}")
    lim = res.get("limit", {}).get("s_per_round")
    for name, r in res.items():
        sim = "wall_s" in r
        print(f"{name:<12}{r['s_per_round']:>9.3f}"
              f"{(r['s_per_round'] / lim if lim else float('nan')):>9.2f}"
              f"{(r['wall_s'] if sim else float('nan')):>8.1f}"
              f"{(r['fixed_s'] if sim else float('nan')):>9.1f}"
              f"{(r['above_idle_mb'] if sim else float('nan')):>15.0f}"
              f"{(r['peak_pss_mb'] if sim else r.get('peak_rss_mb', float('nan'))):>8.0f}")
    if "limit" in res:
        print(f"(limit: workers {res['limit']['workers_s_per_round']} s/round of work + the "
              f"averaging; plain rows' last column: the process' peak RSS)")
    print()
    for key, value in ratios(res).items():
        goal = GOALS.get(key)
        met = "met" if goal is not None and value <= goal else "NOT met"
        verdict = "" if goal is None else f"   goal <= {goal}: {met}"
        print(f"{key:<28}{value:6.2f}{verdict}")
    for name, r in res.items():
        if "above_idle_mb" in r:
            ok = r["above_idle_mb"] <= MEMORY_GOAL_MB
            print(f"{name} memory above idle {r['above_idle_mb']} MB   goal <= "
                  f"{MEMORY_GOAL_MB} MB: {'met' if ok else 'NOT met'}")
    cpu = {name: r["cpu_per_round"] for name, r in res.items() if r.get("cpu_per_round")}
    if cpu:
        print("\nwhere the cores go, rounds 2..N (benchmarks/cpu_by_role.py; share of "
              "cores x s/round):")
        print(table(cpu))
    print(f"load average before {load[0]}, after {load[1]}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--subsample", type=int, default=None, help="pooled images (default: all)")
    p.add_argument("--strategies", nargs="*", default=["fedavg", "fedamp", "fedprox"])
    p.add_argument("--flower-engine", action="store_true",
                   help="also run each strategy with Flower's own engine behaviour (arm "
                        "NAME-flower: " + " ".join(f"{k}=1" for k in FLOWER_ENGINE) + ")")
    p.add_argument("--no-plain", action="store_true", help="only the simulation arms")
    p.add_argument("--tree", default=str(ROOT), help="the project copy of the simulation arms")
    p.add_argument("--timeout", type=float, default=900.0, help="per simulation arm, seconds")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--plain", default=None, help=argparse.SUPPRESS)  # the child's job
    args = p.parse_args()
    if args.plain:  # child: one plain loop, its JSON on the last line
        spec = json.loads(args.plain)
        tree = yaml.safe_load(Path(spec["tree"]).read_text())
        print(json.dumps(plain(tree, spec["threads"], spec["pids"])))
        return
    before = os.getloadavg()
    print(f"load average before: {before}", flush=True)
    res: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="round-limit-") as tmp:
        tree = workload(args.rounds, args.subsample, Path(tmp), lr=LR)
        tree_path = Path(tmp) / "plain.yaml"
        tree_path.write_text(yaml.safe_dump(tree))
        if not args.no_plain:
            res["plain-1t"] = finish(start_plain(tree_path, 1, None))
            res["plain-2t"] = finish(start_plain(tree_path, 2, None))
            half = tree["clients"] // 2
            workers = [start_plain(tree_path, 1, list(range(half))),
                       start_plain(tree_path, 1, list(range(half, tree["clients"])))]
            res["limit"] = limit_of([finish(w) for w in workers], res["plain-1t"]["avg_s"])
            for name in ("plain-1t", "plain-2t", "limit"):
                print(f"{name}: {res[name]['s_per_round']:.3f} s/round", flush=True)
        idle = idle_baseline(5.0)
        arms = [(name, name, False) for name in args.strategies]
        if args.flower_engine:  # the same strategies again, Flower's engine behaviour kept
            arms += [(f"{name}-flower", name, True) for name in args.strategies]
        for name, strategy, flower in arms:
            arm = dict(tree, strategy=strategy)
            clocks: list[CpuClock] = []

            def watch(run_dir: Path, clocks=clocks) -> CpuClock:
                clocks.append(CpuClock(run_dir))
                return clocks[-1]

            with flower_engine(flower):
                r = run_arm(name, arm, Path(tmp), idle, 0.5, args.timeout, Path(args.tree),
                            watch=watch, pss_every=PSS_EVERY)
            r["cpu_per_round"] = clocks[0].per_round()
            r["fixed_s"] = r["wall_s"] - args.rounds * r["s_per_round"]
            r.pop("processes_seen")
            res[name] = r
            print(f"{name}: {r['s_per_round']:.3f} s/round, above idle {r['above_idle_mb']} MB",
                  flush=True)
    after = os.getloadavg()
    report(res, (before, after))
    if args.json:
        Path(args.json).write_text(json.dumps({"load": [before, after], "arms": res,
                                               "ratios": ratios(res)}, indent=1))


if __name__ == "__main__":
    main()
