"""Reliability: bad uploads, client failures, transactional client state, checkpoint/resume.

In-process (flower_pfl/running/inprocess.py: the real Strategy and ClientApp, Flower's message
path in one process) with failures injected in the transport or the client; the real
`flower-pfl run` path (SIGTERM mid-run, resume, repeated starts) is in the slow tier,
named `test_real_*` so a reader sees what costs a `flwr run`.
"""

from __future__ import annotations

import csv
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
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from flower_pfl.clients.base import PFLClient
from flower_pfl.clients.state import ClientState
from flower_pfl.reliability import checkpoints
from flower_pfl.reliability.stop import clear_stop, request_stop
from flower_pfl.reliability.upload_checks import check_update, flat
from flower_pfl.running import inprocess
from flower_pfl.strategies.base import RoundError
from tests.conftest import small_config

REPO = Path(__file__).resolve().parent.parent
SHAPES = [(3, 2), (2,)]
DTYPES = [np.dtype(np.float32)] * 2


def _good():
    return [np.ones((3, 2), np.float32), np.zeros(2, np.float32)]


# ------------------------------------------------------------------ upload checks
@pytest.mark.parametrize("mutate, needle", [
    (lambda a, n: ([a[0]], n), "wrong number of arrays: 1 (the model has 2)"),
    (lambda a, n: ([a[0].T, a[1]], n), "array 0 has shape (2, 3), expected (3, 2)"),
    (lambda a, n: ([a[0].astype(np.float64), a[1]], n), "array 0 has dtype float64"),
    (lambda a, n: ([a[0], a[1].astype(np.int64)], n), "array 1 has dtype int64"),
    (lambda a, n: (a, 0), "num_examples = 0 (must be > 0)"),
    (lambda a, n: (a, -5), "num_examples = -5"),
    (lambda a, n: ([np.full((3, 2), np.nan, np.float32), a[1]], n), "array 0 holds 6 NaN/Inf"),
    (lambda a, n: ([a[0], np.array([1, np.inf], np.float32)], n), "array 1 holds 1 NaN/Inf"),
])
def test_bad_upload_is_named(mutate, needle):
    arrays, n = mutate(_good(), 10)
    assert check_update(_good(), 10, SHAPES, DTYPES) is None
    reason = check_update(arrays, n, SHAPES, DTYPES)
    assert reason is not None and needle in reason


def test_norm_bound_is_on_the_update_and_nan_metric_rejected():
    sent = flat(_good())
    moved = [a + 1.0 for a in _good()]  # ||update|| = sqrt(8) = 2.83
    assert check_update(moved, 5, SHAPES, DTYPES, sent=sent, max_norm=3.0) is None
    assert "exceeds max-update-norm = 2" in check_update(moved, 5, SHAPES, DTYPES, sent=sent,
                                                          max_norm=2.0)
    assert "metric 'train_loss' = nan" in check_update(_good(), 5, SHAPES, DTYPES,
                                                       {"train_loss": float("nan")})


# ------------------------------------------------------- transactional client state
@pytest.mark.parametrize("disk", [False, True])
def test_client_state_keeps_a_fit_only_when_the_server_accepts_it(tmp_path, disk):
    from flwr.app import RecordDict

    state = ClientState(RecordDict(), tmp_path / "p0" if disk else None)
    state.set_arrays("personal", [np.zeros(3, np.float32)])
    state.begin(1)
    state.set_arrays("personal", [np.ones(3, np.float32)])
    assert state.get_arrays("personal")[0][0] == 1  # the fit reads its own writes
    state.end()
    state.resolve(accepted_round=0)  # the server did not accept round 1
    assert state.get_arrays("personal")[0][0] == 0 and "txn" not in state
    state.begin(2)
    state.set_arrays("personal", [np.full(3, 2, np.float32)])
    state.set_values("meta", {"fit-rounds": 1})
    state.end()
    state.resolve(accepted_round=2)
    assert state.get_arrays("personal")[0][0] == 2 and state.get_values("meta") == {
        "fit-rounds": 1}
    state.begin(3)
    state.set_arrays("personal", [np.full(3, 3, np.float32)])
    state.abort()  # the fit raised
    assert state.get_arrays("personal")[0][0] == 2
    if disk:  # a fresh process (restarted node / resumed run) reads the same from disk
        fresh = ClientState(RecordDict(), tmp_path / "p0")
        assert fresh.get_arrays("personal")[0][0] == 2
        assert sorted(p.name for p in (tmp_path / "p0").iterdir()) == ["meta.json",
                                                                        "personal.npz"]


# ----------------------------------------------------------- failure injection
FAIL_RAISE: set[tuple[int, int]] = set()


