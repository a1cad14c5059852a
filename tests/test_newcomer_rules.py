"""Each method's newcomer rule (clients/*.py ``adapt_newcomer``, declared in its contract's
``Entry.newcomer``; docs/newcomers.md), on the real client with the server's real newcomer
instruction after one round on a small FMNIST subset: the steps by hand in float64 with an
asymmetric start (the trained global model), and what each rule must leave untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.common import parameters_to_ndarrays
from torch.nn import functional as F

from flower_pfl import registry
from flower_pfl.catalog.baselines import DittoFit, PerFedAvgEval
from flower_pfl.clients.base import NEWCOMER_SALT
from flower_pfl.instructions import NewcomerEval
from flower_pfl.learning.models import get_arrays, initial_arrays, model_for
from flower_pfl.learning.training import batches
from flower_pfl.running import inprocess
from tests.conftest import small_config

TINY = {"clients": 4, "fraction-fit": 1.0, "model": "mclr", "data.subsample": 2000,
        "train.steps": 2, "train.lr": 0.1}
NEWCOMER = 2


def newcomer_client(strategy, tmp_path, **changes):
    """(the newcomer's client after setup, the arrays and config the server sends it)."""
    cfg = small_config(strategy=strategy, rounds=1, **{**TINY, **changes},
                       **{"newcomers.clients": [NEWCOMER], "newcomers.budget-steps": 2})
    manager = inprocess.make_federation(cfg["clients"])
    s = inprocess.run(cfg, tmp_path, manager=manager)
    asked = {s.proxy_pid(p): (p, ins) for p, ins in s.configure_evaluate(1, None, manager)}
    proxy, ins = asked[NEWCOMER]
    assert NewcomerEval.from_config(ins.config) == NewcomerEval(True, 2)
    client = registry.client_class(strategy)(proxy.proxy.context)  # TaggedProxy -> node
    client.setup(ins.config)
    return client, parameters_to_ndarrays(ins.parameters), dict(ins.config)


def by_hand(client, start, steps, lr, prox=None):
    """``steps`` SGD steps in float64 on the mean cross-entropy of the client's batches
    (the same seeded order), plus lam/2 ||v - c||^2 where ``prox`` = (lam, c)."""
    model = model_for(client.cfg).double()
    with torch.no_grad():
        for p, a in zip(model.parameters(), start):
            p.copy_(torch.as_tensor(a, dtype=torch.float64))
    x, y = client.data.x_train, client.data.y_train  # x[idx]: a float32 batch
    order = batches(len(y), client.spec.batch_size, steps, client.generator(NEWCOMER_SALT),
                    client.spec.drop_last)
    for idx in order:
        grads = torch.autograd.grad(F.cross_entropy(model(x[idx].double()), y[idx]),
                                    list(model.parameters()))
        with torch.no_grad():
            for i, (p, g) in enumerate(zip(model.parameters(), grads)):
                if prox is not None:
                    g = g + prox[0] * (p - torch.as_tensor(prox[1][i], dtype=torch.float64))
                p -= lr * g
    return [p.detach().numpy() for p in model.parameters()]


def adapted(client, params, config, steps=2):
    return get_arrays(client.adapt_newcomer(client.newcomer_start(params, config), config,
                                            steps))


def test_fedavg_newcomer_is_the_global_model_fine_tuned(tmp_path):
    c, params, config = newcomer_client("fedavg", tmp_path)
    before = get_arrays(c.newcomer_start(params, config))
    assert all(np.array_equal(a, b) for a, b in zip(before, params))  # the global model
    want = by_hand(c, params, 2, c.spec.lr)
    for got, w in zip(adapted(c, params, config), want):
        np.testing.assert_allclose(got, w, atol=2e-6)


def test_ditto_newcomer_two_steps_equal_the_hand_computation(tmp_path):
    c, params, config = newcomer_client("ditto", tmp_path, **{"hyper.ditto.lambda": 3.0})
    lam = DittoFit.from_config(config).lam
    assert lam == 3.0
    want = by_hand(c, params, 2, c.spec.lr, prox=(lam, params))
    got = adapted(c, params, config)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=2e-6)
    plain = by_hand(c, params, 2, c.spec.lr)  # without the prox term it ends elsewhere
    assert max(float(np.abs(g - p).max()) for g, p in zip(got, plain)) > 1e-4


def test_perfedavg_newcomer_steps_at_rate_alpha(tmp_path):
    c, params, config = newcomer_client("perfedavg", tmp_path,
                                        **{"hyper.perfedavg.alpha": 0.01})
    alpha = PerFedAvgEval.from_config(config).alpha
    assert alpha == 0.01 != c.spec.lr
    for g, w in zip(adapted(c, params, config), by_hand(c, params, 2, alpha)):
        np.testing.assert_allclose(g, w, atol=2e-6)


