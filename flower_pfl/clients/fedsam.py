"""FedSAM client (Qu et al., "Generalized Federated Learning via Sharpness Aware
Minimization", ICML 2022; PLGU's [33]) and the LWSAM helpers the PLGU clients share.

FedSAM: start from the global model w^t, run the configured local steps with SAM
(:func:`flower_pfl.algorithms.lwsam.lwsam_step` with Lambda = I: eps = rho g/||g||, then the
gradient at w + eps), upload Delta = w^K - w^t. The personalized model IS the global model.
With BatchNorm the running statistics move once per step (the perturbed pass restores
them, :func:`flower_pfl.algorithms.plgu_math.perturbed_gradient`) and travel in Delta.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from flwr.common import NDArrays

from flower_pfl.algorithms.plgu_math import two_model_train
from flower_pfl.catalog import plgu
from flower_pfl.catalog.plgu import SAMFit
from flower_pfl.clients.base import MessageConfig, Metrics, PFLClient
from flower_pfl.learning.models import NamedLayers, get_arrays, layer_groups
from flower_pfl.learning.training import batches, make_optimizer, train_lwsam
from flower_pfl.registry import client_for


def layer_tensors(model: NamedLayers) -> list[list[torch.Tensor]]:
    """The trainable tensors of each layer group (order of ``layer_names()``)."""
    out: list[list[torch.Tensor]] = []
    for name in model.layer_names():
        try:
            out.append(list(model.get_submodule(name).parameters(recurse=False)))
        except AttributeError:  # a parameter registered on the model itself (ScalarModel)
            out.append([model.get_parameter(name)])
    return out


def per_layer(arrays: Sequence[np.ndarray], groups: list[tuple[str, list[int]]]
              ) -> list[list[np.ndarray]]:
    """Split a get_arrays() list into its layer groups."""
    return [[arrays[i] for i in idx] for _, idx in groups]


def parameter_groups(model: NamedLayers) -> list[tuple[str, list[int]]]:
    """:func:`flower_pfl.learning.models.layer_groups` restricted to the parameters: what
    eq. 6 / eq. 10 score ("the number of parameters on layer l"). BatchNorm running
    statistics travel with their layer but are not scored; for models without buffers
    this IS ``layer_groups``."""
    params = {name for name, _ in model.named_parameters()}
    keys = [k for k, v in model.state_dict().items() if v.is_floating_point()]
    return [(name, [i for i in idx if keys[i] in params]) for name, idx in layer_groups(model)]


class LWSAMClientMixin(PFLClient):
    """Runs :func:`flower_pfl.learning.training.train_lwsam` (one model) or
    :func:`flower_pfl.algorithms.plgu_math.two_model_train` (Algorithm 1's two models) on the
    client's data, with the same mini-batch schedule as
    :func:`flower_pfl.learning.training.train` (a PFLClient: it trains on ``self.data`` with
    ``self.spec``; listed before PFLClient in its users' bases)."""

    def lwsam_train(self, model: NamedLayers, perturbed: Sequence[torch.Tensor],
                    scales: Sequence[float], rho: float, plain: Sequence[torch.Tensor] = (),
                    num_steps: int | None = None, salt: int = 0) -> dict[str, float]:
        return train_lwsam(model, self.data.x_train, self.data.y_train, self.spec,
                           self.generator(salt), self.device, perturbed, scales, rho, plain,
                           num_steps=num_steps, loss_fn=self.loss_fn())

    def two_model_train(self, theta_model: NamedLayers,
                        theta: Sequence[torch.Tensor], w: Sequence[torch.Tensor],
                        scales: Sequence[float], rho: float, num_steps: int | None = None,
                        salt: int = 0, w_model: NamedLayers | None = None
                        ) -> dict[str, float]:
        x, y = self.data.x_train, self.data.y_train
        steps = num_steps if num_steps is not None else self.spec.num_steps(len(y))
        order = batches(len(y), self.spec.batch_size, steps, self.generator(salt),
                        self.spec.drop_last)
        data = ((x[idx].to(self.device), y[idx].to(self.device)) for idx in order)
        return two_model_train(theta_model, theta, w, data, scales, rho, self.spec.lr,
                               self.spec.momentum, self.spec.weight_decay, self.loss_fn(),
                               w_model=w_model,
                               make_opt=lambda ts: make_optimizer(ts, self.spec))

    def groups(self, model: NamedLayers) -> list[tuple[str, list[int]]]:
        return layer_groups(model)


def deltas(trained: Sequence[np.ndarray], start: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(a, dtype=np.float32) - np.asarray(b, dtype=np.float32)
            for a, b in zip(trained, start)]


@client_for(plgu.FEDSAM)
class FedSAMClient(LWSAMClientMixin, PFLClient):
    def fit_round(self, parameters: NDArrays, config: MessageConfig
                  ) -> tuple[NDArrays, Metrics]:
        model = self.new_model(parameters)
        tensors = [p for layer in layer_tensors(model) for p in layer]
        rho = SAMFit.from_config(config).rho
        metrics = self.lwsam_train(model, tensors, [1.0] * len(tensors), rho)
        return deltas(get_arrays(model), parameters), metrics

    def personal_model(self, parameters: NDArrays, config: MessageConfig
                       ) -> NamedLayers:
        return self.new_model(parameters)
