"""`flower-pfl bench`: a tiny matrix end to end through the real `flwr run` path.

2 strategies x 1 setting x 2 seeds (MCLR, 4 clients, 2 rounds, 3000 FMNIST images). Checks:
every cell ran through Flower's simulation, the table's numbers are the per-run summary
files' numbers, the plots exist, and a rerun skips every finished cell.  A matrix with a
strategy that is not registered, or a bad value, is refused whole before any cell runs
(exit 2), naming the closest registered name. The matrix file itself (shipped matrices,
aliases, pairs, designs, cell records): tests/test_matrix.py.
"""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
from pathlib import Path

import pytest
import yaml

from flower_pfl import matrix
from flower_pfl.config import merge
from flower_pfl.reporting import coverage, run_files, tables
from flower_pfl.running import bench, rayhead

STRATEGIES = ["fedavg", "fedacs"]
SEEDS = [0, 1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    spec = {
        "name": "tiny",
        "set": {"rounds": 2, "clients": 4, "fraction-fit": 1.0, "model": "mclr",
                "data": {"dataset": "fmnist", "partition": "practical", "groups": 2,
                         "subsample": 3000}},
        "strategies": STRATEGIES,
        "settings": {"prac": {"paper": {"fedavg": 50.0, "fedacs": 90.0}}},
        "seeds": SEEDS,
        "compare": "bmta",
    }
    path = root / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = root / "out"
    lines: list[str] = []
    m = matrix.load_matrix(path)
    records = bench.run_bench(m, out, timeout_s=600, log=lambda s, **_: lines.append(s))
    return m, out, records, lines


def _table(out: Path) -> dict[str, dict[str, str]]:
    with open(out / "table.csv") as fh:
        return {r["strategy"]: r for r in csv.DictReader(fh)}


@pytest.mark.slow  # the `tiny` fixture runs 4 cells through `flwr run`
def test_every_cell_ran_through_flwr_and_table_matches_summaries(tiny):
    m, out, records, lines = tiny
    table = _table(out)
    for strategy in STRATEGIES:
        row = table[strategy]
        assert row["status"] == "done" and row["seeds_done"] == "2"
        finals, bmtas, worst = [], [], []
        for seed in SEEDS:
            cell = out / "runs" / "prac" / strategy / f"seed-{seed}"
            assert "Successfully started run" in (cell / "flwr-run.log").read_text()
            summary = run_files.read_summary(cell)
            assert summary["status"] == "completed" and len(summary["rounds"]) == 2
            assert run_files.read_values(cell)["seed"] == seed
            finals.append(100 * summary["final"]["personal_mean"])
            bmtas.append(100 * summary["bmta"])
            worst.append(100 * summary["final"]["personal_worst10_mean"])
            assert (cell / "curves.png").stat().st_size > 0  # every run draws its curves
        for col, vals in (("final_mean", finals), ("bmta", bmtas), ("final_worst10", worst)):
            mean = sum(vals) / 2
            std = math.sqrt(sum((v - mean) ** 2 for v in vals))  # sample std of 2 values
            assert float(row[col]) == pytest.approx(mean, abs=1e-9)
            assert float(row[col + "_std"]) == pytest.approx(std, abs=1e-9)
    # the paper column and the gap (ours BMTA - paper)
    assert float(table["fedavg"]["gap"]) == pytest.approx(
        float(table["fedavg"]["bmta"]) - 50.0, abs=1e-9)
    assert table["fedavg"]["global_final"] != ""  # fedavg has a global model
    assert table["fedacs"]["global_final"] == ""  # fedacs has none: no number
    # progress: cell k of N with an estimate of what is left
    done = [s for s in lines if re.search(r"cell [1-4]/4 prac/\S+/seed-\d: completed in .* "
                                          r"\| elapsed .* \| est\. left", s)]
    assert len(done) == len(STRATEGIES) * len(SEEDS)


def _bench(tmp_path, spec, *args):
    """`flower-pfl bench` on a matrix written from ``spec``: (exit status, stderr)."""
    import contextlib
    import io

    from flower_pfl.cli import main

    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(spec))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["bench", str(path), "--out", str(tmp_path / "out"), *args])
    return rc, err.getvalue()


