"""PLGU-GRep = FedRep and PLGU-GHN = pFedHN at rho = 0, FedRep's personal head, eq. 10's
scores, the hypernetwork's gradient from a client delta and pFedHN's server step -- on small
real FMNIST subsets (PLGU itself: tests/test_plgu.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flower_pfl.algorithms import plgu_math as pm
from flower_pfl.learning.models import initial_arrays
from flower_pfl.running import inprocess
from flower_pfl.strategies.base import ClientUpdate
from tests.test_plgu import _cfg, _run, _same


# --------------------------------------------------------------- PLGU-GRep / FedRep
def test_plgu_grep_at_rho_zero_is_fedrep(tmp_path):
    rep, rep_states = _run(_cfg("fedrep"), tmp_path, "rep")
    g0, g0_states = _run(_cfg("plgu-grep", **{"hyper.plgu-grep.rho": 0.0}), tmp_path, "g0")
    assert _same(rep.body, g0.body)
    for pid in range(4):
        assert _same(rep_states[pid].get_arrays("head"), g0_states[pid].get_arrays("head"))
    g, _ = _run(_cfg("plgu-grep"), tmp_path, "g")  # rho = 0.05: LWSAM on the body acts
    assert not _same(rep.body, g.body)


def test_fedrep_head_is_personal_and_body_is_shared(tmp_path):
    rep, states = _run(_cfg("fedrep", rounds=1), tmp_path, "rep")
    init = initial_arrays(_cfg("fedrep"))
    assert len(rep.body) == 6  # conv1, conv2, fc1 (weight + bias each); fc2 is the head
    assert not _same(rep.body, init[:6])
    heads = [states[pid].get_arrays("head") for pid in range(4)]
    assert all(len(h) == 2 for h in heads)
    assert not np.array_equal(heads[0][0], heads[1][0])  # each client its own head


def test_grep_scores_follow_eq10(tmp_path):
    from flwr.app import Context, RecordDict

    from flower_pfl.clients.plgu import PLGUGRepClient

    cfg = _cfg("plgu-grep")
    ctx = Context(run_id=0, node_id=1, node_config={"partition-id": 0}, state=RecordDict(),
                  run_config={})
    client = PLGUGRepClient(ctx)
    client.setup({"cfg": cfg.to_json(), "round": 1})
    body = initial_arrays(cfg)[:6]
    layers = [None, None, None]
    assert client.body_scales(body, layers) == pytest.approx([1.0, 1.0, 1.0])  # first time
    mine = [b.copy() for b in body]
    mine[0] = mine[0] + 1.0  # conv1's weight moved by 1 in every entry
    client.state.set_arrays("body", mine)
    lam = client.body_scales(body, layers)
    assert lam[0] == pytest.approx(3.0) and lam[1:] == pytest.approx([0.0, 0.0])


# ------------------------------------------------------------------ pFedHN / PLGU-GHN
def test_hypernetwork_gets_the_client_delta_as_gradient():
    torch.manual_seed(0)
    target = np.arange(6, dtype=np.float32)
    hn = pm.HyperNetwork(4, 8, target)
    v = torch.as_tensor(pm.init_embedding(4, 0, 1))
    with torch.no_grad():
        theta = hn(v)
    trained = theta + torch.tensor([1.0, -2.0, 0.0, 0.5, 0.0, 3.0])  # client delta
    grads, g_v = pm.hypernetwork_grads(hn, v, trained)
    names = [n for n, _ in hn.named_parameters()]
    by_name = dict(zip(names, grads))
    # d<theta, theta - theta~>/d bias_out = theta - theta~ = -delta
    torch.testing.assert_close(by_name["out.bias"], -(trained - theta))
    for n, g in by_name.items():
        assert float(g.abs().sum()) > 0, f"no gradient reaches {n}"
    assert float(g_v.abs().sum()) > 0  # the embedding learns too
    zero, zero_v = pm.hypernetwork_grads(hn, v, theta)  # no delta: no gradient
    assert all(float(g.abs().sum()) == 0 for g in zero) and float(zero_v.abs().sum()) == 0


def test_pfedhn_server_step_moves_hypernetwork_and_embedding(tmp_path):
    from flower_pfl.strategies.pfedhn import PFedHN

    cfg = _cfg("pfedhn")
    s = PFedHN(cfg, results_dir=tmp_path)
    s.initialize_parameters(inprocess.make_federation(4))
    theta0 = s.generate(1)
    assert _same(theta0, s.generate(1))
    v0 = s.store.get("embedding", 1).copy()
    hn0 = [p.detach().clone() for p in s.hn.parameters()]
    trained = [a + 0.01 for a in theta0]  # a client delta of +0.01 everywhere
    s.aggregate_updates(1, [ClientUpdate(1, trained, 10)])
    assert all(not torch.equal(a, b.detach()) for a, b in zip(hn0, s.hn.parameters()))
    assert not np.array_equal(v0, s.store.get("embedding", 1))
    assert np.array_equal(s.store.get("embedding", 0), s.store.get("embedding", 0))
    moved = s.spec.flatten(s.generate(1)) - s.spec.flatten(theta0)
    assert float(moved.mean()) > 0  # the generated model moved towards the trained one


def test_plgu_ghn_at_rho_zero_is_pfedhn(tmp_path):
    hn, _ = _run(_cfg("pfedhn"), tmp_path, "hn")
    g0, _ = _run(_cfg("plgu-ghn", **{"hyper.plgu-ghn.rho": 0.0}), tmp_path, "g0")
    assert all(torch.equal(a, b) for a, b in zip(hn.hn.parameters(), g0.hn.parameters()))
    g, _ = _run(_cfg("plgu-ghn"), tmp_path, "g")
    assert not all(torch.equal(a, b) for a, b in zip(hn.hn.parameters(), g.hn.parameters()))


def test_grep_and_ghn_scores_single_out_a_later_layer():
    """Eq. 10 (PLGU-GRep, over the body) and PLGU-GHN's eq. 6 put all of Lambda = L xi on
    the one layer that differs -- here the last body layer (fc1) / the last layer (fc2)."""
    from flower_pfl.clients.plgu import PLGUGHNClient, PLGUGRepClient
    from tests.test_baselines import make_client

    cfg = _cfg("plgu-grep")
    grep = make_client(PLGUGRepClient)
    grep.setup({"cfg": cfg.to_json(), "round": 2})
    body = initial_arrays(cfg)[:6]  # conv1, conv2, fc1 (weight + bias each)
    mine = [b.copy() for b in body]
    mine[4] = mine[4] + 0.01
    grep.state.set_arrays("body", mine)
    assert grep.body_scales(body, [None] * 3) == pytest.approx([0.0, 0.0, 3.0])

    cfg = _cfg("plgu-ghn")
    ghn = make_client(PLGUGHNClient)
    ghn.setup({"cfg": cfg.to_json(), "round": 2})
    generated = initial_arrays(cfg)
    model = ghn.new_model(generated)
    assert ghn.scales(generated, model) == pytest.approx([1.0] * 4)  # nothing trained yet
    trained = [a.copy() for a in generated]
    trained[7] = trained[7] + 0.01  # fc2's bias
    ghn.state.set_arrays("trained", trained)
    assert ghn.scales(generated, model) == pytest.approx([0.0, 0.0, 0.0, 4.0])
