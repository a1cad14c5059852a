"""The metric kind is decided once (flower_pfl.reporting.metric_kind: metric_of, lower_is_better,
run_metric) and every reader follows it: the writer's BMTA, the console's closing "best",
the table's numbers (an error is not scaled to percent) and its lower-is-better flag.

A real in-process run of the synthetic Gaussian task (per-client mse: lower is better) is
read back by each of them; the same run copied without its config.json (a cell committed by
hand) must read back the same way, from the metric column its clients.csv wrote.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from flower_pfl.learning.metrics import STAT_KEYS
from flower_pfl.reporting import console, metric_kind, results, run_files, tables
from flower_pfl.running import inprocess
from tests.conftest import small_config


def test_the_rule_itself():
    assert metric_kind.metric_of({"data.dataset": "synthetic-gaussian"}) == "mse"
    assert metric_kind.metric_of({"data.dataset": "fmnist"}) == "accuracy"
    assert metric_kind.metric_of({}) == "accuracy"
    assert metric_kind.lower_is_better("mse") and not metric_kind.lower_is_better("accuracy")


@pytest.fixture(scope="module")
def mse_run(tmp_path_factory):
    cfg = small_config(strategy="fedavg", rounds=4, clients=4, model="scalar",
                       **{"data.dataset": "synthetic-gaussian", "train.lr": 0.01})
    out = tmp_path_factory.mktemp("mse-run")
    inprocess.run(cfg, out)
    return out


def _console_best(run_dir) -> float:
    line = next(ln for ln in console.summary_lines(run_dir) if "personalized" in ln)
    assert line.startswith("  personalized mse: final ")  # an error, not a percentage
    return float(re.search(r"best (\S+) \(round", line).group(1))


@pytest.mark.parametrize("with_config", [True, False])
def test_an_mse_run_is_read_back_as_lower_is_better_everywhere(mse_run, tmp_path,
                                                                 with_config):
    run = mse_run
    if not with_config:
        run = tmp_path / "copy"
        shutil.copytree(mse_run, run)
        (run / "config.json").unlink()
    assert metric_kind.run_metric(run) == "mse"
    summary = json.loads((run / "summary.json").read_text())
    means = [r["personal_mean"] for r in summary["rounds"]]
    assert min(means) < max(means)  # the test tells min from max
    best = min(means)
    assert summary["bmta"] == best  # the writer: the lowest error
    assert _console_best(run) == pytest.approx(best, abs=5e-5)  # printed with 4 decimals
    nums = tables.cell_numbers(run)
    assert nums is not None
    assert nums["bmta"] == pytest.approx(best)  # not scaled to percent
    assert nums["final_mean"] == pytest.approx(means[-1])
    rows = run_files.read_rows(run, "clients")
    assert "mse" in rows[0] and "accuracy" not in rows[0]  # the clients' column, same rule


def test_the_writer_refuses_a_caller_with_another_direction(tmp_path):
    writer = results.ResultsWriter(tmp_path, {"values": {"data.dataset": "synthetic-gaussian"}})
    assert writer.metric == "mse" and writer.lower_is_better
    stats = {k: 0.5 for k in STAT_KEYS}
    with pytest.raises(ValueError, match="lower_is_better"):
        writer.log_round(1, stats, None, [{"partition-id": 0}], lower_is_better=False)


def test_seconds_per_round_leaves_out_each_resumed_process_start_up():
    rounds = [{"round": r, "elapsed_s": e} for r, e in
              zip([1, 2, 3, 4, 5], [10.0, 11.0, 30.0, 32.0, 33.0])]
    # segments [1, 2] and [3, 4, 5]: (11 - 10 + 33 - 30) / (1 + 2); the step 2 -> 3 (19 s of
    # a second process starting) is out; without the resume, (33 - 10) / 4
    assert tables.seconds_per_round(rounds, [2]) == pytest.approx(4.0 / 3.0)
    assert tables.seconds_per_round(rounds) == pytest.approx(23.0 / 4.0)
    # a segment of one round adds nothing; nothing left: the last elapsed over its round
    assert tables.seconds_per_round(rounds, [2, 3, 4]) == pytest.approx(1.0)
    assert tables.seconds_per_round(rounds[:1]) == pytest.approx(10.0)
