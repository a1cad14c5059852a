"""Statistics of per-client accuracies against hand computations."""

from __future__ import annotations

import math

import pytest

from flower_pfl.learning.metrics import best_mean, summarize, tail_count


def test_summarize_by_hand():
    accs = [0.5, 1.0, 0.25, 0.75]
    n_test = [10, 30, 20, 40]
    s = summarize(accs, n_test)
    assert s["mean"] == pytest.approx(0.625)
    # weighted: (5 + 30 + 5 + 30) / 100
    assert s["weighted_mean"] == pytest.approx(0.70)
    var = ((-.125) ** 2 + .375 ** 2 + .375 ** 2 + .125 ** 2) / 4
    assert s["std"] == pytest.approx(math.sqrt(var))
    assert s["worst10_mean"] == 0.25 and s["top10_mean"] == 1.0  # ceil(0.4) = 1 client
    assert (s["min"], s["max"]) == (0.25, 1.0)
    assert s["worst5_mean"] == 0.25 and s["top5_mean"] == 1.0  # ceil(0.2) = 1 client


def test_tails_over_more_clients():
    accs = [i / 20 for i in range(20)]  # 0.00 .. 0.95
    s = summarize(accs)
    assert tail_count(20) == 2
    assert s["worst10_mean"] == pytest.approx((0.0 + 0.05) / 2)
    assert s["top10_mean"] == pytest.approx((0.90 + 0.95) / 2)
    assert tail_count(11) == 2 and tail_count(10) == 1
    assert s["worst5_mean"] == 0.0 and s["top5_mean"] == 0.95  # ceil(5% * 20) = 1 client


def test_five_percent_tails_over_many_clients():
    accs = [i / 100 for i in range(100)][::-1]  # order must not matter
    s = summarize(accs)
    assert tail_count(100, 0.05) == 5 and tail_count(41, 0.05) == 3
    assert s["worst5_mean"] == pytest.approx((0.00 + 0.01 + 0.02 + 0.03 + 0.04) / 5)
    assert s["top5_mean"] == pytest.approx((0.95 + 0.96 + 0.97 + 0.98 + 0.99) / 5)
    assert s["worst10_mean"] == pytest.approx(sum(i / 100 for i in range(10)) / 10)


def test_every_stat_key_reaches_the_rounds_table(tmp_path):
    import csv as _csv

    from flower_pfl.learning.metrics import STAT_KEYS
    from flower_pfl.reporting.results import ResultsWriter

    writer = ResultsWriter(tmp_path, {})
    stats = summarize([0.1, 0.5, 0.9])
    writer.log_round(1, stats, stats, [{"partition-id": 0}])
    with open(tmp_path / "rounds.csv") as fh:
        row = next(_csv.DictReader(fh))
    for key in ("worst5_mean", "top5_mean"):
        assert key in STAT_KEYS
        assert float(row[f"personal_{key}"]) == stats[key]
        assert float(row[f"global_{key}"]) == stats[key]


def test_bmta_is_best_round_mean():
    assert best_mean([{"mean": 0.4}, {"mean": 0.7}, {"mean": 0.6}]) == 0.7


def test_empty_is_an_error():
    with pytest.raises(ValueError):
        summarize([])


def test_csv_rows_keep_columns_when_they_vary(tmp_path):
    import csv as _csv

    from flower_pfl.reporting.results import append_csv

    path = tmp_path / "t.csv"
    append_csv(path, [{"round": 1, "a": 1}, {"round": 1, "a": 2}])
    append_csv(path, {"round": 2})  # fewer columns: appended, 'a' left empty
    append_csv(path, {"round": 3, "b": 7})  # a new column: file rewritten with the union
    with open(path) as fh:
        rows = list(_csv.DictReader(fh))
    assert [r["round"] for r in rows] == ["1", "1", "2", "3"]
    assert rows[2]["a"] == "" and rows[3]["b"] == "7" and rows[0]["b"] == ""


def test_for_an_error_the_worst_clients_are_the_highest():
    """The synthetic task scores a squared error: its worst-10%/5% are the largest errors
    (seen: the bench's Self-FL synthetic table listed the SMALLEST errors as worst-10%)."""
    errors = [i / 100 for i in range(100)]
    s = summarize(errors, lower_is_better=True)
    assert s["worst10_mean"] == pytest.approx(sum(i / 100 for i in range(90, 100)) / 10)
    assert s["top10_mean"] == pytest.approx(sum(i / 100 for i in range(10)) / 10)
    assert s["worst5_mean"] == pytest.approx((0.95 + 0.96 + 0.97 + 0.98 + 0.99) / 5)
    assert s["min"] == 0.0 and s["max"] == pytest.approx(0.99)
    acc = summarize(errors)  # accuracies: the lowest are the worst
    assert acc["worst10_mean"] == pytest.approx(s["top10_mean"])
