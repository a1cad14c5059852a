"""HeurFedAMP (eq. 8) in an unsaturated regime: cosines of the stored models themselves.

test_fedamp.py holds eq. 8 by hand on given cosines and the strategy on models grown from
the initial model with sigma = 1000, where the softmax saturates (one peer takes all the
peer weight) and a cosine of the wrong vectors (w - w^0 instead of w) picks the same peer.
Here sigma = 2 and the models are unit vectors with Pythagorean cosines, so every peer
weight is a hand-written number that a wrong cosine moves.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.conftest import small_config

# unit vectors in the first two coordinates: cos(c_i, c_j) = c_i . c_j, by hand
VECTORS = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [-0.8, 0.6]])
COS = np.array([[1.0, 0.6, 0.0, -0.8],
                [0.6, 1.0, 0.8, 0.0],
                [0.0, 0.8, 1.0, 0.6],
                [-0.8, 0.0, 0.6, 1.0]])


def test_strategy_weights_are_eq8_of_the_models_themselves_unsaturated(tmp_path):
    """sigma = 2, self-weight 0.3, rows 0 and 2 sampled.  Row 0's peers 1, 2, 3 have cos
    0.6, 0, -0.8: xi_0j = 0.7 e^{2 cos} / (e^1.2 + e^0 + e^-1.6); row 2's peers 0, 1, 3
    have cos 0, 0.8, 0.6: 0.7 e^{2 cos} / (e^0 + e^1.6 + e^1.2).  The models are not near
    0 and not near the initial model (an MCLR initialisation of norm ~1.8), so cosines of
    w - w^0 differ from these."""
    from flower_pfl.strategies.base import ClientUpdate
    from flower_pfl.strategies.heurfedamp import HeurFedAMP

    assert np.allclose(VECTORS @ VECTORS.T, COS)  # the table above is these vectors' cosines
    cfg = small_config(strategy="heurfedamp", clients=4, model="mclr", **{
        "data.subsample": 2000, "hyper.heurfedamp.sigma": 2.0,
        "hyper.heurfedamp.self-weight": 0.3})
    s = HeurFedAMP(cfg, results_dir=tmp_path)
    s.initialize_parameters(None)
    models = np.zeros((4, s.spec.flatten(s.initial_model).size), dtype=np.float32)
    models[:, :2] = VECTORS
    s.aggregate_updates(1, [ClientUpdate(p, s.spec.unflatten(models[p]), 100 + 30 * p, {})
                            for p in range(4)])
    xi = s.attention(np.array([0, 2]), 2)
    z0 = math.exp(1.2) + 1.0 + math.exp(-1.6)
    z2 = 1.0 + math.exp(1.6) + math.exp(1.2)
    want = np.array([[0.3, 0.7 * math.exp(1.2) / z0, 0.7 / z0, 0.7 * math.exp(-1.6) / z0],
                     [0.7 / z2, 0.7 * math.exp(1.6) / z2, 0.3, 0.7 * math.exp(1.2) / z2]])
    np.testing.assert_allclose(xi, want, rtol=1e-5)
    assert want[0, 1] == pytest.approx(0.51395, abs=1e-5)  # the numbers, written out
    assert want[1, 1] == pytest.approx(0.37389, abs=1e-5)
