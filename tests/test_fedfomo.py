"""FedFomo (clients/fedfomo.py, strategies/fedfomo.py, algorithms/fedfomo_math.py; Zhang et
al., ICLR 2021): the peer weights by hand (loss improvement over distance, negatives dropped,
normalised), the first-order update through the real client, the server's peer choice and
affinity, and a short run."""

from __future__ import annotations

import csv

import numpy as np
import torch
from torch.nn import functional as F

from flower_pfl import registry
from flower_pfl.algorithms.fedfomo_math import fomo_weights
from flower_pfl.running import inprocess
from flower_pfl.strategies.base import ClientUpdate
from tests.conftest import small_config
from tests.test_baselines import TINY, make_client


def test_weights_are_loss_improvement_over_distance_negatives_dropped_normalised():
    """Own loss 1.0; peers (loss, distance): (0.5, 2) -> 0.25, (1.2, 1) -> -0.2 dropped,
    (0.8, 0.5) -> 0.4, (0.7, 0) the same model -> 0; normalised by 0.65."""
    got = fomo_weights(1.0, [0.5, 1.2, 0.8, 0.7], [2.0, 1.0, 0.5, 0.0])
    np.testing.assert_allclose(got, [0.25 / 0.65, 0.0, 0.4 / 0.65, 0.0], rtol=1e-12)
    # every peer worse: no move at all (the client keeps its own model)
    assert fomo_weights(1.0, [1.5, 2.0], [1.0, 3.0]).tolist() == [0.0, 0.0]


def _mclr_loss(arrays, x, y):
    w, b = (torch.tensor(a, dtype=torch.float64) for a in arrays)
    return float(F.cross_entropy(x.flatten(1).double() @ w.T + b, y))


def test_a_newcomer_evaluates_the_first_order_update_by_hand_and_a_fit_reports_its_weights(
        tmp_path):
    """Three peers of the initial MCLR model: its bias moved by the client's log label prior
    (better), by minus it (worse) and by half of it.  On the client's validation split, by
    hand: the losses, the distances, the weights and theta + sum_j w_j (theta_j - theta);
    the never-trained client's personalized model is that update, and a fit reports the
    same weights."""
    cfg = small_config(strategy="fedfomo", **{**TINY, "hyper.fedfomo.val-fraction": 0.3})
    s = registry.strategy_class("fedfomo")(cfg, results_dir=tmp_path)
    s.initialize_parameters(None)
    client = make_client(registry.client_class("fedfomo"), pid=2)
    config = {"cfg": cfg.to_json(), "round": 1, "peer-ids": "0,1,3", "val-fraction": 0.3}
    client.setup(config)
    own = [a.copy() for a in s._initial]
    counts = np.bincount(client.data.y_train.numpy(), minlength=10)
    prior = np.log(counts + 1.0).astype(np.float32)
    peers = [[own[0], own[1] + prior], [own[0], own[1] - prior], [own[0], own[1] + prior / 2]]
    train_idx, val = client.val_split(0.3)
    assert len(val) == round(0.3 * client.data.num_train) and len(train_idx) + len(val) == \
        client.data.num_train
    xv, yv = client.data.x_train[val], client.data.y_train[val]
    own_loss = _mclr_loss(own, xv, yv)
    raw = []
    for p in peers:
        dist = float(np.sqrt(sum(((a.astype(np.float64) - b) ** 2).sum() for a, b in zip(p, own))))
        raw.append(max(0.0, (own_loss - _mclr_loss(p, xv, yv)) / dist))
    want_w = np.array(raw) / sum(raw)
    assert want_w[1] == 0 and min(want_w[0], want_w[2]) > 0.1, want_w
    want = [o + sum(w * (p[k].astype(np.float64) - o) for w, p in zip(want_w, peers))
            for k, o in enumerate(own)]
    download = [a for p in peers for a in p]
    got = [t.detach().numpy() for t in client.personal_model(download, config).state_dict()
           .values()]
    assert max(float(np.abs(g - w).max()) for g, w in zip(got, want)) < 1e-5
    _, _, metrics = client.fit(download, config)
    reported = [float(w) for w in str(metrics["peer_weights"]).split(",")]
    np.testing.assert_allclose(reported, want_w, rtol=1e-6, atol=1e-9)


def test_server_picks_the_highest_affinity_peers_and_adds_the_reported_weights(tmp_path):
    """epsilon 0, M = 2, five clients all stored: client 0's row of P is (-, 0.2, 0.5, 0.5,
    0.1): it gets 2 then 3 (the tie of 0.5 to the lower id), never itself; its reply
    (0.7, 0.3) adds to P[0, 2] and P[0, 3]."""
    cfg = small_config(strategy="fedfomo", **{**TINY, "clients": 5, "hyper.fedfomo.peers": 2,
                                              "hyper.fedfomo.epsilon": 0.0})
    s = registry.strategy_class("fedfomo")(cfg, results_dir=tmp_path)
    s.initialize_parameters(None)
    s.prepare_round(1, list(range(5)))
    assert all(c == [] for c in s.chosen.values())  # nothing stored yet: no peer
    rng = np.random.default_rng(0)
    s.aggregate_updates(1, [ClientUpdate(p, [(a + rng.normal(0, 0.01, a.shape)).astype(
        np.float32) for a in s._initial], 10, {"peer_weights": ""}) for p in range(5)])
    s.affinity[0] = [0.0, 0.2, 0.5, 0.5, 0.1]
    s.prepare_round(2, [0])
    assert s.chosen[0] == [2, 3]
    arrays, config = s.fit_payload(0, 2)
    assert config["peer-ids"] == "2,3" and len(arrays) == 2 * len(s._initial)
    np.testing.assert_allclose(arrays[0], s.matrix.model(2)[:arrays[0].size].reshape(
        arrays[0].shape), rtol=1e-6)
    s.aggregate_updates(2, [ClientUpdate(0, s._initial, 10, {"peer_weights": "0.7,0.3"})])
    np.testing.assert_allclose(s.affinity[0], [0.0, 0.2, 1.2, 0.8, 0.1])


def test_a_short_run_sends_peers_from_round_two(tmp_path):
    cfg = small_config(strategy="fedfomo", rounds=2, **TINY)
    s = inprocess.run(cfg, tmp_path)
    with open(tmp_path / "server.csv") as fh:
        sent = [float(r["peers_sent"]) for r in csv.DictReader(fh)]
    assert sent[0] == 0 and sent[1] == min(5, cfg["clients"] - 1)
    with open(tmp_path / "clients.csv") as fh:
        assert len([r for r in csv.DictReader(fh) if r["round"] == "2"]) == cfg["clients"]
    assert s.matrix.seen.all()


def test_a_held_out_newcomer_is_scored_on_its_rule_without_a_local_step(tmp_path):
    """A held-out newcomer (never sampled) evaluates the first-order update of the initial
    model by its peers, as its contract's rule says: no adaptation step, the same score
    before and after."""
    cfg = small_config(strategy="fedfomo", rounds=2, **{**TINY, "newcomers.clients": [1]})
    inprocess.run(cfg, tmp_path)
    with open(tmp_path / "clients.csv") as fh:
        new = [r for r in csv.DictReader(fh) if r["round"] == "2" and r["newcomer"] == "1"]
    assert [r["partition-id"] for r in new] == ["1"] and new[0]["newcomer_steps"] == "0"
    assert new[0]["newcomer_before"] == new[0]["newcomer_after"]