class FaultyProxy(inprocess.InProcessProxy):
    """The transport of tests: ``plan[(round, pid)]`` = 'lost' | 'nan' | 'shape'."""

    plan: dict[tuple[int, int], str] = {}

    def fit(self, ins, timeout, group_id):
        res = super().fit(ins, timeout, group_id)
        what = self.plan.get((int(ins.config["round"]), int(self.context.node_config[
            "partition-id"])))
        if what == "lost":  # the client trained, its reply never arrived
            raise ValueError("Expected one Message but got: 0")
        arrays = parameters_to_ndarrays(res.parameters)
        if what == "nan":
            arrays[0] = np.full_like(arrays[0], np.nan)
        elif what == "shape":
            arrays[0] = arrays[0].reshape(-1)
        res.parameters = ndarrays_to_parameters(arrays)
        return res


@pytest.fixture
def raising_clients(monkeypatch):
    """Clients listed in FAIL_RAISE raise inside fit AFTER staging their new personal model."""
    original = PFLClient.save_personal

    def save_then_maybe_raise(self, model, key="personal"):
        original(self, model, key)
        if (self.round, self.pid) in FAIL_RAISE:
            raise RuntimeError(f"injected failure of client {self.pid}")
    monkeypatch.setattr(PFLClient, "save_personal", save_then_maybe_raise)
    yield
    FAIL_RAISE.clear()


def _personal(manager, pid):
    for proxy in manager.all().values():
        if proxy.context.node_config["partition-id"] == pid:
            record = proxy.context.state.get("personal")
            return None if record is None else [a.copy() for a in record.to_numpy_ndarrays()]


def _read(path: Path):
    with open(path) as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("strategy", ["fedamp", "selffl"])
def test_injected_failures_are_reported_and_leave_state_untouched(strategy, tmp_path,
                                                                    raising_clients):
    cfg = small_config(strategy=strategy, rounds=4, model="mclr", **{"data.subsample": 3000})
    FAIL_RAISE.update({(2, 1), (2, 4)})  # 2 of 10 raise in round 2
    FaultyProxy.plan = {(3, 2): "nan", (3, 5): "shape", (3, 7): "lost"}
    failing = {2: [1, 4], 3: [2, 5, 7]}
    manager = inprocess.make_federation(10, proxy_cls=FaultyProxy)
    snap: dict[int, dict] = {}

    def on_round(strategy_obj, r):
        stored = {}
        for pid in range(10):
            if strategy == "fedamp":
                stored[pid] = strategy_obj.matrix.model(pid).copy()
            else:
                stored[pid] = strategy_obj.store.get("sigma_sq", pid)
        snap[r] = {"personal": {p: _personal(manager, p) for p in range(10)}, "stored": stored}

    strategy_obj = inprocess.run(cfg, tmp_path, manager=manager, on_round=on_round)
    for r, pids in failing.items():
        for pid in pids:  # bit-identical to before the failed round, server and client
            before, after = snap[r - 1], snap[r]
            assert all(np.array_equal(a, b) for a, b in
                       zip(before["personal"][pid], after["personal"][pid])), (r, pid)
            assert np.array_equal(before["stored"][pid], after["stored"][pid]), (r, pid)
        for pid in set(range(10)) - set(pids):  # the others did train
            assert not all(np.array_equal(a, b) for a, b in
                           zip(snap[r - 1]["personal"][pid], snap[r]["personal"][pid]))
    failures = _read(tmp_path / "failures.csv")
    got = {(int(f["round"]), int(f["partition-id"])): f["reason"] for f in failures}
    assert set(got) == {(2, 1), (2, 4), (3, 2), (3, 5), (3, 7)}
    assert "injected failure of client 1" in got[(2, 1)]
    assert "NaN/Inf" in got[(3, 2)] and "update rejected" in got[(3, 2)]
    assert "shape" in got[(3, 5)] and "no reply" in got[(3, 7)]
    server = {int(r["round"]): r for r in _read(tmp_path / "server.csv")}
    assert server[2]["fit_failed_ids"] == "1 4" and server[3]["fit_failed_ids"] == "2 5 7"
    assert int(server[3]["fit_ok"]) == 7
    last = {int(r["partition-id"]): r for r in _read(tmp_path / "clients.csv")
            if r["round"] == "4"}
    assert len(last) == 10  # everyone evaluated, the failed clients took part again
    for pid in (1, 4, 2, 5, 7):
        assert int(last[pid]["fit-rounds"]) == 3  # counted only the accepted fits
    assert int(last[0]["fit-rounds"]) == 4
    assert strategy_obj.store.last_round[1] == 4
    if strategy == "fedamp":
        assert np.isfinite(strategy_obj.matrix.gram_c).all()
    else:
        assert np.isfinite([strategy_obj.sigma0_sq]).all()
        assert all(np.isfinite(a).all() for a in strategy_obj.global_arrays)


