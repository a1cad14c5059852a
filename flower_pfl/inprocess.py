"""Run a strategy with its real clients in ONE process, without Ray or a SuperLink.

Same Strategy classes, same NumPyClient classes, same ``context.state`` records and the
same legacy round loop as Flower's ``Server`` (fit round, then federated evaluation);
only the transport is a direct call.  Used by the tests to check algorithm behaviour on
real data in seconds and by benchmarks; ``flwr run`` (``flower-pfl run``) is the way to
run experiments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flwr.common import Code, Context, RecordDict
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy

from flower_pfl import registry
from flower_pfl.client_app import client_fn
from flower_pfl.config import RunConfig


class InProcessProxy(ClientProxy):
    """A ClientProxy that calls the ClientApp's client directly, keeping its Context."""

    def __init__(self, cid: str, context: Context) -> None:
        super().__init__(cid)
        self.context = context

    def get_properties(self, ins, timeout, group_id):
        return client_fn(self.context).get_properties(ins)

    def get_parameters(self, ins, timeout, group_id):
        return client_fn(self.context).get_parameters(ins)

    def fit(self, ins, timeout, group_id):
        return client_fn(self.context).fit(ins)

    def evaluate(self, ins, timeout, group_id):
        return client_fn(self.context).evaluate(ins)

    def reconnect(self, ins, timeout, group_id):
        raise NotImplementedError


def make_federation(num_clients: int, node_id_offset: int = 7000,
                    proxy_cls: type[InProcessProxy] = InProcessProxy,
                    run_config: dict | None = None) -> SimpleClientManager:
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


def _call_all(instructions, method: str) -> tuple[list, list]:
    """Like Flower's fit_clients/evaluate_clients: exceptions and non-OK replies are failures."""
    results, failures = [], []
    for proxy, ins in instructions:
        try:
            res = getattr(proxy, method)(ins, None, None)
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
        client_state_dir: str | Path | None = None, on_round=None) -> Any:
    """Run ``cfg`` for ``rounds`` (default: cfg's) and return the strategy (for inspection).

    ``resume``: continue from the newest checkpoint in ``results_dir``;
    ``client_state_dir``: as ``flower-pfl run`` does in simulation (checkpointed with the
    server); ``on_round(strategy, server_round)`` is called after each round (tests)."""
    manager = manager or make_federation(
        cfg["clients"], run_config={"client-state-dir": str(client_state_dir or "")})
    strategy = registry.get(cfg.strategy).strategy_cls()(cfg, results_dir=results_dir)
    if client_state_dir is not None and int(cfg["checkpoint-every"]) > 0:
        strategy.client_state_dir = Path(client_state_dir)
    if resume:
        strategy.resume()
    parameters = strategy.initialize_parameters(manager)
    for server_round in range(strategy.start_round, (rounds or cfg["rounds"]) + 1):
        fit_ins = strategy.configure_fit(server_round, parameters, manager)
        results, failures = _call_all(fit_ins, "fit")
        new_parameters, _ = strategy.aggregate_fit(server_round, results, failures)
        if new_parameters is not None:
            parameters = new_parameters
        eval_ins = strategy.configure_evaluate(server_round, parameters, manager)
        if eval_ins:
            evals, failures = _call_all(eval_ins, "evaluate")
            strategy.aggregate_evaluate(server_round, evals, failures)
        if on_round is not None:
            on_round(strategy, server_round)
    return strategy
