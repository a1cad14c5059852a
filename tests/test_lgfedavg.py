"""LG-FedAvg (clients/lgfedavg.py, strategies/lgfedavg.py) on a DNN: the body fc1 -- the
local representation -- stays on each client and carries over rounds, only the head fc2
travels, and the server's head is the sample-weighted mean of the uploaded heads (Liang et
al. 2020, Algorithm 1)."""

from __future__ import annotations

import numpy as np
from flwr.common import parameters_to_ndarrays

from flower_pfl.learning.models import initial_arrays
from tests.conftest import small_config
from tests.test_baselines import replay_fit, state_arrays, two_rounds
from tests.test_fedper import DNN, gap, hand_made_mean


def test_the_body_never_leaves_and_carries_over_rounds(tmp_path):
    cfg = small_config(strategy="lg-fedavg", rounds=2, **DNN)
    s, proxies, before, ins, res = two_rounds(cfg, tmp_path)
    init = initial_arrays(cfg)
    for pid in (1, 2):
        sent = parameters_to_ndarrays(ins[pid].parameters)
        up = parameters_to_ndarrays(res[pid].parameters)
        # only the head travels, both ways: fc2's weight and bias
        assert [a.shape for a in sent] == [a.shape for a in up] == [a.shape for a in init[2:]]
        body1 = state_arrays(before[pid], "body")
        assert len(body1) == 2 and gap(body1, init[:2]) > 1e-4  # round 1 trained it
        body2 = state_arrays(proxies[pid].context.state, "body")
        again, _ = replay_fit(proxies[pid], before[pid], ins[pid])
        np.testing.assert_allclose(state_arrays(again, "body")[0], body2[0], atol=1e-6)
        fresh, _ = replay_fit(proxies[pid], None, ins[pid])
        assert gap(state_arrays(fresh, "body"), body2) > 1e-5


def test_the_head_is_the_sample_weighted_mean(tmp_path):
    got, want = hand_made_mean("lg-fedavg", tmp_path, kept=slice(0, 2))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
