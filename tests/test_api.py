"""``flower_pfl.run`` (flower_pfl/api.py, docs/python-api.md): the documented example runs as
written; the result's tables are the CSV files' rows; overrides (keywords, dotted, nested)
reach the configuration; a refused configuration raises before any folder exists; a failed
run raises with its record; ``import flower_pfl`` stays light.  Real in-process runs on a
small real Fashion-MNIST subset; the Ray simulation backend in the slow tier.  ``backend=``
is ``run``'s own parameter; ``engine=`` is the configuration's ``engine`` key, an override.

The docs page's ``python`` blocks run top to bottom in one namespace, in a scratch working
directory, except a block that says ``backend="simulation"`` (a Ray run of the shipped
configuration: minutes; the slow test below runs that backend on a tiny configuration).
"""

from __future__ import annotations

import csv
import inspect
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

import flower_pfl
from flower_pfl import api
from flower_pfl.reporting.run_files import read_summary
from flower_pfl.strategies.base import RoundError

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "python-api.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)

#: 4 clients, 2 rounds, MCLR on 2000 FMNIST samples: a run in about a second
TINY = {"strategy": "fedavg", "clients": 4, "rounds": 2, "fraction-fit": 1.0, "model": "mclr",
        "seed": 0, "data": {"dataset": "fmnist", "partition": "dirichlet", "subsample": 2000},
        "train": {"epochs": 1, "batch-size": 32, "lr": 0.05}}


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _blocks() -> list[str]:
    return BLOCK.findall(DOC.read_text())


# ------------------------------------------------------------------ the docs example
def test_the_docs_example_runs_as_written(tmp_path, monkeypatch, capsys):
    blocks = [b for b in _blocks() if 'backend="simulation"' not in b]
    assert len(blocks) >= 5 and len(_blocks()) == len(blocks) + 1
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
    out = capsys.readouterr().out
    result = namespace["result"]
    assert result.status == "completed" and result.backend == "inprocess"
    assert result.dir.parent == tmp_path / "outputs" / "api"
    assert "unknown key 'data.alpah' (did you mean 'data.alpha'?)" in out
    assert "failed RoundError" in out
    assert set(namespace["finals"]) == {"fedavg", "fedamp", "local"}
    assert (tmp_path / "outputs" / "api" / "compare.png").stat().st_size > 0
    # 1 + 3 compared + 1 failed run, each in its own folder (no run-name: never shared)
    assert len(list((tmp_path / "outputs" / "api").glob("*-fmnist-dirichlet-*"))) == 5
    assert namespace["cfg"]["data.alpha"] == 0.1 and namespace["cfg"]["data.subsample"] == 2000


# ------------------------------------------------------------------ tables vs files
def test_the_tables_are_the_csv_files_rows_typed(tmp_path):
    result = flower_pfl.run(TINY, backend="inprocess", output_dir=str(tmp_path), quiet=True,
                            run_name="t")
    assert result.dir == tmp_path / "t" and result.status == "completed"
    for name in ("rounds", "clients", "fit", "server"):
        raw = _csv(tmp_path / "t" / f"{name}.csv")
        rows = result.rows(name)
        assert len(rows) == len(raw) > 0
        for got, want in zip(rows, raw):
            assert list(got) == list(want)  # the file's columns, in its order
            for key, text in want.items():
                value = got[key]
                if text == "":
                    assert value is None
                elif isinstance(value, float):
                    assert math.isnan(value) if text == "nan" else value == float(text)
                else:
                    assert str(value) == text and type(value) in (int, str)
        frame = result.table(name)
        assert list(frame.columns) == list(raw[0]) and len(frame) == len(raw)
    assert result.rows("failures") == [] and len(result.failures) == 0
    clients = result.clients
    assert sorted(clients["partition-id"].unique()) == [0, 1, 2, 3]
    assert clients["partition-id"].dtype.kind == "i" and clients["accuracy"].dtype.kind == "f"
    # rounds.csv's mean is the mean of clients.csv's accuracies of that round
    for _, row in result.rounds.iterrows():
        accs = clients[clients["round"] == row["round"]]["accuracy"]
        assert row["personal_mean"] == pytest.approx(accs.mean(), abs=1e-12)
    summary = json.loads((tmp_path / "t" / "summary.json").read_text())
    assert result.summary == summary and result.coverage == summary["coverage"]
    assert result.coverage["complete"] is True and result.error is None
    assert [r["round"] for r in summary["rounds"]] == list(result.rounds["round"]) == [1, 2]
    assert result.config["clients"] == 4 and result.config["strategy"] == "fedavg"
    assert result.config == json.loads((tmp_path / "t" / "config.json").read_text())["values"]


