"""FedBABU (clients/fedbabu.py, strategies/fedbabu.py) on a DNN: the head fc2 keeps the
server's initial bytes through the federated rounds, on the server and in every upload; the
body is the sample-weighted mean; personalization fine-tunes the whole global model for
tau epochs (Oh et al., ICLR 2022, Algorithm 1)."""

from __future__ import annotations

import numpy as np
from flwr.common import parameters_to_ndarrays

from flower_pfl.catalog.fedbabu import FedBABUEval
from flower_pfl.clients.fedbabu import FedBABUClient
from flower_pfl.learning.models import get_arrays, initial_arrays
from flower_pfl.strategies.base import ClientUpdate
from tests.conftest import small_config
from tests.test_baselines import make_client, two_rounds
from tests.test_fedper import DNN, gap


def test_the_head_keeps_its_initial_bytes_and_the_body_is_the_weighted_mean(tmp_path):
    cfg = small_config(strategy="fedbabu", rounds=2, **DNN)
    s, proxies, before, ins, res = two_rounds(cfg, tmp_path)
    init = initial_arrays(cfg)
    head = [a.tobytes() for a in init[2:]]
    assert [a.tobytes() for a in s.global_arrays[2:]] == head  # the server's, 2 rounds on
    uploads = {pid: parameters_to_ndarrays(r.parameters) for pid, r in res.items()}
    for pid, up in uploads.items():
        assert [a.tobytes() for a in up[2:]] == head, pid  # trained: the body alone
        assert gap(up[:2], init[:2]) > 1e-3
    # the round-2 body: the weighted mean of the uploaded bodies (unequal clients)
    sizes = {pid: r.num_examples for pid, r in res.items()}
    assert len(set(sizes.values())) > 1
    for k in range(2):
        want = sum(sizes[p] * uploads[p][k].astype(np.float64) for p in uploads) / sum(
            sizes.values())
        np.testing.assert_allclose(s.global_arrays[k], want, rtol=1e-5, atol=1e-7)
    # hand-made uploads whose heads differ: the server still keeps its own head
    rng = np.random.default_rng(1)
    made = [[rng.normal(size=a.shape).astype(np.float32) for a in init] for _ in range(2)]
    s.aggregate_updates(3, [ClientUpdate(0, made[0], 30, {}), ClientUpdate(1, made[1], 10, {})])
    assert [a.tobytes() for a in s.global_arrays[2:]] == head
    np.testing.assert_allclose(s.global_arrays[0], 0.75 * made[0][0] + 0.25 * made[1][0],
                               rtol=1e-5, atol=1e-6)


def test_personalization_fine_tunes_the_whole_model_for_tau_epochs(tmp_path):
    cfg = small_config(strategy="fedbabu", **{**DNN, "train.batch-size": 16,
                                              "hyper.fedbabu.finetune-epochs": 2})
    init = initial_arrays(cfg)
    client = make_client(FedBABUClient, pid=2)
    config = {"cfg": cfg.to_json(), "round": 1, **FedBABUEval(finetune_epochs=2).to_config()}
    client.evaluate([a.copy() for a in init], config)
    n = client.data.num_train
    assert client.eval_steps == 2 * -(-n // 16) and n % 16  # 2 passes, the last batch short
    tuned = get_arrays(client.personal_model([a.copy() for a in init], config))
    assert gap(tuned[:2], init[:2]) > 1e-4 and gap(tuned[2:], init[2:]) > 1e-4  # body, head
