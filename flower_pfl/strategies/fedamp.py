"""FedAMP -- Huang et al., "Personalized Cross-Silo Federated Learning on Non-IID Data",
AAAI 2021, Algorithm 1.

Server (eq. 5/7):  u_i = xi_ii w_i + sum_{j != i} xi_ij w_j,
                   xi_ij = alpha_k A'(||w_i - w_j||^2),  A(x) = 1 - exp(-x / sigma),
                   xi_ii = 1 - sum_{j != i} xi_ij.
Client (eq. 6):    w_i = argmin_w F_i(w) + lambda / (2 alpha_k) ||w - u_i||^2
                   (clients/fedamp.py: SGD started from u_i).

Choices the paper leaves open (measured runs in docs/algorithms/fedamp.md):
* ``sigma: auto`` -- sigma = sigma-scale * (median squared distance between the stored
  peer models), recomputed each round.  sigma-scale 1 (the median itself) gives nearly
  flat attention; the default is sharper.
* ``alpha-k: auto`` -- the largest alpha_k that keeps every xi_ii >= min-self-weight for
  the distances of this round: alpha_k = (1 - min-self-weight) / max_i sum_j A'(d_ij).
  An explicit alpha_k that makes some xi_ii < 0 is an error.
* ``alpha-schedule`` -- alpha_k = alpha_1 * {1, 1/sqrt(k), 1/k} (Theorems 1-2).
* ``lambda: auto`` -- lambda = prox-weight * alpha_k, i.e. the client's prox weight
  lambda/alpha_k is fixed (``prox-weight``), whatever alpha_k auto gives; an explicit
  lambda whose lr * lambda/alpha_k >= 1 (explicit SGD on the prox term overshoots) is
  an error.
* Mechanism off: every weight underflowing to 0 raises; a mean peer mass (1 - xi_ii)
  below ``MIN_PEER_MASS`` is logged as a WARNING naming sigma / alpha-k, every round the
  measure ``peer_mass`` is in server.csv.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from flwr.common import Scalar

from flower_pfl.algorithms.attention import fedamp_auto_weights, fedamp_weights, offdiag_mass
from flower_pfl.catalog import fedamp as catalog
from flower_pfl.catalog.fedamp import FedAMPFit
from flower_pfl.config import RunConfig
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.message_passing import MessagePassingStrategy

#: below this mean weight on peers FedAMP is Local training in all but name
MIN_PEER_MASS = 1e-3


@strategy_for(catalog.FEDAMP)
class FedAMP(MessagePassingStrategy):
    params: catalog.FedAMPParams

    def __init__(self, cfg: RunConfig, initial_arrays: Sequence[np.ndarray] | None = None,
                 results_dir: str | Path | None = None) -> None:
        super().__init__(cfg, initial_arrays, results_dir)
        self._coef = math.nan  # lambda / alpha_k of the round's weights (set by attention)

    def sigma(self, peers: np.ndarray) -> float:
        if self.params.sigma != "auto":
            return float(self.params.sigma)
        held = np.flatnonzero(peers)
        if len(held) < 2:
            return 1.0  # no pair yet: any sigma gives the same (self-only) weights
        d = self.matrix.sq_distances(held, held)
        med = float(np.median(d[~np.eye(len(held), dtype=bool)]))
        return self.params.sigma_scale * med if med > 0 else 1.0

    def decay(self, server_round: int) -> float:
        return {"constant": 1.0, "inverse-sqrt": 1.0 / math.sqrt(server_round),
                "inverse": 1.0 / server_round}[self.params.alpha_schedule]

    def prox_coef(self, alpha: float) -> float:
        """lambda / alpha_k, the weight of the client's prox term (eq. 6)."""
        if self.params.lambda_ == "auto":
            return float(self.params.prox_weight)
        coef = float(self.params.lambda_) / alpha
        lr = float(self.cfg["train.lr"])
        if lr * coef >= 1.0:
            # Explicit SGD on c/2 ||w-u||^2 multiplies w-u by (1 - lr c) each step: at
            # lr c >= 1 it overshoots (>= 2: diverges to NaN). Say so instead.
            raise ValueError(f"FedAMP: lambda/alpha_k = {coef:.3g} with lr {lr:g} gives "
                             f"lr*lambda/alpha_k = {lr * coef:.3g} >= 1, so local SGD on the "
                             f"prox term overshoots; lower lambda (or use lambda: auto).")
        return coef

    def attention(self, rows: np.ndarray, server_round: int) -> np.ndarray:
        peers = self.peers()
        sigma = self.sigma(peers)
        dist = self.matrix.sq_distances(rows)
        if self.params.alpha_k == "auto":
            xi, log_alpha = fedamp_auto_weights(dist, rows, peers, sigma,
                                                float(self.params.min_self_weight),
                                                self.decay(server_round))
            alpha = math.exp(min(log_alpha, 700.0))
        else:
            alpha = float(self.params.alpha_k) * self.decay(server_round)
            xi = fedamp_weights(dist, rows, peers, alpha, sigma)
        self._coef = self.prox_coef(alpha)
        self.log_server(sigma=sigma, alpha_k=alpha, prox_coef=self._coef)
        return xi

    def prepare_round(self, server_round: int, sampled: list[int]) -> None:
        super().prepare_round(server_round, sampled)
        assert self.last_xi is not None, "super().prepare_round set this round's weights"
        rows, xi = self.last_xi
        has_peer = self.peers().sum() > 1
        mass = float(offdiag_mass(xi, rows).mean())
        self.log_server(peer_mass=mass)
        if has_peer and mass < MIN_PEER_MASS:
            self.warn_once(
                "local", "[flower-pfl] FedAMP round %d: the clients put on average %.3g of "
                "their cloud model's weight on peers (xi_ii ~ 1): this is Local training. "
                "sigma = %s is too small next to the squared model distances or alpha-k = %s "
                "too small; use sigma: auto and alpha-k: auto (server.csv: peer_mass).",
                server_round, mass, self.params.sigma, self.params.alpha_k)

    def fit_config(self, pid: int, server_round: int) -> Mapping[str, Scalar]:
        return FedAMPFit(prox_coef=self._coef).to_config()
