"""FedPer (Arivazhagan et al. 2019) server, and :class:`SharedPart`, the server of every
method whose model is split into a part each client keeps and a part the federation shares
(FedPer: the head kept; LG-FedAvg, strategies/lgfedavg.py: the body kept; FedBN,
strategies/fedbn.py: the BatchNorm layers kept).

FedPer's server (Algorithm 1, server side): each round it sends the base layers W_B to the
sampled clients and sets W_B <- sum_j (n_j / n) W_B,j over the bases they upload (FedAvg's
weighted mean, ``algorithms.fedavg_math.weighted_average``); the personal layers W_P,j
never reach it (clients/fedper.py). There is no global model to evaluate: client j's
personalized model is (W_B, W_P,j).

Open in the paper, chosen here: the personal layers are the model's head
(``learning.layers.head_split``: the built-ins' last layer, a user model's declared head);
an array outside every layer group (a module with buffers but no parameters) is shared.
A model that is all head (mclr) shares nothing: FedPer is then Local training (WARNING).
"""

from __future__ import annotations

from logging import WARNING
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from flwr.common import Scalar
from flwr.common.logger import log

from flower_pfl.algorithms.fedavg_math import weighted_average
from flower_pfl.catalog import fedper as catalog
from flower_pfl.config import RunConfig
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.base import PersonalizedStrategy
from flower_pfl.strategies.federation import ClientUpdate


class SharedPart(PersonalizedStrategy):
    """The server holds only the shared arrays (``shared``, at ``shared_index`` of the
    model's ``get_arrays``), sends them for fit and evaluation and replaces them by the
    sample-weighted mean of the uploads; each subclass says which arrays its clients keep
    (``personal_indices``, the same rule as its client's)."""

    has_global_model = False
    #: the shared arrays and where they sit in the model (set by setup, not on resume)
    checkpointed: tuple[str, ...] = ("shared", "shared_index")
    #: what the clients keep, in words (the warnings)
    personal_part = "personal layers"

    def __init__(self, cfg: RunConfig, initial_arrays: Sequence[np.ndarray] | None = None,
                 results_dir: str | Path | None = None) -> None:
        super().__init__(cfg, initial_arrays, results_dir)
        self.shared_index: list[int] = []  # the model arrays that are shared (setup)
        self.shared: list[np.ndarray] = []  # their global value, averaged each round

    def personal_indices(self, model: Any) -> list[int]:
        """Indices into ``get_arrays(model)`` its clients keep (a torch model: call only
        from ``setup``)."""
        raise NotImplementedError

    def setup(self, initial_arrays: list[np.ndarray]) -> None:
        from flower_pfl.learning.models import model_for  # torch: here, not at import

        # model_for declares a Mapping; it reads a RunConfig by key and its .source
        personal = set(self.personal_indices(model_for(self.cfg)))  # type: ignore[arg-type]
        self.shared_index = [i for i in range(len(initial_arrays)) if i not in personal]
        self.shared = [np.array(initial_arrays[i], copy=True) for i in self.shared_index]
        what = ("shares nothing: every client trains its own model alone (= Local training)"
                if not self.shared_index else
                f"has no {self.personal_part}: every array is shared (= FedAvg)"
                if not personal else "")
        if what:
            log(WARNING, "[flower-pfl] %s: model '%s' %s", self.cfg.strategy,
                self.cfg["model"], what)

    def upload_template(self) -> list[np.ndarray]:
        return self.shared  # clients upload the shared part (checked by the base)

    def fit_payload(self, pid: int, server_round: int
                    ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        return self.shared, self.fit_config(pid, server_round)

    def eval_payload(self, pid: int, server_round: int
                     ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        return self.shared, self.eval_config(pid, server_round)

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> None:
        if self.shared:
            self.shared = weighted_average([u.arrays for u in updates],
                                           [u.num_examples for u in updates])


@strategy_for(catalog.FEDPER)
class FedPer(SharedPart):
    """The base averaged; the head (personal layers) never leaves a client."""

    def personal_indices(self, model: Any) -> list[int]:
        from flower_pfl.learning.models import head_split

        return head_split(model)[0]
