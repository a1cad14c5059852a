"""PLGU servers (Qu et al., CVPR 2023): PLGU-LF (Algorithm 2), PLGU-GRep (Algorithm 3),
PLGU-GHN (PLGU on pFedHN). The client sides are in clients/plgu.py, the math in
flower_pfl/algorithms/plgu_math.py.

PLGU-LF (scheme I, with a global model), Algorithm 2:
  4  sample C^t (the base's seeded sampling)
  5-10 each sampled client: scores (eq. 6), top-D personal layers, LWSAM (Algorithm 1),
     returns Delta of its universal layers + a mask of which arrays it shared
  11 w^{t+1} = w^t + mean Delta, per array over the clients that shared it
     (strategies/fedsam.apply_mean_delta, the rule FedSAM uses with every array shared)
  Evaluated: personalized models (each client's theta_i) and the global w^t.
  Limits: D = |L^Per| = 0 -> FedSAM (exactly while Lambda = I, e.g. every client's first
  round; afterwards FedSAM with layer-scaled radius); D = L -> Local (nothing is shared,
  w stays at its initial value). See docs/algorithms/plgu.md for why section 4.1's
  "FedAvg" and Fig. 5's wording do not follow from Algorithm 2.
PLGU-GRep (scheme II): FedRep's server (mean of bodies, line 14); clients run eqs. 9-13.
PLGU-GHN: pFedHN's server; clients train with LWSAM (our reading, see clients/plgu.py).
"""

from __future__ import annotations

from logging import WARNING
from typing import Mapping

import numpy as np
from flwr.common import Scalar
from flwr.common.logger import log

from flower_pfl.catalog import plgu as catalog
from flower_pfl.catalog.plgu import PLGUFit, PLGUReply
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.base import ClientUpdate, PersonalizedStrategy
from flower_pfl.strategies.fedrep import FedRep
from flower_pfl.strategies.fedsam import FedSAM, apply_mean_delta, warn_rho_zero
from flower_pfl.strategies.pfedhn import PFedHN


@strategy_for(catalog.PLGU_LF)
class PLGULF(FedSAM):
    params: catalog.PLGULFParams

    def setup(self, initial_arrays: list[np.ndarray]) -> None:
        from flower_pfl.learning.models import model_for  # torch: imported at use, so that
        # importing the strategy modules stays torch-free (flower_pfl/strategies/index.py)

        warn_rho_zero(self.params, "plgu-lf", "PLGU-LF without LWSAM (layer freezing + SGD)")
        # model_for declares a Mapping; it reads a RunConfig by key (as base.py's initial_arrays)
        num_layers = len(model_for(self.cfg).layer_names())  # type: ignore[arg-type]  # RunConfig
        d = self.params.personal_layers
        if d >= num_layers:
            log(WARNING, "[flower-pfl] plgu-lf: personal-layers = %d >= the %d layer(s) of "
                "model '%s': every layer stays personal, nothing is shared -- this runs as "
                "Local training", d, num_layers, self.cfg["model"])
        elif d == 0:
            log(WARNING, "[flower-pfl] plgu-lf: personal-layers = 0 keeps no layer personal: "
                "this is FedSAM with the layer-scaled (LWSAM) perturbation")

    def fit_payload(self, pid: int, server_round: int
                    ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        assert self.global_arrays is not None, "initialize_parameters sets the global model"
        return self.global_arrays, PLGUFit(rho=self.params.rho,
                                           personal_layers=self.params.personal_layers,
                                           reading=self.params.reading).to_config()

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> None:
        assert self.global_arrays is not None, "initialize_parameters sets the global model"
        self.global_arrays, counts = apply_mean_delta(self.global_arrays, updates)
        per = [PLGUReply.from_config(u.metrics).personal_layers or "" for u in updates]
        self.log_server(arrays_shared_by_nobody=int((counts == 0).sum()),
                        personal_layer_choices=";".join(sorted(set(per))))


class PerturbedVariant(PersonalizedStrategy):
    """PLGU-GRep / PLGU-GHN: the base method's server with the clients' LWSAM radius rho
    (``rho = 0`` is the base method: warned).  Listed first among a variant's bases, so
    its ``setup`` (the base method's, then the warning) and ``rho`` come before FedRep's and
    pFedHN's in the method order."""

    base_name = ""
    params: catalog.FedSAMParams  # rho, with the base method's keys

    def setup(self, initial_arrays: list[np.ndarray]) -> None:
        super().setup(initial_arrays)
        warn_rho_zero(self.params, self.cfg.strategy, self.base_name)

    def rho(self) -> float:
        return self.params.rho


@strategy_for(catalog.PLGU_GREP)
class PLGUGRep(PerturbedVariant, FedRep):
    base_name = "FedRep"
    params: catalog.PLGUGRepParams

    def reading(self) -> str:
        return self.params.reading


@strategy_for(catalog.PLGU_GHN)
class PLGUGHN(PerturbedVariant, PFedHN):
    base_name = "pFedHN"
    params: catalog.PLGUGHNParams
