"""A deployment's ServerApp: replies picked up within 0.1 s, not in 3-s steps, in one request.

Under deployment, the ServerApp process (``flwr-serverapp``, running our
``flower_pfl.server_app`` main) talks to its SuperLink through Flower's ``HttpGrid``
(``flwr/superlink/grid/http_grid.py``).  The legacy round loop sends each client's message
from its own thread with ``HttpGrid.send_and_receive``, which pushes the message, then asks
the SuperLink for the reply (``pull_messages``) and, while it is not there, sleeps 3 s
(``time.sleep(3)``, not configurable).  A fit or evaluate step therefore ends up to 3 s
(1.5 s on average) after its last reply came in.

:func:`send_and_receive` keeps Flower's push and its ``timeout`` and replaces the wait:
the replies every waiting thread of one grid is owed are pulled in one request (Flower's
``pull_messages`` with all their ids), at most one every :data:`POLL_S` s, by whichever
waiting thread's turn it is; each thread takes its own from memory.  The legacy loop waits
with one thread per client, so Flower's way would be ``clients / POLL_S`` requests a second
to the SuperLink while a step runs (20 clients at 0.1 s: 200/s, each a few SQL queries
there); this is ``1 / POLL_S``.  The replies are the same, each thread's in the order they
were pulled.

Installed by :func:`flower_pfl.tuned.switch.install` (``engine: tuned``, a deployment's
ServerApp) after :data:`NEEDS` are met (the ``body`` check: Flower 1.42.0's
``send_and_receive``).  ``FLOWER_PFL_FLOWER_GRID=1`` keeps Flower's 3-s steps (measuring).
No Flower import at module level.
"""

from __future__ import annotations

import threading
import time
import weakref
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
#: seconds between two pulls of the replies still missing (Flower: 3 s, per thread)
POLL_S = 0.1
#: seconds between two looks, in memory, of a thread that is not pulling
LOOK_S = 0.02
#: what the wait between two looks calls (tests count the calls through it)
sleep: Callable[[float], None] = time.sleep


class _Replies:
    """The replies one grid's waiting threads are owed: one thread at a time pulls for all
    of them (``wanted``), at most once per :data:`POLL_S`, and files each reply under the
    message it answers (``got``) for its thread to take."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wanted: set[str] = set()
        self.got: dict[str, list[Any]] = {}
        self.polling = False
        self.next_at = 0.0  # time.time() of the next pull


_boxes: weakref.WeakKeyDictionary[Any, _Replies] = weakref.WeakKeyDictionary()
_boxes_lock = threading.Lock()


def _box(grid: Any) -> _Replies:
    with _boxes_lock:
        box = _boxes.get(grid)
        if box is None:
            box = _boxes[grid] = _Replies()
        return box


def _pull_for_all(grid: Any, box: _Replies) -> None:
    """One pull of every reply ``box``'s threads wait for, filed under the message each
    answers (:meth:`_Replies`); the next one not before :data:`POLL_S` from now."""
    with box.lock:
        want = set(box.wanted)
    replies: list[Any] = []
    try:
        replies = list(grid.pull_messages(want)) if want else []
    finally:
        with box.lock:
            box.polling, box.next_at = False, time.time() + POLL_S
            for reply in replies:
                to = reply.metadata.reply_to_message_id
                box.got.setdefault(to, []).append(reply)
                box.wanted.discard(to)


def send_and_receive(self: Any, messages: Iterable[Any], *,
                     timeout: float | None = None) -> Iterable[Any]:
    """Flower's ``HttpGrid.send_and_receive``: push ``messages``, then wait for their
    replies until all are in or ``timeout`` s have passed.  Flower's pulls each thread's
    replies and sleeps 3 s between looks; here the replies every thread of this grid waits
    for are pulled in one request, at most one every :data:`POLL_S` s, by whichever waiting
    thread's turn it is, and each thread takes its own (a thread that is not pulling looks
    again after :data:`LOOK_S` s, in memory).  Returns the replies in the order they were
    pulled."""
    msg_ids = set(self.push_messages(messages))
    del messages
    end_time = time.time() + (timeout if timeout is not None else 0.0)
    box = _box(self)
    with box.lock:
        box.wanted |= msg_ids
    ret: list[Any] = []
    try:
        while timeout is None or time.time() < end_time:
            with box.lock:
                turn = not box.polling and time.time() >= box.next_at
                box.polling = box.polling or turn
            if turn:
                _pull_for_all(self, box)
            with box.lock:
                for msg_id in [i for i in msg_ids if i in box.got]:
                    ret.extend(box.got.pop(msg_id))
                    msg_ids.discard(msg_id)
                wait = LOOK_S if box.polling else max(box.next_at - time.time(), LOOK_S)
            if not msg_ids:
                break
            if timeout is not None:  # never past the deadline by more than a look
                wait = min(wait, max(0.0, end_time - time.time()))
            sleep(wait)
    finally:
        with box.lock:  # a thread that gave up: its replies are nobody's to pull
            box.wanted -= msg_ids
            for msg_id in msg_ids:
                box.got.pop(msg_id, None)
    return ret


#: what :func:`install` puts in Flower's place (flower_pfl/tuned/patch.py)
_replaced = Replaced({f"{_GRID}.send_and_receive": send_and_receive})
install, installed, uninstall = _replaced.install, _replaced.installed, _replaced.undo
flowers_own = _replaced.flowers  #: Flower's own ``send_and_receive``, installed or not
