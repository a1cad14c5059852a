"""flower_pfl.tuned.actor_queue and actor_keeper: each actor gets its next message while it
works on the current one.

By hand: which actor the slots hand out (the fewest in flight, ties by order, at most
``depth``); the engine's worker threads (``depth`` per actor); a pool made to queue, driven
by as many threads as the engine starts, never holds more than ``depth`` messages on one
actor and keeps both busy.  A lost actor (fake actors that die): dropped, replaced where
there is room, each message it held sent once more to a live actor -- by hand for two
actors, one dying with two messages in flight, and under the engine's threads.  A real Ray
run with it installed gives every client the rows of a run in one process
(tests/test_e2e_simulation.py, slow tier); one whose actor is SIGKILLed keeps every client
training (tests/test_actor_death.py, slow tier)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

from flower_pfl.tuned import actor_keeper, actor_queue
from flower_pfl.tuned.actor_keeper import ActorLost, Loss, NoActorLeft, Slots


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
    backend = SimpleNamespace(pool=SimpleNamespace(num_actors=3), keeper=object())
    assert actor_queue.num_workers(backend) == 3 * actor_keeper.DEPTH == 6
    assert actor_queue.num_workers(SimpleNamespace(pool=None, keeper=object())) == 0
    # a pool Flower's own build made (no keeper: installed too late): Flower's count, one each
    assert actor_queue.num_workers(SimpleNamespace(pool=SimpleNamespace(num_actors=3))) == 3


class Future:
    """A Ray ObjectRef's stand-in: hashable, names its actor."""

    def __init__(self, actor) -> None:
        self.actor = actor


def test_a_queued_pool_under_the_engines_threads():
    """Flower's pool made to queue (its submit and give-back replaced), driven as the
    engine's worker threads drive it: submit, wait for the result, give the actor back."""
    actors = [SimpleNamespace(name="A"), SimpleNamespace(name="B")]
    pool = SimpleNamespace(pool=list(actors), _future_to_actor={}, num_actors=2)
    slots = actor_queue.queue_pool(pool, depth=2, ops=SimpleNamespace()).slots
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


def test_install_once_and_uninstall_puts_flowers_back():
    flower = {name: actor_queue.flowers_own(name) for name in actor_queue.NAMES}
    try:
        actor_queue.install()
        actor_queue.install()  # twice: still ours, Flower's kept
        assert RayBackend.__dict__["build"] is actor_queue.build
        assert RayBackend.__dict__["num_workers"].fget is actor_queue.num_workers
        assert RayBackend.__dict__["process_message"] is actor_queue.process_message
    finally:
        actor_queue.uninstall()
    assert {name: RayBackend.__dict__[name] for name in flower} == flower


# -- a lost actor ----------------------------------------------------------------------


class Died(Exception):
    """Ray's ActorDiedError's stand-in, its message laid out as Ray's."""


class Actor:
    def __init__(self, name: str, pid: int) -> None:
        self.name, self.pid, self.dead = name, pid, False


class Job:
    """A submitted message's future: which actor, which client."""

    def __init__(self, actor: Actor, cid: str, context) -> None:
        self.actor, self.cid, self.context = actor, cid, context


def lossy_pool(names, room: int, ready: bool = True, spawn=None):
    """Flower's pool of fake actors, queued by a keeper whose ops fake Ray: a dead actor's
    futures raise :class:`Died`; ``room`` actors fit on the live nodes."""
    actors = [Actor(n, 10 + k) for k, n in enumerate(names)]
    new = iter([Actor(n, 90 + k) for k, n in enumerate("CDEFG")])
    pool = SimpleNamespace(pool=list(actors), _future_to_actor={}, num_actors=len(actors),
                           create_actor_fn=lambda: next(new))
    said, killed = [], []

    def get(job: Job):
        if job.actor.dead:
            raise Died(f"The actor died unexpectedly before finishing this task.\n"
                       f"\tclass_name: ClientAppActor\n\tpid: {job.actor.pid}\n"
                       f"\tip: 10.0.0.{job.actor.pid}")
        return job.cid, f"reply of {job.cid} by {job.actor.name}", job.context

    ops = SimpleNamespace(get=get, is_lost=lambda ex: isinstance(ex, Died),
                          kill=killed.append, room=lambda: room, ready=lambda a: ready,
                          spawn=spawn or (lambda fn: fn()), warn=said.append)
    keeper = actor_queue.queue_pool(pool, depth=2, ops=ops)
    return pool, keeper, actors, said, killed


