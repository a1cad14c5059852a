"""A SuperNode's fixed waits: a new message seen within 0.2 s, a reply sent within 0.05 s.

Flower 1.42's SuperNode (``flower-supernode``; ``flwr/supernode/start_client_internal.py``)
runs one loop: ask the SuperLink for a message (``_pull_and_store_message``); none -- sleep
3 s (``time.sleep(3)`` in ``start_client_internal``) and ask again; one -- wait for its
ClientApp's reply, looking every 0.5 s (``time.sleep(0.5)`` in ``_push_messages``), then send
it, waiting 0.5 s for each of its objects not yet stored.  So a message sits up to 3 s on
the SuperLink before its node sees it, and a reply up to 0.5 s on the node: per fit or
evaluate step up to 3.5 s, none of it configurable.

:func:`install` gives that module a ``time`` of ours (:class:`ShortSleeps`): everything is
the ``time`` module's, but ``sleep(3)`` sleeps :data:`IDLE_POLL_S` and ``sleep(0.5)`` sleeps
:data:`REPLY_POLL_S`.  The loop, its requests and their order are Flower's; an idle node only
asks the SuperLink more often (5 small requests a second instead of one in 3 s).  The body
checks (:data:`NEEDS`) make sure the sleeps are the ones of Flower 1.42.0's code, so no other
wait of a later Flower is shortened unseen.

Installed in the SuperNode's process by :mod:`flower_pfl.tuned.entry` (``engine:
tuned``; the launchers start Flower's ``flower-supernode`` itself under ``stock``) through
:func:`flower_pfl.tuned.switch.install`.  ``FLOWER_PFL_FLOWER_NODE=1`` keeps Flower's waits.
No Flower import at module level.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from flower_pfl.tuned.gate import Need
from flower_pfl.tuned.patch import Replaced

#: set to 1 to keep Flower's 3-s / 0.5-s waits in the SuperNode
KEEP_FLOWER_ENV = "FLOWER_PFL_FLOWER_NODE"

_SCI = "flwr.supernode.start_client_internal"
#: what of Flower's :func:`install` replaces (flower_pfl/tuned/gate.py)
NEEDS = [
    Need(f"{_SCI}:time"),  # the module's name for ``time``: ours goes there
    Need(f"{_SCI}:start_client_internal", "body", "9e89a6eb68fbec68"),  # sleep(3): 1.42.0's
    Need(f"{_SCI}:_push_messages", "body", "00bb86faffdec114"),  # sleep(0.5): 1.42.0's
]
#: Flower's idle wait (no message on the SuperLink) and ours, in seconds
FLOWER_IDLE_S, IDLE_POLL_S = 3.0, 0.2
#: Flower's wait for a reply (or its object) on the node, and ours, in seconds
FLOWER_REPLY_S, REPLY_POLL_S = 0.5, 0.05
#: Flower's sleep -> ours; any other duration is slept as asked
SHORTER = {FLOWER_IDLE_S: IDLE_POLL_S, FLOWER_REPLY_S: REPLY_POLL_S}


class ShortSleeps:
    """The ``time`` module, but :meth:`sleep` of :data:`SHORTER`'s durations is shortened.
    ``real_sleep`` is what sleeps (tests pass a recorder)."""

    def __init__(self, real_sleep: Callable[[float], None] = time.sleep) -> None:
        self.real_sleep = real_sleep

    def sleep(self, seconds: float) -> None:
        self.real_sleep(SHORTER.get(seconds, seconds))

    def __getattr__(self, name: str) -> Any:  # time.time, time.monotonic, ...
        return getattr(time, name)


#: what :func:`install` puts in Flower's place, in this process (flower_pfl/tuned/patch.py):
#: before ``flower_supernode()`` starts its loop (it reads ``time`` on each sleep, so a late
#: install still shortens the next one)
_replaced = Replaced({f"{_SCI}:time": ShortSleeps()})
install, installed, uninstall = _replaced.install, _replaced.installed, _replaced.undo
