"""Run a strategy with its real clients in ONE process, without Ray or a SuperLink.

Same Strategy classes, same ``ClientApp`` (``flower_pfl.client_app.app``), same
``context.state`` records and the same legacy round loop as Flower's ``Server`` (fit
round, then federated evaluation).  Only the transport is a direct call, and it carries
what Flower's transport carries: each instruction becomes a Flower ``Message`` (the
legacy ``FitIns``/``EvaluateIns`` converted to records as Flower's ``GridClientProxy``
does), is deflated to bytes and inflated back as the SuperLink/SuperNode object store
does, handed with a serialised ``Context`` to the ``ClientApp``, and the reply goes the
same way back.  So record types, config value types and array shapes are checked as in
a real run.  Used by the fast tests (every strategy end to end in seconds) and by
benchmarks; ``flwr run`` (``flower-pfl run``) is the way to run experiments.

:func:`try_strategy` is the short way to try a new strategy from a Python prompt::

    from flower_pfl.running.inprocess import try_strategy
    strategy = try_strategy("fedavg", rounds=2, overrides="clients=6")
    print(strategy.results.dir)        # rounds.csv, clients.csv, server.csv, ...
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

from flwr.app import Context, Message, MessageType, Metadata, RecordDict
from flwr.app.message import make_message
from flwr.common import (  # the legacy messages (no newer home in Flower 1.42)
    Code,
    DisconnectRes,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    MessageTypeLegacy,
    ReconnectIns,
)
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.common.serde import context_from_proto, context_to_proto
from flwr.compat.common import recorddict_compat as compat
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

from flower_pfl import config as config_mod
from flower_pfl import registry
from flower_pfl.client_app import app as client_app
from flower_pfl.config import RunConfig

if TYPE_CHECKING:  # what registry.strategy_class builds; imported with it at run time
    from flower_pfl.strategies.base import PersonalizedStrategy

#: a legacy instruction (FitIns, EvaluateIns) and the reply it gets (FitRes, EvaluateRes)
InsT = TypeVar("InsT", FitIns, EvaluateIns)
ResT = TypeVar("ResT", FitRes, EvaluateRes)
#: what ``on_round`` of :func:`run` is called with: the strategy and the round just done
OnRound = Callable[["PersonalizedStrategy", int], object]


def over_the_wire(message: Message) -> Message:
    """``message`` deflated to bytes and inflated back, as Flower's object store moves it."""
    contents = {oid: obj.deflate() for oid, obj in get_all_nested_objects(message).items()}
    out = inflate_object_from_contents(message.object_id, contents)
    assert isinstance(out, Message), "the root object of a Message's contents is the Message"
    out.metadata.__dict__["_message_id"] = message.object_id  # as the SuperLink sets it
    return out


class InProcessProxy(ClientProxy):
    """A ClientProxy that sends Flower Messages to the ClientApp in this process.

    ``context`` is the node's Context; it crosses the boundary serialised (as a SuperNode
    hands it to a ClientApp process) and the ClientApp's updated copy replaces it."""

    def __init__(self, cid: str, context: Context) -> None:
        super().__init__(cid)
        self.context = context

    def _send(self, content: RecordDict, message_type: str, group_id: int | None
              ) -> RecordDict:
        metadata = Metadata(run_id=self.context.run_id, message_id="",
                            src_node_id=SUPERLINK_NODE_ID, dst_node_id=int(self.cid),
                            reply_to_message_id="", group_id=str(group_id or ""),
                            created_at=time.time(), ttl=43200.0, message_type=message_type)
        message = over_the_wire(make_message(metadata=metadata, content=content))
        context = context_from_proto(context_to_proto(self.context))
        reply = over_the_wire(client_app(message, context))
        self.context = context_from_proto(context_to_proto(context))
        if reply.has_error():  # as GridClientProxy reports an error reply
            raise ValueError(f"Message contains an Error (reason: {reply.error.reason}). "
                             "It originated during client-side execution of a message.")
        return reply.content

    def get_properties(self, ins: GetPropertiesIns, timeout: float | None,
                       group_id: int | None) -> GetPropertiesRes:
        content = self._send(compat.getpropertiesins_to_recorddict(ins),
                             MessageTypeLegacy.GET_PROPERTIES, group_id)
        return compat.recorddict_to_getpropertiesres(content)

    def get_parameters(self, ins: GetParametersIns, timeout: float | None,
                       group_id: int | None) -> GetParametersRes:
        content = self._send(compat.getparametersins_to_recorddict(ins),
                             MessageTypeLegacy.GET_PARAMETERS, group_id)
        return compat.recorddict_to_getparametersres(content, False)

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        content = self._send(compat.fitins_to_recorddict(ins, keep_input=True),
                             MessageType.TRAIN, group_id)
        return compat.recorddict_to_fitres(content, keep_input=False)

    def evaluate(self, ins: EvaluateIns, timeout: float | None,
                 group_id: int | None) -> EvaluateRes:
        content = self._send(compat.evaluateins_to_recorddict(ins, keep_input=True),
                             MessageType.EVALUATE, group_id)
        return compat.recorddict_to_evaluateres(content)

    def reconnect(self, ins: ReconnectIns, timeout: float | None,
                  group_id: int | None) -> DisconnectRes:
        raise NotImplementedError


