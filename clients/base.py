"""Plumbing shared by every client, written once.

:class:`PFLClient` is a ``NumPyClient`` that knows its ``partition-id`` (from the node
config), reads the run configuration sent by the server with every message, loads its
local train/test split, builds models on the configured device and keeps personal state
in ``context.state`` through :class:`ClientState` (which survives rounds in simulation
and deployment; module globals do not).

Subclasses implement ``fit_round`` (what one round of local training is) and
``personal_model`` (what is evaluated as this client's personalized model).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch.nn import functional as F
from flwr.client import NumPyClient
from flwr.common import ArrayRecord, ConfigRecord, Context, NDArrays, Scalar

from flower_pfl.config import RunConfig
from flower_pfl.data import ClientData, load_client_data
from flower_pfl.models import NamedLayers, get_arrays, model_for, resolve_device, set_arrays
from flower_pfl.training import TrainSpec, evaluate, gaussian_nll, train


class ClientState:
    """Typed access to ``context.state`` (a RecordDict): arrays and small value dicts.

    With ``disk_dir`` (the node's ``state-dir``, per run and partition) every write also
    goes to the client machine's disk and a key missing from ``context.state`` is read
    back from there -- so a SuperNode restarted mid-run gets its personal state back
    instead of a fresh model.
    """

    def __init__(self, record_dict, disk_dir: str | Path | None = None) -> None:
        self.records = record_dict
        self.disk = Path(disk_dir) if disk_dir else None

    def _restore(self, key: str) -> bool:
        if self.disk is None:
            return False
        arrays, values = self.disk / f"{key}.npz", self.disk / f"{key}.json"
        if arrays.is_file():
            with np.load(arrays) as z:
                self.records[key] = ArrayRecord([z[f"a{i}"] for i in range(len(z.files))])
            return True
        if values.is_file():
            self.records[key] = ConfigRecord(OrderedDict(json.loads(values.read_text())))
            return True
        return False

    def _write(self, key: str, suffix: str, write) -> None:
        if self.disk is None:
            return
        self.disk.mkdir(parents=True, exist_ok=True)
        tmp = self.disk / f".{key}.tmp{suffix}"
        write(tmp)
        os.replace(tmp, self.disk / f"{key}{suffix}")  # atomic: a crash leaves the old copy

    def get_arrays(self, key: str) -> list[np.ndarray] | None:
        if key not in self.records and not self._restore(key):
            return None
        return [a.copy() for a in self.records[key].to_numpy_ndarrays()]

    def set_arrays(self, key: str, arrays: Sequence[np.ndarray]) -> None:
        arrays = [np.ascontiguousarray(a) for a in arrays]
        self.records[key] = ArrayRecord(arrays)

        def write(path: Path) -> None:
            with open(path, "wb") as fh:
                np.savez(fh, **{f"a{i}": a for i, a in enumerate(arrays)})
        self._write(key, ".npz", write)

    def get_values(self, key: str) -> dict[str, Any] | None:
        if key not in self.records and not self._restore(key):
            return None
        return dict(self.records[key])

    def set_values(self, key: str, values: Mapping[str, Any]) -> None:
        self.records[key] = ConfigRecord(OrderedDict(values))
        self._write(key, ".json", lambda path: path.write_text(json.dumps(dict(values))))

    def __contains__(self, key: str) -> bool:
        return key in self.records or self._restore(key)


_CFG_CACHE: dict[str, RunConfig] = {}


def parse_run_config(text: str) -> RunConfig:
    if text not in _CFG_CACHE:
        _CFG_CACHE.clear()
        _CFG_CACHE[text] = RunConfig.from_json(text)
    return _CFG_CACHE[text]


class PFLClient(NumPyClient):
    """Base NumPyClient: identity, configuration, data, device, state, evaluation."""

    def __init__(self, context: Context) -> None:
        self.ctx = context
        if "partition-id" not in context.node_config:
            raise RuntimeError("this node has no 'partition-id' in its node config; start the "
                               "SuperNode with --node-config 'partition-id=<i> num-partitions=<n>'")
        self.pid = int(context.node_config["partition-id"])
        self.data_root = context.node_config.get("data-root") or os.environ.get("FLOWER_PFL_DATA")
        state_dir = context.node_config.get("state-dir")
        self.state = ClientState(context.state, Path(str(state_dir)) / f"run-{context.run_id}" /
                                 f"partition-{self.pid}" if state_dir else None)
        self.cfg: RunConfig | None = None
        self.data: ClientData | None = None
        self.device = torch.device("cpu")
        self.spec: TrainSpec | None = None

    # ------------------------------------------------------------------ subclass hooks
    def fit_round(self, parameters: NDArrays, config: Mapping[str, Scalar]
                  ) -> tuple[NDArrays, dict[str, Scalar]]:
        """One round of local training; returns (arrays to upload, metrics)."""
        raise NotImplementedError

    def personal_model(self, parameters: NDArrays, config: Mapping[str, Scalar]) -> NamedLayers:
        """The model evaluated as this client's personalized model."""
        raise NotImplementedError

    # ------------------------------------------------------------------ Flower methods
    def get_properties(self, config: Mapping[str, Scalar]) -> dict[str, Scalar]:
        return {"partition-id": self.pid}

    def fit(self, parameters: NDArrays, config: Mapping[str, Scalar]):
        self.setup(config)
        arrays, metrics = self.fit_round(parameters, config)
        meta = self.state.get_values("meta") or {"fit-rounds": 0}
        meta["fit-rounds"] = int(meta["fit-rounds"]) + 1  # survives rounds: context.state
        meta["last-round"] = self.round
        self.state.set_values("meta", meta)
        metrics = {"partition-id": self.pid, **metrics}
        return arrays, self.data.num_train, metrics

    def evaluate(self, parameters: NDArrays, config: Mapping[str, Scalar]):
        self.setup(config)
        model = self.personal_model(parameters, config)
        loss, score = self.test(model)
        meta = self.state.get_values("meta") or {"fit-rounds": 0}
        metric = self.data.metric  # "accuracy", or "mse" for the synthetic Gaussian task
        metrics: dict[str, Scalar] = {"partition-id": self.pid, metric: score,
                                      "num-train": self.data.num_train,
                                      "fit-rounds": int(meta["fit-rounds"])}
        if config.get("eval-global") and parameters:
            g_loss, g_score = self.test(self.new_model(parameters))
            metrics.update({f"global_{metric}": g_score, "global_loss": g_loss})
        return loss, self.data.num_test, metrics

    # ------------------------------------------------------------------------ helpers
    def setup(self, config: Mapping[str, Scalar]) -> None:
        self.cfg = parse_run_config(str(config["cfg"]))
        self.data = load_client_data(self.cfg.values, self.pid, self.data_root)
        self.device = resolve_device(self.cfg["device"])
        self.spec = TrainSpec.from_config(self.cfg)
        self.round = int(config.get("round", 0))

    def new_model(self, arrays: Sequence[np.ndarray] | None = None) -> NamedLayers:
        model = model_for(self.cfg)
        if arrays is not None and len(arrays):
            set_arrays(model, arrays)
        return model.to(self.device)

    def generator(self, salt: int = 0) -> torch.Generator:
        """Seeded per (run seed, client, round): reproducible mini-batch orders."""
        g = torch.Generator()
        g.manual_seed(hash((self.cfg["seed"], self.pid, self.round, salt)) & 0x7FFFFFFF)
        return g

    def local_train(self, model: NamedLayers, regularizer=None, num_steps: int | None = None,
                    salt: int = 0, lr: float | None = None) -> dict[str, float]:
        loss_fn = F.cross_entropy if self.data.task == "classification" else \
            gaussian_nll(self.data.noise_sq)
        return train(model, self.data.x_train, self.data.y_train, self.spec,
                     self.generator(salt), self.device, regularizer=regularizer,
                     num_steps=num_steps, lr=lr, loss_fn=loss_fn)

    def test(self, model: NamedLayers) -> tuple[float, float]:
        """(loss, metric): accuracy for images; for the Gaussian task the mean NLL on the
        test samples and the squared error of theta to the client's true theta_m."""
        if self.data.task == "classification":
            return evaluate(model, self.data.x_test, self.data.y_test, self.device)
        with torch.no_grad():
            theta = float(model.theta.detach().cpu()[0])
            nll = float(((theta - self.data.y_test) ** 2).mean() / (2 * self.data.noise_sq))
        return nll, (theta - self.data.theta_true) ** 2

    def save_personal(self, model: NamedLayers, key: str = "personal") -> None:
        self.state.set_arrays(key, get_arrays(model))

    def load_personal(self, key: str = "personal") -> NamedLayers | None:
        arrays = self.state.get_arrays(key)
        return None if arrays is None else self.new_model(arrays)


class PersonalStateClient(PFLClient):
    """Clients whose personalized model lives in ``context.state`` between rounds.

    ``fit_round`` starts from the model the server sent (e.g. FedAMP's u_i, FedACS'
    intermediate model), runs local SGD on the data loss plus ``regularizer`` (none by
    default), keeps the result as the personalized model and uploads it.  Evaluation
    uses the stored personal model; a client that has never trained yet evaluates what
    the server sent (its cloud/intermediate model), or its initial model.
    """

    def regularizer(self, model: NamedLayers, config: Mapping[str, Scalar]):
        """Extra loss term ``f(model) -> tensor`` built once per round, or None."""
        return None

    def fit_round(self, parameters, config):
        model = self.new_model(parameters)
        metrics = self.local_train(model, regularizer=self.regularizer(model, config))
        self.save_personal(model)
        return get_arrays(model), metrics

    def personal_model(self, parameters, config):
        model = self.load_personal()
        if model is not None:
            return model
        return self.new_model(parameters if parameters else None)