def run_on(actor, app, message, cid, context):  # Ray's actor.run.remote(): a future
    return Job(actor, cid, context)


def test_an_actor_lost_with_two_messages_is_replaced_and_both_are_sent_once_more():
    """Two actors A, B; four messages go A, B, A, B; A dies holding two.  B's first comes
    back (B holds 1).  A's first: A dropped and killed, C started (room for 2), the
    message sent to the least-loaded live actor: C (0 < 1).  A new message m4 -> C (C 0,
    B 1).  A's second: B 1, C 1 -> B (ties by order).  One line once both are settled."""
    pool, keeper, (a, b), said, killed = lossy_pool("AB", room=2)
    ctx = [object() for _ in range(5)]
    futures = [pool.submit(run_on, (None, f"m{i}", str(i), ctx[i])) for i in range(4)]
    assert [f.actor.name for f in futures] == ["A", "B", "A", "B"]
    a.dead = True
    fetch = pool.fetch_result_and_return_actor_to_pool
    assert fetch(futures[1]) == ("reply of 1 by B", ctx[1])
    assert fetch(futures[0]) == ("reply of 0 by C", ctx[0])  # the same job, its own context
    assert killed == [a] and [x.name for x in pool.pool] == ["B", "C"] and pool.num_actors == 2
    assert said == []  # A's second message is not settled yet
    m4 = pool.submit(run_on, (None, "m4", "4", ctx[4]))
    assert m4.actor.name == "C"
    assert fetch(futures[2]) == ("reply of 2 by B", ctx[2])
    assert said == ["[flower-pfl] actor died: 1 actor replaced; 2 messages retried on live "
                    "actors (2 answered, 0 failed), 0 failed on a second try; 2 actor(s) in "
                    "the pool (Died, pid 10, 10.0.0.10)"]
    assert fetch(futures[3]) == ("reply of 3 by B", ctx[3])
    assert fetch(m4) == ("reply of 4 by C", ctx[4])
    assert keeper.slots.actors == pool.pool and keeper.slots.free() == 4
    assert pool._future_to_actor == {} and keeper.jobs == {}
    assert [pool.submit(run_on, (None, "m", "9", None)).actor.name for _ in range(4)] \
        == ["B", "C", "B", "C"]  # A never again


def test_no_room_no_replacement_and_a_second_loss_fails_that_message_only():
    """Room for 2 on the nodes but only B lives after A's loss and the new actor does not
    answer: it is killed, the pool goes on with B; A's message is sent to B, B dies too:
    that message fails (not a third try), B's loss is not replaced either, and with no
    actor left every later message fails at once."""
    pool, keeper, (a, b), said, killed = lossy_pool("AB", room=2, ready=False)
    f0 = pool.submit(run_on, (None, "m0", "0", None))
    a.dead = True
    again = {}

    def die_on_retry(job):
        if job.actor is b:
            b.dead = True
        again[job.cid] = job.actor.name
    keeper.ops.get = lambda job, get=keeper.ops.get: (die_on_retry(job), get(job))[1]
    with pytest.raises(ActorLost, match="second try"):
        pool.fetch_result_and_return_actor_to_pool(f0)
    assert again == {"0": "B"} and pool.pool == [] and pool.num_actors == 0
    assert [k.name for k in killed] == ["A", "C", "B", "D"]  # each lost one, each new one
    no = "[flower-pfl] actor died: not replaced (no room on the live Ray nodes, or the new " \
        "actor did not start); "
    assert said == [
        "[flower-pfl] actor died: no ClientApp actor left and none could be started: every "
        "message from now on fails",
        no + "0 messages retried on live actors (0 answered, 0 failed), 1 failed on a second "
        "try; 0 actor(s) in the pool (Died, pid 11, 10.0.0.11)",  # B's
        no + "1 message retried on live actors (0 answered, 1 failed), 0 failed on a second "
        "try; 0 actor(s) in the pool (Died, pid 10, 10.0.0.10)"]  # A's
    with pytest.raises(NoActorLeft):
        pool.submit(run_on, (None, "m1", "1", None))


