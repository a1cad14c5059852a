"""A pool of ClientApp actors that queues each one's next message and survives a lost actor.

The pure half of :mod:`flower_pfl.tuned.actor_queue`: which actor gets the next message
(:class:`Slots`: the fewest in flight, at most :data:`DEPTH` each) and what becomes of the
messages of an actor that was lost (:class:`Keeper`, :class:`Loss`).  Imports nothing of
Flower or Ray: Flower's pool and Ray's calls come in as arguments (tests: fake actors).

**A lost actor** (process killed, node gone: Ray raises ``RayActorError`` --
``ActorDiedError``; an ``ActorUnavailableError`` is given up on the same way -- for each
message it held).  Flower's pool gives a dead actor back after the failure
(``RayBackend.process_message``'s ``except``): every later message sent to it fails too.
Ours (:class:`Keeper`): the first message to meet the loss drops the actor (here and from
``pool.pool``) and kills it; each message it held is sent once more, to a live actor (the
same message and context; the lost attempt's staged client state is dropped by the
client's transaction, ``clients/state.py``); one that meets a lost actor on its second try
fails for that client and round only (an error reply, as Flower's engine makes one, with no
traceback).  A new actor is started in the background where the live Ray nodes have room
(:func:`capacity`) and joins once it answers (:data:`READY_TIMEOUT_S`).  One WARNING line
(:meth:`Loss.line`) once the held messages are settled, a second if the new actor came
later.  No actor left and none starting: every message fails at once (a clear stop).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

#: messages in flight per actor: the one it runs and the next one
DEPTH = 2
#: seconds a new actor has to answer (its process up, its imports) before it is killed
READY_TIMEOUT_S = 300.0
#: how a lost actor's lines start (WARNING: on the console)
LOST = "[flower-pfl] actor died:"


class ActorLost(RuntimeError):
    """A message lost on its second try, or with no actor left: an error reply for it."""


class NoActorLeft(ActorLost):
    """Every actor of the pool was lost and no new one is starting."""


class Slots:
    """Which of ``actors`` gets the next message: the one with the fewest in flight (ties:
    the first in ``actors``), each at most ``depth`` at once.  Actors can be dropped
    (lost) and added (replacements; :meth:`reserve` first).  Thread-safe."""

    def __init__(self, actors: Sequence[Any], depth: int = DEPTH) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, not {depth}")
        self.actors = list(actors)
        self.depth = depth
        self.in_flight = [0] * len(self.actors)
        self.starting = 0  # replacements reserved, not yet added
        self.cond = threading.Condition()

    def _index(self, actor: Any) -> int | None:
        return next((k for k, a in enumerate(self.actors) if a is actor), None)

    def take(self, wait: bool = False) -> Any:
        """The next actor, its count taken.  With ``wait``, blocks while every actor is
        full (or only replacements are left, starting); raises :class:`NoActorLeft` when
        there is no actor and none starting, ``RuntimeError`` when full and not ``wait``."""
        with self.cond:
            while True:
                if not self.actors and not self.starting:
                    raise NoActorLeft("the actor pool is empty: every ClientApp actor was "
                                      "lost and none could be started")
                if self.actors:
                    i = min(range(len(self.actors)), key=self.in_flight.__getitem__)
                    if self.in_flight[i] < self.depth:
                        self.in_flight[i] += 1
                        return self.actors[i]
                if not wait:
                    raise RuntimeError(f"every actor already has {self.depth} messages in "
                                       f"flight" if self.actors else "no actor ready yet")
                self.cond.wait()

    def give_back(self, actor: Any) -> bool:
        """Count one message of ``actor`` done; False when ``actor`` was dropped meanwhile
        (nothing to count)."""
        with self.cond:
            i = self._index(actor)
            if i is None:
                return False
            if self.in_flight[i] < 1:
                raise RuntimeError("an actor was given back more often than it was taken")
            self.in_flight[i] -= 1
            self.cond.notify_all()
            return True

    def drop(self, actor: Any) -> int | None:
        """Remove a lost ``actor``; the messages it held (None: it was not in the pool)."""
        with self.cond:
            i = self._index(actor)
            if i is None:
                return None
            del self.actors[i]
            held = self.in_flight.pop(i)
            self.cond.notify_all()  # waiting takers: maybe none is left
            return held

    def reserve(self, room: int) -> bool:
        """Reserve a place for a new actor if the pool (live and starting) is below
        ``room``; True when reserved (then :meth:`add`)."""
        with self.cond:
            if len(self.actors) + self.starting >= room:
                return False
            self.starting += 1
            return True

    def add(self, actor: Any) -> None:
        """A reserved new ``actor`` joins (None: it did not start, the place is freed)."""
        with self.cond:
            self.starting -= 1
            if actor is not None:
                self.actors.append(actor)
                self.in_flight.append(0)
            self.cond.notify_all()

    def size(self) -> tuple[int, int]:  # (live actors, replacements starting)
        with self.cond:
            return len(self.actors), self.starting

    def free(self) -> int:
        with self.cond:
            return sum(self.depth - n for n in self.in_flight)


@dataclass
class Loss:
    """One lost actor: what became of the ``held`` messages it had in flight when it was
    dropped, and whether a new actor replaced it (None: not decided yet)."""

    what: str
    held: int
    answered: int = 0        # came back although their actor was dropped meanwhile
    retried_ok: int = 0      # sent again, answered
    retried_failed: int = 0  # sent again, failed (lost again, raised, or no actor left)
    not_retried: int = 0     # was itself a second try: failed
    replaced: bool | None = None
    live: Callable[[], int] = lambda: 0  # actors in the pool now
    said: tuple[bool, bool] = (False, False)  # (the messages', the replacement's) logged
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def settle(self, log: Callable[[str], None], **counts: Any) -> None:
        """Add ``counts`` (field=increment; ``replaced``=value).  Logs :meth:`line` once
        every held message is settled, and the replacement's line if decided only later."""
        with self.lock:
            for name, value in counts.items():
                setattr(self, name, value if name == "replaced" else getattr(self, name) + value)
            settled = self.answered + self.retried_ok + self.retried_failed + self.not_retried
            if settled < self.held or self.said[1] or (self.said[0] and self.replaced is None):
                return
            text = self.line(messages=not self.said[0])
            self.said = (True, self.replaced is not None)
        log(text)

    def line(self, messages: bool = True) -> str:
        """``[flower-pfl] actor died: 1 actor replaced; 2 messages retried on live actors (2
        answered, 0 failed), 0 failed on a second try; 2 actor(s) in the pool
        (ActorDiedError, pid 81, 10.0.0.2)`` (without the messages' part: ``messages``)."""
        new = {True: "1 actor replaced", None: "a new actor starting",
               False: "not replaced (no room on the live Ray nodes, or the new actor did "
                      "not start)"}[self.replaced]
        retried = self.retried_ok + self.retried_failed
        late = f", {self.answered} answered before the loss was seen" if self.answered else ""
        told = (f"; {retried} message{'' if retried == 1 else 's'} retried on live actors "
                f"({self.retried_ok} answered, {self.retried_failed} failed), "
                f"{self.not_retried} failed on a second try{late}") if messages else ""
        return f"{LOST} {new}{told}; {self.live()} actor(s) in the pool ({self.what})"


