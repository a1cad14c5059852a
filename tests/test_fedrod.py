"""FedRoD (clients/fedrod.py, strategies/fedrod.py, algorithms/fedrod_math.py; Chen & Chao,
ICLR 2022): the balanced-softmax loss by hand on a skewed label count, two local steps of
the real client by hand, the personalized logits (generic + personal) and the newcomer's
generic model."""

from __future__ import annotations

import csv
import math

import numpy as np
import torch
from torch.nn import functional as F

from flower_pfl import registry
from flower_pfl.algorithms.fedrod_math import balanced_softmax_loss, label_counts
from flower_pfl.running import inprocess
from tests.conftest import small_config
from tests.test_baselines import TINY, make_client, state_arrays
from tests.test_fedprox import client_order, max_gap

DNN = {**TINY, "model": "dnn"}


def test_balanced_softmax_equals_a_hand_computation_on_a_skewed_label_count():
    """L = -log(n_y e^{z_y} / sum_c n_c e^{z_c}) with counts (5, 0, 1, 2): class 1 never
    seen (weight 0), class 0 five times the weight of class 2."""
    labels = torch.tensor([0, 0, 0, 0, 0, 2, 3, 3])
    counts = label_counts(labels, 4)
    assert counts.tolist() == [5.0, 0.0, 1.0, 2.0]
    z = [[1.0, 2.0, 0.5, -1.0], [0.0, 0.3, 1.2, 0.4]]
    y = [0, 3]
    n = [5, 0, 1, 2]
    by_hand = sum(-math.log(n[t] * math.exp(row[t])
                            / sum(nc * math.exp(zc) for nc, zc in zip(n, row)))
                  for row, t in zip(z, y)) / 2
    got = float(balanced_softmax_loss(torch.tensor(z, dtype=torch.float64), torch.tensor(y),
                                      counts))
    assert abs(got - by_hand) < 1e-9, (got, by_hand)
    plain = float(F.cross_entropy(torch.tensor(z), torch.tensor(y)))
    assert abs(plain - by_hand) > 0.1


def _client_round(tmp_path, lr=0.1, steps=2):
    cfg = small_config(strategy="fedrod", **{**DNN, "train.lr": lr, "train.steps": steps,
                                             "train.batch-size": 16})
    s = registry.strategy_class("fedrod")(cfg, results_dir=tmp_path)
    s.initialize_parameters(None)
    arrays, extra = s.fit_payload(1, 1)
    client = make_client(registry.client_class("fedrod"), pid=1)
    up, _, _ = client.fit([a.copy() for a in arrays], {"cfg": cfg.to_json(), "round": 1, **extra})
    return cfg, client, [a.copy() for a in arrays], up


def test_two_local_steps_by_hand(tmp_path):
    """Two steps of the real client on a DNN in float64: the body fc1 and the generic head
    fc2 step on CE(z^G + log n, y) with the client's counts n (not the batch's); the personal
    head (from zero) on CE(stopgrad(z^G) + z^P, y) over the detached features.  Without the
    log n, with the generic logits not detached, or with the batch's counts it lands
    elsewhere."""
    lr = 0.1
    cfg, client, sent, up = _client_round(tmp_path, lr)
    order = client_order(client, 2, salt=0)
    x, y = client.data.x_train, client.data.y_train
    log_n = torch.bincount(y, minlength=10).double().log()

    def by_hand(prior="client", detach=True):
        p = [torch.tensor(a, dtype=torch.float64) for a in sent]
        p += [torch.zeros_like(p[2]), torch.zeros_like(p[3])]  # phi_i's start: zero
        for idx in order:
            leaf = [q.clone().requires_grad_() for q in p]
            xb, yb = x[idx].flatten(1).double(), y[idx]
            feat = torch.relu(xb @ leaf[0].T + leaf[1])
            zg = feat @ leaf[2].T + leaf[3]
            zp = feat.detach() @ leaf[4].T + leaf[5]
            shift = {"client": log_n, "none": 0.0,
                     "batch": torch.bincount(yb, minlength=10).double().log()}[prior]
            loss = (F.cross_entropy(zg + shift, yb)
                    + F.cross_entropy((zg.detach() if detach else zg) + zp, yb))
            p = [q - lr * g for q, g in zip(p, torch.autograd.grad(loss, leaf))]
        return [q.detach().numpy() for q in p]

    want = by_hand()
    phi = state_arrays(client.ctx.state, "rod-head")
    error = max(max_gap(up, want[:4]), max_gap(phi, want[4:]))
    assert error < 1e-5, error
    assert max_gap(phi, want[4:]) < 1e-5 < float(np.abs(phi[0]).max())  # phi_i trained
    for other in (by_hand("none"), by_hand("batch"), by_hand(detach=False)):
        assert max_gap(want, other) > 100 * error + 1e-5


