"""The learning rate of a server round: ``train.lr-schedule`` over rounds (pure math).

The server round r (1-based, the number the server sends with every instruction) drives
the schedule, so a resumed or extended run gives round r the same learning rate as an
uninterrupted one.  Within a round the rate is constant (every local step of the round).
With lr = ``train.lr``:

* ``constant``     lr(r) = lr
* ``step``         lr(r) = lr * gamma ** floor((r - 1) / step_rounds)
* ``exponential``  lr(r) = lr * gamma ** (r - 1)
* ``cosine``       lr(r) = lr_min + (lr - lr_min) * (1 + cos(pi * min(r - 1, T) / T)) / 2,
  T = ``horizon`` rounds (``train.lr-horizon``; null: the run's ``rounds``): lr at round 1,
  lr_min from round T + 1 on (PyTorch's CosineAnnealingLR with T_max = T, stepped per round).
  An extended run keeps the same curve only with a fixed horizon (docs/training.md).

No torch, no Flower: tests/test_training_recipe.py checks it by hand.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

SCHEDULES = ("constant", "step", "cosine", "exponential")


def lr_at(server_round: int, lr: float, schedule: str = "constant", gamma: float = 0.1,
          step_rounds: int = 10, lr_min: float = 0.0, horizon: int = 1) -> float:
    """The learning rate of ``server_round`` (>= 1; 0, a message without a round, is taken
    as 1).  ``gamma`` in (0, 1] (step, exponential), ``step_rounds`` >= 1 (step),
    ``lr_min`` in [0, lr) and ``horizon`` >= 1 rounds (cosine).  Raises ValueError for an
    unknown schedule."""
    r = max(int(server_round), 1) - 1  # rounds completed before this one
    if schedule == "constant":
        return float(lr)
    if schedule == "step":
        return float(lr) * float(gamma) ** (r // int(step_rounds))
    if schedule == "exponential":
        return float(lr) * float(gamma) ** r
    if schedule == "cosine":
        span = max(int(horizon), 1)
        cos = math.cos(math.pi * min(r, span) / span)
        return float(lr_min) + (float(lr) - float(lr_min)) * (1 + cos) / 2
    raise ValueError(f"unknown lr schedule {schedule!r}: one of {list(SCHEDULES)}")


def lr_of_config(values: Mapping[str, Any], server_round: int) -> float:
    """:func:`lr_at` with the ``train.*`` values of a run configuration (dotted keys, e.g.
    ``RunConfig.values``); the cosine horizon is ``train.lr-horizon`` or ``rounds``."""
    horizon = values["train.lr-horizon"]
    return lr_at(server_round, values["train.lr"], values["train.lr-schedule"],
                 values["train.lr-gamma"], values["train.lr-step-rounds"],
                 values["train.lr-min"],
                 int(horizon) if horizon is not None else int(values["rounds"]))