def test_without_pandas_a_table_is_the_list_of_rows(tmp_path, monkeypatch):
    result = flower_pfl.run(TINY, backend="inprocess", output_dir=str(tmp_path), quiet=True)
    monkeypatch.setattr(api, "_pandas", lambda: None)
    assert result.rounds == result.rows("rounds") and isinstance(result.rounds, list)
    assert result.clients[0]["partition-id"] == 0 and result.clients[0]["round"] == 1
    assert result.table("failures") == []


def test_a_cell_reads_as_its_value():
    assert [api.typed(c) for c in ("3", "-2", "0.5", "1e-05", "", None, "cpu", "True")] == \
        [3, -2, 0.5, 1e-05, None, None, "cpu", "True"]
    assert math.isnan(api.typed("nan"))


# ------------------------------------------------------------------ overrides
def test_overrides_by_keyword_dotted_key_and_nested_dict_reach_the_configuration(tmp_path):
    yaml_path = tmp_path / "exp.yaml"
    yaml_path.write_text("strategy: fedavg\nclients: 6\ndata:\n  alpha: 0.5\n  subsample: 3000\n"
                         "hyper:\n  fedamp:\n    sigma: 200\n")
    cfg = api.load_config(yaml_path, strategy="fedamp", run_name="r",
                          data={"alpha": 0.1}, hyper={"fedamp": {"alpha-k": 7.0}},
                          **{"train.lr": 0.02, "client-resources.num-cpus": 1})
    assert cfg["strategy"] == "fedamp" and cfg["run-name"] == "r" and cfg["train.lr"] == 0.02
    assert cfg["data.alpha"] == 0.1 and cfg["data.subsample"] == 3000  # merged, not replaced
    assert cfg["clients"] == 6 and cfg.hyper["sigma"] == 200 and cfg.hyper["alpha-k"] == 7.0
    # a dict config: the same keys; a keyword with underscores is the hyphenated key
    cfg = api.load_config(TINY, fraction_fit=0.5, **{"data.alpha": 0.3})
    assert cfg["fraction-fit"] == 0.5 and cfg["data.alpha"] == 0.3 and cfg["clients"] == 4
    assert TINY["data"] == {"dataset": "fmnist", "partition": "dirichlet", "subsample": 2000}
    # a run gets them: its config.json
    result = flower_pfl.run(TINY, backend="inprocess", output_dir=str(tmp_path / "o"),
                            quiet=True, rounds=1, data={"alpha": 0.2}, **{"train.epochs": 2})
    values = json.loads((result.dir / "config.json").read_text())["values"]
    assert values["rounds"] == 1 and values["data.alpha"] == 0.2 and values["train.epochs"] == 2
    assert list(result.rounds["round"]) == [1]


def test_the_default_configuration_is_the_apps_simulation_yaml():
    from flower_pfl import config as config_mod

    assert api.load_config().values == config_mod.load(config_mod.APP_DIR /
                                                       "simulation.yaml").values
    assert api.load_config("simulation.yaml", rounds=3)["rounds"] == 3  # the app folder's


# ------------------------------------------------------------------ refused before start
@pytest.mark.parametrize("bad, error, match", [
    ({"data.alpah": 0.1}, api.ConfigError, r"unknown key 'data\.alpah' \(did you mean"),
    ({"strategy": "fedamq"}, api.ConfigError, r"fedamq"),
    ({"backend": "ray"}, api.ConfigError, r"backend 'ray': one of simulation, inprocess"),
    # engine= is the configuration's key (tuned | stock), not the backend
    ({"engine": "inprocess"}, api.ConfigError, r"'engine' = 'inprocess' is out of range: "
                                               r"allowed is one of \['tuned', 'stock'\]"),
    ({"timeout": 5.0}, api.ConfigError, r"timeout: only the simulation backend"),
    ({"data.subsample": 5}, api.PreflightError, r"'data\.subsample' = 5 cannot give 4 clients"),
])
def test_a_refused_run_raises_before_any_folder_exists(tmp_path, bad, error, match):
    out = tmp_path / "out"
    kwargs = {"backend": "inprocess", **bad}
    with pytest.raises(error, match=match):
        flower_pfl.run(TINY, output_dir=str(out), **kwargs)
    assert not out.exists()
    assert flower_pfl.ConfigError is api.ConfigError and issubclass(api.ConfigError, ValueError)


