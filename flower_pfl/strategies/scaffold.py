"""SCAFFOLD -- Karimireddy et al., ICML 2020, Algorithm 1 (server side).

    send (x, c) to the sampled clients S
    x <- x + eta_g * mean_{i in S} (y_i - x)          (line 16)
    c <- c + |S|/N * mean_{i in S} (c_i+ - c_i)       (line 17)

Each client uploads its model y_i and, as the paper's line 13 says, dc_i = c_i+ - c_i: the
upload's extra part ``control-delta`` (``upload_extra``), so the base's upload check holds it
to the model's shapes and dtypes and rejects NaN/Inf in it as in a model array.  dc_i is a
gradient (loss per parameter), not an update in the model's units, so ``max-update-norm``
does not bound it.  c starts at zero and is sent after the model, as the download's extra
part ``control`` (``fit_extra``); c_i lives in each client's context.state.

Choices: the model mean is weighted by sample count like FedAvg (the paper's plain mean
when clients hold equal amounts of data), so with zero control variates and eta_g = 1 a
round is exactly a FedAvg round (tested); the control mean is the paper's plain mean.
Personalized evaluation is the global model (SCAFFOLD is not a pFL method; it is
FedAMP's global baseline).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from flwr.common import Scalar

from flower_pfl.catalog import baselines as catalog
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.base import ClientUpdate, PersonalizedStrategy

# flower_pfl/algorithms/baselines_math.py (the names of the extra parts, CONTROL_DELTA: dc_i =
# c_i+ - c_i, line 13, uploaded; CONTROL: c, downloaded; and the server step) imports torch
# for the client's math: each method imports it where used, so that importing the strategy
# modules stays torch-free (flower_pfl/strategies/index.py).


@strategy_for(catalog.SCAFFOLD)
class Scaffold(PersonalizedStrategy):
    params: catalog.ScaffoldParams
    #: the server control variate c
    checkpointed = ("control",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.control: list[np.ndarray] = []  # c; zeros from setup()

    def setup(self, initial_arrays: list[np.ndarray]) -> None:
        self.control = [np.zeros_like(a) for a in initial_arrays]  # c = 0

    def fit_payload(self, pid: int, server_round: int
                    ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        assert self.global_arrays is not None, "initialize_parameters sets the global model"
        return list(self.global_arrays), {}

    def fit_extra(self, pid: int, server_round: int) -> dict[str, list[np.ndarray]]:
        from flower_pfl.algorithms.baselines_math import CONTROL

        return {CONTROL: self.control}

    def upload_extra(self, server_round: int) -> dict[str, list[np.ndarray]]:
        from flower_pfl.algorithms.baselines_math import CONTROL_DELTA

        assert self._initial is not None, "initialize_parameters sets the initial model"
        return {CONTROL_DELTA: self._initial}  # dc_i: shaped like the model

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> None:
        from flower_pfl.algorithms.baselines_math import CONTROL_DELTA, scaffold_server

        dcs = [u.extra[CONTROL_DELTA] for u in updates]
        assert self.global_arrays is not None, "initialize_parameters sets the global model"
        self.global_arrays, self.control = scaffold_server(
            self.global_arrays, self.control, [u.arrays for u in updates], dcs,
            [u.num_examples for u in updates], self.num_clients, float(self.params.global_lr))
        self.log_server(control_norm=float(np.sqrt(sum((c.astype(np.float64) ** 2).sum()
                                                       for c in self.control))))
