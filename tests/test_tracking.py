"""TensorBoard tracking (flower_pfl/reporting/tracking.py), written from where rounds are recorded.

A 3-round in-process run (the real Strategy and ClientApp through Flower's message path)
with ``tracking: tensorboard``; the event files are read back with TensorBoard's own
reader and every round's personalized mean must equal rounds.csv's.  Skipped only where
the optional ``tensorboard`` extra is not installed (scripts/setup.sh installs it).
"""

from __future__ import annotations

import csv

import pytest

from flower_pfl.reporting import tracking
from flower_pfl.reporting.results import ResultsWriter
from flower_pfl.running import inprocess
from tests.conftest import small_config

pytest.importorskip("tensorboard", reason="the optional tensorboard extra is not installed "
                    "(pip install 'flower-pfl[tensorboard]'); TensorBoard tracking untested")


def _events(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def _tiny(strategy, **changes):
    return small_config(strategy=strategy, model="mclr", **{
        "rounds": 3, "clients": 3, "data.subsample": 1500, "train.batch-size": 50, **changes})


def test_event_files_hold_what_rounds_csv_holds(tmp_path):
    inprocess.run(_tiny("fedacs", tracking="tensorboard"), tmp_path)
    acc = _events(tmp_path / "tensorboard")
    with open(tmp_path / "rounds.csv") as fh:
        rounds = list(csv.DictReader(fh))
    assert len(rounds) == 3
    tags = acc.Tags()
    for tag, column in (("personalized/mean", "personal_mean"),
                        ("personalized/worst10", "personal_worst10_mean"),
                        ("personalized/top10", "personal_top10_mean"),
                        ("personalized/best_mean", "personal_bmta")):
        events = acc.Scalars(tag)
        assert [e.step for e in events] == [1, 2, 3], tag
        for e, row in zip(events, rounds):
            assert e.value == pytest.approx(float(row[column]), rel=1e-6, abs=1e-7), tag
    # the mean train loss of each round's uploads, the strategy's server.csv measures and
    # the per-client accuracies as a histogram
    with open(tmp_path / "fit.csv") as fh:
        fits = list(csv.DictReader(fh))
    train = acc.Scalars("loss/train")
    assert [e.step for e in train] == [1, 2, 3]
    first = [float(r["train_loss"]) for r in fits if r["round"] == "1"]
    assert train[0].value == pytest.approx(sum(first) / len(first), rel=1e-6)
    assert "server/delta" in tags["scalars"] and "server/fit_ok" in tags["scalars"]
    assert "clients/personalized_accuracy" in tags["histograms"]
    hist = acc.Histograms("clients/personalized_accuracy")[-1].histogram_value
    assert hist.num == 3  # one value per client
    assert "global/mean" not in tags["scalars"]  # FedACS has no global model


def test_global_model_and_tracking_dir(tmp_path):
    inprocess.run(_tiny("fedavg", tracking="tensorboard",
                        **{"tracking-dir": str(tmp_path / "tb")}), tmp_path / "run-a")
    acc = _events(tmp_path / "tb" / "run-a")  # one run per folder under tracking-dir
    with open(tmp_path / "run-a" / "rounds.csv") as fh:
        rounds = list(csv.DictReader(fh))
    assert [round(e.value, 6) for e in acc.Scalars("global/mean")] == \
        [round(float(r["global_mean"]), 6) for r in rounds]
    assert not (tmp_path / "run-a" / "tensorboard").exists()


def test_tracking_off_writes_nothing_and_a_missing_package_is_named(tmp_path, monkeypatch):
    cfg = _tiny("fedavg")
    writer = ResultsWriter(tmp_path / "off", {"values": dict(cfg.values)})
    assert writer.tracker is None
    monkeypatch.setattr(tracking, "available", lambda: False)
    with pytest.raises(tracking.TrackingError, match=r"pip install 'flower-pfl\[tensorboard\]'"):
        ResultsWriter(tmp_path / "on", {"values": {**cfg.values, "tracking": "tensorboard"}})


def test_bench_cells_get_one_folder_each_under_tracking_dir(tmp_path):
    values = {"tracking": "tensorboard", "tracking-dir": str(tmp_path / "tb")}
    cell = tmp_path / "bench" / "runs" / "prac" / "fedavg" / "seed-1"
    assert tracking.event_dir(values, cell) == tmp_path / "tb" / "prac" / "fedavg" / "seed-1"
    assert tracking.event_dir(values, tmp_path / "out" / "my-run") == tmp_path / "tb" / "my-run"
    assert tracking.event_dir({"tracking": "tensorboard"}, cell) == cell / "tensorboard"


def test_a_resumed_run_replaces_the_rounds_it_repeats(tmp_path):
    """4 rounds, then a resume from the round-2 checkpoint: rounds 3-4 run again; the events
    hold each round once, with the values rounds.csv holds after the resume."""
    cfg = _tiny("fedavg", rounds=4, tracking="tensorboard", **{"checkpoint-every": 2})

    def die_after_round_4(strategy, r):  # before the run's end writes its own checkpoint
        if r == 4:
            raise InterruptedError
    with pytest.raises(InterruptedError):
        inprocess.run(cfg, tmp_path, client_state_dir=tmp_path / "cs",
                      on_round=die_after_round_4)
    first = _events(tmp_path / "tensorboard").Scalars("personalized/mean")
    inprocess.run(cfg, tmp_path, resume=True, client_state_dir=tmp_path / "cs")
    with open(tmp_path / "rounds.csv") as fh:
        rounds = [float(r["personal_mean"]) for r in csv.DictReader(fh)]
    events = _events(tmp_path / "tensorboard").Scalars("personalized/mean")
    assert [e.step for e in first] == [1, 2, 3, 4] and len(rounds) == 4
    assert [e.step for e in events] == [1, 2, 3, 4]
    assert [e.value for e in events] == pytest.approx(rounds, rel=1e-6)
