"""FedAvg and FedAMP for 2 rounds, in-process, on an image folder and on a CSV built in a
temporary directory (issue 50's acceptance)."""

from __future__ import annotations

import numpy as np
import pytest

from flower_pfl.learning import client_data, own_data
from flower_pfl.reliability import preflight as pf
from flower_pfl.running import inprocess
from tests.test_data_sources import make_csv, make_imagefolder, own_config


def _run(cfg, out, monkeypatch):
    pf.preflight(cfg)  # the run's own check first, as flower-pfl run does
    monkeypatch.setattr(own_data, "_INFO", {})  # a fresh process knows only the settings
    client_data.clear_cache()
    strategy = inprocess.run(cfg, out)
    assert len(strategy.eval_history) == 2
    acc = strategy.eval_history[-1]["mean"]
    assert 0.0 <= acc <= 1.0
    assert (out / "clients.csv").is_file()
    return acc


@pytest.mark.parametrize("strategy", ["fedavg", "fedamp"])
def test_two_rounds_on_an_image_folder(tmp_path, monkeypatch, strategy):
    root = make_imagefolder(tmp_path / "imgs", counts=(12, 14, 10))
    cfg = own_config(f"imagefolder:{root}", tmp_path, strategy=strategy, model="cnn",
                     clients=3)
    _run(cfg, tmp_path / "res", monkeypatch)


@pytest.mark.parametrize("strategy", ["fedavg", "fedamp"])
def test_two_rounds_on_a_csv_with_an_mlp(tmp_path, monkeypatch, strategy):
    make_csv(tmp_path / "t.csv", n=120)
    cfg = own_config(str(tmp_path / "t.csv"), tmp_path, strategy=strategy, model="dnn",
                     clients=4, rounds=2,
                     **{"data.label": "kind", "data.features": ["f1", "f2"],
                        "data.partition": "natural", "data.partition-by": "site",
                        "train.epochs": 3})
    acc = _run(cfg, tmp_path / "res", monkeypatch)
    assert acc > 1 / 3 + 0.2  # separable by f1: well above chance after 2 rounds
    assert np.isfinite(acc)
