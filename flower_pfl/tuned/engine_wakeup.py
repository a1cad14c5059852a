"""Flower's simulation engine and the ServerApp's waiting threads, woken by messages.

In a simulation, one process runs the ServerApp, Flower's in-memory LinkState and the
engine that hands messages to the ClientApp actors.  Two loops there poll the LinkState:

1. the engine's extractor (``flwr/server/superlink/fleet/vce/vce_api.py``,
   ``add_messages_to_queue``) asks for one pending message per node, for every node, then
   sleeps 0.1 s (``f_stop.wait(0.1)``): a step's messages wait up to 0.1 s, 0.05 s on
   average, before an actor sees the first of them -- twice a round (fit, evaluate) while
   every actor is idle;
2. each thread of the legacy round loop that waits for its reply
   (``flwr/superlink/grid/inmemory_grid.py``, ``InMemoryGrid.send_and_receive``) looks
   every ``pull_interval`` s (0.1 by default): the step ends up to that long after its
   last reply, and a shorter interval costs each waiting thread that many looks a second.

:func:`install` makes both wait on a signal instead, raised when a message is stored
(``InMemoryLinkState.store_message_ins`` / ``store_message_res``, wrapped): the extractor
passes again as soon as an instruction is stored, each waiting thread looks as soon as a
reply is stored.  Flower's intervals stay as the longest wait (a stop is seen within
0.1 s, as before).  What is looked up, and the order in which the extractor queues what it
finds, is Flower's: the same calls, made at other moments.  So a client's messages, and
its metrics, are the same (the strategies aggregate uploads sorted by partition).

Installed by :func:`flower_pfl.tuned.switch.install` (``engine: tuned``) after :data:`NEEDS`
are met.  ``FLOWER_PFL_FLOWER_TICK=1`` keeps Flower's polling (for measuring one against the
other: benchmarks/round_limit.py ``--flower-engine``); the waiting threads then look every
:func:`reply_poll_s` instead of 0.1 s (:func:`poll_faster`).  No Flower import at module
level: a deployment's ServerApp has no in-memory LinkState.
"""

from __future__ import annotations

import threading
import time
from logging import INFO
from typing import Any, Callable, Iterable

from flower_pfl.tuned.gate import Need
from flower_pfl.tuned.patch import From, Replaced, say

#: set to 1 to keep Flower's polling (0.1 s ticks)
KEEP_FLOWER_ENV = "FLOWER_PFL_FLOWER_TICK"

_VCE = "flwr.server.superlink.fleet.vce.vce_api"
_GRID = "flwr.superlink.grid.inmemory_grid:InMemoryGrid"
_STATE = "flwr.server.superlink.linkstate.in_memory_linkstate:InMemoryLinkState"
#: what of Flower's :func:`install` replaces, wraps and reads (flower_pfl/tuned/gate.py)
NEEDS = [
    Need(f"{_VCE}:add_messages_to_queue", "body", "953f4bd41a931a77"),  # Flower 1.42.0's
    Need(f"{_VCE}:run_api", "names", "add_messages_to_queue"),  # looked up when it starts
    Need(f"{_GRID}.send_and_receive", "body", "7b52ee5031060a2d"),  # Flower 1.42.0's
    Need(f"{_GRID}.push_messages", "params", "self,messages"),
    Need(f"{_GRID}.pull_messages", "params", "self,message_ids"),
    Need(f"{_GRID}.__init__", "names", "pull_interval"),
    Need(f"{_STATE}.store_message_ins", "params", "self,message"),
    Need(f"{_STATE}.store_message_res", "params", "self,message"),
]
#: the longest the extractor waits between passes: Flower's tick
EXTRACTOR_TICK_S = 0.1
#: what the engine's extractor logs when it starts (flwr-run.log; not on the console)
WOKEN = "woken by stored messages (flower_pfl/tuned/engine_wakeup.py)"


