"""Real `flwr run`s in Ray simulation, through the launcher: status checked, PIDs stopped.

Slow tier. One strategy per family runs here; every registered strategy also runs through
Flower's message path in the fast tier (tests/test_message_path.py). A family is the
strategy class right below `PersonalizedStrategy` (FedAvg and its variants, the message
passing methods, pFedBreD and pFedMe, ...), so a new strategy joins one without editing
this file; the most derived class of each family represents it. The runs share one
SuperLink and one Ray instance; the private-SuperLink path of `flower-pfl run` runs once.
"""

from __future__ import annotations

import csv
import json
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
import torch
import yaml

from flower_pfl import config, initial_model, registry
from flower_pfl.running import inprocess
from flower_pfl.running.launch import run_simulation, simulation_superlink
from flower_pfl.running.procs import LaunchError, is_alive
from flower_pfl.running.rayhead import shared_ray
from flower_pfl.strategies.base import PersonalizedStrategy
from flower_pfl.strategies.message_passing import MessagePassingStrategy
from flower_pfl.tuned import actor_queue, engine_wakeup

TINY = {"strategy": "local", "rounds": 3, "clients": 4, "fraction-fit": 1.0, "model": "mclr",
        "eval-every": 1, "data": {"dataset": "fmnist", "partition": "dirichlet", "subsample": 3000}}


def family(name: str) -> type:
    """The class right below PersonalizedStrategy in the strategy's MRO."""
    mro = registry.strategy_class(name).__mro__
    return mro[mro.index(PersonalizedStrategy) - 1]


def representatives() -> list[str]:
    by_family: dict[type, list[str]] = {}
    for name in sorted(registry.REGISTRY):
        by_family.setdefault(family(name), []).append(name)
    return sorted(min(names, key=lambda n: (-len(registry.strategy_class(n).__mro__), n))
                  for names in by_family.values())


def _write(tmp_path: Path, tree) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


@pytest.fixture(scope="module")
def superlink(tmp_path_factory):
    """One Ray instance and one simulation SuperLink for every run of this module (the
    runs attach to Ray through RAY_ADDRESS, as `flower-pfl bench --ray shared` does);
    stopped by PID at the end."""
    work = tmp_path_factory.mktemp("superlink")
    with ExitStack() as stack:
        env = stack.enter_context(pytest.MonkeyPatch.context())  # restored at the end
        env.setenv("RAY_ADDRESS", stack.enter_context(shared_ray(work, work / "ray.log")))
        shared = stack.enter_context(simulation_superlink(work, work / "superlink.log"))
        yield shared  # the SuperLink inherited RAY_ADDRESS
    assert not any(is_alive(p) for p in shared[1].known), "the shared SuperLink left processes"


def test_every_family_has_a_representative():
    reps = representatives()
    assert {family(n) for n in reps} == {family(n) for n in registry.REGISTRY}
    assert "fedamp" in reps or "fedacs" in reps or "heurfedamp" in reps  # message passing


@pytest.mark.slow
@pytest.mark.parametrize("strategy", representatives())
def test_flwr_run_simulation_end_to_end(strategy, tmp_path, superlink):
    path = _write(tmp_path, TINY)
    cfg = config.load(path, [f"strategy={strategy}"])
    out = run_simulation(cfg, path, [f"strategy={strategy}"], tmp_path / "res", echo=False,
                         timeout_s=600, superlink=superlink)
    assert out.status == "finished:completed"
    deadline = time.time() + 30  # the run's own processes (ServerApp, Ray) end with it
    while any(is_alive(p) for p in out.pids) and time.time() < deadline:
        time.sleep(0.5)
    assert out.pids and not any(is_alive(p) for p in out.pids), "processes left running"
    summary = json.loads((tmp_path / "res" / "summary.json").read_text())
    assert summary["status"] == "completed" and len(summary["rounds"]) == 3
    assert json.loads((tmp_path / "res" / "config.json").read_text())["values"]["strategy"] \
        == strategy  # the override reached the ServerApp
    strategy_cls = registry.strategy_class(strategy)
    if issubclass(strategy_cls, MessagePassingStrategy):  # last round's attention (FedAMP Fig. 3)
        assert (tmp_path / "res" / "attention.npy").exists()
        assert (tmp_path / "res" / "attention.png").exists()
    with open(tmp_path / "res" / "clients.csv") as fh:
        rows = list(csv.DictReader(fh))
    last = [r for r in rows if r["round"] == "3"]
    assert sorted(int(r["partition-id"]) for r in last) == [0, 1, 2, 3]
    # context.state survived 3 rounds in the Ray engine: every client counted 3 fits
    assert all(int(r["fit-rounds"]) == 3 for r in last)
    assert all(0.0 <= float(r["accuracy"]) <= 1.0 for r in last)
    if strategy_cls.has_global_model:  # both the personalized and the global model evaluated
        assert all(0.0 <= float(r["global_accuracy"]) <= 1.0 for r in last)
    if strategy == "selffl":
        with open(tmp_path / "res" / "server.csv") as fh:
            server = list(csv.DictReader(fh))
        assert all(float(r["sigma0_sq"]) >= 0 for r in server)


