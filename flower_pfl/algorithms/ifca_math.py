"""IFCA's equations (Ghosh, Chung, Yin & Ramchandran, "An Efficient Framework for Clustered
Federated Learning", NeurIPS 2020, Algorithm 2), numpy only at import.

    cluster estimation (line 5):  j_i = argmin_{j in [k]} F(theta_j; Z_i)
    model averaging (line 12):    theta_j <- sum_{i: j_i = j} n_i theta~_i / sum_{i: j_i = j} n_i

Open choices: a tie in line 5 goes to the lowest index (``np.argmin``); line 12 weighs each
upload by its sample count n_i (the paper's clients hold equal n, where this is its plain
mean); a cluster no client chose this round keeps its model (the paper's line 12 is
undefined there).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from flower_pfl.algorithms.fedavg_math import weighted_average


def choose_cluster(losses: Sequence[float]) -> int:
    """Alg. 2 line 5: the index of the smallest loss (0-based; a tie: the lowest index).
    Raises ValueError for no losses or a NaN among them."""
    values = np.asarray(losses, dtype=np.float64)
    if values.size == 0 or np.isnan(values).any():
        raise ValueError(f"IFCA: cannot choose a cluster from the losses {values.tolist()}")
    return int(np.argmin(values))


def cluster_means(clusters: Sequence[Sequence[np.ndarray]],
                  uploads: Sequence[Sequence[np.ndarray]], choices: Sequence[int],
                  sizes: Sequence[float]) -> list[list[np.ndarray]]:
    """Alg. 2 line 12: each cluster's new model, the ``sizes``-weighted mean of the uploads
    that chose it (``choices[i]`` in [0, k)); a cluster no upload chose keeps its model.
    ``clusters``: k models (lists of arrays); returns k new lists.  Raises ValueError for a
    choice outside [0, k)."""
    k = len(clusters)
    bad = [c for c in choices if not 0 <= int(c) < k]
    if bad:
        raise ValueError(f"IFCA: cluster index {bad[0]} outside [0, {k})")
    out: list[list[np.ndarray]] = []
    for j in range(k):
        members = [i for i, c in enumerate(choices) if int(c) == j]
        out.append(weighted_average([uploads[i] for i in members],
                                    [sizes[i] for i in members]) if members
                   else [np.array(a, copy=True) for a in clusters[j]])
    return out

