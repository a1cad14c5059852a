"""`flower-pfl bench`: a tiny matrix end to end through the real `flwr run` path.

2 strategies x 1 setting x 2 seeds (MCLR, 4 clients, 2 rounds, 3000 FMNIST images). Checks:
every cell ran through Flower's simulation, the table's numbers are the per-run summary
files' numbers, the plots exist, and a rerun skips every finished cell.  A matrix with a
strategy that is not registered, or a bad value, is refused whole before any cell runs
(exit 2), naming the closest registered name.
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

from flower_pfl import config, matrix
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


def test_matrix_errors_are_reported_together(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"strategies": [], "seeds": "0", "compare": "best",
                                    "typo": 1}))
    with pytest.raises(matrix.MatrixError) as err:
        matrix.load_matrix(path)
    msg = str(err.value)
    assert "typo" in msg and "no strategy" in msg and "seeds" in msg and "compare" in msg


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


@pytest.mark.parametrize("matrix_file", sorted(p.name for p in
                                          (Path(__file__).resolve().parent.parent /
                                           "benchmarks").glob("*.yaml")))
def test_shipped_matrices_give_valid_cells(matrix_file, tmp_path):
    """Every cell of every shipped matrix is a valid run configuration (e.g. a per-strategy
    override such as SCAFFOLD's lr, PLGU's drop-last) with every strategy registered."""
    from flower_pfl import config as config_mod

    m = matrix.load_matrix(Path(__file__).resolve().parent.parent / "benchmarks" / matrix_file)
    cells = list(m.cells(tmp_path))
    assert cells
    for cell in cells:
        assert cell.tree is not None, cell.key
        cfg = config_mod.validate(cell.tree, source=cell.key)
        assert cfg.strategy == m.strategies[cell.strategy].get("strategy", cell.strategy)


def test_an_alias_runs_its_registered_strategy_under_its_own_label(tmp_path):
    """`label: {strategy: NAME, ...}`: a second column of a registered strategy with its own
    overrides -- its own cells' folders and row, NAME's run configuration."""
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({
        "strategies": ["fedprox", {"fedprox-mu0": {"strategy": "fedprox",
                                                   "hyper": {"fedprox": {"mu": 0.5}}}}],
        "pairs": [["fedprox", "fedprox-mu0"]]}))
    m = matrix.load_matrix(path)
    plain, alias = m.cells(tmp_path / "out")
    assert alias.strategy == "fedprox-mu0" and alias.dir.parent.name == "fedprox-mu0"
    assert alias.tree["strategy"] == "fedprox" and "strategy" not in alias.tree["hyper"]
    assert alias.tree["hyper"] == {"fedprox": {"mu": 0.5}} and "hyper" not in plain.tree
    records = tables.collect(m, m.cells(tmp_path / "out"))
    assert [r["status"] for r in records] == ["not run", "not run"]  # registered, not run


def _finished_cell(cell_dir: Path, mean: float, worst10: float, global_: float | None = None,
                   dataset: str = "fmnist") -> None:
    """A finished cell's files as a run writes them (the fields the table reads)."""
    cell_dir.mkdir(parents=True)
    final = {"personal_mean": mean, "personal_weighted_mean": mean,
             "personal_worst10_mean": worst10, "personal_top10_mean": mean, "elapsed_s": 4.0}
    if global_ is not None:
        final["global_mean"] = global_
    rounds = [{"round": 1, "elapsed_s": 2.0}, {"round": 2, "elapsed_s": 4.0}]
    (cell_dir / "summary.json").write_text(json.dumps(
        {"status": "completed", "rounds": rounds, "final": final, "bmta": mean}))
    (cell_dir / "config.json").write_text(json.dumps(
        {"values": {"clients": 4, "data.dataset": dataset}, "hyper": {}}))


