"""flower_pfl.tuned.engine_wakeup: Flower's extractor and waiting threads, woken by stored messages.

On a real in-memory LinkState and InMemoryGrid (three nodes of one run, as Flower's
simulation registers them): with Flower's intervals raised to 60 s, a stored instruction
still reaches the engine's queue and a stored reply still ends a wait at once (switched
off, both wait the 60 s and the tests fail); and what the extractor queues, and what a
wait returns, is what Flower's own functions queue and return."""

from __future__ import annotations

import queue
import threading
import time
import uuid

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.proto.task_pb2 import Task  # pylint: disable=no-name-in-module
from flwr.server.superlink.fleet.vce import vce_api
from flwr.server.superlink.linkstate import LinkStateFactory
from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState, RunRecord
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid

from flower_pfl.tuned import engine_wakeup

RUN_ID = 7


@pytest.fixture
def installed():
    engine_wakeup.install()
    yield
    engine_wakeup.uninstall()


class Federation:
    """Flower's simulation in miniature: a LinkState with ``nodes`` nodes, a run, a grid."""

    def __init__(self, nodes: int = 3) -> None:
        TaskIdentity.task_id, TaskIdentity.run_id = 1, RUN_ID
        TaskIdentity.node_id = SUPERLINK_NODE_ID
        factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(),
                                   ObjectStoreFactory())
        self.state = factory.state()
        self.nodes = list(vce_api._register_nodes(nodes, factory))  # Flower's own helper
        run = Run.create_empty(run_id=RUN_ID)
        run.primary_task_id, run.federation_id = 11, NOOP_FEDERATION_ID
        self.state.run_ids[RUN_ID] = RunRecord(run=run)
        self.state.task_store[11] = Task(task_id=11, run_id=RUN_ID)
        self.grid = InMemoryGrid(state_factory=factory)
        self.grid.set_run(run)

    def instruction(self, node: int, x: int) -> Message:
        return Message(RecordDict({"c": ConfigRecord({"x": x})}), dst_node_id=node,
                       message_type="query")

    def answer(self, msg: Message) -> None:
        """The reply a worker of the engine stores for ``msg`` (its x, negated)."""
        x = msg.content["c"]["x"]
        reply = Message(RecordDict({"c": ConfigRecord({"x": -x})}), reply_to=msg)
        reply.metadata.__dict__["_message_id"] = str(uuid.uuid4())  # as vce_api.worker does
        assert self.state.store_message_res(reply) is not None


class Once:
    """A stop event that lets a loop make exactly one pass."""

    def __init__(self) -> None:
        self.asked = 0

    def is_set(self) -> bool:
        self.asked += 1
        return self.asked > 1

    def wait(self, timeout: float | None = None) -> bool:
        return False


def test_the_extractor_is_woken_by_a_stored_instruction(installed, monkeypatch):
    monkeypatch.setattr(engine_wakeup, "EXTRACTOR_TICK_S", 60.0)
    fed = Federation()
    out: queue.Queue = queue.Queue()
    stop = threading.Event()
    thread = threading.Thread(target=vce_api.add_messages_to_queue,
                              args=(fed.state, out, {n: i for i, n in enumerate(fed.nodes)},
                                    stop), daemon=True)
    thread.start()
    time.sleep(0.3)  # its first pass found nothing; it waits (up to 60 s)
    assert out.empty()
    fed.grid.push_messages([fed.instruction(fed.nodes[1], 5)])
    got = out.get(timeout=10)  # Flower's extractor: after its tick (here 60 s)
    assert (got.metadata.dst_node_id, got.content["c"]["x"]) == (fed.nodes[1], 5)
    stop.set()
    engine_wakeup.INSTRUCTIONS.raise_()
    thread.join(10)
    assert not thread.is_alive()


