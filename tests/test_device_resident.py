"""Device-resident client data (``device-resident``, learning/client_data.py), on the CPU.

The resident path (images normalised once and held as one tensor on the training device)
must give the very bits the per-batch path (a gather and a normalising look-up per batch)
gives: forced on the CPU with ``device-resident: always``, every training and evaluation
batch and a client's whole fit are compared bit for bit with ``never``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flower_pfl.learning import client_data, data
from flower_pfl.learning.training import batches
from tests.conftest import small_config
from tests.test_baselines import make_client

CPU = torch.device("cpu")


def bits(t: torch.Tensor) -> np.ndarray:
    """The raw bytes of ``t`` (float equality would call -0.0 == 0.0 and miss NaN)."""
    return t.detach().cpu().contiguous().numpy().view(np.uint8)


def test_resident_setting_picks_the_device():
    assert not client_data.resident("auto", CPU)
    assert client_data.resident("auto", torch.device("cuda", 0))  # no CUDA needed to ask
    assert client_data.resident("always", CPU)
    assert not client_data.resident("never", torch.device("cuda"))
    with pytest.raises(ValueError, match="auto, always or never"):
        client_data.resident("yes", CPU)


def test_resident_batches_are_bit_identical_to_the_per_batch_path():
    client_data.clear_cache()
    cfg = small_config(**{"device-resident": "always", "device": "cpu"})
    sizes = []
    for pid in (0, 3):  # unequal clients: a shifted row range would show
        host = client_data.load_client_data(cfg.values, pid)
        res = client_data.load_client_data(cfg.values, pid, None, CPU)
        assert isinstance(host.x_train, data.NormalizedImages)  # no device: the host path
        assert isinstance(res.x_train, torch.Tensor) and isinstance(res.x_test, torch.Tensor)
        assert res.x_train.dtype == torch.float32 and res.y_train.dtype == host.y_train.dtype
        assert res.num_train == host.num_train and res.num_test == host.num_test
        sizes.append(host.num_train)
        g = torch.Generator()
        g.manual_seed(7)
        for idx in batches(host.num_train, 32, 3 * (host.num_train // 32 + 1), g):
            assert np.array_equal(bits(host.x_train[idx]), bits(res.x_train[idx]))
            assert np.array_equal(bits(host.y_train[idx]), bits(res.y_train[idx]))
        for start in range(0, host.num_test, 100):  # evaluate()'s slices
            sl = slice(start, start + 100)
            assert np.array_equal(bits(host.x_test[sl]), bits(res.x_test[sl]))
            assert np.array_equal(bits(host.y_test[sl]), bits(res.y_test[sl]))
        # kept for the process's lifetime: the same tensors the next time it is asked
        assert client_data.load_client_data(cfg.values, pid, None, CPU).x_train is res.x_train
    assert sizes[0] != sizes[1], sizes


def test_never_and_auto_on_the_cpu_keep_the_per_batch_path():
    client_data.clear_cache()
    for setting in ("never", "auto"):
        cfg = small_config(**{"device-resident": setting, "device": "cpu"})
        got = client_data.load_client_data(cfg.values, 1, None, CPU)
        assert isinstance(got.x_train, data.NormalizedImages), setting


def test_a_clients_fit_is_bit_identical_resident_or_not():
    from flower_pfl.clients.fedavg import FedAvgClient

    out = {}
    for setting in ("never", "always"):
        client_data.clear_cache()
        cfg = small_config(model="mclr", device="cpu", **{"device-resident": setting})
        client = make_client(FedAvgClient, pid=3, num=10)
        arrays, n, metrics = client.fit([], {"cfg": cfg.to_json(), "round": 1})
        resident = isinstance(client.data.x_train, torch.Tensor)
        assert resident == (setting == "always"), setting
        loss, n_test, ev = client.evaluate(arrays, {"cfg": cfg.to_json(), "round": 1})
        out[setting] = (arrays, n, metrics, loss, n_test, ev)
    (a0, n0, m0, l0, t0, e0), (a1, n1, m1, l1, t1, e1) = out["never"], out["always"]
    assert n0 == n1 and t0 == t1 and l0 == l1
    assert all(np.array_equal(x.view(np.uint8), y.view(np.uint8)) for x, y in zip(a0, a1))
    timing = {k for k in m0 if k.endswith("_s")}
    assert {k: v for k, v in m0.items() if k not in timing} == \
        {k: v for k, v in m1.items() if k not in timing}
    assert {k: v for k, v in e0.items() if not k.endswith("_s")} == \
        {k: v for k, v in e1.items() if not k.endswith("_s")}
