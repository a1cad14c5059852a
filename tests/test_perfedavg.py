"""Per-FedAvg: FO/HF meta-gradients by hand, distinct mini-batches, personalization step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import flower_pfl.clients.perfedavg as client_module
from flower_pfl.algorithms.baselines_math import hvp_finite_difference, perfedavg_direction
from flower_pfl.config import ConfigError
from flower_pfl.running import inprocess
from tests.conftest import small_config
from tests.test_baselines import TINY


def _tiny():
    torch.manual_seed(1)
    model = torch.nn.Linear(3, 2)
    data = [(torch.randn(4, 3), torch.randint(0, 2, (4,))) for _ in range(3)]
    return model, data


def _grad(model, params, x, y, create_graph=False):
    out = x @ params[0].T + params[1]
    return torch.autograd.grad(F.cross_entropy(out, y), params, create_graph=create_graph)


def test_fo_direction_is_the_outer_gradient_at_the_inner_step():
    model, data = _tiny()
    alpha = 0.3
    w = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    g1 = _grad(model, w, *data[0])
    w_tmp = [(p - alpha * g).detach().requires_grad_(True) for p, g in zip(w, g1)]
    expected = _grad(model, w_tmp, *data[1])
    got, _ = perfedavg_direction(model, data[:2], alpha, "fo", F.cross_entropy)
    for a, b in zip(got, expected):
        assert torch.allclose(a, b, atol=1e-6)
    # the inner and outer batches matter: using D for both gives another direction
    same, _ = perfedavg_direction(model, [data[0], data[0]], alpha, "fo", F.cross_entropy)
    assert max(float((a - b).abs().max()) for a, b in zip(same, got)) > 1e-4


def test_hf_direction_is_the_exact_hessian_correction():
    model, data = _tiny()
    alpha = 0.3
    w = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    g1 = _grad(model, w, *data[0])
    w_tmp = [(p - alpha * g).detach().requires_grad_(True) for p, g in zip(w, g1)]
    g_out = [g.detach() for g in _grad(model, w_tmp, *data[1])]
    # exact H(w; D'') g_out by double backprop
    g3 = _grad(model, w, *data[2], create_graph=True)
    hv = torch.autograd.grad(sum((a * b).sum() for a, b in zip(g3, g_out)), w)
    expected = [g - alpha * h for g, h in zip(g_out, hv)]
    got, _ = perfedavg_direction(model, data, alpha, "hf", F.cross_entropy, delta=1e-3)
    for a, b in zip(got, expected):
        assert torch.allclose(a, b, atol=1e-4)
    fo, _ = perfedavg_direction(model, data[:2], alpha, "fo", F.cross_entropy)
    assert max(float((a - b).abs().max()) for a, b in zip(fo, got)) > 1e-4  # HF term is there
    finite = hvp_finite_difference(model, [p.detach() for p in w], g_out, *data[2],
                                   F.cross_entropy, 1e-3)
    for a, b in zip(finite, hv):
        assert torch.allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("variant,per_step", [("fo", 2), ("hf", 3)])
def test_client_uses_distinct_batches_per_meta_step(tmp_path, monkeypatch, variant, per_step):
    seen = []
    real = client_module.perfedavg_step

    def spy(model, batches, *args, **kwargs):
        seen.append([b[1].clone() for b in batches])  # labels identify the batch contents
        seen[-1].append([b[0].sum().item() for b in batches])
        return real(model, batches, *args, **kwargs)

    monkeypatch.setattr(client_module, "perfedavg_step", spy)
    cfg = small_config(strategy="perfedavg", rounds=1, **TINY,
                       **{"hyper.perfedavg.variant": variant})
    inprocess.run(cfg, tmp_path)
    assert seen and all(len(s) == per_step + 1 for s in seen)
    for s in seen:
        sums = s[-1]
        assert len(set(round(v, 3) for v in sums)) == per_step  # D, D' (, D'') differ


def test_personalized_eval_is_global_plus_train_steps_and_both_are_reported(tmp_path):
    import csv

    cfg = small_config(strategy="perfedavg", rounds=2, **TINY,
                       **{"hyper.perfedavg.alpha": 0.05, "hyper.perfedavg.personal-steps": 5})
    inprocess.run(cfg, tmp_path)
    with open(tmp_path / "clients.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r["round"] == "2"]
    assert len(rows) == 4
    # the personalized model is not the global model (adapted on the client's train data)
    assert any(r["accuracy"] != r["global_accuracy"] for r in rows), rows


def test_alpha_zero_is_rejected():
    with pytest.raises(ConfigError, match="alpha = 0 is FedAvg"):
        small_config(strategy="perfedavg", **{"hyper.perfedavg.alpha": 0.0})


def _meta_fit_by_hand(w0, x, y, groups, alpha, beta, variant):
    """Algorithm 1's local loop in float64 with plain autograd: for each group of batches
    (D, D'[, D'']), w <- w - beta (g' - [alpha H'' g']) with g' = grad f(w - alpha grad f(w; D);
    D') and H'' g' the exact Hessian-vector product on D'' (double backprop)."""
    x = x.flatten(1).double()
    w = [torch.tensor(a, dtype=torch.float64) for a in w0]  # MCLR: fc.weight, fc.bias

    def grad(params, idx, create_graph=False):
        params = [p if p.requires_grad else p.detach().requires_grad_(True) for p in params]
        loss = F.cross_entropy(x[idx] @ params[0].T + params[1], y[idx])
        return list(torch.autograd.grad(loss, params, create_graph=create_graph)), params

    for group in groups:
        g_in, _ = grad(w, group[0])
        g_out, _ = grad([p - alpha * g for p, g in zip(w, g_in)], group[1])
        direction = [g.detach() for g in g_out]
        if variant == "hf":
            g3, leaf = grad([p.clone().requires_grad_(True) for p in w], group[2],
                            create_graph=True)
            hv = torch.autograd.grad(sum((a * b).sum() for a, b in zip(g3, direction)), leaf)
            direction = [d - alpha * h for d, h in zip(direction, hv)]
        w = [(p - beta * d).detach() for p, d in zip(w, direction)]
    return [p.numpy() for p in w]


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_client_fit_moves_w_by_minus_beta_times_the_meta_gradient(variant):
    """The real client's fit on real FMNIST data: two meta-updates of MCLR, each exactly
    w - beta * (the FO or HF meta-gradient on its own consecutive batches D, D'[, D''])."""
    from flower_pfl.clients.perfedavg import PerFedAvgClient
    from flower_pfl.learning.models import initial_arrays
    from flower_pfl.learning.training import batches
    from tests.test_baselines import make_client

    alpha, beta, steps, size = 0.5, 0.3, 2, 16
    cfg = small_config(strategy="perfedavg", **TINY, **{
        "train.lr": beta, "train.steps": steps, "train.batch-size": size,
        "hyper.perfedavg.variant": variant, "hyper.perfedavg.alpha": alpha})
    client = make_client(PerFedAvgClient, pid=1)
    w0 = initial_arrays(cfg)
    got, _, metrics = client.fit([a.copy() for a in w0], {
        "cfg": cfg.to_json(), "round": 1, "variant": variant, "alpha": alpha, "delta": 1e-4})
    assert metrics["local_steps"] == steps
    # the client's seeded mini-batch order, cut into groups of 2 (FO) or 3 (HF) batches
    per = 2 if variant == "fo" else 3
    order = list(batches(client.data.num_train, size, steps * per, client.generator(),
                         client.spec.drop_last))
    groups = [order[i:i + per] for i in range(0, len(order), per)]
    x, y = client.data.x_train[:], client.data.y_train
    expected = _meta_fit_by_hand(w0, x, y, groups, alpha, beta, variant)
    error = max(float(np.abs(a - b).max()) for a, b in zip(got, expected))
    # what the client would upload with plain SGD on D, and with the other variant
    sgd = _meta_fit_by_hand(w0, x, y, [[g[0], g[0]] for g in groups], 0.0, beta, "fo")
    other = (_meta_fit_by_hand(w0, x, y, [g + [g[1]] for g in groups], alpha, beta, "hf")
             if variant == "fo" else _meta_fit_by_hand(w0, x, y, groups, alpha, beta, "fo"))
    gap_sgd = max(float(np.abs(a - b).max()) for a, b in zip(sgd, expected))
    gap_other = max(float(np.abs(a - b).max()) for a, b in zip(other, expected))
    tol = 1e-5 if variant == "fo" else 5e-4  # HF: the client's finite-difference product
    assert error < tol, (error, gap_sgd, gap_other)
    assert gap_sgd > 100 * tol and gap_other > 100 * tol, (error, gap_sgd, gap_other)


def test_personal_steps_are_sgd_at_alpha_not_at_the_training_lr(tmp_path):
    """Per-FedAvg-P by hand with alpha (0.02) != train.lr (0.3): the server's evaluation
    instructions carry alpha and the step count, and the client's personalized model is
    the global model after that many SGD steps of size alpha on its seeded training
    batches (salt 1), in float64 by hand."""
    from flower_pfl.clients.perfedavg import PerFedAvgClient
    from flower_pfl.learning.training import batches
    from flower_pfl.strategies.perfedavg import PerFedAvg
    from tests.test_baselines import make_client

    alpha, lr, steps, size = 0.02, 0.3, 3, 16
    cfg = small_config(strategy="perfedavg", **TINY, **{
        "train.lr": lr, "train.batch-size": size, "hyper.perfedavg.alpha": alpha,
        "hyper.perfedavg.personal-steps": steps})
    s = PerFedAvg(cfg, results_dir=tmp_path)
    s.initialize_parameters(None)
    w0, extra = s.eval_payload(1, 1)
    assert extra["alpha"] == alpha and extra["personal-steps"] == steps
    client = make_client(PerFedAvgClient, pid=1)
    config = {"cfg": cfg.to_json(), "round": 1, **extra}
    client.setup(config)
    got = [p.detach().numpy() for p in client.personal_model(list(w0), config).parameters()]
    order = list(batches(client.data.num_train, size, steps, client.generator(salt=1),
                         client.spec.drop_last))

    def by_hand(step):
        w = [torch.tensor(a, dtype=torch.float64) for a in w0]
        for idx in order:
            leaf = [p.clone().requires_grad_(True) for p in w]
            xb = client.data.x_train[idx].flatten(1).double()
            loss = F.cross_entropy(xb @ leaf[0].T + leaf[1], client.data.y_train[idx])
            w = [p - step * g for p, g in zip(w, torch.autograd.grad(loss, leaf))]
        return [p.numpy() for p in w]

    want, at_lr = by_hand(alpha), by_hand(lr)
    error = max(float(np.abs(a - b).max()) for a, b in zip(got, want))
    gap = max(float(np.abs(a - b).max()) for a, b in zip(want, at_lr))
    assert error < 1e-5 and gap > 1e3 * error + 1e-3, (error, gap)
