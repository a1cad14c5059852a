"""The object-pull backoff of a tuned deployment (flower_pfl/tuned/pull_backoff.py): an
object not there yet is asked for again after 0.05 s, not Flower's 1 s.

Behaviour, never wall time: Flower's own ``pull_objects`` runs on a scripted pull function
(the object missing five times, then there) with its waits recorded -- Flower's 1, 2, 4,
8, 10 s; ours 0.05, 0.1, 0.2, 0.2, 0.2 s -- and the same pulls either way.  The ClientApp's path
(``pull_and_inflate_object_from_tree``) hands its own default on; a real warm parent sets it
in the children it forks."""

from __future__ import annotations

import os
import threading
import types

import pytest
from flwr.proto.message_pb2 import ObjectTree  # pylint: disable=E0611
from flwr.supercore.inflatable import inflatable_utils as iu

from flower_pfl.tuned import pull_backoff, switch, warm_clientapp

ON_142 = {"flwr": "1.42.0", "ray": "2.55.1"}.get
FLOWERS = {name: dict(getattr(iu, name).__kwdefaults__) for name in pull_backoff.FUNCTIONS}


@pytest.fixture
def lines(switch_lines):
    yield switch_lines
    switch.uninstall()
    assert {n: getattr(iu, n).__kwdefaults__ for n in pull_backoff.FUNCTIONS} == FLOWERS


def _pull_missing(monkeypatch, misses: int = 5) -> tuple[list[float], list[str]]:
    """Flower's ``pull_objects`` on one object missing at the first ``misses`` asks: (the
    waits it asked for, jitter off; the asks)."""
    waits: list[float] = []
    asks: list[str] = []

    class Event(threading.Event):
        def wait(self, timeout=None):
            waits.append(timeout)
            return False

    monkeypatch.setattr(iu, "threading", types.SimpleNamespace(Event=Event,
                                                               Lock=threading.Lock))
    monkeypatch.setattr(iu, "random", types.SimpleNamespace(uniform=lambda a, b: 0.0))

    def pull(object_id):
        asks.append(object_id)
        if len(asks) <= misses:
            raise iu.ObjectUnavailableError(object_id)
        return b"content"

    assert iu.pull_objects(["o1"], pull) == {"o1": b"content"}
    return waits, asks


def test_a_missing_object_is_asked_for_again_after_0_05_s_not_1_s(lines, monkeypatch):
    out, log = lines
    flowers = _pull_missing(monkeypatch)
    assert flowers == ([1, 2, 4, 8, 10], ["o1"] * 6)  # Flower's: 1 s, doubled up to 10 s
    done = switch.install("tuned", process="supernode", version_of=ON_142, log=log)
    assert "pull_backoff" in done.replaced and pull_backoff.installed()
    assert _pull_missing(monkeypatch) == ([0.05, 0.1, 0.2, 0.2, 0.2], ["o1"] * 6)  # same asks
    # the deadline stays Flower's; an object that never comes is given up after as long
    ours = iu.pull_objects.__kwdefaults__
    assert ours["max_time"] == FLOWERS["pull_objects"]["max_time"]
    flower_wait = sum(min(2 ** min(k, 9), 10) for k in range(FLOWERS["pull_objects"]
                                                     ["max_tries_per_object"] - 1))
    our_wait = sum(min(0.05 * 2 ** min(k, 9), 0.2) for k in range(ours["max_tries_per_object"] - 1))
    assert flower_wait == 4965 and abs(our_wait - flower_wait) < 1
    switch.uninstall()
    assert _pull_missing(monkeypatch, 2)[0] == [1, 2]


