"""FedPer client (Arivazhagan et al. 2019, Algorithm 1, client side), and
:class:`PersonalPartClient`, the client of every method whose model is split into a part it
keeps and a part the federation shares (FedPer: keeps the head; LG-FedAvg,
clients/lgfedavg.py: the body; FedBN, clients/fedbn.py: the BatchNorm layers).

One round: receive the shared part; assemble (shared part, the kept part from
``context.state`` -- a client that never trained: the kept part at its initial values);
train the WHOLE model jointly with the run's local SGD (``local_train``: e epochs of the
data loss over base and personal layers together, FedPer's "W_B,j, W_P,j <- SGD"); keep
the personal part, upload the shared part. Its personalized model is (the current shared
part, its kept part). A held-out newcomer (docs/newcomers.md) starts from (the shared part,
the kept part at its initial values) and trains both jointly for the budget's steps.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from flwr.common import NDArrays

from flower_pfl.catalog import fedper
from flower_pfl.clients.base import MessageConfig, Metrics, PFLClient
from flower_pfl.learning.models import NamedLayers, get_arrays, head_split
from flower_pfl.registry import client_for


class PersonalPartClient(PFLClient):
    """Keeps ``personal_indices(model)`` of the model's arrays in ``context.state`` (under
    ``part``) and trades every other array with the server."""

    #: the context.state key of the kept arrays
    part = "personal"

    def personal_indices(self, model: NamedLayers) -> list[int]:
        """Indices into ``get_arrays(model)`` this client keeps (its strategy's rule)."""
        raise NotImplementedError

    def assemble(self, shared: Sequence[np.ndarray]) -> NamedLayers:
        """The model with ``shared`` at the shared indices and the kept part (or, before
        the first accepted fit, the initial values) at the personal ones."""
        model = self.new_model()
        arrays = get_arrays(model)
        personal = self.personal_indices(model)
        kept = set(personal)
        for i, a in zip([i for i in range(len(arrays)) if i not in kept], shared):
            arrays[i] = a
        for i, a in zip(personal, self.state.get_arrays(self.part) or []):
            arrays[i] = a
        return self.new_model(arrays)

    def fit_round(self, parameters: NDArrays, config: MessageConfig
                  ) -> tuple[NDArrays, Metrics]:
        model = self.assemble(parameters)
        metrics = self.local_train(model)  # both parts, jointly
        arrays = get_arrays(model)
        personal = self.personal_indices(model)
        self.state.set_arrays(self.part, [arrays[i] for i in personal])
        kept = set(personal)
        return [a for i, a in enumerate(arrays) if i not in kept], metrics

    def personal_model(self, parameters: NDArrays, config: MessageConfig) -> NamedLayers:
        return self.assemble(parameters)

    def newcomer_start(self, parameters: NDArrays, config: MessageConfig) -> NamedLayers:
        """(the shared part sent, the kept part at its initial values): a held-out
        newcomer's model before it adapts (the base's ``adapt_newcomer`` then trains it
        whole for the budget, as this method's local update does)."""
        return self.assemble(parameters)


@client_for(fedper.FEDPER)
class FedPerClient(PersonalPartClient):
    """Keeps the head (the personal layers W_P,j); uploads the base W_B,j."""

    part = "head"

    def personal_indices(self, model: NamedLayers) -> list[int]:
        return head_split(model)[0]
