"""The base Strategy of every personalized algorithm: the fit side, written once.

:class:`PersonalizedStrategy` is a ``flwr.server.strategy.Strategy`` that knows the
federation by partition-id and samples each round with its own seeded generator
(:mod:`.nodes`), sends each sampled client ITS instructions (``fit_payload``,
``fit_extra``), evaluates all clients every ``eval-every`` rounds (:mod:`.evaluation`) and
checkpoints the attributes each class names in ``checkpointed`` (:mod:`.checkpointing`).

A round's fit side (:meth:`PersonalizedStrategy.aggregate_fit`), step by step: every upload
is checked before any state sees it (``check_uploads``: the claimed partition-id, then
:mod:`flower_pfl.reliability.upload_checks`); rejected uploads and failed clients are logged
by partition-id with the reason (``record_failures``: log, ``failures.csv``); the accepted
ones' round is kept (``accept``: clients commit personal state only for an accepted round,
clients/state.py); fewer than ``min-fit-answers`` accepted ends the run
(``require_min_fit_answers``); ``aggregate_updates`` gets the accepted uploads sorted by
partition-id; the mechanism's use is counted (``count_mechanism``); the results writer
writes ``fit.csv`` and ``server.csv``.

Subclasses implement the paper's Algorithm box: ``fit_payload``, ``aggregate_updates`` and,
if needed, ``eval_payload``, ``prepare_round`` and the upload's parts (``upload_template``,
``upload_extra``); the config a payload carries is its paper's declaration in
:mod:`flower_pfl.instructions` (``to_config``), which its client reads back (``from_config``).
Every attribute is set in ``__init__`` (``setup`` fills in what needs the initial model);
its type is declared once, in :mod:`.state`, for the base and its mixins.
Open choice: a rejected client's server-side state is left untouched
and the round goes on with the others.  ``ClientUpdate``, ``ClientStore`` and the errors
live in :mod:`.federation` (re-exported here, as is ``WAIT_FOR_NODES_S`` of :mod:`.nodes`).
"""

from __future__ import annotations

