"""The local mini-batch schedule: passes, reshuffles and ``train.drop-last``."""

from __future__ import annotations

import csv

import pytest
import torch

from flower_pfl.learning.training import TrainSpec, batches
from flower_pfl.running import inprocess
from tests.conftest import small_config
from tests.test_baselines import TINY


def _passes(n, bs, steps, drop_last):
    return [b.tolist() for b in batches(n, bs, steps, torch.Generator().manual_seed(0),
                                        drop_last)]


def test_without_drop_last_a_pass_ends_with_the_remainder():
    out = _passes(65, 32, 6, drop_last=False)
    assert [len(b) for b in out] == [32, 32, 1, 32, 32, 1]  # 65 % 32 = 1 sample, one step
    assert sorted(sum(out[:3], [])) == list(range(65))  # a pass covers every sample once
    assert TrainSpec(lr=0.1, batch_size=32).num_steps(65) == 3


def test_drop_last_gives_full_batches_and_reshuffles():
    out = _passes(65, 32, 6, drop_last=True)
    assert [len(b) for b in out] == [32] * 6
    for a, b in zip(out[0::2], out[1::2]):  # each pass: two disjoint batches
        assert not set(a) & set(b)
    assert out[0:2] != out[2:4]  # a new permutation per pass
    spec = TrainSpec(lr=0.1, batch_size=32, epochs=2, drop_last=True)
    assert spec.num_steps(65) == 4
    # fewer samples than one batch: each step takes them all
    assert [len(b) for b in _passes(20, 32, 3, drop_last=True)] == [20, 20, 20]
    assert spec.num_steps(20) == 2


@pytest.mark.parametrize("drop_last", [False, True])
def test_drop_last_reaches_the_clients(tmp_path, drop_last):
    """Real FMNIST clients: the steps each one took follow the flag (fit.csv)."""
    cfg = small_config(strategy="fedavg", rounds=1, **TINY,
                       **{"train.batch-size": 64, "train.drop-last": drop_last})
    s = inprocess.run(cfg, tmp_path)
    with open(tmp_path / "fit.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == cfg["clients"]
    sizes = [int(r["num-examples"]) for r in rows]
    assert any(n % 64 for n in sizes)  # the flag matters for these clients
    want = [max(1, n // 64) if drop_last else -(-n // 64) for n in sizes]
    assert [int(float(r["local_steps"])) for r in rows] == want
    assert s.results.status == "completed"


def test_drop_last_reaches_fedrep_epochs(tmp_path):
    """FedRep counts its head/body epochs in passes: with drop-last a pass is floor(n/B)."""
    cfg = small_config(strategy="fedrep", rounds=1, **TINY,
                       **{"train.batch-size": 64, "train.drop-last": True})
    inprocess.run(cfg, tmp_path)
    with open(tmp_path / "fit.csv") as fh:
        rows = list(csv.DictReader(fh))
    sizes = [int(r["num-examples"]) for r in rows]
    assert any(n % 64 for n in sizes)
    per_pass = [max(1, n // 64) for n in sizes]
    head = [int(float(r["head_steps"])) for r in rows]
    epochs = head[0] // per_pass[0]
    assert epochs >= 1 and head == [epochs * p for p in per_pass]
