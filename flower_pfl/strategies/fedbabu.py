"""FedBABU (Oh, Kim & Yun, ICLR 2022) server.

Algorithm 1: the server initialises the model once, the head (classifier) at random, and
sends it with every round's body; clients train only the body (clients/fedbabu.py) and the
server averages the bodies, body <- sum_k (n_k / n) body_k (FedAvg's weighted mean). The
head stays the initial head's bytes for the whole run: the server keeps its own copy and
never averages the heads it receives (they are the sent head, untouched). Personalization
happens at evaluation: every client fine-tunes the global model for ``finetune-epochs``
epochs (tau) before it is evaluated (``FedBABUEval``); the global model (without
fine-tuning) is evaluated beside it.

Open in the paper, chosen here: the head is the model's head (``learning.layers.head_split``:
the built-ins' last layer, a user model's declared head); the fine-tuning updates the whole
model (the paper's default; it also reports head-only fine-tuning) with the run's local
optimizer settings. A model that is all head (mclr) has no body to train: federated training
changes nothing and FedBABU is fine-tuning of the initial model (WARNING).
"""

from __future__ import annotations

from logging import WARNING
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from flwr.common import Scalar
from flwr.common.logger import log

from flower_pfl.algorithms.fedavg_math import weighted_average
from flower_pfl.catalog import fedbabu as catalog
from flower_pfl.catalog.fedbabu import FedBABUEval
from flower_pfl.config import RunConfig
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.fedavg import FedAvg
from flower_pfl.strategies.federation import ClientUpdate


@strategy_for(catalog.FEDBABU)
class FedBABU(FedAvg):
    """The body's sample-weighted mean; the head kept at its initial bytes."""

    params: catalog.FedBABUParams
    checkpointed: tuple[str, ...] = ("body_index",)

    def __init__(self, cfg: RunConfig, initial_arrays: Sequence[np.ndarray] | None = None,
                 results_dir: str | Path | None = None) -> None:
        super().__init__(cfg, initial_arrays, results_dir)
        self.body_index: list[int] = []  # the model arrays of the body (setup)

    def setup(self, initial_arrays: list[np.ndarray]) -> None:
        from flower_pfl.learning.models import head_split, model_for  # torch: here only

        # model_for declares a Mapping; it reads a RunConfig by key and its .source
        self.body_index = head_split(model_for(self.cfg))[1]  # type: ignore[arg-type]
        if not self.body_index:
            log(WARNING, "[flower-pfl] %s: model '%s' is all head, which FedBABU freezes: "
                "federated training changes nothing and every client evaluates the initial "
                "model fine-tuned on its data", self.cfg.strategy, self.cfg["model"])

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> None:
        assert self.global_arrays is not None, "initialize_parameters sets the global model"
        if not self.body_index:
            return
        body = weighted_average([[u.arrays[i] for i in self.body_index] for u in updates],
                                [u.num_examples for u in updates])
        arrays = list(self.global_arrays)  # the head: the server's own, initial bytes
        for i, a in zip(self.body_index, body):
            arrays[i] = a
        self.global_arrays = arrays

    def eval_config(self, pid: int, server_round: int) -> Mapping[str, Scalar]:
        return FedBABUEval(finetune_epochs=self.params.finetune_epochs).to_config()
