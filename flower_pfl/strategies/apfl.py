"""APFL -- Deng, Kamani & Mahdavi 2020, Algorithm 1 (server side).

The global model w is the sample-weighted mean of the clients' local copies of w (as
FedAvg; the paper averages uniformly over the sampled clients, equal for equal data).
The server sends alpha's initial value and step size; each client keeps v_i and
alpha_i (clients/apfl.py) and is evaluated on its mixture alpha_i v_i + (1 - alpha_i) w
(personalized) and on w (global).  A fixed alpha of 0 (FedAvg) or 1 (Local) is rejected
by the registry.
"""

from __future__ import annotations

from flower_pfl.catalog import baselines as catalog
from flower_pfl.instructions import APFLInstruction
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.fedavg import FedAvg
from flower_pfl.strategies.mechanism import Mechanism


@strategy_for(catalog.APFL)
class APFL(FedAvg):
    mechanism = Mechanism("APFL", "v_i and the adapted alpha_i carried over from an earlier "
                          "round", "v_i = w and alpha_i = alpha-init; an untrained client "
                          "evaluates w")

    def fit_payload(self, pid, server_round):
        arrays, extra = super().fit_payload(pid, server_round)
        return arrays, {**extra, **self._alpha_config()}

    def eval_payload(self, pid, server_round):
        arrays, extra = super().eval_payload(pid, server_round)
        return arrays, {**extra, **self._alpha_config()}

    def _alpha_config(self):
        return APFLInstruction(alpha_init=self.hyper["alpha-init"],
                               alpha_lr=self.hyper["alpha-lr"],
                               adapt_alpha=self.hyper["adapt-alpha"]).to_config()
