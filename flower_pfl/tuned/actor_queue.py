"""Each ClientApp actor is handed its next message while it still works on the current one;
a lost actor is replaced and its messages sent once more.

Flower's Ray backend (``flwr/server/superlink/fleet/vce/backend/raybackend.py``,
``RayBackend``; its pool ``flwr/simulation/ray_transport/ray_actor.py``, ``BasicActorPool``)
runs one engine worker thread per actor (``vce_api.run_api``: ``backend.num_workers``): it
submits a message to an idle actor, waits for the reply (``ray.get``), stores the reply and
the client's context, and only then submits the next one.  Meanwhile the actor idles (the
(de)serialisation in the simulation process, under one GIL with the ServerApp; Ray's
transfer) -- about 9 ms per message on 2 cores (docs/BENCHMARKS.md (a)).

:func:`install` gives the engine :data:`DEPTH` worker threads per actor and makes the pool
hand each submission to the actor with the fewest messages in flight (ties: the pool's
order), never more than :data:`DEPTH` at once: Ray queues an actor's calls and runs them
in order, so its next message is there when it finishes one.  Nothing else changes: a node
never has two messages in flight (the engine takes one per node at a time), so a client's
context is read and written as before; which actor ran a client's message was never fixed,
and results do not depend on it (tests/test_e2e_simulation.py: a Ray run equals the same
run in one process, client by client).  Flower's ``clientapp_runtime`` metric now includes
the time a message waited in its actor's queue.

A lost actor's messages are sent once more, to a live actor, and the actor is replaced
(:mod:`flower_pfl.tuned.actor_keeper`, "A lost actor").  Installed by
:func:`flower_pfl.tuned.switch.install` (``engine: tuned``) after :data:`NEEDS` are met;
``FLOWER_PFL_FLOWER_POOL=1`` keeps Flower's pool, lost actors and all.
"""

from __future__ import annotations

import contextlib
import threading
from logging import ERROR, INFO, WARNING
from typing import Any

from flower_pfl.tuned.actor_keeper import (
    DEPTH,
    READY_TIMEOUT_S,
    ActorLost,
    Keeper,
    Slots,
    capacity,
)
from flower_pfl.tuned.gate import Need
from flower_pfl.tuned.patch import Replaced, say

#: set to 1 to keep Flower's pool (one message per actor at a time, lost actors kept)
KEEP_FLOWER_ENV = "FLOWER_PFL_FLOWER_POOL"
#: what the backend logs once its pool queues (flwr-run.log; not on the console)
QUEUED = f"{DEPTH} messages in flight per actor (flower_pfl/tuned/actor_queue.py)"

_BACKEND = "flwr.server.superlink.fleet.vce.backend.raybackend:RayBackend"
_POOL = "flwr.simulation.ray_transport.ray_actor:BasicActorPool"
#: what of Flower's (and Ray's) :func:`install` replaces and reads (flower_pfl/tuned/gate.py);
#: the bodies are Flower 1.42.0's
NEEDS = [
    Need(f"{_BACKEND}.build", "params", "self,app_fn"),
    Need(f"{_BACKEND}.build", "names", "pool"),
    Need(f"{_BACKEND}.build", "names", "app_fn"),
    Need(f"{_BACKEND}.num_workers", "body", "2434d3aa07f7c4df"),
    Need(f"{_BACKEND}.process_message", "body", "c1da6da933ae1a17"),
    Need("flwr.server.superlink.fleet.vce.vce_api:run_api", "names", "num_workers"),
    Need(f"{_POOL}.submit", "body", "2f8e4a246c77f025"),
    Need(f"{_POOL}.add_actor_back_to_pool", "body", "e24110f20fd8dc0a"),
    Need(f"{_POOL}.fetch_result_and_return_actor_to_pool", "body", "75914f5c7f04c645"),
    Need(f"{_POOL}.is_actor_available", "body", "4007e7cb334f9c50"),
    *[Need(f"{_POOL}.__init__", "names", name) for name in
      ("pool", "num_actors", "_future_to_actor", "create_actor_fn", "client_resources")],
    Need(f"{_POOL}.terminate_all_actors"),
    Need("flwr.common.constant:PARTITION_ID_KEY"),
    Need("flwr.common.constant:ErrorCode.UNKNOWN"),
    Need("ray.exceptions:RayActorError"),
    Need("ray:kill"),
    Need("ray:nodes"),
]


