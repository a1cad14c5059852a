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


# ------------------------------------------------- optimizer and learning-rate schedule
def test_schedules_by_hand():
    """The numbers written out (learning/schedule.py's formulas, round r 1-based)."""
    from flower_pfl.learning.schedule import lr_at

    assert [lr_at(r, 0.1) for r in (1, 7)] == [0.1, 0.1]
    # step: x0.5 every 2 rounds
    assert [lr_at(r, 0.1, "step", 0.5, 2) for r in range(1, 6)] == pytest.approx(
        [0.1, 0.1, 0.05, 0.05, 0.025], abs=1e-15)
    # exponential: x0.9 per round
    assert [lr_at(r, 0.2, "exponential", 0.9) for r in (1, 2, 3)] == pytest.approx(
        [0.2, 0.18, 0.162], abs=1e-15)
    # cosine from 0.1 to 0.01 over 4 rounds: 0.01 + 0.09 (1 + cos(pi t / 4)) / 2, t = r - 1
    cosine = [lr_at(r, 0.1, "cosine", lr_min=0.01, horizon=4) for r in range(1, 7)]
    assert cosine == pytest.approx([0.1, 0.086819805, 0.055, 0.023180195, 0.01, 0.01],
                                   abs=1e-9)
    assert lr_at(0, 0.1, "exponential", 0.5) == 0.1  # a message without a round: round 1
    with pytest.raises(ValueError, match="unknown lr schedule 'linear'"):
        lr_at(1, 0.1, "linear")


@pytest.mark.parametrize("name,wd,expected", [
    ("sgd", 0.0, 1.0 - 0.1 * 2.0),           # w - lr g
    ("adam", 0.0, 1.0 - 0.1),                # first Adam step: w - lr g / (|g| + eps)
    ("adam", 0.5, 1.0 - 0.1),                # L2 in the gradient: g = 2 + 0.5 * 1, same sign
    ("adamw", 0.5, 1.0 - 0.1 * 0.5 - 0.1),   # decoupled: w (1 - lr wd), then the Adam step
])
def test_optimizer_first_step_by_hand(name, wd, expected):
    from flower_pfl.learning.training import make_optimizer

    w = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    opt = make_optimizer([w], TrainSpec(lr=0.1, batch_size=1, optimizer=name, weight_decay=wd,
                                        eps=1e-12))
    (2.0 * w).sum().backward()  # gradient 2
    opt.step()
    assert float(w.detach()) == pytest.approx(expected, abs=1e-9)


def _fit_lrs(run_dir):
    with open(run_dir / "fit.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    by_round: dict[int, set[float]] = {}
    for r in rows:
        by_round.setdefault(int(r["round"]), set()).add(float(r["lr"]))
    return by_round


# Adam, cosine from 0.01 to 0.001 over 4 rounds: 0.001 + 0.009 (1 + cos(pi (r - 1) / 4)) / 2
ADAM_COSINE = {0.01: 1, 0.00868198: 2, 0.0055: 3, 0.00231802: 4}


def test_adam_cosine_lr_of_each_round_in_fit_csv_also_across_a_stop_and_resume(tmp_path):
    from flower_pfl.reliability.stop import clear_stop, request_stop

    cfg = small_config(**{**TINY, "clients": 2, "rounds": 4, "strategy": "fedavg",
                          "train.steps": 2, "train.optimizer": "adam", "train.lr": 0.01,
                          "train.lr-schedule": "cosine", "train.lr-min": 0.001,
                          "eval-every": 4})
    expected = {r: lr for lr, r in ADAM_COSINE.items()}
    full, part = tmp_path / "full", tmp_path / "part"
    inprocess.run(cfg, full, client_state_dir=full / "client-state")

    def stop(strategy_obj, r):
        if r == 2:
            request_stop(part)
    inprocess.run(cfg, part, client_state_dir=part / "client-state", on_round=stop)
    assert sorted(_fit_lrs(part)) == [1, 2]  # stopped after round 2
    clear_stop(part)
    inprocess.run(cfg, part, client_state_dir=part / "client-state", resume=True)
    for run in (full, part):
        lrs = _fit_lrs(run)
        assert sorted(lrs) == [1, 2, 3, 4]
        for r, seen in lrs.items():
            assert len(seen) == 1 and seen.pop() == pytest.approx(expected[r], abs=1e-8), r


def test_an_extended_run_keeps_the_schedule_with_a_fixed_horizon(tmp_path):
    """2 rounds, extended to 4: with train.lr-horizon fixed, rounds 3-4 get the lr of an
    uninterrupted 4-round run (exponential needs no horizon; cosine's is 'rounds' unless
    set)."""
    base = {**TINY, "clients": 2, "strategy": "fedavg", "train.steps": 1, "eval-every": 4,
            "train.lr": 0.01, "train.lr-schedule": "cosine", "train.lr-min": 0.001,
            "train.lr-horizon": 4}
    short = tmp_path / "short"
    inprocess.run(small_config(**base, rounds=2), short, client_state_dir=short / "cs")
    inprocess.run(small_config(**base, rounds=4), short, client_state_dir=short / "cs",
                  resume=True)
    lrs = _fit_lrs(short)
    assert {r: seen.pop() for r, seen in lrs.items()} == pytest.approx(
        {r: lr for lr, r in ADAM_COSINE.items()}, abs=1e-8)
