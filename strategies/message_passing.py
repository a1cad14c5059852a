"""Shared server plumbing of attentive message passing (FedAMP, HeurFedAMP, FedACS).

The server keeps the latest uploaded model w_i of every client, by partition-id, as a
row of ONE :class:`~flower_pfl.params.ModelMatrix` (with its incrementally updated Gram
matrix).  Each round it computes, for the sampled clients only, a weight matrix
``Xi`` (s x n) from the pairwise matrix rows (``attention``, implemented per paper) and
their personalized models ``U = Xi @ W`` in one matrix product, and sends each client
ITS u_i.

Clients that have never uploaded are represented by the initial model (their W^0
column) and are not used as peers until they upload.  For evaluation, a client without a
personal model yet receives its u_i; the others evaluate their own w_i (FedACS;
FedAMP/HeurFedAMP with ``hyper.<strategy>.evaluate: personal``) -- or, with
``evaluate: cloud`` (the FedAMP/HeurFedAMP default), every client evaluates the
cloud model u_i the server would send it next round (one (n x n) @ (n x d) product per
evaluated round): w_i is one local epoch past u_i and carries that epoch's SGD noise,
u_i averages it out (docs/algorithms/fedamp.md, issue 13).

Robustness (a choice of ours, not the papers'): a stored model whose distance from the
initial model exceeds ``outlier_factor`` times the median of the stored models'
distances (a client whose local training diverged without producing NaN/Inf, which the
upload check refuses) is not used as anyone's peer until it comes back in range:
cosine attention (HeurFedAMP, FedACS) is blind to a model's scale, and even a small
weight on a huge model drags every cloud model that mixes it in.  The client's own row
is kept (its u_i still starts from its own w_i); the excluded partition-ids are logged.
"""

from __future__ import annotations

import time
from logging import WARNING
from typing import Any

import numpy as np
from flwr.common.logger import log

from flower_pfl.attention import peak_over_mean
from flower_pfl.params import ModelMatrix
from strategies.base import ClientUpdate, PersonalizedStrategy


class MessagePassingStrategy(PersonalizedStrategy):
    has_global_model = False
    #: name under which the last round's weight matrix is saved (npy + png)
    matrix_name = "attention"
    #: a stored model further from the initial model than this many times the median
    #: distance of the stored models is no one's peer (see the module docstring)
    outlier_factor = 10.0

    def setup(self, initial_arrays):
        self.store.matrix = ModelMatrix(self.num_clients, self.spec.flatten(initial_arrays))
        self.cloud: dict[int, np.ndarray] = {}

    # --------------------------------------------------------------- per-paper part
    def attention(self, rows: np.ndarray, server_round: int) -> np.ndarray:
        """Weights Xi (len(rows) x n) for the clients in ``rows``."""
        raise NotImplementedError

    def fit_config(self, pid: int, server_round: int) -> dict[str, Any]:
        """Extra config for the client (e.g. FedAMP's prox weight lambda/alpha_k)."""
        return {}

    # -------------------------------------------------------------------- plumbing
    @property
    def matrix(self) -> ModelMatrix:
        return self.store.matrix

    def peers(self) -> np.ndarray:
        """Clients whose stored model may be mixed into others' models."""
        seen = self.matrix.seen
        if seen.sum() < 3:
            return seen.copy()
        drift = self.matrix.drift()
        limit = self.outlier_factor * float(np.median(drift[seen]))
        return seen & (drift <= limit)

    def prepare_round(self, server_round, sampled):
        rows = np.asarray(sampled, dtype=np.int64)
        started = time.perf_counter()
        xi = self.attention(rows, server_round)
        cloud = self.matrix.combine(xi)  # U_S = Xi_S W: one (s x n) @ (n x d) product
        self.cloud = {pid: cloud[k] for k, pid in enumerate(sampled)}
        self.last_xi = (rows, xi)  # for subclasses that log per-client details
        excluded = np.flatnonzero(self.matrix.seen & ~self.peers())
        if excluded.size:
            log(WARNING, "[flower-pfl] round %d: stored model(s) of partition-id(s) %s are "
                "more than %g x the median distance from the initial model (diverged); not "
                "used as peers", server_round, excluded.tolist(), self.outlier_factor)
        self.log_server(attention_s=round(time.perf_counter() - started, 4),
                        peers=int(self.matrix.seen.sum()), excluded_peers=int(excluded.size),
                        self_weight_mean=float(xi[np.arange(len(rows)), rows].mean()),
                        # ~1 means uniform attention over peers: the mechanism does nothing
                        peak_over_mean=peak_over_mean(xi, rows))

    def fit_payload(self, pid, server_round):
        return self.spec.unflatten(self.cloud[pid]), self.fit_config(pid, server_round)

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> None:
        rows = [u.pid for u in updates]
        vectors = np.stack([self.spec.flatten(u.arrays) for u in updates])
        self.matrix.update(rows, vectors)  # only these Gram rows/columns are recomputed
        self.cloud = {}

    def eval_payload(self, pid, server_round):
        if self.hyper.get("evaluate") == "cloud" and self.matrix.seen.any():
            if getattr(self, "_next_cloud_round", None) != server_round:
                # next round's u_i of every client, from this round's stored models
                self._next_cloud = self.matrix.combine(
                    self.attention(np.arange(self.num_clients), server_round + 1))
                self._next_cloud_round = server_round
            return self.spec.unflatten(self._next_cloud[pid]), {"evaluate-received": True}
        if self.matrix.seen[pid]:
            return [], {}  # the client evaluates its own personalized model w_i
        if getattr(self, "_eval_cloud_round", None) != server_round:
            # cloud models of ALL never-trained clients in one product, once per round
            unseen = np.flatnonzero(~self.matrix.seen)
            cloud = self.matrix.combine(self.attention(unseen, server_round))
            self._eval_cloud = {int(p): cloud[k] for k, p in enumerate(unseen)}
            self._eval_cloud_round = server_round
        return self.spec.unflatten(self._eval_cloud[pid]), {}

    def aggregate_evaluate(self, server_round, results, failures):
        # evaluation-only cloud models (up to n x d floats) are not state: never checkpointed
        for name in ("_next_cloud", "_next_cloud_round", "_eval_cloud", "_eval_cloud_round"):
            self.__dict__.pop(name, None)
        out = super().aggregate_evaluate(server_round, results, failures)
        if server_round >= self.cfg["rounds"] and self.matrix.seen.any():
            self.save_attention(server_round)
        return out

    def save_attention(self, server_round: int) -> np.ndarray:
        """The full n x n weight matrix (weights only: cheap) -> npy + PNG heatmap."""
        xi = self.attention(np.arange(self.num_clients), server_round)
        self.results.save_matrix(self.matrix_name, xi)
        return xi
