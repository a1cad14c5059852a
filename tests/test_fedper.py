"""FedPer (clients/fedper.py, strategies/fedper.py) on a DNN: the head fc2 stays on each
client and carries over rounds, only the base fc1 travels, and the server's base is the
sample-weighted mean of the uploaded bases (Arivazhagan et al. 2019, Algorithm 1)."""

from __future__ import annotations

import numpy as np
from flwr.common import parameters_to_ndarrays

from flower_pfl import registry
from flower_pfl.learning.models import initial_arrays
from flower_pfl.strategies.base import ClientUpdate
from tests.conftest import small_config
from tests.test_baselines import TINY, replay_fit, state_arrays, two_rounds

# a DNN: fc1 (weight, bias) is the shared base, fc2 (weight, bias) each client's head
DNN = {**TINY, "model": "dnn"}


def gap(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def hand_made_mean(strategy: str, tmp_path, kept: slice):
    """The server's rule on hand-made uploads of clients of 10, 30 and 60 examples: the
    shared arrays after ``aggregate_updates`` and the weighted mean by hand (float64);
    ``kept`` the model arrays the clients keep (not uploaded)."""
    cfg = small_config(strategy=strategy, **DNN)
    s = registry.strategy_class(strategy)(cfg, results_dir=tmp_path)
    s.initialize_parameters(None)
    shapes = [a.shape for a in np.delete(np.array(initial_arrays(cfg), dtype=object),
                                         np.arange(4)[kept])]
    assert [a.shape for a in s.shared] == shapes  # the template: the shared part only
    rng = np.random.default_rng(7)
    uploads = [[rng.normal(size=shape).astype(np.float32) for shape in shapes]
               for _ in range(3)]
    counts = [10, 30, 60]
    s.aggregate_updates(1, [ClientUpdate(pid, up, n, {})
                            for pid, (up, n) in enumerate(zip(uploads, counts))])
    want = [sum(n * u[k].astype(np.float64) for n, u in zip(counts, uploads)) / 100
            for k in range(len(shapes))]
    plain = [np.mean([u[k] for u in uploads], axis=0) for k in range(len(shapes))]
    assert gap(plain, want) > 1e-2  # the weights matter
    return s.shared, want


def test_the_head_never_leaves_and_carries_over_rounds(tmp_path):
    cfg = small_config(strategy="fedper", rounds=2, **DNN)
    s, proxies, before, ins, res = two_rounds(cfg, tmp_path)
    init = initial_arrays(cfg)
    for pid in (0, 3):
        sent = parameters_to_ndarrays(ins[pid].parameters)
        up = parameters_to_ndarrays(res[pid].parameters)
        # only the base travels, both ways: fc1's weight and bias
        assert [a.shape for a in sent] == [a.shape for a in up] == [a.shape for a in init[:2]]
        head1 = state_arrays(before[pid], "head")
        assert len(head1) == 2 and gap(head1, init[2:]) > 1e-3  # round 1 trained it
        # round 2 starts from the round-1 head: a replay from that state is the real round
        # 2, a client that lost its head (fresh state) ends elsewhere
        head2 = state_arrays(proxies[pid].context.state, "head")
        again, _ = replay_fit(proxies[pid], before[pid], ins[pid])
        np.testing.assert_allclose(state_arrays(again, "head")[0], head2[0], atol=1e-6)
        fresh, _ = replay_fit(proxies[pid], None, ins[pid])
        assert gap(state_arrays(fresh, "head"), head2) > 1e-4


def test_the_base_is_the_sample_weighted_mean(tmp_path):
    got, want = hand_made_mean("fedper", tmp_path, kept=slice(2, 4))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
