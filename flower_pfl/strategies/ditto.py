"""Ditto -- Li, Hu, Beirami & Smith, ICML 2021, Algorithm 1 (server side).

The global model is trained exactly as FedAvg (sample-weighted mean of the clients'
updates of w^t); the server only adds lambda and the personal step count to the fit
instructions.  Each client keeps its personal v_i (clients/ditto.py).  Both models are
evaluated every evaluation round: Ditto-P (v_i, the personalized column) and Ditto-G
(the global model).  lambda = 0 makes v_i plain local training and is rejected.
"""

from __future__ import annotations

from typing import Mapping

from flwr.common import Scalar

from flower_pfl.catalog import baselines as catalog
from flower_pfl.catalog.baselines import DittoFit
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.fedavg import FedAvg


@strategy_for(catalog.DITTO)
class Ditto(FedAvg):
    params: catalog.DittoParams

    def fit_config(self, pid: int, server_round: int) -> Mapping[str, Scalar]:
        steps = self.params.personal_steps
        return DittoFit(lam=self.params.lambda_,
                        personal_steps=0 if isinstance(steps, str) else steps  # str: 'auto'
                        ).to_config()

    def newcomer_config(self, pid: int, server_round: int) -> Mapping[str, Scalar]:
        """A newcomer's personal solve reads lambda (:class:`DittoFit`)."""
        return self.fit_config(pid, server_round)
