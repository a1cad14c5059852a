"""docs/results stays lean: every committed run folder is slim (flower_pfl/reporting/slim.py),
the folder stays under its budget, the tables and pairs regenerate byte for byte from the
slim cells, and slimming a real run changes none of the numbers the tables read."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from flower_pfl.matrix import load_matrix
from flower_pfl.reporting import slim
from flower_pfl.reporting.results import client_failures, read_rows, read_summary
from flower_pfl.reporting.tables import cell_numbers, collect, write_table
from flower_pfl.running import inprocess
from tests.conftest import small_config

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
#: the budget of docs/results in bytes (file sizes; 9.9 MB when the cells were slimmed).
#: A full cell is ~6x its slim self: the "every cell is slim" test below names the culprit.
BUDGET = 15_000_000
MATRICES = ("fedacs-table1", "fedamp-table2", "fedamp-table3", "pfedbred-table1",
            "plgu-lowest5", "selffl-synthetic")


def test_docs_results_stays_under_its_budget():
    total = sum(p.stat().st_size for p in RESULTS.rglob("*") if p.is_file())
    assert total <= BUDGET, (f"docs/results holds {total / 1e6:.1f} MB, over its "
                             f"{BUDGET / 1e6:.0f} MB budget: slim the new cells "
                             "(flower-pfl bench ... --table-only --slim)")


def test_every_committed_run_folder_is_slim():
    fat = []
    for summary in sorted(RESULTS.rglob("summary.json")):
        run = summary.parent
        extra = [n for n in slim.DROPPED if (run / n).exists()] + \
            [p.name for p in run.glob("*.png")]
        if extra or "server" in (read_summary(run) or {}):
            fat.append(f"{run.relative_to(ROOT)}: {extra or 'summary.json server'}")
    assert not fat, "not slim (flower-pfl bench ... --table-only --slim):\n" + "\n".join(fat)


@pytest.mark.parametrize("name", MATRICES)
def test_tables_regenerate_byte_for_byte_from_the_slim_cells(name, tmp_path):
    out = tmp_path / name
    shutil.copytree(RESULTS / name, out)
    matrix = load_matrix(ROOT / "benchmarks" / f"{name}.yaml", {})
    write_table(matrix, collect(matrix, matrix.cells(out)), out)
    for f in ("table.md", "table.csv", "pairs.csv"):
        if (RESULTS / name / f).is_file():
            assert (out / f).read_bytes() == (RESULTS / name / f).read_bytes(), f"{name}/{f}"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished 3-round FedAvg run of 3 clients (every client evaluated every round)."""
    path = tmp_path_factory.mktemp("run") / "fedavg"
    inprocess.run(small_config(strategy="fedavg", model="mclr", rounds=3, clients=3,
                               **{"data.subsample": 1500, "train.batch-size": 50}), path)
    return path


def test_slimming_a_run_keeps_every_number_the_tables_read(run, tmp_path):
    cell = tmp_path / "cell"
    shutil.copytree(run, cell)
    before = cell_numbers(cell)
    last = [r for r in read_rows(cell, "clients") if r["round"] == "3"]
    assert (cell / "fit.csv").is_file() and len(read_rows(cell, "clients")) == 9
    saved = slim.slim_cell(cell)
    assert saved > 0 and not (cell / "fit.csv").exists() and not (cell / "rounds.csv").exists()
    assert not list(cell.glob("*.png")) and "server" not in read_summary(cell)
    assert read_rows(cell, "clients") == last  # the last round's rows, as strings
    assert cell_numbers(cell) == before
    assert [r["round"] for r in read_summary(cell)["rounds"]] == [1, 2, 3]
    assert client_failures(cell) is None
    assert slim.slim_cell(cell) < 100  # a second slim changes (almost) nothing


def test_a_run_with_a_short_round_keeps_its_whole_clients_file(run, tmp_path):
    cell = tmp_path / "cell"
    shutil.copytree(run, cell)
    rows = read_rows(cell, "clients")
    short = [r for r in rows if not (r["round"] == "2" and r["partition-id"] == "0")]
    with open(cell / "clients.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(short)
    reason = client_failures(cell)
    assert reason is not None
    slim.slim_cell(cell)
    assert read_rows(cell, "clients") == short  # the failure check still sees round 2
    assert client_failures(cell) == reason
