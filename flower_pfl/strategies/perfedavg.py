"""Per-FedAvg -- Fallah, Mokhtari & Ozdaglar, NeurIPS 2020, Algorithm 1 (server side).

The server averages the clients' meta-updated models (sample-weighted, as FedAvg) and
sends alpha (inner step), delta (HF finite difference) and the variant (fo | hf) with
the fit instructions, and alpha and the number of personalization steps with the
evaluation instructions: each client evaluates the global model after that many SGD
steps of size alpha on its training data (Per-FedAvg-P) and the global model itself
(Per-FedAvg-G).  alpha = 0 makes it FedAvg and is rejected.
"""

from __future__ import annotations

from typing import Mapping

from flwr.common import Scalar

from flower_pfl.catalog import baselines as catalog
from flower_pfl.catalog.baselines import PerFedAvgEval, PerFedAvgFit
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.fedavg import FedAvg


@strategy_for(catalog.PERFEDAVG)
class PerFedAvg(FedAvg):
    params: catalog.PerFedAvgParams

    def fit_config(self, pid: int, server_round: int) -> Mapping[str, Scalar]:
        hp = self.params
        return PerFedAvgFit(variant=hp.variant, alpha=hp.alpha, delta=hp.delta).to_config()

    def eval_config(self, pid: int, server_round: int) -> Mapping[str, Scalar]:
        return PerFedAvgEval(alpha=self.params.alpha,
                             personal_steps=self.params.personal_steps).to_config()
