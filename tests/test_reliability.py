"""Reliability: checkpoint/resume, stop requests and extending a finished run, signals.

In-process (flower_pfl/running/inprocess.py: the real Strategy and ClientApp, Flower's message
path in one process) with failures injected in the transport or the client; the real
`flower-pfl run` path (SIGTERM mid-run, resume, stop and extend) is in the slow tier,
named `test_real_*` so a reader sees what costs a `flwr run`. Bad uploads, client failures,
transactional client state and federation changes: tests/test_failures.py; bad input before
training and repeated starts: tests/test_bad_input.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from flower_pfl.reliability import checkpoints
from flower_pfl.reliability.stop import clear_stop, request_stop
from flower_pfl.running import inprocess
from tests.conftest import small_config
from tests.test_failures import FaultyProxy, _read

REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- checkpoint/resume
class Killed(Exception):
    pass


# every strategy with server state of its own (FedRep's body needs a model of > 1 layer)
@pytest.mark.parametrize("strategy, model", [
    ("fedamp", "mclr"), ("fedacs", "mclr"), ("selffl", "mclr"), ("scaffold", "mclr"),
    ("pfedhn", "mclr"), ("plgu-grep", "dnn"), ("apfl", "mclr")])
def test_inprocess_resume_equals_uninterrupted(strategy, model, tmp_path):
    cfg = small_config(strategy=strategy, rounds=4, model=model, **{
        "checkpoint-every": 2, "fraction-fit": 0.5, "data.subsample": 3000})
    FaultyProxy.plan = {}
    full = tmp_path / "full"
    inprocess.run(cfg, full, client_state_dir=full / "client-state")

    part = tmp_path / "part"

    def kill(strategy_obj, r):
        if r == 3:
            raise Killed  # dies after round 3; the newest checkpoint holds round 2
    with pytest.raises(Killed):
        inprocess.run(cfg, part, client_state_dir=part / "client-state", on_round=kill)
    assert checkpoints.latest_checkpoint(part).name == "round-000002"
    # fresh nodes: the personal state must come back from the checkpoint
    inprocess.run(cfg, part, client_state_dir=part / "client-state", resume=True)
    rounds = [int(r["round"]) for r in _read(part / "rounds.csv")]
    assert rounds == [1, 2, 3, 4]  # no round duplicated
    assert _read(part / "clients.csv") == _read(full / "clients.csv") or \
        _same_metrics(_read(part / "clients.csv"), _read(full / "clients.csv"))
    summary = json.loads((part / "summary.json").read_text())
    assert summary["status"] == "completed" and len(summary["rounds"]) == 4


def test_a_checkpoint_holds_the_named_state_only(tmp_path):
    from flower_pfl.strategies.checkpointing import checkpointed_names
    from flower_pfl.strategies.scaffold import Scaffold

    cfg = small_config(strategy="scaffold", rounds=2, clients=4, model="mclr",
                       **{"checkpoint-every": 1, "data.subsample": 2000})

    def add_cache(s, r):  # an attribute no class names: a cache, say
        s.scratch_cache = np.ones(3)
    s = inprocess.run(cfg, tmp_path, on_round=add_cache)
    state = checkpoints.read_checkpoint(checkpoints.latest_checkpoint(tmp_path))["strategy"]
    assert hasattr(s, "scratch_cache") and "scratch_cache" not in state
    assert set(state) == set(checkpointed_names(Scaffold))
    # the base's state and SCAFFOLD's own c; never the configuration or the connections
    assert {"rng", "store", "global_arrays", "run_uid", "control"} <= set(state)
    assert not {"cfg", "results", "proxies", "pid_of_cid", "_sent"} & set(state)


def test_checkpointed_names_are_collected_along_the_mro():
    from flower_pfl.strategies.checkpointing import Checkpointing, checkpointed_names

    class Base(Checkpointing):
        checkpointed = ("a", "b")

    class Mixin:
        checkpointed = ("m",)

    class Child(Mixin, Base):
        checkpointed = ("c", "a")

    assert checkpointed_names(Child) == ("a", "b", "m", "c")
    child = Child()
    child.a, child.b, child.c = 1, 2, 3
    with pytest.raises(AttributeError, match=r"names \['m'\] in 'checkpointed'"):
        child.checkpoint_state()  # a named attribute that is missing is an error
    child.m, child.other = 4, 5
    assert child.checkpoint_state() == {"a": 1, "b": 2, "m": 4, "c": 3}
    fresh = Child()
    fresh.restore_state({**child.checkpoint_state(), "other": 5})
    assert (fresh.a, fresh.m) == (1, 4) and not hasattr(fresh, "other")


def _same_metrics(a, b, tol=1e-9):
    skip = {"elapsed_s"}
    if len(a) != len(b):
        return False
    for ra, rb in zip(a, b):
        for k in ra:
            if k in skip:
                continue
            try:
                if abs(float(ra[k]) - float(rb[k])) > tol:
                    return False
            except ValueError:
                if ra[k] != rb[k]:
                    return False
    return True


def test_resume_refuses_another_configuration_and_a_missing_checkpoint(tmp_path):
    from flower_pfl.strategies.base import ResumeError

    cfg = small_config(strategy="fedavg", rounds=2, clients=4, model="mclr",
                       **{"checkpoint-every": 1, "data.subsample": 2000})
    with pytest.raises(ResumeError, match="no checkpoint in"):
        inprocess.run(cfg, tmp_path, resume=True)
    inprocess.run(cfg, tmp_path)
    other = small_config(strategy="fedavg", rounds=2, clients=4, model="mclr",
                         **{"checkpoint-every": 1, "data.subsample": 2000, "train.lr": 0.1})
    with pytest.raises(ResumeError, match=r"different configuration \(differs in: train.lr\)"):
        inprocess.run(other, tmp_path, resume=True)
    # the refused resume is recorded as failed, beside the two rounds the first launch ran
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "ResumeError" in summary["error"]["type"]
    assert [r["round"] for r in summary["rounds"]] == [1, 2]


# ------------------------------------------------------------- stop, resume, extend
def _lifecycle_cfg(**changes):
    # default checkpoint-every (5): only the stop and the run's end write checkpoints here
    return small_config(**{"strategy": "fedamp", "rounds": 3, "clients": 4, "model": "mclr",
                            "fraction-fit": 0.5, "data.subsample": 2000, **changes})


def test_stop_file_ends_the_run_after_its_round_and_resume_equals_uninterrupted(tmp_path):
    cfg = _lifecycle_cfg()
    assert cfg["checkpoint-every"] == 5  # the default: no periodic checkpoint in 3 rounds
    full = tmp_path / "full"
    inprocess.run(cfg, full, client_state_dir=full / "client-state")

    part = tmp_path / "part"

    def stop(strategy_obj, r):
        if r == 2:  # `flower-pfl run` got SIGINT during round 2
            request_stop(part)
    inprocess.run(cfg, part, client_state_dir=part / "client-state", on_round=stop)
    summary = json.loads((part / "summary.json").read_text())
    assert summary["status"] == "stopped" and [r["round"] for r in summary["rounds"]] == [1, 2]
    assert checkpoints.latest_checkpoint(part).name == "round-000002"
    clear_stop(part)  # as the launcher does before it starts a run
    inprocess.run(cfg, part, client_state_dir=part / "client-state", resume=True)
    assert [int(r["round"]) for r in _read(part / "rounds.csv")] == [1, 2, 3]
    assert _read(part / "clients.csv") == _read(full / "clients.csv") or \
        _same_metrics(_read(part / "clients.csv"), _read(full / "clients.csv"))
    assert json.loads((part / "summary.json").read_text())["status"] == "completed"


def test_a_finished_run_is_extended_and_its_first_rows_stay(tmp_path):
    short, longer = tmp_path / "short", tmp_path / "longer"
    inprocess.run(_lifecycle_cfg(rounds=2), short, client_state_dir=short / "client-state")
    first = _read(short / "clients.csv")
    assert checkpoints.latest_checkpoint(short).name == "round-000002"  # the run's end
    inprocess.run(_lifecycle_cfg(rounds=4), short, client_state_dir=short / "client-state",
                  resume=True)
    rows = _read(short / "clients.csv")
    assert [r for r in rows if int(r["round"]) <= 2] == first
    # round 3 also holds the second process's start-up: s/round leaves that step out
    assert json.loads((short / "summary.json").read_text())["resumed_after"] == [2]
    assert sorted({int(r["round"]) for r in rows}) == [1, 2, 3, 4]
    # ... and it is the run that 4 rounds from the start would have been
    inprocess.run(_lifecycle_cfg(rounds=4), longer, client_state_dir=longer / "client-state")
    assert _same_metrics(rows, _read(longer / "clients.csv"))


def _checkpointed(tmp_path, cfg, done: int) -> Path:
    """A results folder whose newest checkpoint is after round ``done`` of ``cfg``."""
    run = tmp_path / "run"
    state = {"version": 1, "round": done,
             "config": {"values": dict(cfg.values), "hyper": dict(cfg.hyper)}}
    checkpoints.write_checkpoint(run, done, state)
    return run


def test_resume_compares_with_the_runs_own_configuration(tmp_path):
    from flower_pfl.config import ConfigError
    from flower_pfl.running.launch import AlreadyCompleted, resume_config

    cfg = _lifecycle_cfg(rounds=3, **{"train.epochs": 2, "output-dir": "/elsewhere"})
    run = _checkpointed(tmp_path, cfg, 3)
    with pytest.raises(AlreadyCompleted, match=r"completed all its 3 round\(s\).*--set rounds=N"):
        resume_config(run)
    extended, path = resume_config(run, None, ["rounds=5", "stall-timeout=60"])
    assert (extended["rounds"], extended["train.epochs"], extended["stall-timeout"]) == \
        (5, 2, 60)
    assert yaml.safe_load(path.read_text())["rounds"] == 5  # what the ServerApp reads
    with pytest.raises(ConfigError) as bad:
        resume_config(run, None, ["rounds=5", "seed=4"])
    assert "seed differ(s) from the run's own configuration" in str(bad.value)
    assert "train.epochs" not in str(bad.value).split("differ(s)")[0]
    with pytest.raises(ConfigError, match=r": hyper\.sigma differ\(s\)"):
        resume_config(run, None, ["hyper.fedamp.sigma=7"])
    with pytest.raises(ConfigError, match="set rounds above 3"):
        resume_config(run, None, ["rounds=2"])


def test_config_differences_name_each_key_and_leave_the_free_ones_out():
    saved = {"rounds": 3, "seed": 0, "train.lr": 0.1, "output-dir": "a"}
    given = {"rounds": 9, "seed": 1, "train.lr": 0.1, "output-dir": "b", "extra": 1}
    assert checkpoints.config_differences(saved, {"mu": 1.0, "k": 2}, given,
                                          {"mu": 1.0, "k": 3}) == ["extra", "seed", "hyper.k"]
    assert checkpoints.config_differences(saved, {}, saved, {}) == []


_SIGNALS_CHILD = """
import os, signal, sys
from flower_pfl.running.procs import StopAfterRound, Terminated
asked = []
StopAfterRound(asked.append).install()
os.kill(os.getpid(), signal.SIGINT)      # Ctrl-C: ask once, go on
print("asked", asked, flush=True)
try:
    os.kill(os.getpid(), signal.SIGTERM)  # again: stop now
