"""A deployment's ServerApp: replies picked up within 0.1 s, not in 3-s steps.

Under deployment, the ServerApp process (``flwr-serverapp``, running our
``flower_pfl.server_app`` main) talks to its SuperLink through Flower's ``HttpGrid``
(``flwr/superlink/grid/http_grid.py``).  The legacy round loop sends each client's message
from its own thread with ``HttpGrid.send_and_receive``, which pushes the message, then asks
the SuperLink for the reply (``pull_messages``) and, while it is not there, sleeps 3 s
(``time.sleep(3)``, not configurable).  A fit or evaluate step therefore ends up to 3 s
(1.5 s on average) after its last reply came in.

:func:`send_and_receive` is Flower's body with that sleep shortened to :data:`POLL_S`: the
same push, the same pulls (each one HTTP request to the SuperLink), the same replies in
the same order, the same ``timeout`` -- only more looks while a reply is missing.  With
``clients`` waiting threads that is ``clients / POLL_S`` small requests a second to the
SuperLink while a step runs (20 clients: 200/s), which the SuperLink serves from memory.

Installed by :func:`flower_pfl.tuned.switch.install` (``engine: tuned``, a deployment's
ServerApp) after :data:`NEEDS` are met (the ``body`` check: Flower 1.42.0's
``send_and_receive``).  ``FLOWER_PFL_FLOWER_GRID=1`` keeps Flower's 3-s steps (measuring).
No Flower import at module level.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from flower_pfl.tuned.gate import Need
from flower_pfl.tuned.patch import Replaced

#: set to 1 to keep Flower's 3-s reply polling in a deployment's ServerApp
KEEP_FLOWER_ENV = "FLOWER_PFL_FLOWER_GRID"

_GRID = "flwr.superlink.grid.http_grid:HttpGrid"
#: what of Flower's :func:`install` replaces and calls (flower_pfl/tuned/gate.py)
NEEDS = [
    Need(f"{_GRID}.send_and_receive", "body", "d8474171bdaaf132"),  # Flower 1.42.0's
    Need(f"{_GRID}.push_messages", "params", "self,messages"),
    Need(f"{_GRID}.pull_messages", "params", "self,message_ids"),
]
#: seconds between two looks for the replies still missing (Flower: 3)
POLL_S = 0.1
#: what the wait between two looks calls (tests count the calls through it)
sleep: Callable[[float], None] = time.sleep

_replaced = Replaced()  # what install() put in Flower's place


def send_and_receive(self: Any, messages: Iterable[Any], *,
                     timeout: float | None = None) -> Iterable[Any]:
    """Flower's ``HttpGrid.send_and_receive``: push ``messages``, then pull their replies
    until all are in or ``timeout`` s have passed, looking again every :data:`POLL_S` s
    (Flower: 3 s).  Returns the replies in the order they were pulled."""
    msg_ids = set(self.push_messages(messages))
    del messages
    end_time = time.time() + (timeout if timeout is not None else 0.0)
    ret: list[Any] = []
    while timeout is None or time.time() < end_time:
        res_msgs = self.pull_messages(msg_ids)
        ret.extend(res_msgs)
        msg_ids.difference_update({msg.metadata.reply_to_message_id for msg in res_msgs})
        if len(msg_ids) == 0:
            break
        wait = POLL_S
        if timeout is not None:  # never past the deadline by more than a look
            wait = min(wait, max(0.0, end_time - time.time()))
        sleep(wait)
    return ret


def install() -> None:
    """Put :func:`send_and_receive` in the place of ``HttpGrid.send_and_receive`` in this
    process (once; the caller, :func:`flower_pfl.tuned.switch.install`, checked
    :data:`NEEDS` first)."""
    from flwr.superlink.grid.http_grid import HttpGrid

    if not _replaced:
        _replaced.put(HttpGrid, "send_and_receive", send_and_receive)


def installed() -> bool:
    """True while ours is in Flower's place."""
    return bool(_replaced)


def flowers_own() -> Callable[..., Any]:
    """Flower's own ``HttpGrid.send_and_receive``, installed or not."""
    from flwr.superlink.grid.http_grid import HttpGrid

    return _replaced.flowers("send_and_receive", HttpGrid)


def uninstall() -> None:
    """Put Flower's own back."""
    _replaced.undo()
