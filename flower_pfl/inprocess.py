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

from flwr.common import Context, RecordDict
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


def make_federation(num_clients: int, node_id_offset: int = 7000) -> SimpleClientManager:
    """``num_clients`` in-process nodes; node ids deliberately differ from partition ids."""
    manager = SimpleClientManager()
    for pid in reversed(range(num_clients)):  # registration order != partition order
        context = Context(run_id=0, node_id=node_id_offset + 3 * pid,
                          node_config={"partition-id": pid, "num-partitions": num_clients},
                          state=RecordDict(), run_config={})
        manager.register(InProcessProxy(str(node_id_offset + 3 * pid), context))
    return manager


def run(cfg: RunConfig, results_dir: str | Path, manager: SimpleClientManager | None = None,
        rounds: int | None = None) -> Any:
    """Run ``cfg`` for ``rounds`` (default: cfg's) and return the strategy (for inspection)."""
    manager = manager or make_federation(cfg["clients"])
    strategy = registry.get(cfg.strategy).strategy_cls()(cfg, results_dir=results_dir)
    parameters = strategy.initialize_parameters(manager)
    for server_round in range(1, (rounds or cfg["rounds"]) + 1):
        fit_ins = strategy.configure_fit(server_round, parameters, manager)
        results = [(proxy, proxy.fit(ins, None, None)) for proxy, ins in fit_ins]
        new_parameters, _ = strategy.aggregate_fit(server_round, results, [])
        if new_parameters is not None:
            parameters = new_parameters
        eval_ins = strategy.configure_evaluate(server_round, parameters, manager)
        evals = [(proxy, proxy.evaluate(ins, None, None)) for proxy, ins in eval_ins]
        strategy.aggregate_evaluate(server_round, evals, [])
    return strategy
