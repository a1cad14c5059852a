"""FedACS -- Chen, Li, Shen, "Attention-based client selection" for pFL, Algorithm 1.

Each round k:
  3  sample clients;
  4  S^k: cosine similarity of the stored client models (one stacked matrix, one Gram
     matrix: the same ModelMatrix as FedAMP);
  5  delta^k = p-quantile of ALL entries of S^k (over the clients the server holds);
  6  for each sampled client (eq. 4):
        u_i = sum_j 1[s_ij > delta] s_ij w_j / sum_j 1[s_ij > delta] s_ij,
     the client itself always included (s_ii = 1);
  7  the client runs local SGD from u_i (eq. 5, clients/fedacs.py) and uploads w_i.

Clients never sampled yet (the 500-client setting): their stored model is just the
initial model, which carries no information about their data, so their u_i is the
similarity-weighted mean of ALL stored models (no threshold, own row excluded) -- a
consensus start, like FedAvg's global model -- until their first upload.

Saved per round: delta and the number of peers each sampled client aggregated
(``server.csv``, ``peers.csv``); at the end the n x n weights (``attention``) and the
selection mask (``selection.npy/.png``).
"""

from __future__ import annotations

import numpy as np

from flower_pfl.attention import consensus_weights, fedacs_weights, quantile_threshold
from strategies.message_passing import MessagePassingStrategy


class FedACS(MessagePassingStrategy):
    def threshold(self) -> float:
        """delta^k over the similarity matrix of the stored models."""
        seen = np.flatnonzero(self.matrix.seen)
        if len(seen) == 0:
            return float("inf")
        return quantile_threshold(self.matrix.cosine(seen)[:, seen], float(self.hyper["pick-ratio"]))

    def attention(self, rows, server_round):
        peers = self.peers()
        cosine = self.matrix.cosine(rows)
        self.delta = self.threshold()
        xi = fedacs_weights(cosine, rows, peers, self.delta)
        newcomers = ~self.matrix.seen[rows]
        if newcomers.any() and peers.any():
            xi[newcomers] = consensus_weights(cosine[newcomers], peers)
        return xi

    def prepare_round(self, server_round, sampled):
        super().prepare_round(server_round, sampled)
        rows, xi = self.last_xi
        peers = (xi > 0).sum(axis=1) - (xi[np.arange(len(rows)), rows] > 0)
        self.log_server(delta=self.delta, peers_mean=float(peers.mean()),
                        peers_min=int(peers.min()), peers_max=int(peers.max()))
        self.results.log_table("peers", [
            {"round": server_round, "partition-id": int(pid), "peers": int(k),
             "newcomer": bool(not self.matrix.seen[pid])} for pid, k in zip(rows, peers)])

    def save_attention(self, server_round):
        xi = super().save_attention(server_round)
        self.results.save_matrix("selection", (xi > 0).astype(np.float64))
        return xi
