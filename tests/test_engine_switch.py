"""``engine: tuned | stock`` (flower_pfl/tuned/switch.py): one switch, a version gate, every
name of Flower's checked before anything is replaced, and nothing replaced at import.

On the installed Flower: ``stock`` leaves every Flower function in place; ``tuned`` puts all
three replacements there, with one line.  Faked: a Flower (or Ray) outside the tested
series, a private name taken away, a Flower function whose body changed, a signature
changed -- each runs stock, before anything is replaced, with one WARNING line naming why.
A real simulation run with ``engine: stock`` gives the per-client rows of a tuned one
(tests/test_e2e_simulation.py, slow tier)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from logging import INFO, WARNING

import pytest
from flwr.app import Context
from flwr.server.superlink.fleet.vce import vce_api
from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend
from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
from flwr.simulation.ray_transport.ray_actor import BasicActorPool
from flwr.superlink.grid.inmemory_grid import InMemoryGrid

from flower_pfl import config, server_app
from flower_pfl.tuned import engine_wakeup, gate, linkstate_lookup, switch
from flower_pfl.tuned.gate import Need

#: (owner, name) of everything the tuned engine puts in Flower's place
TARGETS = [(InMemoryLinkState, "get_message_ins"), (InMemoryLinkState, "store_message_ins"),
           (InMemoryLinkState, "store_message_res"), (vce_api, "add_messages_to_queue"),
           (InMemoryGrid, "send_and_receive"), (RayBackend, "build"),
           (RayBackend, "num_workers"), (RayBackend, "process_message")]
FLOWERS = {(owner, name): vars(owner)[name] for owner, name in TARGETS}  # at import: Flower's


#: the versions this was tested on, as a faked ``gate.installed_version``
ON_142 = {"flwr": "1.42.0", "ray": "2.55.1"}.get


@pytest.fixture
def lines(switch_lines):
    """The lines :func:`switch.install` logs, as (level, text); Flower's own put back after."""
    yield switch_lines
    switch.uninstall()  # before switch_lines' own teardown: check it now
    assert all(vars(owner)[name] is FLOWERS[owner, name] for owner, name in TARGETS)


def flowers_in_place() -> list[str]:
    return [f"{getattr(o, '__name__', o)}.{n}" for o, n in TARGETS if vars(o)[n] is FLOWERS[o, n]]


def test_stock_replaces_nothing(lines):
    out, log = lines
    done = switch.install("stock", simulation=True, version_of=ON_142, log=log)
    assert (done.engine, done.replaced) == ("stock", ())
    assert len(flowers_in_place()) == len(TARGETS)
    assert out == [(INFO, "[flower-pfl] simulation engine: stock (engine: stock): Flower as "
                          "released")]


def test_tuned_replaces_all_three_with_one_line_and_a_second_call_adds_none(lines):
    out, log = lines
    done = switch.install("tuned", simulation=True, version_of=ON_142, log=log)
    assert done.replaced == ("linkstate_lookup", "engine_wakeup", "actor_queue")
    assert flowers_in_place() == []  # every target is ours now
    assert InMemoryLinkState.get_message_ins is linkstate_lookup.get_message_ins
    assert out == [(INFO, "[flower-pfl] simulation engine: tuned on flwr 1.42.0: "
                          "linkstate_lookup, engine_wakeup, actor_queue in Flower's place")]
    assert switch.install("tuned", simulation=True, version_of=ON_142, log=log) is done
    assert len(out) == 1
    # another request between runs: the first's replacements undone first
    assert switch.install("stock", simulation=True, version_of=ON_142, log=log).replaced == ()
    assert len(flowers_in_place()) == len(TARGETS)


def test_a_deployments_server_app_replaces_none_of_the_simulation_engine(lines):
    """Its own replacement only (tests/test_deployed_waits.py): the reply polling, the packing."""
    out, log = lines
    done = switch.install("tuned", simulation=False, version_of=ON_142, log=log)
    assert done.replaced == ("grid_poll", "pull_backoff", "array_packing")
    assert len(flowers_in_place()) == len(TARGETS)
    assert len(out) == 1 and "deployment engine (ServerApp)" in out[0][1]


