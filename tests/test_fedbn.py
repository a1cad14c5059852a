"""FedBN (clients/fedbn.py, strategies/fedbn.py, algorithms/fedbn_math.py) on a small CNN of
one's own with BatchNorm2d and BatchNorm1d (tests/test_user_model.py's): every BatchNorm
layer -- weight, bias, running mean and variance -- stays on its client, the rest is
averaged with weights n_k / n (Li et al., ICLR 2021, Algorithm 1)."""

from __future__ import annotations

import numpy as np
from flwr.common import parameters_to_ndarrays

from flower_pfl.algorithms.fedbn_math import batchnorm_indices
from flower_pfl.learning import models
from flower_pfl.strategies.base import ClientUpdate
from flower_pfl.strategies.fedbn import FedBN
from tests.test_baselines import state_arrays, two_rounds
from tests.test_fedper import gap
from tests.test_user_model import _cfg, _module

BN = [f"net.{layer}.{what}" for layer in ("bn", "bn1")
      for what in ("weight", "bias", "running_mean", "running_var")]


def _bn_config(tmp_path, name):
    return _cfg(_module(tmp_path, name), f"{name}:make", {"width": 4}, strategy="fedbn",
                clients=4, **{"data.subsample": 1200})


def _keys(model):
    return [k for k, v in model.state_dict().items() if v.is_floating_point()]


def test_the_batchnorm_arrays_are_the_layers_weights_biases_and_statistics(tmp_path):
    model = models.model_for(_bn_config(tmp_path, "fedbn_keys"))
    keys = _keys(model)
    assert sorted(keys[i] for i in batchnorm_indices(model)) == sorted(BN)
    assert batchnorm_indices(models.build_model("cnn", (1, 28, 28), 10, 0)) == []


def test_batchnorm_never_leaves_and_the_rest_is_the_weighted_mean(tmp_path):
    cfg = _bn_config(tmp_path, "fedbn_rounds")
    s, proxies, before, ins, res = two_rounds(cfg, tmp_path / "run")
    model = models.model_for(cfg)
    keys, init = _keys(model), models.get_arrays(model)
    shared = [i for i, k in enumerate(keys) if k not in BN]
    stats = [keys.index(f"net.{layer}.running_mean") for layer in ("bn", "bn1")]
    kept = {}
    for pid, r in res.items():
        # what travels, both ways: the non-BatchNorm arrays, in order, nothing else
        up = parameters_to_ndarrays(r.parameters)
        sent = parameters_to_ndarrays(ins[pid].parameters)
        assert [a.shape for a in up] == [a.shape for a in sent] == [init[i].shape for i in shared]
        kept[pid] = state_arrays(proxies[pid].context.state, "batchnorm")
        assert len(kept[pid]) == len(BN)
    # the running statistics moved with each client's own batches, and stayed there
    bn_at = [i for i, k in enumerate(keys) if k in BN]
    for pid in kept:
        for i in stats:
            assert np.abs(kept[pid][bn_at.index(i)] - init[i]).max() > 1e-3
    assert gap(kept[0], kept[1]) > 1e-3
    # the server's rule on hand-made uploads of unequal clients: the weighted mean
    rng = np.random.default_rng(3)
    uploads = [[rng.normal(size=init[i].shape).astype(np.float32) for i in shared]
               for _ in range(3)]
    counts = [50, 20, 130]
    s.aggregate_updates(3, [ClientUpdate(p, u, n, {}) for p, (u, n)
                            in enumerate(zip(uploads, counts))])
    for k, got in enumerate(s.shared):
        want = sum(n * u[k].astype(np.float64) for n, u in zip(counts, uploads)) / sum(counts)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert np.abs(np.mean([u[k] for u in uploads], axis=0) - want).max() > 1e-3


def test_a_model_without_batchnorm_is_fedavg_and_is_told_so(tmp_path, caplog):
    from tests.conftest import small_config

    s = FedBN(small_config(strategy="fedbn", model="mclr", clients=4), results_dir=tmp_path)
    s.initialize_parameters(None)
    assert len(s.shared) == 2  # everything is shared
    assert "no BatchNorm layer" in caplog.text and "= FedAvg" in caplog.text
