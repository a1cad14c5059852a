"""IFCA client -- Ghosh, Chung, Yin & Ramchandran, NeurIPS 2020, Algorithm 2 (client side).

The download holds the k cluster models one after the other (``IFCAInstruction``: k).  A fit:

1. line 5: the loss of every cluster model on the client's whole training split; the
   client's cluster j is the lowest (a tie: the lowest index, ``ifca_math.choose_cluster``);
2. lines 8-10: the configured local SGD from theta_j (the shared loop: sample-level DP's
   loop too, though IFCA's contract refuses it for the unnoised index);
3. upload theta~_i with j (``IFCAReply``).

The personalized model is the cluster model the same estimation picks at evaluation (the
paper's test-time rule): nothing is kept between rounds, so a client that never trained is
personalized exactly as one that did (its newcomer rule).
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.common import NDArrays

from flower_pfl.algorithms.ifca_math import choose_cluster
from flower_pfl.catalog import ifca
from flower_pfl.catalog.ifca import IFCAInstruction, IFCAReply
from flower_pfl.clients.base import MessageConfig, Metrics, PFLClient
from flower_pfl.learning.models import NamedLayers, get_arrays
from flower_pfl.learning.training import evaluate
from flower_pfl.registry import client_for


@client_for(ifca.IFCA)
class IFCAClient(PFLClient):
    chosen: tuple[int, int] | None = None  # (cluster, k) of the last estimation

    def clusters(self, parameters: NDArrays, config: MessageConfig) -> list[list[np.ndarray]]:
        """The k models of the download; ValueError when it does not hold k whole models."""
        k = IFCAInstruction.from_config(config).clusters
        size = len(get_arrays(self.new_model()))
        if k < 1 or len(parameters) != k * size:
            raise ValueError(f"IFCA: the download holds {len(parameters)} arrays, not {k} "
                             f"models of {size} arrays")
        return [list(parameters[j * size:(j + 1) * size]) for j in range(k)]

    def train_loss(self, model: NamedLayers) -> float:
        """F(theta; Z_i): the model's mean loss on the client's whole training split."""
        if self.data.task == "classification":
            return evaluate(model, self.data.x_train, self.data.y_train, self.device)[0]
        with torch.no_grad():
            return float(self.loss_fn()(model(self.data.x_train), self.data.y_train))

    def estimate(self, models: list[list[np.ndarray]]) -> int:
        """Alg. 2 line 5: the index of the cluster model of lowest training loss."""
        j = choose_cluster([self.train_loss(self.new_model(m)) for m in models])
        self.chosen = (j, len(models))
        return j

    def fit_round(self, parameters: NDArrays, config: MessageConfig
                  ) -> tuple[NDArrays, Metrics]:
        models = self.clusters(parameters, config)
        model = self.new_model(models[self.estimate(models)])
        metrics = self.local_train(model)
        assert self.chosen is not None  # estimate set it
        return get_arrays(model), {**metrics,
                                   **IFCAReply(cluster=self.chosen[0]).to_config()}

    def personal_model(self, parameters: NDArrays, config: MessageConfig) -> NamedLayers:
        models = self.clusters(parameters, config)
        return self.new_model(models[self.estimate(models)])

    def newcomer_start(self, parameters: NDArrays, config: MessageConfig) -> NamedLayers:
        """A held-out newcomer's model: the cluster model it estimates (line 5)."""
        return self.personal_model(parameters, config)

    def adapt_newcomer(self, model: NamedLayers, config: MessageConfig, steps: int
                       ) -> NamedLayers:
        """IFCA's newcomer rule is the estimation alone: no local step."""
        return model

    def evaluated_model(self, parameters: NDArrays, model: NamedLayers) -> str:
        if self.chosen is None:
            return super().evaluated_model(parameters, model)
        j, k = self.chosen
        return (f"cluster model {j} of the {k} the server sent (lowest loss on its training "
                f"data), not trained by it")