def test_a_loss_line_waits_for_every_held_message_then_the_replacement_has_its_own():
    said = []
    loss = Loss("Died, pid 7", held=2, live=lambda: 1)
    loss.settle(said.append, retried_ok=1)
    assert said == []
    loss.settle(said.append, answered=1)
    assert said == ["[flower-pfl] actor died: a new actor starting; 1 message retried on live "
                    "actors (1 answered, 0 failed), 0 failed on a second try, 1 answered "
                    "before the loss was seen; 1 actor(s) in the pool (Died, pid 7)"]
    loss.live = lambda: 2
    loss.settle(said.append, replaced=True)
    loss.settle(said.append, retried_ok=1)  # after both lines: counted, not logged again
    assert said[1:] == ["[flower-pfl] actor died: 1 actor replaced; 2 actor(s) in the pool "
                        "(Died, pid 7)"]
    decided_first = Loss("Died", held=1, replaced=False)
    decided_first.settle(said.append, not_retried=1)
    assert said[2:] == ["[flower-pfl] actor died: not replaced (no room on the live Ray nodes, "
                        "or the new actor did not start); 0 messages retried on live actors (0 "
                        "answered, 0 failed), 1 failed on a second try; 0 actor(s) in the pool "
                        "(Died)"]


def test_capacity_counts_live_nodes_as_flower_sizes_its_pool():
    """Head 0 CPUs, workers 1/1/2 CPUs, the 2-CPU worker dead: 2 actors of 1 CPU; with
    0.5 GPU each and one GPU on the first worker: 1 (min of CPU and GPU per node)."""
    nodes = [{"Alive": True, "Resources": {"CPU": 0.0}},
             {"Alive": True, "Resources": {"CPU": 1.0, "GPU": 1.0}},
             {"Alive": True, "Resources": {"CPU": 1.0}},
             {"Alive": False, "Resources": {"CPU": 2.0}},
             {"Alive": True, "Resources": {}}]
    assert actor_keeper.capacity(nodes, {"num_cpus": 1, "num_gpus": 0.0}) == 2
    assert actor_keeper.capacity(nodes, {"num_cpus": 0.5, "num_gpus": 0.0}) == 4
    assert actor_keeper.capacity(nodes, {"num_cpus": 1, "num_gpus": 0.5}) == 1
    nodes[3]["Alive"] = True
    assert actor_keeper.capacity(nodes, {"num_cpus": 1, "num_gpus": 0.0}) == 4


def test_slots_take_waits_for_a_replacement_then_says_none_is_left():
    slots = Slots(["a"], depth=1)
    assert slots.take() == "a" and slots.drop("a") == 1 and slots.drop("a") is None
    assert slots.give_back("a") is False  # dropped meanwhile: nothing to count
    assert slots.reserve(room=1) and not slots.reserve(room=1)  # one starting fills it
    got = []
    taker = threading.Thread(target=lambda: got.append(slots.take(wait=True)))
    taker.start()
    taker.join(0.2)
    assert taker.is_alive()  # waits for the starting one
    slots.add("b")
    taker.join(10)
    assert got == ["b"] and slots.size() == (1, 0)
    slots.drop("b")
    with pytest.raises(NoActorLeft):
        slots.take(wait=True)