def describe(ex: BaseException) -> str:
    """``ActorDiedError, pid 81, 10.0.0.2``: the error's type and, where Ray's message
    names them, the lost actor's pid and ip."""
    found = (re.search(rf"^\s*{key}: (\S+)\s*$", str(ex), re.M) for key in ("pid", "ip"))
    return ", ".join([type(ex).__name__] + [label + m.group(1) for label, m in
                                            zip(("pid ", ""), found) if m])


def capacity(nodes: Sequence[Mapping[str, Any]], client_resources: Mapping[str, float]) -> int:
    """How many actors of ``client_resources`` (``num_cpus``, ``num_gpus``) the live
    nodes of ``nodes`` (``ray.nodes()``: ``Alive``, ``Resources``) hold, counted per node
    as Flower's ``pool_size_from_resources`` counts (a dead node counts 0)."""
    total, cpus = 0, float(client_resources.get("num_cpus", 1) or 0)
    gpus = float(client_resources.get("num_gpus", 0) or 0)
    for node in (n for n in nodes if n.get("Alive", True) and n.get("Resources")):
        res = node["Resources"]
        n = int(res.get("CPU", 0) / cpus) if cpus > 0 else 0
        total += min(n, int(res.get("GPU", 0) / gpus)) if gpus > 0 else n
    return total


