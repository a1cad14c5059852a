"""A node's pending messages found by their destination first, in Flower's in-memory LinkState.

Flower's simulation engine hands messages to the ClientApp actors from a thread that, every
0.1 s, asks the in-memory LinkState for one pending message per node, for EVERY node of the
federation (``flwr/server/superlink/fleet/vce/vce_api.py``, ``add_messages_to_queue``).
``InMemoryLinkState.get_message_ins`` (``flwr/server/superlink/linkstate/
in_memory_linkstate.py``) answers each of those calls by walking the whole store of pending
messages and running ``_check_stored_messages`` (a clock read, a TTL and a federation check)
on every message it passes, whoever it is for.  One pass of the engine therefore costs
(nodes x messages in flight) checks: with 1,000 nodes and 100 messages in flight, ~10^5
checks per 0.1 s tick, and the time per message grows with the number of clients in the
federation, not with the number sampled.

:func:`install` replaces that method, in the process that runs the simulation engine (the
ServerApp's process), by :func:`get_message_ins`, which first selects the store's messages
addressed to ``node_id`` (an attribute comparison each) and runs Flower's checks only on
those, in the store's order.  What a call returns is what Flower's returns: the first
``limit`` undelivered, unexpired messages for that node and run, in insertion order,
marked delivered.  One difference: an expired message is deleted when ITS node is next
asked (the engine asks every node on every tick), not when another node's query walks past
it.  ``tests/test_linkstate_lookup.py`` runs both on the same sequences of stores and
queries.  Installed by :func:`flower_pfl.tuned.switch.install` (``engine: tuned``) after
:data:`NEEDS` are met; ``FLOWER_PFL_FLOWER_LOOKUP=1`` leaves Flower's own method in place
(for measuring one against the other: benchmarks/client_scale.py).
"""

from __future__ import annotations

from typing import Any

from flower_pfl.tuned.gate import Need
from flower_pfl.tuned.patch import Replaced

#: set to 1 to keep Flower's own InMemoryLinkState.get_message_ins
KEEP_FLOWER_ENV = "FLOWER_PFL_FLOWER_LOOKUP"

_STATE = "flwr.server.superlink.linkstate.in_memory_linkstate:InMemoryLinkState"
#: what of Flower's :func:`get_message_ins` replaces and reads (flower_pfl/tuned/gate.py)
NEEDS = [
    Need(f"{_STATE}.get_message_ins", "body", "224d79339150c8cb"),  # Flower 1.42.0's
    Need(f"{_STATE}._check_stored_messages", "params", "self,message_ids,run_id"),
    Need(f"{_STATE}.__init__", "names", "lock"),
    Need(f"{_STATE}.__init__", "names", "message_ins_store"),
    Need("flwr.supercore.date:now"),
]


def get_message_ins(self: Any, node_id: int, limit: int | None, *,
                    run_id: int | None = None) -> list[Any]:
    """``InMemoryLinkState.get_message_ins`` with the messages for ``node_id`` selected
    before Flower's per-message checks (see the module docstring)."""
    # the clock Flower's in_memory_linkstate reads (it imports this `now`)
    from flwr.supercore.date import now

    if limit is not None and limit < 1:
        raise AssertionError("`limit` must be >= 1")
    found: list[Any] = []
    with self.lock:
        mine = [msg_id for msg_id, msg in self.message_ins_store.items()
                if msg.metadata.dst_node_id == node_id]
        for msg_id in mine:
            self._check_stored_messages({msg_id})
            msg = self.message_ins_store.get(msg_id)
            if (msg is not None and (run_id is None or msg.metadata.run_id == run_id)
                    and msg.metadata.delivered_at == ""):
                found.append(msg)
            if limit and len(found) == limit:
                break
    delivered_at = now().isoformat()
    for msg in found:
        msg.metadata.delivered_at = delivered_at
    return found


#: what :func:`install` puts in Flower's place (flower_pfl/tuned/patch.py)
_replaced = Replaced({f"{_STATE}.get_message_ins": get_message_ins})
install, installed, uninstall = _replaced.install, _replaced.installed, _replaced.undo
