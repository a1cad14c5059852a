"""pFedBreD_ns -- Shi et al., "Personalized Federated Learning with Hidden Information on
Personalized Prior", NeurIPS 2023, Algorithm 1 (server side); and pFedMe -- Dinh et al.,
"Personalized Federated Learning with Moreau Envelopes", NeurIPS 2020 (mu = w).

    line 3   send w^(t-1) to the sampled clients (with prior, lambda, alpha, alpha_m, R, K,
             eta, eta_alpha, batch size)
    line 12  w^(t) = (1 - beta) w^(t-1) + beta E_I w_{i,R}^(t)
The client side (line 9's envelope gradient, theta's start, the mh-lookahead variant) is
documented in flower_pfl/algorithms/pfedbred_math.py.

beta = 1 is plain averaging; beta > 1 extrapolates (pFedMe's trick); beta = 0 would freeze
the global model and is rejected by config validation (flower_pfl/catalog/pfedbred.py).
A meta-step switched off (eta = 0 for meg, eta_alpha = 0 for lg, both for mh) turns pFedBreD
into pFedMe: allowed (tests use it) but warned in the log.

Open choice: the paper has every client train every round and aggregates a 20% sample; here
(as everywhere in flower-pfl) only the sampled clients train, so a client's theta_i and
memory advance only in the rounds it is sampled.  E_I is the uniform mean (``weighting``).
"""

from __future__ import annotations

from logging import WARNING
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from flwr.common import Scalar
from flwr.common.logger import log

from flower_pfl.catalog import pfedbred as catalog
from flower_pfl.catalog.pfedbred import PFedBreDFit, PFedBreDReply
from flower_pfl.config import RunConfig
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.base import ClientUpdate, PersonalizedStrategy


@strategy_for(catalog.PFEDBRED)
class PFedBreD(PersonalizedStrategy):
    #: pfedbred: PFedBreDParams; pfedbred-<prior>: FixedPriorParams; pfedme: PFedMeParams
    params: catalog.EnvelopeParams
    #: the meta-step of eq. 14; None: read ``hyper.prior`` (convenience names fix it)
    fixed_prior: str | None = None

    def __init__(self, cfg: RunConfig, initial_arrays: Sequence[np.ndarray] | None = None,
                 results_dir: str | Path | None = None) -> None:
        super().__init__(cfg, initial_arrays, results_dir)
        self.prior = self.fixed_prior or self.chosen_prior()
        meta = self.meta_step()
        sizes = {"eta": meta.eta, "eta-alpha": meta.eta_alpha} if meta is not None else {}
        off = {"lg": ["eta-alpha"], "meg": ["eta"], "mh": ["eta", "eta-alpha"],
               "mh-lookahead": ["eta", "eta-alpha"]}.get(self.prior, [])
        if off and all(float(sizes[k]) == 0.0 for k in off):
            log(WARNING, "[flower-pfl] %s: %s = 0 switches the meta-step off (mu = w): this "
                "run is pFedMe, not pFedBreD-%s", cfg.strategy, " = ".join(off), self.prior)

    def chosen_prior(self) -> str:
        """``hyper.pfedbred.prior`` (only the name ``pfedbred`` leaves the prior open)."""
        assert isinstance(self.params, catalog.PFedBreDParams), (
            f"{type(self).__name__} fixes no prior and {type(self.params).__name__} holds none")
        return self.params.prior

    def meta_step(self) -> catalog.MetaStepParams | None:
        """eta, eta-alpha and envelope (eq. 14, line 9); None for pFedMe, which has none."""
        return self.params if isinstance(self.params, catalog.MetaStepParams) else None

    def newcomer_config(self, pid: int, server_round: int) -> Mapping[str, Scalar]:
        """A newcomer's inner problem reads lambda and alpha (:class:`PFedBreDFit`)."""
        return self.fit_payload(pid, server_round)[1]

    def fit_payload(self, pid: int, server_round: int
                    ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        p, meta = self.params, self.meta_step()
        assert self.global_arrays is not None, "initialize_parameters sets the global model"
        return self.global_arrays, PFedBreDFit(
            lam=p.lambda_, alpha=p.alpha, alpha_m=p.alpha_m,
            local_iterations=p.local_iterations, prox_steps=p.prox_steps,
            batch_size=p.batch_size, theta_init=p.theta_init, prior=self.prior,
            eta=meta.eta if meta is not None else 0.0,
            envelope=meta.envelope if meta is not None else "mu",
            eta_alpha=meta.eta_alpha if meta is not None else 0.0).to_config()

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> None:
        from flower_pfl.algorithms import pfedbred_math as pm  # torch: imported at use, so
        # that importing the strategy modules stays torch-free (strategies/index.py)

        weights: list[float] | None = None
        if self.params.weighting == "samples":
            weights = [u.num_examples for u in updates]
        assert self.global_arrays is not None, "initialize_parameters sets the global model"
        self.global_arrays = pm.server_update(self.global_arrays, [u.arrays for u in updates],
                                              float(self.params.beta), weights)
        gaps = [gap for u in updates
                if (gap := PFedBreDReply.from_config(u.metrics).w_theta_gap) is not None]
        if gaps:
            self.log_server(mean_w_theta_gap=sum(gaps) / len(gaps))


@strategy_for(catalog.PFEDBRED_LG)
class PFedBreDLG(PFedBreD):
    params: catalog.FixedPriorParams
    fixed_prior = "lg"


@strategy_for(catalog.PFEDBRED_MEG)
class PFedBreDMEG(PFedBreD):
    params: catalog.FixedPriorParams
    fixed_prior = "meg"


@strategy_for(catalog.PFEDBRED_MH)
class PFedBreDMH(PFedBreD):
    params: catalog.FixedPriorParams
    fixed_prior = "mh"


@strategy_for(catalog.PFEDBRED_MH_LOOKAHEAD)
class PFedBreDMHLookahead(PFedBreD):
    params: catalog.FixedPriorParams
    fixed_prior = "mh-lookahead"


@strategy_for(catalog.PFEDME)
class PFedMe(PFedBreD):
    """pFedMe = the same framework with mu = w (no meta-step); its contract declares no
    mechanism (theta-init: restart -- nothing of an earlier round enters a fit)."""

    params: catalog.PFedMeParams
    fixed_prior = "none"