@pytest.mark.slow
def test_private_superlink_run_stops_everything(tmp_path, monkeypatch):
    """`flower-pfl run`'s own path: a private SuperLink and Ray, stopped with the run."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    path = _write(tmp_path, {**TINY, "rounds": 1})
    out = run_simulation(config.load(path), path, [], tmp_path / "res", echo=False,
                         timeout_s=600)
    assert out.status == "finished:completed"
    assert out.pids and not any(is_alive(p) for p in out.pids), "processes left running"


@pytest.mark.slow
def test_failed_run_is_reported_not_hidden(tmp_path, superlink):
    # 6 SuperNodes for a 4-client configuration: the ServerApp refuses, the run fails,
    # and the launcher must say so (flwr run itself exits 0) and still clean up.
    path = _write(tmp_path, TINY)
    cfg = config.load(path)
    with pytest.raises(LaunchError, match="finished:failed"):
        run_simulation(cfg, path, [], tmp_path / "res", echo=False, timeout_s=300,
                       num_supernodes=6, superlink=superlink)


def _client_rows(path: Path) -> list[dict[str, str]]:
    with open(path) as fh:
        return sorted(csv.DictReader(fh), key=lambda r: (int(r["round"]), int(r["partition-id"])))


@pytest.mark.slow
def test_the_engine_tuned_and_stock_keep_every_clients_metrics(tmp_path, superlink):
    """flower_pfl/tuned/ in a real run (half the clients a round, FedAMP: personal state and
    a cloud model per client): with ``engine: tuned`` the ServerApp installed the engine's
    wake-up and the actor queue, with ``engine: stock`` nothing (Flower as released), and
    every client's row of both equals that of the same configuration run in one process,
    where no engine runs."""
    tree = dict(TINY, strategy="fedamp", **{"fraction-fit": 0.5})
    path = _write(tmp_path, tree)
    for engine in ("tuned", "stock"):
        cfg = config.load(path, [f"engine={engine}"])
        out = run_simulation(cfg, path, [f"engine={engine}"], tmp_path / engine, echo=False,
                             timeout_s=600, superlink=superlink)
        assert out.status == "finished:completed"
        log = (tmp_path / engine / "flwr-run.log").read_text()
        tuned = [f"[flower-pfl] simulation engine: {engine_wakeup.WOKEN}",
                 f"[flower-pfl] simulation engine: {actor_queue.QUEUED}",
                 "[flower-pfl] simulation engine: tuned on flwr 1.42"]
        assert [line in log for line in tuned] == [engine == "tuned"] * 3
        assert ("[flower-pfl] simulation engine: stock (engine: stock)" in log) == \
            (engine == "stock")
    # no preflight file without the launcher (run_simulation called directly): built apart
    assert f"[flower-pfl] initial model: {initial_model.BUILT}" in log
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each Ray actor (client-resources.num-cpus 1): the same sums
    try:
        inprocess.run(config.load(path), tmp_path / "plain")
    finally:
        torch.set_num_threads(threads)
    tuned_rows, stock_rows, plain_rows = (_client_rows(tmp_path / d / "clients.csv")
                                          for d in ("tuned", "stock", "plain"))
    assert len(tuned_rows) == 3 * 4
    assert tuned_rows == plain_rows
    assert stock_rows == plain_rows
