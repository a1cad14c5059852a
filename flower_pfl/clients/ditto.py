"""Ditto client -- Li, Hu, Beirami & Smith, ICML 2021, Algorithm 1 (client side).

Given the global model w^t:
    personal:  s steps of SGD on  f_i(v) + lambda/2 ||v - w^t||^2   (v_i kept in context.state)
    global:    the configured local SGD on f_i(w) from w^t, uploaded (FedAvg's client update)
The prox centre is the w^t received this round (detached: it does not move while v
trains); the term is a ``prox.Prox`` (its gradient added to the data gradient before
each step, bit for bit autograd's; tests/test_prox_fused.py).  v_i starts at the first
global model the client receives.  Personalized evaluation uses v_i (Ditto-P); the base
evaluates the global model beside it (Ditto-G).
"""

from __future__ import annotations

from flwr.common import NDArrays

from flower_pfl.algorithms.prox import Prox
from flower_pfl.catalog import baselines
from flower_pfl.catalog.baselines import DittoFit
from flower_pfl.clients.base import NEWCOMER_SALT, MessageConfig, Metrics
from flower_pfl.clients.fedavg import FedAvgClient
from flower_pfl.learning.models import NamedLayers, get_arrays
from flower_pfl.learning.training import params_of
from flower_pfl.registry import client_for


@client_for(baselines.DITTO)
class DittoClient(FedAvgClient):
    def fit_round(self, parameters: NDArrays, config: MessageConfig
                  ) -> tuple[NDArrays, Metrics]:
        center = params_of(self.new_model(parameters))  # w^t
        sent = DittoFit.from_config(config)
        lam = sent.lam
        v = self._personal(parameters)
        steps = sent.personal_steps or None  # 0: the configured local steps
        personal = self.local_train(v, regularizer=Prox(center, lam),
                                    num_steps=steps, salt=1)
        self.save_personal(v, "ditto-v")
        arrays, metrics = super().fit_round(parameters, config)  # w: FedAvg's local update
        return arrays, {**metrics, "personal_train_loss": personal["train_loss"],
                        "personal_prox_loss": personal["reg_loss"]}

    def personal_model(self, parameters: NDArrays, config: MessageConfig
                       ) -> NamedLayers:
        return self._personal(parameters)

    def adapt_newcomer(self, model: NamedLayers, config: MessageConfig, steps: int
                       ) -> NamedLayers:
        """Ditto's personal solve for a newcomer: ``steps`` SGD steps on f_i(v) +
        lambda/2 ||v - w*||^2 from v = w* (``model``; lambda: the newcomer instruction's
        :class:`DittoFit`)."""
        center = params_of(self.new_model(get_arrays(model)))  # w*, fixed while v trains
        self.local_train(model, regularizer=Prox(center, DittoFit.from_config(config).lam),
                         num_steps=steps, salt=NEWCOMER_SALT)
        return model

    def _personal(self, parameters: NDArrays) -> NamedLayers:
        """v_i from context.state; before the first fit, the global model received."""
        v = self.load_personal("ditto-v")
        return v if v is not None else self.new_model(parameters)
