"""Separate / Local client: trains its own model from the shared initialisation, alone.

The model lives in ``context.state`` between rounds; nothing is uploaded.
"""

from __future__ import annotations

from flwr.common import NDArrays

from flower_pfl.catalog import baselines
from flower_pfl.clients.base import MessageConfig, Metrics, PersonalStateClient
from flower_pfl.registry import client_for


@client_for(baselines.LOCAL)
class LocalClient(PersonalStateClient):
    def fit_round(self, parameters: NDArrays, config: MessageConfig
                  ) -> tuple[NDArrays, Metrics]:
        model = self.load_personal() or self.new_model()
        metrics = self.local_train(model)
        self.save_personal(model)
        return [], metrics
