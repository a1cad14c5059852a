"""IFCA (clients/ifca.py, strategies/ifca.py, algorithms/ifca_math.py; Ghosh et al. 2020,
Algorithm 2): the client's cluster estimation (line 5) and the server's per-cluster means
(line 12), by hand with asymmetric inputs, and a short run."""

from __future__ import annotations

import csv

import numpy as np
import torch
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from torch.nn import functional as F

from flower_pfl import registry
from flower_pfl.running import inprocess
from flower_pfl.strategies.base import ClientUpdate
from tests.conftest import small_config
from tests.test_baselines import TINY, make_client

IFCA3 = {**TINY, "hyper.ifca.clusters": 3}


def _strategy(tmp_path, **overrides):
    s = registry.strategy_class("ifca")(small_config(strategy="ifca", **{**IFCA3, **overrides}),
                                        results_dir=tmp_path)
    s.initialize_parameters(None)
    return s


def test_per_cluster_means_weighted_by_sample_count_and_an_unchosen_cluster_kept(tmp_path):
    """Line 12 by hand: uploads of constant arrays (2, 6 and 7) with sizes 10, 30 and 25;
    the first two chose cluster 2, the third cluster 0, nobody cluster 1.  Cluster 2 is
    (10*2 + 30*6)/40 = 5 (the plain mean would be 4), cluster 0 is 7, cluster 1 unchanged."""
    s = _strategy(tmp_path)
    before = [[a.copy() for a in m] for m in s.clusters]
    assert len(before) == 3
    shapes = [a.shape for a in before[0]]
    ups = [ClientUpdate(pid, [np.full(sh, v, np.float32) for sh in shapes], n, {"cluster": c})
           for pid, (v, n, c) in enumerate([(2.0, 10, 2), (6.0, 30, 2), (7.0, 25, 0)])]
    s.aggregate_updates(1, ups)
    for a in s.clusters[2]:
        np.testing.assert_allclose(a, 5.0, rtol=1e-6)
    for a in s.clusters[0]:
        np.testing.assert_allclose(a, 7.0, rtol=1e-6)
    assert all(np.array_equal(a, b) for a, b in zip(s.clusters[1], before[1]))
    assert s._round_server_log["cluster_counts"] == "1 0 2"


def test_initial_clusters_differ_and_are_seeded(tmp_path):
    """Cluster 0 is the run's initial model; the others are distinct re-initialisations,
    the same for the same seed (a resumed or repeated run starts from the same k models)."""
    from flower_pfl.learning.models import initial_arrays

    s, again = _strategy(tmp_path / "a"), _strategy(tmp_path / "b")
    init = initial_arrays(s.cfg)
    assert all(np.array_equal(a, b) for a, b in zip(s.clusters[0], init))
    for j in (1, 2):
        assert all(np.array_equal(a, b) for a, b in zip(s.clusters[j], again.clusters[j]))
        assert min(float(np.abs(a - b).max()) for a, b in zip(s.clusters[j], init)) > 1e-3
    assert float(np.abs(s.clusters[1][0] - s.clusters[2][0]).max()) > 1e-3


def _mclr_loss(arrays, x, y):
    """An MCLR model's mean cross-entropy on (x, y), by hand in float64."""
    w, b = (torch.tensor(a, dtype=torch.float64) for a in arrays)
    return float(F.cross_entropy(x[0:len(y)].flatten(1).double() @ w.T + b, y))


def test_client_picks_the_lowest_training_loss_and_a_tie_goes_to_the_lower_index(tmp_path):
    """Line 5 through the real client: of the clusters (initial, B, B) with B the initial
    model moved towards the client's own labels, B has the lowest training loss (by hand),
    twice: the client must choose 1 (not 0, not the tied 2), train from B and say so."""
    s = _strategy(tmp_path)
    arrays, config = s.fit_payload(1, 1)
    client = make_client(registry.client_class("ifca"), pid=1)
    client.setup({**config, "cfg": s.cfg.to_json()})
    x, y = client.data.x_train, client.data.y_train
    init = [a.copy() for a in s.clusters[0]]
    counts = np.bincount(y.numpy(), minlength=init[1].shape[0])
    better = [init[0], init[1] + np.log(counts + 1.0).astype(np.float32)]  # its label prior
    losses = [_mclr_loss(m, x, y) for m in (init, better, better)]
    assert losses[1] == losses[2] < losses[0] - 0.1, losses
    download = [*init, *better, *[a.copy() for a in better]]
    up, n, metrics = client.fit(download, {**config, "cfg": s.cfg.to_json()})
    assert metrics["cluster"] == 1
    # the upload is local SGD from B, not from the initial model
    from_b = float(np.abs(up[1] - better[1]).max())
    assert from_b < float(np.abs(up[1] - init[1]).max())
    # evaluation scores the same choice
    client.evaluate(download, {**config, "cfg": s.cfg.to_json(), "eval-global": False})
    assert client.chosen == (1, 3)


def _fit_res(arrays, metrics, n=20):
    return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), n,
                  {"partition-id": 0, **metrics})


def test_update_norm_is_held_to_the_chosen_cluster_and_a_bad_index_is_refused(tmp_path):
    """max-update-norm is checked against the model of the cluster the upload names (the
    download is all k): cluster 1's own model is an update of 0 there, and far from 0's."""
    s = _strategy(tmp_path, **{"max-update-norm": 0.01})
    template = s.template(1)
    own = [a.copy() for a in s.clusters[1]]
    assert s.upload_problem(0, own, _fit_res(own, {"cluster": 1}), template, 0.01) is None
    far = s.upload_problem(0, own, _fit_res(own, {"cluster": 0}), template, 0.01)
    assert far is not None and "max-update-norm" in far
    bad = s.upload_problem(0, own, _fit_res(own, {"cluster": 3}), template, 0.01)
    assert bad is not None and "outside [0, 3)" in bad
    missing = s.upload_problem(0, own, _fit_res(own, {}), template, 0.01)
    assert missing is not None and "'cluster'" in missing


def test_a_short_run_trains_the_chosen_clusters(tmp_path):
    """Two rounds in one process: every upload named a cluster (server.csv), the chosen
    clusters moved, every client evaluated its estimated cluster model."""
    k = 2
    cfg = small_config(strategy="ifca", rounds=2, **{**TINY, "hyper.ifca.clusters": k})
    s = inprocess.run(cfg, tmp_path)
    with open(tmp_path / "server.csv") as fh:
        counts = [[int(c) for c in r["cluster_counts"].split()] for r in csv.DictReader(fh)]
    assert [sum(c) for c in counts] == [cfg["clients"]] * 2 and all(len(c) == k for c in counts)
    with open(tmp_path / "clients.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r["round"] == "2"]
    assert len(rows) == cfg["clients"]
    assert len(s.clusters) == k


def test_a_held_out_newcomer_is_scored_on_its_rule_without_a_local_step(tmp_path):
    """A held-out newcomer (never sampled) evaluates its estimated cluster model, as its contract's
    rule says: no adaptation step, the same score before and after."""
    cfg = small_config(strategy="ifca", rounds=2, **{**TINY, "newcomers.clients": [1]})
    inprocess.run(cfg, tmp_path)
    with open(tmp_path / "clients.csv") as fh:
        new = [r for r in csv.DictReader(fh) if r["round"] == "2" and r["newcomer"] == "1"]
    assert [r["partition-id"] for r in new] == ["1"] and new[0]["newcomer_steps"] == "0"
    assert new[0]["newcomer_before"] == new[0]["newcomer_after"]
