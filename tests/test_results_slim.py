"""docs/results/ is cut to what the tables need (flower_pfl.running.bench.slim_cell): the
committed tables regenerate byte for byte from the slim cells, every committed cell still
counts as done, and the folder stays under its budget."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from flower_pfl.matrix import load_matrix
from flower_pfl.reporting.coverage import client_failures
from flower_pfl.reporting.run_files import SERIES, read_rows
from flower_pfl.reporting.tables import cell_numbers, collect, round_series, write_table
from flower_pfl.running.bench import cell_state, slim_cell, under_docs

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
BUDGET_BYTES = 10 * 1024 * 1024  # docs/results/ in all (files' bytes)
MATRICES = sorted(p for p in (ROOT / "benchmarks").glob("*.yaml")
                  if (RESULTS / p.stem / "table.md").is_file())


def test_docs_results_stays_under_its_budget():
    files = [p for p in RESULTS.rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    assert total < BUDGET_BYTES, (
        f"docs/results/ holds {total / 2**20:.1f} MiB in {len(files)} files, over its "
        f"{BUDGET_BYTES / 2**20:.0f} MiB budget: slim the cells "
        "(flower_pfl.running.bench.slim_tree) or keep fewer figures")
    # nothing a slim cell drops is committed
    assert not [p for p in files if p.name in ("fit.csv",) or
                (p.parent.name.startswith("seed-") and p.suffix == ".png")]


def test_there_are_committed_matrices():
    assert len(MATRICES) >= 6


@pytest.mark.parametrize("path", MATRICES, ids=lambda p: p.stem)
def test_the_committed_tables_regenerate_byte_for_byte_and_every_cell_is_done(path, tmp_path):
    matrix = load_matrix(path)
    cells = matrix.cells(RESULTS / path.stem)
    states = {c.key: cell_state(c) for c in cells}
    assert [k for k, s in states.items() if s != "done"] == []
    write_table(matrix, collect(matrix, cells), tmp_path)
    for name in ("table.md", "table.csv", "pairs.csv"):
        committed = RESULTS / path.stem / name
        if committed.is_file():
            assert (tmp_path / name).read_bytes() == committed.read_bytes(), name


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def full_cell(tmp_path: Path, last_round_clients: int = 3, fit_failed: int = 0) -> Path:
    """An unslimmed finished cell: 3 clients, rounds 2 / 5 / 9 evaluated (unequal gaps, so
    s/round depends on which rounds the summary keeps)."""
    cell = tmp_path / "docs" / "results" / "m" / "runs" / "s" / "fedavg" / "seed-0"
    cell.mkdir(parents=True)
    src = next(p.parent for p in sorted(RESULTS.rglob("config.json"))
               if (p.parent / "cell.yaml").is_file())
    conf = json.loads((src / "config.json").read_text())
    conf["values"]["clients"] = 3
    (cell / "config.json").write_text(json.dumps(conf))
    shutil.copy(src / "cell.yaml", cell / "cell.yaml")
    rounds = [{"round": r, "elapsed_s": e, "personal_mean": m,
               "personal_weighted_mean": m + 0.01, "personal_worst10_mean": m - 0.2,
               "personal_top10_mean": m + 0.1, "global_mean": m - 0.05}
              for r, e, m in ((2, 10.0, 0.5), (5, 16.0, 0.6), (9, 40.0, 0.7))]
    write_csv(cell / "rounds.csv", rounds)
    write_csv(cell / "server.csv", [{"round": r, "fit_failed": fit_failed if r == 4 else 0}
                                     for r in range(1, 10)])
    write_csv(cell / "fit.csv", [{"round": 1, "partition-id": 0, "loss": 1.0}])
    clients = [{"round": r, "partition-id": i, "accuracy": 0.5 + 0.1 * i + 0.01 * r}
               for r in (2, 5, 9) for i in range(3 if r < 9 else last_round_clients)]
    write_csv(cell / "clients.csv", clients)
    (cell / "curves.png").write_bytes(b"png")
    (cell / "checkpoint" / "round-000009").mkdir(parents=True)
    final = {k: v for k, v in rounds[-1].items() if k not in ("round", "elapsed_s")}
    (cell / "summary.json").write_text(json.dumps({
        "status": "completed", "elapsed_s": 41.0, "bmta": 0.65, "final": final,
        "rounds": rounds, "server": [{"round": 1}]}))
    (cell / "bench-cell.json").write_text(json.dumps({"status": "completed", "wall_s": 55.5}))
    return cell


def test_a_slimmed_cell_gives_the_same_numbers_curves_and_failure_check(tmp_path):
    cell = full_cell(tmp_path)
    before = cell_numbers(cell)
    series = round_series(cell)
    assert slim_cell(cell)
    assert not (cell / "rounds.csv").exists() and (cell / SERIES).is_file()
    assert not (cell / "fit.csv").exists() and not (cell / "curves.png").exists()
    assert not (cell / "checkpoint").exists()
    summary = json.loads((cell / "summary.json").read_text())
    assert [r["round"] for r in summary["rounds"]] == [2, 9] and "server" not in summary
    after = cell_numbers(cell)
    assert after == before and after["s_per_round"] == pytest.approx(30.0 / 7)
    assert after["wall_s"] == 55.5
    assert [r["round"] for r in round_series(cell)] == [2, 5, 9]
    assert [r["personal_mean"] for r in round_series(cell)] == \
        [r["personal_mean"] for r in series]
    # clients.csv keeps the final round's per-client values only
    assert [(r["round"], r["partition-id"]) for r in read_rows(cell, "clients")] == \
        [("9", "0"), ("9", "1"), ("9", "2")]
    text = {p.name: p.read_bytes() for p in cell.iterdir()}
    assert slim_cell(cell)  # idempotent
    assert {p.name: p.read_bytes() for p in cell.iterdir()} == text


def test_a_slimmed_cell_still_shows_failed_clients(tmp_path):
    short = full_cell(tmp_path / "a", last_round_clients=2)
    failed = full_cell(tmp_path / "b", fit_failed=2)
    for cell in (short, failed):
        slim_cell(cell)
    assert "1 evaluation round(s) with fewer than all 3" in client_failures(short)
    assert client_failures(failed).startswith("2 failed client fit(s)")  # from the archive
    assert cell_numbers(short) is None and cell_numbers(failed) is None


def test_only_cells_written_under_docs_results_are_slimmed(tmp_path):
    assert under_docs(tmp_path / "docs" / "results" / "m")
    assert not under_docs(tmp_path / "results" / "m")
    assert not under_docs(tmp_path / "docs" / "other")


def test_headers_mark_one_model_strategies_and_name_the_metric():
    from flower_pfl.reporting.pairs import GLOBAL_MARK, global_note, metric_words, one_model
    one = {"per_seed": {0: {"final_mean": 80.0, "global_final": 80.0},
                        1: {"final_mean": 81.5, "global_final": 81.5}}}
    two = {"per_seed": {0: {"final_mean": 80.0, "global_final": 80.0},  # equal on one seed only
                        1: {"final_mean": 83.0, "global_final": 81.5}}}
    local = {"per_seed": {0: {"final_mean": 90.0}}}
    assert one_model(one) and not one_model(two) and not one_model(local)
    assert not one_model({"per_seed": {}})
    assert GLOBAL_MARK.strip() in global_note([two, one]) and global_note([two, local]) == ""
    assert metric_words([{"lower_is_better": False}]) == "Personalized accuracy in %"
    assert "squared error" in metric_words([{}, {"lower_is_better": True}])


def test_the_committed_tables_say_which_rows_hold_a_global_model():
    fedacs = (RESULTS / "fedacs-table1" / "table.md").read_text()
    assert "| fedavg † (in-process) |" in fedacs and "| ditto (in-process) |" in fedacs
    assert "| local (in-process) |" in fedacs and "| fedavg-ft |" in fedacs  # seed 0 by flwr run
    synthetic = (RESULTS / "selffl-synthetic" / "table.md").read_text()
    assert "squared error" in synthetic and "accuracy in %" not in synthetic