@pytest.mark.parametrize("versions,named", [
    ({"flwr": "1.43.0", "ray": "2.55.1"}, "flwr 1.43.0 (tested: 1.42.x)"),
    ({"flwr": "1.420.0", "ray": "2.55.1"}, "flwr 1.420.0 (tested: 1.42.x)"),  # not a prefix
    ({"flwr": "1.41.2", "ray": "2.55.1"}, "flwr 1.41.2 (tested: 1.42.x)"),
    ({"flwr": "1.42.0", "ray": "2.56.0"}, "ray 2.56.0 (tested: 2.55.x)"),
])
def test_a_version_outside_the_tested_series_runs_stock_with_one_line(lines, versions, named):
    out, log = lines
    done = switch.install("tuned", simulation=True, version_of=versions.get, log=log)
    assert (done.engine, done.replaced) == ("stock", ())
    assert len(flowers_in_place()) == len(TARGETS)
    assert out == [(WARNING, f"[flower-pfl] engine: stock -- {named} is outside what the "
                             f"tuned engine was tested on (flwr 1.42.x, ray 2.55.x): Flower "
                             f"runs as released")]


def test_the_gate_reads_the_series_not_a_prefix():
    want = {"flwr": "1.42", "ray": "2.55"}
    assert gate.series("1.42.1rc1") == "1.42" and gate.series("1.420.0") == "1.420"
    assert gate.outside_tested({"flwr": "1.42.9", "ray": "2.55.0"}.get, want) is None
    assert gate.outside_tested({"flwr": "1.42.9"}.get, want) is None  # no Ray: not gated
    assert gate.outside_tested({"flwr": "2.42.0", "ray": "2.54.9"}.get, want) == \
        "flwr 2.42.0 (tested: 1.42.x); ray 2.54.9 (tested: 2.55.x)"
    assert gate.outside_tested(gate.installed_version) is None  # this environment: tested


def test_every_need_is_met_on_this_flower():
    """The fingerprints are those of the installed Flower (1.42.0): a failure here means
    Flower changed a body ours re-implements -- compare, port, then update the hash."""
    assert set(switch.EVERY) == {m for _, ms in switch.SETS.values() for m in ms}
    for module in switch.EVERY:
        assert gate.unmet(module.NEEDS) == [], switch.name(module)


def test_every_place_a_replacement_takes_is_checked_before_it_is_taken():
    """What each module puts in Flower's place (flower_pfl/tuned/patch.py) is named by one
    of its needs (pull_backoff sets keyword defaults: its functions' bodies are checked)."""
    for module in switch.EVERY:
        places = module._replaced.places if hasattr(module, "_replaced") else \
            {f"{module.MODULE}:{name}" for name in module.FUNCTIONS}
        assert places and set(places) <= {need.where for need in module.NEEDS}, \
            switch.name(module)


def test_a_missing_private_name_falls_back_before_anything_is_replaced(lines, monkeypatch):
    out, log = lines
    monkeypatch.delattr(InMemoryLinkState, "_check_stored_messages")
    done = switch.install("tuned", simulation=True, version_of=ON_142, log=log)
    assert (done.engine, done.replaced) == ("stock", ())
    assert len(flowers_in_place()) == len(TARGETS)  # the other two were not installed either
    assert out == [(WARNING, "[flower-pfl] engine: stock -- this Flower lacks what the tuned "
                             "engine touches: in_memory_linkstate.InMemoryLinkState."
                             "_check_stored_messages: absent (flower_pfl/tuned): Flower runs "
                             "as released")]


def test_an_instance_attribute_no_longer_set_falls_back(lines, monkeypatch):
    out, log = lines
    real = vars(BasicActorPool)["__init__"]

    def renamed(self, actor_type, client_resources, actor_kwargs):  # _future_to_actor renamed
        self.futures = {}

    monkeypatch.setattr(BasicActorPool, "__init__", renamed)
    assert switch.install("tuned", simulation=True, version_of=ON_142, log=log).replaced == ()
    assert "ray_actor.BasicActorPool.__init__: does not use _future_to_actor" in out[0][1]
    assert "does not use pool" in out[0][1] and len(out) == 1
    monkeypatch.setattr(BasicActorPool, "__init__", real)
    assert Need("flwr.simulation.ray_transport.ray_actor:BasicActorPool.__init__", "names",
                "_future_to_actor").unmet() is None


def test_a_changed_flower_body_or_signature_falls_back(lines, monkeypatch):
    out, log = lines
    source = {}
    exec("def add_messages_to_queue(state, queue, nodes_mapping, f_stop):\n"  # noqa: S102
         "    while not f_stop.is_set():\n        f_stop.wait(0.05)\n", source)
    monkeypatch.setattr(vce_api, "add_messages_to_queue", source["add_messages_to_queue"])
    monkeypatch.setattr(InMemoryLinkState, "store_message_res",
                        lambda self, message, *, ttl=None: None)
    assert switch.install("tuned", simulation=True, version_of=ON_142, log=log).replaced == ()
    (level, text), = out
    assert level == WARNING
    assert "vce_api.add_messages_to_queue: source unreadable" in text  # exec'd: no file
    assert ("in_memory_linkstate.InMemoryLinkState.store_message_res: parameters "
            "(self,message,ttl), not (self,message)") in text


