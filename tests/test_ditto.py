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
