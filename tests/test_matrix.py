"""A bench matrix (flower_pfl/matrix.py) and its cells, without running one: errors reported
together, every shipped matrix's cells valid, aliases, paired comparisons and the pairs a
matrix names, the documented example, the cells a design runs, a cell's record (a cell.yaml
that is not a run, a launch that fails) and numbers read as the run files read them. The
cells run end to end: tests/test_bench.py."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest
import yaml

from flower_pfl import config, matrix
from flower_pfl.config import merge
from flower_pfl.reporting import tables
from flower_pfl.running import bench


def test_matrix_errors_are_reported_together(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"strategies": [], "seeds": "0", "compare": "best",
                                    "typo": 1}))
    with pytest.raises(matrix.MatrixError) as err:
        matrix.load_matrix(path)
    msg = str(err.value)
    assert "typo" in msg and "no strategy" in msg and "seeds" in msg and "compare" in msg


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
