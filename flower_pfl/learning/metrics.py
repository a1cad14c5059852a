"""Per-client accuracies -> the statistics pFL papers report.

``summarize`` gives, for one evaluation round over ALL clients: mean (the papers'
"mean test accuracy"), sample-weighted mean (accuracy of the pooled test sets), std,
worst-10% mean and top-10% mean (mean over the ceil(10% * n) lowest/highest clients),
worst-5% and top-5% mean (the same over ceil(5% * n) clients: the "lowest 5%" and "top 5%"
columns of PLGU's Tables 1-2; with fewer than 20 clients that is the single worst/best
client), min and max.  ``best_mean`` over rounds is BMTA (FedAMP's
"best mean testing accuracy").  For an error (``lower_is_better``: the synthetic task's
squared error) the worst clients are those with the HIGHEST values and the top ones those
with the lowest; min and max stay the smallest and largest value.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

STAT_KEYS = ("mean", "weighted_mean", "std", "worst10_mean", "top10_mean", "worst5_mean",
             "top5_mean", "min", "max")


def tail_count(n: int, share: float = 0.1) -> int:
    """How many clients form the worst/top ``share`` (at least one)."""
    return max(1, math.ceil(share * n))


def summarize(values: Sequence[float], weights: Sequence[float] | None = None,
              lower_is_better: bool = False) -> dict[str, float]:
    """Statistics of per-client values (e.g. accuracies); weights = test-sample counts;
    ``lower_is_better``: the values are errors (worst = highest)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("no client values to summarize")
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=np.float64)
    k = tail_count(v.size)
    k5 = tail_count(v.size, 0.05)
    ordered = np.sort(v)
    worst_first = ordered[::-1] if lower_is_better else ordered
    return {
        "mean": float(v.mean()),
        "weighted_mean": float((v * w).sum() / w.sum()),
        "std": float(v.std()),  # population std over clients
        "worst10_mean": float(worst_first[:k].mean()),
        "top10_mean": float(worst_first[-k:].mean()),
        "worst5_mean": float(worst_first[:k5].mean()),  # PLGU Tables 1-2: lowest 5%
        "top5_mean": float(worst_first[-k5:].mean()),  # PLGU Tables 1-2: top 5%
        "min": float(ordered[0]),
        "max": float(ordered[-1]),
    }


def best_mean(history: Sequence[Mapping[str, float]], key: str = "mean") -> float:
    """BMTA: the best per-round mean over the rounds evaluated so far."""
    return max(h[key] for h in history)