def ray_ops(pool: Any) -> Any:
    """:class:`Keeper`'s ``ops`` with Ray and Flower's log."""
    from types import SimpleNamespace

    import ray

    def kill(actor: Any) -> None:
        with contextlib.suppress(Exception):  # already gone
            ray.kill(actor, no_restart=True)

    def ready(actor: Any) -> bool:
        try:
            return bool(ray.get(actor.__ray_ready__.remote(), timeout=READY_TIMEOUT_S))
        except Exception:  # noqa: BLE001 -- GetTimeoutError, RayActorError: not started
            return False

    return SimpleNamespace(
        get=ray.get, is_lost=lambda ex: isinstance(ex, ray.exceptions.RayActorError),
        kill=kill, room=lambda: capacity(ray.nodes(), pool.client_resources), ready=ready,
        spawn=lambda fn: threading.Thread(target=fn, daemon=True).start(),
        warn=lambda text: say(WARNING, text))


def queue_pool(pool: Any, depth: int = DEPTH, ops: Any = None) -> Keeper:
    """Make Flower's ``BasicActorPool`` ``pool`` hand out its actors through :class:`Slots`
    (up to ``depth`` messages in flight each) and keep going when one is lost
    (:class:`Keeper`; ``ops``: Ray's, :func:`ray_ops`, when None); its actors stay in
    ``pool.pool``, the list Flower's ``terminate_all_actors`` walks.  The keeper, for
    inspection (``.slots``)."""
    keeper = Keeper(pool, Slots(pool.pool, depth), ops if ops is not None else ray_ops(pool))
    pool.submit = keeper.submit
    pool.add_actor_back_to_pool = keeper.give_back
    pool.fetch_result_and_return_actor_to_pool = keeper.fetch
    pool.is_actor_available = lambda: keeper.slots.free() > 0
    return keeper


def build(self: Any, app_fn: Any) -> None:
    """Flower's ``RayBackend.build`` (the pool and its actors), then :func:`queue_pool`;
    logs :data:`QUEUED`."""
    flowers_own("build")(self, app_fn)
    self.keeper = queue_pool(self.pool, DEPTH)
    say(INFO, f"[flower-pfl] simulation engine: {QUEUED}")


def run_remote(actor: Any, app_fn: Any, message: Any, cid: str, context: Any) -> Any:
    return actor.run.remote(app_fn, message, cid, context)  # as Flower's process_message


def error_reply(message: Any, ex: ActorLost) -> Any:
    """The error reply the engine makes of an exception (``vce_api.worker``), one line."""
    from flwr.app import Message
    from flwr.app.error import Error
    from flwr.common.constant import ErrorCode

    return Message(Error(code=ErrorCode.UNKNOWN, reason=f"{type(ex)}:<'{ex}'>"),
                   reply_to=message)


def process_message(self: Any, message: Any, context: Any) -> tuple[Any, Any]:
    """Flower's ``RayBackend.process_message`` (submit, fetch, the actor back; the
    ClientApp's exception raised), except that a message whose actor was lost is sent once
    more (:meth:`Keeper.fetch`) and one that still cannot run gets an error reply, with
    ``context`` unchanged, instead of an exception (the engine would log its traceback)."""
    from flwr.common.constant import PARTITION_ID_KEY
    from flwr.common.logger import log

    if self.pool is None or self.app_fn is None or not hasattr(self, "keeper"):
        return flowers_own("process_message")(self, message, context)
    job = (self.app_fn, message, str(context.node_config[PARTITION_ID_KEY]), context)
    future = None
    try:
        future = self.pool.submit(run_remote, job)
        return self.pool.fetch_result_and_return_actor_to_pool(future)
    except ActorLost as ex:
        return error_reply(message, ex), context
    except Exception:
        log(ERROR, "An exception was raised when processing a message by %s",
            type(self).__name__)
        if future is not None:
            self.pool.add_actor_back_to_pool(future)
        raise


def num_workers(self: Any) -> int:
    """The engine's worker threads: :data:`DEPTH` per actor where :func:`build` queued the
    pool; one per actor, as Flower's, where Flower's own ``build`` ran (an engine that built
    its pool before :func:`install`: its pool takes one message per actor)."""
    return (DEPTH if hasattr(self, "keeper") else 1) * (self.pool.num_actors if self.pool else 0)


NAMES = ("build", "num_workers", "process_message")  #: what :func:`install` replaces
#: what :func:`install` puts on Flower's ``RayBackend`` (the class itself: the engine builds
#: its backend's pool, and counts its worker threads, seconds after it created the backend,
#: which starts Ray first; flower_pfl/tuned/patch.py).  Each part stands alone: a backend
#: whose pool Flower's ``build`` made keeps Flower's count of workers and Flower's
#: ``process_message``.
_replaced = Replaced({f"{_BACKEND}.build": build, f"{_BACKEND}.num_workers": property(num_workers),
                      f"{_BACKEND}.process_message": process_message})
install, installed, uninstall = _replaced.install, _replaced.installed, _replaced.undo
#: Flower's own ``RayBackend`` attribute ``name`` (one of :data:`NAMES`: ``build``, the
#: ``num_workers`` property, ``process_message``), installed or not
flowers_own = _replaced.flowers
