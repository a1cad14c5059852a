"""FedSAM (PLGU's baseline), client and server: one SAM step of the real client by hand and
its delta upload; the server's mean delta over those who shared each array."""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from flower_pfl.learning.models import build_model, initial_arrays
from flower_pfl.strategies.base import ClientUpdate
from tests.test_plgu import _cfg, _same


# ---------------------------------------------------------------- FedSAM, client and server
def test_fedsam_client_runs_sam_and_uploads_its_delta():
    """One local step of the real FedSAM client on its first mini-batch, by hand: g at w,
    eps = rho g/||g||, g~ at w + eps, upload Delta = -lr g~."""
    from flower_pfl.clients.fedsam import FedSAMClient
    from flower_pfl.learning.training import batches
    from tests.test_baselines import make_client

    rho, lr = 0.5, 0.05
    cfg = _cfg("fedsam", model="mclr", **{"train.steps": 1, "train.lr": lr})
    w = initial_arrays(cfg)

    def fit(r):
        client = make_client(FedSAMClient)
        delta, _, _ = client.fit([a.copy() for a in w], {"cfg": cfg.to_json(), "round": 1,
                                                         "rho": r})
        return client, delta

    client, delta = fit(rho)
    idx = next(batches(client.data.num_train, 32, 1, client.generator(), False))
    xb, yb = client.data.x_train[idx], client.data.y_train[idx]
    ref = build_model("mclr", (1, 28, 28), 10, seed=0)
    params = list(ref.parameters())
    with torch.no_grad():
        for p, a in zip(params, w):
            p.copy_(torch.as_tensor(a))
    g = torch.autograd.grad(F.cross_entropy(ref(xb), yb), params)
    norm = torch.sqrt(sum((x ** 2).sum() for x in g))
    with torch.no_grad():
        for p, gi in zip(params, g):
            p.add_(rho * gi / norm)
    g_sam = torch.autograd.grad(F.cross_entropy(ref(xb), yb), params)
    for d, gs in zip(delta, g_sam):
        np.testing.assert_allclose(d, -lr * gs.numpy(), rtol=1e-4, atol=1e-7)
    _, plain = fit(0.0)
    assert not _same(delta, plain)  # rho reaches the optimizer


def test_mean_delta_moves_each_array_by_the_mean_of_those_who_shared_it():
    from flower_pfl.strategies.fedsam import apply_mean_delta

    w = [np.zeros(2, np.float32), np.ones(3, np.float32)]
    ups = [ClientUpdate(0, [np.array([1.0, 2.0]), np.full(3, 3.0)], 10, {"shared": "11"}),
           ClientUpdate(1, [np.array([3.0, 0.0]), np.zeros(3)], 90, {"shared": "10"}),
           ClientUpdate(2, [np.array([5.0, 5.0]), np.full(3, 9.0)], 5, {"shared": "00"})]
    out, counts = apply_mean_delta(w, ups)  # PLGU-LF: per array, over those who shared it
    assert counts.tolist() == [2, 1]
    np.testing.assert_allclose(out[0], [2.0, 1.0])  # unweighted mean of (1, 2) and (3, 0)
    np.testing.assert_allclose(out[1], [4.0, 4.0, 4.0])
    out, counts = apply_mean_delta(w, [ClientUpdate(u.pid, u.arrays, u.num_examples, {})
                                       for u in ups])  # FedSAM: every array shared
    assert counts.tolist() == [3, 3]
    np.testing.assert_allclose(out[0], [3.0, 7 / 3], rtol=1e-6)
    np.testing.assert_allclose(out[1], [5.0, 5.0, 5.0])
