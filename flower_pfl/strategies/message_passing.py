"""Shared server plumbing of attentive message passing (FedAMP, HeurFedAMP, FedACS).

The server keeps the latest uploaded model w_i of every client, by partition-id, as a
row of ONE :class:`~flower_pfl.model_store.ModelStore` (with its incrementally updated
Gram matrix; in memory, or in a file under ``<results>/state/`` when n x d exceeds
``server.memory-budget-mb``: the choice is logged once).  Each round it computes, for the
sampled clients only, a weight matrix ``Xi`` (s x n) from the pairwise matrix rows
(``attention``, implemented per paper) and their personalized models ``U = Xi @ W`` in
one pass over the stored rows, and sends each client ITS u_i.  Uploads reach
``aggregate_updates`` serialised and are decoded and stored one at a time, then the Gram
rows of the round's clients are refreshed in one pass.  Evaluation-time cloud models are
computed in blocks of clients that fit the store's output budget.  A checkpoint pins the
store's file instead of pickling its rows (see flower_pfl/model_store.py).

Clients that have never uploaded are represented by the initial model (their W^0
column) and are not used as peers until they upload.  For evaluation, a client without a
personal model yet receives its u_i; the others evaluate their own w_i (FedACS;
FedAMP/HeurFedAMP with ``hyper.<strategy>.evaluate: personal``) -- or, with
``evaluate: cloud`` (the FedAMP/HeurFedAMP default), every client evaluates the
cloud model u_i the server would send it next round (one (n x n) @ (n x d) product per
evaluated round): w_i is one local epoch past u_i and carries that epoch's SGD noise,
u_i averages it out (docs/algorithms/fedamp.md, "Which model is scored").

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
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from flwr.common import EvaluateRes, Scalar
from flwr.common.logger import log
from flwr.server.client_proxy import ClientProxy

from flower_pfl.algorithms.attention import peak_over_mean
from flower_pfl.config import RunConfig
from flower_pfl.instructions import ReceivedModel
from flower_pfl.model_store import ModelStore, plan_from_config
from flower_pfl.store_rows import RowMatrix
from flower_pfl.strategies.base import PersonalizedStrategy
from flower_pfl.strategies.federation import ClientUpdate

#: the store's file and the scratch files of large cloud models, under the results folder
STATE_DIR = "state"


class MessagePassingStrategy(PersonalizedStrategy):
    has_global_model = False
    #: name under which the last round's weight matrix is saved (npy + png)
    matrix_name = "attention"
    #: a stored model further from the initial model than this many times the median
    #: distance of the stored models is no one's peer (see the module docstring)
    outlier_factor = 10.0

    #: the largest federation whose last n x n weight matrix is saved (save_attention):
    #: 1,000 clients = 8 MB; 10,000 would be 0.8 GB on disk and ~10 GB to draw
    saved_matrix_limit = 1000

    #: uploads are decoded one at a time into the store (strategies/base.py)
    lazy_uploads = True
    # checkpointed: nothing of its own -- the ModelStore is in the base's ClientStore (its
    # file pinned, not pickled: save_checkpoint); the cloud models are per-round scratch

    def __init__(self, cfg: RunConfig, initial_arrays: Sequence[np.ndarray] | None = None,
                 results_dir: str | Path | None = None) -> None:
        super().__init__(cfg, initial_arrays, results_dir)
        # this round's cloud models u_i of the sampled clients (prepare_round .. aggregate)
        self.cloud: RowMatrix | None = None
        self.cloud_index: dict[int, int] = {}
        self.last_xi: tuple[np.ndarray, np.ndarray] | None = None  # (rows, Xi) of the round
        self.reset_eval_cache()

    def reset_eval_cache(self) -> None:
        """Forget the evaluation round's weights and cloud models (up to n x d floats)."""
        self._eval_key: tuple[int, bool] | None = None
        self._eval_need: np.ndarray | None = None
        self._eval_xi: np.ndarray | None = None
        self._eval_block: int | None = None
        self._eval_rows: RowMatrix | None = None

    def setup(self, initial_arrays: list[np.ndarray]) -> None:
        reference = self.spec.flatten(initial_arrays)
        plan = plan_from_config(self.cfg.values, self.num_clients, reference.shape[0])
        self.store.matrix = ModelStore(self.num_clients, reference, plan, self.state_dir)
        log(INFO, "[flower-pfl] model store: %s, %s: %s", plan.backend, plan.dtype, plan.reason)

    @property
    def state_dir(self) -> Path:
        return self.results.dir / STATE_DIR

    # --------------------------------------------------------------- per-paper part
    def attention(self, rows: np.ndarray, server_round: int) -> np.ndarray:
        """Weights Xi (len(rows) x n) for the clients in ``rows``."""
        raise NotImplementedError

    # -------------------------------------------------------------------- plumbing
    @property
    def matrix(self) -> ModelStore:
        return self.store.matrix

    def peers(self) -> np.ndarray:
        """Clients whose stored model may be mixed into others' models."""
        seen = self.matrix.seen
        if seen.sum() < 3:
            return seen.copy()
        drift = self.matrix.drift()
        limit = self.outlier_factor * float(np.median(drift[seen]))
        return seen & (drift <= limit)

    def prepare_round(self, server_round: int, sampled: list[int]) -> None:
        rows = np.asarray(sampled, dtype=np.int64)
        started = time.perf_counter()
        xi = self.attention(rows, server_round)
        self.close_cloud()
        # U_S = Xi_S W: one pass over the stored rows (a scratch file when large, on disk)
        self.cloud = self.matrix.combine_rows(xi, self.state_dir / "cloud-fit.bin")
        self.cloud_index = {pid: k for k, pid in enumerate(sampled)}
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

    def fit_payload(self, pid: int, server_round: int
                    ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        assert self.cloud is not None, "prepare_round computed this round's cloud models"
        return (self.spec.unflatten(self.cloud.row(self.cloud_index[pid])),
                self.fit_config(pid, server_round))

    def close_cloud(self) -> None:
        if self.cloud is not None:
            self.cloud.close()
        self.cloud, self.cloud_index = None, {}

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> None:
        for u in updates:  # decoded one at a time (u.arrays is lazy: strategies/base.py)
            self.matrix.write(u.pid, self.spec.flatten(u.arrays), server_round)
        self.matrix.refresh()  # only these Gram rows/columns: one pass over the stored rows
        self.close_cloud()

    def eval_payload(self, pid: int, server_round: int
                     ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        # FedAMP's and HeurFedAMP's ``evaluate`` (FedACS has none: its own rule)
        cloud = getattr(self.params, "evaluate", None) == "cloud" and bool(self.matrix.seen.any())
        if not cloud and self.matrix.seen[pid]:
            return [], {}  # the client evaluates its own personalized model w_i
        if self._eval_key != (server_round, cloud):
            # cloud: next round's u_i of every client, from this round's stored models;
            # else the u_i of every never-trained client; weights once per round ...
            need = (np.arange(self.num_clients) if cloud
                    else np.flatnonzero(~self.matrix.seen))
            self._eval_xi = self.attention(need, server_round + 1 if cloud else server_round)
            self._eval_key, self._eval_need, self._eval_block = (server_round, cloud), need, None
        # ... the models in blocks of clients that fit the store's output budget
        assert self._eval_need is not None and self._eval_xi is not None  # set just above
        k = int(np.searchsorted(self._eval_need, pid))
        per = self.matrix.rows_per_output()
        block = k // per
        if self._eval_block != block:
            if self._eval_rows is not None:
                self._eval_rows.close()
            self._eval_rows = self.matrix.combine_rows(self._eval_xi[block * per:(block + 1) * per],
                                                       self.state_dir / "cloud-eval.bin")
            self._eval_block = block
        assert self._eval_rows is not None  # this block's, computed above or before
        arrays = self.spec.unflatten(self._eval_rows.row(k - block * per))
        return arrays, (ReceivedModel(evaluate_received=True).to_config() if cloud else {})

    def aggregate_evaluate(self, server_round: int,
                           results: list[tuple[ClientProxy, EvaluateRes]],
                           failures: list[Any]) -> tuple[float | None, dict[str, Scalar]]:
        # evaluation-only cloud models (up to n x d floats): not state, not kept
        if self._eval_rows is not None:
            self._eval_rows.close()
        self.reset_eval_cache()
        out = super().aggregate_evaluate(server_round, results, failures)
        if server_round >= self.cfg["rounds"] and self.matrix.seen.any():
            self.save_attention(server_round)
        return out

    # ------------------------------------------------------------- checkpoint/resume
    def save_checkpoint(self, server_round: int) -> Path:
        """The store's file is the checkpoint of its rows: pinned, not pickled."""
        self.matrix.pin()
        folder = super().save_checkpoint(server_round)
        self.matrix.release_old_pins()
        return folder

    def restore_state(self, state: dict[str, Any]) -> None:
        super().restore_state(state)
        log(INFO, "[flower-pfl] %s", self.matrix.attach(self.state_dir))

    def save_attention(self, server_round: int) -> np.ndarray | None:
        """The full n x n weight matrix -> npy + PNG heatmap, up to
        :attr:`saved_matrix_limit` clients (None above: not computed, a line says so)."""
        n = self.num_clients
        if n > self.saved_matrix_limit:
            log(INFO, "[flower-pfl] %s.npy/.png not written: the %d x %d weight matrix (%.1f GB "
                "as float64, a %d-megapixel figure) is over the %d clients this strategy "
                "writes it for", self.matrix_name, n, n, n * n * 8 / 1e9, n * n // 10**6,
                self.saved_matrix_limit)
            return None
        xi = self.attention(np.arange(n), server_round)
        self.results.save_matrix(self.matrix_name, xi)
        return xi
