"""Adaptive clipping -- Andrew, Thakkar, McMahan & Ramaswamy, "Differentially Private
Learning with Adaptive Clipping", NeurIPS 2021, Algorithm 1 (server side).  Pure math.

Each round every client reports b_i = 1[||Delta_i|| <= C] (its update was not clipped);
the server noises their count and moves C geometrically toward the target quantile gamma:

    b_bar = (sum_i b_i + N(0, sigma_b^2)) / n                          (line "b~")
    C    <- C * exp(-eta_C (b_bar - gamma))                            (eq. 2, geometric)

The count is a second Gaussian query on the same clients, so the update's noise multiplier
is raised to keep the pair's total at the configured z (section 3, Theorem 1):

    z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)          (needs 2 sigma_b > z)

(the count's sensitivity is half the update sum's in units of C, under add/remove and
replace-one alike, so the accountant keeps z).  The paper's default sigma_b = m / 20.
"""

from __future__ import annotations

import math

import numpy as np


def update_multiplier(z: float, count_std: float) -> float:
    """z_Delta: the update noise multiplier that, with the count's noise ``count_std``,
    spends the same privacy as multiplier ``z`` alone.  Raises ValueError when
    ``2 count_std <= z`` (the count alone would spend it all)."""
    if not 2.0 * count_std > z:
        raise ValueError(f"count noise {count_std:g} is too small for noise multiplier {z:g}: "
                         f"adaptive clipping needs 2 x count noise > noise multiplier")
    return (z ** -2 - (2.0 * count_std) ** -2) ** -0.5


def default_count_std(sampled: int) -> float:
    """The paper's sigma_b = m / 20 for m clients per round."""
    return sampled / 20.0


def next_clip(clip: float, unclipped: int, n: int, target: float, lr: float,
              count_std: float, rng: np.random.Generator) -> tuple[float, float]:
    """(the next round's C, the noised unclipped fraction b_bar) after a round where
    ``unclipped`` of ``n`` updates were within ``clip``."""
    if n < 1:
        raise ValueError("no update to adapt the clip from")
    b_bar = (unclipped + float(rng.normal(0.0, count_std))) / n
    return clip * math.exp(-lr * (b_bar - target)), b_bar
