"""FedRep client (Collins et al., "Exploiting Shared Representations for Personalized
Federated Learning", ICML 2021), as PLGU section 5.1 / Algorithm 3 lines 7-12 describe it.

The model is theta_i = h_i o phi: the head h_i is the model's LAST ``head_count(model)``
layer groups (flower_pfl/learning/layers.py: the built-ins' last layer, ``fc`` / ``fc2`` /
``net.fc``; a user model's declared head, one layer or several, ordered last), kept in
``context.state`` with its float buffers (a BatchNorm's running statistics in the head stay
personal, the body's travel with the body); the body (representation) phi is every other
layer and is shared.  One round:

1. receive the global body phi^t; assemble (h_i, phi^t)  (a new client: the initial head);
2. train the head for ``head-epochs`` passes with the body frozen (eq. 9, plain SGD);
3. train the body for ``body-epochs`` passes with the head frozen -- plain SGD for FedRep,
   the LWSAM step of eqs. 10-13 for PLGU-GRep (``rho`` > 0, clients/plgu.py);
4. keep h_i, upload the body phi_i.

The personalized model is (h_i, current global body). With a one-layer model (mclr) the
body is empty: FedRep then IS local training of the head (the strategy warns).

A held-out newcomer (docs/newcomers.md) starts from (initial head, global body) and trains
the head alone for the budget's steps, the body frozen (FedRep's new-client experiment).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from flwr.common import NDArrays

from flower_pfl.catalog import plgu
from flower_pfl.catalog.plgu import FedRepFit
from flower_pfl.clients.base import NEWCOMER_SALT, MessageConfig, Metrics, PFLClient
from flower_pfl.clients.fedsam import LWSAMClientMixin, layer_tensors
from flower_pfl.learning.models import NamedLayers, get_arrays, head_count, head_split
from flower_pfl.registry import client_for


@client_for(plgu.FEDREP)
class FedRepClient(LWSAMClientMixin, PFLClient):
    def split(self, model: NamedLayers) -> tuple[list[int], list[int]]:
        """(indices of head arrays, indices of body arrays) in get_arrays order
        (:func:`~flower_pfl.learning.models.head_split`)."""
        return head_split(model)

    def assemble(self, body_arrays: Sequence[np.ndarray]) -> NamedLayers:
        """The model (h_i, phi): the stored head (or the initial one) and the given body."""
        model = self.new_model()
        arrays = get_arrays(model)
        head, body = self.split(model)
        stored = self.state.get_arrays("head")
        if stored is not None:
            for i, a in zip(head, stored):
                arrays[i] = a
        for i, a in zip(body, body_arrays):
            arrays[i] = a
        return self.new_model(arrays)

    def body_scales(self, received_body: NDArrays,
                    body_layers: Sequence[Sequence[torch.Tensor]]) -> list[float]:
        """Lambda per body layer: FedRep perturbs nothing (rho = 0), so any value works."""
        return [1.0] * len(body_layers)

    def train_body(self, model: NamedLayers, body_layers: Sequence[Sequence[torch.Tensor]],
                   scales: Sequence[float], rho: float, num_steps: int, config: MessageConfig
                   ) -> tuple[dict[str, float], list[np.ndarray]]:
        """Step 3: the body with the head frozen (LWSAM when rho > 0, plain SGD at rho = 0);
        returns (metrics, the body arrays to upload)."""
        perturbed = [p for layer in body_layers for p in layer]
        per_tensor = [s for layer, s in zip(body_layers, scales) for _ in layer]
        metrics = self.lwsam_train(model, perturbed, per_tensor, rho, num_steps=num_steps,
                                   salt=1)
        arrays = get_arrays(model)
        return metrics, [arrays[i] for i in self.split(model)[1]]

    def fit_round(self, parameters: NDArrays, config: MessageConfig
                  ) -> tuple[NDArrays, Metrics]:
        model = self.assemble(parameters)
        layers, heads = layer_tensors(model), head_count(model)
        head_t = [p for layer in layers[-heads:] for p in layer]
        body_layers = layers[:-heads]
        # one "epoch" = one pass over the local data (or train.steps mini-batches if set)
        n_batches = self.spec.steps or self.spec.steps_per_pass(self.data.num_train)
        sent = FedRepFit.from_config(config)
        m_head = self.lwsam_train(model, [], [], 0.0, plain=head_t,
                                  num_steps=sent.head_epochs * n_batches, salt=0)
        scales = self.body_scales(parameters, body_layers)
        m_body, body_arrays = self.train_body(
            model, body_layers, scales, sent.rho, sent.body_epochs * n_batches, config)
        arrays = get_arrays(model)
        head, body = self.split(model)
        self.state.set_arrays("head", [arrays[i] for i in head])
        self.state.set_arrays("body", body_arrays)  # phi_i: eq. 10 needs it next round
        metrics = {"train_loss": m_body["train_loss"] if body else m_head["train_loss"],
                   "head_loss": m_head["train_loss"], "head_steps": m_head["local_steps"],
                   "body_steps": m_body["local_steps"]}
        return [np.asarray(a) for a in body_arrays], {k: float(v) for k, v in metrics.items()
                                                      if np.isfinite(v)}

    def personal_model(self, parameters: NDArrays, config: MessageConfig
                       ) -> NamedLayers:
        return self.assemble(parameters)

    def newcomer_start(self, parameters: NDArrays, config: MessageConfig) -> NamedLayers:
        """(the initial head, the global body phi sent): what the server gives a newcomer."""
        return self.assemble(parameters)

    def adapt_newcomer(self, model: NamedLayers, config: MessageConfig, steps: int
                       ) -> NamedLayers:
        """The head h trained for ``steps`` plain SGD steps on the frozen body (eq. 9)."""
        head_t = [p for layer in layer_tensors(model)[-head_count(model):] for p in layer]
        out = self.lwsam_train(model, [], [], 0.0, plain=head_t, num_steps=steps,
                               salt=NEWCOMER_SALT)
        self.eval_steps += int(out.get("local_steps", 0))
        return model
