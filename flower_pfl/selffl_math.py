"""Self-FL equations -- Chen et al., "Self-Aware Personalized Federated Learning".

Pure numpy, no Flower.  Notation: sigma0_sq = inter-client uncertainty sigma_0^2,
sigma_sq[m] = intra-client uncertainty sigma_m^2, w_m = (sigma_0^2 + sigma_m^2)^-1,
S_{-m} = sum_{k != m} w_k.

Every division and logarithm is guarded; the fallbacks are documented per function and
never produce NaN.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def precision_weights(sigma0_sq: float, sigma_sq: Sequence[float]) -> np.ndarray:
    """w_m = (sigma_0^2 + sigma_m^2)^-1, with documented fallbacks.

    * unknown sigma_m^2 (NaN: fewer than two observations yet) -> the mean of the known
      ones (no information to rank that client);
    * no usable variance at all, or sigma_0^2 + sigma_m^2 = 0 for some client (infinite
      precision) -> equal weights (the plain mean).
    """
    s = np.asarray(sigma_sq, dtype=np.float64)
    known = np.isfinite(s)
    if not known.any():
        return np.ones_like(s)
    s = np.where(known, s, s[known].mean())
    denom = float(sigma0_sq) + s
    if not np.isfinite(denom).all() or (denom <= 0).any():
        return np.ones_like(s)
    return 1.0 / denom


def theta_fl(z: Sequence[float], sigma0_sq: float, sigma_sq: Sequence[float]) -> np.ndarray:
    """Closed form of eq. 3: theta_m^(FL) = (sigma_m^-2 z_m + sum_{k!=m} w_k z_k) /
    (sigma_m^-2 + S_{-m}), the posterior mean of theta_m given all clients' data."""
    z = np.asarray(z, dtype=np.float64)
    s = np.asarray(sigma_sq, dtype=np.float64)
    w = 1.0 / (sigma0_sq + s)
    others_sum = (w * z).sum() - w * z
    s_minus = w.sum() - w
    return (z / s + others_sum) / (1.0 / s + s_minus)


def theta_global(z: Sequence[float], sigma0_sq: float, sigma_sq: Sequence[float]) -> float:
    """Eq. 2: theta^(G), the precision-weighted mean of the local estimates."""
    w = 1.0 / (sigma0_sq + np.asarray(sigma_sq, dtype=np.float64))
    return float((w * np.asarray(z, dtype=np.float64)).sum() / w.sum())


def s_minus(sigma0_sq: float, sigma_sq_others: Sequence[float]) -> float:
    """S_{-m} = sum_{k != m} (sigma_0^2 + sigma_k^2)^-1 over the OTHER clients' variances."""
    others = np.asarray(sigma_sq_others, dtype=np.float64)
    others = others[np.isfinite(others)]
    if others.size == 0:
        return 0.0
    denom = sigma0_sq + others
    if (denom <= 0).any():
        return math.inf
    return float((1.0 / denom).sum())


def init_coefficient(sigma0_sq: float, sigma_m_sq: float, s_minus_m: float) -> float:
    """c_m = (sigma_0^2 + sigma_m^2)^-1 / S_{-m} of eq. 10.

    Fallback 0 (start from the global model) when it is undefined: sigma_m^2 unknown,
    no other client known (S_{-m} = 0), or infinite precision on either side.
    """
    denom = sigma0_sq + sigma_m_sq
    if not (math.isfinite(sigma_m_sq) and math.isfinite(sigma0_sq) and math.isfinite(s_minus_m)) \
            or s_minus_m <= 0 or denom <= 0:
        return 0.0
    return (1.0 / denom) / s_minus_m


def init_params(theta_global_prev: np.ndarray, theta_m_prev: np.ndarray, coef: float
                ) -> np.ndarray:
    """Eq. 10: theta_m^{t,INIT} = theta^{t-1} - c_m (theta_m^{t-1} - theta^{t-1})."""
    return theta_global_prev - coef * (theta_m_prev - theta_global_prev)


def local_steps(eta: float, sigma_m_sq: float, s_minus_m: float, l_max: int,
                default: int) -> tuple[int, str]:
    """Eq. 8: (1 - eta/sigma_m^2)^l = S_{-m} / (sigma_m^-2 + S_{-m}) solved for l, clipped
    to [1, l_max] (section 4.2).  Returns (steps, reason).

    Fallbacks: sigma_m^2 or S_{-m} unknown (NaN) -> ``default`` (the configured local
    steps); sigma_m^2 = 0
    or S_{-m} = 0 (q = 0: trust the local data fully) -> l_max; eta >= sigma_m^2 (one step
    already reaches or passes the local optimum) -> 1; S_{-m} infinite (q = 1) -> 1.
    """
    if not math.isfinite(sigma_m_sq) or math.isnan(s_minus_m):
        return max(1, min(default, l_max)), "variance unknown"
    if sigma_m_sq <= 0 or s_minus_m <= 0:
        return l_max, "q = 0"
    if eta >= sigma_m_sq:
        return 1, "eta >= sigma_m^2"
    if not math.isfinite(s_minus_m):
        return 1, "q = 1"
    q = s_minus_m / (1.0 / sigma_m_sq + s_minus_m)
    steps = math.log(q) / math.log(1.0 - eta / sigma_m_sq)
    return int(min(max(round(steps), 1), l_max)), "eq. 8"


def aggregate(models: np.ndarray, sigma0_sq: float, sigma_sq: Sequence[float]) -> np.ndarray:
    """Eq. 11: theta^t = sum_m w_m theta_m^t / sum_m w_m over the active clients."""
    w = precision_weights(sigma0_sq, sigma_sq)
    models = np.asarray(models, dtype=np.float64)
    return (w[:, None] * models).sum(axis=0) / w.sum()


def smooth(theta_prev: np.ndarray, theta_hat: np.ndarray, activity: float) -> np.ndarray:
    """Section 4.1: theta^t = (1 - C) theta^{t-1} + C theta_hat^t under client sampling."""
    return (1.0 - activity) * theta_prev + activity * theta_hat


def variance_across(models: np.ndarray) -> float:
    """Eq. 14 (and 13): empirical variance of vectors = trace of their sample covariance
    = sum of entry-wise sample variances (ddof = 1); NaN for fewer than two vectors."""
    models = np.asarray(models, dtype=np.float64)
    if models.shape[0] < 2:
        return float("nan")
    return float(models.var(axis=0, ddof=1).sum())


class Welford:
    """Online eq. 13: running mean and sum of squared deviations of a parameter vector."""

    def __init__(self, count: int = 0, mean: np.ndarray | None = None,
                 m2: np.ndarray | None = None) -> None:
        self.count = count
        self.mean = mean
        self.m2 = m2

    def add(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float64)
        if self.mean is None:
            self.mean, self.m2 = np.zeros_like(x), np.zeros_like(x)
        self.count += 1
        delta = x - self.mean
        self.mean = self.mean + delta / self.count
        self.m2 = self.m2 + delta * (x - self.mean)

    @property
    def variance(self) -> float:
        """Trace of the sample covariance (ddof = 1); NaN before two observations."""
        if self.count < 2:
            return float("nan")
        return float(self.m2.sum() / (self.count - 1))
