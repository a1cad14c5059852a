"""The base Strategy of every personalized algorithm: the fit side, written once.

:class:`PersonalizedStrategy` is a ``flwr.server.strategy.Strategy`` assembled from one
mixin per job; this module holds the composition, the state its ``__init__`` sets (each
attribute's type declared once, in :mod:`.state`) and the Flower methods that run a
round's steps in order (``initialize_parameters``, ``configure_fit``, ``aggregate_fit``).
The map -- job, module, what it does:

* who is in the federation -- :mod:`.nodes` (``NodeTracking``): each node's partition-id
  (``handshake``), the round's seeded sample (``sample``), ``proxy_pid``; what came back
  from it (``ClientUpdate``, ``ClientStore``, ``TaggedProxy``, the errors) is
  :mod:`.federation`;
* what each sampled client is sent -- :mod:`.payloads` (``FitPayloads``): the paper's
  ``fit_payload`` and ``fit_extra``, each client's ``FitIns`` (``fit_instructions``), what
  every message carries (``base_config``);
* what the round accepts -- :mod:`.uploads` (``UploadAcceptance``): the upload's template
  (``upload_template``, ``upload_extra``), every upload checked before any state sees it
  (``check_uploads``), rejected uploads and failed clients logged by partition-id with the
  reason (``record_failures``: log, ``failures.csv``), the accepted ones' round kept
  (``accept``: clients commit personal state only for an accepted round), fewer than
  ``min-fit-answers`` accepted ends the run (``require_min_fit_answers``);
* client-level DP's server side -- :mod:`.private_round` (``PrivateRound``): the budget
  before a round (``require_privacy_budget``), clipping instead of rejecting
  (``clip_upload``), equal weights, noise and the accountant (``private_round``);
* what the round records -- :mod:`.round_records` (``RoundRecords``): ``log_server``, the
  mechanism's use (``mechanism_used``, ``count_mechanism``; :mod:`.mechanism`),
  ``fit_metrics``, ``warn_once``;
* evaluation of all clients every ``eval-every`` rounds -- :mod:`.evaluation`
  (``EvaluationReporting``, with the paper's ``eval_payload``);
* checkpoint and resume -- :mod:`.checkpointing` (``Checkpointing``: the attributes each
  class names in ``checkpointed``).

A round's fit side (:meth:`PersonalizedStrategy.aggregate_fit`), step by step:
``check_uploads``, ``record_failures``, ``accept``, ``require_min_fit_answers``; then
``aggregate_updates`` gets the accepted uploads sorted by partition-id (``private_round``);
the mechanism's use is counted (``count_mechanism``); the results writer writes ``fit.csv``
and ``server.csv``.

Subclasses implement the paper's Algorithm box: ``fit_payload``, ``aggregate_updates`` and,
if needed, ``eval_payload``, ``prepare_round`` and the upload's parts (``upload_template``,
``upload_extra``); the config a payload carries is its paper's declaration in
:mod:`flower_pfl.instructions` (``to_config``), which its client reads back (``from_config``).
Every attribute is set in ``__init__`` (``setup`` fills in what needs the initial model).
The mixins import :mod:`.state` and :mod:`.federation`, never this module.
``ClientUpdate``, ``ClientStore`` and the errors (:mod:`.federation`), ``WAIT_FOR_NODES_S``
(:mod:`.nodes`) and ``fit_metrics`` (:mod:`.round_records`) are re-exported here (tests
and the message-API server import them from here).
"""

from __future__ import annotations

import resource
import time
import uuid
from logging import INFO
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from flwr.common import (
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
)
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from flower_pfl import raynode, registry
from flower_pfl.config import RunConfig
from flower_pfl.contract import Mechanism, Params
from flower_pfl.learning.params import ParamSpec
from flower_pfl.newcomers import held_out
from flower_pfl.privacy.server_side import ClientLevelDP
from flower_pfl.reporting.metric_kind import lower_is_better, metric_of
from flower_pfl.reporting.results import ResultsWriter
from flower_pfl.reporting.run_dirs import default_results_dir
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
from flower_pfl.strategies.mechanism import MechanismCount
from flower_pfl.strategies.nodes import WAIT_FOR_NODES_S, NodeTracking  # noqa: F401
from flower_pfl.strategies.payloads import FitPayloads
from flower_pfl.strategies.private_round import PrivateRound
from flower_pfl.strategies.round_records import RoundRecords, fit_metrics
from flower_pfl.strategies.uploads import UploadAcceptance

__all__ = ["WAIT_FOR_NODES_S", "ClientFailure", "ClientStore", "ClientUpdate", "FederationError",
           "PersonalizedStrategy", "ResumeError", "RoundError", "TaggedProxy", "failure_reason",
           "fit_metrics"]


class PersonalizedStrategy(NodeTracking, FitPayloads, UploadAcceptance, PrivateRound,
                           RoundRecords, EvaluationReporting, Checkpointing, Strategy):
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
        self.newcomers = held_out(cfg.values)  # drawn before round 1, never sampled
        self.results = ResultsWriter(Path(results_dir) if results_dir else default_results_dir(cfg),
                                     {"source": cfg.source, "values": dict(cfg.values),
                                      "hyper": self.hyper,
                                      **({"newcomers": self.newcomers} if self.newcomers
                                         else {})})
        if self.newcomers:
            self.results.set_summary("newcomers", self.newcomers)
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
        #: the paper's contract (flower_pfl/catalog/<paper>.py) and its parameters, read once
        self.entry = registry.get(cfg.strategy)
        self.params = self.entry.params.read(self.hyper)
        self.mechanism = self.entry.mechanism

    # ------------------------------------------------------------------ subclass hooks
    def setup(self, initial_arrays: list[np.ndarray]) -> None:
        """Called once with the initial model (e.g. to allocate per-client matrices)."""

    def prepare_round(self, server_round: int, sampled: list[int]) -> None:
        """Server-side computation before sending (e.g. FedAMP's cloud models u_i)."""

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> None:
        """Consume this round's uploads (default: nothing)."""

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
        """One round's start: the previous round checkpointed when due, the privacy budget
        checked, the federation's nodes mapped, the clients sampled, ``prepare_round``, then
        each sampled client's instructions (``fit_instructions``)."""
        self.checkpoint_before(server_round)  # the state after round server_round - 1
        self.require_privacy_budget(server_round)
        self.handshake(client_manager)
        self._round_server_log = {}
        sampled = self.sample(server_round)
        started = time.perf_counter()
        self.prepare_round(server_round, sampled)
        instructions = self.fit_instructions(server_round, sampled)
        self.log_server(server_prepare_s=round(time.perf_counter() - started, 4),
                        sampled=len(sampled))
        return instructions

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