def test_a_waiting_thread_is_woken_by_a_stored_reply(installed):
    fed = Federation()
    fed.grid.pull_interval = 60.0  # Flower's thread would look again after 60 s
    got: list = []
    thread = threading.Thread(target=lambda: got.extend(fed.grid.send_and_receive(
        [fed.instruction(fed.nodes[0], 3), fed.instruction(fed.nodes[2], 4)])), daemon=True)
    thread.start()
    pending: list[Message] = []
    deadline = time.time() + 10
    while len(pending) < 2 and time.time() < deadline:  # the engine's side: pick them up
        for node in fed.nodes:
            pending += fed.state.get_message_ins(node_id=node, limit=1)
    assert len(pending) == 2
    fed.answer(pending[0])
    time.sleep(0.3)  # it looked, found one of two, waits again
    assert thread.is_alive() and not got
    fed.answer(pending[1])
    thread.join(10)
    assert not thread.is_alive()
    assert sorted(m.content["c"]["x"] for m in got) == [-4, -3]


def queued(extract, pushes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(node index, x) of what one pass of ``extract`` queues after ``pushes``."""
    fed = Federation(4)
    fed.grid.push_messages([fed.instruction(fed.nodes[n], x) for n, x in pushes])
    out: queue.Queue = queue.Queue()
    extract(fed.state, out, {n: i for i, n in enumerate(fed.nodes)}, Once())
    items = []
    while not out.empty():
        msg = out.get()
        items.append((fed.nodes.index(msg.metadata.dst_node_id), msg.content["c"]["x"]))
    return items


def test_one_pass_queues_what_flowers_queues_in_its_order(installed):
    pushes = [(2, 1), (0, 2), (2, 3), (3, 4), (0, 5), (1, 6), (3, 7)]
    ours = queued(engine_wakeup.add_messages_to_queue, pushes)
    flower = queued(engine_wakeup.flowers_own("add_messages_to_queue"), pushes)
    assert ours == flower == [(0, 2), (1, 6), (2, 1), (3, 4)]  # per node, its first; node order


@pytest.mark.parametrize("own", [False, True])
def test_a_wait_returns_what_flowers_returns_and_keeps_its_timeout(installed, own):
    fed = Federation()
    fed.grid.pull_interval = 0.02
    send = engine_wakeup.flowers_own("send_and_receive") if own else \
        engine_wakeup.send_and_receive

    def answer_later() -> None:
        answered = 0
        while answered < 2:
            for node in fed.nodes:
                for msg in fed.state.get_message_ins(node_id=node, limit=1):
                    time.sleep(0.05)
                    fed.answer(msg)
                    answered += 1

    helper = threading.Thread(target=answer_later, daemon=True)
    helper.start()
    replies = send(fed.grid, [fed.instruction(fed.nodes[2], 8),
                              fed.instruction(fed.nodes[1], 9)], timeout=30)
    helper.join(10)
    assert sorted(m.content["c"]["x"] for m in replies) == [-9, -8]
    started = time.time()
    assert list(send(fed.grid, [fed.instruction(fed.nodes[0], 1)], timeout=0.3)) == []
    assert time.time() - started >= 0.3  # nobody answers: it gave up at its timeout


def test_install_once_and_uninstall_puts_flowers_back():
    flower = {name: engine_wakeup.flowers_own(name) for name in
              ("add_messages_to_queue", "send_and_receive", "store_message_ins")}
    try:
        engine_wakeup.install()
        engine_wakeup.install()  # twice: still ours, Flower's kept (not wrapped twice)
        assert vce_api.add_messages_to_queue is engine_wakeup.add_messages_to_queue
        assert InMemoryGrid.send_and_receive is engine_wakeup.send_and_receive
        assert InMemoryLinkState.store_message_ins is not flower["store_message_ins"]
        assert engine_wakeup.flowers_own("store_message_ins") is flower["store_message_ins"]
    finally:
        engine_wakeup.uninstall()
    assert vce_api.add_messages_to_queue is flower["add_messages_to_queue"]
    assert InMemoryGrid.send_and_receive is flower["send_and_receive"]
    assert InMemoryLinkState.store_message_ins is flower["store_message_ins"]
