"""FedAvg and FedAvg-FT clients.

FedAvg: start from the global model, run the configured local SGD, upload.  Its
personalized model IS the global model.  FedAvg-FT: same training; for personalized
evaluation the global model is first fine-tuned for ``finetune-steps`` mini-batch steps
on the client's local training data (not kept: the next round starts from the global
model again).
"""

from __future__ import annotations

from flwr.common import NDArrays

from flower_pfl.catalog import baselines
from flower_pfl.catalog.baselines import FineTuneEval
from flower_pfl.clients.base import MessageConfig, Metrics, PFLClient, Regularizer
from flower_pfl.learning.models import NamedLayers, get_arrays
from flower_pfl.registry import client_for


@client_for(baselines.FEDAVG)
class FedAvgClient(PFLClient):
    def regularizer(self, model: NamedLayers, config: MessageConfig) -> Regularizer:
        """Extra term of the local objective: a ``prox.Prox`` (FedProx) or a callable
        ``f(model) -> tensor`` added to the loss; None: the data loss alone."""
        return None

    def fit_round(self, parameters: NDArrays, config: MessageConfig
                  ) -> tuple[NDArrays, Metrics]:
        model = self.new_model(parameters)
        metrics = self.local_train(model, regularizer=self.regularizer(model, config))
        return get_arrays(model), metrics

    def personal_model(self, parameters: NDArrays, config: MessageConfig
                       ) -> NamedLayers:
        return self.new_model(parameters)


@client_for(baselines.FEDAVG_FT)
class FedAvgFTClient(FedAvgClient):
    def personal_model(self, parameters: NDArrays, config: MessageConfig
                       ) -> NamedLayers:
        model = self.new_model(parameters)
        self.local_train(model, num_steps=FineTuneEval.from_config(config).finetune_steps, salt=1)
        return model
