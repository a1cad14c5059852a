"""HeurFedAMP -- Huang et al., AAAI 2021, section 6, eq. 8.

Server:  xi_ij = exp(sigma cos(w_i, w_j)) / sum_{h != i} exp(sigma cos(w_i, w_h)) * (1 - xi_ii),
         xi_ii a hyper-parameter (``self-weight``); u_i = sum_j xi_ij w_j.
Client:  the same local problem as FedAMP (eq. 6) with prox weight lambda / alpha_k.

Cosines come from the same stacked model matrix and Gram matrix as FedAMP's distances.
"""

from __future__ import annotations

from flower_pfl.attention import heurfedamp_weights
from strategies.message_passing import MessagePassingStrategy


class HeurFedAMP(MessagePassingStrategy):
    def attention(self, rows, server_round):
        return heurfedamp_weights(self.matrix.cosine(rows), rows, self.peers(),
                                  float(self.hyper["sigma"]), float(self.hyper["self-weight"]))

    def fit_config(self, pid, server_round):
        return {"prox-coef": float(self.hyper["lambda"] / self.hyper["alpha-k"])}
