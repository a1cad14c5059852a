"""Self-FL: eqs. 8, 10, 11, 13, 14 by hand (with degenerate cases), mechanisms on/off,
and the synthetic two-level Gaussian against the closed form of eq. 3."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from flower_pfl import config, data, inprocess
from flower_pfl import selffl_math as sm
from strategies.base import ClientUpdate

SYNTH = str(Path(__file__).resolve().parent.parent / "configs" / "selffl-synthetic.yaml")


def test_eq8_local_steps_by_hand_and_guards():
    # q = S / (sigma_m^-2 + S) = 10 / (20 + 10); l = log q / log(1 - eta/sigma_m^2)
    steps, why = sm.local_steps(0.01, 0.05, 10.0, l_max=100, default=7)
    assert why == "eq. 8" and steps == round(math.log(1 / 3) / math.log(1 - 0.01 / 0.05)) == 5
    assert sm.local_steps(0.01, math.nan, 10.0, 100, 7) == (7, "variance unknown")
    assert sm.local_steps(0.01, 0.05, math.nan, 100, 7) == (7, "variance unknown")
    assert sm.local_steps(0.01, 0.0, 10.0, 100, 7)[0] == 100  # sigma_m = 0: trust local
    assert sm.local_steps(0.01, 0.05, 0.0, 100, 7)[0] == 100  # no peers: q = 0
    assert sm.local_steps(0.05, 0.05, 10.0, 100, 7) == (1, "eta >= sigma_m^2")
    assert sm.local_steps(0.01, 0.05, math.inf, 100, 7) == (1, "q = 1")
    assert sm.local_steps(1e-6, 0.05, 10.0, 100, 7)[0] == 100  # clipped to l_max


def test_eq10_initialisation_by_hand_and_guards():
    # c_m = (sigma0^2 + sigma_m^2)^-1 / S_-m = 0.5 / 2 ; init = g - c (p - g)
    c = sm.init_coefficient(1.0, 1.0, 2.0)
    assert c == pytest.approx(0.25)
    assert sm.init_params(np.array([1.0]), np.array([3.0]), c) == pytest.approx([0.5])
    for args in [(1.0, math.nan, 2.0), (1.0, 1.0, 0.0), (math.nan, 1.0, 2.0), (0.0, 0.0, 2.0),
                 (1.0, 1.0, math.nan)]:
        assert sm.init_coefficient(*args) == 0.0  # falls back to the global model


def test_eq11_weighted_aggregation_by_hand_and_guards():
    models = np.array([[0.0], [10.0]])
    # weights (1+1)^-1 = 0.5 and (1+3)^-1 = 0.25 -> (0 + 2.5) / 0.75
    assert sm.aggregate(models, 1.0, [1.0, 3.0])[0] == pytest.approx(10 / 3)
    assert sm.aggregate(models, 1.0, [math.nan, math.nan])[0] == pytest.approx(5.0)
    assert sm.aggregate(models, 0.0, [0.0, 3.0])[0] == pytest.approx(5.0)  # 1/0 -> plain mean
    # an unknown variance takes the mean of the known ones
    assert sm.aggregate(np.array([[0.0], [10.0], [4.0]]), 1.0, [1.0, 3.0, math.nan])[0] == \
        pytest.approx((0 * 0.5 + 10 * 0.25 + 4 * (1 / 3)) / (0.5 + 0.25 + 1 / 3))
    assert sm.smooth(np.array([2.0]), np.array([4.0]), 0.25)[0] == pytest.approx(2.5)


def test_eq13_welford_and_eq14_variance_by_hand():
    xs = np.array([[1.0, 2.0], [3.0, 6.0], [2.0, 1.0]])
    w = sm.Welford()
    assert math.isnan(w.variance)
    for x in xs:
        w.add(x)
    assert w.variance == pytest.approx(xs.var(axis=0, ddof=1).sum())  # trace of the variance
    assert sm.variance_across(xs) == pytest.approx(1.0 + 7.0)  # var([1,3,2]) + var([2,6,1])
    assert math.isnan(sm.variance_across(xs[:1]))


def test_eq3_closed_form_by_hand():
    z, s0, s = np.array([1.0, 2.0, 4.0]), 1.0, np.array([0.5, 1.0, 3.0])
    w = 1 / (s0 + s)
    expected_0 = (z[0] / s[0] + w[1] * z[1] + w[2] * z[2]) / (1 / s[0] + w[1] + w[2])
    assert sm.theta_fl(z, s0, s)[0] == pytest.approx(expected_0)
    assert sm.theta_global(z, s0, s) == pytest.approx((w * z).sum() / w.sum())


def _personal_thetas(strategy, m):
    return np.array([float(strategy.proxies[p].context.state["personal"].to_numpy_ndarrays()[0][0])
                     for p in range(m)])


def _closeness(m, tmp_path, *extra):
    cfg = config.load(SYNTH, [f"clients={m}", *extra])
    s = inprocess.run(cfg, tmp_path / f"m{m}")
    truth = data.gaussian_truth(cfg.values)
    target = sm.theta_fl(truth.z_mean, truth.sigma0_sq, truth.sigma_sq)
    gap = np.mean(np.abs(_personal_thetas(s, m) - target))
    return gap / np.mean(np.abs(truth.z_mean - target)), s


def test_synthetic_oracle_reaches_the_closed_form_and_improves_with_m(tmp_path):
    ratio20, s = _closeness(20, tmp_path)
    assert ratio20 < 0.1, ratio20  # within 10% of the local estimate's distance to theta^FL
    ratio200, _ = _closeness(200, tmp_path)
    assert ratio200 < ratio20  # Proposition 3.1: the error shrinks as M grows
    rows = s.results.server_rows
    assert all(r["local_steps_min"] >= 1 for r in rows)


def test_estimated_variances_never_produce_nan(tmp_path):
    _, s = _closeness(20, tmp_path, "hyper.selffl.oracle=false", "rounds=6", "train.steps=5")
    for row in s.results.server_rows[1:]:
        assert math.isfinite(row["sigma0_sq"]) and row["sigma0_sq"] >= 0
    assert np.isfinite(_personal_thetas(s, 20)).all()
    assert np.isfinite(s.global_arrays[0]).all()


def test_server_uses_variance_weights_not_a_plain_mean(tmp_path):
    from strategies.selffl import SelfFL

    cfg = config.load(SYNTH, ["clients=3", "hyper.selffl.oracle=false"])
    strategy = SelfFL(cfg, results_dir=tmp_path)
    strategy.initialize_parameters(None)
    updates = [ClientUpdate(0, [np.array([0.0], np.float32)], 10, {"sigma_sq": 0.01}),
               ClientUpdate(1, [np.array([3.0], np.float32)], 10, {"sigma_sq": 5.0}),
               ClientUpdate(2, [np.array([6.0], np.float32)], 10, {"sigma_sq": 20.0})]
    strategy.aggregate_updates(1, updates)
    sigma0 = sm.variance_across(np.array([[0.0], [3.0], [6.0]]))  # eq. 14 = 9
    assert strategy.sigma0_sq == pytest.approx(sigma0)
    w = 1 / (sigma0 + np.array([0.01, 5.0, 20.0]))
    expected = (w * np.array([0.0, 3.0, 6.0])).sum() / w.sum()
    assert float(strategy.global_arrays[0][0]) == pytest.approx(expected, rel=1e-5)
    assert abs(expected - 3.0) > 0.3  # a plain mean would give 3.0


def test_client_starts_from_eq10_not_from_the_global_model(tmp_path):
    from clients.selffl import SelfFLClient
    from flwr.common import Context, RecordDict

    cfg = config.load(SYNTH, ["clients=4"])
    ctx = Context(run_id=0, node_id=1, node_config={"partition-id": 0}, state=RecordDict(),
                  run_config={})
    client = SelfFLClient(ctx)
    client.state.set_arrays("personal", [np.array([3.0], np.float32)])  # theta_m^{t-1}
    cfg_json = cfg.to_json()
    arrays, _, metrics = client.fit([np.array([1.0], np.float32)], {
        "cfg": cfg_json, "round": 2, "warmup": False, "sigma0-sq": 1.0, "s-minus": 2.0,
        "eta": 1e-9, "l-max": 1, "oracle-sigma-sq": 1.0})
    # c = (1 + 1)^-1 / 2 = 0.25: init = 1 - 0.25 (3 - 1) = 0.5; eta ~ 0 keeps it there
    assert float(arrays[0][0]) == pytest.approx(0.5, abs=1e-4)
    assert metrics["init_coef"] == pytest.approx(0.25)


def test_oracle_needs_the_synthetic_task():
    with pytest.raises(config.ConfigError, match="oracle"):
        config.validate({"strategy": "selffl", "hyper": {"selffl": {"oracle": True}}})
    with pytest.raises(config.ConfigError, match="scalar model"):
        config.validate({"strategy": "selffl", "data": {"dataset": "synthetic-gaussian"}})
