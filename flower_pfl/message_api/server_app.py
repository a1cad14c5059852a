"""The spike's server side: FedAvg and FedAMP as Message-API strategies
(``flwr.serverapp.strategy.Strategy``, driven by its ``start()`` loop over a ``Grid``).

:class:`PaperStrategy` moves a paper's server logic onto the Message API without copying
it: it holds the registered legacy strategy of the run (``self.paper``: a
``PersonalizedStrategy`` from ``strategies/``) and calls only its transport-free hooks --
``sample`` (the seeded draw of partition-ids), ``prepare_round`` (FedAMP: the attention
weights Xi and the cloud models U = Xi W of eqs. 5/7), ``fit_payload`` / ``fit_extra`` /
``base_config`` (each client's arrays and its typed instructions,
:mod:`flower_pfl.instructions`), ``accept`` / ``aggregate_updates`` (FedAvg: the
sample-weighted mean; FedAMP: the uploads into the model store and its Gram rows),
``eval_payload`` and the evaluation reporting -- while the transport is the Message
API's: a ``QUERY`` handshake maps node ids to partition-ids, instructions and replies are
``ArrayRecord`` + ``ConfigRecord`` / ``MetricRecord`` (:mod:`.records`), error replies
and missing replies are the round's failures by partition-id.

Same numbers: the hooks, the seeded sampling and the clients' code are the legacy path's,
so a run writes the same ``clients.csv`` values (tests/test_message_api.py).  Not ported
(refused at construction, naming the key: :data:`UNPORTED`): checkpoints and resume,
differential privacy, ``max-update-norm``; ``start()`` has no early stop, so a stop
request ends the run after its last round only.  docs/design.md ("Message API spike")
says what a full port of every strategy takes.

Errors: ValueError for a configuration this class does not run (another strategy, an
unported key); :class:`~flower_pfl.strategies.federation.FederationError` when the grid's
node count differs from ``clients``; the legacy path's ``RoundError`` (too few answers).
"""

from __future__ import annotations

import time
from logging import INFO
from pathlib import Path
from typing import Any, ClassVar, Iterable, Sequence, cast

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.common import Code, EvaluateRes, Status
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy

from flower_pfl import registry
from flower_pfl.config import RunConfig
from flower_pfl.instructions import EvaluateInstruction
from flower_pfl.message_api.records import HANDSHAKE, instruction, metric_record, read_reply
from flower_pfl.reliability.uploads import EXTRA_ARRAYS, describe_parts
from flower_pfl.strategies.base import PersonalizedStrategy, fit_metrics
from flower_pfl.strategies.federation import ClientFailure, ClientUpdate, FederationError
from flower_pfl.strategies.nodes import WAIT_FOR_NODES_S

#: configuration keys whose mechanism lives in the legacy base's Flower-typed methods and is
#: not ported by the spike: key -> (the value that is refused, why)
UNPORTED: dict[str, tuple[Any, str]] = {
    "privacy.mode": ("not none", "differential privacy clips and noises inside the legacy "
                                 "configure_fit/aggregate_fit"),
    "max-update-norm": ("set", "the update-norm bound needs the legacy configure_fit's "
                               "record of what each client was sent"),
    "checkpoint-every": ("> 0", "checkpoints and resume are driven by the legacy round loop"),
}


def refuse_unported(cfg: RunConfig) -> None:
    """Raise ValueError naming the first :data:`UNPORTED` key ``cfg`` sets."""
    values = cfg.values
    refused = {"privacy.mode": str(values.get("privacy.mode", "none")) != "none",
               "max-update-norm": values.get("max-update-norm") is not None,
               "checkpoint-every": int(values.get("checkpoint-every", 0) or 0) > 0}
    for key, on in refused.items():
        if on:
            raise ValueError(f"{key} = {values.get(key)!r}: the Message-API spike does not "
                             f"run it ({UNPORTED[key][1]}); use the legacy path")