class Keeper:
    """A pool whose lost actors are dropped, replaced where there is room, and whose
    messages on them are sent once more (module docstring, "A lost actor").

    ``pool``: Flower's ``BasicActorPool`` (``pool``, ``num_actors``, ``_future_to_actor``,
    ``create_actor_fn``); ``ops``, what it does with Ray (:func:`ray_ops`): ``get(future)``
    -> ``(cid, message, context)``, ``is_lost(exc)``, ``kill(actor)``, ``room()`` (actors
    the live nodes hold), ``ready(actor)`` (False: it did not answer in time), ``spawn(fn)``
    (in the background), ``warn(text)``."""

    def __init__(self, pool: Any, slots: Slots, ops: Any) -> None:
        self.pool, self.slots, self.ops = pool, slots, ops
        self.jobs: dict[Any, tuple[Any, Any, Loss | None]] = {}  # future -> (fn, job, retry of)
        self.losses: list[tuple[Any, Loss]] = []
        self.lock = threading.Lock()
        self.empty_said = False

    def submit(self, actor_fn: Any, job: tuple[Any, Any, str, Any],
               retry_of: Loss | None = None) -> Any:
        """``job`` on the actor :class:`Slots` picks (waits for a free one); its future."""
        actor = self.slots.take(wait=True)
        try:
            future = actor_fn(actor, *job)
        except BaseException:
            self.slots.give_back(actor)
            raise
        with self.lock:
            self.pool._future_to_actor[future] = actor  # Flower's own map, as its submit keeps
            self.jobs[future] = (actor_fn, job, retry_of)
        return future

    def _forget(self, future: Any) -> tuple[Any, Any, Any, Loss | None]:
        with self.lock:
            return (self.pool._future_to_actor.pop(future, None),
                    *self.jobs.pop(future, (None, None, None)))

    def give_back(self, future: Any) -> None:
        """One message fewer on the actor of ``future`` (Flower's ``add_actor_back_to_pool``;
        a no-op for a future already settled)."""
        actor = self._forget(future)[0]
        if actor is not None and not self.slots.give_back(actor):  # dropped meanwhile
            with self.lock:
                loss = next(loss for a, loss in self.losses if a is actor)
            loss.settle(self.ops.warn, answered=1)

    def fetch(self, future: Any) -> tuple[Any, Any]:
        """(reply, context) of ``future`` (Flower's ``fetch_result_and_return_actor_to_pool``);
        where its actor was lost, the same job once more on a live actor.  Raises
        :class:`ActorLost` when that fails too (or no actor is left), the ClientApp's
        error as Flower does (the caller gives the actor back)."""
        actor = self.pool._future_to_actor.get(future)
        retry_of = self.jobs.get(future, (None, None, None))[2]
        try:
            _, out, context = self.ops.get(future)
        except Exception as ex:
            if not self.ops.is_lost(ex):
                if retry_of is not None:
                    retry_of.settle(self.ops.warn, retried_failed=1)
                raise
            _, actor_fn, job, _ = self._forget(future)
            loss = self.lose(actor, ex)
            if retry_of is not None or actor_fn is None:
                loss.settle(self.ops.warn, not_retried=1)
                if retry_of is not None:
                    retry_of.settle(self.ops.warn, retried_failed=1)
                raise ActorLost(f"the ClientApp actor was lost ({describe(ex)}) on the "
                                f"message's second try") from None
            try:
                again = self.submit(actor_fn, job, retry_of=loss)
            except NoActorLeft:
                loss.settle(self.ops.warn, retried_failed=1)
                raise
            return self.fetch(again)
        self.give_back(future)
        if retry_of is not None:
            retry_of.settle(self.ops.warn, retried_ok=1)
        return out, context

    def lose(self, actor: Any, ex: BaseException) -> Loss:
        """The :class:`Loss` of ``actor``; the first time: drop it (here and from Flower's
        pool), kill it, and start a replacement in the background."""
        with self.lock:
            known = [loss for a, loss in self.losses if a is actor]
            if known:
                return known[0]
            loss = Loss(describe(ex), held=max(self.slots.drop(actor) or 0, 1),
                        live=lambda: self.slots.size()[0])
            self.losses.append((actor, loss))
            if any(a is actor for a in self.pool.pool):
                self.pool.pool[:] = [a for a in self.pool.pool if a is not actor]
                self.pool.num_actors -= 1
        self.ops.kill(actor)
        self.ops.spawn(lambda: self.replace(loss))
        return loss

    def replace(self, loss: Loss) -> None:
        """Start a new actor if the live nodes have room for one more; it joins the pool
        once it answers.  Settles ``loss.replaced``."""
        replaced = reserved = False
        actor = None
        try:
            reserved = self.slots.reserve(self.ops.room())
            if reserved:
                actor = self.pool.create_actor_fn()
                replaced = bool(self.ops.ready(actor))
                if replaced:
                    with self.lock:
                        self.pool.pool.append(actor)
                        self.pool.num_actors += 1
                else:
                    self.ops.kill(actor)
        except Exception as ex:  # noqa: BLE001 -- Ray's state calls; the run goes on without
            self.ops.warn(f"{LOST} starting a new actor failed: {type(ex).__name__}: {ex}")
        if reserved:
            self.slots.add(actor if replaced else None)
        if not replaced and self.slots.size() == (0, 0) and not self.empty_said:
            self.empty_said = True
            self.ops.warn(f"{LOST} no ClientApp actor left and none could be started: "
                          f"every message from now on fails")
        loss.settle(self.ops.warn, replaced=replaced)