def test_the_clientapps_pull_hands_the_shorter_backoff_on(lines, monkeypatch):
    """``run_clientapp.pull_task_input`` calls ``pull_and_inflate_object_from_tree`` with its
    defaults; it passes its own ``initial_backoff`` to ``pull_objects``."""
    out, log = lines
    seen: list[float] = []
    calls: list[dict] = []

    def pull_objects(ids, fn, **kw):
        seen.append(kw["initial_backoff"])
        calls.append(kw)
        raise RuntimeError("stop")

    for engine in ("stock", "tuned"):
        switch.install(engine, process="serverapp", version_of=ON_142, log=log)
        monkeypatch.setattr(iu, "pull_objects", pull_objects)  # after the checks
        with pytest.raises(RuntimeError):
            iu.pull_and_inflate_object_from_tree(ObjectTree(object_id="m"), None, None)
        monkeypatch.undo()
    assert seen == [1, 0.05]
    assert [kw["backoff_cap"] for kw in calls] == [10, 0.2]


@pytest.mark.parametrize("process", ["serverapp", "supernode", "superexec"])
def test_every_deployment_process_shortens_it_unless_kept(lines, monkeypatch, process):
    out, log = lines
    assert "pull_backoff" in switch.install("tuned", process=process, version_of=ON_142,
                                            log=log).replaced
    switch.uninstall()
    monkeypatch.setenv(pull_backoff.KEEP_FLOWER_ENV, "1")
    done = switch.install("tuned", process=process, version_of=ON_142, log=log)
    assert "pull_backoff" in done.kept and not pull_backoff.installed()
    assert "pull_backoff kept Flower's (FLOWER_PFL_FLOWER_PULL=1)" in out[-1][1]
    assert switch.install("tuned", simulation=True, version_of=ON_142, log=log).kept == ()


def test_a_changed_pull_body_falls_back_before_anything(lines, monkeypatch):
    out, log = lines

    def pull_objects(object_ids, pull_object_fn, *, initial_backoff=1):  # a later Flower's
        return {}

    monkeypatch.setattr(iu, "pull_objects", pull_objects)
    done = switch.install("tuned", process="supernode", version_of=ON_142, log=log)
    assert done.replaced == () and "inflatable_utils.pull_objects: not the body" in out[-1][1]
    assert pull_objects.__kwdefaults__ == {"initial_backoff": 1}


REPORT = '''
import json, os, sys
def report():
    from flwr.supercore.inflatable import inflatable_utils as iu
    with open(sys.argv[1], "a") as fh:
        fh.write(json.dumps({n: [getattr(iu, n).__kwdefaults__[k] for k in
                                 ("initial_backoff", "backoff_cap", "max_tries_per_object")]
                             for n in ("pull_objects", "pull_and_inflate_object_from_tree")})
                 + "\\n")
'''


def test_the_warm_parent_gives_its_children_the_backoff_of_its_superexec(lines, tmp_path):
    """A real fork server started by a SuperExec where pull_backoff is installed (and one
    where it is not): each child asks again after what its SuperExec's engine says."""
    from test_warm_clientapp import _reports

    out, log = lines
    (tmp_path / "warm_report.py").write_text(REPORT)
    result = tmp_path / "out.jsonl"
    for engine in ("tuned", "stock"):
        switch.uninstall()
        switch.install(engine, process="superexec", version_of=ON_142, log=log)
        server = warm_clientapp.ForkServer(
            [*warm_clientapp.SERVER_COMMAND, "--preload", "", "--run", "warm_report:report"],
            env={**os.environ, "PYTHONPATH": str(tmp_path)})
        try:
            assert server.submit(["flwr-clientapp", str(result)])
            _reports(result, 1 if engine == "tuned" else 2)
        finally:
            server.stop()
    tuned, stock = _reports(result, 2)
    assert tuned == dict.fromkeys(pull_backoff.FUNCTIONS, [0.05, 0.2, 24828])
    assert stock == dict.fromkeys(pull_backoff.FUNCTIONS, [1, 10, 500])


def test_a_kwdefault_the_function_lacks_stops_the_parent_before_ready(tmp_path):
    server = warm_clientapp.ForkServer(
        [*warm_clientapp.SERVER_COMMAND, "--preload", "", "--kwdefaults",
         "json:dumps.no_such_param=0.05"], stderr=open(os.devnull, "w"))
    assert not server.submit(["flwr-clientapp", "--help"])
    assert server.broken and server.pid is None