class PaperStrategy(Strategy):
    """A registered paper's server logic under ``flwr.serverapp.strategy.Strategy``.

    ``cfg``: a validated run configuration whose ``strategy`` is one of
    :attr:`papers`; ``results_dir``: where the legacy results files go (``clients.csv``,
    ``rounds.csv``, ``server.csv``, ``fit.csv``); ``initial_arrays``: the round-0 model
    (default: built from ``cfg``).  ``round_cost[r]`` holds round r's wall-clock seconds
    (``round_s``: from ``configure_train`` to the end of ``aggregate_evaluate``) and the
    server's own share (``server_s``: the four strategy methods)."""

    #: the registry names this class runs (subclasses)
    papers: ClassVar[tuple[str, ...]] = ()

    def __init__(self, cfg: RunConfig, results_dir: str | Path | None = None,
                 initial_arrays: Sequence[np.ndarray] | None = None) -> None:
        if cfg.strategy not in self.papers:
            raise ValueError(f"strategy = {cfg.strategy!r}: {type(self).__name__} runs "
                             f"{' / '.join(self.papers)}")
        refuse_unported(cfg)
        self.cfg = cfg
        self.num_rounds = int(cfg["rounds"])
        self.paper: PersonalizedStrategy = registry.strategy_class(cfg.strategy)(
            cfg, initial_arrays, results_dir)
        self.node_of: dict[int, int] = {}  # partition-id -> node id (the handshake)
        self.pid_of: dict[int, int] = {}  # node id -> partition-id
        self.round_cost: dict[int, dict[str, float]] = {}
        self._round_started = 0.0
        self._evaluating = False
        self._sampled: list[int] = []  # this round's partition-ids (configure_train)

    # ---------------------------------------------------------------- start() inputs
    def initial_record(self) -> ArrayRecord:
        """The round-0 model as the ArrayRecord ``start()`` takes (sets the paper up)."""
        self.paper.initialize_parameters(cast(Any, None))  # its ClientManager is unused
        arrays = self.paper.global_arrays or self.paper.initial_model or []
        return ArrayRecord([np.asarray(a) for a in arrays])

    def summary(self) -> None:
        log(INFO, "\t├──> paper: %s (%s), %d clients, results -> %s", self.cfg.strategy,
            type(self.paper).__name__, self.paper.num_clients, self.paper.results.dir)

    # -------------------------------------------------------------------- federation
    def handshake(self, grid: Grid) -> None:
        """Ask every node its partition-id (a QUERY message); there must be ``clients``,
        waited for up to ``WAIT_FOR_NODES_S`` as on the legacy path (Flower's runtimes may
        start the ServerApp before the nodes have registered)."""
        deadline = time.monotonic() + WAIT_FOR_NODES_S
        while (len(nodes := sorted(grid.get_node_ids())) < self.paper.num_clients
               and time.monotonic() < deadline):
            time.sleep(0.1)
        if len(nodes) != self.paper.num_clients:
            raise FederationError(f"the configuration says clients = {self.paper.num_clients}"
                                  f" but the grid has {len(nodes)} node(s)")
        asks = [Message(RecordDict(), dst_node_id=n, message_type=MessageType.QUERY)
                for n in nodes]
        for answer in grid.send_and_receive(asks):
            if answer.has_error():
                raise FederationError(f"node {answer.metadata.src_node_id} did not answer the "
                                      f"partition-id handshake: {answer.error.reason}")
            pid = int(cast(int, answer.content.config_records["info"][HANDSHAKE]))
            self.node_of[pid] = answer.metadata.src_node_id
        if sorted(self.node_of) != list(range(self.paper.num_clients)):
            raise FederationError(f"the nodes report partition-ids {sorted(self.node_of)}, "
                                  f"not 0..{self.paper.num_clients - 1}")
        self.pid_of = {n: p for p, n in self.node_of.items()}
        # NodeTracking.sample draws from the connected partition-ids, the keys of `proxies`
        self.paper.proxies = cast(Any, dict(self.node_of))

    def _message(self, pid: int, arrays: Sequence[np.ndarray], config: dict[str, Any],
                 kind: str, server_round: int) -> Message:
        return Message(instruction(arrays, config), dst_node_id=self.node_of[pid],
                       message_type=kind, group_id=str(server_round))

    # ------------------------------------------------------------------------ train
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: Any,
                        grid: Grid) -> Iterable[Message]:
        """Each sampled client's own payload (``arrays``/``config`` of ``start()`` unused:
        the paper's state decides what each client gets)."""
        self._round_started = time.perf_counter()
        if not self.node_of:  # (as the legacy handshake: before server_prepare_s starts)
            self.handshake(grid)
        started = time.perf_counter()
        paper = self.paper
        paper._round_server_log = {}  # a new server.csv row (legacy: configure_fit)
        sampled = paper.sample(server_round)
        self._sampled = list(sampled)
        paper.prepare_round(server_round, sampled)
        out = []
        for pid in sampled:
            payload, extra = paper.fit_payload(pid, server_round)
            extra_arrays = paper.fit_extra(pid, server_round)
            if extra_arrays:  # after the model, named in the config (SCAFFOLD's c)
                payload = [*payload, *(a for part in extra_arrays.values() for a in part)]
                extra = {**extra, EXTRA_ARRAYS: describe_parts(extra_arrays)}
            out.append(self._message(pid, payload, paper.base_config(server_round, extra, pid),
                                     MessageType.TRAIN, server_round))
        paper.log_server(server_prepare_s=round(time.perf_counter() - started, 4),
                         sampled=len(sampled))
        self._server_time(server_round, started)
        return out

    def updates_of(self, server_round: int, replies: Iterable[Message],
                   expected: set[int]) -> tuple[list[ClientUpdate], list[ClientFailure]]:
        """The replies as ClientUpdates (checked against the round's upload template) and
        a ClientFailure for each error reply, rejected upload or missing reply."""
        template = self.paper.template(server_round)
        updates, failures = [], []
        for msg in replies:
            pid = self.pid_of.get(msg.metadata.src_node_id, -1)
            expected.discard(pid)
            if msg.has_error():
                failures.append(ClientFailure(pid, f"error reply: {msg.error.reason}"))
                continue
            arrays, num_examples, metrics, _ = read_reply(msg.content)
            claimed = int(metrics.get("partition-id", pid))
            problem = (f"the upload claims partition-id {claimed}" if claimed != pid else
                       template.check(arrays, num_examples, metrics)
                       if self.paper.uploads_model or arrays else None)  # Local: nothing
            if problem is not None:
                failures.append(ClientFailure(pid, f"update rejected: {problem}"))
                continue
            model, extra = template.split(arrays)
            update = ClientUpdate(pid, model, num_examples, metrics)
            update.extra = extra
            updates.append(update)
        failures += [ClientFailure(pid, "no reply") for pid in sorted(expected)]
        return updates, failures

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The legacy round's steps on the Message API's replies (see the module doc)."""
        started = time.perf_counter()
        paper = self.paper
        updates, failures = self.updates_of(server_round, replies, set(self._sampled))
        failed = paper.record_failures(server_round, "fit", list(failures))
        carried = paper.accept(server_round, updates)
        paper.require_min_fit_answers(server_round, updates, failed)
        if updates:
            paper.aggregate_updates(server_round, paper.private_round(server_round, updates))
        paper.count_mechanism(server_round, updates, carried)
        paper.log_server(server_aggregate_s=round(time.perf_counter() - started, 4),
                         fit_ok=len(updates), fit_failed=len(failed),
                         fit_failed_ids=" ".join(str(p) for p, _ in sorted(failed)))
        paper.results.log_fit(server_round, [(u.pid, u.num_examples, u.metrics)
                                             for u in sorted(updates, key=lambda u: u.pid)])
        paper.results.log_server(server_round, paper.round_server_log)
        self._server_time(server_round, started)
        arrays = ArrayRecord(paper.global_arrays) if paper.global_arrays else None
        return arrays, metric_record(fit_metrics(updates, failed))

    # --------------------------------------------------------------------- evaluate
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: Any,
                           grid: Grid) -> Iterable[Message]:
        """Every client, every ``eval-every`` rounds and the last one (legacy rule)."""
        started = time.perf_counter()
        paper = self.paper
        self._evaluating = paper.is_eval_round(server_round)
        if not self._evaluating:
            return []
        eval_global = EvaluateInstruction(bool(paper.cfg["eval-global"]
                                               and paper.has_global_model)).to_config()
        out = []
        for pid in sorted(self.node_of):
            payload, extra = paper.eval_payload(pid, server_round)
            config_ = paper.base_config(server_round, {**eval_global, **extra}, pid)
            out.append(self._message(pid, payload, config_, MessageType.EVALUATE,
                                     server_round))
        self._server_time(server_round, started)
        return out

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        """The legacy reporting (clients.csv, rounds.csv, summary.json) on the replies."""
        started = time.perf_counter()
        paper, metrics = self.paper, None
        if self._evaluating:
            results: list[tuple[Any, EvaluateRes]] = []
            failures: list[Any] = []
            for msg in replies:
                pid = self.pid_of.get(msg.metadata.src_node_id, -1)
                if msg.has_error():
                    failures.append(ClientFailure(pid, f"error reply: {msg.error.reason}"))
                    continue
                _, num_examples, values, loss = read_reply(msg.content)
                results.append((None, EvaluateRes(Status(Code.OK, ""), loss, num_examples,
                                                  values)))
            _, summary = paper.aggregate_evaluate(server_round, results, failures)
            metrics = metric_record(summary)
        paper.after_round(server_round, self.num_rounds)
        self._server_time(server_round, started)
        cost = self.round_cost[server_round]
        cost["round_s"] = time.perf_counter() - self._round_started
        return metrics

    def _server_time(self, server_round: int, started: float) -> None:
        cost = self.round_cost.setdefault(server_round, {"server_s": 0.0})
        cost["server_s"] += time.perf_counter() - started


class MessageFedAvg(PaperStrategy):
    """FedAvg (McMahan et al. 2017): w <- sum_i (n_i / n) w_i (strategies/fedavg.py's
    ``aggregate_updates``, :func:`flower_pfl.algorithms.fedavg_math.weighted_average`)."""

    papers = ("fedavg", "fedavg-ft")


class MessageFedAMP(PaperStrategy):
    """FedAMP (Huang et al. 2021, eqs. 5-7): each sampled client gets its own cloud model
    u_i = sum_j xi_ij w_j and prox weight lambda/alpha_k (strategies/fedamp.py's
    ``attention`` / ``fit_config``, strategies/message_passing.py's ``prepare_round``);
    uploads go to the model store (``aggregate_updates``)."""

    papers = ("fedamp", "heurfedamp")


#: registry name -> its Message-API strategy class
STRATEGIES: dict[str, type[PaperStrategy]] = {
    name: cls for cls in (MessageFedAvg, MessageFedAMP) for name in cls.papers}


def strategy_for(cfg: RunConfig, results_dir: str | Path | None = None) -> PaperStrategy:
    """The Message-API strategy of ``cfg.strategy`` (ValueError: not part of the spike)."""
    if cfg.strategy not in STRATEGIES:
        raise ValueError(f"strategy = {cfg.strategy!r} has no Message-API port in the spike "
                         f"(ported: {', '.join(sorted(STRATEGIES))})")
    return STRATEGIES[cfg.strategy](cfg, results_dir)


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """The spike's ServerApp: the run's validated configuration from the run config
    (``cfg``, as flower-pfl's launchers set it), its strategy's ``start()`` on ``grid``.
    Pair it with :data:`flower_pfl.message_api.client_app.app`."""
    text = str(context.run_config.get("cfg", ""))
    if not text:
        raise ValueError("the run config has no 'cfg' (the validated configuration as JSON)")
    cfg = RunConfig.from_json(text)
    results = str(context.run_config.get("results-dir", "")) or None
    strategy = strategy_for(cfg, results)
    strategy.paper.cfg_travels = False  # the clients read it from the run config too
    strategy.start(grid, strategy.initial_record(), num_rounds=strategy.num_rounds)