def test_a_typo_in_a_strategy_stops_the_bench_before_anything_runs(tmp_path):
    rc, err = _bench(tmp_path, {"strategies": ["fedavg", "fedampp"], "seeds": [0]})
    assert rc == 2 and not (tmp_path / "out").exists()  # nothing run, nothing written
    assert "'fedampp' is not a registered strategy (did you mean 'fedamp'?)" in err
    # an alias names its registered strategy: that name is checked
    rc, err = _bench(tmp_path, {"strategies": [{"sw": {"strategy": "heurfedam"}}]})
    assert rc == 2 and "'sw' (strategy: 'heurfedam') is not a registered strategy (did you " \
        "mean 'heurfedamp'?)" in err


def test_every_cell_goes_through_the_run_validator_first(tmp_path):
    rc, err = _bench(tmp_path, {
        "set": {"rounds": -2},
        "strategies": ["fedavg", {"fedacs": {"hyper": {"fedacs": {"pick-ration": 0.8}}}}],
        "settings": {"a": {}, "b": {"set": {"clients": 1}, "paper": {"fedav": 70.0}}}})
    assert rc == 2 and not (tmp_path / "out").exists()
    assert "'rounds' = -2 is out of range: allowed is an integer >= 1 [every cell]" in err
    assert "'hyper.fedacs.pick-ration' is not a hyper-parameter of 'fedacs'" in err
    assert "[a/fedacs, b/fedacs]" in err  # the cells it concerns
    assert "'clients' = 1 is out of range" in err and "[b/fedavg, b/fedacs]" in err
    assert "settings.b.paper: 'fedav' is not a strategy of this matrix (did you mean " \
        "'fedavg'?)" in err
    # the command line's --set goes through the same validator
    rc, err = _bench(tmp_path, {"strategies": ["fedavg"]}, "--set", "train.lr=fast")
    assert rc == 2 and "'train.lr' = 'fast' has the wrong type" in err