def test_personalized_logits_add_the_heads_and_a_newcomer_scores_the_generic_model(tmp_path):
    """After a fit the personalized model's logits are z^G + z^P (by hand from the received
    model and the stored phi_i); a client that never trained evaluates the generic model
    itself, its loss the generic model's."""
    cfg, client, sent, _ = _client_round(tmp_path)
    config = {"cfg": cfg.to_json(), "round": 2, "accepted-round": 1}
    client.setup(config)
    model = client.personal_model(sent, config)
    x = client.data.x_test[0:len(client.data.y_test)].flatten(1).double()
    phi = [torch.tensor(a, dtype=torch.float64) for a in state_arrays(client.ctx.state,
                                                                      "rod-head")]
    w = [torch.tensor(a, dtype=torch.float64) for a in sent]
    feat = torch.relu(x @ w[0].T + w[1])
    want = (feat @ w[2].T + w[3]) + (feat @ phi[0].T + phi[1])
    with torch.no_grad():
        got = model(client.data.x_test[0:len(client.data.y_test)]).double()
    assert float((got - want).abs().max()) < 1e-4
    assert float((feat @ phi[0].T + phi[1]).abs().max()) > 1e-3  # the personal part acts
    fresh = make_client(registry.client_class("fedrod"), pid=2)
    loss, _, metrics = fresh.evaluate(sent, {"cfg": cfg.to_json(), "round": 1,
                                             "eval-global": True})
    assert metrics["fit-rounds"] == 0 and abs(loss - float(metrics["global_loss"])) < 1e-6


def test_a_short_run_keeps_each_personal_head(tmp_path):
    """Two rounds in one process: every client's phi_i is in its state and the personalized
    and generic (global) accuracies are both reported."""
    cfg = small_config(strategy="fedrod", rounds=2, **DNN)
    manager = inprocess.make_federation(cfg["clients"])
    inprocess.run(cfg, tmp_path, manager=manager)
    for proxy in manager.all().values():
        phi = state_arrays(proxy.context.state, "rod-head")
        assert phi is not None and float(np.abs(phi[0]).max()) > 0
    text = (tmp_path / "rounds.csv").read_text()
    assert "personal_mean" in text and "global_mean" in text


def test_a_held_out_newcomer_is_scored_on_its_rule_without_a_local_step(tmp_path):
    """A held-out newcomer (never sampled) evaluates the generic model, as its contract's
    rule says: no adaptation step, the same score before and after."""
    cfg = small_config(strategy="fedrod", rounds=2, **{**DNN, "newcomers.clients": [1]})
    inprocess.run(cfg, tmp_path)
    with open(tmp_path / "clients.csv") as fh:
        new = [r for r in csv.DictReader(fh) if r["round"] == "2" and r["newcomer"] == "1"]
    assert [r["partition-id"] for r in new] == ["1"] and new[0]["newcomer_steps"] == "0"
    assert new[0]["newcomer_before"] == new[0]["newcomer_after"]
