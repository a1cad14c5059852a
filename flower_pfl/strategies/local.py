"""Separate / Local training: each client trains only its own model; nothing is exchanged.

The baseline every pFL paper compares against (FedAMP's "Separate").  The server only
schedules rounds and collects evaluations; no weights travel in either direction.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
from flwr.common import Scalar

from flower_pfl.catalog import baselines as catalog
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.base import PersonalizedStrategy


@strategy_for(catalog.LOCAL)
class Local(PersonalizedStrategy):
    has_global_model = False
    uploads_model = False  # nothing is uploaded, so there is no model to check

    def fit_payload(self, pid: int, server_round: int
                    ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        return [], {}

    def eval_payload(self, pid: int, server_round: int
                     ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        return [], {}