@pytest.mark.slow  # the `tiny` fixture runs 4 cells through `flwr run`
def test_plots_exist(tiny):
    m, out, records, lines = tiny
    for name in ("curves-prac.png", "clients-prac.png", "heatmap-prac-fedacs-attention.png",
                 "heatmap-prac-fedacs-selection.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000, name


@pytest.mark.slow  # the `tiny` fixture runs 4 cells through `flwr run`
def test_plots_survive_a_cell_without_its_config_json(tiny, tmp_path):
    """A finished cell committed without config.json (seen: the bench crashed in write_plots
    after all its cells had run) still gets its table row and heatmap."""
    m, out, records, lines = tiny
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    for seed in SEEDS:
        (copy / "runs" / "prac" / "fedacs" / f"seed-{seed}" / "config.json").unlink()
    (copy / "heatmap-prac-fedacs-attention.png").unlink()
    cells = m.cells(copy)
    recs = tables.collect(m, cells)
    tables.write_table(m, recs, copy)
    tables.write_plots(m, cells, recs, copy)
    assert (copy / "heatmap-prac-fedacs-attention.png").read_bytes()[:4] == b"\x89PNG"
    assert _table(copy)["fedacs"]["seeds_done"] == "2"


@pytest.mark.slow  # the `tiny` fixture runs 4 cells through `flwr run`
def test_rerun_skips_finished_cells(tiny):
    m, out, records, lines = tiny
    summaries = sorted((out / "runs").rglob("summary.json"))
    assert len(summaries) == len(STRATEGIES) * len(SEEDS)
    stamps = [p.stat().st_mtime_ns for p in summaries]
    again: list[str] = []
    bench.run_bench(matrix.load_matrix(m.path), out, log=lambda s, **_: again.append(s))
    assert sum("done, skipped" in s for s in again) == len(STRATEGIES) * len(SEEDS)
    assert [p.stat().st_mtime_ns for p in summaries] == stamps  # nothing was rerun
    assert "0 to run" in again[0]


@pytest.mark.slow  # the `tiny` fixture runs 4 cells through `flwr run`
def test_cell_state_detects_unfinished_and_changed_cells(tiny, tmp_path):
    m, out, records, lines = tiny
    cell = next(c for c in m.cells(out) if c.strategy == "fedavg" and c.seed == 0)
    assert bench.cell_state(cell) == "done"
    copy = matrix.Cell(cell.setting, cell.strategy, cell.seed, cell.tree, tmp_path / cell.dir.name)
    shutil.copytree(cell.dir, copy.dir)
    (copy.dir / "cell.yaml").write_text((copy.dir / "cell.yaml").read_text()
                                        .replace(str(cell.dir.parent), str(copy.dir.parent)))
    assert bench.cell_state(copy) == "done"
    # a run that "completed" while clients failed (e.g. Ray killed workers for memory) is not
    # the matrix's setting: no number, and it reruns
    clients_csv = copy.dir / "clients.csv"
    good = clients_csv.read_text()
    with open(clients_csv) as fh:
        rows = list(csv.DictReader(fh))
    with open(clients_csv, "w", newline="") as fh:  # one client missing from round 1
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(r for r in rows if not (r["round"] == "1" and r["partition-id"] == "0"))
    assert coverage.client_failures(copy.dir) is not None
    assert bench.cell_state(copy) == "todo" and tables.cell_numbers(copy.dir) is None
    clients_csv.write_text(good)
    assert bench.cell_state(copy) == "done"
    summary = json.loads((copy.dir / "summary.json").read_text())
    summary["status"] = "running"  # an interrupted run
    (copy.dir / "summary.json").write_text(json.dumps(summary))
    assert bench.cell_state(copy) == "todo"
    changed = matrix.Cell(cell.setting, cell.strategy, cell.seed,
                         merge(cell.tree, {"rounds": 3}), cell.dir)
    assert bench.cell_state(changed) == "todo"  # a changed configuration reruns


@pytest.mark.slow  # the `tiny` fixture runs 4 cells through `flwr run`
def test_a_changed_registry_default_reruns_the_cell(tiny, tmp_path):
    """cell.yaml leaves the strategy's hyper-parameters to the registry: a run made under
    another default (its config.json) is not today's cell.  A configuration key added
    since the run is not a change."""
    m, out, records, lines = tiny
    cell = next(c for c in m.cells(out) if c.strategy == "fedacs" and c.seed == 0)
    copy = matrix.Cell(cell.setting, cell.strategy, cell.seed, cell.tree, tmp_path / cell.dir.name)
    shutil.copytree(cell.dir, copy.dir)
    (copy.dir / "cell.yaml").write_text((copy.dir / "cell.yaml").read_text()
                                        .replace(str(cell.dir.parent), str(copy.dir.parent)))
    conf_path = copy.dir / "config.json"
    conf = json.loads(conf_path.read_text())
    assert bench.cell_state(copy) == "done"
    older = json.loads(json.dumps(conf))
    del older["values"]["stall-timeout"]  # a key this run's code did not have yet
    conf_path.write_text(json.dumps(older))
    assert bench.cell_state(copy) == "done"
    older["hyper"]["pick-ratio"] = conf["hyper"]["pick-ratio"] / 2  # another default then
    conf_path.write_text(json.dumps(older))
    assert bench.cell_state(copy) == "todo"
    (copy.dir / "config.json").unlink()  # copied by hand without it: cell.yaml decides
    assert bench.cell_state(copy) == "done"


def test_the_shared_ray_temp_dir_fits_the_socket_path_limit(tmp_path):
    """`--ray shared`: Ray refuses socket paths over 107 bytes, so a bench run from a long
    TMPDIR used to fail at `ray start --head`; the shared instance's temp dir must leave
    room for Ray's session/sockets suffix wherever the bench's work folder is."""
    import tempfile

    deep = tmp_path / ("long-tmpdir-" * 5)
    deep.mkdir()
    chosen = rayhead.ray_temp_dir(deep)
    assert chosen.is_dir() and len(str(chosen) + rayhead.RAY_SOCKET_SUFFIX) <= 107
    chosen.rmdir()
    short = Path(tempfile.mkdtemp(prefix="w", dir="/tmp"))
    try:
        assert rayhead.ray_temp_dir(short) == short / "ray"  # kept inside the work folder
    finally:
        short.rmdir()


@pytest.mark.slow  # the `tiny` fixture runs 4 cells through `flwr run`
def test_inprocess_cells_land_in_the_bench_layout_marked_as_such(tiny, tmp_path):
    """benchmarks/matrix_inprocess.py runs the bench's cells in one process each, --jobs at a
    time: the bench's table reads them (numbers = their summaries), marks their rows
    "(in-process)" and never calls them `flwr run` cells; a rerun skips them."""
    import subprocess
    import sys

    m, out, records, lines = tiny
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "matrix_inprocess.py"
    dest = tmp_path / "inproc"
    cmd = [sys.executable, str(script), str(m.path), "--out", str(dest), "--strategies",
           "fedavg", "--seeds", "0", "1", "--jobs", "2"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "2 cells to run, 2 at a time" in first.stdout
    for seed in SEEDS:
        cell = dest / "runs" / "prac" / "fedavg" / f"seed-{seed}"
        assert json.loads((cell / "bench-cell.json").read_text())["engine"] == "inprocess"
        assert not (cell / "flwr-run.log").exists()
        assert bench.cell_state(next(c for c in m.cells(dest) if c.dir == cell)) == "done"
    cells = m.cells(dest)
    recs = tables.collect(m, cells)
    tables.write_table(m, recs, dest)
    row = _table(dest)["fedavg"]
    assert row["engine"] == "inprocess" and row["seeds_done"] == "2"
    bmtas = [100 * run_files.read_summary(dest / "runs" / "prac" / "fedavg" / f"seed-{s}")["bmta"]
             for s in SEEDS]
    assert float(row["bmta"]) == pytest.approx(sum(bmtas) / 2, abs=1e-9)
    md = (dest / "table.md").read_text()
    assert "| fedavg † (in-process) |" in md and "flower_pfl.running.inprocess" in md
    assert _table(out)["fedavg"]["engine"] == "flwr"  # the flwr-run cells: not marked
    assert "(in-process)" not in (out / "table.md").read_text()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert "0 cells to run" in again.stdout


def test_inprocess_deadline_stops_the_lowest_priority_cell_first(tmp_path):
    """matrix_inprocess.py's deadline rule: nothing stops while every projected end is in
    time; a late projection stops the LAST-priority cell only, at most one per grace period;
    past the deadline everything stops. Projections come from a cell's last rounds."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "matrix_inprocess.py"
    spec = importlib.util.spec_from_file_location("matrix_inprocess", path)
    mi = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mi)
    cells = ["a", "b", "c"]  # priority order
    in_time = {"a": 90.0, "b": 95.0, "c": None}
    assert mi.to_stop(cells, in_time, now=50, deadline=100, last_stop=0, grace=10) == []
    late = {"a": 120.0, "b": 95.0, "c": 80.0}  # the TOP cell is late: the last one goes
    assert mi.to_stop(cells, late, now=50, deadline=100, last_stop=0, grace=10) == ["c"]
    assert mi.to_stop(cells, late, now=50, deadline=100, last_stop=45, grace=10) == []
    assert mi.to_stop(cells, in_time, now=100, deadline=100, last_stop=99, grace=10) == cells
    # projection: 10 s per round over the last rounds, 60 - 3 rounds to go
    cell_dir = tmp_path / "cell"
    cell_dir.mkdir()
    (cell_dir / "summary.json").write_text(json.dumps({"rounds": [
        {"round": 1, "elapsed_s": 30.0}, {"round": 2, "elapsed_s": 40.0},
        {"round": 3, "elapsed_s": 50.0}]}))
    cell = matrix.Cell("s", "fedavg", 0, {"rounds": 60}, cell_dir)
    assert mi.projected_end(cell, now=1000.0) == pytest.approx(1000.0 + 57 * 10.0)
    (cell_dir / "summary.json").write_text(json.dumps({"rounds": [{"round": 1,
                                                                   "elapsed_s": 30.0}]}))
    assert mi.projected_end(cell, now=1000.0) is None  # one round: too early to tell