except Terminated as exc:
    print("terminated", exc.signum, flush=True)
"""


def test_first_signal_asks_the_run_to_stop_a_second_stops_it_even_with_sigint_ignored():
    # started with SIGINT ignored, as from `nohup` or a script's `trap '' INT`
    out = subprocess.run([sys.executable, "-c", _SIGNALS_CHILD], capture_output=True,
                         text=True, timeout=60, cwd=REPO,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == [f"asked [{int(signal.SIGINT)}]",
                                          f"terminated {int(signal.SIGTERM)}"]


# ------------------------------------------------------------- real `flower-pfl run`
def _tiny_yaml(tmp_path: Path, strategy: str, **changes) -> Path:
    tree = {"strategy": strategy, "rounds": 4, "clients": 4, "fraction-fit": 0.5,
            "model": "mclr", "eval-every": 1, "checkpoint-every": 1, "seed": 3,
            "output-dir": str(tmp_path / "out"), "run-name": "run",
            "data": {"dataset": "fmnist", "partition": "dirichlet", "subsample": 3000}}
    tree.update(changes)
    path = tmp_path / f"{strategy}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def _cli(*args: str) -> subprocess.Popen:
    # this checkout's code, not the one the console script was installed from
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        str(REPO), os.environ.get("PYTHONPATH", "")]))}
    return subprocess.Popen([str(Path(sys.executable).parent / "flower-pfl"), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO, start_new_session=True, env=env)


@pytest.mark.slow  # a real `flwr run`
# the real signal path, once: FedAMP has server state (the cloud models) and client state;
# every strategy with server state of its own (Self-FL's variances, FedACS, SCAFFOLD, ...)
# has its resume checked in-process above (test_inprocess_resume_equals_uninterrupted)
@pytest.mark.parametrize("strategy", ["fedamp"])
def test_real_sigterm_leaves_nothing_and_resume_equals_uninterrupted(strategy, tmp_path):
    import threading

    import torch

    from flower_pfl import config
    from flower_pfl.running.procs import is_alive, process_tree

    # SIGTERM after the round-2 checkpoint line reaches the launcher's console.  That line
    # comes through Flower's log stream, which can trail the ServerApp by several rounds of
    # this tiny MCLR run (~0.1 s each on an idle machine); 40 rounds keep the run going
    # well past the signal
    rounds = 40
    path = _tiny_yaml(tmp_path, strategy, rounds=rounds)
    results = tmp_path / "out" / "run"
    launcher = _cli("run", "--config", str(path))
    seen: set[int] = set()
    stop = threading.Event()

    def watch() -> None:  # every process the run started, while it runs
        while not stop.is_set():
            seen.update(process_tree(launcher.pid))
            time.sleep(0.5)
    threading.Thread(target=watch, daemon=True).start()
    log = []
    for line in launcher.stdout:
        log.append(line)
        if "checkpoint after round 2 written" in line:
            seen.update(process_tree(launcher.pid))
            launcher.send_signal(signal.SIGTERM)  # a scheduler's time limit, `kill`, `timeout`
            break
    rest = launcher.communicate(timeout=180)[0]
    stop.set()
    assert launcher.returncode == 128 + signal.SIGTERM, "".join(log[-30:]) + rest
    # the round in progress finished and was checkpointed; the hint names that checkpoint
    stopped = re.search(rf"SIGTERM: the run stopped after round (\d+) of {rounds}", rest)
    assert stopped, "".join(log[-30:]) + rest
    stopped_after = int(stopped.group(1))
    assert f"Its checkpoint is after round {stopped_after}; continue with" in rest
    assert json.loads((results / "summary.json").read_text())["status"] == "stopped"
    assert len(seen) > 3 and not [p for p in seen if is_alive(p)], "processes left running"
    done = [int(r["round"]) for r in _read(results / "rounds.csv")]
    assert 2 <= max(done) == stopped_after < rounds, "the run finished before SIGTERM landed"

    resumed = _cli("run", "--resume", str(results), "--quiet")
    out = resumed.communicate(timeout=600)[0]
    assert resumed.returncode == 0, out[-3000:]
    assert [int(r["round"]) for r in _read(results / "rounds.csv")] == list(range(1, rounds + 1))
    # both launches' ServerApps read the initial model their preflight check wrote, and the
    # launcher removed the file each time
    from flower_pfl import initial_model
    log_text = (results / "flwr-run.log").read_text()
    assert log_text.count(f"[flower-pfl] initial model: {initial_model.READ}") == 2
    assert not (results / initial_model.FILE).exists()

    # the same run, uninterrupted, in one process (same classes, seeds and one torch
    # thread per client as in the Ray actors)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = config.load(path)
        inprocess.run(cfg, tmp_path / "ref", client_state_dir=tmp_path / "ref" / "cs")
    finally:
        torch.set_num_threads(threads)
    last = str(rounds)
    got = {int(r["partition-id"]): r for r in _read(results / "clients.csv") if r["round"] == last}
    want = {int(r["partition-id"]): r for r in _read(tmp_path / "ref" / "clients.csv")
            if r["round"] == last}
    assert sorted(got) == sorted(want) == [0, 1, 2, 3]
    metric = "accuracy"
    for pid in want:
        assert float(got[pid][metric]) == pytest.approx(float(want[pid][metric]), abs=1e-6)
        assert float(got[pid]["loss"]) == pytest.approx(float(want[pid]["loss"]), rel=1e-4)
        assert got[pid]["fit-rounds"] == want[pid]["fit-rounds"]


def test_cli_resume_of_a_completed_run_says_so_and_a_changed_key_is_named(tmp_path, capsys):
    from flower_pfl import cli

    cfg = _lifecycle_cfg(rounds=3)
    run = _checkpointed(tmp_path, cfg, 3)
    assert cli.main(["run", "--resume", str(run)]) == 0
    assert "has completed all its 3 round(s); nothing to resume" in capsys.readouterr().out
    assert cli.main(["run", "--resume", str(run), "--set", "rounds=5",
                     "--set", "train.lr=0.5"]) == 2
    err = capsys.readouterr().err
    assert "train.lr differ(s) from the run's own configuration" in err
    assert "rounds" not in err.split("differ(s)")[0]  # the extension is allowed


@pytest.fixture(scope="module")
def shared_superlink(tmp_path_factory):
    """One Ray instance and one simulation SuperLink for the real runs below (as
    tests/test_e2e_simulation.py); stopped by PID at the end."""
    from contextlib import ExitStack

    from flower_pfl.running.launch import simulation_superlink
    from flower_pfl.running.procs import is_alive
    from flower_pfl.running.rayhead import shared_ray

    work = tmp_path_factory.mktemp("superlink")
    with ExitStack() as stack:
        env = stack.enter_context(pytest.MonkeyPatch.context())
        env.setenv("RAY_ADDRESS", stack.enter_context(shared_ray(work, work / "ray.log")))
        shared = stack.enter_context(simulation_superlink(work, work / "superlink.log"))
        yield shared
    assert not any(is_alive(p) for p in shared[1].known), "the shared SuperLink left processes"


def _real_run(cfg_path: Path, results: Path, superlink, sets=(), resume=False, on_line=None):
    from flower_pfl import config
    from flower_pfl.running.launch import resume_config, run_simulation

    if resume:
        cfg, cfg_path = resume_config(results, None, list(sets))
        sets = ()
    else:
        cfg = config.load(cfg_path, list(sets) or None)
    return run_simulation(cfg, cfg_path, list(sets), results, echo=False, timeout_s=600,
                          resume=resume, on_line=on_line, superlink=superlink)


@pytest.mark.slow  # real `flwr run`s on one shared SuperLink and Ray instance
def test_real_stop_resumes_to_the_uninterrupted_rows_and_extends(tmp_path, shared_superlink):
    # stopped in round 1, whose Ray actors take seconds to start: the stop file is there long
    # before the round ends (a stop asked at the [ROUND 2] line raced a 2 s round against the
    # streamed line on an idle machine; the in-process test stops in round 2 exactly)
    path = _tiny_yaml(tmp_path, "fedamp", rounds=3, model="cnn", train={"epochs": 4})
    tree = yaml.safe_load(path.read_text())
    del tree["checkpoint-every"]  # the default, 5: no periodic checkpoint in 3 rounds
    path.write_text(yaml.safe_dump(tree))
    full, part = tmp_path / "full", tmp_path / "part"
    _real_run(path, full, shared_superlink)

    def stop_in_round_1(line: str) -> None:  # what the launcher does on SIGINT
        if "[ROUND 1]" in line:
            request_stop(part)
    _real_run(path, part, shared_superlink, on_line=stop_in_round_1)
    summary = json.loads((part / "summary.json").read_text())
    assert summary["status"] == "stopped" and len(summary["rounds"]) == 1
    assert checkpoints.latest_checkpoint(part).name == "round-000001"
    _real_run(path, part, shared_superlink, resume=True)
    assert _same_metrics(_read(part / "clients.csv"), _read(full / "clients.csv"))
    assert json.loads((part / "summary.json").read_text())["status"] == "completed"

    original = _read(full / "clients.csv")
    _real_run(path, full, shared_superlink, sets=["rounds=4"], resume=True)
    rows = _read(full / "clients.csv")
    assert rows[:len(original)] == original
    assert sorted({int(r["round"]) for r in rows}) == [1, 2, 3, 4]
    assert json.loads((full / "summary.json").read_text())["status"] == "completed"
