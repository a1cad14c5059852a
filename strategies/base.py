"""Plumbing shared by every personalized strategy, written once.

:class:`PersonalizedStrategy` is a ``flwr.server.strategy.Strategy`` that

* learns each node's ``partition-id`` with a ``get_properties`` handshake and keys all
  per-client state by it (never by Flower's random node id);
* checks that the federation has exactly ``clients`` nodes (one source of truth with
  ``simulation.yaml``) and fails with a clear message otherwise;
* samples ``max(min-fit-clients, round(fraction-fit * clients))`` partition-ids per round
  with its own seeded generator (reproducible sampling);
* sends each sampled client ITS instructions (``fit_payload``) and hands the uploads to
  ``aggregate_updates`` as :class:`ClientUpdate` objects;
* every ``eval-every`` rounds (and in the last round) asks ALL clients to evaluate their
  personalized model (and the global model where there is one), then writes the
  statistics of :mod:`flower_pfl.metrics` to the results folder and Flower's log.

Subclasses implement the paper's Algorithm box: ``fit_payload``, ``aggregate_updates``
and, if needed, ``eval_payload`` and ``prepare_round``.
"""

from __future__ import annotations

import concurrent.futures
import resource
import time
from dataclasses import dataclass, field
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from flwr.common import (EvaluateIns, EvaluateRes, FitIns, FitRes, GetPropertiesIns, Parameters,
                         Scalar, ndarrays_to_parameters, parameters_to_ndarrays)
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from flower_pfl.config import RunConfig
from flower_pfl.metrics import summarize
from flower_pfl.params import ParamSpec
from flower_pfl.results import ResultsWriter

WAIT_FOR_NODES_S = 120.0


class FederationError(RuntimeError):
    """The federation does not match the configuration (node count, partition ids)."""


@dataclass
class ClientUpdate:
    """One client's upload of one round."""

    pid: int
    arrays: list[np.ndarray]
    num_examples: int
    metrics: dict[str, Scalar] = field(default_factory=dict)


class ClientStore:
    """All server-side per-client state, keyed by partition-id, in one checkpointable place.

    ``values[name][pid]`` holds scalars/arrays a strategy keeps per client (e.g. Self-FL's
    sigma_m^2); strategies with a model per client keep a ``ModelMatrix`` in ``matrix``.
    """

    def __init__(self, num_clients: int) -> None:
        self.num_clients = num_clients
        self.values: dict[str, dict[int, Any]] = {}
        self.matrix: Any = None
        self.last_round: dict[int, int] = {}  # pid -> last round it uploaded

    def put(self, name: str, pid: int, value: Any) -> None:
        self.values.setdefault(name, {})[pid] = value

    def get(self, name: str, pid: int, default: Any = None) -> Any:
        return self.values.get(name, {}).get(pid, default)


