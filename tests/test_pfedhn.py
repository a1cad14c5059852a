"""pFedHN's server step on asymmetric input, by hand: two clients with unequal deltas,
hn-lr != embed-lr != 1, so a summed instead of averaged phi-gradient, a flipped sign or the
two step sizes swapped changes the numbers (the other pFedHN tests:
tests/test_plgu_grep_ghn.py)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from flower_pfl.running import inprocess
from flower_pfl.strategies.base import ClientUpdate
from tests.conftest import small_config


def test_server_step_is_the_mean_phi_gradient_and_each_own_v_gradient_by_hand(tmp_path):
    from flower_pfl.strategies.pfedhn import PFedHN

    hn_lr, embed_lr = 0.5, 0.2
    cfg = small_config(strategy="pfedhn", clients=4, model="mclr", **{
        "data.subsample": 2000, "hyper.pfedhn.hn-lr": hn_lr, "hyper.pfedhn.embed-lr": embed_lr,
        "hyper.pfedhn.hidden": 8, "hyper.pfedhn.embed-dim": 4})
    s = PFedHN(cfg, results_dir=tmp_path)
    s.initialize_parameters(inprocess.make_federation(4))
    hn0 = copy.deepcopy(s.hn)
    pids, shifts = (1, 3), (0.02, -0.06)  # client deltas theta~ - theta, unequal
    v0 = {p: torch.as_tensor(s.store.get("embedding", p).copy()) for p in pids}
    idle = s.store.get("embedding", 0).copy()  # client 0 is not in the round
    thetas = {p: s.spec.flatten(s.generate(p)) for p in pids}
    trained = {p: thetas[p] + d for p, d in zip(pids, shifts)}
    s.aggregate_updates(1, [ClientUpdate(p, s.spec.unflatten(trained[p].astype(np.float32)),
                                         10 * (1 + k), {}) for k, p in enumerate(pids)])
    # by hand: g_i = grad of <h(v_i; phi), theta_i - theta~_i> (the difference held fixed)
    grads, grads_v = [], {}
    for p in pids:
        v = v0[p].clone().requires_grad_(True)
        theta = hn0(v)
        inner = (theta * torch.as_tensor(thetas[p] - trained[p], dtype=theta.dtype)).sum()
        g = torch.autograd.grad(inner, list(hn0.parameters()) + [v])
        grads.append(g[:-1])
        grads_v[p] = g[-1]
    for k, (p0, p1) in enumerate(zip(hn0.parameters(), s.hn.parameters())):
        want = p0.detach() - hn_lr * (grads[0][k] + grads[1][k]) / 2
        torch.testing.assert_close(p1.detach(), want, rtol=1e-5, atol=1e-7)
    # the output bias (the shared part of every theta_i) moves by hn-lr * the mean delta
    bias0, bias1 = hn0.out.bias.detach().numpy(), s.hn.out.bias.detach().numpy()
    assert bias1 - bias0 == pytest.approx(np.full(bias0.shape, hn_lr * np.mean(shifts)),
                                          abs=1e-6)
    for p in pids:
        np.testing.assert_allclose(s.store.get("embedding", p),
                                   (v0[p] - embed_lr * grads_v[p]).numpy(), rtol=1e-5, atol=1e-7)
    assert np.array_equal(s.store.get("embedding", 0), idle)
