"""flower_pfl.tuned.linkstate_lookup answers as Flower's InMemoryLinkState.get_message_ins does.

Both methods run, on twin stores, the same sequence of stored messages (several nodes, two
runs, an expired one) and queries (limit 1, 2, None, a run filter, a node with nothing);
they must return the same messages in the same order, mark the same ones delivered and
leave the same unexpired messages in the store.  Ours may still hold expired messages that
Flower's walk past them deleted (never returned by either: they are checked first)."""

from __future__ import annotations

import random
import threading
from types import SimpleNamespace

import pytest
from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

from flower_pfl.tuned import linkstate_lookup

FLOWER = InMemoryLinkState.__dict__["get_message_ins"]  # Flower's own, whatever is installed


class TwinStore:
    """What both methods use of the LinkState: its lock, its store of pending messages, and
    Flower's check (an expired message is deleted)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.message_ins_store: dict[str, SimpleNamespace] = {}
        self.checked: list[str] = []

    def _check_stored_messages(self, message_ids: set[str], run_id: int | None = None) -> None:
        for msg_id in message_ids:
            self.checked.append(msg_id)
            msg = self.message_ins_store.get(msg_id)
            if msg is not None and msg.metadata.ttl <= 0:
                del self.message_ins_store[msg_id]

    def store(self, msg_id: str, node: int, run: int, ttl: float = 60.0) -> None:
        self.message_ins_store[msg_id] = SimpleNamespace(
            id=msg_id, metadata=SimpleNamespace(dst_node_id=node, run_id=run,
                                                delivered_at="", ttl=ttl))


def play(method, seed: int) -> tuple[list[list[str]], list[tuple[str, bool]], set[str]]:
    """The answers, the unexpired messages left in the store (delivered or not), and the
    expired ones left."""
    rng = random.Random(seed)
    store = TwinStore()
    answers = []
    for step in range(300):
        if rng.random() < 0.55:
            store.store(f"m{step}", node=rng.randrange(6), run=rng.choice([1, 1, 2]),
                        ttl=0.0 if rng.random() < 0.1 else 60.0)
        else:
            node = rng.randrange(7)  # node 6 never gets a message
            limit = rng.choice([1, 1, 2, None])
            run_id = rng.choice([None, 1, 2])
            answers.append([m.id for m in method(store, node, limit, run_id=run_id)])
    left = [(k, m.metadata.delivered_at != "") for k, m in store.message_ins_store.items()
            if m.metadata.ttl > 0]
    expired_kept = {k for k, m in store.message_ins_store.items() if m.metadata.ttl <= 0}
    return answers, left, expired_kept


@pytest.mark.parametrize("seed", range(5))
def test_the_same_messages_in_the_same_order_as_flowers_own(seed):
    flower, ours = play(FLOWER, seed), play(linkstate_lookup.get_message_ins, seed)
    assert ours[:2] == flower[:2]  # the same answers, the same unexpired messages left
    # ours may still hold expired messages that Flower's walks past them deleted
    assert flower[2] <= ours[2]
    assert sum(len(a) for a in ours[0]) > 20  # the sequences deliver messages
    assert any(len(a) == 2 for a in ours[0])  # limit 2 returns two


def test_only_the_nodes_own_messages_are_checked():
    store = TwinStore()
    for i in range(50):
        store.store(f"a{i}", node=1, run=1)
    store.store("b", node=2, run=1)
    assert [m.id for m in linkstate_lookup.get_message_ins(store, 2, 1)] == ["b"]
    assert store.checked == ["b"]  # Flower's method checks all 51 on the way
    store.checked.clear()
    FLOWER(store, 2, 1)
    assert len(store.checked) == 51


def test_a_limit_below_one_is_refused_as_by_flower():
    with pytest.raises(AssertionError):
        linkstate_lookup.get_message_ins(TwinStore(), 1, 0)


def test_install_puts_ours_once_and_uninstall_puts_flowers_back():
    try:
        linkstate_lookup.install()
        linkstate_lookup.install()  # twice: still ours, Flower's kept
        assert InMemoryLinkState.get_message_ins is linkstate_lookup.get_message_ins
        assert linkstate_lookup.installed()
    finally:
        linkstate_lookup.uninstall()
    assert InMemoryLinkState.get_message_ins is FLOWER and not linkstate_lookup.installed()
