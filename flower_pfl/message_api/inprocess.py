"""The spike's strategies on an in-process ``Grid``: the Message-API twin of
:mod:`flower_pfl.running.inprocess` (same nodes, same transport), for tests and the
benchmark (benchmarks/message_api_spike.py).

:class:`InProcessGrid` hands each message to the Message-API ClientApp
(:data:`flower_pfl.message_api.client_app.app`) in this process, as the legacy in-process
runner does: the message deflated to bytes and inflated back as Flower's object store
moves it (``over_the_wire``), the node's ``Context`` serialised across the boundary and
the ClientApp's updated copy kept; an exception in the ClientApp becomes an error reply,
as a SuperNode sends one.  The nodes are :func:`~flower_pfl.running.inprocess.
make_federation`'s (node ids unlike partition-ids, registered in reverse order).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, cast

from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.common.serde import context_from_proto, context_to_proto
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from flower_pfl.config import RunConfig
from flower_pfl.message_api.client_app import app as client_app
from flower_pfl.message_api.server_app import PaperStrategy, strategy_for
from flower_pfl.running.inprocess import InProcessProxy, make_federation, over_the_wire

#: the error code of a ClientApp that raised (Flower's ``ErrorCode.CLIENT_APP_RAISED_EXCEPTION``)
CLIENT_APP_RAISED = 1


def _copy(context: Context) -> Context:
    return context_from_proto(context_to_proto(context))


class InProcessGrid(Grid):
    """A ``Grid`` whose nodes are ``contexts`` (node id -> Context) in this process; each
    message is answered when pushed (``pull_messages`` returns the stored replies)."""

    def __init__(self, contexts: Mapping[int, Context]) -> None:
        self.contexts = dict(contexts)
        self._run = Run.create_empty(run_id=0)
        self._replies: dict[str, Message] = {}
        self._next_id = 0

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_run_id"] = self._run.run_id
            msg.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
            sent = over_the_wire(msg)
            node = msg.metadata.dst_node_id
            context = _copy(self.contexts[node])
            try:
                answer = client_app(sent, context)
            except Exception as exc:  # noqa: BLE001 - as a SuperNode: an error reply
                answer = Message(Error(CLIENT_APP_RAISED, f"{type(exc).__name__}: {exc}"),
                                 reply_to=sent)
            self.contexts[node] = _copy(context)
            key = f"m{self._next_id}"
            self._next_id += 1
            self._replies[key] = over_the_wire(answer)
            ids.append(key)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))


def make_grid(cfg: RunConfig, client_state_dir: str | Path | None = None) -> InProcessGrid:
    """``cfg['clients']`` in-process nodes, each with the run's configuration in its run
    config (``cfg``), as :func:`flower_pfl.running.inprocess.run` builds them."""
    manager = make_federation(int(cfg["clients"]), run_config={
        "client-state-dir": str(client_state_dir or ""), "cfg": cfg.to_json()})
    # the proxies are InProcessProxy (each holds its node's Context); typed ClientProxy
    return InProcessGrid({int(cid): cast(InProcessProxy, proxy).context
                          for cid, proxy in manager.all().items()})


def run(cfg: RunConfig, results_dir: str | Path, grid: InProcessGrid | None = None,
        on_round: Callable[[PaperStrategy, int], None] | None = None) -> PaperStrategy:
    """Run ``cfg`` with its Message-API strategy through ``start()`` on ``grid`` (default:
    :func:`make_grid`); returns the strategy (``paper.results.dir`` has the CSV files,
    ``round_cost`` the per-round seconds).  ``on_round(strategy, r)`` is called after
    each round r, and with r = 0 before the first (``start()``'s ``evaluate_fn``), as the
    legacy runner's ``on_round``.  An exception ends the run ``failed`` in its
    summary.json, as the legacy runner does, and is raised."""
    strategy = strategy_for(cfg, results_dir)
    # the clients read the configuration from their run config (make_grid puts it there)
    strategy.paper.cfg_travels = False

    def after(server_round: int, arrays: object) -> None:
        if on_round is not None:
            on_round(strategy, server_round)

    grid = grid or make_grid(cfg)
    with serverapp_identity(grid.run.run_id), strategy.paper.results.record_outcome():
        strategy.start(grid, strategy.initial_record(), num_rounds=strategy.num_rounds,
                       evaluate_fn=after if on_round is not None else None)
    return strategy


@contextmanager
def serverapp_identity(run_id: int) -> Iterator[None]:
    """This process as a ServerApp task of run ``run_id`` while the block runs: Flower 1.42's
    ``Message(...)`` reads ``TaskIdentity.run_id`` (set by Flower's ServerApp runtime, not
    by a plain call of ``start()``); the earlier identity is restored after."""
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run_id, SUPERLINK_NODE_ID
    try:
        yield
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved
