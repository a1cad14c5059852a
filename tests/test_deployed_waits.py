"""The tuned engine in a deployment (flower_pfl/tuned/grid_poll.py, node_waits.py,
superexec_start.py, entry.py): Flower's fixed waits shortened and the SuperNode's SuperExec
started through our entry, fenced behind the same switch (the warm launcher itself:
tests/test_warm_clientapp.py).

Behaviour, never wall time: a fake grid / node state scripts when replies exist, and each
test counts the pulls and records the sleeps asked for -- ours next to Flower's own code on
the same script (the same pulls and replies; 0.1 s instead of 3 s between looks).  The
SuperNode's loop and reply wait are Flower's own functions, run with fakes around them.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import types
from contextlib import contextmanager
from logging import INFO, WARNING

import pytest
from flwr.supercore.run import RunNotRunningException
from flwr.superlink.grid import http_grid
from flwr.superlink.grid.http_grid import HttpGrid
from flwr.supernode import start_client_internal as sci

from flower_pfl.running import deploy
from flower_pfl.running.procs import bin_path
from flower_pfl.tuned import (
    array_packing,
    entry,
    grid_poll,
    node_waits,
    programs,
    switch,
    warm_clientapp,
)

FLOWERS_GRID = vars(HttpGrid)["send_and_receive"]  # at import: Flower's
FLOWERS_PUSH = vars(HttpGrid)["push_messages"]
ON_142 = {"flwr": "1.42.0", "ray": "2.55.1"}.get


@pytest.fixture
def lines(switch_lines):
    """The lines :func:`switch.install` logs; Flower's own put back after."""
    yield switch_lines
    switch.uninstall()  # before switch_lines' own teardown: check it now
    assert vars(HttpGrid)["send_and_receive"] is FLOWERS_GRID and sci.time is __import__("time")
    assert sci.subprocess is subprocess and not warm_clientapp.installed()


def _reply(to: str):
    return types.SimpleNamespace(metadata=types.SimpleNamespace(reply_to_message_id=to))


class FakeGrid:
    """Pushes two messages (ids a, b); pull k returns ``script[k]`` (replies present then)."""

    def __init__(self, script):
        self.script, self.pulls = list(script), []

    def push_messages(self, messages):
        return ["a", "b"]

    def pull_messages(self, message_ids):
        self.pulls.append(sorted(message_ids))
        return self.script.pop(0) if self.script else []


class Clock:
    """``time.time`` that moves only when :meth:`sleep` is called."""

    def __init__(self):
        self.now, self.slept = 1000.0, []

    def time(self):
        return self.now

    def sleep(self, s):
        self.slept.append(s)
        self.now += s


SCRIPT = [[], [_reply("b")], [_reply("a")]]  # nothing, then b, then a


def test_replies_are_picked_up_a_tenth_of_a_second_after_they_exist(monkeypatch):
    """Ours: the same three pulls as Flower's, 0.1 s between them instead of 3 s."""
    ours, clock = FakeGrid(SCRIPT), Clock()
    monkeypatch.setattr(grid_poll, "time", clock)
    monkeypatch.setattr(grid_poll, "sleep", clock.sleep)
    got = grid_poll.send_and_receive(ours, ["m1", "m2"])
    flowers, flower_slept = FakeGrid(SCRIPT), []
    monkeypatch.setattr(http_grid.time, "sleep", flower_slept.append)
    want = FLOWERS_GRID(flowers, ["m1", "m2"])
    assert [m.metadata.reply_to_message_id for m in got] == ["b", "a"] == \
        [m.metadata.reply_to_message_id for m in want]
    assert ours.pulls == flowers.pulls == [["a", "b"], ["a", "b"], ["a"]]
    assert clock.slept == pytest.approx([0.1, 0.1]) and flower_slept == [3, 3]


def test_a_timeout_ends_the_wait_at_its_deadline_not_a_look_later(monkeypatch):
    clock, grid = Clock(), FakeGrid([])  # no reply ever
    monkeypatch.setattr(grid_poll, "time", clock)
    monkeypatch.setattr(grid_poll, "sleep", clock.sleep)
    assert grid_poll.send_and_receive(grid, ["m1", "m2"], timeout=0.25) == []
    assert len(grid.pulls) == 3  # at 0, 0.1, 0.2 s
    assert clock.slept == pytest.approx([0.1, 0.1, 0.05])  # the last one: to the deadline


class SharedGrid:
    """Each thread pushes one message (m0, m1, m2 -> ids a0, a1, a2); the reply to ``ai``
    exists from ``ready[ai]`` s after the start; every pull is recorded with its ids."""

    def __init__(self, ready):
        self.ready, self.start, self.pulls = ready, time.time(), []
        self.lock = threading.Lock()

    def push_messages(self, messages):
        return ["a" + m[1:] for m in messages]

    def pull_messages(self, message_ids):
        now = time.time() - self.start
        with self.lock:
            self.pulls.append((now, sorted(message_ids)))
            out = [i for i in message_ids if self.ready[i] <= now]
            for i in out:
                self.ready[i] = float("inf")  # the SuperLink hands a reply out once
        return [_reply(i) for i in out]


def test_the_waiting_threads_share_one_pull_every_poll_and_each_gets_its_own_reply():
    """Three clients' threads wait at once (the legacy loop): one request pulls for all of
    them, no more than one per POLL_S, and each thread gets the reply to its message --
    Flower's way would be three requests per look, one per thread."""
    grid = SharedGrid({"a0": 0.35, "a1": 0.05, "a2": 0.2})
    got = {}

    def wait(i):
        got[i] = grid_poll.send_and_receive(grid, [f"m{i}"], timeout=5)

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {i: [r.metadata.reply_to_message_id for r in got[i]] for i in got} == \
        {0: ["a0"], 1: ["a1"], 2: ["a2"]}
    times = [at for at, _ in grid.pulls]
    assert all(b - a >= grid_poll.POLL_S * 0.9 for a, b in zip(times, times[1:]))
    assert len(grid.pulls) <= 6  # ~0.35 s / 0.1 s, not three per look
    assert ["a0", "a1", "a2"] in [ids for _, ids in grid.pulls]  # one pull, every thread's
    assert grid.pulls[-1][1] == ["a0"]  # what was answered is not asked for again
    assert grid_poll._box(grid).wanted == set() and grid_poll._box(grid).got == {}


def test_a_thread_that_times_out_leaves_nothing_owed_behind(monkeypatch):
    grid = SharedGrid({"a0": float("inf")})
    assert grid_poll.send_and_receive(grid, ["m0"], timeout=0.15) == []
    box = grid_poll._box(grid)
    assert box.wanted == set() and box.got == {} and not box.polling


def test_a_deployments_server_app_gets_the_grid_poll_and_stock_keeps_flowers(lines):
    out, log = lines
    done = switch.install("tuned", simulation=False, version_of=ON_142, log=log)
    assert done.replaced == ("grid_poll", "pull_backoff", "array_packing")
    assert HttpGrid.send_and_receive is grid_poll.send_and_receive
    assert HttpGrid.push_messages is array_packing.push_messages
    assert grid_poll.flowers_own("send_and_receive") is FLOWERS_GRID
    assert out[-1] == (INFO, "[flower-pfl] deployment engine (ServerApp): tuned on flwr "
                             "1.42.0: grid_poll, pull_backoff, array_packing in Flower's "
                             "place")
    assert switch.install("stock", simulation=False, version_of=ON_142, log=log).replaced == ()
    assert vars(HttpGrid)["send_and_receive"] is FLOWERS_GRID
    assert vars(HttpGrid)["push_messages"] is FLOWERS_PUSH
    assert out[-1] == (INFO, "[flower-pfl] deployment engine (ServerApp): stock (engine: "
                             "stock): Flower as released")


def _a_later_flowers_send_and_receive(self, messages, *, timeout=None):
    """A Flower whose body changed (here: its wait), signature kept."""
    msg_ids = set(self.push_messages(messages))
    while msg_ids:
        msg_ids -= {m.metadata.reply_to_message_id for m in self.pull_messages(msg_ids)}
        __import__("time").sleep(1)
    return []


def test_a_changed_grid_body_or_a_missing_loop_name_falls_back_before_anything(
        lines, monkeypatch):
    out, log = lines
    monkeypatch.setattr(HttpGrid, "send_and_receive", _a_later_flowers_send_and_receive)
    done = switch.install("tuned", process="serverapp", version_of=ON_142, log=log)
    assert (done.engine, done.replaced) == ("stock", ())
    assert HttpGrid.send_and_receive is _a_later_flowers_send_and_receive  # not ours
    assert out == [(WARNING, "[flower-pfl] engine: stock -- this Flower lacks what the tuned "
                             "engine touches: http_grid.HttpGrid.send_and_receive: not the "
                             "body ours was written from (source changed) (flower_pfl/tuned): "
                             "Flower runs as released")]
    monkeypatch.delattr(sci, "time")
    done = switch.install("tuned", process="supernode", version_of=ON_142, log=log)
    assert done.replaced == () and "start_client_internal.time: absent" in out[-1][1]
    assert not hasattr(sci, "time")


def test_outside_the_tested_flower_the_supernode_runs_stock(lines):
    out, log = lines
    done = switch.install("tuned", process="supernode", log=log,
                          version_of={"flwr": "1.43.0", "ray": "2.55.1"}.get)
    assert done.replaced == () and out[-1][0] == WARNING and not node_waits.installed()


def test_short_sleeps_shortens_only_flowers_two_waits():
    slept: list[float] = []
    fake = node_waits.ShortSleeps(slept.append)
    for s in (3, 0.5, 1.0, 3.5):
        fake.sleep(s)
    assert slept == [0.2, 0.05, 1.0, 3.5]
    assert fake.monotonic is __import__("time").monotonic


class _Stop(Exception):
    pass


def _run_supernode_loop(monkeypatch) -> list[list[str]]:
    """Flower's own ``start_client_internal``: it starts its SuperExec (the commands it
    starts are returned, none started), two empty pulls, then the test stops it."""
    started: list[list[str]] = []
    monkeypatch.setattr(subprocess, "Popen", lambda cmd, *a, **k: started.append(cmd))
    pulls = iter([None, None])

    def pull(**_):
        try:
            return next(pulls)
        except StopIteration:
            raise _Stop from None

    @contextmanager
    def conn(**_):
        yield (7, None, None, None, None, None, None, None)

    monkeypatch.setattr(sci, "_pull_and_store_message", pull)
    monkeypatch.setattr(sci, "_init_connection", conn)
    monkeypatch.setattr(sci, "register_signal_handlers", lambda **_: None)
    state = types.SimpleNamespace(set_node_id=lambda n: None)
    factory = types.SimpleNamespace(state=lambda: state, objectstore_factory=types.
                                    SimpleNamespace(store=lambda: None))
    with pytest.raises(_Stop):
        sci.start_client_internal(state_factory=factory, server_address="x:1", node_config={},
                                  insecure=True, runtime_api_address="127.0.0.1:9094")
    return started


def _push_one_reply(monkeypatch) -> None:
    """Flower's own ``_push_messages``: the reply appears at the third look."""
    looks = iter([[], [], [types.SimpleNamespace(metadata=types.SimpleNamespace(
        run_id=1, group_id="", message_type="train", message_id="r", reply_to_message_id="m"))]])
    state = types.SimpleNamespace(get_messages_legacy=lambda is_reply: next(looks),
                                  get_message_processing_duration=lambda message_id: 0.0,
                                  delete_messages=lambda message_ids: None)
    store = types.SimpleNamespace(get_object_tree=lambda _: None, delete=lambda _: None)

    def send(*_):
        raise RunNotRunningException

    sci._push_messages(state=state, object_store=store, send=send, push_object=None)


def test_the_supernode_looks_again_after_0_2_s_and_for_a_reply_after_0_05_s(lines, monkeypatch):
    """Flower's loop and reply wait, ours installed: the same looks, shorter sleeps."""
    out, log = lines
    stock: list[float] = []
    monkeypatch.setattr(sci.time, "sleep", stock.append)  # the real time module, patched
    flowers = _run_supernode_loop(monkeypatch)
    _push_one_reply(monkeypatch)
    assert stock == [3, 3, 0.5, 0.5]
    monkeypatch.undo()
    assert switch.install("tuned", process="supernode", version_of=ON_142,
                          log=log).replaced == ("node_waits", "superexec_start", "pull_backoff")
    tuned: list[float] = []
    monkeypatch.setattr(sci.time, "real_sleep", tuned.append)
    ours = _run_supernode_loop(monkeypatch)
    _push_one_reply(monkeypatch)
    assert tuned == [0.2, 0.2, 0.05, 0.05]
    # its SuperExec: Flower's arguments, started through our entry
    assert flowers[0][0] == "flower-superexec" and "--parent-pid" in flowers[0]
    assert ours == [[*programs.command("tuned", program="flower-superexec"), *flowers[0][1:]]]


def test_the_supernodes_command_under_each_engine(tmp_path):
    flower = bin_path("flower-supernode")
    stock = deploy.supernode_command("h:1", 9, "partition-id=0", None, None, engine="stock")
    tuned = deploy.supernode_command("h:1", 9, "partition-id=0", None, None)  # the default
    assert stock[0] == flower and stock[1:3] == ["--superlink", "h:1"]
    assert tuned[:4] == [sys.executable, "-m", "flower_pfl.tuned.entry",
                         "flower-supernode"] and tuned[4:] == stock[1:]
    with pytest.raises(ValueError, match="engine must be one of"):
        deploy.supernode_command("h:1", 9, "c", None, None, engine="fast")
    dep = deploy.Deployment(tmp_path / "w", 1, None, engine="stock")
    assert dep.node_command(dep.add_node(0))[0][0] == flower


def test_deploy_starts_its_nodes_with_the_yamls_engine_and_threads(tmp_path, monkeypatch):
    seen = []

    class Started(Exception):
        pass

    def fake(*args, **kwargs):
        seen.append((kwargs["engine"], kwargs["threads"]))
        raise Started

    monkeypatch.setattr(deploy, "Deployment", fake)
    for engine in ("stock", "tuned"):
        path = tmp_path / f"{engine}.yaml"
        path.write_text(f"strategy: fedavg\nengine: {engine}\n")
        with pytest.raises(Started):
            deploy.deploy(path, [], tmp_path / "res", 1, None)
    with pytest.raises(Started):
        deploy.deploy(tmp_path / "tuned.yaml", ["engine=stock", "client-resources.num-cpus=3"],
                      tmp_path / "res", 1, None)
    assert seen == [("stock", 1), ("tuned", 1), ("stock", 3)]


def test_each_node_gets_the_threads_a_simulated_client_gets_unless_set(tmp_path, monkeypatch):
    """Nodes sharing a machine's cores with torch's default threads (one per core) spin
    against each other: each node's ClientApps get ``threads`` (client-resources.num-cpus),
    under either engine; one set in the environment is kept, None keeps torch's default."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for engine in ("stock", "tuned"):
        dep = deploy.Deployment(tmp_path / engine, 2, None, engine=engine, threads=2)
        assert dep.node_command(dep.add_node(0))[1]["OMP_NUM_THREADS"] == "2"
    dep = deploy.Deployment(tmp_path / "default", 2, None)
    assert dep.node_command(dep.add_node(0))[1]["OMP_NUM_THREADS"] == "1"
    dep = deploy.Deployment(tmp_path / "none", 2, None, threads=None)
    assert "OMP_NUM_THREADS" not in dep.node_command(dep.add_node(0))[1]
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    dep = deploy.Deployment(tmp_path / "set", 2, None, threads=1)
    assert dep.node_command(dep.add_node(0))[1]["OMP_NUM_THREADS"] == "4"


def test_the_entry_installs_the_supernodes_waits_then_runs_flowers_main(lines, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    seen = []
    entry.main(["flower-supernode", "--superlink", "h:1"],
                         run=lambda: seen.append((list(sys.argv), node_waits.installed())))
    assert seen == [(["flower-supernode", "--superlink", "h:1"], True)]
    supernode_entry_ran = warm_clientapp.installed()
    entry.main(["flower-superexec", "--insecure"], run=lambda: seen.append(
        (list(sys.argv), warm_clientapp.installed())))
    assert not supernode_entry_ran and seen[-1] == (["flower-superexec", "--insecure"], True)
    with pytest.raises(SystemExit) as exc:
        entry.main(["--superlink", "h:1"], run=lambda: None)
    assert exc.value.code == 2


def test_the_entry_reaches_flowers_supernode_in_a_fresh_process():
    done = subprocess.run([*programs.command("tuned"), "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--superlink" in done.stdout  # flower-supernode's own help
    assert "deployment engine (SuperNode): tuned on flwr" in done.stdout + done.stderr


@pytest.mark.parametrize("flag,want", [([], "tuned"), (["--engine", "stock"], "stock")])
def test_flower_pfl_supernode_starts_the_engine_it_is_given(tmp_path, flag, want):
    from flower_pfl.running.sites import supernode_parser, supernode_plan

    args = supernode_parser().parse_args(
        ["--superlink", "h:1", "--insecure", "--partition-id", "0", "--num-partitions", "2",
         "--state-dir", str(tmp_path / "s"), *flag])
    cmd, _, about = supernode_plan(args)
    assert cmd[:cmd.index("--superlink")] == programs.command(want, bin_path("flower-supernode"))
    assert about.endswith(f"engine {want}")
