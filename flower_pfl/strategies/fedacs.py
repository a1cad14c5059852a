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
and, when the weights sum to ~0, unbounded.  Recorded: server.csv ``dropped_nonpositive``
(pairs of the round's sampled clients with delta < s_ij <= 0, which eq. 4 would select),
one INFO line the first round it happens, and the run's total in the end-of-run
mechanism line and summary.json (``fedacs``).  See docs/algorithms/fedacs.md.

A newcomer whose initial model has cos <= 0 to every stored model has no similarity to
weight the consensus by: an all-zero initial model (``model: scalar`` starts at theta = 0)
has cosine 0 to everything.  It starts from the plain mean of the stored models
(``attention.consensus_weights``); server.csv ``consensus_uniform`` counts the round's
sampled newcomers that did, one WARNING says it once (with the cause), and the run's
total (fit and evaluation) goes to the mechanism line and summary.json.
"""

from __future__ import annotations

from logging import INFO
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from flwr.common.logger import log

from flower_pfl.algorithms.attention import (
    consensus_fallback,
    consensus_weights,
    fedacs_dropped,
    fedacs_weights,
    quantile_threshold,
)
from flower_pfl.catalog import fedacs as catalog
from flower_pfl.config import RunConfig
from flower_pfl.contract import Mechanism
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.message_passing import MessagePassingStrategy
from flower_pfl.warnings_once import first_time


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

    #: run totals for the end-of-run record: {"dropped_nonpositive": pairs,
    #: "consensus_uniform": never-trained client-rounds, fit or evaluation, given the
    #: plain mean of the stored models}
    checkpointed: tuple[str, ...] = ("fedacs_counts",)

    params: catalog.FedACSParams

    def __init__(self, cfg: RunConfig, initial_arrays: Sequence[np.ndarray] | None = None,
                 results_dir: str | Path | None = None) -> None:
        super().__init__(cfg, initial_arrays, results_dir)
        self.delta = float("inf")  # delta^k of the round (set by attention)
        self.fedacs_counts = {"dropped_nonpositive": 0, "consensus_uniform": 0}
        self._round_uniform = 0  # newcomer rows of the last attention() call given the mean

    def threshold(self) -> float:
        """delta^k over the similarity matrix of the stored models."""
        seen = np.flatnonzero(self.matrix.seen)
        if len(seen) == 0:
            return float("inf")
        return quantile_threshold(self.matrix.cosine(seen, seen),
                                  float(self.params.pick_ratio))

    def attention(self, rows: np.ndarray, server_round: int) -> np.ndarray:
        peers = self.peers()
        cosine = self.matrix.cosine(rows)
        self.delta = self.threshold()
        xi = fedacs_weights(cosine, rows, peers, self.delta)
        newcomers = ~self.matrix.seen[rows]
        self._round_uniform = 0
        if newcomers.any() and peers.any():
            xi[newcomers] = consensus_weights(cosine[newcomers], peers)
            self._round_uniform = int(consensus_fallback(cosine[newcomers], peers).sum())
            if self._round_uniform:
                self.fedacs_counts["consensus_uniform"] += self._round_uniform
                self.warn_once(
                    "consensus-uniform", "[flower-pfl] fedacs round %d: %d never-trained "
                    "client(s) start from the plain mean of the %d stored models: the initial "
                    "model has cosine <= 0 to every one of them (an all-zero initial model, "
                    "e.g. model: scalar, has cosine 0 to everything), so there is no "
                    "similarity to weight their consensus by (server.csv: consensus_uniform)",
                    server_round, self._round_uniform, int(peers.sum()))
        return xi

    def prepare_round(self, server_round: int, sampled: list[int]) -> None:
        super().prepare_round(server_round, sampled)
        assert self.last_xi is not None, "super().prepare_round set this round's weights"
        rows, xi = self.last_xi
        peers = (xi > 0).sum(axis=1) - (xi[np.arange(len(rows)), rows] > 0)
        share, off = selection_share(xi, rows, self.peers(), ~self.matrix.seen[rows])
        known = self.matrix.seen[rows]
        dropped = int(fedacs_dropped(self.matrix.cosine(rows[known]), rows[known],
                                     self.peers(), self.delta).sum())
        self.fedacs_counts["dropped_nonpositive"] += dropped
        if dropped and first_time(self.warned, "dropped-nonpositive"):
            log(INFO, "[flower-pfl] fedacs round %d: delta = %.4g < 0, so eq. 4 selects %d "
                "pair(s) with s_ij <= 0; they are dropped (u_i stays a convex combination: "
                "docs/algorithms/fedacs.md; server.csv: dropped_nonpositive)", server_round,
                self.delta, dropped)
        self.log_server(delta=self.delta, peers_mean=float(peers.mean()),
                        peers_min=int(peers.min()), peers_max=int(peers.max()),
                        selection_share=share, dropped_nonpositive=dropped,
                        consensus_uniform=self._round_uniform)
        if off:
            p = float(self.params.pick_ratio)
            fix = ("lower hyper.fedacs.pick-ratio: delta is above every peer's similarity, so "
                   "FedACS is running as Local training" if off == "only itself" else
                   "raise hyper.fedacs.pick-ratio: delta is below every peer's similarity, so "
                   "FedACS is running as a similarity-weighted FedAvg")
            self.warn_once(off, "[flower-pfl] fedacs round %d: every sampled client selected %s "
                           "(pick-ratio %g, delta %.4g); %s", server_round, off, p, self.delta, fix)
        self.results.log_table("peers", [
            {"round": server_round, "partition-id": int(pid), "peers": int(k),
             "newcomer": bool(not self.matrix.seen[pid])} for pid, k in zip(rows, peers)])

    def report_run_end(self, rows: list[dict[str, Any]], trained: dict[str, float] | None,
                       evaluated: dict[int, str] | None = None) -> None:
        """The mechanism line and summary.json's ``mechanism`` name the run's dropped
        non-positive pairs and plain-mean newcomers when there were any; summary.json's
        ``fedacs`` holds both totals."""
        counts = self.fedacs_counts
        notes = [f"{counts['dropped_nonpositive']} pair(s) with delta < s_ij <= 0 dropped"
                 if counts["dropped_nonpositive"] else "",
                 f"{counts['consensus_uniform']} never-trained client-round(s), fit or "
                 "evaluation, given the plain mean of the stored models (the initial model "
                 "has cos <= 0 to every one)"
                 if counts["consensus_uniform"] else ""]
        note = "; ".join(n for n in notes if n)
        base = self.entry.mechanism  # the contract's (catalog/fedacs.py), without a note
        assert base is not None, "FedACS's contract declares its mechanism"
        self.mechanism = Mechanism(base.name, base.what + (f" ({note})" if note else ""),
                                   base.otherwise, base.hint)
        self.results.set_summary("fedacs", dict(counts))
        super().report_run_end(rows, trained, evaluated)  # (strategies/evaluation.py)

    def save_attention(self, server_round: int) -> np.ndarray | None:
        counted = dict(self.fedacs_counts)  # the saved matrix is no client's start
        xi = super().save_attention(server_round)
        self.fedacs_counts = counted
        if xi is not None:
            self.results.save_matrix("selection", (xi > 0).astype(np.float64))
        return xi
