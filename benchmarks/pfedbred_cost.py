"""Cost of a pFedBreD round vs a FedAvg round on the same clients and data (in-process).

pFedBreD_ns does, per client and round, R local iterations of K prox SGD steps (+ one loss
gradient for lg / mh) on one mini-batch each, plus R envelope steps (no gradient); FedAvg
does ``train.epochs`` passes of mini-batch SGD.  This script runs both strategies with their
real clients in ONE process (flower_pfl/running/inprocess.py, no Ray), times only the fit phase of
each round (client training + server aggregation; evaluation excluded) and prints seconds
per round, the number of gradient evaluations (SGD steps) per round, and both ratios.

    .venv/bin/python benchmarks/pfedbred_cost.py [--strategy pfedbred-mh] [--model mclr]
        [--clients 20] [--rounds 3] [--subsample 14000] [--batch-size 20] [--threads 1]

Defaults mimic one round of the paper's FMNIST setting: 20 clients (the 20% of 100 sampled
per round) with ~700 images each (75% train), batch 20 for both methods.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from flower_pfl import config, registry
from flower_pfl.running import inprocess


def fit_rounds(cfg, rounds: int) -> tuple[list[float], list[float]]:
    """Seconds and summed client SGD steps of each round's fit phase."""
    manager = inprocess.make_federation(cfg["clients"])
    with tempfile.TemporaryDirectory() as tmp:
        strategy = registry.strategy_class(cfg.strategy)(cfg, results_dir=tmp)
        parameters = strategy.initialize_parameters(manager)
        seconds, steps = [], []
        for server_round in range(1, rounds + 1):
            start = time.perf_counter()
            fit_ins = strategy.configure_fit(server_round, parameters, manager)
            results = [(proxy, proxy.fit(ins, None, None)) for proxy, ins in fit_ins]
            new, _ = strategy.aggregate_fit(server_round, results, [])
            seconds.append(time.perf_counter() - start)
            steps.append(sum(float(r.metrics["local_steps"]) for _, r in results))
            parameters = new if new is not None else parameters
    return seconds, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strategy", default="pfedbred-mh")
    ap.add_argument("--model", default="mclr")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--subsample", type=int, default=14000)
    ap.add_argument("--batch-size", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1, as in a Ray client actor with num-cpus 1; "
                         "on a loaded 2-core machine 2 threads made an MCLR step ~60x slower)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = {}
    for name in (args.strategy, "fedavg"):
        cfg = config.validate({
            "strategy": name, "clients": args.clients, "fraction-fit": 1.0, "model": args.model,
            "rounds": args.rounds, "device": "cpu", "seed": 0,
            "data": {"dataset": "fmnist", "partition": "pathological",
                     "subsample": args.subsample},
            "train": {"epochs": 1, "batch-size": args.batch_size, "lr": 0.01},
            "hyper": {name: {"batch-size": args.batch_size}} if name != "fedavg" else {}},
            source="pfedbred_cost")
        fit_rounds(cfg, 1)  # warm-up: data loading and partition caches out of the timing
        seconds, steps = fit_rounds(cfg, args.rounds)
        rows[name] = (min(seconds), sum(steps) / len(steps))
        print(f"{name:14s} {args.model}: {min(seconds):7.3f} s/round (best of {args.rounds}; "
              f"all {[round(s, 3) for s in seconds]}), {rows[name][1]:.0f} SGD steps/round "
              f"over {args.clients} clients")
    (t1, s1), (t0, s0) = rows[args.strategy], rows["fedavg"]
    print(f"ratio {args.strategy}/fedavg: time {t1 / t0:.2f}x, SGD steps {s1 / s0:.2f}x")


if __name__ == "__main__":
    main()
