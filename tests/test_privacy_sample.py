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


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_ghost_clipping_equals_opacus_per_sample_gradients_on_a_mlp():
    # the clipped mean dp_train steps with (two backward passes, norms without per-sample
    # gradients) against opacus' per-sample-gradient DP-SGD ("hooks") on the same batch:
    # an asymmetric MLP, a clip that cuts some samples and not others, no noise
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    def mlp():
        torch.manual_seed(3)
        return nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(9, 5, generator=g) * torch.arange(1, 10.0)[:, None], \
        torch.randint(0, 3, (9,), generator=g)
    spec = TrainSpec(lr=0.5, batch_size=16)  # q = 1: all 9 samples in the step
    ghost = mlp()
    dp_train(ghost, x, y, spec, torch.Generator().manual_seed(0), torch.device("cpu"),
             0.0, 2.5, num_steps=1)
    ref = mlp()
    gsm = GradSampleModule(ref, loss_reduction="mean")
    opt = DPOptimizer(torch.optim.SGD(ref.parameters(), lr=0.5), noise_multiplier=0.0,
                      max_grad_norm=2.5, expected_batch_size=9)
    nn.functional.cross_entropy(gsm(x), y).backward()
    norms = torch.stack([p.grad_sample.flatten(1).norm(dim=1) for p in ref.parameters()],
                        1).norm(dim=1)
    assert (norms > 2.5).any() and (norms < 2.5).any()  # both branches of the clip
    opt.step()
    gsm._close()
    for a, b in zip(ghost.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not hasattr(next(ghost.parameters()), "_norm_sample")  # opacus' state removed


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_the_norm_pass_computes_no_weight_gradient():
    # pass 1 needs each layer's output gradient only (its ghost norms): a weight's gradient
    # is computed once a step (pass 2), a bias's twice (pass 1 reaches each layer through it)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    calls = dict.fromkeys((name for name, _ in model.named_parameters()), 0)
    for name, p in model.named_parameters():
        p.register_hook(lambda g, name=name: calls.__setitem__(name, calls[name] + 1))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 5, generator=g), torch.randint(0, 3, (6,), generator=g)
    dp_train(model, x, y, TrainSpec(lr=0.1, batch_size=16), torch.Generator().manual_seed(0),
             torch.device("cpu"), 0.0, 1.0, num_steps=3)
    assert calls == {"0.weight": 3, "0.bias": 6, "2.weight": 3, "2.bias": 6}


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
    assert sl.epsilon(stored, 1e-3) == ref.get_epsilon(1e-3)  # bit for bit
    assert sl.epsilon([], 1e-3) == 0.0
    # a history of several (z, q): opacus' sum over its entries, from the cached curves
    mixed = [(1.1, 0.05, 60), (0.9, 0.031, 7), (1.1, 0.05, 3)]
    ref.history = list(mixed)
    before = sl.step_rdp.cache_info()
    assert sl.epsilon(mixed, 1e-5) == ref.get_epsilon(1e-5)
    assert sl.step_rdp.cache_info().hits >= before.hits + 2  # (1.1, 0.05) computed once


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
    for row in fits:  # each client's ε: opacus' accountant for its own q and steps, at the
        n = int(row["num-examples"])  # default δ of its n examples: min(1/(10 n), 1e-5)
        ref = RDPAccountant()
        ref.history = [(1.0, min(1.0, 32 / n), int(float(row["local_steps"])))]
        assert float(row["dp_delta"]) == min(1 / (10 * n), 1e-5)
        assert float(row["dp_epsilon"]) == pytest.approx(ref.get_epsilon(float(row["dp_delta"])),
                                                         rel=1e-9)
    with open(tmp_path / "server.csv", newline="") as fh:
        server = list(csv.DictReader(fh))
    assert float(server[0]["epsilon_max"]) == pytest.approx(
        max(float(r["dp_epsilon"]) for r in fits), abs=1e-6)


def test_lean_dp_step_moves_the_clipped_sum_and_adds_the_noise_once():
    # asymmetric clipped sum, expected batch size 2: grad = (S + N(0, (z C)^2)) / 2 with
    # the noise opacus would draw from the same seed; S moved into summed_grad, not copied
    from flower_pfl.learning.dp_optimizer import LeanDPOptimizer

    p = nn.Parameter(torch.zeros(3))
    opt = LeanDPOptimizer(torch.optim.SGD([p], lr=1.0), noise_multiplier=1.5,
                          max_grad_norm=0.5, expected_batch_size=2, loss_reduction="mean")
    s = torch.tensor([1.0, -2.0, 3.0])
    p.grad = s
    torch.manual_seed(0)
    assert opt.pre_step()
    assert p.summed_grad is s
    torch.manual_seed(0)
    noise = torch.normal(0.0, 0.75, (3,))
    assert torch.equal(p.grad, (s + noise) / 2)
    opt.original_optimizer.step()
    torch.testing.assert_close(p.detach(), -(s + noise) / 2)
    opt.zero_grad(set_to_none=True)  # the next step gets a fresh sum
    assert p.summed_grad is None and p.grad is None


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_lean_dp_training_equals_opacus_optimizer_bit_for_bit(monkeypatch):
    # six Poisson-sampled DP-SGD steps with noise, a clip that cuts some samples: the lean
    # step and opacus' own DPOptimizerFastGradientClipping give the same model bit for bit
    from opacus.optimizers import DPOptimizerFastGradientClipping

    from flower_pfl.learning import dp_optimizer

    def trained():
        torch.manual_seed(3)
        model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
        g = torch.Generator().manual_seed(1)
        x = torch.randn(40, 5, generator=g) * torch.linspace(0.5, 4.0, 40)[:, None]
        y = torch.randint(0, 3, (40,), generator=g)
        torch.manual_seed(7)  # opacus draws its noise from torch's generator
        dp_train(model, x, y, TrainSpec(lr=0.3, batch_size=8),
                 torch.Generator().manual_seed(0), torch.device("cpu"), 1.3, 0.7,
                 num_steps=6)
        return [p.detach().clone() for p in model.parameters()]

    lean = trained()
    monkeypatch.setattr(dp_optimizer, "LeanDPOptimizer", DPOptimizerFastGradientClipping)
    stock = trained()
    assert all(torch.equal(a, b) for a, b in zip(lean, stock))
    torch.manual_seed(3)
    assert not torch.equal(lean[0], nn.Linear(5, 4).weight)  # it trained