def test_a_body_check_compares_the_source():
    def flower(x):
        return x + 1

    def changed(x):
        return x + 2

    mod = types.ModuleType("fake_flower_mod")
    mod.fn = flower
    sys.modules["fake_flower_mod"] = mod
    try:
        need = Need("fake_flower_mod:fn", "body", gate.fingerprint(flower))
        assert need.unmet() is None
        mod.fn = changed
        assert need.unmet() == "fake_flower_mod.fn: not the body ours was written from " \
                               "(source changed)"
        assert Need("fake_flower_mod:gone").unmet() == "fake_flower_mod.gone: absent"
    finally:
        del sys.modules["fake_flower_mod"]
    with pytest.raises(ValueError, match="kind"):
        Need("x:y", "hash")


def test_an_override_leaves_one_replacement_out_and_its_needs_unchecked(lines, monkeypatch):
    out, log = lines
    monkeypatch.setenv(engine_wakeup.KEEP_FLOWER_ENV, "1")
    monkeypatch.delattr(InMemoryGrid, "pull_messages")  # only engine_wakeup needs it
    done = switch.install("tuned", simulation=True, version_of=ON_142, log=log)
    assert done.replaced == ("linkstate_lookup", "actor_queue")
    assert done.kept == ("engine_wakeup",)
    assert vars(vce_api)["add_messages_to_queue"] is FLOWERS[vce_api, "add_messages_to_queue"]
    assert out[0][1].endswith("; engine_wakeup kept Flower's (FLOWER_PFL_FLOWER_TICK=1)")


def test_an_unknown_engine_or_process_is_refused():
    with pytest.raises(ValueError, match="engine must be one of"):
        switch.decide("fast", simulation=True)
    with pytest.raises(ValueError, match="process must be one of"):
        switch.decide("tuned", process="superlink")


def _context(engine: str) -> Context:
    cfg = config.validate({"strategy": "fedavg", "engine": engine})
    return Context(run_id=1, node_id=0, node_config={}, state=None,  # type: ignore[arg-type]
                   run_config={"cfg": cfg.to_json()})


class Built(Exception):
    """Raised where the ServerApp would build its strategy."""


@pytest.mark.parametrize("engine", ["tuned", "stock"])
def test_the_server_apps_main_installs_the_runs_engine_before_the_strategy(
        lines, monkeypatch, engine):
    seen = []

    def server_fn(context, cfg):
        seen.append((cfg["engine"], linkstate_lookup.installed()))
        raise Built

    monkeypatch.setattr(server_app, "server_fn", server_fn)
    grid = types.SimpleNamespace(pull_interval=0.1)  # the simulation's in-memory grid
    with pytest.raises(Built):
        server_app.main(grid, _context(engine))
    assert seen == [(engine, engine == "tuned")]
    assert grid.pull_interval == 0.1  # woken by replies (tuned), or Flower's (stock)


def test_importing_the_server_app_replaces_nothing():
    """In a fresh process where Flower's engine is loaded (as in the simulation's)."""
    probe = ("import json, sys\n"
             "from flwr.server.superlink.fleet.vce import vce_api\n"
             "from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend\n"
             "from flwr.server.superlink.linkstate.in_memory_linkstate import "
             "InMemoryLinkState as S\n"
             "from flwr.superlink.grid.inmemory_grid import InMemoryGrid\n"
             "import flower_pfl.server_app\n"
             "objs = [S.get_message_ins, S.store_message_ins, S.store_message_res,\n"
             "        vce_api.add_messages_to_queue, InMemoryGrid.send_and_receive,\n"
             "        RayBackend.build, RayBackend.num_workers.fget, RayBackend.process_message]\n"
             "print(json.dumps([o.__module__ for o in objs]))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, env={"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
                                            "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    modules = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(modules) == 8 and all(m.startswith("flwr.") for m in modules), modules


def test_the_cli_engine_flag_is_the_configuration_key(monkeypatch, capsys):
    """``flower-pfl run/validate --engine stock`` sets the YAML key ``engine`` (after any
    ``--set``), a value outside tuned|stock is refused by the argument parser."""
    from flower_pfl import cli

    seen = []

    def fake_load(path, sets):
        seen.append(list(sets))
        raise cli.config_mod.ConfigError("stop here")

    monkeypatch.setattr(cli, "load_config", fake_load)
    assert cli.main(["validate", "--set", "engine=tuned", "--engine", "stock"]) == 2
    assert seen == [["engine=tuned", "engine=stock"]]  # the flag wins: it comes last
    assert cli.main(["validate"]) == 2 and seen[-1] == []
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--engine", "fast"])
    assert exc.value.code == 2 and "invalid choice: 'fast'" in capsys.readouterr().err
