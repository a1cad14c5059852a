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


def assert_kept_part_stays_and_carries_over(strategy: str, key: str, kept: slice,
                                            pids: tuple[int, ...], tmp_path) -> None:
    """Two rounds of ``strategy`` on the DNN: only the arrays outside ``kept`` travel, both
    ways; the kept ones (``context.state[key]``) were trained in round 1, and round 2 starts
    from them: a replay from that state is the real round 2, a client that lost them (a
    fresh state) ends elsewhere."""
    cfg = small_config(strategy=strategy, rounds=2, **DNN)
    s, proxies, before, ins, res = two_rounds(cfg, tmp_path)
    init = initial_arrays(cfg)
    shared = [a.shape for i, a in enumerate(init) if i not in range(4)[kept]]
    for pid in pids:
        sent = parameters_to_ndarrays(ins[pid].parameters)
        up = parameters_to_ndarrays(res[pid].parameters)
        assert [a.shape for a in sent] == [a.shape for a in up] == shared
        part1 = state_arrays(before[pid], key)
        assert len(part1) == 2 and gap(part1, init[kept]) > 1e-4  # round 1 trained it
        part2 = state_arrays(proxies[pid].context.state, key)
        again, _ = replay_fit(proxies[pid], before[pid], ins[pid])
        np.testing.assert_allclose(state_arrays(again, key)[0], part2[0], atol=1e-6)
        fresh, _ = replay_fit(proxies[pid], None, ins[pid])
        assert gap(state_arrays(fresh, key), part2) > 1e-5


def test_the_head_never_leaves_and_carries_over_rounds(tmp_path):
    # only the base (fc1's weight and bias) travels; the head fc2 stays and carries over
    assert_kept_part_stays_and_carries_over("fedper", "head", slice(2, 4), (0, 3), tmp_path)


def test_the_base_is_the_sample_weighted_mean(tmp_path):
    got, want = hand_made_mean("fedper", tmp_path, kept=slice(2, 4))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_a_newcomer_starts_from_the_global_base_and_the_initial_head(tmp_path):
    """A held-out newcomer (docs/newcomers.md) is scored before it adapts on (the global
    base, the initial head) -- by hand on its test split -- and adapts for the budget."""
    import csv

    import torch

    from flower_pfl.learning.client_data import load_client_data
    from flower_pfl.learning.models import model_for, set_arrays
    from flower_pfl.learning.training import evaluate
    from flower_pfl.running import inprocess

    cfg = small_config(strategy="fedper", rounds=1, **{**DNN, "clients": 5},
                       **{"newcomers.clients": [3], "newcomers.budget-steps": 4})
    s = inprocess.run(cfg, tmp_path)
    with open(tmp_path / "clients.csv") as fh:
        row = next(r for r in csv.DictReader(fh) if r["newcomer"] == "1")
    assert int(row["partition-id"]) == 3 and int(row["newcomer_steps"]) == 4
    model, data = model_for(cfg), load_client_data(cfg.values, 3, None)
    set_arrays(model, list(s.shared) + initial_arrays(cfg)[2:])
    _, before = evaluate(model, data.x_test, data.y_test, torch.device("cpu"))
    assert abs(float(row["newcomer_before"]) - before) < 1e-9
    set_arrays(model, initial_arrays(cfg))  # the initial model scores otherwise
    assert abs(evaluate(model, data.x_test, data.y_test, torch.device("cpu"))[1] - before) > 0.01
