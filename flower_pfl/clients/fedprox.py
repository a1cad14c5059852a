"""FedProx and FedProx-FT clients -- Li et al., MLSys 2020, Algorithm 2.

Each round the client approximately minimises
    h_i(w; w^t) = F_i(w) + mu/2 ||w - w^t||^2
with the configured local SGD started from the global model w^t (``prox.Prox``: its
gradient mu (w - w^t) is added to the data loss's gradient before each step, bit for bit
autograd's for the squared term; tests/test_fedprox.py, tests/test_prox_fused.py).  The
paper's variable amount of work per device (gamma-inexact solutions, stragglers) is not
simulated: every client runs the configured epochs/steps.

FedProx-FT (FedAMP's baseline, after Wang et al. 2019): the same training, then before
personalized evaluation the global model is fine-tuned for ``finetune-steps`` SGD steps
on the client's training data -- exactly FedAvg-FT's evaluation path (inherited).
"""

from __future__ import annotations

from flower_pfl.algorithms.prox import Prox
from flower_pfl.catalog import baselines
from flower_pfl.catalog.baselines import FedProxFit
from flower_pfl.clients.base import MessageConfig
from flower_pfl.clients.fedavg import FedAvgClient, FedAvgFTClient
from flower_pfl.learning.models import NamedLayers
from flower_pfl.learning.training import params_of
from flower_pfl.registry import client_for


@client_for(baselines.FEDPROX)
class FedProxClient(FedAvgClient):
    def regularizer(self, model: NamedLayers, config: MessageConfig) -> Prox:
        center = params_of(model)  # w^t: training starts there; detached, it does not move
        mu = FedProxFit.from_config(config).mu
        return Prox(center, mu)


@client_for(baselines.FEDPROX_FT)
class FedProxFTClient(FedProxClient, FedAvgFTClient):
    """FedProx training (FedProxClient.fit_round) + FedAvg-FT's fine-tuned evaluation."""
