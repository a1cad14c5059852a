"""Mechanisms that need history, reported per run (strategies/mechanism.py), and the rows
of clients that never trained (strategies/evaluation.py).

Every registered strategy that declares a mechanism runs once, small (4 clients, 2 per
round, 3 rounds, 2 local steps): its end-of-run line and summary.json must count exactly
the client-rounds whose client had an accepted upload in an earlier round (read back from
fit.csv), which under partial participation is neither all nor none of them.  Self-FL's
own rule (eq. 8/10) is tested in tests/test_selffl.py.
"""

from __future__ import annotations

import csv
import json
import logging

import pytest

from flower_pfl import registry
from flower_pfl.contract import MORE_ROUNDS
from flower_pfl.running import inprocess
from tests.conftest import small_config

#: mechanisms whose use is not "the client had an accepted upload before", each tested on
#: its own rule: Self-FL (eq. 8/10, tests/test_selffl.py), FedFomo (a peer of positive
#: weight moved the model: below)
OWN_RULE = ("selffl", "fedfomo")
HISTORY = sorted(name for name, entry in registry.REGISTRY.items()
                 if entry.mechanism is not None and name not in OWN_RULE)
SMALL = {"clients": 4, "fraction-fit": 0.5, "model": "dnn", "data.subsample": 1200,
         "train.steps": 2, "train.batch-size": 16}


