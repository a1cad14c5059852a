"""Clients at scale, end to end: ``flower-pfl run`` with 20 ... 10,000 clients (docs/BENCHMARKS.md,
"Clients at scale").

Each arm is one real simulation (this checkout's CLI, its own SuperLink and Ray instance,
:func:`sim_memory.run_arm`): FMNIST, ``--model`` (MCLR by default), pathological 2 classes
per client over all 70,000 images, ``--rounds`` rounds with ``fraction-fit`` of the clients
(``min-fit-clients`` 1), batch 10, 1 epoch, and ONE evaluation of every client, in the last
round (``eval-every`` = rounds: the papers' metric is over all clients, so an evaluation
round costs a message per client whatever the sampling).  Printed per arm:

* ``start``: from the launch to Flower's ``[ROUND 1]`` (SuperLink, Ray, the ServerApp, the
  strategy's initial model; read from the streamed log, ~0.5 s resolution);
* ``round 1``: to the end of round 1's aggregation (the partition-id handshake with every
  node, the actors' start, the sampled clients' fit);
* ``s/round``: the median of the later rounds' fit steps (between two appends to fit.csv,
  which the server writes once per round after aggregating; polled every 20 ms);
* ``last``: after the last round's aggregation: the evaluation of every client, the run's
  end (summary, curves.png, checkpoint) and the processes' shutdown;
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
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim_memory import ROOT, Poller, idle_baseline, run_arm  # noqa: E402 - benchmarks/, here

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


class RoundClock(Poller):
    """Times a run's rounds as it goes: Flower's ``[ROUND k]`` lines reaching its
    ``flwr-run.log`` (streamed in chunks: ~0.5 s resolution, used for the start only) and
    the first rows of each round in its ``fit.csv`` (the server writes a round's rows in one
    call, after that round's aggregation: polled every 20 ms)."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(0.02)
        self.log, self.fit = run_dir / "flwr-run.log", run_dir / "fit.csv"
        self.t0 = time.perf_counter()
        self.seen: dict[int, float] = {}  # round -> when its [ROUND k] line was read
        self.fit_ends: list[float] = []  # when round k's rows reached fit.csv, k = 1, 2, ...
        self.pos, self.fit_size = 0, 0

    def poll(self) -> None:
        now = time.perf_counter() - self.t0
        try:
            size = self.fit.stat().st_size
        except OSError:
            size = 0
        if size > self.fit_size:  # a round's rows: the first bytes of round k's rows
            self.fit_size = size      # (a large append reaches the file in several writes)
            with open(self.fit, "rb") as fh:
                fh.seek(max(0, size - 4096))
                lines = fh.read().split(b"\n")
            last = next((ln for ln in reversed(lines[:-1]) if ln[:1].isdigit()), b"")
            if last and int(last.split(b",")[0]) > len(self.fit_ends):
                self.fit_ends.append(now)
        try:
            with open(self.log, errors="replace") as fh:
                fh.seek(self.pos)
                text = fh.read()
                self.pos = fh.tell()
        except OSError:
            return
        for match in ROUND.finditer(text):
            self.seen.setdefault(int(match.group(1)), now)


def round_times(clock: RoundClock, wall: float, rounds: int) -> dict:
    """``start`` (launch to ``[ROUND 1]``), ``round1`` (to round 1's fit.csv rows: the
    handshake with every node and the first fit), ``s_per_round`` (median time between the
    later rounds' fit.csv appends: fit-only rounds), ``last`` (after the last append: the
    evaluation of every client and the run's end); None where not seen."""
    ends = clock.fit_ends
    start = clock.seen.get(1)
    if len(ends) != rounds or start is None:
        return {"start": start, "round1": None, "s_per_round": None, "last": None}
    fit = [b - a for a, b in zip(ends, ends[1:])]
    return {"start": start, "round1": ends[0] - start,
            "s_per_round": statistics.median(fit) if fit else None, "last": wall - ends[-1]}


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
                    times = round_times(clocks[0], res["wall_s"], args.rounds)
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
