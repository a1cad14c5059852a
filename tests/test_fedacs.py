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


# ------------------------------------------------- ties, delta < 0, an all-zero initial model
def test_a_peer_exactly_at_delta_is_not_selected():
    """Eq. 4 selects s_ij > delta, strictly.  p = 0.6 over S's 16 entries lands on index
    0.6 * 15 = 9 of the sorted entries (.2 .2 .3 .3 .5 .5 .6 .6 .8 .8 .9 .9 1 1 1 1): delta
    = 0.8, the similarity of clients 2 and 3 -- a tie, left out.  Two identical clients
    (cos 1) and p = 1 (delta = 1) stay apart: p = 1 is Local."""
    delta = quantile_threshold(S, 0.6)
    assert delta == 0.8
    xi = fedacs_weights(S, np.arange(4), ALL, delta)
    assert xi[0] == pytest.approx(np.array([1.0, 0.9, 0.0, 0.0]) / 1.9)
    assert xi[1] == pytest.approx(np.array([0.9, 1.0, 0.0, 0.0]) / 1.9)
    assert xi[2].tolist() == [0.0, 0.0, 1.0, 0.0]  # 0.8 == delta: not above it
    assert xi[3].tolist() == [0.0, 0.0, 0.0, 1.0]
    twins = np.array([[1.0, 1.0, 0.3], [1.0, 1.0, 0.3], [0.3, 0.3, 1.0]])
    assert quantile_threshold(twins, 1.0) == 1.0
    assert np.array_equal(fedacs_weights(twins, np.arange(3), np.ones(3, bool), 1.0), np.eye(3))


def test_dropped_nonpositive_pairs_and_consensus_fallback_by_hand():
    from flower_pfl.algorithms.attention import consensus_fallback, fedacs_dropped

    s = np.array([[1.0, -0.2, -0.9, 0.7],
                  [-0.2, 1.0, 0.1, 0.0],
                  [-0.9, 0.1, 1.0, -0.6],
                  [0.7, 0.0, -0.6, 1.0]])
    # delta = -0.3: eq. 4 selects row 0's -0.2, row 1's -0.2 and 0.0, row 3's 0.0; all dropped
    assert fedacs_dropped(s, np.arange(4), ALL, -0.3).tolist() == [1, 2, 0, 1]
    assert fedacs_dropped(s, np.arange(4), ALL, 0.05).tolist() == [0, 0, 0, 0]
    xi = fedacs_weights(s, np.arange(4), ALL, -0.3)
    assert xi[1] == pytest.approx(np.array([0.0, 1.0, 0.1, 0.0]) / 1.1)
    # a newcomer whose row is all <= 0 (a zero initial model) gets the plain mean of the peers
    peers = np.array([True, False, True, True])
    rows = np.array([[0.0, 0.0, 0.0, 0.0], [0.5, 0.0, -0.4, 0.25]])
    assert consensus_fallback(rows, peers).tolist() == [True, False]
    xi = consensus_weights(rows, peers)
    assert xi[0] == pytest.approx([1 / 3, 0.0, 1 / 3, 1 / 3])
    assert xi[1] == pytest.approx([0.5 / 0.75, 0.0, 0.0, 0.25 / 0.75])
    with pytest.raises(ValueError, match="at least one stored peer"):
        consensus_weights(rows, np.zeros(4, bool))


def _fedacs_with_models(tmp_path, vectors, pick_ratio):
    """A FedACS server holding one stored model per client: ``vectors`` in the first two
    coordinates of an MCLR model's parameters, zeros elsewhere."""
    from flower_pfl.strategies.base import ClientUpdate
    from flower_pfl.strategies.fedacs import FedACS

    cfg = small_config(strategy="fedacs", clients=len(vectors), model="mclr", **{
        "data.subsample": 2000, "hyper.fedacs.pick-ratio": pick_ratio})
    s = FedACS(cfg, results_dir=tmp_path)
    s.initialize_parameters(None)
    size = s.spec.flatten(s.initial_model).size
    models = np.zeros((len(vectors), size), dtype=np.float32)
    models[:, :2] = vectors
    s.aggregate_updates(1, [ClientUpdate(p, s.spec.unflatten(models[p]), 100, {})
                            for p in range(len(vectors))])
    return s


