"""Self-FL's bootstrap estimator (sec. 3.2) on the client: eq. 14 from running sums, the
convergence rule, the fit to each resample's optimum, eq. 13's samples, the contraction
setting and the warm-up rounds; and a client's first participation (two resamples under
partial participation). The rest of Self-FL: tests/test_selffl.py."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from flower_pfl import config
from flower_pfl.algorithms import selffl_math as sm
from flower_pfl.learning import data

SYNTH = str(Path(__file__).resolve().parent.parent / "configs" / "selffl-synthetic.yaml")


# ------------------------------------------------------------ bootstrap estimator (sec. 3.2)
def test_eq14_from_sums_equals_the_variance_of_the_vectors_by_hand():
    x = np.array([[1.0, 2.0], [3.0, 6.0], [2.0, 1.0]])
    r = np.array([10.0, -4.0])  # any common reference (the server's theta^{t-1})
    d = x - r
    got = sm.variance_from_sums(d.sum(axis=0), float((d ** 2).sum()), 3)
    assert got == pytest.approx(8.0)  # var([1,3,2]) + var([2,6,1]) = 1 + 7
    assert math.isnan(sm.variance_from_sums(d[0], float(d[0] @ d[0]), 1))


def test_convergence_rule_by_hand():
    rule = sm.ConvergenceRule(tol=0.1, window=2)
    assert not rule.update(10.0) and not rule.update(10.0)  # first window: mean 10
    assert not rule.update(2.0)  # last window (10, 2): 6 > 1
    assert not rule.update(1.5)  # (2, 1.5): 1.75 > 1
    assert rule.update(0.5) and rule.converged  # (1.5, 0.5): 1.0 <= 0.1 * 10


def test_orders_of_magnitude_drop_by_hand():
    assert sm.orders_of_magnitude_drop(1.0, 1e-3) == pytest.approx(3.0)
    assert sm.orders_of_magnitude_drop(1.0, 2.0) == 0.0
    assert sm.orders_of_magnitude_drop(math.nan, 1.0) == 0.0
    assert sm.orders_of_magnitude_drop(1.0, 0.0) == math.inf


def _selffl_client(cfg, pid=0):
    from flwr.app import Context, RecordDict

    from flower_pfl.clients.selffl import SelfFLClient

    ctx = Context(run_id=0, node_id=1, node_config={"partition-id": pid}, state=RecordDict(),
                  run_config={})
    return SelfFLClient(ctx)


def _fit_cfg(cfg, **changes):
    """A Self-FL fit config for the synthetic task: bootstrap estimator, nothing known yet."""
    out = {"cfg": cfg.to_json(), "round": 1, "warmup": False, "sigma0-sq": -1.0,
           "s-minus": -1.0, "eta": 0.001, "l-max": 1000, "oracle-sigma-sq": -1.0,
           "variance-estimator": "bootstrap", "bootstrap-max-steps": 1000,
           "bootstrap-tol": 0.01, "bootstrap-lr": 0.01, "contraction": "measured",
           "eq13-samples": "optimum", "sample-variance": True}
    out.update({k.replace("_", "-"): v for k, v in changes.items()})
    return out


def test_bootstrap_fit_converges_to_the_resample_optimum(tmp_path):
    """theta_{m,t} is the optimum of the resampled data (its mean), not a few steps towards it."""
    cfg = config.load(SYNTH, ["clients=4"])
    client = _selffl_client(cfg, pid=2)
    arrays, _, metrics = client.fit([np.array([0.0], np.float32)], _fit_cfg(cfg))
    offset = arrays[1]  # the upload: theta_m^t, then d_m (its extra part)
    assert len(arrays) == 2 and offset.dtype == np.float32
    z = data.gaussian_truth(cfg.values).z[2]
    rng = np.random.default_rng([cfg["seed"], 2, 1, 0xB007])  # the client's resample
    resample_mean = z[rng.integers(0, len(z), size=len(z))].mean()
    assert metrics["bootstrap_converged"] and metrics["bootstrap_steps"] < 1000
    assert offset[0] == pytest.approx(resample_mean, abs=0.01 * abs(resample_mean) + 1e-4)
    assert metrics["optimum_sq_norm"] == pytest.approx(float(offset[0]) ** 2, rel=1e-5)
    assert offset[0] != pytest.approx(z.mean(), abs=1e-6)  # a resample, not the data itself
    # full-batch GD on the Gaussian NLL: the measured curvature is the paper's sigma_m^-2
    truth = data.gaussian_truth(cfg.values)
    assert metrics["curvature"] == pytest.approx(1.0 / truth.sigma_sq[2], rel=1e-3)


@pytest.mark.parametrize("samples", ["optimum", "offset"])
def test_eq13_samples_are_the_optima_or_their_offsets_to_the_global_model(samples):
    """'offset': eq. 13's moments hold d_m = theta_{m,t} - theta^{t-1}, so a global model
    that moved between rounds adds nothing to sigma_m^2; 'optimum' keeps theta_{m,t}."""
    cfg = config.load(SYNTH, ["clients=4"])
    client = _selffl_client(cfg, pid=1)
    fit_cfg = _fit_cfg(cfg, l_max=10, eq13_samples=samples)
    arrays, _, metrics = client.fit([np.array([3.0], np.float32)], fit_cfg)
    offset = float(arrays[1][0])  # d_m, the upload's extra part
    client.state.resolve(accepted_round=1)  # the server accepted the fit: its writes stay
    mean = float(client.load_moments().mean[0])
    expected = offset if samples == "offset" else offset + 3.0
    assert mean == pytest.approx(expected, abs=1e-5)


def test_the_contraction_setting_reaches_the_clients_step_count():
    """'measured': eq. 8 with the curvature of this round's bootstrap fit; 'variance': with
    sigma_m^-2 (eq. 8 literally). Same client state, same round: different l_m."""
    cfg = config.load(SYNTH, ["clients=4"])
    base = _fit_cfg(cfg)
    steps = {}
    for contraction in ("measured", "variance"):
        client = _selffl_client(cfg, pid=3)
        for t in (1, 2):  # two bootstrap samples: sigma_m^2 known from round 3 on
            client.fit([np.array([0.0], np.float32)],
                       {**base, "round": t, "contraction": contraction})
            client.state.resolve(accepted_round=t)
        sigma_m_sq = client.load_moments().variance
        _, _, m = client.fit([np.array([0.0], np.float32)],
                             {**base, "round": 3, "contraction": contraction,
                              "sigma0-sq": 1.0, "s-minus": 10.0})
        curvature = m["curvature"] if contraction == "measured" else None
        expected = sm.local_schedule(0.001, sigma_m_sq, 10.0, 1000, 1, curvature=curvature)
        assert m["local_steps"] == expected[0] and m["steps_rule"] == expected[2]
        steps[contraction] = m["local_steps"]
    assert steps["measured"] != steps["variance"]


def test_early_warmup_rounds_take_no_variance_sample(tmp_path):
    """Section 3.2's warm start: the early warm-up rounds' fluctuation stays out of eqs.
    13-14 (the client runs no bootstrap fit and adds no sample); the last PRIME_ROUNDS
    warm-up rounds already sample, so Self-FL starts with both variances known."""
    from flower_pfl.strategies.selffl import PRIME_ROUNDS, SelfFL

    cfg = config.load(SYNTH, ["clients=4", "hyper.selffl.warmup-rounds=4"])
    strategy = SelfFL(cfg, results_dir=tmp_path)
    strategy.initialize_parameters(None)
    assert [strategy.samples_variance(t) for t in range(1, 7)] == \
        [t > 4 - PRIME_ROUNDS for t in range(1, 7)]
    client = _selffl_client(cfg, pid=1)
    fit_cfg = _fit_cfg(cfg, warmup=True, l_max=10, sample_variance=False)
    arrays, _, metrics = client.fit([np.array([3.0], np.float32)], fit_cfg)
    client.state.resolve(accepted_round=1)
    assert len(arrays) == 1 and "bootstrap_steps" not in metrics  # no d_m uploaded
    assert client.load_moments().count == 0
    arrays, _, metrics = client.fit([np.array([3.0], np.float32)], {**fit_cfg, "round": 2,
                                                                   "sample-variance": True})
    client.state.resolve(accepted_round=2)
    assert len(arrays) == 2 and client.load_moments().count == 1
    assert [bool(strategy.upload_extra(t)) for t in range(1, 7)] == \
        [t > 4 - PRIME_ROUNDS for t in range(1, 7)]  # the server expects d_m in those rounds


def test_warmup_auto_warm_starts_a_network_not_the_scalar_model(tmp_path):
    from flower_pfl.strategies.selffl import SelfFL

    main = str(Path(SYNTH).parent.parent / "simulation.yaml")
    for path, overrides, expected in [(SYNTH, ["rounds=40"], 0),
                                      (main, ["strategy=selffl", "rounds=20"], 5),
                                      (main, ["strategy=selffl", "rounds=20",
                                              "hyper.selffl.warmup-rounds=0"], 0)]:
        strategy = SelfFL(config.load(path, overrides), results_dir=tmp_path / str(expected))
        strategy.initialize_parameters(None)
        assert strategy.warmup_rounds == expected, (path, overrides)


# -------------------------------------------------------------- first participation
def test_first_participation_fits_two_resamples_and_uses_sigma_m_at_once(tmp_path):
    """Partial participation: a client's first turn fits FIRST_FITS = 2 independent bootstrap
    resamples, so sigma_m^2 (eq. 13, the n-1 variance of the two optima) is known at once
    and eqs. 8 and 10 use it in the same round; one fit leaves it unknown (fallback)."""
    from flower_pfl.learning.params import ParamSpec

    cfg = config.load(SYNTH, ["clients=4"])
    fit_cfg = _fit_cfg(cfg, sigma0_sq=1.0, s_minus=5.0, contraction="variance", first_fits=2)
    reference = _selffl_client(cfg, pid=3)
    reference.setup(fit_cfg)
    spec = ParamSpec.of([np.zeros(1, np.float32)])
    o0, _ = reference.bootstrap_optimum(np.zeros(1), spec, fit_cfg)
    o1, _ = reference.bootstrap_optimum(np.zeros(1), spec, fit_cfg, fit=1)
    sigma_sq = float((o0[0] - o1[0]) ** 2 / 2)  # two samples: n - 1 = 1 in the denominator
    assert sigma_sq > 1e-6  # two different resamples, not the same one twice
    client = _selffl_client(cfg, pid=3)
    _, _, metrics = client.fit([np.array([0.0], np.float32)], fit_cfg)
    assert metrics["bootstrap_fits"] == 2
    assert metrics["sigma_sq"] == pytest.approx(sigma_sq, rel=1e-6)
    # eq. 10's coefficient (sigma_0^2 + sigma_m^2)^-1 / S_{-m} with sigma_0^2 = 1, S_{-m} = 5
    assert metrics["init_coef"] == pytest.approx(1.0 / ((1.0 + sigma_sq) * 5.0), rel=1e-6)
    from flower_pfl.strategies.selffl import EQ8_RAN

    steps, eta_m, rule = sm.local_schedule(0.001, sigma_sq, 5.0, 1000,
                                           client.spec.num_steps(client.data.num_train))
    assert metrics["steps_rule"] == rule and rule in EQ8_RAN
    assert metrics["local_steps"] == steps and metrics["eta_m"] == pytest.approx(eta_m)
    # one fit (every client every round: fraction-fit 1): eq. 13 waits for the next round
    single = _selffl_client(cfg, pid=3)
    _, _, metrics = single.fit([np.array([0.0], np.float32)], {**fit_cfg, "first-fits": 1})
    assert metrics["sigma_sq"] == -1.0 and metrics["steps_rule"] == sm.RULE_UNKNOWN
    assert metrics["init_coef"] == 0.0 and "bootstrap_fits" not in metrics


def test_first_fits_only_under_partial_participation(tmp_path):
    """fraction-fit 1 (the committed synthetic and FMNIST cells): one fit per round, as
    before; fraction-fit < 1: FIRST_FITS on a client's first turn."""
    from flower_pfl.strategies.selffl import FIRST_FITS, SelfFL

    assert FIRST_FITS == 2
    for fraction, expected in [(1.0, 1), (0.2, FIRST_FITS)]:
        cfg = config.load(SYNTH, ["clients=5", f"fraction-fit={fraction}"])
        strategy = SelfFL(cfg, results_dir=tmp_path / str(fraction))
        strategy.initialize_parameters(None)
        assert strategy.fit_payload(0, 1)[1]["first-fits"] == expected
