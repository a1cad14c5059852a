"""FedACS -- Chen, Li, Shen, "Attention-based client selection" for pFL, Algorithm 1.

Each round k:
  3  sample clients;
  4  S^k: cosine similarity of the stored client models (one stacked matrix, one Gram
     matrix: the same ModelStore as FedAMP, strategies/message_passing.py);
  5  delta^k = p-quantile of ALL entries of S^k (over the clients the server holds);
  6  for each sampled client (eq. 4):
        u_i = sum_j 1[s_ij > delta] s_ij w_j / sum_j 1[s_ij > delta] s_ij,
     the client itself always included (s_ii = 1);
  7  the client runs local SGD from u_i (eq. 5, clients/fedacs.py) and uploads w_i.

Clients never sampled yet (the 500-client setting): their stored model is just the
initial model, which carries no information about their data, so their u_i is the
similarity-weighted mean of ALL stored models (no threshold, own row excluded) -- a
consensus start, like FedAvg's global model -- until their first upload.

Mechanism off: when every (non-newcomer) sampled client selects only itself, FedACS is
Local training; when every one selects all its available peers, it is a
similarity-weighted FedAvg.  ``selection_share`` (selected / available peers, averaged
over those clients; :func:`selection_share`) goes to server.csv every round and either
extreme logs one WARNING naming ``hyper.fedacs.pick-ratio``.

Eq. 4 weights by s_ij; we drop non-positive similarities (``attention.fedacs_weights``)
even when delta < 0 (possible for a low pick-ratio with opposed models): a negative
weight would make u_i a non-convex combination -- pushed AWAY from a dissimilar model
and, when the weights sum to ~0, unbounded.  See docs/algorithms/fedacs.md.
"""

from __future__ import annotations

import numpy as np

from flower_pfl.algorithms.attention import consensus_weights, fedacs_weights, quantile_threshold
from flower_pfl.catalog import fedacs as catalog
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.mechanism import Mechanism
from flower_pfl.strategies.message_passing import CLOUD, MessagePassingStrategy


def selection_share(xi: np.ndarray, rows: np.ndarray, peers: np.ndarray,
                    newcomers: np.ndarray) -> tuple[float, str | None]:
    """Mean over the sampled non-newcomers with >= 1 available peer of (selected peers /
    available peers), and the mechanism-off case: "only itself" (share 0), "everyone"
    (every such client selected every available peer), or None.  NaN when no client
    qualifies (round 1: nothing stored yet)."""
    rows = np.asarray(rows)
    available = np.asarray(peers, dtype=bool)[None, :].repeat(len(rows), axis=0)
    available[np.arange(len(rows)), rows] = False
    counts = available.sum(axis=1)
    keep = (~np.asarray(newcomers, dtype=bool)) & (counts > 0)
    if not keep.any():
        return float("nan"), None
    selected = ((np.asarray(xi) > 0) & available).sum(axis=1)
    shares = selected[keep] / counts[keep]
    off = "only itself" if (shares == 0).all() else "everyone" if (shares == 1).all() else None
    return float(shares.mean()), off


@strategy_for(catalog.FEDACS)
class FedACS(MessagePassingStrategy):
    """Saved per round: delta and the number of peers each sampled client aggregated
    (``server.csv``, ``peers.csv``); at the end the n x n weights (``attention``) and the
    selection mask (``selection.npy/.png``).
    """

    mechanism = Mechanism("FedACS", *CLOUD)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.delta = float("inf")  # delta^k of the round (set by attention)

    def threshold(self) -> float:
        """delta^k over the similarity matrix of the stored models."""
        seen = np.flatnonzero(self.matrix.seen)
        if len(seen) == 0:
            return float("inf")
        return quantile_threshold(self.matrix.cosine(seen, seen),
                                  float(self.hyper["pick-ratio"]))

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
        share, off = selection_share(xi, rows, self.peers(), ~self.matrix.seen[rows])
        self.log_server(delta=self.delta, peers_mean=float(peers.mean()),
                        peers_min=int(peers.min()), peers_max=int(peers.max()),
                        selection_share=share)
        if off:
            p = float(self.hyper["pick-ratio"])
            fix = ("lower hyper.fedacs.pick-ratio: delta is above every peer's similarity, so "
                   "FedACS is running as Local training" if off == "only itself" else
                   "raise hyper.fedacs.pick-ratio: delta is below every peer's similarity, so "
                   "FedACS is running as a similarity-weighted FedAvg")
            self.warn_once(off, "[flower-pfl] fedacs round %d: every sampled client selected %s "
                           "(pick-ratio %g, delta %.4g); %s", server_round, off, p, self.delta, fix)
        self.results.log_table("peers", [
            {"round": server_round, "partition-id": int(pid), "peers": int(k),
             "newcomer": bool(not self.matrix.seen[pid])} for pid, k in zip(rows, peers)])

    def save_attention(self, server_round):
        xi = super().save_attention(server_round)
        if xi is not None:
            self.results.save_matrix("selection", (xi > 0).astype(np.float64))
        return xi
