"""IFCA -- Ghosh, Chung, Yin & Ramchandran, "An Efficient Framework for Clustered Federated
Learning", NeurIPS 2020, Algorithm 2 with model averaging (server side).

The server holds k cluster models theta_1..theta_k (``clusters``) and sends every sampled
client all k, in order (``IFCAInstruction``: k).  Each client estimates its cluster
(line 5: the lowest loss on its training data), trains that model and uploads it with the
index it chose (``IFCAReply``; clients/ifca.py).  The server then sets each cluster's model
to the sample-weighted mean of the uploads that chose it (line 12,
:func:`~flower_pfl.algorithms.ifca_math.cluster_means`); a cluster nobody chose keeps its
model.  There is no single global model: evaluation sends all k models and each client
scores the one of lowest training loss (the paper's test-time estimation).

Choices the paper leaves open (docs/algorithms/ifca.md): cluster 0 starts at the run's
initial model, cluster j >= 1 at a re-initialisation of the same architecture under the
seed (seed, j) (the paper: "random initialization"); uploads weighted by sample count.

The download is k models, the upload one: ``upload_problem`` holds each upload's update
norm (``max-update-norm``) to the model of the cluster it names, not to the whole download.
server.csv: ``cluster_counts`` (how many uploads chose each cluster, in order).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from flwr.common import FitRes, Scalar

from flower_pfl.algorithms.ifca_math import cluster_means
from flower_pfl.catalog import ifca as catalog
from flower_pfl.catalog.ifca import IFCAInstruction, IFCAReply
from flower_pfl.config import RunConfig
from flower_pfl.instructions import WireError
from flower_pfl.registry import strategy_for
from flower_pfl.reliability.upload_checks import flat
from flower_pfl.reliability.uploads import UploadTemplate
from flower_pfl.strategies.base import PersonalizedStrategy
from flower_pfl.strategies.federation import ClientUpdate


@strategy_for(catalog.IFCA)
class IFCA(PersonalizedStrategy):
    has_global_model = False
    params: catalog.IFCAParams
    checkpointed: tuple[str, ...] = ("clusters",)

    def __init__(self, cfg: RunConfig, initial_arrays: Sequence[np.ndarray] | None = None,
                 results_dir: str | Path | None = None) -> None:
        super().__init__(cfg, initial_arrays, results_dir)
        self.clusters: list[list[np.ndarray]] = []  # k models, each in get_arrays order

    def setup(self, initial_arrays: list[np.ndarray]) -> None:
        from flower_pfl.learning.models import model_for, set_arrays  # torch: here only

        model = model_for(self.cfg)  # type: ignore[arg-type]  # RunConfig, read by key
        set_arrays(model, initial_arrays)
        self.clusters = seeded_models(model, self.params.clusters, int(self.cfg["seed"]))

    def download(self) -> list[np.ndarray]:
        """The k cluster models, one after the other (what fit and evaluation send)."""
        return [a for model in self.clusters for a in model]

    def fit_payload(self, pid: int, server_round: int
                    ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        return self.download(), IFCAInstruction(clusters=len(self.clusters)).to_config()

    def eval_payload(self, pid: int, server_round: int
                     ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        return self.fit_payload(pid, server_round)

    def upload_problem(self, pid: int, arrays: list[np.ndarray], res: FitRes,
                       template: UploadTemplate, max_norm: float | None) -> str | None:
        try:
            chosen = IFCAReply.from_config(res.metrics).cluster
        except WireError as exc:
            return str(exc)
        if not 0 <= chosen < len(self.clusters):
            return f"cluster index {chosen} outside [0, {len(self.clusters)})"
        if max_norm is not None:  # the update is against the cluster model it trained
            self._sent[pid] = flat(self.clusters[chosen])
        return super().upload_problem(pid, arrays, res, template, max_norm)

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> None:
        choices = [IFCAReply.from_config(u.metrics).cluster for u in updates]
        self.clusters = cluster_means(self.clusters, [u.arrays for u in updates], choices,
                                      [u.num_examples for u in updates])
        self.log_server(cluster_counts=" ".join(
            str(choices.count(j)) for j in range(len(self.clusters))))


def seeded_models(model: object, k: int, seed: int) -> list[list[np.ndarray]]:
    """k initial models: ``model``'s arrays first, then k - 1 re-initialisations of it
    (each submodule's ``reset_parameters`` under the torch seed drawn from (seed, j); the
    global torch RNG untouched).  A parameter no submodule resets (a model's own root
    parameter) stays as in ``model`` in every cluster."""
    import torch

    from flower_pfl.learning.models import get_arrays

    assert isinstance(model, torch.nn.Module)
    out = [get_arrays(model)]
    for j in range(1, k):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(np.random.SeedSequence([seed, j]).generate_state(1)[0]))
            for module in model.modules():
                reset = getattr(module, "reset_parameters", None)
                if callable(reset):
                    reset()
        out.append(get_arrays(model))
    return out
