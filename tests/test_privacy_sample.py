"""Sample-level DP (DP-SGD with opacus in the client): per-sample clipping on a hand-computed
input, the per-client ε against opacus' accountant, one real round on the DNN."""

from __future__ import annotations

import csv

import pytest
import torch
from opacus.accountants import RDPAccountant
from torch import nn

from flower_pfl.learning.training import TrainSpec, dp_train
from flower_pfl.privacy import sample_level as sl


def squared(out, y):
    return ((out.squeeze(1) - y) ** 2).mean()


def one_step(noise: float):
    model = nn.Linear(2, 1, bias=False)
    nn.init.zeros_(model.weight)
    x = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    y = torch.tensor([1.0, 0.1])
    spec = TrainSpec(lr=1.0, batch_size=8)  # >= n: q = 1, both samples every step
    out, q = dp_train(model, x, y, spec, torch.Generator().manual_seed(0), torch.device("cpu"),
                      noise, 1.0, num_steps=1, loss_fn=squared)
    return model.weight.detach().flatten(), out, q


def test_per_sample_clipping_hand_computed():
    # at w = 0 the per-sample gradients are -2 y x: (-6, -8) (norm 10, clipped to 1:
    # (-0.6, -0.8)) and (-0.2, 0) (inside); their mean (-0.4, -0.4); one step of lr 1
    w, out, q = one_step(0.0)
    assert q == 1.0 and out["local_steps"] == 1.0
    torch.testing.assert_close(w, torch.tensor([0.4, 0.4]))


def test_dp_sgd_noise_moves_the_step():
    torch.manual_seed(0)  # opacus draws its noise from torch's generator
    w, _, _ = one_step(5.0)  # std 5 x 1 / 2 per coordinate on the mean
    assert (w - torch.tensor([0.4, 0.4])).abs().max() > 0.05


def test_per_client_epsilon_is_opacus_accountant_over_all_rounds():
    history = sl.extend([], 1.1, 0.05, 30)
    history = sl.extend(history, 1.1, 0.05, 30)  # a second round: one entry, 60 steps
    assert history == [(1.1, 0.05, 60)]
    stored = sl.history_of(sl.stored(history))
    ref = RDPAccountant()
    for _ in range(60):
        ref.step(noise_multiplier=1.1, sample_rate=0.05)
    assert sl.epsilon(stored, 1e-3) == pytest.approx(ref.get_epsilon(1e-3), rel=1e-12)
    assert sl.epsilon([], 1e-3) == 0.0


@pytest.mark.slow
def test_sample_level_one_round_on_the_dnn(tmp_path):
    from flower_pfl.running.inprocess import try_strategy

    strategy = try_strategy("fedavg", rounds=1, results_dir=tmp_path, overrides={
        "privacy.mode": "sample-level", "privacy.noise-multiplier": 1.0,
        "privacy.max-grad-norm": 1.0})
    assert strategy.results.status == "completed"
    with open(tmp_path / "fit.csv", newline="") as fh:
        fits = list(csv.DictReader(fh))
    assert len(fits) == 4
    for row in fits:  # each client's ε: opacus' accountant for its own q and steps
        n = int(row["num-examples"])
        ref = RDPAccountant()
        ref.history = [(1.0, min(1.0, 32 / n), int(float(row["local_steps"])))]
        assert float(row["dp_epsilon"]) == pytest.approx(ref.get_epsilon(1.0 / n), rel=1e-9)
    with open(tmp_path / "server.csv", newline="") as fh:
        server = list(csv.DictReader(fh))
    assert float(server[0]["epsilon_max"]) == pytest.approx(
        max(float(r["dp_epsilon"]) for r in fits), abs=1e-6)
