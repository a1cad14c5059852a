"""FedACS: threshold, mask, weights and u_i by hand; selection follows the data groups."""

from __future__ import annotations

import numpy as np
import pytest

from flower_pfl.algorithms.attention import consensus_weights, fedacs_weights, quantile_threshold
from flower_pfl.learning.partitions import group_of_clients
from flower_pfl.running import inprocess
from tests.conftest import small_config

S = np.array([[1.0, 0.9, 0.2, 0.6],
              [0.9, 1.0, 0.3, 0.5],
              [0.2, 0.3, 1.0, 0.8],
              [0.6, 0.5, 0.8, 1.0]])
ALL = np.ones(4, dtype=bool)


def test_quantile_threshold_by_hand():
    entries = np.sort(S.ravel())  # 16 entries; numpy's default linear interpolation
    assert quantile_threshold(S, 0.5) == pytest.approx((entries[7] + entries[8]) / 2)
    assert quantile_threshold(S, 0.75) == pytest.approx(entries[11] + 0.25 * (entries[12] -
                                                                             entries[11]))
    assert quantile_threshold(S, 1.0) == 1.0 and quantile_threshold(S, 0.0) == 0.2


def test_mask_weights_and_u_by_hand():
    delta = 0.55
    xi = fedacs_weights(S, np.arange(4), ALL, delta)
    # client 0 selects itself (1.0), client 1 (0.9) and client 3 (0.6); not client 2 (0.2)
    assert xi[0] == pytest.approx(np.array([1.0, 0.9, 0.0, 0.6]) / 2.5)
    # client 2 selects itself and client 3 (0.8)
    assert xi[2] == pytest.approx(np.array([0.0, 0.0, 1.0, 0.8]) / 1.8)
    np.testing.assert_allclose(xi.sum(axis=1), 1.0)
    w = np.arange(8, dtype=np.float64).reshape(4, 2)
    assert (xi @ w)[0] == pytest.approx((1.0 * w[0] + 0.9 * w[1] + 0.6 * w[3]) / 2.5)


def test_self_always_selected_and_p1_is_local():
    delta = quantile_threshold(S, 1.0)  # p -> 1: delta = max(S) = 1
    xi = fedacs_weights(S, np.arange(4), ALL, delta)
    assert np.array_equal(xi, np.eye(4))  # only the client itself: pure local training
    lonely = fedacs_weights(S[[1]], np.array([1]), np.array([False, True, False, False]), -1.0)
    assert lonely.tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_delta_below_everything_gives_cosine_weighted_mean():
    xi = fedacs_weights(S, np.arange(4), ALL, -np.inf)
    np.testing.assert_allclose(xi, S / S.sum(axis=1, keepdims=True))


def test_newcomer_gets_the_consensus_of_stored_models():
    peers = np.array([True, True, False, True])
    xi = consensus_weights(S[[2]], peers)  # client 2 never uploaded
    assert xi[0] == pytest.approx(np.array([0.2, 0.3, 0.0, 0.8]) / 1.3)


def test_strategy_with_p1_sends_each_client_its_own_model(tmp_path):
    cfg = small_config(strategy="fedacs", clients=6, rounds=2, **{"hyper.fedacs.pick-ratio": 1.0})
    s = inprocess.run(cfg, tmp_path)
    rows = np.flatnonzero(s.matrix.seen)
    xi = s.attention(rows, 3)
    assert np.array_equal(xi[:, rows], np.eye(len(rows)))
    u = s.matrix.combine(xi)
    for k, pid in enumerate(rows):
        np.testing.assert_allclose(u[k], s.matrix.model(pid), atol=1e-6)


def test_selected_peers_are_mostly_in_the_own_group(tmp_path):
    cfg = small_config(strategy="fedacs", clients=12, rounds=4, **{
        "data.partition": "practical", "data.groups": 3, "data.subsample": 12000})
    s = inprocess.run(cfg, tmp_path)
    mask = np.load(tmp_path / "selection.npy").astype(bool)
    assert (tmp_path / "selection.png").exists() and (tmp_path / "peers.csv").exists()
    groups = group_of_clients(12, 3)
    off = ~np.eye(12, dtype=bool)
    same = (groups[:, None] == groups[None, :]) & off
    share = (mask & same).sum() / (mask & off).sum()
    assert share > 3 / 11 + 0.3, share  # chance: 3 same-group peers among 11
    assert all(np.isfinite(r["delta"]) for r in s.results.server_rows[1:])
    assert s.eval_history[-1]["mean"] > 0.5


