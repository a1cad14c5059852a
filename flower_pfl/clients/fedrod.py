"""FedRoD client -- Chen & Chao, "On Bridging Generic and Personalized Federated Learning for
Image Classification", ICLR 2022, section 4 (client side).

The model is split as FedRep's (``head_split``: its last layer group(s) are the head, the
rest the body).  The body and the head the server sends are the GENERIC model (shared,
uploaded); the client keeps a PERSONAL head phi_i of the same shape in ``context.state``.
Each local step, on one mini-batch (the run's ``train.*`` loop, one optimizer over both):

* z^G = the generic model's logits: the balanced-softmax loss CE(z^G + log n, y) with the
  client's label counts n_c trains the body and the generic head;
* z^P = the personal head on the body's features, the body detached (a functional call of
  the model with phi_i in the head's place): CE(stopgrad(z^G) + z^P, y) trains phi_i alone
  (:mod:`flower_pfl.algorithms.fedrod_math`).

Upload: body + generic head.  The personalized model's logits are z^G + z^P.  phi_i starts
as the received head with its output layer (last group) zeroed: z^P = 0, so a client that
never trained evaluates the generic model (its newcomer rule).  Open choices (the paper
trains the heads with separate optimizers at one rate): one optimizer, the run's.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from flwr.common import NDArrays
from torch import nn

from flower_pfl.algorithms.fedrod_math import two_head_loss
from flower_pfl.catalog import fedrod
from flower_pfl.clients.base import LossFn, MessageConfig, Metrics, PFLClient
from flower_pfl.learning.models import NamedLayers, get_arrays, head_split, layer_groups
from flower_pfl.registry import client_for

#: context.state key of the personal head phi_i
HEAD = "rod-head"


class TwoHeads(NamedLayers):
    """The generic model and a personal head over the same body.  ``forward`` gives
    ``[z^G | z^P]`` (B x 2C, ``joined`` False: training) or ``z^G + z^P`` (B x C: the
    personalized model); ``personal`` holds phi_i's arrays in ``head_split`` order."""

    def __init__(self, generic: NamedLayers, personal: Sequence[np.ndarray],
                 joined: bool) -> None:
        super().__init__()
        self.generic, self.joined = generic, joined
        names = [k for k, v in generic.state_dict().items() if v.is_floating_point()]
        self.head_names = [names[i] for i in head_split(generic)[0]]
        trained = dict(generic.named_parameters())
        device = next(generic.parameters()).device
        self.personal = nn.ParameterList(
            nn.Parameter(torch.as_tensor(np.asarray(a), dtype=torch.float32, device=device),
                         requires_grad=name in trained)
            for name, a in zip(self.head_names, personal))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        generic = self.generic(x)
        head = set(self.head_names)
        fixed = {n: p.detach() for n, p in self.generic.named_parameters() if n not in head}
        # the body's buffers as copies: the personal pass leaves its running statistics
        fixed.update({n: b.clone() for n, b in self.generic.named_buffers() if n not in head})
        fixed.update(zip(self.head_names, self.personal))
        personal = torch.func.functional_call(self.generic, fixed, (x,))
        return generic + personal if self.joined else torch.cat([generic, personal], 1)

    def personal_arrays(self) -> list[np.ndarray]:
        return [p.detach().cpu().numpy().copy() for p in self.personal]


def start_head(model: NamedLayers) -> list[np.ndarray]:
    """phi_i's start: ``model``'s head with its output layer (the last group) zeroed."""
    arrays = get_arrays(model)
    head = head_split(model)[0]
    last = set(layer_groups(model)[-1][1])
    return [np.zeros_like(arrays[i]) if i in last else arrays[i] for i in head]


@client_for(fedrod.FEDROD)
class FedRoDClient(PFLClient):
    def heads(self, parameters: NDArrays, joined: bool) -> TwoHeads:
        """(the received generic model, phi_i from context.state or its start)."""
        generic = self.new_model(parameters)
        phi = self.state.get_arrays(HEAD)
        return TwoHeads(generic, start_head(generic) if phi is None else phi, joined)

    def loss_fn(self) -> LossFn:
        """L_BSM + L_P on ``[z^G | z^P]`` with this client's label counts."""
        return two_head_loss(self.data.y_train)

    def fit_round(self, parameters: NDArrays, config: MessageConfig
                  ) -> tuple[NDArrays, Metrics]:
        model = self.heads(parameters, joined=False)
        metrics = self.local_train(model)
        self.state.set_arrays(HEAD, model.personal_arrays())
        return get_arrays(model.generic), metrics

    def personal_model(self, parameters: NDArrays, config: MessageConfig) -> NamedLayers:
        return self.heads(parameters, joined=True)

    def newcomer_start(self, parameters: NDArrays, config: MessageConfig) -> NamedLayers:
        """A held-out newcomer's model: the generic model, its personal head at its start
        (adding nothing)."""
        generic = self.new_model(parameters)
        return TwoHeads(generic, start_head(generic), joined=True)

    def adapt_newcomer(self, model: NamedLayers, config: MessageConfig, steps: int
                       ) -> NamedLayers:
        """FedRoD's newcomer rule is the generic model as it is: no local step."""
        return model

    def evaluated_model(self, parameters: NDArrays, model: NamedLayers) -> str:
        return ("the generic model the server sent (its personal head at its start adds "
                "nothing), not a personalized one")

