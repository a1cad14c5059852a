"""FedFomo's first-order weights and update (Zhang et al., ICLR 2021, section 3), numpy only.

For client i with its current model theta_i and peers theta_j:

    w_ij = max(0, (L_i(theta_i) - L_i(theta_j)) / ||theta_j - theta_i||)
    w_ij <- w_ij / sum_j w_ij
    theta_i <- theta_i + sum_j w_ij (theta_j - theta_i)

L_i is the mean loss on the client's validation split, ||.|| the L2 norm over all the
model's float arrays.  Open choices: a peer at distance 0 gets weight 0 (it is the same
model: no direction); every weight 0 (no peer better) keeps theta_i unchanged.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def distance(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    """||a - b||, the L2 norm over all arrays (float64)."""
    return float(np.sqrt(sum(float(np.sum((np.asarray(x, np.float64) - np.asarray(y, np.float64))
                                          ** 2)) for x, y in zip(a, b))))


def fomo_weights(own_loss: float, peer_losses: Sequence[float],
                 distances: Sequence[float]) -> np.ndarray:
    """The normalised weights (length M, summing to 1, or all 0 when no peer has a
    lower loss).  ``distances[j]`` = ||theta_j - theta_i|| (>= 0)."""
    losses = np.asarray(peer_losses, dtype=np.float64)
    dist = np.asarray(distances, dtype=np.float64)
    raw = np.zeros_like(losses)
    moved = dist > 0
    raw[moved] = (own_loss - losses[moved]) / dist[moved]
    raw = np.maximum(raw, 0.0)
    total = raw.sum()
    return raw / total if total > 0 else raw


def fomo_update(own: Sequence[np.ndarray], peers: Sequence[Sequence[np.ndarray]],
                weights: Sequence[float] | np.ndarray) -> list[np.ndarray]:
    """The update: theta_i + sum_j w_j (theta_j - theta_i), array by array (float64 sums, the
    arrays' own dtype back)."""
    out = []
    for k, base in enumerate(own):
        acc = np.asarray(base, dtype=np.float64).copy()
        for w, peer in zip(weights, peers):
            if w:
                acc += float(w) * (np.asarray(peer[k], np.float64) - np.asarray(base, np.float64))
        out.append(acc.astype(np.asarray(base).dtype))
    return out
