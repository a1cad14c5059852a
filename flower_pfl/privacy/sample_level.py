"""Sample-level DP's accounting in the client: opacus' RDP accountant over every DP-SGD step
the client has run in this federation (its history kept in the client's state, so it grows
across rounds and survives a resume).  Per-client ε is reported in the fit metrics
(``dp_epsilon``); the server records the largest (``epsilon_max``).

Cost: opacus' RDP of one step at (z, q) (``privacy_analysis.compute_rdp``, pure Python over
its 150 orders, ~0.1 s) is computed once per distinct (z, q) in this process
(:func:`step_rdp`, cached; a client keeps its q = batch / n across rounds), and
:func:`epsilon` then does exactly what ``RDPAccountant.get_privacy_spent`` does with it
(``sum`` of ``curve x steps`` over the history, ``privacy_analysis.get_privacy_spent``): the
same value bit for bit (tests/test_privacy_sample.py checks equality)."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Mapping

import numpy as np
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis import rdp as privacy_analysis

#: the client state key of the DP-SGD history (clients/base.py)
STATE_KEY = "dp-sgd"


def history_of(values: Mapping[str, Any] | None) -> list[tuple[float, float, int]]:
    """The (noise multiplier, sample rate, steps) entries stored under :data:`STATE_KEY`."""
    if not values:
        return []
    return [(float(z), float(q), int(k)) for z, q, k in json.loads(str(values["history"]))]


def extend(history: list[tuple[float, float, int]], z: float, q: float, steps: int
           ) -> list[tuple[float, float, int]]:
    """``history`` with ``steps`` more DP-SGD steps at (z, q)."""
    if history and history[-1][0] == z and history[-1][1] == q:
        return [*history[:-1], (z, q, history[-1][2] + steps)]
    return [*history, (z, q, steps)]


@lru_cache(maxsize=4096)
def step_rdp(z: float, q: float) -> tuple[float, ...]:
    """opacus' RDP of ONE DP-SGD step (noise multiplier z, Poisson rate q) at each of
    ``RDPAccountant.DEFAULT_ALPHAS`` (``compute_rdp(steps=1)``: the curve x 1, exactly)."""
    return tuple(float(r) for r in privacy_analysis.compute_rdp(
        q=q, noise_multiplier=z, steps=1, orders=RDPAccountant.DEFAULT_ALPHAS))


def epsilon(history: list[tuple[float, float, int]], delta: float) -> float:
    """ε(δ) of the steps in ``history``: opacus' ``RDPAccountant(history).get_epsilon(delta)``
    bit for bit (its sum of ``compute_rdp(q, z, steps)`` = curve x steps, then
    ``get_privacy_spent`` over ``DEFAULT_ALPHAS``), each curve from :func:`step_rdp`'s
    cache; 0.0 for none."""
    if not history:
        return 0.0
    alphas = RDPAccountant.DEFAULT_ALPHAS
    rdp = sum([np.array(step_rdp(float(z), float(q))) * int(k) for z, q, k in history])
    eps, _ = privacy_analysis.get_privacy_spent(orders=alphas, rdp=rdp, delta=delta)
    return float(eps)


def stored(history: list[tuple[float, float, int]]) -> dict[str, str]:
    return {"history": json.dumps([list(h) for h in history])}
