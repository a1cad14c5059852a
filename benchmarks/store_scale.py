"""Model store at scale: seconds per round and peak RSS of the server, n up to 10,000
clients x d = 1,010,850 (docs/BENCHMARKS.md, "Model store on disk: 10,000 clients").

One fresh process per (strategy, n, fraction) -- ``ru_maxrss`` is that process's own peak
-- drives the Strategy through Flower's methods with synthetic uploads, as
benchmarks/server_cost.py does (benchmarks/synthetic_uploads.py: the fake client manager,
the MLP-shaped model, the noisy uploads): each round
``configure_fit`` (sampling, attention, the cloud models, every payload serialised) and
``aggregate_fit`` (every upload checked, decoded into the store, the Gram refresh). The
uploads (payload + client-specific noise) are built outside the clock; the instructions
stay alive until ``aggregate_fit`` returns, as in Flower's ``fit_round``, so the peak holds
the round's payloads and uploads (Flower's bytes) as a real server would.

Store: ``server.model-store`` as given (default disk), ``server.store-dtype``, and the
budget (default: half the RAM). ``--prefill`` starts from a store where all n clients
have a model (synthetic rows r + C_j B, rank 4, written to the store; their Gram matrix
assigned from C B B^T C^T, not computed) so that every timed round is the steady state
(every row stored); without it the run starts empty, as a real run does, and round t
refreshes k x min(n, ~t k) Gram entries.

Bare Gram: one float32 sgemm of the round's shape -- (k x dc) @ (dc x m), k = sampled
rows, m = stored rows, on a column slice dc = 8192 scaled by d / dc: the incremental Gram
update's own arithmetic without the store's I/O (best of 3, same process).

    .venv/bin/python benchmarks/store_scale.py --clients 1000 2000 --fractions 0.01 0.1 \
        --strategies fedamp heurfedamp fedacs selffl --rounds 3 --out store.jsonl
    .venv/bin/python benchmarks/store_scale.py --clients 10000 --fractions 0.1 \
        --strategies fedamp fedacs --rounds 3 --workdir /work/store-bench
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.synthetic_uploads import (  # noqa: E402
    make_manager,
    model_arrays,
    timed_rounds,
)

SLICE = 8192


def bare_gram_s(k: int, m: int, d: int) -> float:
    """float32 (k x SLICE) @ (SLICE x m), best of 3, scaled to d columns."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((k, SLICE), dtype=np.float32)
    b = rng.standard_normal((m, SLICE), dtype=np.float32)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        a @ b.T
        best = min(best, time.perf_counter() - t0)
    return best * d / SLICE


def prefill(strategy, rank: int = 4) -> None:
    """Every client holds a synthetic model r + C_j B; the Gram matrix is assigned."""
    store = strategy.matrix
    n, d = store.num_rows, store.dim
    rng = np.random.default_rng(7)
    basis = (0.01 * rng.standard_normal((rank, d), dtype=np.float32))
    coef = rng.standard_normal((n, rank)).astype(np.float32)
    for j in range(n):
        store.write(j, store.reference + coef[j] @ basis)
    store.gram_c[:] = coef @ (basis.astype(np.float64) @ basis.T.astype(np.float64)) @ coef.T
    store.cross[:] = coef.astype(np.float64) @ (basis.astype(np.float64) @ store.reference)
    store.dirty[:] = False