def test_a_run_name_holding_a_run_is_refused_and_without_one_each_run_gets_its_folder(
        tmp_path):
    first = flower_pfl.run(TINY, backend="inprocess", output_dir=str(tmp_path), run_name="x",
                           quiet=True, rounds=1)
    rows = _csv(first.dir / "rounds.csv")
    with pytest.raises(api.PreflightError, match="holds a run already"):
        flower_pfl.run(TINY, backend="inprocess", output_dir=str(tmp_path), run_name="x",
                       rounds=1)
    assert _csv(first.dir / "rounds.csv") == rows  # nothing appended
    cfg = api.load_config(TINY, output_dir=str(tmp_path / "d"))
    base = api._results_dir(cfg)
    base.mkdir(parents=True)
    assert api._results_dir(cfg) == base.with_name(base.name + "-2")


# ------------------------------------------------------------------ engine= vs backend=
def test_engine_is_the_configuration_key_and_backend_the_way_it_runs(tmp_path):
    """``run(cfg, engine="stock")`` reaches the configuration as the YAML key ``engine``
    (an override like ``rounds=``), on the in-process backend; its config.json says so and
    the default is ``tuned``."""
    result = flower_pfl.run(TINY, backend="inprocess", engine="stock", output_dir=str(tmp_path),
                            run_name="stock", quiet=True, rounds=1)
    assert result.backend == "inprocess" and result.status == "completed"
    assert result.config["engine"] == "stock"
    assert api.RunResult(result.dir, "inprocess").config["engine"] == "stock"  # config.json
    assert "backend=inprocess" in repr(result)
    assert api.load_config(TINY)["engine"] == "tuned"
    params = inspect.signature(api.run).parameters  # no engine parameter to shadow the key
    assert "engine" not in params and params["backend"].default == "simulation"


# ------------------------------------------------------------------ a failed run
def test_a_failed_run_raises_with_its_record(tmp_path):
    with pytest.raises(api.RunFailed) as info:
        flower_pfl.run(TINY, backend="inprocess", output_dir=str(tmp_path), run_name="nan",
                       quiet=True, model="dnn", **{"train.lr": 1e6})
    assert isinstance(info.value.__cause__, RoundError)
    result = info.value.result
    assert result.dir == tmp_path / "nan" and result.status == "failed"
    assert read_summary(tmp_path / "nan")["status"] == "failed"
    assert result.error["type"] == "RoundError"
    assert result.error["message"].startswith("round 1: 0 valid update(s) from 4 sampled")
    assert str(info.value).startswith("the run failed: RoundError: round 1: 0 valid update(s)")
    assert len(result.rounds) == 0 and len(result.fit) == 0


# ------------------------------------------------------------------ a light import
def test_importing_the_package_imports_neither_torch_nor_flower():
    code = ("import sys, flower_pfl\n"
            "heavy = ('torch', 'flwr', 'ray', 'pandas', 'matplotlib', 'numpy')\n"
            "print([m for m in heavy if m in sys.modules])\n"
            "flower_pfl.run, flower_pfl.RunResult\n"
            "print([m for m in heavy[:-1] if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.split("\n")
    assert out[0] == "[]"  # the package alone: nothing heavy at all
    assert out[1] == "[]"  # flower_pfl.run found: still no torch, Flower, Ray, pandas
    with pytest.raises(AttributeError, match="no attribute 'rn'"):
        flower_pfl.rn  # noqa: B018


# ------------------------------------------------------------------ the Ray backend
@pytest.mark.slow
def test_the_simulation_backend_runs_flwr_run_in_ray_and_returns_its_tables(tmp_path):
    result = flower_pfl.run(TINY, output_dir=str(tmp_path), run_name="ray", quiet=True,
                            timeout=600)
    assert result.backend == "simulation" and result.status == "completed"
    assert (result.dir / "flwr-run.log").is_file()  # written by `flwr run`, not in process
    assert not (result.dir / ".initial-arrays.npz").exists()  # the preflight's, removed
    assert list(result.rounds["round"]) == [1, 2]
    assert sorted(result.clients["partition-id"].unique()) == [0, 1, 2, 3]
    assert len(result.fit) == 8 and result.coverage["complete"] is True
    assert result.rows("rounds")[-1]["personal_mean"] == pytest.approx(
        result.summary["final"]["personal_mean"])