def test_selection_share_and_mechanism_off_cases_by_hand():
    from flower_pfl.strategies.fedacs import selection_share

    peers = np.array([True, True, True, False])  # client 3 never uploaded
    rows = np.array([0, 1])
    xi = np.array([[0.5, 0.5, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    share, off = selection_share(xi, rows, peers, np.array([False, False]))
    assert share == pytest.approx((1 / 2 + 0 / 2) / 2) and off is None
    only_self = np.eye(4)[rows]
    assert selection_share(only_self, rows, peers, np.array([False, False])) == (0.0, "only itself")
    everyone = np.array([[0.4, 0.3, 0.3, 0.0], [0.3, 0.4, 0.3, 0.0]])
    assert selection_share(everyone, rows, peers, np.array([False, False])) == (1.0, "everyone")
    # a newcomer's consensus row (all peers) does not count; no qualifying client -> NaN
    assert selection_share(everyone, rows, peers, np.array([True, False]))[1] == "everyone"
    assert np.isnan(selection_share(everyone, rows, peers, np.array([True, True]))[0])


def test_p1_selects_only_itself_warns_and_logs_the_share(tmp_path, caplog):
    import logging

    cfg = small_config(strategy="fedacs", clients=6, rounds=3, model="mclr",
                       **{"hyper.fedacs.pick-ratio": 1.0})
    with caplog.at_level(logging.WARNING):
        s = inprocess.run(cfg, tmp_path)
    assert [r["selection_share"] for r in s.results.server_rows[1:]] == [0.0, 0.0]
    text = [r.getMessage() for r in caplog.records if "selected only itself" in r.getMessage()]
    assert len(text) == 1 and "hyper.fedacs.pick-ratio" in text[0]


def test_mid_pick_ratio_selects_some_peers_and_does_not_warn(tmp_path, caplog):
    import logging

    # (the default 0.8 with only 6 clients selects nobody: the 6 diagonal 1s are 17% of S,
    # so delta sits above every peer -- the warning above fires for it)
    cfg = small_config(strategy="fedacs", clients=6, rounds=3, model="mclr",
                       **{"hyper.fedacs.pick-ratio": 0.5})
    with caplog.at_level(logging.WARNING):
        s = inprocess.run(cfg, tmp_path)
    shares = [r["selection_share"] for r in s.results.server_rows[1:]]
    assert all(0 < v < 1 for v in shares), shares
    assert not [r for r in caplog.records if "fedacs round" in r.getMessage()]


def test_threshold_under_partial_participation_is_over_the_seen_clients_by_hand(tmp_path):
    """Three of five clients have uploaded: delta^k is the p-quantile of the 3 x 3 cosine
    matrix of THEIR models (by hand), not of a matrix with the never-seen clients' columns
    (their stored row is only the initial model)."""
    from flower_pfl.strategies.base import ClientUpdate
    from flower_pfl.strategies.fedacs import FedACS

    p = 0.6
    cfg = small_config(strategy="fedacs", clients=5, model="mclr", **{
        "data.subsample": 2000, "hyper.fedacs.pick-ratio": p})
    s = FedACS(cfg, results_dir=tmp_path)
    s.initialize_parameters(None)
    rng = np.random.default_rng(4)
    w0 = s.spec.flatten(s.initial_model).astype(np.float64)
    seen = [0, 2, 3]
    models = {pid: (w0 + rng.normal(0, 0.05 * (1 + k), w0.size)).astype(np.float32)
              for k, pid in enumerate(seen)}
    s.aggregate_updates(1, [ClientUpdate(pid, s.spec.unflatten(m), 50 + 40 * pid, {})
                            for pid, m in models.items()])
    m = np.stack([models[pid] for pid in seen]).astype(np.float64)
    norm = np.linalg.norm(m, axis=1)
    cos = m @ m.T / np.outer(norm, norm)
    want = float(np.quantile(cos, p))
    assert s.threshold() == pytest.approx(want, rel=1e-5, abs=1e-6)
    # with the unseen clients' columns the quantile moves: the test can tell
    m_all = np.stack([models.get(pid, w0) for pid in range(5)]).astype(np.float64)
    n_all = np.linalg.norm(m_all, axis=1)
    wrong = float(np.quantile((m @ m_all.T) / np.outer(norm, n_all), p))
    assert abs(wrong - want) > 1e-4, (wrong, want)
