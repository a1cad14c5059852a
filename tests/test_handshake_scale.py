"""The partition-id handshake at the size of the federation (flower_pfl/strategies/nodes.py):
its wait and its messages' lifetime grow with the number of nodes, so a large simulation's
slow start (Flower's engine creates one context per node before it delivers anything) does
not expire them; a node that really does not answer is still named."""

from __future__ import annotations

import pytest
from flwr.common import Code, GetPropertiesRes, Status

from flower_pfl.strategies import nodes
from flower_pfl.strategies.federation import FederationError


class SlowStart:
    """A federation whose engine needs ``start_s`` before it delivers a message: a message
    whose lifetime (the handshake's timeout) is shorter has expired by then."""

    def __init__(self, num_nodes: int, start_s: float, silent: int | None = None) -> None:
        self.start_s, self.silent = start_s, silent
        self.proxies = {f"n{i}": Node(self, f"n{i}", i) for i in range(num_nodes)}
        self.lifetimes: list[float] = []

    def num_available(self) -> int:
        return len(self.proxies)

    def wait_for(self, num_clients: int, timeout: int) -> bool:
        return True

    def all(self) -> dict:
        return self.proxies


class Node:
    def __init__(self, engine: SlowStart, cid: str, pid: int) -> None:
        self.engine, self.cid, self.pid = engine, cid, pid

    def get_properties(self, ins, timeout, group_id):
        self.engine.lifetimes.append(timeout)
        if timeout < self.engine.start_s or self.pid == self.engine.silent:
            raise TimeoutError("no reply before the message expired")
        return GetPropertiesRes(Status(Code.OK, ""), {"partition-id": self.pid})


class Tracking(nodes.NodeTracking):
    def __init__(self, num_clients: int) -> None:
        self.num_clients, self.pid_of_cid, self.proxies = num_clients, {}, {}
        self._federation_checked = False


def test_the_handshake_wait_grows_with_the_federation():
    assert nodes.handshake_wait_s(20) == pytest.approx(120.2)
    assert nodes.handshake_wait_s(100_000) == pytest.approx(1_120.0)
    # 100,000 nodes whose engine takes 1.6 ms a node to start (160 s: a fixed 120-s
    # lifetime expires, as it did before): every node is mapped
    engine = SlowStart(100_000, start_s=0.0016 * 100_000)
    tracking = Tracking(100_000)
    tracking.handshake(engine)
    assert len(tracking.proxies) == 100_000 and tracking.proxies[99_999].cid == "n99999"
    assert len(engine.lifetimes) == 100_000 and set(engine.lifetimes) == {1_120.0}


def test_a_node_that_does_not_answer_is_still_named():
    engine = SlowStart(30, start_s=1.0, silent=17)
    with pytest.raises(FederationError, match="node n17 did not answer the partition-id "
                                              "handshake"):
        Tracking(30).handshake(engine)
