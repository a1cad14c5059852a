"""APFL -- Deng, Kamani & Mahdavi 2020, Algorithm 1 (server side).

The global model w is the sample-weighted mean of the clients' local copies of w (as
FedAvg; the paper averages uniformly over the sampled clients, equal for equal data).
The server sends alpha's initial value and step size; each client keeps v_i and
alpha_i (clients/apfl.py) and is evaluated on its mixture alpha_i v_i + (1 - alpha_i) w
(personalized) and on w (global).  A fixed alpha of 0 (FedAvg) or 1 (Local) is rejected
by the registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
from flwr.common import Scalar

from flower_pfl.catalog import baselines as catalog
from flower_pfl.catalog.baselines import APFLInstruction
from flower_pfl.contract import Mechanism
from flower_pfl.instructions import Scalar as InstructionScalar
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.fedavg import FedAvg
from flower_pfl.strategies.hyper_view import HyperView


@dataclass(frozen=True)
class APFLHyper:
    """hyper.apfl (flower_pfl/catalog/baselines.py)."""

    alpha_init: float  # the mixing weight alpha_i before it is adapted
    alpha_lr: float  # alpha_i's step size
    adapt_alpha: bool  # whether alpha_i is adapted (eq. 10)


@strategy_for(catalog.APFL)
class APFL(FedAvg):
    mechanism = Mechanism("APFL", "v_i and the adapted alpha_i carried over from an earlier "
                          "round", "v_i = w and alpha_i = alpha-init; an untrained client "
                          "evaluates w")

    apfl_hyper = HyperView(APFLHyper)

    def fit_payload(self, pid: int, server_round: int
                    ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        arrays, extra = super().fit_payload(pid, server_round)
        return arrays, {**extra, **self._alpha_config()}

    def eval_payload(self, pid: int, server_round: int
                     ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        arrays, extra = super().eval_payload(pid, server_round)
        return arrays, {**extra, **self._alpha_config()}

    def _alpha_config(self) -> dict[str, InstructionScalar]:
        hp = self.apfl_hyper
        return APFLInstruction(alpha_init=hp.alpha_init, alpha_lr=hp.alpha_lr,
                               adapt_alpha=hp.adapt_alpha).to_config()
