"""Prox terms as a fused gradient update (issue 29): bit for bit the autograd result.

``prox.Prox`` adds coef * (w - c) to the data loss's gradient after its backward pass
(``add_prox_grad_``); the reference is today's autograd path, the same term added to the
loss as a plain regularizer callable (``prox_penalty``).  Every comparison is
``torch.equal`` on real FMNIST batches and models, over several SGD steps, with and
without momentum / weight decay; each case also checks that the prox term moved the
result (coef matters), so a fused update that did nothing would fail.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from flower_pfl.algorithms.prox import PROX_VALUE_EVERY, Prox, add_prox_grad_, prox_penalty
from flower_pfl.learning.client_data import load_client_data
from flower_pfl.learning.models import model_for
from flower_pfl.learning.training import TrainSpec, params_of, train
from tests.conftest import small_config
from tests.test_baselines import TINY, state_arrays

COEFS = (0.7, 1.0 / 3.0, 15.0, 1.0)  # FedProx's mu, an inexact float32, FedAMP's
# lambda/alpha_k, FedProx's default mu (the multiply pass skipped)


def _data(model="dnn"):
    cfg = small_config(strategy="fedavg", **{**TINY, "model": model})
    data = load_client_data(cfg.values, 0)
    return cfg, data.x_train, data.y_train


def _model(cfg, seed=0):
    torch.manual_seed(seed)
    return model_for(cfg)


def _moved_center(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [p.detach() + 0.05 * torch.randn(p.shape, generator=g) for p in model.parameters()]


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def _gap(a, b):
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


@pytest.mark.parametrize("model", ["dnn", "cnn"])
@pytest.mark.parametrize("coef", COEFS)
def test_prox_gradient_equals_autograd_bit_for_bit(model, coef):
    cfg, x, y = _data(model)
    net = _model(cfg)
    center = _moved_center(net)
    xb, yb = x[:10], y[:10]
    (F.cross_entropy(net(xb), yb) + prox_penalty(net, center, coef)).backward()
    want = [p.grad.clone() for p in net.parameters()]
    net.zero_grad(set_to_none=True)
    F.cross_entropy(net(xb), yb).backward()
    value = add_prox_grad_(list(net.parameters()), center, coef, value=True)
    assert _same([p.grad for p in net.parameters()], want)
    assert value == pytest.approx(float(prox_penalty(net, center, coef).detach()), rel=1e-5)
    # on autograd.grad's output (pFedMe's prox steps) instead of .grad
    params = list(net.parameters())
    grads = list(torch.autograd.grad(F.cross_entropy(net(xb), yb), params))
    add_prox_grad_(params, center, coef, grads)
    assert _same(grads, want)
    # switched off (coef 0): the data gradient alone, which differs
    net.zero_grad(set_to_none=True)
    F.cross_entropy(net(xb), yb).backward()
    add_prox_grad_(params, center, 0.0)
    assert _gap([p.grad for p in params], want) > 1e-3 * min(coef, 1.0)


def test_a_parameter_without_data_gradient_gets_the_prox_gradient_alone():
    net = torch.nn.Linear(3, 2)
    unused = torch.nn.Parameter(torch.randn(4))
    params = list(net.parameters()) + [unused]
    center = [p.detach() + 0.3 for p in params]
    net(torch.randn(5, 3)).square().sum().backward()
    add_prox_grad_(params, center, 7.0)
    torch.testing.assert_close(unused.grad, 7.0 * (unused.detach() - center[-1]), rtol=0, atol=0)


def _train(cfg, x, y, regularizer, momentum=0.0, weight_decay=0.0, steps=12, start=None):
    net = _model(cfg)
    if start is not None:
        with torch.no_grad():
            for p, s in zip(net.parameters(), start):
                p.copy_(s)
    spec = TrainSpec(lr=0.05, batch_size=10, momentum=momentum, weight_decay=weight_decay)
    reg = regularizer(net) if callable(regularizer) and not isinstance(regularizer, Prox) \
        else regularizer
    out = train(net, x, y, spec, torch.Generator().manual_seed(3), torch.device("cpu"),
                regularizer=reg, num_steps=steps)
    return params_of(net), out


@pytest.mark.parametrize("model", ["dnn", "cnn"])
@pytest.mark.parametrize("momentum,weight_decay", [(0.0, 0.0), (0.9, 5e-4)])
@pytest.mark.parametrize("coef", COEFS)
def test_train_with_prox_equals_the_autograd_term_over_steps(model, momentum, weight_decay,
                                                             coef):
    cfg, x, y = _data(model)
    center = _moved_center(_model(cfg))  # w_0 != c: the term acts from the first step
    fused, m_fused = _train(cfg, x, y, Prox(center, coef), momentum, weight_decay)
    values = []

    def autograd_term(m):  # today's path; records the term's value at every step
        reg = prox_penalty(m, center, coef)
        values.append(float(reg.detach()))
        return reg

    old, m_old = _train(cfg, x, y, lambda net: autograd_term, momentum, weight_decay)
    assert _same(fused, old)
    assert m_fused["train_loss"] == m_old["train_loss"]
    sampled = values[::PROX_VALUE_EVERY]  # reg_loss: the term at every 10th step
    assert len(sampled) == 2 and m_fused["reg_loss"] == pytest.approx(
        sum(sampled) / len(sampled), rel=1e-5)
    off, _ = _train(cfg, x, y, None, momentum, weight_decay)
    assert _gap(fused, off) > 1e-4  # the prox term mattered


def test_train_never_builds_the_autograd_term_of_a_prox():
    """The fused path is what runs: a Prox whose autograd term raises still trains."""
    class NoAutograd(Prox):
        def __call__(self, model):
            raise AssertionError("prox term differentiated by autograd")

    cfg, x, y = _data("dnn")
    center = _moved_center(_model(cfg))
    fused, _ = _train(cfg, x, y, NoAutograd(center, 0.7), steps=3)
    assert _same(fused, _train(cfg, x, y, Prox(center, 0.7), steps=3)[0])


def _autograd_train(monkeypatch):
    """Route clients/base.py's ``train`` through today's autograd path (Prox -> callable)."""
    import flower_pfl.clients.base

    def old_train(model, *args, regularizer=None, **kwargs):
        if isinstance(regularizer, Prox):
            prox = regularizer
            regularizer = lambda m: prox_penalty(m, prox.center, prox.coef)  # noqa: E731
        return train(model, *args, regularizer=regularizer, **kwargs)

    monkeypatch.setattr(flower_pfl.clients.base, "train", old_train)


def _fit(cls, config, arrays=None, state=None):
    from flwr.app import Context, RecordDict

    from flower_pfl.learning.models import initial_arrays

    cfg = small_config(strategy=config.pop("strategy"),
                       **{**TINY, "model": "dnn", "train.batch-size": 10, "train.lr": 0.05})
    ctx = Context(run_id=0, node_id=1, node_config={"partition-id": 1},
                  state=state if state is not None else RecordDict(), run_config={})
    arrays = arrays if arrays is not None else initial_arrays(cfg)
    out, _, metrics = cls(ctx).fit(arrays, {"cfg": cfg.to_json(), "round": 1, **config})
    return out, metrics, ctx.state


def _client_case(name):
    from flower_pfl.clients.ditto import DittoClient
    from flower_pfl.clients.fedamp import FedAMPClient
    from flower_pfl.clients.fedprox import FedProxClient

    return {"fedamp": (FedAMPClient, "prox-coef", {"strategy": "fedamp"}),
            "fedprox": (FedProxClient, "mu", {"strategy": "fedprox"}),
            "ditto": (DittoClient, "lambda", {"strategy": "ditto", "personal-steps": 0})}[name]


@pytest.mark.parametrize("name", ["fedamp", "fedprox", "ditto"])
def test_client_round_equals_the_autograd_prox_term(name, monkeypatch):
    """A real client's round (the DNN, batch 10; the centre is the model received: FedAMP's
    u_i, FedProx's / Ditto's w^t; Ditto's v_i starts away from it): the upload -- and
    Ditto's personal model v_i -- bit for bit today's, and not the round without the term."""
    import numpy as np
    from flwr.app import RecordDict

    cls, key, extra = _client_case(name)
    coef = 15.0 if name == "fedamp" else 0.7

    def run(c):
        state = RecordDict()
        if name == "ditto":  # v_i from an accepted previous round, away from w^t
            _, _, state = _fit(cls, {**extra, key: c})
        out, metrics, state = _fit(cls, {**extra, key: c, "round": 2, "accepted-round": 1},
                                   state=state)
        models = [out]
        if name == "ditto":
            models.append(state_arrays(state, "ditto-v"))
        return models, metrics

    fused, m_fused = run(coef)
    with monkeypatch.context() as mp:
        _autograd_train(mp)
        old, m_old = run(coef)
    off, _ = run(1e-30)  # the term effectively off
    for a, b in zip(fused, old):
        assert all(np.array_equal(u, v) for u, v in zip(a, b))
    assert m_fused["train_loss"] == m_old["train_loss"]
    moved = fused[-1]  # the model trained with the prox term (Ditto: v_i)
    assert max(float(np.abs(u - v).max()) for u, v in zip(moved, off[-1])) > 1e-4


# ------------------------------------------------------------------ pFedMe's prox steps
def _prox_steps_autograd(model, mu, lam, alpha, steps, xb, yb):
    """pFedBreD/pFedMe line 8 as written before issue 29 (algorithms/pfedbred_math.py)."""
    params = list(model.parameters())
    for _ in range(steps):
        loss = F.cross_entropy(model(xb), yb) + prox_penalty(model, mu, lam)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(alpha * g)


def _prox_steps_fused(model, mu, lam, alpha, steps, xb, yb):
    """The same with the prox gradient added by ``add_prox_grad_``."""
    params = list(model.parameters())
    for _ in range(steps):
        grads = list(torch.autograd.grad(F.cross_entropy(model(xb), yb), params))
        add_prox_grad_(params, mu, lam, grads)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(alpha * g)


@pytest.mark.parametrize("lam", [15.0, 1.0 / 3.0])
def test_pfedme_prox_steps_fused_equal_autograd(lam):
    cfg, x, y = _data("dnn")
    start = _model(cfg)
    mu = _moved_center(start)
    xb, yb = x[:20], y[:20]

    def run(fn, lam_):
        net = _model(cfg)
        fn(net, mu, lam_, 0.01, 5, xb, yb)
        return params_of(net)

    fused = run(_prox_steps_fused, lam)
    assert _same(fused, run(_prox_steps_autograd, lam))
    assert _gap(fused, run(_prox_steps_fused, 0.0)) > 1e-5
    from flower_pfl.algorithms import pfedbred_math

    net = _model(cfg)  # the project's own function, whichever way it computes the term
    pfedbred_math.prox_steps(net, mu, lam, 0.01, 5, xb, yb, F.cross_entropy)
    assert _same(params_of(net), fused)
    assert math.isfinite(float(fused[0].sum()))
