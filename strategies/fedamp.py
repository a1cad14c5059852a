"""FedAMP -- Huang et al., "Personalized Cross-Silo Federated Learning on Non-IID Data",
AAAI 2021, Algorithm 1.

Server (eq. 5/7):  u_i = xi_ii w_i + sum_{j != i} xi_ij w_j,
                   xi_ij = alpha_k A'(||w_i - w_j||^2),  A(x) = 1 - exp(-x / sigma),
                   xi_ii = 1 - sum_{j != i} xi_ij.
Client (eq. 6):    w_i = argmin_w F_i(w) + lambda / (2 alpha_k) ||w - u_i||^2
                   (clients/fedamp.py: SGD started from u_i).

Choices the paper leaves open (documented in docs/algorithms/fedamp.md):
* ``sigma: auto`` -- sigma = median squared distance between the stored client models,
  recomputed each round, so A' neither underflows nor goes flat whatever the model size.
* ``alpha-k: auto`` -- alpha_k = alpha-scale * sigma / (n_peers), the largest step that
  keeps every xi_ii >= 0 (A' <= 1/sigma); an explicit alpha_k above that bound is an error.
* ``alpha-schedule`` -- alpha_k = alpha_1 * {1, 1/sqrt(k), 1/k} (Theorems 1-2).
* ``lambda: auto`` -- lambda = prox-weight * alpha_k, i.e. the client's prox weight
  lambda/alpha_k is fixed (default 1), whatever alpha_k auto gives; an explicit lambda
  whose lr * lambda/alpha_k >= 1 (explicit SGD on the prox term overshoots) is an error.
* A degenerate setting (every weight underflows) raises instead of running as Local.
"""

from __future__ import annotations

import math

import numpy as np

from flower_pfl.attention import fedamp_alpha_bound, fedamp_weights
from strategies.message_passing import MessagePassingStrategy


class FedAMP(MessagePassingStrategy):
    def sigma(self) -> float:
        if self.hyper["sigma"] != "auto":
            return float(self.hyper["sigma"])
        seen = np.flatnonzero(self.matrix.seen)
        if len(seen) < 2:
            return 1.0  # no pair yet: any sigma gives the same (self-only) weights
        d = self.matrix.sq_distances(seen)[:, seen]
        med = float(np.median(d[~np.eye(len(seen), dtype=bool)]))
        return med if med > 0 else 1.0

    def alpha_k(self, server_round: int, sigma: float) -> float:
        if self.hyper["alpha-k"] == "auto":
            others = max(int(self.matrix.seen.sum()), 1)  # at most n_seen peers besides i
            base = self.hyper["alpha-scale"] * fedamp_alpha_bound(sigma, others)
        else:
            base = float(self.hyper["alpha-k"])
        decay = {"constant": 1.0, "inverse-sqrt": 1.0 / math.sqrt(server_round),
                 "inverse": 1.0 / server_round}[self.hyper["alpha-schedule"]]
        return base * decay

    def prox_coef(self, alpha: float) -> float:
        """lambda / alpha_k, the weight of the client's prox term (eq. 6)."""
        if self.hyper["lambda"] == "auto":
            return float(self.hyper["prox-weight"])
        coef = float(self.hyper["lambda"]) / alpha
        lr = float(self.cfg["train.lr"])
        if lr * coef >= 1.0:
            # Explicit SGD on c/2 ||w-u||^2 multiplies w-u by (1 - lr c) each step: at
            # lr c >= 1 it overshoots (>= 2: diverges to NaN). Say so instead.
            raise ValueError(f"FedAMP: lambda/alpha_k = {coef:.3g} with lr {lr:g} gives "
                             f"lr*lambda/alpha_k = {lr * coef:.3g} >= 1, so local SGD on the "
                             f"prox term overshoots; lower lambda (or use lambda: auto).")
        return coef

    def attention(self, rows, server_round):
        sigma = self.sigma()
        alpha = self.alpha_k(server_round, sigma)
        self._coef = self.prox_coef(alpha)
        self.log_server(sigma=sigma, alpha_k=alpha, prox_coef=self._coef)
        return fedamp_weights(self.matrix.sq_distances(rows), rows, self.peers(), alpha, sigma)

    def fit_config(self, pid, server_round):
        return {"prox-coef": self._coef}