def test_an_actor_lost_mid_run_under_the_engines_threads():
    """40 messages, 2 actors, 4 engine threads; A dies once 10 messages have come back
    (every message it holds then, and any sent to it later, fails): every message is
    answered exactly once, A is replaced by C in the background and never used again,
    and the lines say so."""
    started = []
    pool, keeper, (a, b), said, killed = lossy_pool(
        "AB", room=2, spawn=lambda fn: started.append(threading.Thread(target=fn)) or
        started[-1].start())
    lock = threading.Lock()
    jobs, answers, done = list(range(40)), {}, [0]

    def engine_worker():
        while True:
            with lock:
                if not jobs:
                    return
                cid = str(jobs.pop())
            future = pool.submit(run_on, (None, "m", cid, None))
            time.sleep(0.002)
            reply, _ = pool.fetch_result_and_return_actor_to_pool(future)
            with lock:
                answers.setdefault(cid, []).append(reply)
                done[0] += 1
                if done[0] == 10:
                    a.dead = True

    threads = [threading.Thread(target=engine_worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for t in started:  # the replacement
        t.join(30)
    assert not any(t.is_alive() for t in threads + started) and len(started) == 1
    assert sorted(answers, key=int) == [str(i) for i in range(40)]
    assert all(len(r) == 1 for r in answers.values())  # each message answered once
    assert {pool.submit(run_on, (None, "m", "9", None)).actor.name for _ in range(4)} \
        == {"B", "C"}  # A never again
    assert killed == [a] and [x.name for x in pool.pool] == ["B", "C"]
    assert said[0].startswith("[flower-pfl] actor died: ")  # replaced before or after it
    assert "actor(s) in the pool (Died, pid 10, 10.0.0.10)" in said[0]
    assert "answered, 0 failed), 0 failed on a second try" in said[0]
    assert said[-1].startswith("[flower-pfl] actor died: 1 actor replaced; ") \
        and len(said) <= 2


def test_process_message_turns_a_lost_message_into_an_error_reply(monkeypatch):
    """The engine gets an error reply (no exception, no traceback) and the client's
    context back unchanged; the ClientApp's own exceptions still raise, the actor given
    back."""
    from flwr.app import Metadata, RecordDict
    from flwr.app.message import Message
    from flwr.common.constant import PARTITION_ID_KEY
    from flwr.supercore.task_identity import TaskIdentity

    for name in ("_run_id", "_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)
    pool, keeper, (a,), said, killed = lossy_pool("A", room=1, ready=False)
    backend = SimpleNamespace(pool=pool, app_fn=lambda: None, keeper=keeper)
    monkeypatch.setattr(actor_queue, "run_remote", run_on)
    meta = Metadata(run_id=1, message_id="m1", src_node_id=1, dst_node_id=5,
                    reply_to_message_id="", group_id="", created_at=time.time(), ttl=60.0,
                    message_type="train")
    message = Message(metadata=meta, content=RecordDict())
    context = SimpleNamespace(node_config={PARTITION_ID_KEY: 3})
    assert actor_queue.process_message(backend, message, context) == ("reply of 3 by A", context)
    a.dead = True
    reply, ctx = actor_queue.process_message(backend, message, context)
    assert ctx is context and reply.has_error()
    assert reply.error.reason == ("<class 'flower_pfl.tuned.actor_keeper.NoActorLeft'>:<'the actor "
                                  "pool is empty: every ClientApp actor was lost and none "
                                  "could be started'>")  # one line
    assert reply.metadata.reply_to_message_id == "m1"
    boom = RuntimeError("the ClientApp raised")
    keeper.ops.get = lambda job: (_ for _ in ()).throw(boom)
    pool.pool.append(b := Actor("B", 20))
    keeper.slots.reserve(room=1) and keeper.slots.add(b)
    with pytest.raises(RuntimeError, match="the ClientApp raised"):
        actor_queue.process_message(backend, message, context)
    assert keeper.slots.free() == 2 and pool._future_to_actor == {}
