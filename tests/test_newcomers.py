"""Held-out newcomers (flower_pfl/newcomers.py, docs/newcomers.md): the configuration, the
draw, that they never train and that nothing a newcomer computes reaches the server; the
records of a real run on a small FMNIST subset."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from flower_pfl import config, newcomers
from flower_pfl.instructions import NewcomerReply
from flower_pfl.reporting.coverage import run_coverage
from flower_pfl.running import inprocess
from tests.conftest import small_config

TINY = {"clients": 6, "fraction-fit": 1.0, "model": "mclr", "data.subsample": 2000,
        "train.steps": 3}


def _rows(path):
    with open(path) as fh:
        return list(csv.DictReader(fh))


def test_default_has_no_newcomer_and_bad_input_is_refused_by_name():
    cfg = small_config()
    assert cfg["newcomers.clients"] is None and newcomers.held_out(cfg.values) == []
    for value, word in ((0, "out of range"), (1.0, "out of range"), (True, "wrong type"),
                        ([1, 1], "out of range"), ("two", "expected number or list"),
                        ([3, 12], "outside [0, 10)"), (9, "fewer than min-fit-clients")):
        with pytest.raises(config.ConfigError, match="newcomers.clients") as err:
            small_config(**{"newcomers.clients": value})
        assert word in str(err.value), (value, str(err.value))
    with pytest.raises(config.ConfigError, match="'newcomers.budget-steps' = 5 is set but"):
        small_config(**{"newcomers.budget-steps": 5})
    with pytest.raises(config.ConfigError, match="not a multiple of 'eval-every' = 2"):
        small_config(**{"newcomers.clients": 2, "newcomers.every": 3, "eval-every": 2})
    with pytest.raises(config.ConfigError, match="unknown key 'newcomers.count'"):
        small_config(**{"newcomers.count": 2})
    # a strategy whose contract declares no rule is refused with the reason
    with pytest.raises(config.ConfigError, match="strategy 'selffl' has no newcomer rule"):
        small_config(strategy="selffl", **{"newcomers.clients": 2})


def test_held_out_set_is_the_seeds_and_count_fraction_and_list_agree():
    a = small_config(**{"newcomers.clients": 3})
    b = small_config(**{"newcomers.clients": 0.3})  # round(0.3 * 10) = 3: the same draw
    other = small_config(seed=1, **{"newcomers.clients": 3})
    assert newcomers.held_out(a.values) == newcomers.held_out(b.values)
    assert len(newcomers.held_out(a.values)) == 3
    assert newcomers.held_out(a.values) != newcomers.held_out(other.values)
    listed = small_config(**{"newcomers.clients": [7, 2]})
    assert newcomers.held_out(listed.values) == [2, 7]


def test_newcomers_never_train_and_the_participants_sampling_stream_is_kept(tmp_path):
    cfg = small_config(strategy="fedavg", rounds=2, **{**TINY, "fraction-fit": 0.5},
                       **{"newcomers.clients": 2, "newcomers.budget-steps": 4})
    held = newcomers.held_out(cfg.values)
    s = inprocess.run(cfg, tmp_path)
    fit = _rows(tmp_path / "fit.csv")
    trained = {int(r["partition-id"]) for r in fit}
    assert trained and not trained & set(held)
    # participants + newcomers = clients, in every record
    rows = [r for r in _rows(tmp_path / "clients.csv") if r["round"] == "2"]
    is_new = {int(r["partition-id"]): r["newcomer"] == "1" for r in rows}
    assert sorted(is_new) == list(range(6))
    assert sorted(p for p, n in is_new.items() if n) == held
    assert json.loads((tmp_path / "config.json").read_text())["newcomers"] == held
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["newcomers"] == held
    # named newcomers, never "never trained" (participants not sampled yet may be)
    assert not set(summary["untrained_clients"]) & set(held)
    assert s.store is not None
    # the participants' sample: 0.5 of the 4 participants from the run's own generator
    assert all(len({int(r["partition-id"]) for r in fit if r["round"] == str(k)}) == 2
               for k in (1, 2))


def test_newcomer_records_before_after_gap_and_gain(tmp_path):
    cfg = small_config(strategy="fedavg", rounds=2, **TINY,
                       **{"newcomers.clients": [1, 4], "newcomers.budget-steps": 5})
    inprocess.run(cfg, tmp_path)
    rounds = _rows(tmp_path / "rounds.csv")
    clients = [r for r in _rows(tmp_path / "clients.csv") if r["round"] == "2"]
    new = [r for r in clients if r["newcomer"] == "1"]
    part = [r for r in clients if r["newcomer"] != "1"]
    assert [int(r["partition-id"]) for r in new] == [1, 4]
    assert all(int(r["newcomer_steps"]) == 5 for r in new)
    last = rounds[-1]
    before = np.mean([float(r["newcomer_before"]) for r in new])
    after = np.mean([float(r["newcomer_after"]) for r in new])
    assert math.isclose(float(last["newcomers_before_mean"]), before, abs_tol=1e-9)
    assert math.isclose(float(last["newcomers_after_mean"]), after, abs_tol=1e-9)
    # personal_* are the participants' own
    pmean = np.mean([float(r["accuracy"]) for r in part])
    assert math.isclose(float(last["personal_mean"]), pmean, abs_tol=1e-9)
    assert math.isclose(float(last["participation_gap"]), after - pmean, abs_tol=1e-9)
    assert math.isclose(float(last["adaptation_gain"]), after - before, abs_tol=1e-9)
    # the participants' numbers cover the 4 participants, all of them: a complete run
    assert int(last["clients_evaluated"]) == 4
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert math.isclose(summary["final"]["participation_gap"], after - pmean, abs_tol=1e-9)
    cover = summary["coverage"]
    assert (cover["clients"], cover["final_clients_covered"], cover["final_missing"],
            cover["complete"]) == (4, 4, [], True)
    assert run_coverage(tmp_path) == cover  # read back from the run's files alike


def test_nothing_a_newcomer_computes_reaches_the_server(tmp_path, monkeypatch):
    """Every reply of a newcomer is read: evaluation metrics only (no arrays, no fit), and
    its state holds nothing after it adapted, even where its rule writes to it."""
    from flower_pfl.clients.ditto import DittoClient

    rule = DittoClient.adapt_newcomer

    def writing(self, model, config, steps):  # a rule that stores what it adapted
        out = rule(self, model, config, steps)
        self.save_personal(out, "ditto-v")
        return out

    monkeypatch.setattr(DittoClient, "adapt_newcomer", writing)
    cfg = small_config(strategy="ditto", rounds=1, **TINY,
                       **{"newcomers.clients": [2], "newcomers.budget-steps": 3})
    manager = inprocess.make_federation(cfg["clients"])
    s = inprocess.run(cfg, tmp_path, manager=manager)
    proxies = {int(p.context.node_config["partition-id"]): p for p in manager.all().values()}
    asked = dict((s.proxy_pid(p), ins) for p, ins in s.configure_evaluate(1, None, manager))
    assert sorted(asked) == list(range(6))
    res = proxies[2].evaluate(asked[2], None, None)
    allowed = {"partition-id", "accuracy", "num-train", "fit-rounds", "device",
               "device_kind", "device_name", *NewcomerReply.keys()}
    assert set(res.metrics) <= allowed | {k for k in res.metrics if k.startswith("device")}
    assert all(isinstance(v, (int, float, str)) for v in res.metrics.values())
    assert len(proxies[2].context.state) == 0  # the adaptation kept nothing
    assert 2 not in {int(r["partition-id"]) for r in _rows(tmp_path / "fit.csv")}
    # no fit instruction ever names it
    assert 2 not in s.sample(2) and 2 not in s.sample(3)


def test_docs_newcomers_holds_the_generated_rules_table():
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "newcomers.md").read_text()
    assert newcomers.rules_table() in text, (
        "regenerate: python -c 'from flower_pfl import newcomers; "
        "print(newcomers.rules_table())'")
    # the table names every strategy's declaration: a rule and basis, or why not
    assert "| `ditto` | v = argmin" in newcomers.rules_table()


def test_compare_shows_the_newcomer_columns(tmp_path):
    from flower_pfl.reporting.compare import compare

    for name in ("fedavg", "ditto"):
        cfg = small_config(strategy=name, rounds=1, **TINY,
                           **{"newcomers.clients": [0, 5], "newcomers.budget-steps": 2})
        inprocess.run(cfg, tmp_path / name)
    out = compare([tmp_path / "fedavg", tmp_path / "ditto"], tmp_path / "cmp")
    assert "newcomers_after_mean" in out.metrics and "participation_gap" in out.metrics
    with open(tmp_path / "cmp" / "table.csv") as fh:
        table = {r["strategy"]: r for r in csv.DictReader(fh)}
    for name in ("fedavg", "ditto"):
        final = json.loads((tmp_path / name / "summary.json").read_text())["final"]
        assert math.isclose(float(table[name]["participation_gap"]),
                            100 * final["participation_gap"], abs_tol=1e-6)
