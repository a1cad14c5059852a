"""FedFomo client -- Zhang, Sapra, Fidler, Yeung & Alvarez, ICLR 2021, Algorithm 1 (client
side).

The client keeps its own latest model theta_i (``context.state``; the initial model before
its first fit) and a validation split: ``val-fraction`` of its training split, drawn once
per (seed, client) and fixed.  A fit, with the M peer models of the download:

1. L(theta) = the mean loss on the validation split, for theta_i and every peer;
2. the first-order weights and update (:mod:`flower_pfl.algorithms.fedfomo_math`):
   w_j = max(0, (L(theta_i) - L(theta_j)) / ||theta_j - theta_i||), normalised (all 0: no
   move), theta_i + sum_j w_j (theta_j - theta_i);
3. the run's local training from there on the rest of its training split;
4. keep and upload the result, with the weights (``FedFomoReply``).

The personalized model is theta_i; a client that never trained evaluates the first-order
update of the initial model by the peers the server sends it at evaluation.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from flwr.common import NDArrays

from flower_pfl.algorithms.fedfomo_math import distance, fomo_update, fomo_weights
from flower_pfl.catalog import fedfomo
from flower_pfl.catalog.fedfomo import FedFomoFit, FedFomoReply
from flower_pfl.clients.base import MessageConfig, Metrics, PFLClient
from flower_pfl.learning.models import NamedLayers, get_arrays
from flower_pfl.registry import client_for

#: context.state key of the client's own model theta_i
OWN = "fomo-own"


@client_for(fedfomo.FEDFOMO)
class FedFomoClient(PFLClient):
    def val_split(self, fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(training indices, validation indices) of the training split: ``fraction`` of
        it (at least 1, leaving at least 1) held out, the same every round."""
        n = self.data.num_train
        g = torch.Generator()
        g.manual_seed(hash((self.cfg["seed"], self.pid, -1)) & 0x7FFFFFFF)
        perm = torch.randperm(n, generator=g)
        held = min(n - 1, max(1, round(fraction * n)))
        return perm[held:], perm[:held]

    def val_loss(self, arrays: list[np.ndarray], val: torch.Tensor) -> float:
        model = self.new_model(arrays).eval()
        with torch.no_grad():
            return float(self.loss_fn()(model(self.data.x_train[val].to(self.device)),
                                        self.data.y_train[val].to(self.device)))

    def first_order(self, own: list[np.ndarray], parameters: NDArrays, config: MessageConfig
                    ) -> tuple[list[np.ndarray], np.ndarray]:
        """(theta_i moved by the peers of the download, the peers' weights)."""
        sent = FedFomoFit.from_config(config)
        count = len([p for p in sent.peer_ids.split(",") if p])
        size = len(own)
        if len(parameters) != count * size:
            raise ValueError(f"FedFomo: the download holds {len(parameters)} arrays, not "
                             f"{count} models of {size}")
        peers = [list(parameters[j * size:(j + 1) * size]) for j in range(count)]
        if not peers:
            return own, np.zeros(0)
        val = self.val_split(sent.val_fraction)[1]
        weights = fomo_weights(self.val_loss(own, val), [self.val_loss(p, val) for p in peers],
                               [distance(p, own) for p in peers])
        return fomo_update(own, peers, weights), weights

    def own(self) -> list[np.ndarray]:
        stored = self.state.get_arrays(OWN)
        return stored if stored is not None else get_arrays(self.new_model())

    def fit_round(self, parameters: NDArrays, config: MessageConfig
                  ) -> tuple[NDArrays, Metrics]:
        start, weights = self.first_order(self.own(), parameters, config)
        model = self.new_model(start)
        train_idx = self.val_split(FedFomoFit.from_config(config).val_fraction)[0]
        full = self.data
        self.data = dataclasses.replace(full, x_train=full.x_train[train_idx],
                                        y_train=full.y_train[train_idx])
        try:
            metrics = self.local_train(model)
        finally:
            self.data = full
        arrays = get_arrays(model)
        self.state.set_arrays(OWN, arrays)
        reply = FedFomoReply(peer_weights=",".join(f"{w:.9g}" for w in weights))
        return arrays, {**metrics, **reply.to_config()}

    def personal_model(self, parameters: NDArrays, config: MessageConfig) -> NamedLayers:
        stored = self.state.get_arrays(OWN)
        if stored is not None:
            return self.new_model(stored)
        return self.newcomer_start(parameters, config)

    def newcomer_start(self, parameters: NDArrays, config: MessageConfig) -> NamedLayers:
        """A client without a model of its own: the first-order update of the initial model
        by the peers sent (the initial model when none was)."""
        if not parameters:
            return self.new_model()
        return self.new_model(self.first_order(get_arrays(self.new_model()), parameters,
                                               config)[0])

    def adapt_newcomer(self, model: NamedLayers, config: MessageConfig, steps: int
                       ) -> NamedLayers:
        """FedFomo's newcomer rule is the first-order update alone: no local step."""
        return model
