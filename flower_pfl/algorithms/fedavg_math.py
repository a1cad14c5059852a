"""FedAvg's server update (McMahan et al., AISTATS 2017, Algorithm 1), numpy only.

    w <- sum_i (n_i / n) w_i,   n = sum_i n_i,   over the clients of the round

Numpy and no torch, so a strategy built on it keeps torch out of the ServerApp's process
(tests/test_sim_memory.py).  Open choice: the sum is accumulated in float64 and the result
cast back to float32, layer by layer.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def weighted_average(arrays: Sequence[Sequence[np.ndarray]], weights: Sequence[float]
                     ) -> list[np.ndarray]:
    """sum_i w_i * arrays_i / sum_i w_i, layer by layer (float64 accumulation)."""
    w = np.asarray(weights, dtype=np.float64)
    if w.sum() <= 0:
        raise ValueError("weights must have a positive sum")
    w = w / w.sum()
    return [np.tensordot(w, np.stack([a[k] for a in arrays]).astype(np.float64), axes=1)
            .astype(np.float32) for k in range(len(arrays[0]))]