def test_local_newcomer_trains_from_the_initial_model(tmp_path):
    c, params, config = newcomer_client("local", tmp_path)
    assert params == []  # the server holds nothing to give
    start = initial_arrays(c.cfg)
    assert all(np.array_equal(a, b) for a, b in
               zip(get_arrays(c.newcomer_start(params, config)), start))
    for g, w in zip(adapted(c, params, config), by_hand(c, start, 2, c.spec.lr)):
        np.testing.assert_allclose(g, w, atol=2e-6)


@pytest.mark.parametrize("strategy", ["fedrep", "plgu-grep"])
def test_fedrep_newcomer_changes_only_the_head(tmp_path, strategy):
    c, params, config = newcomer_client(strategy, tmp_path, model="dnn")
    start = c.newcomer_start(params, config)
    head, body = c.split(start)
    before = get_arrays(start)
    assert [before[i] for i in body] and all(
        np.array_equal(before[i], a) for i, a in zip(body, params))  # the global body
    after = adapted(c, params, config)
    assert all(np.array_equal(before[i], after[i]) for i in body)  # bytes equal
    assert all(float(np.abs(before[i] - after[i]).max()) > 1e-5 for i in head)


def test_apfl_newcomer_learns_v_and_alpha_against_the_fixed_global_model(tmp_path):
    """Two APFL steps by hand in float64 from v = w*, alpha = alpha-init (0.3): each step
    v -= lr alpha grad f(vbar), alpha -= alpha_lr <grad f(vbar), v - w*>, w* fixed; the
    result alpha v + (1 - alpha) w*."""
    from flower_pfl.catalog.baselines import APFLInstruction

    c, params, config = newcomer_client("apfl", tmp_path, **{"hyper.apfl.alpha-init": 0.3,
                                                              "hyper.apfl.alpha-lr": 0.5})
    sent = APFLInstruction.from_config(config)
    assert (sent.alpha_init, sent.alpha_lr) == (0.3, 0.5)
    model = model_for(c.cfg).double()
    names = [n for n, _ in model.named_parameters()]
    w = [torch.as_tensor(a, dtype=torch.float64) for a in params]
    v, alpha = [t.clone() for t in w], 0.3
    x, y = c.data.x_train, c.data.y_train
    for idx in batches(len(y), c.spec.batch_size, 2, c.generator(NEWCOMER_SALT),
                       c.spec.drop_last):
        vbar = [(alpha * a + (1 - alpha) * b).requires_grad_(True) for a, b in zip(v, w)]
        out = torch.func.functional_call(model, dict(zip(names, vbar)), (x[idx].double(),))
        g = torch.autograd.grad(F.cross_entropy(out, y[idx]), vbar)
        d_alpha = sum(float((gi * (a - b)).sum()) for gi, a, b in zip(g, v, w))
        v = [a - c.spec.lr * alpha * gi for a, gi in zip(v, g)]
        alpha = min(1.0, max(0.0, alpha - sent.alpha_lr * d_alpha))
    want = [(alpha * a + (1 - alpha) * b).numpy() for a, b in zip(v, w)]
    got = adapted(c, params, config)
    for g_, w_ in zip(got, want):
        np.testing.assert_allclose(g_, w_, atol=2e-6)
    assert max(float(np.abs(g_ - p).max()) for g_, p in zip(got, params)) > 1e-4


def test_pfedme_newcomer_solves_its_inner_problem_around_the_global_model(tmp_path):
    from flower_pfl.catalog.pfedbred import PFedBreDFit

    c, params, config = newcomer_client("pfedme", tmp_path, **{
        "train.steps": None, "train.lr": 0.05,  # pFedMe's own solver: refused otherwise
        "hyper.pfedme.lambda": 5.0, "hyper.pfedme.alpha": 0.02,
        "hyper.pfedme.local-iterations": 2, "hyper.pfedme.prox-steps": 1})
    sent = PFedBreDFit.from_config(config)
    assert (sent.lam, sent.alpha) == (5.0, 0.02) and sent.alpha != c.spec.lr
    want = by_hand(c, params, 2, sent.alpha, prox=(sent.lam, params))
    got = adapted(c, params, config)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=2e-6)
    plain = by_hand(c, params, 2, sent.alpha)  # without the prox term it ends elsewhere
    assert max(float(np.abs(g - p).max()) for g, p in zip(got, plain)) > 1e-5
