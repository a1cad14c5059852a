"""SCAFFOLD: corrected step, option II control variates, server update, state across rounds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flower_pfl.algorithms.baselines_math import (
    linear_term,
    scaffold_client_control,
    scaffold_control_delta,
    scaffold_server,
)
from flower_pfl.clients.base import PFLClient
from flower_pfl.config import ConfigError
from flower_pfl.running import inprocess
from tests.conftest import small_config
from tests.test_baselines import TINY, replay_fit, state_arrays, two_rounds


def test_correction_term_gradient_is_c_minus_ci():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    d = [torch.randn_like(p) for p in model.parameters()]
    linear_term(model, d).backward()
    for p, dd in zip(model.parameters(), d):
        assert torch.equal(p.grad, dd)


def test_option_ii_and_server_update_by_hand():
    ci, c = [np.array([1.0, -2.0])], [np.array([0.5, 0.5])]
    x, y = [np.array([3.0, 3.0])], [np.array([2.0, 4.0])]
    # c_i - c + (x - y) / (K lr) with K = 4, lr = 0.25 -> (x - y) / 1
    out = scaffold_client_control(ci, c, x, y, steps=4, lr=0.25)
    assert np.allclose(out[0], [1.0 - 0.5 + 1.0, -2.0 - 0.5 - 1.0])
    # x + eta_g * weighted mean(y_i - x);  c + |S|/N * mean(dc_i)
    nx, nc = scaffold_server([np.array([1.0])], [np.array([0.0])],
                             [[np.array([2.0])], [np.array([5.0])]],
                             [[np.array([1.0])], [np.array([3.0])]], weights=[1, 3],
                             num_clients=8, eta_g=0.5)
    assert np.allclose(nx[0], 1.0 + 0.5 * (0.25 * 1 + 0.75 * 4))
    assert np.allclose(nc[0], 0.0 + 2 / 8 * 2.0)


def test_zero_control_variates_equal_fedavg_then_the_correction_acts(tmp_path):
    cfg = dict(TINY, rounds=1)
    fedavg = inprocess.run(small_config(strategy="fedavg", **cfg), tmp_path / "f1")
    scaffold = inprocess.run(small_config(strategy="scaffold", **cfg), tmp_path / "s1")
    # round 1: c = c_i = 0, so SCAFFOLD (eta_g = 1) is FedAvg on the same seed
    for a, b in zip(fedavg.global_arrays, scaffold.global_arrays):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert any(np.abs(c).max() > 0 for c in scaffold.control)  # c was learned
    # round 2: the control variates correct the steps, so the models now differ
    cfg["rounds"] = 2
    fedavg = inprocess.run(small_config(strategy="fedavg", **cfg), tmp_path / "f2")
    scaffold = inprocess.run(small_config(strategy="scaffold", **cfg), tmp_path / "s2")
    gap = max(float(np.abs(a - b).max()) for a, b in
              zip(fedavg.global_arrays, scaffold.global_arrays))
    assert gap > 1e-3, gap


def test_client_control_variate_continues_across_rounds(tmp_path):
    cfg = small_config(strategy="scaffold", rounds=2, **TINY)
    s, proxies, before, ins, res = two_rounds(cfg, tmp_path)
    pid = 1
    ci1 = state_arrays(before[pid], "scaffold-ci")
    ci2 = state_arrays(proxies[pid].context.state, "scaffold-ci")
    from flwr.common import parameters_to_ndarrays

    x, extra = PFLClient.split_download(parameters_to_ndarrays(ins[pid].parameters),
                                        ins[pid].config)
    c = extra["control"]  # the download: x, then c
    assert len(c) == len(x) and any(np.abs(a).max() > 0 for a in c)  # the learned c
    y = parameters_to_ndarrays(res[pid].parameters)
    y, dc_up = y[:len(x)], y[len(x):]  # the upload: y, then dc_i
    steps, lr = int(res[pid].metrics["local_steps"]), cfg["train.lr"]
    # option II from the ROUND-1 c_i (MCLR: the arrays are the parameters)
    expected = [a - b + (xx - yy) / (steps * lr) for a, b, xx, yy in zip(ci1, c, x, y)]
    for got, want in zip(ci2, expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # the uploaded dc_i (line 13) is the change of the client's c_i
    dc = scaffold_control_delta(c, x, y, steps, lr)
    for d, up, got, old in zip(dc, dc_up, ci2, ci1):
        np.testing.assert_array_equal(d, up)
        np.testing.assert_allclose(d, got - old, rtol=1e-4, atol=1e-4)
    # fit.csv: one row per accepted upload, with the client's own fit metrics
    import csv

    with open(tmp_path / "fit.csv") as fh:
        rows = {(int(r["round"]), int(r["partition-id"])): r for r in csv.DictReader(fh)}
    assert set(rows) == {(r, p) for r in (1, 2) for p in range(cfg["clients"])}
    row = rows[(2, pid)]
    assert int(float(row["local_steps"])) == steps
    assert int(row["num-examples"]) == res[pid].num_examples
    norm = float(np.sqrt(sum(float((a.astype(np.float64) ** 2).sum()) for a in ci2)))
    assert float(row["ci_norm"]) == pytest.approx(norm, rel=1e-5)
    # a client that forgot c_i (fresh state) would end elsewhere
    fresh_state, _ = replay_fit(proxies[pid], None, ins[pid])
    fresh = state_arrays(fresh_state, "scaffold-ci")
    assert max(float(np.abs(a - b).max()) for a, b in zip(fresh, ci2)) > 1e-3


def test_momentum_is_rejected():
    with pytest.raises(ConfigError, match="assumes plain SGD"):
        small_config(strategy="scaffold", **{"train.momentum": 0.9})


def test_client_steps_are_corrected_by_plus_c_minus_ci_by_hand():
    """The real client's fit on FMNIST with c != 0 and c_i != 0 of unequal sizes: each of the
    K steps is y <- y - lr (grad f(y; b) + c - c_i) (line 10), by hand in float64; the
    uploaded dc_i and the kept c_i+ follow option II from that y."""
    from torch.nn import functional as F

    from flower_pfl.algorithms.baselines_math import CONTROL
    from flower_pfl.clients.scaffold import ScaffoldClient
    from flower_pfl.learning.models import initial_arrays
    from flower_pfl.learning.training import batches
    from flower_pfl.reliability.uploads import EXTRA_ARRAYS, describe_parts
    from tests.test_baselines import make_client

    lr, steps, size = 0.1, 3, 16
    cfg = small_config(strategy="scaffold", **TINY, **{
        "train.lr": lr, "train.steps": steps, "train.batch-size": size})
    x0 = initial_arrays(cfg)
    rng = np.random.default_rng(3)
    c = [rng.normal(0, 0.3, a.shape).astype(np.float32) for a in x0]
    c_i = [rng.normal(0, 0.1, a.shape).astype(np.float32) + 0.2 for a in x0]
    client = make_client(ScaffoldClient, pid=2)
    client.state.set_arrays("scaffold-ci", c_i)
    up, _, metrics = client.fit([a.copy() for a in x0] + [a.copy() for a in c], {
        "cfg": cfg.to_json(), "round": 1, EXTRA_ARRAYS: describe_parts({CONTROL: c})})
    y, dc = up[:len(x0)], up[len(x0):]
    order = list(batches(client.data.num_train, size, steps, client.generator(),
                         client.spec.drop_last))

    def by_hand(sign):
        w = [torch.tensor(a, dtype=torch.float64) for a in x0]
        corr = [sign * torch.tensor(cc - ci, dtype=torch.float64) for cc, ci in zip(c, c_i)]
        for idx in order:
            xb = client.data.x_train[idx].flatten(1).double()
            leaf = [p.clone().requires_grad_(True) for p in w]
            loss = F.cross_entropy(xb @ leaf[0].T + leaf[1], client.data.y_train[idx])
            grads = torch.autograd.grad(loss, leaf)
            w = [p - lr * (g + d) for p, g, d in zip(w, grads, corr)]
        return [p.numpy() for p in w]

    want, flipped = by_hand(+1.0), by_hand(-1.0)
    error = max(float(np.abs(a - b).max()) for a, b in zip(y, want))
    gap = max(float(np.abs(a - b).max()) for a, b in zip(want, flipped))
    assert error < 1e-5 and gap > 1e3 * error + 1e-3, (error, gap)
    # option II from that y: c_i+ = c_i - c + (x - y)/(K lr); dc_i = c_i+ - c_i
    c_plus = [ci - cc + (xx - yy) / (steps * lr) for ci, cc, xx, yy in zip(c_i, c, x0, y)]
    for got, want_c, d, ci in zip(state_arrays(client.ctx.state, "scaffold-ci"), c_plus, dc, c_i):
        np.testing.assert_allclose(got, want_c, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(d, want_c - ci, rtol=1e-4, atol=1e-4)
