"""Each ClientApp actor is handed its next message while it still works on the current one.

Flower's Ray backend (``flwr/server/superlink/fleet/vce/backend/raybackend.py``,
``RayBackend``; its pool ``flwr/simulation/ray_transport/ray_actor.py``, ``BasicActorPool``)
runs one engine worker thread per actor (``vce_api.run_api``: ``backend.num_workers``).
A thread takes a message, submits it to an idle actor, waits for the reply (``ray.get``),
stores the client's updated context and the reply, and only then takes and submits the next
message.  Meanwhile the actor idles: the reply's and the next message's (de)serialisation
in the simulation process (which also runs the ServerApp, under one GIL), Ray's transfer
and the context's update -- about 9 ms per message on 2 cores (docs/BENCHMARKS.md (a)).

:func:`install` gives the engine :data:`DEPTH` worker threads per actor and makes the pool
hand each submission to the actor with the fewest messages in flight (ties: the pool's
order), never more than :data:`DEPTH` at once: while an actor runs one message, its next
one is already submitted (Ray queues an actor's calls and runs them one at a time, in
order).  Nothing else changes:

* a node never has two messages in flight (the engine takes one message per node at a
  time, and the server sends a node its next message only after its reply), so each
  client's context is read and written as before;
* which actor ran a client's message was never fixed (whichever was idle first), and a
  client's results do not depend on it (tests/test_e2e_simulation.py compares a Ray run
  with the same run in one process, client by client).

Where a step has fewer messages than actors the least-loaded choice still spreads them
over the actors.  At a step's end one actor may hold one more queued message than the
other, as it could before (the last message went to the first idle actor).  Flower's
per-run ``clientapp_runtime`` metric now includes the time a message waited in its
actor's queue.  ``FLOWER_PFL_FLOWER_POOL=1`` keeps Flower's one-at-a-time pool.
:class:`Slots` (which actor next) imports nothing of Flower or Ray.
"""

from __future__ import annotations

import threading
from logging import INFO
from typing import Any

from flower_pfl.flower_patch import Replaced, wanted

#: set to 1 to keep Flower's pool (one message per actor at a time)
KEEP_FLOWER_ENV = "FLOWER_PFL_FLOWER_POOL"
#: messages in flight per actor: the one it runs and the next one
DEPTH = 2
#: what the backend logs once its pool queues (flwr-run.log; not on the console)
QUEUED = f"{DEPTH} messages in flight per actor (flower_pfl/actor_queue.py)"


class Slots:
    """Which of ``actors`` gets the next message: the one with the fewest in flight (ties:
    the first in ``actors``), each at most ``depth`` at once.  Thread-safe."""

    def __init__(self, actors: list[Any], depth: int = DEPTH) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, not {depth}")
        self.actors = list(actors)
        self.depth = depth
        self.in_flight = [0] * len(self.actors)
        self.lock = threading.Lock()

    def take(self) -> Any:
        with self.lock:
            if not self.actors:
                raise RuntimeError("the actor pool is empty")
            i = min(range(len(self.actors)), key=self.in_flight.__getitem__)
            if self.in_flight[i] >= self.depth:
                raise RuntimeError(f"every actor already has {self.depth} messages in flight")
            self.in_flight[i] += 1
            return self.actors[i]

    def give_back(self, actor: Any) -> None:
        with self.lock:
            i = next(k for k, a in enumerate(self.actors) if a is actor)
            if self.in_flight[i] < 1:
                raise RuntimeError("an actor was given back more often than it was taken")
            self.in_flight[i] -= 1

    def free(self) -> int:
        with self.lock:
            return sum(self.depth - n for n in self.in_flight)


def queue_pool(pool: Any, depth: int = DEPTH) -> Slots:
    """Make Flower's ``BasicActorPool`` ``pool`` hand out its actors through :class:`Slots`
    (up to ``depth`` messages in flight each); its actors stay in ``pool.pool``, the list
    Flower's ``terminate_all_actors`` walks.  The slots, for inspection."""
    slots = Slots(pool.pool, depth)

    def submit(actor_fn: Any, job: tuple[Any, Any, str, Any]) -> Any:
        actor = slots.take()
        app, message, cid, context = job
        future = actor_fn(actor, app, message, cid, context)
        pool._future_to_actor[future] = actor  # Flower's own map, as its submit keeps it
        return future

    def add_actor_back_to_pool(future: Any) -> None:
        slots.give_back(pool._future_to_actor.pop(future))

    pool.submit = submit
    pool.add_actor_back_to_pool = add_actor_back_to_pool
    pool.is_actor_available = lambda: slots.free() > 0
    return slots


_replaced = Replaced()  # what install() put in place of RayBackend's own


def build(self: Any, app_fn: Any) -> None:
    """Flower's ``RayBackend.build`` (the pool and its actors), then :func:`queue_pool`;
    logs :data:`QUEUED`."""
    from flwr.common.logger import log
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    _replaced.flowers("build", RayBackend)(self, app_fn)
    self.slots = queue_pool(self.pool, DEPTH)
    log(INFO, "[flower-pfl] simulation engine: %s", QUEUED)


def num_workers(self: Any) -> int:
    """The engine's worker threads: :data:`DEPTH` per actor (Flower's: one)."""
    return DEPTH * (self.pool.num_actors if self.pool else 0)


def install(engine_loaded_only: bool = False) -> bool:
    """Put :func:`build` and :func:`num_workers` on Flower's ``RayBackend`` in this process
    (the class itself: the engine builds its backend's pool, and counts its worker
    threads, seconds after it created the backend, which starts Ray first).  Once; a no-op
    with ``FLOWER_PFL_FLOWER_POOL=1``, where Flower has no such backend, or -- with
    ``engine_loaded_only`` -- in a process where Flower's simulation engine is not loaded
    (a deployment's ServerApp).  True when installed."""
    if not wanted(KEEP_FLOWER_ENV, engine_loaded_only):
        return False
    if _replaced:
        return True
    try:
        from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend
    except ImportError:
        return False
    if not isinstance(RayBackend.__dict__.get("num_workers"), property) \
            or not callable(RayBackend.__dict__.get("build")):
        return False
    _replaced.put(RayBackend, "build", build)
    _replaced.put(RayBackend, "num_workers", property(num_workers))
    return True


def flowers_own(name: str) -> Any:
    """Flower's own ``RayBackend`` attribute ``name`` (``build``, the ``num_workers``
    property), installed or not."""
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    return _replaced.flowers(name, RayBackend)


def uninstall() -> None:
    """Put Flower's methods back (tests)."""
    _replaced.undo()