def run_one(name: str, n: int, fraction: float, rounds: int, store: str, dtype: str,
            budget_mb: float | None, do_prefill: bool, workdir: Path) -> dict:
    from flower_pfl import config, registry

    tree = {"strategy": name, "clients": n, "fraction-fit": fraction, "min-fit-clients": 1,
            "rounds": rounds + 1, "model": "dnn", "checkpoint-every": 0,
            "data": {"dataset": "fmnist"},
            "server": {"model-store": store, "store-dtype": dtype}}
    if budget_mb:
        tree["server"]["memory-budget-mb"] = budget_mb
    cfg = config.validate(tree, source="store_scale")
    out = Path(tempfile.mkdtemp(prefix=f"{name}-{n}-", dir=workdir))
    try:
        strategy = registry.strategy_class(name)(cfg, initial_arrays=model_arrays(),
                                                      results_dir=out)
        manager = make_manager(n)
        params = strategy.initialize_parameters(manager)
        d = strategy.spec.dim
        t0 = time.perf_counter()
        if do_prefill and getattr(strategy.store, "matrix", None) is not None:
            prefill(strategy)
        prefill_s = time.perf_counter() - t0
        rows = []
        for rnd, k, t_conf, t_agg in timed_rounds(strategy, params, manager, rounds):
            matrix = getattr(strategy.store, "matrix", None)
            m = int(matrix.seen.sum()) if matrix is not None else 0
            rows.append({"round": rnd, "k": k, "stored": m, "configure_s": round(t_conf, 2),
                         "aggregate_s": round(t_agg, 2), "s": round(t_conf + t_agg, 2)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        file_gb = sum(f.stat().st_size for f in out.rglob("*.bin")) / 2**30
        with open(out / "server.csv") as fh:
            server = list(csv.DictReader(fh))
        plan = getattr(getattr(strategy.store, "matrix", None), "plan", None)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    k = rows[-1]["k"]
    return {"strategy": name, "clients": n, "fraction": fraction, "d": d,
            "store": plan.backend if plan else "none (no per-client models)", "dtype": dtype,
            "prefill": do_prefill, "prefill_s": round(prefill_s, 1), "rounds": rows,
            "s_per_round": [r["s"] for r in rows],
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
            "store_file_gb": round(file_gb, 2),
            "attention_s": [float(r.get("attention_s") or 0) for r in server],
            "bare_gram_s_last_round": round(bare_gram_s(k, max(1, rows[-1]["stored"]), d), 2),
            "bare_gram_s_steady": round(bare_gram_s(k, n, d), 2)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--strategies", nargs="+", default=["fedamp", "heurfedamp", "fedacs",
                                                         "selffl"])
    p.add_argument("--clients", nargs="+", type=int, default=[1000, 2000])
    p.add_argument("--fractions", nargs="+", type=float, default=[0.01, 0.1])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--store", default="disk", choices=("auto", "memory", "disk"))
    p.add_argument("--dtype", default="float32", choices=("float32", "float16"))
    p.add_argument("--budget-mb", type=float, default=None)
    p.add_argument("--prefill", action="store_true")
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    p.add_argument("--out", type=Path, default=None, help="append one JSON line per point")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    if args.one:
        res = run_one(args.strategies[0], args.clients[0], args.fractions[0], args.rounds,
                      args.store, args.dtype, args.budget_mb, args.prefill, args.workdir)
        print(json.dumps(res), flush=True)
        return
    args.workdir.mkdir(parents=True, exist_ok=True)
    for n in args.clients:
        for fraction in args.fractions:
            for name in args.strategies:  # a fresh process each: its own ru_maxrss
                cmd = [sys.executable, __file__, "--one", "--strategies", name, "--clients",
                       str(n), "--fractions", str(fraction), "--rounds", str(args.rounds),
                       "--store", args.store, "--dtype", args.dtype, "--workdir",
                       str(args.workdir)] + (["--prefill"] if args.prefill else []) + \
                      (["--budget-mb", str(args.budget_mb)] if args.budget_mb else [])
                t0 = time.time()
                proc = subprocess.run(cmd, capture_output=True, text=True)
                lines = proc.stdout.strip().splitlines()
                if proc.returncode or not lines:
                    res = {"strategy": name, "clients": n, "fraction": fraction,
                           "error": proc.stderr[-600:]}
                else:
                    res = json.loads(lines[-1])
                res["wall_s"] = round(time.time() - t0, 1)
                print(json.dumps(res), flush=True)
                if args.out:
                    with open(args.out, "a") as fh:
                        fh.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
