"""Per-FedAvg -- Fallah, Mokhtari & Ozdaglar, NeurIPS 2020, Algorithm 1 (server side).

The server averages the clients' meta-updated models (sample-weighted, as FedAvg) and
sends alpha (inner step), delta (HF finite difference) and the variant (fo | hf) with
the fit instructions, and alpha and the number of personalization steps with the
evaluation instructions: each client evaluates the global model after that many SGD
steps of size alpha on its training data (Per-FedAvg-P) and the global model itself
(Per-FedAvg-G).  alpha = 0 makes it FedAvg and is rejected.
"""

from __future__ import annotations

from flower_pfl.catalog import baselines as catalog
from flower_pfl.instructions import PerFedAvgEval, PerFedAvgFit
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.fedavg import FedAvg


@strategy_for(catalog.PERFEDAVG)
class PerFedAvg(FedAvg):
    def fit_payload(self, pid, server_round):
        arrays, extra = super().fit_payload(pid, server_round)
        return arrays, {**extra, **PerFedAvgFit(variant=self.hyper["variant"],
                                                alpha=self.hyper["alpha"],
                                                delta=self.hyper["delta"]).to_config()}

    def eval_payload(self, pid, server_round):
        arrays, extra = super().eval_payload(pid, server_round)
        return arrays, {**extra, **PerFedAvgEval(alpha=self.hyper["alpha"],
                                                 personal_steps=self.hyper["personal-steps"]
                                                 ).to_config()}