import resource
import time
import uuid
from dataclasses import replace
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from flwr.common import (
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    bytes_to_ndarray,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from flower_pfl import raynode, registry
from flower_pfl.config import RunConfig
from flower_pfl.contract import Mechanism, Params
from flower_pfl.instructions import RoundInstruction
from flower_pfl.learning.params import ParamSpec
from flower_pfl.privacy.clipping import clip_update
from flower_pfl.privacy.server_side import ClientLevelDP
from flower_pfl.reliability.upload_checks import flat
from flower_pfl.reliability.uploads import EXTRA_ARRAYS, UploadTemplate, describe_parts
from flower_pfl.reporting.metric_kind import lower_is_better, metric_of
from flower_pfl.reporting.results import ResultsWriter
from flower_pfl.reporting.run_dirs import default_results_dir
from flower_pfl.store_rows import LazyArrays
from flower_pfl.strategies.checkpointing import Checkpointing
from flower_pfl.strategies.evaluation import EvaluationReporting
from flower_pfl.strategies.federation import (  # noqa: F401 - re-exported (tests import them here)
    ClientFailure,
    ClientStore,
    ClientUpdate,
    FederationError,
    ResumeError,
    RoundError,
    TaggedProxy,
    failure_reason,
)
from flower_pfl.strategies.hyper_view import read_views
from flower_pfl.strategies.mechanism import MechanismCount
from flower_pfl.strategies.nodes import WAIT_FOR_NODES_S, NodeTracking  # noqa: F401
from flower_pfl.warnings_once import warn_once

__all__ = ["WAIT_FOR_NODES_S", "ClientFailure", "ClientStore", "ClientUpdate", "FederationError",
           "PersonalizedStrategy", "ResumeError", "RoundError", "TaggedProxy", "failure_reason",
           "fit_metrics"]


class PersonalizedStrategy(NodeTracking, EvaluationReporting, Checkpointing, Strategy):
    """Base Strategy: identity, sampling, per-client payloads, evaluation of all clients."""

    #: whether the strategy maintains a global model that clients also evaluate
    has_global_model: bool = True
    #: whether clients upload a model (Local uploads nothing: its uploads skip the model checks)
    uploads_model: bool = True
    #: the state a checkpoint holds (checkpointing.py: each subclass names its own)
    checkpointed: tuple[str, ...] = ("rng", "store", "_initial", "global_arrays",
                                     "eval_history", "run_uid", "mechanism_count")
    #: what the strategy's own mechanism is, where it can fall back (strategies/mechanism.py):
    #: each accepted upload is one client-round that used it or not; None = nothing to count
    mechanism: Mechanism | None = None
    #: the paper's parameters (its contract's Params class; each strategy names its own)
    params: Params
    #: uploads reach aggregate_updates still serialised, each array decoded when read (n x d
    #: stores: a round's uploads are held once, as the transport's bytes; model_store.py)
    lazy_uploads: bool = False

    def __init__(self, cfg: RunConfig, initial_arrays: Sequence[np.ndarray] | None = None,
                 results_dir: str | Path | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.hyper = dict(cfg.hyper)
        self.num_clients = int(cfg["clients"])
        self.rng = np.random.default_rng([cfg["seed"], 0xC11E])
        self.cfg_json = cfg.to_json()
        #: the run's configuration goes with every message unless the clients read it from
        #: the run config (``context.run_config["cfg"]``: flower-pfl's launchers put it there)
        self.cfg_travels = True
        self.store = ClientStore(self.num_clients)
        self._initial = list(initial_arrays) if initial_arrays is not None else None
        self.global_arrays: list[np.ndarray] | None = None
        self._spec: ParamSpec | None = None  # the model's layout: ``spec``
        self.pid_of_cid: dict[str, int] = {}
        self.proxies: dict[int, ClientProxy] = {}
        self.eval_history: list[dict[str, float]] = []
        self.results = ResultsWriter(Path(results_dir) if results_dir else default_results_dir(cfg),
                                     {"source": cfg.source, "values": dict(cfg.values),
                                      "hyper": self.hyper})
        self._round_server_log: dict[str, Any] = {}
        # the per-client metric, decided once: accuracy, or the synthetic task's mse (an
        # error: lower is better); flower_pfl.reporting.results' metric_of and
        # lower_is_better are the one rule
        self.metric = metric_of(cfg.values)
        self.lower_is_better = lower_is_better(self.metric)
        self.warned: set[Any] = set()  # keys of the warnings given (self.warn_once)
        # reliability state
        self.run_uid = uuid.uuid4().hex  # names the clients' state folders across a resume
        self.start_round = 1  # > 1 after resume()
        self.client_state_dir: Path | None = None  # simulation: set by the ServerApp
        self._federation_checked = False
        self._restored = False
        self._sent: dict[int, np.ndarray] = {}
        # differential privacy (docs/privacy.md): client-level's clip/noise/accountant
        self.privacy_mode = str(cfg.values.get("privacy.mode", "none"))
        self.dp = ClientLevelDP.of(cfg.values)
        self._sent_arrays: dict[int, list[np.ndarray]] = {}  # under DP: what each was sent
        self.upload_spec: ParamSpec | None = None  # the model part of an upload
        self.mechanism_count = MechanismCount()  # client-rounds that used ``mechanism``
        self.ray_cluster_said = False  # flower_pfl.raynode.cluster_line, logged once
        read_views(self)  # each typed hyper-parameter view (hyper_view.py), now
        #: the paper's contract (flower_pfl/catalog/<paper>.py) and its parameters, read once
        self.entry = registry.get(cfg.strategy)
        self.params = self.entry.params.read(self.hyper)
        if self.entry.mechanism is not None:
            self.mechanism = self.entry.mechanism

    # ------------------------------------------------------------------ subclass hooks
    def setup(self, initial_arrays: list[np.ndarray]) -> None:
        """Called once with the initial model (e.g. to allocate per-client matrices)."""

    def prepare_round(self, server_round: int, sampled: list[int]) -> None:
        """Server-side computation before sending (e.g. FedAMP's cloud models u_i)."""

    def fit_payload(self, pid: int, server_round: int
                    ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        """Arrays and extra config sent to sampled client ``pid`` (default: the global model)."""
        return self.global_arrays or [], {}

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> None:
        """Consume this round's uploads (default: nothing)."""

    def upload_template(self) -> list[np.ndarray]:
        """Arrays shaped like one client's upload (called after ``setup``/a resume): the
        upload check holds every upload to these shapes and dtypes.  Default: the whole
        model; a strategy whose clients upload a part (FedRep: the body) returns that."""
        return self._initial if self._initial is not None else []

    def upload_extra(self, server_round: int) -> dict[str, list[np.ndarray]]:
        """The extra part of this round's uploads, after the model part: named arrays shaped
        like what each client adds (Self-FL's d_m, SCAFFOLD's dc_i), held to the same upload
        check as the model's; they reach ``aggregate_updates`` as ``ClientUpdate.extra``."""
        return {}

    def bounded_extra(self) -> frozenset[str]:
        """Extra parts that are updates in the model's units: max-update-norm bounds each."""
        return frozenset()

    def fit_extra(self, pid: int, server_round: int) -> dict[str, list[np.ndarray]]:
        """Named arrays sent after the model to sampled client ``pid`` (SCAFFOLD's c); the
        client splits them off with ``PFLClient.split_download``."""
        return {}

    def template(self, server_round: int) -> UploadTemplate:
        """This round's upload: the model part and the extra part."""
        return UploadTemplate(self.upload_template() or [], self.upload_extra(server_round),
                              self.bounded_extra())

    def eval_payload(self, pid: int, server_round: int
                     ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        """Arrays and extra config for evaluation (default: the global model)."""
        return self.global_arrays or [], {}

    def mechanism_used(self, update: ClientUpdate, carried: bool) -> bool:
        """Whether ``update``'s client-round ran the strategy's mechanism.  Default (history):
        ``carried`` = the client had an accepted upload in an earlier round, so the state
        the mechanism builds on (personal model, head, v_i, c_i, stored w_i) was its own."""
        return carried

    def warn_once(self, key: Any, message: str, *args: object) -> bool:
        """A WARNING logged the first time ``key`` comes up in this run
        (:func:`flower_pfl.warnings_once.warn_once`)."""
        return warn_once(self.warned, key, message, *args)

    def log_server(self, **values: Any) -> None:
        """Record server-side per-round quantities (written to server.csv and the log)."""
        self._round_server_log.update(values)

    # ---------------------------------------------------------------- Strategy methods
    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        if self._initial is None:
            from flower_pfl.learning.models import initial_arrays

            # initial_arrays declares a Mapping; it reads a RunConfig by key and its .source
            self._initial = initial_arrays(self.cfg)  # type: ignore[arg-type]  # RunConfig
        self._spec = ParamSpec.of(self._initial)
        if not self._restored:
            self.global_arrays = [a.copy() for a in self._initial] if self.has_global_model \
                else None
            self.setup([a.copy() for a in self._initial])
        self.upload_spec = ParamSpec.of(self.upload_template())
        log(INFO, "[flower-pfl] strategy=%s clients=%d rounds=%d model=%s (%d parameters); "
            "results -> %s%s", self.cfg.strategy, self.num_clients, self.cfg["rounds"],
            self.cfg["model"], self.spec.dim, self.results.dir,
            f"; resumed after round {self.start_round - 1}" if self._restored else "")
        # The legacy server asks one client for parameters if we return None; our model is
        # built from the config, so always return it (it also travels as the global model).
        return ndarrays_to_parameters(self.global_arrays or self._initial)

    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        every = int(self.cfg.values.get("checkpoint-every", 0) or 0)
        if every and server_round > self.start_round and (server_round - 1) % every == 0:
            self.save_checkpoint(server_round - 1)  # the state after round server_round - 1
        if self.dp is not None and self.dp.next_round_exceeds():  # e.g. resuming a spent run
            raise RoundError(f"round {server_round} would take client-level DP's ε past "
                             f"privacy.target-epsilon = {self.dp.target} (ε now "
                             f"{self.dp.epsilon():.4g}): the budget is spent")
        self.handshake(client_manager)
        self._round_server_log = {}
        sampled = self.sample(server_round)
        started = time.perf_counter()
        self.prepare_round(server_round, sampled)
        instructions: list[tuple[ClientProxy, FitIns]] = []
        max_norm = self.cfg.values.get("max-update-norm")
        self._sent, self._sent_arrays = {}, {}
        for pid in sampled:
            arrays, extra = self.fit_payload(pid, server_round)
            start = arrays if arrays else self._initial  # what the client starts from
            if max_norm is not None:  # the update's starting point, for the norm check
                assert start is not None, "initialize_parameters sets the initial model"
                self._sent[pid] = flat(start)
            if self.privacy_mode != "none":  # ... and for clipping it (docs/privacy.md)
                assert start is not None, "initialize_parameters sets the initial model"
                self._sent_arrays[pid] = list(start)
            if self.dp is not None:  # the client's clip, reference and noise share
                extra = {**extra, **self.dp.client_config(len(sampled))}
            extra_arrays = self.fit_extra(pid, server_round)
            if extra_arrays:  # after the model, named in the config
                arrays = [*arrays, *(a for part in extra_arrays.values() for a in part)]
                extra = {**extra, EXTRA_ARRAYS: describe_parts(extra_arrays)}
            config = self.base_config(server_round, extra, pid)
            instructions.append((TaggedProxy(self.proxies[pid], pid),
                                 FitIns(ndarrays_to_parameters(arrays), config)))
        self.log_server(server_prepare_s=round(time.perf_counter() - started, 4),
                        sampled=len(sampled))
        return instructions

    def record_failures(self, server_round: int, phase: str, failures: list[Any]
                        ) -> list[tuple[int, str]]:
        """(partition-id, reason) of every failed message; logged and kept in failures.csv."""
        out = []
        for f in failures:
            if isinstance(f, ClientFailure):
                out.append((f.pid, f.reason))
            elif isinstance(f, tuple) and len(f) == 2:  # (proxy, result with a bad status)
                out.append((self.proxy_pid(f[0]), f"status: {f[1].status.message[:400]}"))
            else:
                out.append((-1, failure_reason(f)))
        for pid, reason in out:
            log(WARNING, "[flower-pfl] round %d: %s of partition-id %d failed: %s", server_round,
                phase, pid, reason)
        self.results.log_failures(server_round, phase, out)
        return out

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[Any]) -> tuple[Parameters | None, dict[str, Scalar]]:
        """One round's uploads: checked, failures recorded, the accepted ones' round kept,
        aggregated, the mechanism counted, the round's rows written."""
        if results and not self.ray_cluster_said:  # fits came back: Ray is connected here
            self.ray_cluster_said = True
            line = raynode.cluster_line()  # None unless attached to an existing cluster
            if line:
                log(INFO, line)
        updates, rejected = self.check_uploads(server_round, results)
        failed = self.record_failures(server_round, "fit", list(failures) + rejected)
        carried = self.accept(server_round, updates)
        self.require_min_fit_answers(server_round, updates, failed)
        started = time.perf_counter()
        if updates:
            self.aggregate_updates(server_round, self.private_round(server_round, updates))
        self.count_mechanism(server_round, updates, carried)
        self.log_server(server_aggregate_s=round(time.perf_counter() - started, 4),
                        fit_ok=len(updates), fit_failed=len(failed),
                        fit_failed_ids=" ".join(str(p) for p, _ in sorted(failed)),
                        server_peak_rss_mb=round(resource.getrusage(
                            resource.RUSAGE_SELF).ru_maxrss / 1024, 1))
        self.results.log_fit(server_round, [(u.pid, u.num_examples, u.metrics)
                                            for u in sorted(updates, key=lambda u: u.pid)])
        self.results.log_server(server_round, self._round_server_log)
        params = ndarrays_to_parameters(self.global_arrays) if self.global_arrays else None
        return params, fit_metrics(updates, failed)

    # ------------------------------------------------------------ the steps of a round
    def check_uploads(self, server_round: int, results: list[tuple[ClientProxy, FitRes]]
                      ) -> tuple[list[ClientUpdate], list[ClientFailure]]:
        """(the accepted uploads as ClientUpdates, a ClientFailure for each rejected one)."""
        updates, rejected = [], []
        max_norm = self.cfg.values.get("max-update-norm")
        template = self.template(server_round)
        for proxy, res in results:
            pid = self.proxy_pid(proxy)
            arrays = parameters_to_ndarrays(res.parameters)
            reason = self.upload_problem(pid, arrays, res, template, max_norm)
            if reason is not None:
                rejected.append(ClientFailure(pid, f"update rejected: {reason}"))
                continue
            if self.dp is not None or (self.privacy_mode != "none" and max_norm is not None):
                # under DP a norm bound clips, never rejects (a lazy store's bytes kept else)
                arrays = self.clip_upload(pid, arrays, template, max_norm)
                updates.append(self.client_update(pid, arrays, res, template, lazy=False))
                continue
            updates.append(self.client_update(pid, arrays, res, template))
        return updates, rejected

    def clip_upload(self, pid: int, arrays: list[np.ndarray], template: UploadTemplate,
                    max_norm: float | None) -> list[np.ndarray]:
        """Under DP an upload's norm bound clips it (a rejection would depend on the data and
        break the guarantee): client-level clips its whole update (model part against what
        was sent, extra parts against zero, one vector) to privacy.clip-norm; otherwise
        ``max-update-norm`` clips the model's update and each bounded extra part."""
        model, extra = template.split(arrays)
        sent = self._sent_arrays.get(pid)
        if self.dp is not None:
            model, extra, _ = self.dp.clip_upload(model, extra, sent)
        elif max_norm is not None:
            model = clip_update(model, sent, max_norm)[0]
            extra = {k: clip_update(v, None, max_norm)[0] if k in template.bounded else v
                     for k, v in extra.items()}
        return [*model, *(a for part in extra.values() for a in part)]

    def private_round(self, server_round: int, updates: list[ClientUpdate]
                      ) -> list[ClientUpdate]:
        """What ``aggregate_updates`` gets, sorted by partition-id.  Client-level DP:
        copies weighted equally (num_examples 1: a sample-weighted mean would let one
        client weigh more than 1/n), the server's noise added (privacy/server_side.py), the
        round accounted (server.csv: epsilon).  Sample-level: the largest per-client ε
        reported (epsilon_max)."""
        ordered = sorted(updates, key=lambda u: u.pid)
        if self.dp is not None:
            ordered = [replace(u, num_examples=1) for u in ordered]
            self.dp.add_noise(ordered)
            self.log_server(**self.dp.record(
                ordered, int(self._round_server_log.get("sampled", len(ordered)))))
        elif self.privacy_mode == "sample-level":
            eps = [float(u.metrics["dp_epsilon"]) for u in updates if "dp_epsilon" in u.metrics]
            self.log_server(epsilon_max=round(max(eps), 6) if eps else float("nan"))
        return ordered

    def upload_problem(self, pid: int, arrays: list[np.ndarray], res: FitRes,
                       template: UploadTemplate, max_norm: float | None) -> str | None:
        """Why partition ``pid``'s upload must be rejected, or None (upload_checks.py)."""
        claimed = res.metrics.get("partition-id", pid)
        if int(claimed) != pid:
            return f"the upload claims partition-id {claimed!s}"
        if self.uploads_model or arrays:
            return template.check(arrays, res.num_examples, res.metrics, self._sent.get(pid),
                                  max_norm, clip=self.privacy_mode != "none")
        return None

    def client_update(self, pid: int, arrays: list[np.ndarray], res: FitRes,
                      template: UploadTemplate, lazy: bool | None = None) -> ClientUpdate:
        """An accepted upload split into its model part and its named extra parts
        (``lazy``: None = the class's ``lazy_uploads``; False: ``arrays`` as given)."""
        model: Sequence[np.ndarray]
        extra: Mapping[str, Sequence[np.ndarray]]
        if self.lazy_uploads if lazy is None else lazy:  # decoded again when read
            blobs, blob_parts = template.split(res.parameters.tensors)
            model = LazyArrays(blobs, bytes_to_ndarray)
            extra = {k: LazyArrays(v, bytes_to_ndarray) for k, v in blob_parts.items()}
        else:
            model, extra = template.split(arrays)
        update = ClientUpdate(pid, model, int(res.num_examples), dict(res.metrics))
        update.extra = extra  # the named extra parts (upload_extra)
        return update

    def accept(self, server_round: int, updates: list[ClientUpdate]) -> dict[int, bool]:
        """Record the round of each accepted upload (clients keep this round's state);
        returns whether each client had an accepted upload before (``mechanism_used``)."""
        carried = {u.pid: self.store.last_round.get(u.pid, 0) > 0 for u in updates}
        for u in updates:
            self.store.last_round[u.pid] = server_round  # accepted: clients keep this round
        return carried

    def require_min_fit_answers(self, server_round: int, updates: list[ClientUpdate],
                                failed: list[tuple[int, str]]) -> None:
        """Raise RoundError when fewer than ``min-fit-answers`` uploads were accepted."""
        minimum = int(self.cfg.values.get("min-fit-answers", 1))
        if len(updates) < minimum:
            raise RoundError(
                f"round {server_round}: {len(updates)} valid update(s) from "
                f"{len(updates) + len(failed)} sampled client(s), fewer than min-fit-answers = "
                f"{minimum}; failures: " + "; ".join(f"partition-id {p}: {r}"
                                                     for p, r in failed[:10]))

    def count_mechanism(self, server_round: int, updates: list[ClientUpdate],
                        carried: Mapping[int, bool]) -> None:
        """Each accepted client-round used the strategy's mechanism or not (mechanism.py)."""
        if self.mechanism is not None:
            for u in updates:
                self.mechanism_count.add(server_round, self.mechanism_used(u, carried[u.pid]))

    # ------------------------------------------------------------------------ helpers
    def base_config(self, server_round: int, extra: Mapping[str, Scalar],
                    pid: int | None = None) -> dict[str, Scalar]:
        """What every message carries (the strategy, the round, the run's id, the client's
        last accepted round; the configuration where the clients cannot read it from the run
        config: ``cfg_travels``), then ``extra``."""
        config = RoundInstruction(
            self.cfg.strategy, server_round, self.run_uid,
            cfg=self.cfg_json if self.cfg_travels else None,
            # the last round whose upload the server accepted from pid
            accepted_round=None if pid is None else int(self.store.last_round.get(pid, 0)),
        ).to_config()
        return {**config, **extra}


def fit_metrics(updates: Sequence[ClientUpdate], failed: Sequence[tuple[int, str]]
                ) -> dict[str, Scalar]:
    """What aggregate_fit reports to Flower: counts and the mean training loss."""
    train_losses = [float(u.metrics["train_loss"]) for u in updates if "train_loss" in u.metrics]
    metrics: dict[str, Scalar] = {"fit_clients": len(updates), "fit_failures": len(failed)}
    if train_losses:
        metrics["train_loss"] = float(np.mean(train_losses))
    return metrics
