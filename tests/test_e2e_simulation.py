"""One real `flwr run` in Ray simulation, through the launcher: status checked, PIDs stopped."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from flower_pfl import config, registry
from flower_pfl.launch import LaunchError, _alive, run_simulation

TINY = {"strategy": "local", "rounds": 3, "clients": 4, "fraction-fit": 1.0, "model": "mclr",
        "eval-every": 1, "data": {"dataset": "fmnist", "partition": "dirichlet", "subsample": 3000}}


def _write(tmp_path: Path, tree) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


# Every registered strategy runs once through the real `flwr run` (a new catalog entry is
# covered without editing this file). `local` is the TINY default and runs in the failure test.
@pytest.mark.parametrize("strategy", sorted(set(registry.REGISTRY) - {"local"}))
def test_flwr_run_simulation_end_to_end(strategy, tmp_path):
    path = _write(tmp_path, TINY)
    cfg = config.load(path, [f"strategy={strategy}"])
    out = run_simulation(cfg, path, [f"strategy={strategy}"], tmp_path / "res", echo=False,
                         timeout_s=600)
    assert out.status == "finished:completed"
    assert out.pids and not any(_alive(p) for p in out.pids), "processes left running"
    summary = json.loads((tmp_path / "res" / "summary.json").read_text())
    assert summary["status"] == "completed" and len(summary["rounds"]) == 3
    assert json.loads((tmp_path / "res" / "config.json").read_text())["values"]["strategy"] \
        == strategy  # the override reached the ServerApp
    from strategies.message_passing import MessagePassingStrategy

    strategy_cls = registry.get(strategy).strategy_cls()
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


def test_failed_run_is_reported_not_hidden(tmp_path):
    # 6 SuperNodes for a 4-client configuration: the ServerApp refuses, the run fails,
    # and the launcher must say so (flwr run itself exits 0) and still clean up.
    path = _write(tmp_path, TINY)
    cfg = config.load(path)
    with pytest.raises(LaunchError, match="finished:failed"):
        run_simulation(cfg, path, [], tmp_path / "res", echo=False, timeout_s=300,
                       num_supernodes=6)