def make_federation(num_clients: int, node_id_offset: int = 7000,
                    proxy_cls: type[InProcessProxy] = InProcessProxy,
                    run_config: dict[str, str] | None = None) -> SimpleClientManager:
    """``num_clients`` in-process nodes; node ids deliberately differ from partition ids.

    ``proxy_cls`` lets tests put a faulty transport in between; ``run_config`` is what the
    ClientApp sees as ``context.run_config`` (e.g. ``client-state-dir``)."""
    manager = SimpleClientManager()
    for pid in reversed(range(num_clients)):  # registration order != partition order
        context = Context(run_id=0, node_id=node_id_offset + 3 * pid,
                          node_config={"partition-id": pid, "num-partitions": num_clients},
                          state=RecordDict(), run_config=dict(run_config or {}))
        manager.register(proxy_cls(str(node_id_offset + 3 * pid), context))
    return manager


def _call_all(instructions: Sequence[tuple[ClientProxy, InsT]],
              call: Callable[[ClientProxy, InsT], ResT]
              ) -> tuple[list[tuple[ClientProxy, ResT]],
                         list[tuple[ClientProxy, ResT] | BaseException]]:
    """Like Flower's fit_clients/evaluate_clients: exceptions and non-OK replies are failures.
    ``call(proxy, ins)``: ``proxy.fit(ins, None, None)`` or ``proxy.evaluate(...)``."""
    results: list[tuple[ClientProxy, ResT]] = []
    failures: list[tuple[ClientProxy, ResT] | BaseException] = []
    for proxy, ins in instructions:
        try:
            res = call(proxy, ins)
        except Exception as exc:  # noqa: BLE001 - Flower collects every exception
            failures.append(exc)
            continue
        if res.status.code == Code.OK:
            results.append((proxy, res))
        else:
            failures.append((proxy, res))
    return results, failures


def run(cfg: RunConfig, results_dir: str | Path, manager: SimpleClientManager | None = None,
        rounds: int | None = None, resume: bool = False,
        client_state_dir: str | Path | None = None, on_round: OnRound | None = None,
        cfg_travels: bool | None = None) -> PersonalizedStrategy:
    """Run ``cfg`` for ``rounds`` (default: cfg's) and return the strategy (for inspection).

    ``resume``: continue from the newest checkpoint in ``results_dir``;
    ``client_state_dir``: as ``flower-pfl run`` does in simulation (checkpointed with the
    server); ``on_round(strategy, server_round)`` is called after each round (tests);
    ``cfg_travels``: whether every message carries the configuration (default: only when the
    caller brings its own ``manager``; the federation built here has it in its run config,
    as ``flower-pfl run`` gives it to the clients).  An exception (a RoundError, a test's
    own) ends the run ``failed`` in its summary.json, with the error, and is raised."""
    if cfg_travels is None:
        cfg_travels = manager is not None
    manager = manager or make_federation(
        cfg["clients"], run_config={"client-state-dir": str(client_state_dir or ""),
                                    "cfg": cfg.to_json()})
    strategy: PersonalizedStrategy = registry.strategy_class(cfg.strategy)(
        cfg, results_dir=results_dir)
    strategy.cfg_travels = cfg_travels
    if client_state_dir is not None and int(cfg["checkpoint-every"]) > 0:
        strategy.client_state_dir = Path(client_state_dir)
    with strategy.results.record_outcome():  # as the ServerApp: raised -> status failed
        _rounds(strategy, manager, rounds or cfg["rounds"], resume, on_round)
    return strategy


def _rounds(strategy: PersonalizedStrategy, manager: SimpleClientManager, last: int,
            resume: bool, on_round: OnRound | None) -> None:
    """The legacy round loop of :func:`run` (``ResumableServer.fit``'s, in one process)."""
    if resume:
        strategy.results.adopt_earlier_rounds()  # until the checkpoint's list replaces them
        strategy.resume()
    parameters = strategy.initialize_parameters(manager)
    assert parameters is not None, "our strategies build the initial model from the config"
    for server_round in range(strategy.start_round, last + 1):
        fit_ins = strategy.configure_fit(server_round, parameters, manager)
        results, failures = _call_all(fit_ins, lambda proxy, ins: proxy.fit(ins, None, None))
        new_parameters, _ = strategy.aggregate_fit(server_round, results, failures)
        if new_parameters is not None:
            parameters = new_parameters
        eval_ins = strategy.configure_evaluate(server_round, parameters, manager)
        if eval_ins:
            evals, eval_failures = _call_all(
                eval_ins, lambda proxy, ins: proxy.evaluate(ins, None, None))
            strategy.aggregate_evaluate(server_round, evals, eval_failures)
        if on_round is not None:
            on_round(strategy, server_round)
        if strategy.after_round(server_round, last):
            break  # as flower_pfl.server_app.ResumableServer: the last round, or a stop


#: what :func:`try_strategy` runs on: a few clients of a small real FMNIST subset
TRY = {"rounds": 2, "clients": 4, "fraction-fit": 1.0, "model": "dnn", "seed": 0,
       "data": {"dataset": "fmnist", "partition": "dirichlet", "subsample": 2000},
       "train": {"epochs": 1, "batch-size": 32, "lr": 0.05}}


def try_strategy(strategy: str, rounds: int = 2, results_dir: str | Path | None = None,
                 overrides: str | dict[str, Any] | None = None) -> PersonalizedStrategy:
    """Run the registered ``strategy`` in this process for ``rounds`` rounds on :data:`TRY`
    (``overrides``: ``"key=value ..."`` or a mapping, as ``--set``) and return the strategy;
    its CSV files are in ``strategy.results.dir`` (``results_dir``, default a new temporary
    folder).  The configuration is validated as ``flower-pfl validate`` does."""
    mapping = overrides if isinstance(overrides, dict) else config_mod.parse_overrides(overrides)
    cfg = config_mod.validate(config_mod.merge(TRY, {"strategy": strategy, "rounds": rounds,
                                                     **mapping}), source="try_strategy")
    out = Path(results_dir) if results_dir else Path(tempfile.mkdtemp(prefix=f"{strategy}-"))
    return run(cfg, out)
