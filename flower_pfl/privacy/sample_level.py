"""Sample-level DP's accounting in the client: opacus' RDP accountant over every DP-SGD step
the client has run in this federation (its history kept in the client's state, so it grows
across rounds and survives a resume).  Per-client ε is reported in the fit metrics
(``dp_epsilon``); the server records the largest (``epsilon_max``)."""

from __future__ import annotations

import json
from typing import Any, Mapping

from opacus.accountants import RDPAccountant  # type: ignore[import-untyped]

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


def epsilon(history: list[tuple[float, float, int]], delta: float) -> float:
    """ε(δ) of the steps in ``history`` (opacus' RDPAccountant; 0.0 for none)."""
    if not history:
        return 0.0
    acc = RDPAccountant()
    acc.history = list(history)
    return float(acc.get_epsilon(delta))


def stored(history: list[tuple[float, float, int]]) -> dict[str, str]:
    return {"history": json.dumps([list(h) for h in history])}
