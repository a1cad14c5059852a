"""Gaussian noise of client-level DP (docs/privacy.md, "How much noise").  Pure numpy.

Every client's update is clipped to L2 norm C (:mod:`.clipping`); the server's aggregate is
the MEAN of the n updates it accepted (weights forced equal under DP: a sample-weighted
mean would let one client's weight exceed 1/n).  The Gaussian mechanism (Dwork & Roth
2014, Thm A.1; McMahan et al. 2018, DP-FedAvg) adds to the SUM noise of standard deviation
``z C`` per coordinate, z = ``noise-multiplier``; on the mean that is

    server noise (``noise: server``):   std = z C / n                     (:func:`server_std`)

With ``noise: clients`` each of the m sampled clients adds its own independent share
N(0, s^2) to its clipped update; the n shares that reach the mean sum to a Gaussian of
variance n s^2, so s = z C / sqrt(m) gives exactly std z C on the sum when all m answer:

    client share (``noise: clients``):  s = z C / sqrt(m)                 (:func:`client_std`)

With fewer answers (n < m) the sum's noise is s sqrt(n) = z sqrt(n/m) C: the round's
effective multiplier is z sqrt(n/m) (:func:`effective_multiplier`), and that is what the
accountant is given.  An array only some clients share (PLGU-LF's personal layers are
zeros outside its ``shared`` mask) is a mean over its c_k contributors: server noise
z C / c_k on it keeps the guarantee (the privacy loss sums ||Delta_k||^2 / (z C)^2 over the
arrays, <= 1/z^2); client shares give z sqrt(min_k c_k / m).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def server_std(z: float, clip: float, n: int) -> float:
    """Std (model units) of the server's noise on the mean of ``n`` updates clipped to
    ``clip``: z C / n.  Raises ValueError for n < 1."""
    if n < 1:
        raise ValueError(f"noise on a mean of {n} updates")
    return z * clip / n


def client_std(z: float, clip: float, m: int) -> float:
    """Std (model units) of each of ``m`` sampled clients' noise share: z C / sqrt(m)."""
    if m < 1:
        raise ValueError(f"noise shares for {m} sampled clients")
    return z * clip / math.sqrt(m)


def effective_multiplier(z: float, mode: str, answered: int, sampled: int) -> float:
    """The noise multiplier the round's sum really had: z for server noise; z sqrt(n/m)
    for client shares when n of the m sampled clients' updates reached the mean."""
    if mode == "server":
        return z
    if mode == "clients":
        return z * math.sqrt(min(answered, sampled) / sampled)
    raise ValueError(f"unknown noise placement {mode!r} (server | clients)")


def gaussian_like(arrays: Sequence[np.ndarray], stds: Sequence[float] | float,
                  rng: np.random.Generator) -> list[np.ndarray]:
    """One draw of N(0, std_k^2) per entry of each array k (float64, the arrays' shapes);
    ``stds``: one std for all arrays or one per array."""
    per = [float(stds)] * len(arrays) if isinstance(stds, (int, float)) \
        else [float(s) for s in stds]
    if len(per) != len(arrays):
        raise ValueError(f"{len(per)} stds for {len(arrays)} arrays")
    return [rng.normal(0.0, s, size=np.shape(a)) if s > 0 else np.zeros(np.shape(a))
            for a, s in zip(arrays, per)]
