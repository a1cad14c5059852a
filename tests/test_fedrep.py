"""FedRep (clients/fedrep.py, strategies/fedrep.py) on a DNN: the client's head h_i persists
across rounds and is the head of its personalized model; the server's body is the plain
mean of the uploaded bodies (PLGU Algorithm 3, line 14)."""

from __future__ import annotations

import csv

import numpy as np
import torch
from flwr.common import FitIns, parameters_to_ndarrays

from flower_pfl.learning.models import initial_arrays, model_for, set_arrays
from flower_pfl.learning.training import evaluate
from flower_pfl.running import inprocess
from tests.conftest import small_config
from tests.test_baselines import TINY, replay_fit, state_arrays, two_rounds

# a DNN: fc1 is the shared body, fc2 (weight, bias) each client's head
DNN = {**TINY, "model": "dnn", "hyper.fedrep.head-epochs": 1}


def _gap(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def test_round_two_starts_from_the_round_one_head_and_the_body_is_the_mean(tmp_path):
    cfg = small_config(strategy="fedrep", rounds=2, **DNN)
    s, proxies, before, ins, res = two_rounds(cfg, tmp_path)
    init_head = initial_arrays(cfg)[2:]
    for pid in (0, 3):
        head1 = state_arrays(before[pid], "head")
        assert len(head1) == 2 and _gap(head1, init_head) > 1e-3  # round 1 trained it
        # round 2 without head epochs: the head it keeps is the one it had after round 1
        frozen = FitIns(ins[pid].parameters, {**ins[pid].config, "head-epochs": 0})
        state, _ = replay_fit(proxies[pid], before[pid], frozen)
        kept = state_arrays(state, "head")
        assert all(np.array_equal(a, b) for a, b in zip(kept, head1))
        # with head epochs: round 2 replayed from the round-1 state is the real round 2,
        # while a client that lost its head (fresh state) ends elsewhere
        head2 = state_arrays(proxies[pid].context.state, "head")
        again, _ = replay_fit(proxies[pid], before[pid], ins[pid])
        np.testing.assert_allclose(state_arrays(again, "head")[0], head2[0], atol=1e-6)
        fresh, _ = replay_fit(proxies[pid], None, ins[pid])
        assert _gap(state_arrays(fresh, "head"), head2) > 1e-4
    # the server's new body: the unweighted mean of the round-2 bodies (fc1 only)
    bodies = [parameters_to_ndarrays(r.parameters) for r in res.values()]
    assert all(len(b) == 2 for b in bodies)
    assert len({r.num_examples for r in res.values()}) > 1  # a weighted mean would differ
    for k, got in enumerate(s.body):
        np.testing.assert_allclose(got, np.mean([b[k] for b in bodies], axis=0), atol=1e-6)


def test_personalized_evaluation_uses_the_stored_head(tmp_path):
    cfg = small_config(strategy="fedrep", rounds=2, **DNN)
    manager = inprocess.make_federation(cfg["clients"])
    s = inprocess.run(cfg, tmp_path, manager=manager)
    with open(tmp_path / "clients.csv") as fh:
        reported = {int(r["partition-id"]): float(r["loss"])
                    for r in csv.DictReader(fh) if r["round"] == "2"}
    assert sorted(reported) == list(range(cfg["clients"]))
    from flower_pfl.learning.client_data import load_client_data

    model, init_head = model_for(cfg), initial_arrays(cfg)[2:]
    for proxy in manager.all().values():
        pid = int(proxy.context.node_config["partition-id"])
        head = state_arrays(proxy.context.state, "head")
        data = load_client_data(cfg.values, pid, None)

        def loss(h, data=data):
            set_arrays(model, list(s.body) + list(h))
            return evaluate(model, data.x_test, data.y_test, torch.device("cpu"))[0]

        # (h_i, phi^t): the client's own head on the current global body
        assert abs(reported[pid] - loss(head)) < 1e-5 * max(1.0, reported[pid]), pid
        assert abs(loss(init_head) - loss(head)) > 1e-3  # the initial head scores otherwise


def test_head_then_body_steps_by_hand(tmp_path):
    """One FedRep round of the real client on a DNN, by hand in float64 with unequal phase
    lengths (head-epochs 2, body-epochs 1, 2 batches an epoch): 4 SGD steps on the head
    fc2 with the body frozen (salt 0), then 2 on the body fc1 with the head frozen (salt 1),
    from a stored head unlike the initial one; the body is uploaded and the head kept.
    Swapping the two phases' lengths, their order or which layers they train lands elsewhere."""
    from torch.nn import functional as F

    from flower_pfl.clients.fedrep import FedRepClient
    from flower_pfl.strategies.fedrep import FedRep
    from tests.test_baselines import make_client
    from tests.test_fedprox import client_order, max_gap

    lr = 0.1
    cfg = small_config(strategy="fedrep", **{**DNN, "hyper.fedrep.head-epochs": 2,
                                             "hyper.fedrep.body-epochs": 1, "train.lr": lr,
                                             "train.steps": 2, "train.batch-size": 16})
    s = FedRep(cfg, results_dir=tmp_path)
    s.initialize_parameters(None)
    body0, extra = s.fit_payload(1, 1)
    rng = np.random.default_rng(5)
    head0 = [(a + rng.normal(0, 0.05, a.shape)).astype(np.float32)
             for a in initial_arrays(cfg)[2:]]
    client = make_client(FedRepClient, pid=1)
    client.state.set_arrays("head", head0)
    up, _, _ = client.fit([a.copy() for a in body0], {"cfg": cfg.to_json(), "round": 1, **extra})
    head_order, body_order = client_order(client, 4, salt=0), client_order(client, 2, salt=1)

    def by_hand(head_steps, body_steps):
        p = [torch.tensor(a, dtype=torch.float64) for a in list(body0) + head0]
        for which, order in (((2, 3), head_steps), ((0, 1), body_steps)):
            for idx in order:
                leaf = [q.clone().requires_grad_(k in which) for k, q in enumerate(p)]
                xb = client.data.x_train[idx].flatten(1).double()
                out = torch.relu(xb @ leaf[0].T + leaf[1]) @ leaf[2].T + leaf[3]
                loss = F.cross_entropy(out, client.data.y_train[idx])
                grads = dict(zip(which, torch.autograd.grad(loss, [leaf[k] for k in which])))
                p = [q - lr * grads[k] if k in grads else q for k, q in enumerate(p)]
        return [q.numpy() for q in p]

    want = by_hand(head_order, body_order)
    swapped = by_hand(head_order[:2], client_order(client, 4, salt=1))
    kept = state_arrays(client.ctx.state, "head")
    error = max(max_gap(up, want[:2]), max_gap(kept, want[2:]))
    assert error < 1e-5 and max_gap(want, swapped) > 100 * error + 1e-5, error