class PersonalizedStrategy(Strategy):
    """Base Strategy: identity, sampling, per-client payloads, evaluation of all clients."""

    #: whether the strategy maintains a global model that clients also evaluate
    has_global_model: bool = True

    def __init__(self, cfg: RunConfig, initial_arrays: Sequence[np.ndarray] | None = None,
                 results_dir: str | Path | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.hyper = dict(cfg.hyper)
        self.num_clients = int(cfg["clients"])
        self.rng = np.random.default_rng([cfg["seed"], 0xC11E])
        self.cfg_json = cfg.to_json()
        self.store = ClientStore(self.num_clients)
        self._initial = list(initial_arrays) if initial_arrays is not None else None
        self.global_arrays: list[np.ndarray] | None = None
        self.spec: ParamSpec | None = None
        self.pid_of_cid: dict[str, int] = {}
        self.proxies: dict[int, ClientProxy] = {}
        self.eval_history: list[dict[str, float]] = []
        self.results = ResultsWriter(Path(results_dir) if results_dir else default_results_dir(cfg),
                                     {"source": cfg.source, "values": dict(cfg.values),
                                      "hyper": self.hyper})
        self._round_server_log: dict[str, Any] = {}
        # the per-client metric: accuracy (higher is better), or the synthetic task's mse
        self.metric = "mse" if cfg["data.dataset"] == "synthetic-gaussian" else "accuracy"

    # ------------------------------------------------------------------ subclass hooks
    def setup(self, initial_arrays: list[np.ndarray]) -> None:
        """Called once with the initial model (e.g. to allocate per-client matrices)."""

    def prepare_round(self, server_round: int, sampled: list[int]) -> None:
        """Server-side computation before sending (e.g. FedAMP's cloud models u_i)."""

    def fit_payload(self, pid: int, server_round: int) -> tuple[list[np.ndarray], dict[str, Scalar]]:
        """Arrays and extra config sent to sampled client ``pid`` (default: the global model)."""
        return self.global_arrays or [], {}

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> None:
        """Consume this round's uploads (default: nothing)."""

    def eval_payload(self, pid: int, server_round: int) -> tuple[list[np.ndarray], dict[str, Scalar]]:
        """Arrays and extra config for evaluation (default: the global model)."""
        return self.global_arrays or [], {}

    def log_server(self, **values: Any) -> None:
        """Record server-side per-round quantities (written to server.csv and the log)."""
        self._round_server_log.update(values)

    # ---------------------------------------------------------------- Strategy methods
    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        if self._initial is None:
            from flower_pfl.models import initial_arrays

            self._initial = initial_arrays(self.cfg)
        self.spec = ParamSpec.of(self._initial)
        self.global_arrays = [a.copy() for a in self._initial] if self.has_global_model else None
        self.setup([a.copy() for a in self._initial])
        log(INFO, "[flower-pfl] strategy=%s clients=%d rounds=%d model=%s (%d parameters); "
            "results -> %s", self.cfg.strategy, self.num_clients, self.cfg["rounds"],
            self.cfg["model"], self.spec.dim, self.results.dir)
        # The legacy server asks one client for parameters if we return None; our model is
        # built from the config, so always return it (it also travels as the global model).
        return ndarrays_to_parameters(self._initial)

    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        self._handshake(client_manager)
        self._round_server_log = {}
        sampled = self.sample(server_round)
        started = time.perf_counter()
        self.prepare_round(server_round, sampled)
        instructions = []
        for pid in sampled:
            arrays, extra = self.fit_payload(pid, server_round)
            config = self._base_config(server_round, extra)
            instructions.append((self.proxies[pid], FitIns(ndarrays_to_parameters(arrays), config)))
        self.log_server(server_prepare_s=round(time.perf_counter() - started, 4),
                        sampled=len(sampled))
        return instructions

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[Any]) -> tuple[Parameters | None, dict[str, Scalar]]:
        updates = []
        for proxy, res in results:
            pid = int(res.metrics.get("partition-id", self.pid_of_cid.get(proxy.cid, -1)))
            updates.append(ClientUpdate(pid, parameters_to_ndarrays(res.parameters),
                                        res.num_examples, dict(res.metrics)))
            self.store.last_round[pid] = server_round
        if failures:
            log(WARNING, "[flower-pfl] round %d: %d client(s) failed in fit: %s", server_round,
                len(failures), [repr(f)[:300] for f in failures[:3]])
            if not results:
                raise RuntimeError(f"round {server_round}: every sampled client failed; first "
                                   f"failure: {failures[0]!r:.1000}")
        started = time.perf_counter()
        if updates:
            self.aggregate_updates(server_round, sorted(updates, key=lambda u: u.pid))
        self.log_server(server_aggregate_s=round(time.perf_counter() - started, 4),
                        fit_ok=len(updates), fit_failed=len(failures),
                        server_peak_rss_mb=round(resource.getrusage(
                            resource.RUSAGE_SELF).ru_maxrss / 1024, 1))
        train_losses = [u.metrics["train_loss"] for u in updates if "train_loss" in u.metrics]
        metrics: dict[str, Scalar] = {"fit_clients": len(updates), "fit_failures": len(failures)}
        if train_losses:
            metrics["train_loss"] = float(np.mean(train_losses))
        self.results.log_server(server_round, self._round_server_log)
        params = ndarrays_to_parameters(self.global_arrays) if self.global_arrays else None
        return params, metrics

    def configure_evaluate(self, server_round: int, parameters: Parameters,
                           client_manager: ClientManager) -> list[tuple[ClientProxy, EvaluateIns]]:
        if not self._eval_round(server_round):
            return []
        self._handshake(client_manager)
        instructions = []
        eval_global = bool(self.cfg["eval-global"] and self.has_global_model)
        for pid in sorted(self.proxies):
            arrays, extra = self.eval_payload(pid, server_round)
            config = self._base_config(server_round, {"eval-global": eval_global, **extra})
            instructions.append((self.proxies[pid],
                                 EvaluateIns(ndarrays_to_parameters(arrays), config)))
        return instructions

    def aggregate_evaluate(self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]],
                           failures: list[Any]) -> tuple[float | None, dict[str, Scalar]]:
        if not results:
            if self._eval_round(server_round):
                log(WARNING, "[flower-pfl] round %d: no evaluation results (%d failures)",
                    server_round, len(failures))
            return None, {}
        m = self.metric
        rows = sorted((_client_row(res, m) for _, res in results),
                      key=lambda r: r["partition-id"])
        personal = summarize([r[m] for r in rows], [r["num-test"] for r in rows])
        global_ = None
        if all(f"global_{m}" in r for r in rows):
            global_ = summarize([r[f"global_{m}"] for r in rows], [r["num-test"] for r in rows])
        self.eval_history.append(personal)
        lower_is_better = m == "mse"
        self.results.log_round(server_round, personal, global_, rows, lower_is_better)
        best = (min if lower_is_better else max)(h["mean"] for h in self.eval_history)
        log(INFO, "[flower-pfl] round %d: personalized %s mean %.4f weighted %.4f std %.4f "
            "worst10%% %.4f top10%% %.4f min %.4f | best mean %.4f%s | %d clients, %d failed",
            server_round, m, personal["mean"], personal["weighted_mean"], personal["std"],
            personal["worst10_mean"], personal["top10_mean"], personal["min"], best,
            f" | global {m} mean {global_['mean']:.4f}" if global_ else "", len(rows),
            len(failures))
        if server_round >= self.cfg["rounds"]:
            self.results.finish("completed")
            log(INFO, "[flower-pfl] final per-round table: %s", self.results.dir / "rounds.csv")
            log(INFO, "[flower-pfl] per-client table: %s", self.results.dir / "clients.csv")
        metrics: dict[str, Scalar] = {f"personal_{k}": v for k, v in personal.items()}
        metrics["personal_bmta"] = best
        if global_:
            metrics.update({f"global_{k}": v for k, v in global_.items()})
        loss = float(np.average([r["loss"] for r in rows], weights=[r["num-test"] for r in rows]))
        return loss, metrics

    def evaluate(self, server_round: int, parameters: Parameters
                 ) -> tuple[float, dict[str, Scalar]] | None:
        return None  # no centralised test set: pFL is evaluated on each client's own split

    # ------------------------------------------------------------------------ helpers
    def sample(self, server_round: int) -> list[int]:
        """Partition-ids of this round's clients (seeded; independent of node ids)."""
        available = sorted(self.proxies)
        k = max(int(self.cfg["min-fit-clients"]), int(round(self.cfg["fraction-fit"] *
                                                            self.num_clients)))
        k = min(k, len(available))
        return sorted(self.rng.choice(available, size=k, replace=False).tolist())

    def _eval_round(self, server_round: int) -> bool:
        return server_round % self.cfg["eval-every"] == 0 or server_round >= self.cfg["rounds"]

    def _base_config(self, server_round: int, extra: Mapping[str, Scalar]) -> dict[str, Scalar]:
        return {"cfg": self.cfg_json, "strategy": self.cfg.strategy, "round": server_round,
                **extra}

    def _handshake(self, client_manager: ClientManager) -> None:
        """Map every connected node to its partition-id (asked once per node)."""
        if client_manager.num_available() < self.num_clients:
            client_manager.wait_for(self.num_clients, timeout=int(WAIT_FOR_NODES_S))
        available = client_manager.all()
        if len(available) != self.num_clients:
            raise FederationError(
                f"the configuration says clients = {self.num_clients} but the federation has "
                f"{len(available)} node(s). In simulation run through `flower-pfl run` (it sets "
                f"num-supernodes from the YAML) or pass --federation-config "
                f"'num-supernodes={self.num_clients}'; in deployment start one SuperNode per client.")
        unknown = [p for cid, p in available.items() if cid not in self.pid_of_cid]
        if unknown:
            ins = GetPropertiesIns({"cfg": self.cfg_json})
            with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
                answers = list(pool.map(lambda p: p.get_properties(ins, None, None), unknown))
            for proxy, res in zip(unknown, answers):
                if "partition-id" not in res.properties:
                    raise FederationError(f"node {proxy.cid} did not report a partition-id "
                                          f"(status: {res.status.message})")
                pid = int(res.properties["partition-id"])
                if not 0 <= pid < self.num_clients:
                    raise FederationError(f"node {proxy.cid} reports partition-id {pid}, outside "
                                          f"[0, {self.num_clients}) of the configuration")
                if pid in self.proxies and self.proxies[pid].cid in available \
                        and self.proxies[pid].cid != proxy.cid:
                    raise FederationError(f"two nodes report partition-id {pid}")
                self.pid_of_cid[proxy.cid] = pid
                self.proxies[pid] = proxy
        # drop proxies of nodes that disconnected (a restarted SuperNode gets a new proxy)
        self.proxies = {pid: p for pid, p in self.proxies.items() if p.cid in available}


def _client_row(res: EvaluateRes, metric: str) -> dict[str, Any]:
    m = res.metrics
    row: dict[str, Any] = {"partition-id": int(m["partition-id"]), metric: float(m[metric]),
                           "loss": float(res.loss), "num-test": int(res.num_examples),
                           "num-train": int(m.get("num-train", 0)),
                           "fit-rounds": int(m.get("fit-rounds", 0))}
    if f"global_{metric}" in m:
        row[f"global_{metric}"] = float(m[f"global_{metric}"])
        row["global_loss"] = float(m["global_loss"])
    return row


def default_results_dir(cfg: RunConfig) -> Path:
    """``<output-dir>/<run-name>``; relative output dirs resolve against the cwd."""
    name = cfg["run-name"] or (f"{cfg.strategy}-{cfg['data.dataset']}-{cfg['data.partition']}-"
                               f"{time.strftime('%Y%m%d-%H%M%S')}")
    return (Path(cfg["output-dir"]).expanduser().resolve() / name)
