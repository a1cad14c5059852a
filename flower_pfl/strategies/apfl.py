"""APFL -- Deng, Kamani & Mahdavi 2020, Algorithm 1 (server side).

The global model w is the sample-weighted mean of the clients' local copies of w (as
FedAvg; the paper averages uniformly over the sampled clients, equal for equal data).
The server sends alpha's initial value and step size; each client keeps v_i and
alpha_i (clients/apfl.py) and is evaluated on its mixture alpha_i v_i + (1 - alpha_i) w
(personalized) and on w (global).  A fixed alpha of 0 (FedAvg) or 1 (Local) is rejected
by the registry.
"""

from __future__ import annotations

from typing import Mapping

from flwr.common import Scalar

from flower_pfl.catalog import baselines as catalog
from flower_pfl.catalog.baselines import APFLInstruction
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.fedavg import FedAvg


@strategy_for(catalog.APFL)
class APFL(FedAvg):
    params: catalog.APFLParams

    def fit_config(self, pid: int, server_round: int) -> Mapping[str, Scalar]:
        hp = self.params  # the same instruction for fit and evaluation
        return APFLInstruction(alpha_init=hp.alpha_init, alpha_lr=hp.alpha_lr,
                               adapt_alpha=hp.adapt_alpha).to_config()

    eval_config = fit_config
