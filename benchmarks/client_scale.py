"""Clients at scale, end to end: ``flower-pfl run`` with 20 ... 10,000 clients (docs/BENCHMARKS.md,
"Clients at scale").

Each arm is one real simulation (this checkout's CLI, its own SuperLink and Ray instance,
:func:`sim_memory.run_arm`): FMNIST, ``--model`` (MCLR by default), pathological 2 classes
per client over all 70,000 images, ``--rounds`` rounds with ``fraction-fit`` of the clients
(``min-fit-clients`` 1), batch 10, 1 epoch, and ONE evaluation of every client, in the last
round (``eval-every`` = rounds: the papers' metric is over all clients, so an evaluation
round costs a message per client whatever the sampling).  Printed per arm:

* ``start``: from the launch to Flower's ``[ROUND 1]`` (SuperLink, Ray, the ServerApp, the
  strategy's initial model) -- the first round's partition-id handshake with every node is
  inside round 1, not here;
* ``round 1``: the first round (the handshake with every node, then the sampled clients' fit);
* ``s/round``: the median of the later fit-only rounds (``[ROUND k]`` to ``[ROUND k+1]``,
  read from the run's log as it is written, to ~0.05 s);
* ``last``: the last round, whose evaluation asks every client;
* the machine's memory above idle at its peak, and the peak summed PSS of every process of
  the run (:class:`sim_memory.Sampler`).

    .venv/bin/python benchmarks/client_scale.py --clients 20 100 1000 10000 \\
        --fractions 0.1 0.01 --strategies fedavg fedamp selffl --rounds 3 --json OUT.json
    .venv/bin/python benchmarks/client_scale.py --clients 1000 --tree OLD_CHECKOUT ...  # before

Run it alone on a quiet machine (it says the load before and after).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim_memory import ROOT, idle_baseline, run_arm  # noqa: E402 - benchmarks/, this directory

ROUND = re.compile(r"\[ROUND (\d+)\]")


def arm_tree(strategy: str, clients: int, fraction: float, rounds: int, model: str,
             out: Path) -> dict:
    return {"strategy": strategy, "rounds": rounds, "clients": clients,
            "fraction-fit": fraction, "min-fit-clients": 1, "eval-every": rounds,
            "eval-global": False, "model": model, "seed": 0, "output-dir": str(out),
            "run-name": "scale",
            "data": {"dataset": "fmnist", "partition": "pathological", "classes-per-client": 2,
                     "subsample": None},
            "train": {"epochs": 1, "batch-size": 10, "lr": 0.05}}


class RoundClock:
    """Times Flower's ``[ROUND k]`` lines as they reach the run's ``flwr-run.log``."""

    def __init__(self, run_dir: Path) -> None:
        self.log = run_dir / "flwr-run.log"
        self.t0 = time.perf_counter()
        self.seen: dict[int, float] = {}
        self.pos = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            self.read()
            time.sleep(0.05)
        self.read()

    def read(self) -> None:
        try:
            with open(self.log, errors="replace") as fh:
                fh.seek(self.pos)
                text = fh.read()
                self.pos = fh.tell()
        except OSError:
            return
        now = time.perf_counter() - self.t0
        for match in ROUND.finditer(text):
            self.seen.setdefault(int(match.group(1)), now)

    def __enter__(self) -> "RoundClock":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def round_times(seen: dict[int, float], wall: float, rounds: int) -> dict:
    """``start``, ``round1``, ``s_per_round`` (median of the fit-only rounds 2..rounds-1, or
    None), ``last`` (from ``[ROUND rounds]`` to the end of the launcher)."""
    starts = [seen.get(k) for k in range(1, rounds + 1)]
    if any(s is None for s in starts):
        return {"start": None, "round1": None, "s_per_round": None, "last": None}
    fit = sorted(b - a for a, b in zip(starts[1:-1], starts[2:]))
    return {"start": starts[0], "round1": (starts[1] - starts[0]) if rounds > 1 else None,
            "s_per_round": fit[len(fit) // 2] if fit else None, "last": wall - starts[-1]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, nargs="+", default=[20, 100, 1000, 10000])
    p.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.01])
    p.add_argument("--strategies", nargs="+", default=["fedavg", "fedamp", "selffl"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default="mclr")
    p.add_argument("--timeout", type=float, default=1800.0, help="per arm, seconds")
    p.add_argument("--json", default=None, help="results, rewritten after every arm")
    p.add_argument("--keep", default=None, help="keep the runs' folders here")
    p.add_argument("--tree", default=None,
                   help="run the arms from this copy of the project (e.g. a checkout from "
                        "before a change); default: this one")
    args = p.parse_args()
    print(f"load average before: {os.getloadavg()}", flush=True)
    idle = idle_baseline(5.0)
    print(f"idle baseline (MemTotal-MemAvailable): {idle / 1024:.0f} MB", flush=True)
    print("| clients | sampled | strategy | start s | round 1 s | s/round | last round s "
          "| wall s | above idle MB | summed PSS MB |", flush=True)
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|", flush=True)
    results = []
    with (contextlib.nullcontext(args.keep) if args.keep
          else tempfile.TemporaryDirectory(prefix="client-scale-")) as tmp:
        for n in args.clients:
            for fraction in args.fractions:
                for strategy in args.strategies:
                    name = f"{strategy}-{n}-{fraction:g}"
                    tree = arm_tree(strategy, n, fraction, args.rounds, args.model, Path(tmp))
                    clocks: list[RoundClock] = []

                    def watch(run_dir: Path, clocks=clocks) -> RoundClock:
                        clocks.append(RoundClock(run_dir))
                        return clocks[-1]

                    res = run_arm(name, tree, Path(tmp), idle, 0.5, args.timeout,
                                  app=Path(args.tree).resolve() if args.tree else ROOT,
                                  watch=watch)
                    times = round_times(clocks[0].seen, res["wall_s"], args.rounds)
                    sampled = max(1, round(fraction * n))
                    row = {"name": name, "clients": n, "sampled": sampled,
                           "strategy": strategy, **times,
                           **{k: res[k] for k in ("wall_s", "above_idle_mb", "peak_pss_mb",
                                                  "roles")}}
                    results.append(row)

                    def f(x):
                        return "–" if x is None else f"{x:.2f}"

                    print(f"| {n:,} | {sampled:,} | {strategy} | {f(times['start'])} | "
                          f"{f(times['round1'])} | {f(times['s_per_round'])} | "
                          f"{f(times['last'])} | {res['wall_s']:.0f} | {res['above_idle_mb']} | "
                          f"{res['peak_pss_mb']} |", flush=True)
                    if args.json:
                        Path(args.json).write_text(json.dumps(
                            {"idle_mb": idle / 1024, "rounds": args.rounds,
                             "model": args.model, "arms": results}, indent=1))
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
