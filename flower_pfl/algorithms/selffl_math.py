"""Self-FL equations -- Chen et al., "Self-Aware Personalized Federated Learning".

Pure numpy, no Flower.  Notation: sigma0_sq = inter-client uncertainty sigma_0^2,
sigma_sq[m] = intra-client uncertainty sigma_m^2, w_m = (sigma_0^2 + sigma_m^2)^-1,
S_{-m} = sum_{k != m} w_k, q_m = S_{-m} / (sigma_m^-2 + S_{-m}).

Paper equations used here:
  eq. 3   theta_m^(FL) = (sigma_m^-2 z_m + sum_{k!=m} w_k z_k) / (sigma_m^-2 + S_{-m})
  eq. 8   (1 - eta_m / sigma_m^2)^l_m = q_m          (local steps l_m and step size eta_m)
  eq. 10  theta_m^{t,INIT} = theta^{t-1} - (w_m / S_{-m}) (theta_m^{t-1} - theta^{t-1})
  eq. 11  theta^t = sum_m w_m theta_m^t / sum_m w_m
  eq. 13  sigma_m^2 = empirical variance of client m's local optima theta_{m,1..t}
  eq. 14  sigma_0^2 = empirical variance of the clients' local optima theta_{1..M,t}
  (vectors: "empirical variance" = trace of the sample covariance, section 3.2)

Choices the paper leaves open, and ours:
* What eq. 13/14 are taken over (section 3.2): the BOOTSTRAP estimator (default) takes
  them over local optima theta_{m,t}, each the result of training a copy on a bootstrap
  resample of the client's data "until it approximately converges" -- the stopping rule
  is :class:`ConvergenceRule` (mean gradient norm over the last pass fell below ``tol``
  times that of the first pass) with a step cap.  The paper's cheaper SURROGATE takes
  them over the personal models theta_m^t; it collapses (Self-FL pulls theta_m^t to the
  global model, so their spread shrinks, so sigma_0^2 shrinks, ...) -- see
  :func:`orders_of_magnitude_drop`, the mechanism-off measure.
* Eq. 14 from sums (:func:`variance_from_sums`): each client sends its optimum's offset
  d_m = theta_{m,t} - theta^{t-1} and the scalar ||d_m||^2 (float64), the server forms
  (sum ||d_m||^2 - ||sum d_m||^2 / n) / (n - 1).  Offsets to the shared theta^{t-1}
  keep the float32 transport exact enough (raw parameters would cancel catastrophically).
* Eq. 8 when one step at eta already passes the target (eta >= sigma_m^2, or eq. 8's
  l < 1): the paper lets eta_m follow sigma_m^2, so we keep the configured number of
  local steps l (clipped to l_max) and solve eq. 8 for the step size,
  eta_m = sigma_m^2 (1 - q^(1/l)) -- exact, instead of clipping to one step of eta.
* Eq. 8's per-step contraction in deep learning (``contraction: measured``, the default
  with the bootstrap estimator): eq. 8 is (1 - eta h_m)^l = q_m with h_m = sigma_m^-2,
  the curvature of client m's negative log-likelihood in the Gaussian model (eq. 5).
  For a network trained on a mean cross-entropy, sigma_m^2 is a TRACE over d parameters
  (section 3.2) and is not that curvature: taken literally, eta / sigma_m^2 compares a
  per-parameter step with a d-dimensional variance and eq. 8 returns one step
  (docs/algorithms/selffl.md, FMNIST practical).  q_m itself is a ratio of variances and
  is unchanged by the trace (scale-free).  So we keep q_m from eqs. 13-14 and measure
  the contraction per step where the paper assumes it: the bootstrap fit starts at the
  same theta_m^INIT and descends toward the local optimum, and its gradient norm
  shrinks by rho per step (:meth:`ConvergenceRule.contraction`); h_m = (1 - rho) /
  eta_b (:func:`measured_curvature`).  On the Gaussian model with full-batch GD this
  IS sigma_m^-2 (the norm shrinks by exactly 1 - eta_b / sigma_m^2 per step), so the
  synthetic task could use either; ``contraction: variance`` is eq. 8 literally, and
  ``auto`` keeps it for a one-parameter model (sigma_m^2 is then a variance, not a trace;
  on the synthetic task the literal form also measured better: its estimated sigma_m^2
  enters q_m and the contraction alike, and the errors partly cancel).
  When the fit shows no contraction (rho >= 1: mini-batch noise) the client runs
  l-max steps, the "too large, clip to l_max" case of section 4.2.
* Every other division and logarithm is guarded; each fallback has a name (returned
  with the value) so that the strategy can count it, and none produces NaN.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

# names of the fallbacks of eq. 11 (counted per round by the strategy)
WEIGHTS_EQ11 = "eq. 11"
WEIGHTS_UNWEIGHTED = "unweighted mean"
#: the name of d_m = theta_{m,t} - theta^{t-1}, the upload's extra part (bootstrap rounds)
OPTIMUM_OFFSET = "optimum-offset"


def precision_weights_explained(sigma0_sq: float, sigma_sq: Sequence[float]
                                ) -> tuple[np.ndarray, str]:
    """w_m = (sigma_0^2 + sigma_m^2)^-1 and the rule used, with documented fallbacks.

    * unknown sigma_m^2 (NaN: fewer than two observations yet) -> the mean of the known
      ones (no information to rank that client; the strategy counts these);
    * no usable variance at all, or sigma_0^2 + sigma_m^2 = 0 for some client (infinite
      precision) -> equal weights (``WEIGHTS_UNWEIGHTED``, the plain mean).
    """
    s = np.asarray(sigma_sq, dtype=np.float64)
    known = np.isfinite(s)
    if not known.any():
        return np.ones_like(s), WEIGHTS_UNWEIGHTED
    s = np.where(known, s, s[known].mean())
    denom = float(sigma0_sq) + s
    if not np.isfinite(denom).all() or (denom <= 0).any():
        return np.ones_like(s), WEIGHTS_UNWEIGHTED
    return 1.0 / denom, WEIGHTS_EQ11


def precision_weights(sigma0_sq: float, sigma_sq: Sequence[float]) -> np.ndarray:
    """w_m of eq. 11 (see :func:`precision_weights_explained` for the fallbacks)."""
    return precision_weights_explained(sigma0_sq, sigma_sq)[0]


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


# names of the rules of eq. 8 (the client reports one as ``steps_rule``)
RULE_EQ8 = "eq. 8"
RULE_L_MAX = "eq. 8 clipped to l-max"
RULE_ETA_GE_SIGMA = "eta_m by eq. 8 (eta >= sigma_m^2)"
RULE_BELOW_ONE = "eta_m by eq. 8 (l < 1 at eta)"
RULE_UNKNOWN = "variance unknown"
RULE_Q0 = "q = 0"
RULE_Q1 = "q = 1"
RULE_WARMUP = "warm-up (FedAvg)"
RULE_NO_CONTRACTION = "no measured contraction (l-max)"
RULES = (RULE_EQ8, RULE_L_MAX, RULE_ETA_GE_SIGMA, RULE_BELOW_ONE, RULE_UNKNOWN, RULE_Q0,
         RULE_Q1, RULE_WARMUP, RULE_NO_CONTRACTION)


def eta_for_steps(inv_curvature: float, q: float, steps: int) -> float:
    """Eq. 8 solved for the step size: eta_m = h^-1 (1 - q^(1/l)), in (0, h^-1); the paper's
    h^-1 is sigma_m^2."""
    return inv_curvature * (1.0 - q ** (1.0 / steps))


def measured_curvature(rho: float, lr: float) -> float:
    """h = (1 - rho) / lr: the curvature a GD step of size ``lr`` needs to shrink the distance
    to the optimum by ``rho`` per step (exact on a quadratic).  NaN when rho is unknown,
    0 when there was no contraction (rho >= 1)."""
    if not math.isfinite(rho) or lr <= 0:
        return math.nan
    return max(0.0, (1.0 - rho) / lr)


def local_schedule(eta: float, sigma_m_sq: float, s_minus_m: float, l_max: int,
                   default: int, curvature: float | None = None) -> tuple[int, float, str]:
    """Eq. 8: (1 - eta_m h_m)^l = q = S_{-m} / (sigma_m^-2 + S_{-m}), h_m = sigma_m^-2 in
    the paper, or the measured ``curvature`` when given (see the module notes).

    Returns (l_m, eta_m, rule).  Normally eta_m = eta and l_m = round(log q / log(1 -
    eta h_m)), clipped to l_max (section 4.2; rule ``RULE_L_MAX``).  When one step of eta
    already passes the target -- eta h_m >= 1 (the log is undefined) or eq. 8 gives
    l < 1 -- l_m = min(default, l_max) and eta_m = :func:`eta_for_steps`, which meets
    eq. 8 exactly (rules ``RULE_ETA_GE_SIGMA``, ``RULE_BELOW_ONE``).

    Fallbacks: sigma_m^2 or S_{-m} unknown (NaN) -> ``default`` steps at eta
    (``RULE_UNKNOWN``, also when a measured curvature is NaN); sigma_m^2 = 0 or S_{-m} = 0
    (q = 0: trust the local data fully) -> l_max; S_{-m} infinite (q = 1: no local step
    wanted) -> 1 step; a measured curvature of 0 (no contraction) -> l_max
    (``RULE_NO_CONTRACTION``).
    """
    if not math.isfinite(sigma_m_sq) or math.isnan(s_minus_m) or \
            (curvature is not None and math.isnan(curvature)):
        return max(1, min(default, l_max)), eta, RULE_UNKNOWN
    if sigma_m_sq <= 0 or s_minus_m <= 0:
        return l_max, eta, RULE_Q0
    if not math.isfinite(s_minus_m):
        return 1, eta, RULE_Q1
    q = s_minus_m / (1.0 / sigma_m_sq + s_minus_m)
    fixed = max(1, min(default, l_max))
    h = 1.0 / sigma_m_sq if curvature is None else float(curvature)
    if h <= 0:
        return l_max, eta, RULE_NO_CONTRACTION
    if eta * h >= 1.0:
        return fixed, eta_for_steps(1.0 / h, q, fixed), RULE_ETA_GE_SIGMA
    steps = math.log(q) / math.log(1.0 - eta * h)
    if steps < 0.5:
        return fixed, eta_for_steps(1.0 / h, q, fixed), RULE_BELOW_ONE
    if steps > l_max:
        return l_max, eta, RULE_L_MAX
    return int(round(steps)), eta, RULE_EQ8


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


def variance_from_sums(offset_sum: np.ndarray, sq_norm_sum: float, n: int) -> float:
    """Eq. 14 from what the clients send: with offsets d_m = x_m - r to any common r,
    trace of the sample covariance = (sum ||d_m||^2 - ||sum d_m||^2 / n) / (n - 1).
    NaN for n < 2; tiny negative rounding is clipped to 0."""
    if n < 2:
        return float("nan")
    offset_sum = np.asarray(offset_sum, dtype=np.float64)
    return max(0.0, (float(sq_norm_sum) - float(offset_sum @ offset_sum) / n) / (n - 1))


def orders_of_magnitude_drop(peak: float, current: float) -> float:
    """log10(peak / current): how far sigma_0^2 fell below its largest value so far (the
    mechanism-off measure: at ~2+ orders the personal models have collapsed onto the
    global model and Self-FL runs as FedAvg).  0 when undefined; inf when current = 0."""
    if not (math.isfinite(peak) and math.isfinite(current)) or peak <= 0:
        return 0.0
    if current <= 0:
        return math.inf
    return max(0.0, math.log10(peak / current))


class ConvergenceRule:
    """The bootstrap fit's stopping rule ("until it approximately converges", section 3.2).

    Fed one gradient norm per SGD step; stops when the mean norm over the last ``window``
    steps (one pass over the resample) has fallen to ``tol`` times the mean over the first
    ``window`` steps.  With full-batch GD on a quadratic (the synthetic task) the distance
    to the optimum shrinks like the gradient, so ``tol`` = 0.01 leaves 1% of the initial
    distance.  With mini-batch SGD the norm plateaus at the gradient noise and the step cap
    (the caller's) ends the fit instead; the caller reports which one did.
    """

    def __init__(self, tol: float, window: int) -> None:
        self.tol = float(tol)
        self.window = max(1, int(window))
        self.norms: list[float] = []
        self.converged = False

    def update(self, grad_norm: float) -> bool:
        """Record one step's gradient norm; True = stop now."""
        self.norms.append(float(grad_norm))
        if len(self.norms) < self.window:
            return False
        first, last = self._window_means()
        self.converged = first <= 0 or last <= self.tol * first
        return self.converged

    def _window_means(self) -> tuple[float, float]:
        """Mean gradient norm over the first and over the last ``window`` steps."""
        w = self.window
        return float(np.mean(self.norms[:w])), float(np.mean(self.norms[-w:]))

    def contraction(self) -> float:
        """rho: the per-step factor by which the gradient norm shrank, (mean over the last
        window / mean over the first) ^ (1 / steps between them); NaN with fewer than
        window + 1 steps.  On a quadratic under full-batch GD, exactly 1 - lr h."""
        gap = len(self.norms) - self.window
        if gap < 1:
            return math.nan
        first, last = self._window_means()
        if first <= 0:
            return 0.0
        return (last / first) ** (1.0 / gap)


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
        assert self.m2 is not None  # count >= 2: add() has set it
        return float(self.m2.sum() / (self.count - 1))
