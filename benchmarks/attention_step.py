"""Server-side attention step of FedAMP/HeurFedAMP/FedACS vs the physical floor.

For n clients with d-parameter models (default d = 1M) it prints, from ONE run:

  gram      one bare float32 Gram matmul X @ X.T of the (n, d) model stack (the floor)
  full      the server's step recomputed from scratch: Gram of all n stored models +
            FedAMP weights + U = Xi W for the sampled clients
  incr      the step as the strategy runs it: only the s uploaded rows of the Gram
            matrix refreshed + weights + U for the s sampled clients
  naive     a Python loop over client pairs computing ||w_i - w_j||^2 (n <= 100)

and the ratios full/gram, incr/gram, naive/gram.  Usage:

    .venv/bin/python benchmarks/attention_step.py [--dim 1000000] [--clients 20 100 500]
                                                  [--sample 1.0 0.1]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from flower_pfl.algorithms.attention import fedamp_alpha_bound, fedamp_weights
from flower_pfl.model_store import ModelStore


def timed(fn, repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def step(matrix: ModelStore, rows: np.ndarray) -> np.ndarray:
    """Weights for ``rows`` over all stored models, then their cloud models."""
    seen = np.flatnonzero(matrix.seen)
    d = matrix.sq_distances(rows)
    sigma = float(np.median(d[:, seen])) or 1.0
    xi = fedamp_weights(d, rows, matrix.seen, fedamp_alpha_bound(sigma, len(seen)), sigma)
    return matrix.combine(xi)


def naive_pairs(x: np.ndarray) -> np.ndarray:
    n = len(x)
    out = np.zeros((n, n), dtype=np.float32)
    for i in range(n):
        for j in range(i + 1, n):
            diff = x[i] - x[j]
            out[i, j] = out[j, i] = diff @ diff
    return out


def time_steps(matrix: ModelStore, rows: np.ndarray, new: np.ndarray,
               repeat: int) -> tuple[float, float]:
    """Best times of the full (from scratch) and the incremental server step for ``rows``."""

    def full() -> None:
        matrix.recompute()
        step(matrix, rows)

    def incr() -> None:
        matrix.update(rows, new)
        step(matrix, rows)

    return timed(full, repeat), timed(incr, repeat)


def time_clients(n: int, args: argparse.Namespace, rng: np.random.Generator) -> None:
    """Print one row per sample fraction for ``n`` clients (the model stack lives only here)."""
    ref = rng.standard_normal(args.dim, dtype=np.float32)
    x = ref + 0.01 * rng.standard_normal((n, args.dim), dtype=np.float32)
    gram = timed(lambda: x @ x.T, args.repeat)
    matrix = ModelStore(n, ref)
    matrix.update(np.arange(n), x)
    naive = timed(lambda: naive_pairs(x)) if n <= 100 else float("nan")
    for frac in args.sample:
        s = max(1, int(round(frac * n)))
        rows = np.sort(rng.choice(n, s, replace=False))
        new = x[rows] + 0.001
        t_full, t_incr = time_steps(matrix, rows, new, args.repeat)
        print(f"{n:>5} {s:>5} {gram:>8.3f} {t_full:>8.3f} {t_incr:>8.3f} {naive:>8.3f} "
              f"{t_full / gram:>9.2f} {t_incr / gram:>9.2f} {naive / gram:>10.1f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dim", type=int, default=1_000_000)
    p.add_argument("--clients", type=int, nargs="+", default=[20, 100, 500])
    p.add_argument("--sample", type=float, nargs="+", default=[1.0, 0.1])
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    print(f"d = {args.dim:,} float32 parameters per model")
    print(f"{'n':>5} {'s':>5} {'gram_s':>8} {'full_s':>8} {'incr_s':>8} {'naive_s':>8} "
          f"{'full/gram':>9} {'incr/gram':>9} {'naive/gram':>10}")
    for n in args.clients:
        time_clients(n, args, rng)  # its model stack is freed on return, before the next n


if __name__ == "__main__":
    main()
