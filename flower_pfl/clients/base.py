"""Plumbing shared by every client, written once.

:class:`PFLClient` is a ``NumPyClient`` that knows its ``partition-id`` (from the node
config), reads the run configuration sent by the server with every message, loads its
local train/test split, builds models on the configured device and keeps personal state
in ``context.state`` through :class:`~flower_pfl.clients.state.ClientState` (a fit's
writes are kept only once the server accepts its upload).

Subclasses implement ``fit_round`` (what one round of local training is) and
``personal_model`` (what is evaluated as this client's personalized model); they read the
server's instructions and write their replies through the declarations their strategy
shares (:mod:`flower_pfl.instructions`: ``from_config`` / ``to_config``), never by key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Mapping, Sequence, Union

import numpy as np
import torch
from flwr.app import Context
from flwr.client import NumPyClient  # legacy API: no flwr.clientapp path in Flower 1.42
from flwr.common import NDArrays, Scalar  # (NumPyClient's own types, flwr.common only)
from torch import nn
from torch.nn import functional as F

from flower_pfl import raynode
from flower_pfl.algorithms.prox import Prox
from flower_pfl.clients.state import ClientState
from flower_pfl.config import RunConfig
from flower_pfl.instructions import (
    EvaluateInstruction,
    NewcomerEval,
    NewcomerReply,
    ReceivedModel,
    RoundInstruction,
    SampleLevelReply,
)
from flower_pfl.learning import devices
from flower_pfl.learning.client_data import load_client_data
from flower_pfl.learning.data import ClientData
from flower_pfl.learning.models import (
    NamedLayers,
    get_arrays,
    model_for,
    resolve_device,
    set_arrays,
)
from flower_pfl.learning.splits import unseen_classes
from flower_pfl.learning.training import TrainSpec, dp_train, evaluate, gaussian_nll, train
from flower_pfl.privacy.client_side import is_private, private_upload
from flower_pfl.reliability.uploads import EXTRA_ARRAYS, parse_parts, split_parts
from flower_pfl.reporting.metric_kind import metric_of

_CFG_CACHE: dict[str, RunConfig] = {}
#: the mini-batch order's salt of a newcomer's adaptation (``generator``)
NEWCOMER_SALT = 7

#: a message's config as the client reads it (``FitIns.config`` / ``EvaluateIns.config``)
MessageConfig = Mapping[str, Scalar]
#: a fit's metrics as a client hook returns them (``fit_round``; ``local_train``'s
#: ``dict[str, float]`` is one)
Metrics = Mapping[str, Scalar]
#: the data loss of a local step: (model output, targets) -> scalar tensor
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: an extra term of the local objective (``training.train``): a ``Prox`` (applied as its
#: gradient), a callable ``f(model) -> tensor`` added to the loss, or None
Regularizer = Union[Callable[[nn.Module], torch.Tensor], Prox, None]


def parse_run_config(text: str) -> RunConfig:
    if text not in _CFG_CACHE:
        _CFG_CACHE.clear()
        _CFG_CACHE[text] = RunConfig.from_json(text)
    return _CFG_CACHE[text]


class PFLClient(NumPyClient):
    """Base NumPyClient: identity, configuration, data, device, state, evaluation.

    ``cfg``, ``data`` and ``spec`` are the message's: :meth:`setup` sets them, first thing
    in every ``fit`` and ``evaluate`` (read before it: AttributeError)."""

    ctx: Context
    pid: int  # partition-id (node config)
    data_root: str | None  # the node's data-root, else $FLOWER_PFL_DATA, else data.root
    state: ClientState
    cfg: RunConfig  # the run's validated configuration (setup)
    data: ClientData  # this client's local train/test split (setup)
    device: torch.device
    spec: TrainSpec  # local training's settings at this round's learning rate (setup)
    round: int  # the server round of the message being answered (setup; 0 before)
    eval_steps: int  # local SGD steps personal_model took in this evaluation
    in_fit: bool  # sample-level DP: local training in a fit runs DP-SGD

    def __init__(self, context: Context) -> None:
        self.ctx = context
        if "partition-id" not in context.node_config:
            raise RuntimeError("this node has no 'partition-id' in its node config; start the "
                               "SuperNode with --node-config 'partition-id=<i> num-partitions=<n>'")
        self.pid = int(context.node_config["partition-id"])
        root = context.node_config.get("data-root")
        self.data_root = str(root) if root else os.environ.get("FLOWER_PFL_DATA")
        self.state = ClientState(context.state)  # its disk folder is set in setup()
        self.device = torch.device("cpu")
        self.round = 0
        self.eval_steps = 0
        self.in_fit = False

    # ------------------------------------------------------------------ subclass hooks
    def fit_round(self, parameters: NDArrays, config: MessageConfig
                  ) -> tuple[NDArrays, Metrics]:
        """One round of local training; returns (arrays to upload, metrics)."""
        raise NotImplementedError

    def personal_model(self, parameters: NDArrays, config: MessageConfig) -> NamedLayers:
        """The model evaluated as this client's personalized model."""
        raise NotImplementedError

    def newcomer_start(self, parameters: NDArrays, config: MessageConfig) -> NamedLayers:
        """A held-out newcomer's model before adaptation: the model the server would give it
        (default: what it sent, else the initial model)."""
        return self.new_model(parameters if parameters else None)

    def adapt_newcomer(self, model: NamedLayers, config: MessageConfig, steps: int
                       ) -> NamedLayers:
        """The method's newcomer rule (docs/newcomers.md; declared in its contract's
        ``Entry.newcomer``): ``model`` (:meth:`newcomer_start`'s) adapted with ``steps``
        local SGD steps on the newcomer's own training data; ``config`` is the server's
        newcomer instruction (:class:`~flower_pfl.instructions.NewcomerEval` and the
        method's own declarations).  Default: plain fine-tuning of the model (FedAvg-FT).
        Nothing it writes is kept (:meth:`evaluate_newcomer`)."""
        self.local_train(model, num_steps=steps, salt=NEWCOMER_SALT)
        return model

    # ------------------------------------------------------------------ Flower methods
    def get_properties(self, config: MessageConfig) -> dict[str, Scalar]:
        return {"partition-id": self.pid}

    def fit(self, parameters: NDArrays, config: MessageConfig
            ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        self.setup(config)
        self.state.begin(self.round)  # kept only if the server accepts this round's upload
        try:
            devices.start_fit(self.device)  # CUDA: this fit's peak memory, not the process'
            self.in_fit = True
            try:
                arrays, metrics = self.fit_round(parameters, config)
            finally:
                self.in_fit = False
            if is_private(config):  # client-level DP: clipped (+ its noise share) as it leaves
                arrays, dp_metrics = private_upload(
                    arrays, self.split_download(parameters, config)[0], config)
                metrics = {**metrics, **dp_metrics}
            device = devices.fit_report(self.device)  # where it trained (learning.devices)
            meta = self.state.get_values("meta") or {"fit-rounds": 0}
            meta["fit-rounds"] = int(meta["fit-rounds"]) + 1  # survives rounds: context.state
            meta["last-round"] = self.round
            for key in devices.KEYS:  # the last fit's device, reported with evaluations
                meta.pop(key, None)
            meta.update(device)
            self.state.set_values("meta", meta)
        except BaseException:
            self.state.abort()
            raise
        self.state.end()
        # and, in a simulation on Ray, the node it ran on (flower_pfl.raynode)
        metrics = {"lr": self.spec.lr, **metrics}  # this round's train.lr-schedule rate
        reply: dict[str, Scalar] = {
            "partition-id": self.pid, **metrics, **device, **raynode.node_metrics()}
        return arrays, self.data.num_train, reply

    def evaluate(self, parameters: NDArrays, config: MessageConfig
                 ) -> tuple[float, int, dict[str, Scalar]]:
        self.setup(config)
        self.eval_steps = 0  # local_train counts what personal_model trains (FT, Per-FedAvg)
        sent = NewcomerEval.from_config(config)
        if sent.newcomer:
            return self.evaluate_newcomer(parameters, config, sent)
        model = self.personal_model(parameters, config)
        loss, score = self.test(model)
        meta = self.state.get_values("meta") or {"fit-rounds": 0}
        metric = metric_of(self.cfg.values)  # the one rule the server reports by, too
        metrics: dict[str, Scalar] = {"partition-id": self.pid, metric: score,
                                      "num-train": self.data.num_train,
                                      "fit-rounds": int(meta["fit-rounds"])}
        if int(meta["fit-rounds"]) == 0:  # the never-trained warning says what this is
            metrics["evaluated"] = self.evaluated_model(parameters, model)
        if self.data.task == "classification":  # classes it tests on but never trains on
            metrics["unseen-classes"] = unseen_classes(self.data.y_train, self.data.y_test)
        # the device of its last accepted fit; one that has not trained yet: where it evaluated
        metrics.update(devices.select(meta) or devices.fit_report(self.device, peak=False))
        if EvaluateInstruction.from_config(config).eval_global and parameters:
            g_loss, g_score = self.test(self.new_model(parameters))
            metrics.update({f"global_{metric}": g_score, "global_loss": g_loss})
        return loss, self.data.num_test, metrics

    def evaluate_newcomer(self, parameters: NDArrays, config: MessageConfig,
                          sent: NewcomerEval) -> tuple[float, int, dict[str, Scalar]]:
        """A held-out newcomer's evaluation: the metric of :meth:`newcomer_start`'s model
        (before) and of :meth:`adapt_newcomer`'s (after) with ``budget-steps`` local steps
        (0: the run's local training).  Everything it writes to its state is thrown away
        (one transaction, aborted); the reply is metrics only (:class:`NewcomerReply`), no
        arrays, outside every fit: under DP it spends none of the federation's budget."""
        steps = sent.budget_steps or self.spec.num_steps(self.data.num_train)
        metric = metric_of(self.cfg.values)
        self.state.begin(self.round)
        try:
            _, before = self.test(self.newcomer_start(parameters, config))
            self.eval_steps = 0
            model = self.adapt_newcomer(self.newcomer_start(parameters, config), config, steps)
            loss, after = self.test(model)
        finally:
            self.state.abort()
        reply = NewcomerReply(newcomer_before=float(before), newcomer_after=float(after),
                              newcomer_steps=int(self.eval_steps)).to_config()
        metrics: dict[str, Scalar] = {"partition-id": self.pid, metric: after,
                                      "num-train": self.data.num_train, "fit-rounds": 0,
                                      **reply, **devices.fit_report(self.device, peak=False)}
        return loss, self.data.num_test, metrics

    # ------------------------------------------------------------------------ helpers
    def setup(self, config: MessageConfig) -> None:
        sent = RoundInstruction.from_config(config)
        self.cfg = parse_run_config(self.run_config_text(config))
        self.state.disk = self.state_dir(config)
        if sent.accepted_round is not None:  # the server's verdict on this client's last fit
            self.state.resolve(sent.accepted_round)
        self.device = resolve_device(self.cfg["device"])
        self.data = load_client_data(self.cfg.values, self.pid, self.data_root, self.device)
        self.round = sent.round
        # the round's lr (schedule); from_config reads cfg.values, its annotation says Mapping
        self.spec = TrainSpec.from_config(self.cfg, self.round)  # type: ignore[arg-type]  # RunConfig

    def evaluated_model(self, parameters: NDArrays, model: NamedLayers) -> str:
        """What a client without an accepted fit evaluated, as a phrase (``evaluate``'s
        ``evaluated`` metric): the model the server sent, part of it (FedRep: the body; the
        head at its initial values) or none (Local: the initial model), and the local SGD
        steps its evaluation took (FedAvg-FT's fine-tuning, Per-FedAvg's personal steps),
        counted where they ran (:meth:`local_train`)."""
        sent, total = len(parameters or []), len(get_arrays(model))
        what = ("its initial model (the server sent none)" if not sent else
                "the model the server sent" if sent >= total else
                f"the model the server sent ({sent} of its {total} arrays; the rest at their "
                f"initial values)")
        if not self.eval_steps:
            return f"{what}, not a personalized one"
        return (f"{what} after {self.eval_steps} local SGD step(s) on its own training data "
                f"at evaluation (personalized there, though no fit of its was accepted)")

    def run_config_text(self, config: MessageConfig) -> str:
        """The run's validated configuration (JSON): from the run config, where flower-pfl's
        launchers put it once per run, else from the message (a server started by
        ``flwr run`` with a YAML path sends it with every message)."""
        text = RoundInstruction.from_config(config).cfg or self.ctx.run_config.get("cfg")
        if not text:
            raise RuntimeError("the run's configuration reached this client neither in the run "
                               "config ('cfg', set by flower-pfl run/submit/bench) nor in the "
                               "message; start the run with flower-pfl, or flwr run with "
                               "config-file and overrides")
        return str(text)

    def state_dir(self, config: MessageConfig) -> Path | None:
        """Where this client's state is mirrored on disk: the node's ``state-dir``
        (deployment), else the run's ``client-state-dir`` (simulation with checkpoints),
        else nowhere.  Keyed by the server's run-uid, which a resumed run keeps."""
        run = f"run-{RoundInstruction.from_config(config).run_uid or self.ctx.run_id}"
        node_dir = self.ctx.node_config.get("state-dir")
        if node_dir:
            return Path(str(node_dir)) / run / f"partition-{self.pid}"
        sim_dir = str((self.ctx.run_config or {}).get("client-state-dir", ""))
        if sim_dir and int(self.cfg.values.get("checkpoint-every", 0) or 0) > 0:
            return Path(sim_dir) / f"partition-{self.pid}"
        return None

    @staticmethod
    def split_download(parameters: NDArrays, config: MessageConfig
                       ) -> tuple[list[np.ndarray], dict[str, list[np.ndarray]]]:
        """(model, {name: extra part}) of what the server sent (``fit_extra``: SCAFFOLD's c);
        an upload's extra part is laid out as ``reliability.uploads.UploadTemplate`` says."""
        return split_parts(parameters, parse_parts(str(config.get(EXTRA_ARRAYS, ""))))

    def new_model(self, arrays: Sequence[np.ndarray] | None = None) -> NamedLayers:
        # model_for reads cfg[...] and, for a user model's folder, RunConfig.source
        model = model_for(self.cfg)  # type: ignore[arg-type]  # RunConfig, not a Mapping
        if arrays is not None and len(arrays):
            set_arrays(model, arrays)
        return model.to(self.device)

    def generator(self, salt: int = 0) -> torch.Generator:
        """Seeded per (run seed, client, round): reproducible mini-batch orders."""
        g = torch.Generator()
        g.manual_seed(hash((self.cfg["seed"], self.pid, self.round, salt)) & 0x7FFFFFFF)
        return g

    def local_train(self, model: NamedLayers, regularizer: Regularizer = None,
                    num_steps: int | None = None,
                    salt: int = 0, lr: float | None = None) -> dict[str, float]:
        if self.in_fit and self.cfg.values.get("privacy.mode") == "sample-level":
            return self.private_train(model, regularizer, num_steps, salt, lr)
        out = train(model, self.data.x_train, self.data.y_train, self.spec,
                    self.generator(salt), self.device, regularizer=regularizer,
                    num_steps=num_steps, lr=lr, loss_fn=self.loss_fn())
        self.eval_steps += int(out.get("local_steps", 0))  # read only by evaluate
        return out

    def private_train(self, model: NamedLayers, regularizer: Regularizer,
                      num_steps: int | None,
                      salt: int, lr: float | None) -> dict[str, float]:
        """Sample-level DP (docs/privacy.md): DP-SGD with opacus (``dp_train``); every step
        joins this client's accountant history (its state, privacy/sample_level.py) and the
        metrics carry its ε after them (``dp_epsilon``, at ``dp_delta``: privacy.delta, or
        privacy.fields.default_delta of its training examples).  Every local training of a
        fit counts, also one whose result stays on the client (Ditto's v_i): ε is an upper
        bound."""
        from flower_pfl.privacy import sample_level as sl  # opacus: only under DP
        from flower_pfl.privacy.fields import delta_for

        values = self.cfg.values
        z = float(values["privacy.noise-multiplier"])
        out, q = dp_train(model, self.data.x_train, self.data.y_train, self.spec,
                          self.generator(salt), self.device, z,
                          float(values["privacy.max-grad-norm"]), regularizer=regularizer,
                          num_steps=num_steps, lr=lr, loss_fn=self.loss_fn())
        history = sl.extend(sl.history_of(self.state.get_values(sl.STATE_KEY)), z, q,
                            int(out["local_steps"]))
        self.state.set_values(sl.STATE_KEY, sl.stored(history))
        delta = delta_for(values, self.data.num_train)
        reply = SampleLevelReply(dp_epsilon=sl.epsilon(history, delta), dp_delta=float(delta))
        return {**out, **{k: float(v) for k, v in reply.to_config().items()}}

    def loss_fn(self) -> LossFn:
        """The data loss of every local step: cross-entropy for images, the Gaussian NLL
        (known noise variance) for the synthetic task."""
        return F.cross_entropy if self.data.task == "classification" else \
            gaussian_nll(self.data.noise_sq)

    def test(self, model: NamedLayers) -> tuple[float, float]:
        """(loss, metric): accuracy for images; for the Gaussian task the mean NLL on the
        test samples and the squared error of theta to the client's true theta_m."""
        if self.data.task == "classification":
            return evaluate(model, self.data.x_test, self.data.y_test, self.device)
        with torch.no_grad():
            theta = float(model.get_parameter("theta").detach().cpu()[0])  # ScalarModel
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

    def regularizer(self, model: NamedLayers, config: MessageConfig) -> Regularizer:
        """Extra loss term ``f(model) -> tensor`` built once per round, or None."""
        return None

    def fit_round(self, parameters: NDArrays, config: MessageConfig
                  ) -> tuple[NDArrays, Metrics]:
        model = self.new_model(parameters)
        metrics = self.local_train(model, regularizer=self.regularizer(model, config))
        self.save_personal(model)
        return get_arrays(model), metrics

    def personal_model(self, parameters: NDArrays, config: MessageConfig
                       ) -> NamedLayers:
        if ReceivedModel.from_config(config).evaluate_received and parameters:
            return self.new_model(parameters)  # the server chose the model (e.g. FedAMP's u_i)
        model = self.load_personal()
        if model is not None:
            return model
        return self.new_model(parameters if parameters else None)
