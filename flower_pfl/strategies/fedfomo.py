"""FedFomo -- Zhang, Sapra, Fidler, Yeung & Alvarez, ICLR 2021, Algorithm 1 (server side).

The server keeps the latest uploaded model of every client (the ModelStore of
:class:`~flower_pfl.strategies.message_passing.MessagePassingStrategy`: in memory or on
disk, checkpointed by pinning) and an affinity matrix P (n x n, ``affinity``): P_ij adds
up the weights client i gave peer j.  Each round it sends a sampled client i M stored peer
models (``peers``), chosen epsilon-greedily: each slot is a uniformly random peer with
probability ``epsilon``, else the peer of highest P_ij (ties: the lowest partition-id);
never i itself, never a peer the store marks diverged (``peers()``).  The client weighs them
on its validation split, starts from its first-order update and trains (clients/fedfomo.py);
its upload replaces its stored model and its reported weights are added to row i of P.

Evaluation: a client with a stored model evaluates its own (nothing sent); one without
gets its M peers of highest affinity (no exploration) and evaluates their first-order
update of the initial model (its newcomer rule).  ``max-update-norm`` holds an upload to
the client's previous stored model (the initial one before its first upload).  The last
round's P is saved as the message-passing strategies' weight matrix,
``attention.npy`` / ``.png``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from flwr.common import FitRes, Scalar

from flower_pfl.catalog import fedfomo as catalog
from flower_pfl.catalog.fedfomo import FedFomoFit, FedFomoReply
from flower_pfl.config import RunConfig
from flower_pfl.instructions import WireError
from flower_pfl.registry import strategy_for
from flower_pfl.reliability.uploads import UploadTemplate
from flower_pfl.strategies.federation import ClientUpdate
from flower_pfl.strategies.message_passing import MessagePassingStrategy


def weights_of(reply: FedFomoReply) -> list[float]:
    """The reported peer weights, in the order the peers were sent."""
    return [float(w) for w in reply.peer_weights.split(",") if w]


@strategy_for(catalog.FEDFOMO)
class FedFomo(MessagePassingStrategy):
    params: catalog.FedFomoParams
    checkpointed: tuple[str, ...] = ("affinity",)

    def __init__(self, cfg: RunConfig, initial_arrays: Sequence[np.ndarray] | None = None,
                 results_dir: str | Path | None = None) -> None:
        super().__init__(cfg, initial_arrays, results_dir)
        self.affinity = np.zeros((self.num_clients, self.num_clients), dtype=np.float64)
        self.chosen: dict[int, list[int]] = {}  # this round's peers of each sampled client

    def choose_peers(self, pid: int, explore: bool = True) -> list[int]:
        """Up to M stored peers for ``pid``: epsilon-greedy over row pid of P (``explore``
        False: the greedy choice alone)."""
        left = [int(j) for j in np.flatnonzero(self.peers()) if j != pid]
        chosen: list[int] = []
        for _ in range(min(self.params.peers, len(left))):
            if explore and self.rng.random() < self.params.epsilon:
                j = left[int(self.rng.integers(len(left)))]
            else:  # highest affinity; a tie: the lowest partition-id (left is sorted)
                j = max(left, key=lambda c: (self.affinity[pid, c], -c))
            chosen.append(j)
            left.remove(j)
        return chosen

    def attention(self, rows: np.ndarray, server_round: int) -> np.ndarray:
        """Rows of P (saved at the end of the run as the strategy's weight matrix)."""
        return self.affinity[np.asarray(rows, dtype=np.int64)]

    def prepare_round(self, server_round: int, sampled: list[int]) -> None:
        self.chosen = {pid: self.choose_peers(pid) for pid in sampled}
        self.log_server(peers_sent=float(np.mean([len(c) for c in self.chosen.values()]))
                        if self.chosen else 0.0)

    def download(self, peers: list[int]) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        arrays = [a for j in peers for a in self.spec.unflatten(self.matrix.model(j))]
        return arrays, FedFomoFit(peer_ids=",".join(map(str, peers)),
                                  val_fraction=self.params.val_fraction).to_config()

    def fit_payload(self, pid: int, server_round: int
                    ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        return self.download(self.chosen[pid])

    def eval_payload(self, pid: int, server_round: int
                     ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        if self.matrix.seen[pid]:
            return [], {}  # the client evaluates its own model
        return self.download(self.choose_peers(pid, explore=False))

    def upload_problem(self, pid: int, arrays: list[np.ndarray], res: FitRes,
                       template: UploadTemplate, max_norm: float | None) -> str | None:
        try:
            weights = weights_of(FedFomoReply.from_config(res.metrics))
        except (WireError, ValueError) as exc:
            return f"its peer weights cannot be read: {exc}"
        sent = len(self.chosen.get(pid, []))
        if len(weights) != sent or not all(np.isfinite(weights)) or min(weights, default=0) < 0:
            return f"{len(weights)} peer weight(s) {weights[:5]} for the {sent} peer(s) sent"
        if max_norm is not None:  # the update is against its previous model
            self._sent[pid] = self.matrix.model(pid).astype(np.float64)
        return super().upload_problem(pid, arrays, res, template, max_norm)

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> None:
        for u in updates:
            weights = weights_of(FedFomoReply.from_config(u.metrics))
            for j, w in zip(self.chosen[u.pid], weights):
                self.affinity[u.pid, j] += w
        super().aggregate_updates(server_round, updates)

    def mechanism_used(self, update: ClientUpdate, carried: bool) -> bool:
        """The client moved its model towards a peer (a positive weight)."""
        return sum(weights_of(FedFomoReply.from_config(update.metrics))) > 0
