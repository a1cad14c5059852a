"""LG-FedAvg (clients/lgfedavg.py, strategies/lgfedavg.py) on a DNN: the body fc1 -- the
local representation -- stays on each client and carries over rounds, only the head fc2
travels, and the server's head is the sample-weighted mean of the uploaded heads (Liang et
al. 2020, Algorithm 1)."""

from __future__ import annotations

import numpy as np

from tests.test_fedper import assert_kept_part_stays_and_carries_over, hand_made_mean


def test_the_body_never_leaves_and_carries_over_rounds(tmp_path):
    # only the head (fc2's weight and bias) travels; the body fc1 stays and carries over
    assert_kept_part_stays_and_carries_over("lg-fedavg", "body", slice(0, 2), (1, 2),
                                            tmp_path)


def test_the_head_is_the_sample_weighted_mean(tmp_path):
    got, want = hand_made_mean("lg-fedavg", tmp_path, kept=slice(0, 2))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