def test_round_fails_clearly_below_min_fit_answers(tmp_path):
    cfg = small_config(strategy="fedavg", rounds=2, clients=4, model="mclr",
                       **{"min-fit-answers": 3, "data.subsample": 2000})
    FaultyProxy.plan = {(1, 0): "nan", (1, 3): "lost"}
    with pytest.raises(RoundError, match=r"round 1: 2 valid update\(s\) from 4 sampled client"
                                         r"\(s\), fewer than min-fit-answers = 3"):
        inprocess.run(cfg, tmp_path, manager=inprocess.make_federation(4, proxy_cls=FaultyProxy))
    summary = json.loads((tmp_path / "summary.json").read_text())  # the record says so too
    assert summary["status"] == "failed" and summary["error"]["type"] == "RoundError"
    assert summary["error"]["message"].startswith("round 1: 2 valid update(s) from 4 sampled")


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


# ------------------------------------------------------------ bad input before training
def test_unwritable_output_dir_is_named(tmp_path):
    from flower_pfl.reliability.preflight import PreflightError, check_output_dir

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(PreflightError, match=r"output directory .*file/run is not writable"):
        check_output_dir(blocker / "run")


def test_model_not_fitting_the_data_is_named(tmp_path, monkeypatch):
    from flower_pfl.learning import data
    from flower_pfl.reliability.preflight import PreflightError, preflight

    cfg = small_config(model="mclr", **{"data.subsample": 2000})
    preflight(cfg, tmp_path / "ok")  # the real pairing passes
    # a model built for 3x32x32 inputs (what a mislabelled dataset would give)
    monkeypatch.setattr(data, "input_shape", lambda name: (3, 32, 32))
    with pytest.raises(PreflightError, match=r"model 'mclr' does not fit dataset 'fmnist': "
                                             r"samples of shape \(1, 28, 28\) fail"):
        preflight(cfg, tmp_path / "bad")
    monkeypatch.setattr(data, "input_shape", lambda name: (1, 28, 28))
    monkeypatch.setitem(data.NUM_CLASSES, "fmnist", 5)
    with pytest.raises(PreflightError, match=r"gives \(5,\) outputs per sample but dataset "
                                             r"'fmnist' has 10 classes"):
        preflight(cfg, tmp_path / "bad")


