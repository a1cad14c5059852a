"""``engine: tuned`` in a real deployment keeps every client's numbers (issue #55): the same
3-round deployment (`flower-pfl deploy`: a SuperLink and two SuperNodes on 127.0.0.1, the
CNN on a small FMNIST subsample) run once per engine gives the same per-client rows --
clients.csv and fit.csv, every metric of every client every round, exactly -- with the
timing, node and process columns left out.  Each run's logs say which engine ran where
(docs/engine.md), so a switch that is ignored fails the test, not only one that changes
numbers."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from flower_pfl.running.deploy import deploy
from flower_pfl.running.procs import is_alive
from tests.conftest import tiny_run_yaml

# Two real deployments (SuperLink + SuperNodes + ClientApps): tens of seconds.
pytestmark = pytest.mark.slow

#: columns that say when, where or in which process, not what was learned
NOT_RESULTS = {"device", "ray_node", "node_id", "node-id", "pid"}


def _rows(path: Path) -> list[dict[str, str]]:
    """A CSV's rows without :data:`NOT_RESULTS` and ``*_s`` (seconds) columns, by (round,
    partition-id)."""
    with open(path) as fh:
        rows = [{k: v for k, v in r.items() if k not in NOT_RESULTS and not k.endswith("_s")}
                for r in csv.DictReader(fh)]
    return sorted(rows, key=lambda r: (int(r["round"]), int(r["partition-id"])))


def _engine_lines(results: Path) -> dict[str, str]:
    """The engine line each process logged (docs/engine.md): the ServerApp's in
    flwr-run.log, the SuperNodes' (and the SuperExecs they start) in their own logs."""
    text = (results / "flwr-run.log").read_text(errors="replace")
    for log in sorted((results / "deployment").glob("client-*.log")):
        text += log.read_text(errors="replace")
    found = {}
    for process in ("ServerApp", "SuperNode", "SuperExec"):
        lines = [ln for ln in text.splitlines() if f"deployment engine ({process}):" in ln]
        found[process] = lines[0].split(f"deployment engine ({process}): ", 1)[1] if lines \
            else ""
    return found


def test_a_tuned_deployment_gives_the_per_client_rows_of_a_stock_one(tmp_path):
    rows = {}
    for engine in ("tuned", "stock"):
        path = tiny_run_yaml(tmp_path, f"{engine}.yaml", model="cnn", rounds=3, clients=2,
                             **{"fraction-fit": 1.0, "engine": engine, "run-name": engine},
                             data={"dataset": "fmnist", "partition": "dirichlet",
                                   "subsample": 600},
                             train={"steps": 4, "batch-size": 32})
        results = tmp_path / "out" / engine
        out = deploy(path, [], results, 2, None, timeout_s=600, echo=False)
        assert out.status == "finished:completed"
        assert not any(is_alive(p) for p in out.pids)
        lines = _engine_lines(results)
        if engine == "tuned":
            assert lines["ServerApp"].startswith("tuned on flwr 1.42") and \
                "grid_poll, pull_backoff, array_packing in Flower's place" \
                in lines["ServerApp"]
            assert "node_waits, superexec_start, pull_backoff" in lines["SuperNode"]
            assert "warm_clientapp, pull_backoff" in lines["SuperExec"]
        else:  # Flower's binaries: only our ServerApp speaks, and says stock
            assert lines == {"ServerApp": "stock (engine: stock): Flower as released",
                             "SuperNode": "", "SuperExec": ""}
        rows[engine] = {name: _rows(results / name) for name in ("clients.csv", "fit.csv")}
    tuned, stock = rows["tuned"], rows["stock"]
    assert [(int(r["round"]), int(r["partition-id"])) for r in tuned["clients.csv"]] == \
        [(r, p) for r in (1, 2, 3) for p in (0, 1)]
    assert len(tuned["fit.csv"]) == 3 * 2
    for name in ("clients.csv", "fit.csv"):  # every column, every row, exactly
        assert tuned[name] == stock[name], name
