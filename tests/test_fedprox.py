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