def test_paired_comparisons_from_finished_cells(tmp_path):
    """`pairs:` -> A - B per seed over the seeds both finished, the 95% Student-t interval
    and the verdict, personalized with personalized and global with global; for an error
    metric (the synthetic task) lower is better."""
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({
        "name": "pairs", "strategies": ["fedavg", "fedprox", "local"], "seeds": [0, 1, 2],
        "settings": {"acc": {}, "syn": {"set": {"data": {"dataset": "synthetic-gaussian"},
                                                "model": "scalar"}}},
        "pairs": [["fedavg", "fedprox"], ["fedavg", "local"]]}))
    m = matrix.load_matrix(path)
    assert m.pairs == [("fedavg", "fedprox"), ("fedavg", "local")]
    out = tmp_path / "out"
    runs = out / "runs"
    for s, (mean, worst, glob) in enumerate([(0.80, 0.50, 0.70), (0.82, 0.52, 0.71),
                                             (0.81, 0.51, 0.72)]):
        _finished_cell(runs / "acc" / "fedavg" / f"seed-{s}", mean, worst, glob)
    for s, (mean, worst, glob) in enumerate([(0.78, 0.40, 0.75), (0.79, 0.41, 0.76),
                                             (0.80, 0.42, 0.78)]):
        _finished_cell(runs / "acc" / "fedprox" / f"seed-{s}", mean, worst, glob)
    _finished_cell(runs / "acc" / "local" / "seed-1", 0.70, 0.30)  # one seed, no global model
    for s, (a, b) in enumerate([(1.0, 2.0), (1.1, 2.1), (1.2, 2.3)]):  # squared errors
        _finished_cell(runs / "syn" / "fedavg" / f"seed-{s}", a, a, dataset="synthetic-gaussian")
        _finished_cell(runs / "syn" / "fedprox" / f"seed-{s}", b, b, dataset="synthetic-gaussian")
    records = tables.collect(m, m.cells(out))
    tables.write_table(m, records, out)
    with open(out / "pairs.csv") as fh:
        rows = {(r["setting"], r["a"], r["b"], r["column"], r["model"]): r
                for r in csv.DictReader(fh)}
    half3 = 4.302653 / math.sqrt(3)  # t_{0.975, 2} * s_d / sqrt(3) with s_d = 1
    mean_row = rows[("acc", "fedavg", "fedprox", "final mean", "personalized")]
    assert [float(d) for d in mean_row["diffs"].split()] == pytest.approx([2.0, 3.0, 1.0])
    assert float(mean_row["mean"]) == pytest.approx(2.0)
    assert float(mean_row["half"]) == pytest.approx(half3, abs=1e-5)
    assert mean_row["seeds"] == "0 1 2"
    assert mean_row["verdict"] == "not resolved at 3 seeds (±2.48)"  # half3 = 2.4841
    worst_row = rows[("acc", "fedavg", "fedprox", "worst-10%", "personalized")]
    assert float(worst_row["mean"]) == pytest.approx(10.0)
    assert float(worst_row["low"]) == pytest.approx(10.0 - half3, abs=1e-5)
    assert worst_row["verdict"] == "holds"
    glob_row = rows[("acc", "fedavg", "fedprox", "final mean", "global")]  # global vs global
    assert [float(d) for d in glob_row["diffs"].split()] == pytest.approx([-5.0, -5.0, -6.0])
    assert glob_row["verdict"] == "does not hold"
    one = rows[("acc", "fedavg", "local", "final mean", "personalized")]
    assert one["n"] == "1" and one["seeds"] == "1" and one["half"] == ""
    assert float(one["mean"]) == pytest.approx(12.0) and one["verdict"] == "n/a (1 seed)"
    assert ("acc", "fedavg", "local", "final mean", "global") not in rows  # local: no global
    syn = rows[("syn", "fedavg", "fedprox", "final mean", "personalized")]
    assert float(syn["mean"]) == pytest.approx(-1.0 - 0.1 / 3)  # errors, not scaled to %
    assert syn["verdict"] == "holds"  # A's error is lower: A better
    none = rows[("syn", "fedavg", "local", "final mean", "personalized")]
    assert none["n"] == "0" and none["verdict"].startswith("n/a (no seed")
    md = (out / "table.md").read_text()
    section = md[md.index("## Paired comparisons"):]
    assert "| fedavg − fedprox | worst-10% (personalized) | 0,1,2 | +10.00, +11.00, +9.00 " \
           f"| +10.00 | [{10 - half3:+.2f}, {10 + half3:+.2f}] | holds |" in section
    assert "| fedavg − fedprox | final mean (personalized) | 0,1,2 | +2.00, +3.00, +1.00 " \
           "| +2.00 | [-0.48, +4.48] | not resolved at 3 seeds (±2.48) |" in section
    assert "**not resolved at n seeds (±h)** = it contains 0, h being its half-width" in section
    assert "| fedavg − local | final mean (personalized) | 1 | +12.00 | +12.00 | – (1 seed) " \
           "| n/a (1 seed) |" in section
    assert "error: lower is better" in section
    # mean ± sample std over seeds in every finished group's row (s/round included)
    row = next(ln for ln in md.splitlines() if ln.startswith("| fedprox |"))
    assert "79.00 ± 1.00" in row and "2.0 ± 0.0" in row
    assert "| 70.00 |" in next(ln for ln in md.splitlines() if ln.startswith("| local |"))


