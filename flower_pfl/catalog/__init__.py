"""One module per paper (or family of baselines), each with ``ENTRIES: list[Entry]``.

``flower_pfl.registry`` imports every module here; nothing here imports torch or Flower.
"""

from __future__ import annotations

from typing import Mapping

#: ``train.*`` keys that act only when another key leaves its default: Adam's and AdamW's
#: settings need ``train.optimizer`` adam/adamw, a schedule's parameters need a
#: ``train.lr-schedule`` that reads them (flower_pfl.config refuses them otherwise)
NEEDS = {"train.betas": "train.optimizer", "train.eps": "train.optimizer",
         "train.lr-gamma": "train.lr-schedule", "train.lr-step-rounds": "train.lr-schedule",
         "train.lr-min": "train.lr-schedule", "train.lr-horizon": "train.lr-schedule"}


def refusals(reasons: Mapping[str, str]) -> dict[str, str]:
    """An entry's ``refuses`` (train key -> the paper's reason): ``reasons`` plus every key of
    :data:`NEEDS` whose key it needs is refused, with that refusal's reason -- a method that
    refuses Adam refuses Adam's ``train.betas``, one that refuses schedules refuses
    ``train.lr-gamma``, so docs/training.md's table says "refused" where validation stops."""
    out = dict(reasons)
    for key, needed in NEEDS.items():
        if needed in reasons and key not in out:
            out[key] = f"acts only with another {needed}, which is refused here: {reasons[needed]}"
    return out
