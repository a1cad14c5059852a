"""Every registered strategy end to end through Flower's message path, in one process.

`inprocess.run` sends each instruction as a Flower ``Message`` to ``client_app.app``:
legacy ins converted to records as Flower's ``GridClientProxy`` does, deflated to bytes
and inflated back as the object store moves them, the node's ``Context`` serialised in
and out.  So what a real ``flwr run`` would refuse (record and config value types, array
shapes, a ``context.state`` that does not serialise) fails here too, in seconds; the real
``flwr run`` of one strategy per family is in the slow tier (test_e2e_simulation.py).
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from flower_pfl import registry
from flower_pfl.running import inprocess
from flower_pfl.strategies.message_passing import MessagePassingStrategy
from tests.conftest import small_config

ROUNDS, CLIENTS = 2, 3


def _tiny(strategy: str, **changes):
    """The shared small run; a ``train.*`` key the strategy refuses (pFedBreD / pFedMe take
    their batch size from their own hyper-parameters) is left at its default for it."""
    settings = {"eval-every": 1, "data.subsample": 1500, "train.batch-size": 50, **changes}
    refused = registry.REGISTRY[strategy].refuses
    return small_config(strategy=strategy, rounds=ROUNDS, clients=CLIENTS, model="mclr",
                        **{k: v for k, v in settings.items() if k not in refused})


def _rows(path, name):
    with open(path / name) as fh:
        return list(csv.DictReader(fh))


# A new catalog entry is covered without editing this file.
@pytest.mark.parametrize("strategy", sorted(registry.REGISTRY))
def test_every_strategy_runs_through_the_message_path(strategy, tmp_path):
    inprocess.run(_tiny(strategy), tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(summary["rounds"]) == ROUNDS
    last = [r for r in _rows(tmp_path, "clients.csv") if r["round"] == str(ROUNDS)]
    assert sorted(int(r["partition-id"]) for r in last) == list(range(CLIENTS))
    # context.state crossed the (serialised) boundary every round: each client counted its fits
    assert all(int(r["fit-rounds"]) == ROUNDS for r in last)
    assert all(0.0 <= float(r["accuracy"]) <= 1.0 for r in last)
    strategy_cls = registry.strategy_class(strategy)
    if strategy_cls.has_global_model:  # both the personalized and the global model evaluated
        assert all(0.0 <= float(r["global_accuracy"]) <= 1.0 for r in last)
    if issubclass(strategy_cls, MessagePassingStrategy):  # last round's attention (Fig. 3)
        assert (tmp_path / "attention.npy").exists() and (tmp_path / "attention.png").exists()
    fits = _rows(tmp_path, "fit.csv")
    assert len(fits) == ROUNDS * CLIENTS and all(np.isfinite(float(r["train_loss"]))
                                                  for r in fits)


def test_a_metric_flower_cannot_carry_fails_the_round(tmp_path, monkeypatch):
    """The transport is Flower's: a reply with a value no MetricRecord holds (a numpy
    float32) does not reach the strategy, as it would not in a real run."""
    from flower_pfl.clients.base import PFLClient
    from flower_pfl.strategies.federation import RoundError

    original = PFLClient.fit

    def fit_with_a_bad_metric(self, parameters, config):
        arrays, n, metrics = original(self, parameters, config)
        return arrays, n, {**metrics, "bad": np.float32(1.0)}

    monkeypatch.setattr(PFLClient, "fit", fit_with_a_bad_metric)
    with pytest.raises(RoundError, match=r"0 valid update\(s\).*TypeError: Not all values are "
                                         r"of valid type.*numpy.float32"):
        inprocess.run(_tiny("fedavg"), tmp_path)

