"""FedProx (Li et al., MLSys 2020, Algorithm 2) and FedProx-FT.

Server: as FedAvg (the sample-weighted mean of the returned models; the paper averages
uniformly over devices sampled proportionally to n_i -- with our uniform sampling the
weighted mean is the matching estimator).  It sends mu with every fit instruction; the
client adds mu/2 ||w - w^t||^2 to its local loss (clients/fedprox.py).
mu = 0 is FedAvg and is rejected by the registry (mu must be > 0).

FedProx-FT: FedProx training; before personalized evaluation each client fine-tunes
the global model for ``finetune-steps`` SGD steps (FedAvg-FT's evaluation, shared).
"""

from __future__ import annotations

from typing import Mapping

from flwr.common import Scalar

from flower_pfl.catalog import baselines as catalog
from flower_pfl.catalog.baselines import FedProxFit
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.fedavg import FedAvg, FedAvgFT


@strategy_for(catalog.FEDPROX)
class FedProx(FedAvg):
    params: catalog.FedProxParams

    def fit_config(self, pid: int, server_round: int) -> Mapping[str, Scalar]:
        return FedProxFit(mu=self.params.mu).to_config()


@strategy_for(catalog.FEDPROX_FT)
class FedProxFT(FedProx, FedAvgFT):
    """FedProx.fit_payload (mu) + FedAvgFT.eval_payload (finetune-steps)."""

    params: catalog.FedProxFTParams