def test_pairs_must_name_strategies_of_the_matrix(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"strategies": ["fedavg", "fedprox"],
                                    "pairs": [["fedavg", "fedsam"], ["fedavg"],
                                              ["fedprox", "fedprox"]]}))
    with pytest.raises(matrix.MatrixError) as err:
        matrix.load_matrix(path)
    msg = str(err.value)
    assert "['fedsam'], not a strategy of this matrix" in msg
    assert "['fedavg'] is not a pair [A, B]" in msg and "with itself" in msg


def test_the_documented_example_is_a_valid_matrix(tmp_path):
    """docs/bench.md's complete example loads as it is written (from benchmarks/, where its
    `base: ../simulation.yaml` points at the app's file)."""
    repo = Path(__file__).resolve().parent.parent
    example = (repo / "docs" / "bench.md").read_text().split("```yaml\n", 1)[1].split("```")[0]
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "m.yaml").write_text(example)
    shutil.copy(repo / "simulation.yaml", tmp_path / "simulation.yaml")
    m = matrix.load_matrix(tmp_path / "benchmarks" / "m.yaml")
    cells = m.cells(tmp_path / "out")
    assert len(cells) == 20 and m.pairs == [("fedamp", "fedavg"), ("fedamp-sw0.1", "fedamp")]
    alias = next(c for c in cells if c.strategy == "fedamp-sw0.1")
    assert alias.tree["strategy"] == "fedamp" and alias.tree["rounds"] == 30


def test_a_matrix_states_which_cells_its_design_runs(tmp_path):
    """A strategy's `seeds` (default the matrix's), a setting's `strategies` and `seeds`
    (default all): exactly those cells, the table's rows and pairs only for them, and a
    bench of the matrix has nothing left to run once they are done."""
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({
        "name": "design", "strategies": ["fedavg", {"fedprox": {"seeds": [0, 1, 2, 3]}},
                                         "local"],
        "seeds": [0, 1], "pairs": [["fedprox", "fedavg"], ["fedprox", "local"]],
        "settings": {"one": {}, "k5": {"strategies": ["fedprox", "fedavg"], "seeds": [1, 3],
                                       "set": {"train": {"epochs": 5}}}}}, sort_keys=False))
    m = matrix.load_matrix(path)
    out = tmp_path / "out"
    cells = m.cells(out)
    assert [c.key for c in cells] == [
        "one/fedavg/seed-0", "one/fedavg/seed-1", "one/fedprox/seed-0", "one/fedprox/seed-1",
        "one/fedprox/seed-2", "one/fedprox/seed-3", "one/local/seed-0", "one/local/seed-1",
        "k5/fedavg/seed-1", "k5/fedprox/seed-1", "k5/fedprox/seed-3"]
    prox = next(c for c in cells if c.key == "k5/fedprox/seed-3")
    assert "seeds" not in prox.tree and prox.tree["seed"] == 3  # not a run key
    assert prox.tree["train"]["epochs"] == 5
    for c in cells:
        _finished_cell(c.dir, 0.8 + 0.01 * c.seed, 0.5)
    records = tables.collect(m, cells)
    assert [(r["setting"], r["strategy"], r["seeds_total"]) for r in records] == [
        ("one", "fedavg", 2), ("one", "fedprox", 4), ("one", "local", 2),
        ("k5", "fedavg", 1), ("k5", "fedprox", 2)]  # no row for local in k5
    assert all(r["status"] == "done" for r in records)
    pairs = tables.pair_records(m, records)
    assert {(r["setting"], r["a"], r["b"]) for r in pairs} == {
        ("one", "fedprox", "fedavg"), ("one", "fedprox", "local"), ("k5", "fedprox", "fedavg")}
    k5 = next(r for r in pairs if r["setting"] == "k5" and r["column"] == "final mean")
    assert k5["seeds"] == "1"  # the seeds both ran there
    for c in cells:  # a finished cell made elsewhere (other folders, data files, device),
        where = {"device": "cpu", "data": {"root": str(tmp_path / "fmnist-files")}}
        made = matrix.Cell(c.setting, c.strategy, c.seed, merge(c.tree, where),
                           tmp_path / "elsewhere" / c.key)  # copied here with its cell.yaml
        (c.dir / "cell.yaml").write_text(bench.cell_yaml(made))
        (c.dir / "config.json").unlink()  # (without it, judged on its cell.yaml alone)
    states = {c.key: bench.cell_state(c) for c in cells}
    assert set(states.values()) == {"done"}
    assert bench.to_run(cells, states, {}) == []
    changed = matrix.Cell(prox.setting, prox.strategy, prox.seed, merge(prox.tree, {"rounds": 3}),
                          prox.dir)
    assert bench.cell_state(changed) == "todo"  # what ran differs: not done


