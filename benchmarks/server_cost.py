"""Server cost of every registered strategy, without clients (docs/BENCHMARKS.md (b), (c)).

Drives each Strategy through Flower's own methods -- ``initialize_parameters``,
``configure_fit`` (handshake, sampling, attention, payload serialisation) and
``aggregate_fit`` (upload deserialisation, aggregation) -- with synthetic uploads
(benchmarks/synthetic_uploads.py: every sampled client returns the model's arrays plus
client-specific Gaussian noise; the model is a synthetic MLP-shaped parameter list of
1,010,850 floats, so layer-wise strategies (PLGU, FedRep) see layers). A strategy that
needs uploads of another shape (e.g. control variates) fails here and is reported as "not
measured" with the reason.

(b) ``--mode ratio``: server seconds per round (configure_fit + aggregate_fit, all n clients
    sampled, round 2 onwards, median over rounds) for n in --clients, divided by ONE bare fp32
    Gram matmul ``W @ W.T`` of the same shape (n x d), best of 3.
(c) ``--mode scale``: one strategy per fresh process, n = 1000 clients, 10% per round,
    peak RSS of the server process (ru_maxrss) and seconds per round.

    .venv/bin/python benchmarks/server_cost.py --mode ratio --clients 20 100 500
    .venv/bin/python benchmarks/server_cost.py --mode scale --strategies fedacs fedamp
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.synthetic_uploads import (  # noqa: E402
    SHAPES,
    make_manager,
    model_arrays,
    timed_rounds,
)


def server_rounds(strategy_name: str, n: int, fraction: float, rounds: int,
                  out: Path) -> list[float]:
    """Seconds of configure_fit + aggregate_fit per round (uploads built outside the clock)."""
    from flower_pfl import config, registry

    cfg = config.validate({"strategy": strategy_name, "clients": n, "fraction-fit": fraction,
                           "min-fit-clients": 1, "rounds": rounds, "model": "dnn",
                           "data": {"dataset": "fmnist"}}, source="server_cost")
    strategy = registry.strategy_class(strategy_name)(cfg, initial_arrays=model_arrays(),
                                                          results_dir=out)
    manager = make_manager(n)
    params = strategy.initialize_parameters(manager)
    return [t_conf + t_agg
            for _, _, t_conf, t_agg in timed_rounds(strategy, params, manager, rounds)]


def gram_seconds(n: int, d: int) -> float:
    w = np.random.default_rng(0).standard_normal((n, d), dtype=np.float32)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        w @ w.T
        best = min(best, time.perf_counter() - t0)
    return best


def ratio(strategies: list[str], clients: list[int], rounds: int) -> None:
    d = sum(int(np.prod(s)) for s in SHAPES)
    print(f"d = {d:,} parameters; all n clients sampled; server s/round = median over rounds "
          f"2..{rounds} of configure_fit + aggregate_fit; Gram = one fp32 W @ W.T (n x d)")
    rows = []
    for n in clients:
        gram = gram_seconds(n, d)
        print(f"n={n}: bare Gram {gram * 1e3:.1f} ms", flush=True)
        for name in strategies:
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    times = server_rounds(name, n, 1.0, rounds, Path(tmp))
                    t = statistics.median(times[1:])
                    rows.append((name, n, t, t / gram))
                    print(f"  {name:12s} {t * 1e3:9.1f} ms/round  = {t / gram:7.1f} x Gram",
                          flush=True)
                except Exception as exc:  # noqa: BLE001 - report, go on with the next one
                    rows.append((name, n, None, None))
                    print(f"  {name:12s} not measured: {type(exc).__name__}: {str(exc)[:160]}",
                          flush=True)
    print(json.dumps(rows))


def scale_one(name: str, n: int, fraction: float, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        times = server_rounds(name, n, fraction, rounds, Path(tmp))
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
    print(json.dumps({"strategy": name, "clients": n, "fraction": fraction,
                      "s_per_round_median": statistics.median(times[1:]),
                      "s_round_1": times[0], "peak_rss_gb": peak_gb}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("ratio", "scale", "scale-one"), default="ratio")
    p.add_argument("--strategies", nargs="+", default=None)
    p.add_argument("--clients", nargs="+", type=int, default=[20, 100, 500])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--fraction", type=float, default=0.1)
    args = p.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    from flower_pfl import registry

    names = args.strategies or list(registry.REGISTRY)
    if args.mode == "ratio":
        ratio(names, args.clients, args.rounds)
    elif args.mode == "scale-one":
        scale_one(names[0], args.clients[0], args.fraction, args.rounds)
    else:
        n = args.clients[0] if args.clients != [20, 100, 500] else 1000
        for name in names:  # a fresh process each: ru_maxrss is the process' own peak
            out = subprocess.run([sys.executable, __file__, "--mode", "scale-one", "--strategies",
                                  name, "--clients", str(n), "--fraction", str(args.fraction),
                                  "--rounds", str(args.rounds)], capture_output=True, text=True)
            line = out.stdout.strip().splitlines()[-1:] or [out.stderr[-300:]]
            print(line[0], flush=True)


if __name__ == "__main__":
    main()