def _rows(run_dir, name):
    with open(run_dir / f"{name}.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def _lines(caplog, text):
    return [r for r in caplog.records if text in r.getMessage()]


def test_every_history_mechanism_is_declared():
    """The methods whose mechanism builds on a client's earlier rounds all declare it."""
    for name in ("ditto", "apfl", "fedrep", "plgu-grep", "fedamp", "heurfedamp", "fedacs",
                 "scaffold", "pfedhn", "plgu-ghn", "plgu-lf", "pfedbred-mh"):
        assert name in HISTORY, name
    for name in ("fedavg", "local", "pfedme", "perfedavg"):
        assert registry.get(name).mechanism is None, name


def _small(name: str) -> dict:
    """SMALL without the ``train.*`` keys strategy ``name`` refuses (pFedBreD's local
    iterations and batch are its own hyper-parameters): those stay at their defaults."""
    return {k: v for k, v in SMALL.items() if k not in registry.REGISTRY[name].refuses}


@pytest.mark.parametrize("name", HISTORY)
def test_run_level_mechanism_line_counts_client_rounds_with_history(name, tmp_path, caplog):
    cfg = small_config(strategy=name, rounds=3, **_small(name))
    with caplog.at_level(logging.INFO):
        s = inprocess.run(cfg, tmp_path / "run")
    fits = _rows(s.results.dir, "fit")
    seen, used = set(), 0
    for r in sorted(fits, key=lambda r: int(r["round"])):
        pid = int(r["partition-id"])
        if any(int(q["partition-id"]) == pid and int(q["round"]) < int(r["round"])
               for q in fits):
            used += 1
        seen.add(pid)
    assert len(fits) == 6 and 0 < used < 6, (name, used)  # partial participation
    summary = json.loads((s.results.dir / "summary.json").read_text())
    mech = s.mechanism
    assert summary["mechanism"] == {"name": mech.name, "what": mech.what,
                                    "otherwise": mech.otherwise, "used": used,
                                    "client_rounds": 6, "never_used": False}
    line = f"{mech.name}: {mech.what} used in {used} of 6 client-rounds"
    hits = _lines(caplog, line)
    assert len(hits) == 1 and hits[0].levelno == logging.INFO, [r.getMessage() for r in
                                                                caplog.records][-5:]


def test_mechanism_that_never_ran_ends_with_a_warning_and_the_hint(tmp_path, caplog):
    cfg = small_config(strategy="ditto", rounds=1, **SMALL)
    with caplog.at_level(logging.INFO):
        s = inprocess.run(cfg, tmp_path / "run")
    hits = _lines(caplog, "Ditto: personal v_i carried over from an earlier round used in 0 "
                          "of 2 client-rounds")
    assert len(hits) == 1 and hits[0].levelno == logging.WARNING
    assert MORE_ROUNDS in hits[0].getMessage()
    summary = json.loads((s.results.dir / "summary.json").read_text())
    assert summary["mechanism"]["never_used"] is True and summary["mechanism"]["used"] == 0


def test_strategy_without_a_fallback_reports_no_mechanism(tmp_path, caplog):
    cfg = small_config(strategy="fedavg", rounds=1, **SMALL)
    with caplog.at_level(logging.INFO):
        s = inprocess.run(cfg, tmp_path / "run")
    assert "mechanism" not in json.loads((s.results.dir / "summary.json").read_text())
    assert not _lines(caplog, "client-rounds")


def test_never_sampled_client_row_says_it_never_trained(tmp_path, caplog):
    """One of 4 clients trains (Ditto, 1 round): the other three evaluate the global model w
    the server sent; their rows say trained 0, the trained-only statistics leave them out,
    the all-clients statistics keep their meaning, and the run says so at the end."""
    cfg = small_config(strategy="ditto", rounds=1,
                       **{**SMALL, "fraction-fit": 0.25, "min-fit-clients": 1})
    with caplog.at_level(logging.INFO):
        s = inprocess.run(cfg, tmp_path / "run")
    trained_pid = {int(r["partition-id"]) for r in _rows(s.results.dir, "fit")}
    assert len(trained_pid) == 1
    rows = _rows(s.results.dir, "clients")
    assert {int(r["partition-id"]) for r in rows if r["trained"] == "1"} == trained_pid
    untrained = [r for r in rows if r["trained"] == "0"]
    assert len(untrained) == 3 and all(r["fit-rounds"] == "0" for r in untrained)
    # an untrained Ditto client evaluates w: its 'personalized' number IS the global one
    assert all(r["accuracy"] == r["global_accuracy"] for r in untrained)
    last = json.loads((s.results.dir / "summary.json").read_text())["final"]
    trained_acc = [float(r["accuracy"]) for r in rows if r["trained"] == "1"]
    assert last["personal_trained_clients"] == 1
    assert last["personal_trained_mean"] == pytest.approx(trained_acc[0])
    assert last["personal_mean"] == pytest.approx(sum(float(r["accuracy"]) for r in rows) / 4)
    assert last["personal_trained_mean"] != pytest.approx(last["personal_mean"])
    summary = json.loads((s.results.dir / "summary.json").read_text())
    assert summary["untrained_clients"] == sorted(int(r["partition-id"]) for r in untrained)
    hits = _lines(caplog, "3 of 4 clients never trained")
    assert len(hits) == 1 and hits[0].levelno == logging.WARNING


def test_fedfomo_counts_the_fits_a_peer_of_positive_weight_moved(tmp_path, monkeypatch):
    from flower_pfl.catalog.fedfomo import FedFomoReply
    from flower_pfl.strategies.fedfomo import FedFomo

    weights: list[str] = []  # each accepted upload's reported peer weights, as sent
    aggregate = FedFomo.aggregate_updates

    def spy(self, server_round, updates):
        weights.extend(FedFomoReply.from_config(u.metrics).peer_weights for u in updates)
        return aggregate(self, server_round, updates)

    monkeypatch.setattr(FedFomo, "aggregate_updates", spy)
    cfg = small_config(strategy="fedfomo", rounds=3, **_small("fedfomo"))
    s = inprocess.run(cfg, tmp_path / "run")
    moved = sum(1 for w in weights if sum(float(x) for x in w.split(",") if x) > 0)
    summary = json.loads((s.results.dir / "summary.json").read_text())
    assert len(weights) == 6 and summary["mechanism"]["client_rounds"] == 6
    assert summary["mechanism"]["used"] == moved and 0 < moved < 6  # neither all nor none