def test_cli_refuses_bad_input_before_starting(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    path = _tiny_yaml(tmp_path, "fedavg", **{"output-dir": str(blocker)})
    out = subprocess.run([str(Path(sys.executable).parent / "flower-pfl"), "run", "--config",
                          str(path)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 2 and "cannot start" in out.stderr and "not writable" in out.stderr
    assert "SuperLink" not in out.stdout
    out = subprocess.run([str(Path(sys.executable).parent / "flower-pfl"), "run", "--resume",
                          str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 2 and "no checkpoint there" in out.stderr


def test_flower_processes_get_one_blas_thread_and_the_watchdog_fires(tmp_path):
    from flower_pfl.running.procs import LaunchError, ProcessSet, flwr_env, stream_run

    env = flwr_env(tmp_path / "home", 1)
    assert env["OPENBLAS_NUM_THREADS"] == "1"  # no OpenBLAS thread pool: no exec_blas spin
    # a "run" that prints one progress line and then hangs: stopped with a clear message
    cmd = [sys.executable, "-c", "import time; print('[flower-pfl] started', flush=True); "
           "time.sleep(600)"]
    procs = ProcessSet()
    started = time.time()
    with pytest.raises(LaunchError, match=r"watchdog: no progress for 3s .* the last progress "
                                          r"line was: '\[flower-pfl\] started'"):
        stream_run(cmd, env, tmp_path / "log", False, None, procs, stall_s=3)
    procs.stop()
    assert time.time() - started < 120
    assert all(p.poll() is not None for p in procs.procs)


@pytest.mark.slow  # a real `flwr run`
def test_real_repeated_starts_of_a_model_matrix_run_do_not_hang(tmp_path):
    # issue 15: 1 of 6 identical FedACS starts sat in [INIT] for 10 minutes (BLAS spin).
    from flower_pfl import config
    from flower_pfl.running.launch import run_simulation

    path = _tiny_yaml(tmp_path, "fedacs", clients=40, rounds=1, **{"fraction-fit": 0.1,
                                                                 "stall-timeout": 240,
                                                                 "checkpoint-every": 0})
    cfg = config.load(path)
    for attempt in range(3):
        out = run_simulation(cfg, path, [], tmp_path / f"r{attempt}", echo=False, timeout_s=600)
        assert out.status == "finished:completed"


# ------------------------------------------------------------------ federation changes
def _with_pids(pids: list[int]):
    from flwr.app import Context, RecordDict
    from flwr.server.client_manager import SimpleClientManager

    manager = SimpleClientManager()
    for k, pid in enumerate(pids):
        ctx = Context(run_id=0, node_id=500 + k, node_config={"partition-id": pid,
                                                               "num-partitions": len(pids)},
                      state=RecordDict(), run_config={})
        manager.register(inprocess.InProcessProxy(str(500 + k), ctx))
    return manager


@pytest.mark.parametrize("pids, needle", [
    ([0, 1, 2, 7], r"reports partition-id 7, outside \[0, 4\) of the configuration"),
    ([0, 1, 1, 3], r"two nodes report partition-id 1"),
])
def test_handshake_refuses_bad_partition_ids(tmp_path, pids, needle):
    from flower_pfl.strategies.base import FederationError

    cfg = small_config(strategy="fedavg", clients=4, rounds=1, model="mclr",
                       **{"data.subsample": 2000})
    with pytest.raises(FederationError, match=needle):
        inprocess.run(cfg, tmp_path, manager=_with_pids(pids))


def test_a_node_failing_the_first_handshake_is_named_with_its_reason(tmp_path):
    """The first handshake must end in a FederationError that names the node and why (it
    raised NameError once: the helper that words the reason was not imported)."""
    from flower_pfl.strategies.base import FederationError

    class Broken(inprocess.InProcessProxy):
        def get_properties(self, ins, timeout, group_id):
            raise RuntimeError("socket closed")

    manager = inprocess.make_federation(4)
    node = next(p for p in manager.all().values() if p.context.node_config["partition-id"] == 3)
    manager.unregister(node)
    manager.register(Broken(node.cid, node.context))
    cfg = small_config(strategy="fedavg", clients=4, rounds=1, model="mclr",
                       **{"data.subsample": 2000})
    with pytest.raises(FederationError, match=rf"node {node.cid} did not answer the partition-id "
                                              r"handshake: RuntimeError: socket closed"):
        inprocess.run(cfg, tmp_path, manager=manager)


def test_node_that_leaves_is_not_fatal_and_rejoins_under_its_partition_id(tmp_path):
    cfg = small_config(strategy="fedavg", clients=4, rounds=4, model="mclr",
                       **{"fraction-fit": 1.0, "data.subsample": 2000})
    manager = inprocess.make_federation(4)
    node = next(p for p in manager.all().values() if p.context.node_config["partition-id"] == 2)

    def churn(strategy_obj, r):
        if r == 1:
            manager.unregister(node)  # the node goes away after round 1
        if r == 2:  # ... and comes back with a new node id, its disk/state intact
            manager.register(inprocess.InProcessProxy("9999", node.context))
    strategy_obj = inprocess.run(cfg, tmp_path, manager=manager, on_round=churn)
    rows = _read(tmp_path / "clients.csv")
    by_round = {r: sorted(int(x["partition-id"]) for x in rows if x["round"] == str(r))
                for r in range(1, 5)}
    assert by_round == {1: [0, 1, 2, 3], 2: [0, 1, 3], 3: [0, 1, 2, 3], 4: [0, 1, 2, 3]}
    assert strategy_obj.proxies[2].cid == "9999"
    last = {int(x["partition-id"]): x for x in rows if x["round"] == "4"}
    assert int(last[2]["fit-rounds"]) == 3 and int(last[0]["fit-rounds"]) == 4
    server = {int(r["round"]): r for r in _read(tmp_path / "server.csv")}
    assert int(server[2]["sampled"]) == 3 and int(server[3]["sampled"]) == 4


def test_node_that_rejoins_under_the_same_node_id_is_sampled_again(tmp_path):
    """Deployment with node authentication: a restarted SuperNode keeps its node id. Gone at
    one round's start and back at the next, it must be sampled again (it was mapped already,
    so no handshake re-adds it; found by the namespace deployment test)."""
    cfg = small_config(strategy="fedavg", clients=4, rounds=4, model="mclr",
                       **{"fraction-fit": 1.0, "data.subsample": 2000})
    manager = inprocess.make_federation(4)
    node = next(p for p in manager.all().values() if p.context.node_config["partition-id"] == 2)

    def churn(strategy_obj, r):
        if r == 1:
            manager.unregister(node)
        if r == 2:  # back under the SAME node id
            manager.register(inprocess.InProcessProxy(node.cid, node.context))
    inprocess.run(cfg, tmp_path, manager=manager, on_round=churn)
    rows = _read(tmp_path / "clients.csv")
    by_round = {r: sorted(int(x["partition-id"]) for x in rows if x["round"] == str(r))
                for r in range(1, 5)}
    assert by_round == {1: [0, 1, 2, 3], 2: [0, 1, 3], 3: [0, 1, 2, 3], 4: [0, 1, 2, 3]}
