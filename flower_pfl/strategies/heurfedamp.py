"""HeurFedAMP -- Huang et al., AAAI 2021, section 6, eq. 8.

Server:  xi_ij = exp(sigma cos(w_i, w_j)) / sum_{h != i} exp(sigma cos(w_i, w_h)) * (1 - xi_ii),
         xi_ii a hyper-parameter (``self-weight``); u_i = sum_j xi_ij w_j.
Client:  the same local problem as FedAMP (eq. 6) with prox weight lambda / alpha_k.

Cosines come from the same stacked model matrix and Gram matrix as FedAMP's distances.

Mechanism off: cosines of models grown from one initialisation differ by ~1e-3, so a
small sigma makes the softmax uniform (every peer the same weight: FedAvg-like mixing,
no attention).  ``peak_over_mean`` (max / mean peer weight) is in server.csv every round;
below ``MIN_PEAK_OVER_MEAN`` a WARNING names sigma.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
from flwr.common import Scalar

from flower_pfl.algorithms.attention import heurfedamp_weights, peak_over_mean
from flower_pfl.catalog import fedamp as catalog
from flower_pfl.catalog.fedamp import FedAMPFit
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.message_passing import MessagePassingStrategy

#: peak / mean peer weight below this: attention is uniform over the peers
MIN_PEAK_OVER_MEAN = 1.1


@strategy_for(catalog.HEURFEDAMP)
class HeurFedAMP(MessagePassingStrategy):
    params: catalog.HeurFedAMPParams

    def attention(self, rows: np.ndarray, server_round: int) -> np.ndarray:
        return heurfedamp_weights(self.matrix.cosine(rows), rows, self.peers(),
                                  float(self.params.sigma), float(self.params.self_weight))

    def prepare_round(self, server_round: int, sampled: list[int]) -> None:
        super().prepare_round(server_round, sampled)
        assert self.last_xi is not None, "super().prepare_round set this round's weights"
        rows, xi = self.last_xi
        ratio = peak_over_mean(xi, rows)
        if self.peers().sum() > 2 and ratio < MIN_PEAK_OVER_MEAN:
            self.warn_once(
                "uniform", "[flower-pfl] HeurFedAMP round %d: the attention is uniform over the "
                "peers (peak/mean peer weight %.4f): the cosines of the models are too close "
                "for sigma = %g to separate them; raise sigma (server.csv: peak_over_mean).",
                server_round, ratio, float(self.params.sigma))

    def fit_config(self, pid: int, server_round: int) -> Mapping[str, Scalar]:
        return FedAMPFit(prox_coef=self.params.lambda_ / self.params.alpha_k).to_config()
