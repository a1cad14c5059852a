"""Statistics over seeds: mean +- sample std, and the paired Student-t interval.

A bench compares two strategies A and B on the same seeds (same partition, same sampling,
same initial model). For seed s let d_s = x_A(s) - x_B(s), over the n seeds where both
finished. The paired 95% interval of the mean difference is

    d_bar +- t_{(1+c)/2, n-1} * s_d / sqrt(n),   s_d = sqrt(sum (d_s - d_bar)^2 / (n - 1)),

with t_{q, k} the q-quantile of Student's t with k degrees of freedom (c = 0.95: q = 0.975).
With one seed there is no interval (no spread to estimate).  Where the interval contains 0
the verdict is "not resolved at n seeds (±h)", h = t s_d / sqrt(n) its half-width: at this
spread and n, |d_bar| must exceed h to be told from 0 (small h: any true gap is small).

Student's t CDF through the regularized incomplete beta function,

    P(T <= t) = 1 - I_{k/(k+t^2)}(k/2, 1/2) / 2     (t >= 0; symmetric for t < 0),

I_x(a, b) by its continued fraction (Lentz's method, Numerical Recipes 6.4), and the quantile
by bisection on that CDF (monotone, so bisection always converges; 1e-12 relative).
Choices left open: none of the statistics is weighted by clients or samples (one number per
seed, the bench's final mean or worst-10%); no correction for several comparisons.
Pure Python (``math`` only): no scipy, no Flower.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

HOLDS, DOES_NOT_HOLD, ONE_SEED = "holds", "does not hold", "n/a (1 seed)"
NOT_RESOLVED = "not resolved"  # how the verdict starts where the interval contains 0


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample std (n - 1 in the denominator; 0.0 for one value)."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_std of no values")
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, std


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc: x = {x} outside [0, 1]")
    if x in (0.0, 1.0):
        return x
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):  # the fraction converges fast here
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"t_cdf: df = {df} must be > 0")
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p``-quantile of Student's t with ``df`` degrees of freedom (0 < p < 1)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p = {p} outside (0, 1)")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class PairedInterval:
    """A - B per pair: ``diffs``, their ``mean``, and the interval's ``half`` width (None
    with one pair: no interval)."""

    mean: float
    half: float | None
    n: int
    diffs: tuple[float, ...]

    @property
    def low(self) -> float | None:
        return None if self.half is None else self.mean - self.half

    @property
    def high(self) -> float | None:
        return None if self.half is None else self.mean + self.half


def paired_interval(a: Sequence[float], b: Sequence[float], confidence: float = 0.95
                    ) -> PairedInterval:
    """The Student-t interval of mean(a - b) over the pairs (a[i], b[i])."""
    if len(a) != len(b):
        raise ValueError(f"paired_interval: {len(a)} values of A but {len(b)} of B")
    if not a:
        raise ValueError("paired_interval: no pairs")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"paired_interval: confidence = {confidence} outside (0, 1)")
    diffs = tuple(float(x) - float(y) for x, y in zip(a, b))
    mean, std = mean_std(diffs)
    n = len(diffs)
    half = None if n < 2 else t_quantile((1.0 + confidence) / 2.0, n - 1) * std / math.sqrt(n)
    return PairedInterval(mean, half, n, diffs)


def not_resolved(n: int, half: float) -> str:
    """The verdict of an interval that contains 0: ``not resolved at n seeds (±h)``, h its
    half-width as the tables print numbers (2 decimals, the compared column's units)."""
    return f"{NOT_RESOLVED} at {n} seeds (±{half:.2f})"


def is_unresolved(text: str) -> bool:
    """Whether a verdict says the interval contains 0 (see :func:`not_resolved`)."""
    return text.startswith(NOT_RESOLVED)


def verdict(interval: PairedInterval, lower_is_better: bool = False) -> str:
    """'holds' (the interval excludes 0 on A's better side), 'does not hold' (it excludes 0
    on B's better side), 'not resolved at n seeds (±h)' (it contains 0; h its half-width,
    :func:`not_resolved`) or 'n/a (1 seed)'.  For an error metric (``lower_is_better``) A is
    better where A - B < 0."""
    if interval.half is None:
        return ONE_SEED
    low, high = interval.mean - interval.half, interval.mean + interval.half
    if low <= 0.0 <= high:
        return not_resolved(interval.n, interval.half)
    a_better = high < 0.0 if lower_is_better else low > 0.0
    return HOLDS if a_better else DOES_NOT_HOLD
