"""FedSAM (Qu et al., ICML 2022; PLGU's [33] and Table 1 baseline).

Server: w^{t+1} = w^t + (1/C) sum_{i in C^t} Delta_i (PLGU Algorithm 2, line 11, which
FedSAM shares); clients (clients/fedsam.py) run SAM as the local optimizer and upload
Delta_i = w_i^K - w^t. The mean is unweighted, as in Algorithm 2's 1/C (FedAvg in this
project is sample-weighted; on equal-sized clients the two coincide).

``apply_mean_delta`` is the one aggregation rule FedSAM and PLGU-LF share: each array of
the global model moves by the mean Delta of the clients that SHARED it this round (a
PLGU-LF client keeps its top-D layers personal and marks them in its ``shared`` mask); an
array nobody shared stays as it is.
"""

from __future__ import annotations

from logging import WARNING
from typing import Mapping, Sequence

import numpy as np
from flwr.common import Scalar
from flwr.common.logger import log

from flower_pfl.catalog import plgu as catalog
from flower_pfl.catalog.plgu import SAMFit, SharedReply
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.base import PersonalizedStrategy
from flower_pfl.strategies.federation import ClientUpdate


def apply_mean_delta(global_arrays: Sequence[np.ndarray], updates: Sequence[ClientUpdate]
                     ) -> tuple[list[np.ndarray], np.ndarray]:
    """(new global arrays, how many clients shared each array)."""
    out, counts = [], np.zeros(len(global_arrays), dtype=int)
    masks = []
    for u in updates:
        mask = SharedReply.from_config(u.metrics).shared or "1" * len(global_arrays)
        if len(mask) != len(global_arrays) or len(u.arrays) != len(global_arrays):
            raise ValueError(f"client {u.pid} uploaded {len(u.arrays)} arrays with a "
                             f"{len(mask)}-entry mask for a {len(global_arrays)}-array model")
        masks.append([c == "1" for c in mask])
    for k, w in enumerate(global_arrays):
        sel = [u.arrays[k] for u, m in zip(updates, masks) if m[k]]
        counts[k] = len(sel)
        if sel:
            mean = np.mean(np.stack(sel).astype(np.float64), axis=0)
            out.append((w.astype(np.float64) + mean).astype(np.float32))
        else:
            out.append(np.array(w, copy=True))
    return out, counts


def warn_rho_zero(params: catalog.FedSAMParams, name: str, becomes: str) -> None:
    if params.rho == 0.0:
        log(WARNING, "[flower-pfl] %s with rho = 0 has no perturbation: it runs as %s",
            name, becomes)


@strategy_for(catalog.FEDSAM)
class FedSAM(PersonalizedStrategy):
    params: catalog.FedSAMParams

    def setup(self, initial_arrays: list[np.ndarray]) -> None:
        warn_rho_zero(self.params, "fedsam", "FedAvg with an unweighted mean of deltas")

    def fit_payload(self, pid: int, server_round: int
                    ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        assert self.global_arrays is not None, "FedSAM keeps a global model (has_global_model)"
        return self.global_arrays, SAMFit(rho=self.params.rho).to_config()

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> None:
        assert self.global_arrays is not None, "FedSAM keeps a global model (has_global_model)"
        self.global_arrays, _ = apply_mean_delta(self.global_arrays, updates)
