"""Self-FL's equations on asymmetric inputs, by hand: S_{-m} over the OTHER clients only
(unequal sigma_k^2), and eq. 10's coefficient with sigma_0^2 != sigma_m^2 and S_{-m} from
three unequal peers -- inputs where a client counted in its own S_{-m}, a swapped pair or a
factor of 2 changes the number (tests/test_selffl.py and test_selffl_bootstrap.py hold the
rest of Self-FL's tests)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from flower_pfl import config
from flower_pfl.algorithms import selffl_math as sm

SYNTH = str(Path(__file__).resolve().parent.parent / "configs" / "selffl-synthetic.yaml")


def test_s_minus_by_hand_over_the_other_clients_only():
    # sigma_0^2 = 0.5, the others' sigma_k^2 = 1.5, 3.5 (and an unknown one, skipped)
    assert sm.s_minus(0.5, [1.5, 3.5, math.nan]) == pytest.approx(1 / 2.0 + 1 / 4.0)
    assert sm.s_minus(0.5, []) == 0.0


def test_strategy_s_minus_leaves_the_client_itself_out(tmp_path):
    """The server's S_{-m} for client m sums (sigma_0^2 + sigma_k^2)^-1 over k != m, with
    unequal variances so that counting m itself (or anyone twice) changes the value; the
    fit instructions carry it."""
    from flower_pfl.strategies.selffl import SelfFL

    cfg = config.load(SYNTH, ["clients=4", "hyper.selffl.variance-estimator=surrogate"])
    s = SelfFL(cfg, results_dir=tmp_path)
    s.initialize_parameters(None)
    s.sigma0_sq = 0.5
    sigma = {0: 0.5, 1: 1.5, 2: 3.5}  # client 3 has no variance yet
    for pid, v in sigma.items():
        s.store.put("sigma_sq", pid, v)
    by_hand = {0: 1 / 2.0 + 1 / 4.0, 1: 1 / 1.0 + 1 / 4.0, 2: 1 / 1.0 + 1 / 2.0,
               3: 1 / 1.0 + 1 / 2.0 + 1 / 4.0}
    for pid, want in by_hand.items():
        assert s.s_minus(pid) == pytest.approx(want), pid
        assert s.fit_payload(pid, 5)[1]["s-minus"] == pytest.approx(want), pid
    # eq. 10's coefficient for client 1: (sigma_0^2 + sigma_1^2)^-1 / S_{-1} = 0.5 / 1.25
    assert sm.init_coefficient(0.5, 1.5, s.s_minus(1)) == pytest.approx(0.4)
    # and eq. 10 itself: theta_init = g - c (p - g), g = 1, p = 4 -> 1 - 0.4 * 3
    assert sm.init_params(np.array([1.0]), np.array([4.0]), 0.4)[0] == pytest.approx(-0.2)


def test_a_zero_variance_is_a_known_variance_in_eq11(tmp_path):
    """sigma_m^2 = 0 (identical local optima) is the end of the range, not "unknown": eq. 11
    weighs that client by (sigma_0^2 + 0)^-1, the largest weight.  Thetas 0, 3, 6 and
    sigma_m^2 = 0, 5, 20: sigma_0^2 = var(0, 3, 6) = 9, weights 1/9, 1/14, 1/29, so
    theta = (3/14 + 6/29) / (1/9 + 1/14 + 1/29) = 1.94073 (counting 0 as unknown would
    give it the known ones' mean 12.5: 1/21.5, and theta = 2.7632)."""
    from flower_pfl.strategies.base import ClientUpdate
    from flower_pfl.strategies.selffl import SelfFL

    cfg = config.load(SYNTH, ["clients=3", "hyper.selffl.variance-estimator=surrogate"])
    s = SelfFL(cfg, results_dir=tmp_path)
    s.initialize_parameters(None)
    s.aggregate_updates(1, [
        ClientUpdate(0, [np.array([0.0], np.float32)], 10, {"sigma_sq": 0.0}),
        ClientUpdate(1, [np.array([3.0], np.float32)], 10, {"sigma_sq": 5.0}),
        ClientUpdate(2, [np.array([6.0], np.float32)], 10, {"sigma_sq": 20.0})])
    assert s.sigma0_sq == pytest.approx(9.0)
    assert s.store.values["sigma_sq"][0] == 0.0  # kept, as a known variance
    assert float(s.global_arrays[0][0]) == pytest.approx(1.94073, abs=1e-5)
