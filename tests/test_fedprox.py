"""FedProx: the prox term's gradient is mu (w - w_global); it pulls the local models in."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flower_pfl.clients.fedprox import FedProxClient, FedProxFTClient
from flower_pfl.config import ConfigError
from flower_pfl.running import inprocess
from tests.conftest import small_config
from tests.test_baselines import TINY, make_client


def test_prox_gradient_is_mu_times_distance_to_global():
    client = make_client(FedProxClient)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    reg = client.regularizer(model, {"mu": 0.7})  # centre = the model as received (w^t)
    center = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():  # local training has moved w away from w^t
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    model.zero_grad()
    reg(model).backward()
    for p, c in zip(model.parameters(), center):
        assert torch.allclose(p.grad, 0.7 * (p.detach() - c), atol=1e-6)


def test_fedprox_keeps_the_global_model_closer_to_its_start_than_fedavg(tmp_path):
    def moved(strategy, **hyper):
        cfg = small_config(strategy=strategy, rounds=1, **TINY, **{"train.epochs": 3}, **hyper)
        s = inprocess.run(cfg, tmp_path / strategy)
        return float(np.sqrt(sum(((a - b) ** 2).sum() for a, b in
                                 zip(s.global_arrays, s.initial_model))))

    fedavg = moved("fedavg")
    fedprox = moved("fedprox", **{"hyper.fedprox.mu": 5.0})
    # same seed, same batches: only the prox term differs; removing it gives fedprox == fedavg
    assert fedprox < 0.9 * fedavg, (fedprox, fedavg)


def test_fedprox_ft_trains_as_fedprox_and_evaluates_as_fedavg_ft():
    assert FedProxFTClient.fit_round is FedProxClient.fit_round
    assert FedProxFTClient.regularizer is FedProxClient.regularizer
    from flower_pfl.clients.fedavg import FedAvgFTClient

    assert FedProxFTClient.personal_model is FedAvgFTClient.personal_model


@pytest.mark.parametrize("name", ["fedprox", "fedprox-ft"])
def test_mu_zero_is_rejected(name):
    with pytest.raises(ConfigError, match="mu = 0 is FedAvg"):
        small_config(strategy=name, **{f"hyper.{name}.mu": 0.0})


def prox_sgd_by_hand(client, w0, order, lr, centre, coef):
    """MCLR by hand in float64: w <- w - lr (grad CE(w; b) + coef (w - centre)) over the
    index batches ``order`` of ``client``'s training data."""
    from torch.nn import functional as F

    w = [torch.tensor(a, dtype=torch.float64) for a in w0]
    c = [torch.tensor(a, dtype=torch.float64) for a in centre]
    for idx in order:
        leaf = [p.clone().requires_grad_(True) for p in w]
        xb = client.data.x_train[idx].flatten(1).double()
        loss = F.cross_entropy(xb @ leaf[0].T + leaf[1], client.data.y_train[idx])
        w = [p - lr * (g + coef * (p - cc))
             for p, g, cc in zip(w, torch.autograd.grad(loss, leaf), c)]
    return [p.numpy() for p in w]


def client_order(client, steps, salt=0):
    """The client's seeded mini-batch order of its last fit (round and seed from setup)."""
    from flower_pfl.learning.training import batches

    return list(batches(client.data.num_train, client.spec.batch_size, steps,
                        client.generator(salt), client.spec.drop_last))


def max_gap(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


@pytest.mark.parametrize("name", ["fedprox", "fedprox-ft"])
def test_client_round_by_hand_with_the_servers_mu(name, tmp_path):
    """The strategy's mu (0.7, not the default) through the real client: K SGD steps on
    CE + mu/2 ||w - w^t||^2 from w^t, by hand in float64.  The first step's prox term is 0
    (w = w^t), so the steps after it carry the check; a halved mu, a flipped sign or the
    centre taken as the moving w all land elsewhere."""
    from flower_pfl import registry

    mu, lr, steps = 0.7, 0.2, 4
    cfg = small_config(strategy=name, **TINY, **{
        f"hyper.{name}.mu": mu, "train.lr": lr, "train.steps": steps, "train.batch-size": 16})
    s = registry.strategy_class(name)(cfg, results_dir=tmp_path)
    s.initialize_parameters(None)
    w0, extra = s.fit_payload(1, 1)
    client = make_client(registry.client_class(name), pid=1)
    up, _, _ = client.fit([a.copy() for a in w0], {"cfg": cfg.to_json(), "round": 1, **extra})
    order = client_order(client, steps)
    want = prox_sgd_by_hand(client, w0, order, lr, w0, mu)
    error, gap = max_gap(up, want), max_gap(want, prox_sgd_by_hand(client, w0, order, lr, w0,
                                                                    mu / 2))
    assert error < 1e-5 and gap > 100 * error + 1e-5, (error, gap)
