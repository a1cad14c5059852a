"""Ditto: the personal prox term acts with gradient lambda (v - w^t); v_i persists; P and G."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from flwr.common import FitIns

from flower_pfl.config import ConfigError
from flower_pfl.running import inprocess
from tests.conftest import small_config
from tests.test_baselines import TINY, replay_fit, state_arrays, two_rounds


def test_personal_step_has_the_prox_gradient(tmp_path):
    # one personal SGD step from v != w^t with the lambda the SERVER sent (0.7, not the
    # default): v1(lambda) - v1(0) = -lr * lambda * (v0 - w^t)
    lam = 0.7
    cfg = small_config(strategy="ditto", rounds=2, **TINY, **{"hyper.ditto.lambda": lam})
    s, proxies, before, ins, res = two_rounds(cfg, tmp_path)
    pid = 0
    v0 = state_arrays(before[pid], "ditto-v")
    from flwr.common import parameters_to_ndarrays

    w_t = parameters_to_ndarrays(ins[pid].parameters)
    assert max(float(np.abs(a - b).max()) for a, b in zip(v0, w_t)) > 1e-3
    lr = cfg["train.lr"]

    def one_step(**change):
        config = {**ins[pid].config, "personal-steps": 1, **change}
        state, _ = replay_fit(proxies[pid], before[pid], FitIns(ins[pid].parameters, config))
        return state_arrays(state, "ditto-v")

    with_prox, without = one_step(), one_step(**{"lambda": 0.0})
    for a, b, v, w in zip(with_prox, without, v0, w_t):
        np.testing.assert_allclose(a - b, -lr * lam * (v - w), rtol=1e-3, atol=1e-6)


def test_v_continues_across_rounds_and_is_not_the_global_model(tmp_path):
    cfg = small_config(strategy="ditto", rounds=2, **TINY)
    s, proxies, before, ins, res = two_rounds(cfg, tmp_path)
    pid = 3
    v2 = state_arrays(proxies[pid].context.state, "ditto-v")
    again, _ = replay_fit(proxies[pid], before[pid], ins[pid])
    for a, b in zip(state_arrays(again, "ditto-v"), v2):
        np.testing.assert_allclose(a, b, atol=1e-6)
    fresh, _ = replay_fit(proxies[pid], None, ins[pid])  # v_i restarted from w^t
    assert max(float(np.abs(a - b).max()) for a, b in
               zip(state_arrays(fresh, "ditto-v"), v2)) > 1e-4
    # the upload is FedAvg's local update of w^t, not v_i
    from flwr.common import parameters_to_ndarrays

    up = parameters_to_ndarrays(res[pid].parameters)
    assert max(float(np.abs(a - b).max()) for a, b in zip(up, v2)) > 1e-4


def test_ditto_p_beats_ditto_g_on_a_pathological_split(tmp_path):
    cfg = small_config(strategy="ditto", rounds=3, clients=6, **{
        "data.partition": "pathological", "data.classes-per-client": 2,
        "data.subsample": 3000, "fraction-fit": 1.0, "model": "mclr"})
    inprocess.run(cfg, tmp_path)
    with open(tmp_path / "rounds.csv") as fh:
        last = list(csv.DictReader(fh))[-1]
    assert float(last["personal_mean"]) > float(last["global_mean"]) + 0.1, last


def test_lambda_zero_is_rejected():
    with pytest.raises(ConfigError, match="lambda = 0 is Local"):
        small_config(strategy="ditto", **{"hyper.ditto.lambda": 0.0})


def test_servers_lambda_reaches_the_personal_step_by_hand(tmp_path):
    """Ditto's fit instructions (lambda 0.7, not the default) through the real client, from
    a stored v_i unlike w^t: s SGD steps on f(v) + lambda/2 ||v - w^t||^2 (salt 1), by hand
    in float64; the upload is FedAvg's update of w^t (salt 0, no prox term)."""
    from flower_pfl.clients.ditto import DittoClient
    from flower_pfl.learning.models import initial_arrays
    from flower_pfl.strategies.ditto import Ditto
    from tests.test_baselines import make_client
    from tests.test_fedprox import client_order, max_gap, prox_sgd_by_hand

    lam, lr, steps = 0.7, 0.2, 3
    cfg = small_config(strategy="ditto", **TINY, **{
        "hyper.ditto.lambda": lam, "hyper.ditto.personal-steps": steps, "train.lr": lr,
        "train.steps": 2, "train.batch-size": 16})
    s = Ditto(cfg, results_dir=tmp_path)
    s.initialize_parameters(None)
    w_t, extra = s.fit_payload(2, 1)
    assert extra["lambda"] == lam and extra["personal-steps"] == steps
    rng = np.random.default_rng(1)
    v0 = [(a + rng.normal(0, 0.1, a.shape)).astype(np.float32) for a in initial_arrays(cfg)]
    client = make_client(DittoClient, pid=2)
    client.state.set_arrays("ditto-v", v0)
    up, _, _ = client.fit([a.copy() for a in w_t], {"cfg": cfg.to_json(), "round": 1, **extra})
    v = state_arrays(client.ctx.state, "ditto-v")
    order = client_order(client, steps, salt=1)
    want = prox_sgd_by_hand(client, v0, order, lr, w_t, lam)
    error, gap = max_gap(v, want), max_gap(want, prox_sgd_by_hand(client, v0, order, lr, w_t,
                                                                   lam / 2))
    assert error < 1e-5 and gap > 100 * error + 1e-5, (error, gap)
    fedavg = prox_sgd_by_hand(client, w_t, client_order(client, 2), lr, w_t, 0.0)
    assert max_gap(up, fedavg) < 1e-5