def test_pairs_dropped_below_zero_are_in_server_csv_the_log_and_the_mechanism_line(
        tmp_path, caplog):
    """Four opposed models; cosines by hand: c01 = -0.2/sqrt(1.04) = -0.196, c02 = -0.995,
    c03 = 0.707, c12 = 0.098, c13 = 0.555, c23 = -0.774.  p = 0.25: index 3.75 of the 16
    sorted entries, between -0.774 and -0.196: delta = -0.774 + 0.75 (-0.196 + 0.774) =
    -0.340 < 0, so eq. 4 selects s_01 = -0.196 (both ways), which is dropped."""
    import json
    import logging
    import math

    vectors = np.array([[1.0, 0.0], [-0.2, 1.0], [-1.0, -0.1], [1.0, 1.0]])
    s = _fedacs_with_models(tmp_path, vectors, 0.25)
    c01 = -0.2 / math.sqrt(1.04)
    c23 = (-1.0 - 0.1) / (math.sqrt(1.01) * math.sqrt(2.0))
    with caplog.at_level(logging.INFO):
        s.prepare_round(2, [0, 2])  # row 0 drops peer 1; row 2's -0.995, -0.774 < delta
        assert s.delta == pytest.approx(c23 + 0.75 * (c01 - c23), abs=1e-5)
        assert s.round_server_log["dropped_nonpositive"] == 1
        s.prepare_round(3, [0, 1, 2, 3])  # rows 0 and 1 each drop the other
        assert s.round_server_log["dropped_nonpositive"] == 2
        s.report_run_end([], None)
    said = [r.getMessage() for r in caplog.records if "fedacs round" in r.getMessage()]
    assert len(said) == 1 and "round 2: delta = -0.34" in said[0], said  # once per run
    assert "selects 1 pair(s) with s_ij <= 0; they are dropped" in said[0]
    line = [r.getMessage() for r in caplog.records if "client-rounds" in r.getMessage()]
    assert len(line) == 1 and "3 pair(s) with delta < s_ij <= 0 dropped" in line[0], line
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["fedacs"] == {"dropped_nonpositive": 3, "consensus_uniform": 0}
    assert "3 pair(s)" in summary["mechanism"]["what"]


def test_scalar_model_with_half_sampled_runs_and_records_the_plain_mean_start(tmp_path, caplog):
    """The issue's input: model scalar, fraction-fit 0.5.  Newcomers are stored as theta = 0,
    cosine 0 to everyone: they start from the plain mean of the stored thetas (was: a
    ValueError in round 1's evaluation), one WARNING names the cause, server.csv counts them."""
    import json
    import logging

    cfg = small_config(strategy="fedacs", clients=6, rounds=3, model="scalar", **{
        "fraction-fit": 0.5, "data": {"dataset": "synthetic-gaussian", "partition": "iid"},
        "train.batch-size": 100000, "train.lr": 0.01})
    with caplog.at_level(logging.WARNING):
        s = inprocess.run(cfg, tmp_path)
    assert len(s.eval_history) == 3
    said = [r.getMessage() for r in caplog.records if "plain mean" in r.getMessage()]
    assert len(said) == 1 and "model: scalar" in said[0] and "cosine 0" in said[0]
    peers = s.peers()
    newcomers = np.flatnonzero(~s.matrix.seen)
    assert peers.sum() >= 1 and len(newcomers) >= 1  # 3 of 6 a round, 3 rounds: seen by hand
    xi = s.attention(newcomers, 4)
    np.testing.assert_allclose(xi, np.tile(peers / peers.sum(), (len(newcomers), 1)))
    thetas = np.array([s.matrix.model(p)[0] for p in np.flatnonzero(peers)], dtype=np.float64)
    assert s.matrix.combine(xi)[0, 0] == pytest.approx(thetas.mean(), abs=1e-6)
    column = [r["consensus_uniform"] for r in s.results.server_rows]
    assert column[0] == 0 and sum(column) >= 1  # round 1: nothing stored, no consensus
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["fedacs"]["consensus_uniform"] >= sum(column)  # plus evaluation rounds
    assert "plain mean" in summary["mechanism"]["what"]