class Signal:
    """A counter that waiting threads watch: :meth:`raise_` bumps it and wakes them."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.count = 0

    def raise_(self) -> None:
        with self.cond:
            self.count += 1
            self.cond.notify_all()

    def wait_past(self, seen: int, timeout: float) -> int:
        """Wait until the count differs from ``seen`` (at most ``timeout`` s); the count."""
        with self.cond:
            self.cond.wait_for(lambda: self.count != seen, timeout)
            return self.count


#: raised after an instruction is stored (the extractor waits on it)
INSTRUCTIONS = Signal()
#: raised after a reply is stored (the ServerApp's waiting threads wait on it)
REPLIES = Signal()


def _raising(method: Callable[..., Any], signal: Signal) -> Callable[..., Any]:
    def store(self: Any, message: Any) -> Any:
        try:
            return method(self, message)
        finally:
            signal.raise_()

    store.__name__ = method.__name__
    store.__doc__ = f"Flower's ``{method.__qualname__}``, then the signal is raised."
    return store


def add_messages_to_queue(state: Any, queue: Any, nodes_mapping: Iterable[int],
                          f_stop: threading.Event) -> None:
    """Flower's extractor (``vce_api.add_messages_to_queue``): one pending message per node
    into the engine's queue, pass after pass -- the next pass as soon as an instruction
    was stored during this one, else after Flower's 0.1 s.  Logs :data:`WOKEN` once."""
    say(INFO, f"[flower-pfl] simulation engine: {WOKEN}")
    while not f_stop.is_set():
        seen = INSTRUCTIONS.count  # before the pass: a message stored during it wakes the wait
        for node_id in nodes_mapping:
            for msg in state.get_message_ins(node_id=node_id, limit=1):
                queue.put(msg)
        INSTRUCTIONS.wait_past(seen, EXTRACTOR_TICK_S)


def send_and_receive(self: Any, messages: Iterable[Any], *,
                     timeout: float | None = None) -> Iterable[Any]:
    """Flower's ``InMemoryGrid.send_and_receive``: push ``messages``, then pull their
    replies until all are in or ``timeout`` s have passed -- looking again as soon as a
    reply was stored, at the latest after ``pull_interval``."""
    msg_ids = set(self.push_messages(messages))
    del messages
    end_time = time.time() + (timeout if timeout is not None else 0.0)
    ret: list[Any] = []
    while timeout is None or time.time() < end_time:
        seen = REPLIES.count  # before the look: a reply stored during it wakes the wait
        res_msgs = self.pull_messages(msg_ids)
        ret.extend(res_msgs)
        msg_ids.difference_update({msg.metadata.reply_to_message_id for msg in res_msgs})
        if len(msg_ids) == 0:
            break
        wait = self.pull_interval
        if timeout is not None:
            wait = min(wait, max(0.0, end_time - time.time()))
        REPLIES.wait_past(seen, wait)
    return ret


#: what :func:`install` puts in Flower's place (flower_pfl/tuned/patch.py).  It must run
#: before the engine starts its extractor thread (``vce_api.run_api`` looks the function up
#: when it starts it, after Ray and the actors are up): the ServerApp's ``main`` installs it
#: first thing.  Each part stands alone: an extractor already started as Flower's polls on,
#: while the waiting threads are woken by stored replies.
_replaced = Replaced({
    f"{_STATE}.store_message_ins": From(lambda flowers: _raising(flowers, INSTRUCTIONS)),
    f"{_STATE}.store_message_res": From(lambda flowers: _raising(flowers, REPLIES)),
    f"{_VCE}:add_messages_to_queue": add_messages_to_queue,
    f"{_GRID}.send_and_receive": send_and_receive,
})
install, installed, uninstall = _replaced.install, _replaced.installed, _replaced.undo
#: Flower's own function or method ``name`` (one of those :func:`install` replaces)
flowers_own = _replaced.flowers


#: the most looks for replies per second, over all of a round's waiting threads, in simulation
REPLY_POLLS_PER_S = 2000


def reply_poll_s(threads: int) -> float:
    """Seconds between two looks for its reply by each of ``threads`` waiting threads: as
    short as 10 ms, as long as Flower's 0.1 s, so that all together look at most
    :data:`REPLY_POLLS_PER_S` times a second (a look takes the LinkState's lock, ~20 us)."""
    return min(0.1, max(0.01, threads / REPLY_POLLS_PER_S))


def poll_faster(grid: Any, threads: int) -> None:
    """In simulation the grid is Flower's ``InMemoryGrid``: each message's thread looks for
    its reply every ``pull_interval`` seconds (0.1 by default), so a step (fit, evaluate)
    ends up to 0.1 s after its last reply.  With 20 clients, 10 ms (:func:`reply_poll_s`).
    Only where the threads are not woken by the replies themselves (``engine: tuned`` with
    ``FLOWER_PFL_FLOWER_TICK=1``).  A deployment's grid (gRPC to the SuperLink) has no such
    attribute and is left alone."""
    if hasattr(grid, "pull_interval"):
        grid.pull_interval = reply_poll_s(threads)
