"""FedRep (Collins et al., ICML 2021) server, as PLGU Algorithm 3 lines 5 and 14 use it.

The server holds only the global body (representation) phi: every layer group of the model
but the head's (the last one of a built-in, a user model's declared head of one or more
layers: ``models.head_split``; each client keeps its head, clients/fedrep.py). Each round it sends
phi^t to the sampled clients and sets phi^{t+1} = (1/C) sum_i phi_i (Algorithm 3, line 14:
an unweighted mean of the uploaded bodies). There is no global model to evaluate: the
personalized model of client i is (h_i, phi^t), evaluated by every client.

Uploads are bodies, so ``upload_template`` points the base's upload check (array count,
shapes, dtypes) at the body's arrays instead of the whole model's.
"""

from __future__ import annotations

from logging import WARNING
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from flwr.common import Scalar
from flwr.common.logger import log

from flower_pfl.catalog import plgu as catalog
from flower_pfl.catalog.plgu import FedRepFit
from flower_pfl.config import RunConfig
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.base import PersonalizedStrategy
from flower_pfl.strategies.federation import ClientUpdate


@strategy_for(catalog.FEDREP)
class FedRep(PersonalizedStrategy):
    has_global_model = False
    params: catalog.FedRepParams
    #: the shared body and which model arrays it is (set by setup, not called on resume)
    checkpointed: tuple[str, ...] = ("body", "body_index")

    def __init__(self, cfg: RunConfig, initial_arrays: Sequence[np.ndarray] | None = None,
                 results_dir: str | Path | None = None) -> None:
        super().__init__(cfg, initial_arrays, results_dir)
        self.body_index: list[int] = []  # the model arrays of the body (setup)
        self.body: list[np.ndarray] = []  # the shared body, averaged each round

    def setup(self, initial_arrays: list[np.ndarray]) -> None:
        from flower_pfl.learning.models import head_split, model_for  # torch: here, not at import

        # model_for declares a Mapping; it reads a RunConfig by key and its .source
        self.body_index = head_split(model_for(self.cfg))[1]  # type: ignore[arg-type]  # RunConfig
        self.body = [np.array(initial_arrays[i], copy=True) for i in self.body_index]
        if not self.body_index:
            log(WARNING, "[flower-pfl] %s: model '%s' is all head (one layer group), so the "
                "shared body is empty and every client trains only its own head (= Local "
                "training)",
                self.cfg.strategy, self.cfg["model"])

    def upload_template(self) -> list[np.ndarray]:
        return self.body  # clients upload the body (checked by the base)

    def rho(self) -> float:
        return 0.0

    def reading(self) -> str:
        """Algorithm 1's reading of the body step: FedRep trains one model."""
        return "one-model"

    def fit_payload(self, pid: int, server_round: int
                    ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        hp = self.params
        return self.body, FedRepFit(head_epochs=hp.head_epochs, body_epochs=hp.body_epochs,
                                    rho=self.rho(), reading=self.reading()).to_config()

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> None:
        if not self.body:
            return
        self.body = [np.mean(np.stack([u.arrays[k] for u in updates]).astype(np.float64),
                             axis=0).astype(np.float32) for k in range(len(self.body))]

    def eval_payload(self, pid: int, server_round: int
                     ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        return self.body, {}
