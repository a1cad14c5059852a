"""flower_pfl.actor_queue: each actor gets its next message while it works on the current one.

By hand: which actor the slots hand out (the fewest in flight, ties by order, at most
``depth``); the engine's worker threads (``depth`` per actor); a pool made to queue, driven
by as many threads as the engine starts, never holds more than ``depth`` messages on one
actor and keeps both busy.  A real Ray run with it installed gives every client the rows
of a run in one process (tests/test_e2e_simulation.py, slow tier)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

from flower_pfl import actor_queue
from flower_pfl.actor_queue import Slots


def test_the_fewest_in_flight_first_ties_by_order_never_more_than_depth():
    slots = Slots(["a", "b", "c"], depth=2)
    assert [slots.take() for _ in range(4)] == ["a", "b", "c", "a"]  # a: 2, b: 1, c: 1
    slots.give_back("c")                      # a: 2, b: 1, c: 0
    assert slots.take() == "c"                # the fewest, not the first
    assert slots.take() == "b"                # b: 2, c: 1 -> ...
    assert slots.take() == "c"
    assert slots.free() == 0
    with pytest.raises(RuntimeError, match="already has 2 messages in flight"):
        slots.take()
    slots.give_back("a")
    assert (slots.free(), slots.take()) == (1, "a")
    with pytest.raises(RuntimeError, match="more often than it was taken"):
        Slots(["a"]).give_back("a")
    with pytest.raises(ValueError):
        Slots(["a"], depth=0)


def test_two_messages_on_two_actors_go_one_to_each():
    slots = Slots(["a", "b"], depth=2)
    assert {slots.take(), slots.take()} == {"a", "b"}


def test_the_engine_starts_depth_threads_per_actor():
    backend = SimpleNamespace(pool=SimpleNamespace(num_actors=3))
    assert actor_queue.num_workers(backend) == 3 * actor_queue.DEPTH == 6
    assert actor_queue.num_workers(SimpleNamespace(pool=None)) == 0


class Future:
    """A Ray ObjectRef's stand-in: hashable, names its actor."""

    def __init__(self, actor) -> None:
        self.actor = actor


def test_a_queued_pool_under_the_engines_threads():
    """Flower's pool made to queue (its submit and give-back replaced), driven as the
    engine's worker threads drive it: submit, wait for the result, give the actor back."""
    actors = [SimpleNamespace(name="A"), SimpleNamespace(name="B")]
    pool = SimpleNamespace(pool=list(actors), _future_to_actor={}, num_actors=2)
    slots = actor_queue.queue_pool(pool, depth=2)
    lock = threading.Lock()
    load = {"A": 0, "B": 0}
    peak = {"A": 0, "B": 0}
    ran = {"A": 0, "B": 0}

    def actor_fn(actor, app, message, cid, context):  # Ray's .remote(): returns a future
        with lock:
            load[actor.name] += 1
            peak[actor.name] = max(peak[actor.name], load[actor.name])
        return Future(actor)

    jobs = list(range(40))

    def engine_worker():
        while True:
            with lock:
                if not jobs:
                    return
                jobs.pop()
            future = pool.submit(actor_fn, (None, "message", "0", "context"))
            time.sleep(0.005)  # the actor works
            with lock:
                load[future.actor.name] -= 1
                ran[future.actor.name] += 1
            pool.add_actor_back_to_pool(future)

    threads = [threading.Thread(target=engine_worker) for _ in range(2 * len(actors))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not jobs and not any(t.is_alive() for t in threads)
    assert peak == {"A": 2, "B": 2}  # each actor had its next message while it worked
    assert ran["A"] + ran["B"] == 40 and min(ran.values()) >= 10
    assert slots.free() == 4 and pool._future_to_actor == {}
    assert pool.pool == actors and pool.is_actor_available()  # Flower's list stays whole


def test_install_uninstall_and_the_switch_to_keep_flowers(monkeypatch):
    flower = {name: actor_queue.flowers_own(name) for name in ("build", "num_workers")}
    actor_queue.uninstall()  # whatever an import installed in this process
    try:
        monkeypatch.setenv(actor_queue.KEEP_FLOWER_ENV, "1")
        assert actor_queue.install() is False
        assert RayBackend.__dict__["build"] is flower["build"]
        monkeypatch.delenv(actor_queue.KEEP_FLOWER_ENV)
        assert actor_queue.install() is True
        assert actor_queue.install() is True  # twice: still ours, Flower's kept
        assert RayBackend.__dict__["build"] is actor_queue.build
        assert RayBackend.__dict__["num_workers"].fget is actor_queue.num_workers
    finally:
        actor_queue.uninstall()
    assert {name: RayBackend.__dict__[name] for name in flower} == flower