def test_a_design_naming_what_does_not_exist_is_refused(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({
        "strategies": ["fedavg", {"fedprox": {"seeds": "0-4"}}],
        "settings": {"a": {"strategies": ["fedavgg"]}, "b": {"seeds": []}}}))
    with pytest.raises(matrix.MatrixError) as err:
        matrix.load_matrix(path)
    msg = str(err.value)
    assert "'fedprox': 'seeds' must be a non-empty list" in msg
    assert "settings.a.strategies: 'fedavgg' is not a strategy of this matrix (did you mean " \
           "'fedavg'?)" in msg
    assert "settings.b.seeds: must be a non-empty list" in msg
    path.write_text(yaml.safe_dump({
        "strategies": ["fedavg", {"fedprox": {"seeds": [3]}}, {"local": [1]}], "seeds": [0, 1],
        "settings": {"a": {"seeds": [0], "paper": {"fedavg": 80.0}},
                     "b": {"strategies": ["fedprox"], "paper": {"fedavg": 80.0}}},
        "pairs": [["fedavg", "fedprox"]]}))
    with pytest.raises(matrix.MatrixError) as err:
        matrix.load_matrix(path)
    msg = str(err.value)
    assert "settings.a.seeds [0] keeps none of 'fedprox''s seeds [3]" in msg
    assert "settings.b.paper: 'fedavg' does not run in this setting" in msg
    assert "settings.a.paper" not in msg  # fedavg runs in a
    assert "pairs: [fedavg, fedprox] never run together" in msg
    assert "{'local': [1]} is neither a name nor {name: overrides}" in msg
    # a bad selection does not hide the cells' own problems; repeated seeds are refused
    path.write_text(yaml.safe_dump({"strategies": [{"fedavg": {"seeds": [0, 0]}}],
                                    "seeds": [], "set": {"rounds": -1}}))
    with pytest.raises(matrix.MatrixError) as err:
        matrix.load_matrix(path)
    msg = str(err.value)
    assert "'fedavg': 'seeds' must be a non-empty list of distinct integers" in msg
    assert "'seeds' must be a non-empty list of distinct integers, got []" in msg
    assert "'rounds' = -1 is out of range" in msg


def test_a_cell_yaml_that_is_not_a_run_is_not_done(tmp_path):
    """A finished cell whose cell.yaml is not a mapping (or not valid YAML) is to be run
    again, not a crash of the whole bench."""
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"strategies": ["fedavg"]}))
    cell = matrix.load_matrix(path).cells(tmp_path / "out")[0]
    _finished_cell(cell.dir, 0.8, 0.5)
    (cell.dir / "config.json").unlink()  # judged on its cell.yaml alone
    for text in ("abc\n", "[1, 2]\n", "a: [\n", bench.cell_yaml(cell)):
        (cell.dir / "cell.yaml").write_text(text)
        assert bench.cell_state(cell) == ("done" if text == bench.cell_yaml(cell) else "todo")


def test_a_cell_whose_launch_fails_is_recorded_failed_not_running(tmp_path, monkeypatch):
    # the launch dies after the ServerApp wrote its first summary.json ('running'), as a
    # killed or timed-out `flwr run` does: the cell's record must say failed, with the error
    from flower_pfl.reporting.results import ResultsWriter
    from flower_pfl.running.procs import LaunchError

    def dies(cfg, path, sets, results_dir, **_):
        ResultsWriter(Path(results_dir), {"values": dict(cfg.values)})  # status: running
        raise LaunchError("the run's watchdog fired after 5 s")

    monkeypatch.setattr(bench, "run_simulation", dies)
    spec = {"name": "dies", "set": {"rounds": 1, "clients": 4, "model": "mclr",
                                    "data": {"subsample": 2000}},
            "strategies": ["fedavg"], "seeds": [0]}
    path = tmp_path / "dies.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    records = bench.run_bench(matrix.load_matrix(path), out, superlink="private", retries=0,
                              log=lambda s, **_: None)
    assert [r["status"] for r in records] == ["failed"]
    (summary,) = [json.loads(p.read_text()) for p in out.rglob("summary.json")]
    assert summary["status"] == "failed"
    assert summary["error"] == {"type": "LaunchError",
                                "message": "the run's watchdog fired after 5 s"}


def test_a_matrix_reads_numbers_as_the_run_files_do(tmp_path):
    # `1e-2` is a number in simulation.yaml and in --set; a bench matrix is no exception
    path = tmp_path / "m.yaml"
    path.write_text("name: m\nset:\n  train:\n    lr: 1e-2\n  rounds: 2\nstrategies: [fedavg]\n"
                    "seeds: [0]\n")
    (cell,) = matrix.load_matrix(path).cells(tmp_path / "out")
    cfg = config.validate(yaml.safe_load(bench.cell_yaml(cell)), "cell")
    assert cfg["train.lr"] == 0.01 and isinstance(cfg["train.lr"], float)
