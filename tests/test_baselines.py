"""FedAvg, Local and FedAvg-FT with their real clients on small FMNIST subsets (in-process)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from flower_pfl.running import inprocess
from flower_pfl.strategies.base import FederationError
from tests.conftest import small_config

PATHOLOGICAL = {"data.partition": "pathological", "data.classes-per-client": 2,
                "data.subsample": 6000, "clients": 10, "fraction-fit": 1.0}


def _rounds(path):
    with open(path / "rounds.csv") as fh:
        return list(csv.DictReader(fh))


def test_fedavg_global_model_improves(tmp_path):
    cfg = small_config(**{"strategy": "fedavg", "rounds": 4, "data.partition": "iid",
                          "train.epochs": 3})
    s = inprocess.run(cfg, tmp_path)
    means = [float(r["global_mean"]) for r in _rounds(tmp_path)]
    assert means[-1] > means[0] + 0.05 and means[-1] > 0.6, means
    # FedAvg's personalized model is its global model
    assert [float(r["personal_mean"]) for r in _rounds(tmp_path)] == means
    assert s.global_arrays is not None


def test_local_beats_fedavg_global_on_pathological_split(tmp_path):
    local = inprocess.run(small_config(**PATHOLOGICAL, strategy="local", rounds=4), tmp_path / "l")
    # run for its results folder: the FedAvg global accuracy is read from its rounds.csv below
    inprocess.run(small_config(**PATHOLOGICAL, strategy="fedavg", rounds=4), tmp_path / "f")
    local_acc = local.eval_history[-1]["mean"]
    fedavg_global = float(_rounds(tmp_path / "f")[-1]["global_mean"])
    # the papers' pattern (FedAMP Table 2: Separate 97.67 vs FedAvg 77.88): local >> global
    assert local_acc > 0.9, local_acc
    assert local_acc > fedavg_global + 0.2, (local_acc, fedavg_global)
    # Local exchanges no weights and keeps no global model
    assert local.global_arrays is None
    assert "global_mean" not in _rounds(tmp_path / "l")[-1]


def test_fedavg_ft_personalizes_the_global_model(tmp_path):
    cfg = small_config(**PATHOLOGICAL, strategy="fedavg-ft", rounds=3,
                       **{"hyper.fedavg-ft.finetune-steps": 15})
    inprocess.run(cfg, tmp_path)
    last = _rounds(tmp_path)[-1]
    assert float(last["personal_mean"]) > float(last["global_mean"]) + 0.2, last


def test_state_survives_rounds_and_identity_is_partition_id(tmp_path):
    cfg = small_config(strategy="local", rounds=3, clients=6)
    manager = inprocess.make_federation(6)
    s = inprocess.run(cfg, tmp_path, manager=manager)
    for pid, proxy in s.proxies.items():
        assert proxy.context.node_config["partition-id"] == pid
        assert int(proxy.cid) != pid  # node ids are not partition ids
    with open(tmp_path / "clients.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r["round"] == "3"]
    assert sorted(int(r["partition-id"]) for r in rows) == list(range(6))
    assert all(int(r["fit-rounds"]) == 3 for r in rows)  # personal state kept 3 rounds


def test_eval_cadence_and_summary_file(tmp_path):
    cfg = small_config(strategy="fedavg", rounds=3, clients=4, **{"eval-every": 2})
    inprocess.run(cfg, tmp_path)
    assert [r["round"] for r in _rounds(tmp_path)] == ["2", "3"]  # every 2nd + the last
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["bmta"] == max(r["personal_mean"] for r in summary["rounds"])
    for key in ("personal_mean", "personal_weighted_mean", "personal_std", "personal_worst10_mean",
                "personal_top10_mean", "personal_min", "personal_bmta", "global_mean"):
        assert key in summary["final"]


def test_sampling_is_seeded_and_sized(tmp_path):
    cfg = small_config(strategy="fedavg", clients=10, **{"fraction-fit": 0.3})
    s = inprocess.run(cfg, tmp_path / "a", rounds=1)
    again = inprocess.run(cfg, tmp_path / "b", rounds=1)
    picks = [s.sample(r) for r in range(2, 6)]
    assert picks == [again.sample(r) for r in range(2, 6)]
    assert all(len(p) == 3 == len(set(p)) for p in picks)
    assert len({tuple(p) for p in picks}) > 1  # not the same clients every round


def test_node_count_must_match_config(tmp_path):
    cfg = small_config(strategy="fedavg", clients=5)
    manager = inprocess.make_federation(4)
    import flower_pfl.strategies.nodes as nodes
    old, nodes.WAIT_FOR_NODES_S = nodes.WAIT_FOR_NODES_S, 0.5
    try:
        with pytest.raises(FederationError, match="clients = 5 but the federation has 4"):
            inprocess.run(cfg, tmp_path, manager=manager)
    finally:
        nodes.WAIT_FOR_NODES_S = old


# --------------------------------------------------------------- helpers for the baselines
# (used by tests/test_fedprox.py, test_scaffold.py, test_apfl.py, test_ditto.py, ...)
TINY = {"clients": 4, "fraction-fit": 1.0, "model": "mclr", "data.subsample": 2000}


def two_rounds(cfg, tmp_path):
    """Round 1 in-process, a snapshot of every client's context.state, then round 2.

    Returns (strategy, proxies by partition-id, states before round 2, round-2 FitIns by
    partition-id, round-2 FitRes by partition-id)."""
    import copy

    manager = inprocess.make_federation(cfg["clients"])
    s = inprocess.run(cfg, tmp_path, manager=manager, rounds=1)
    proxies = {int(p.context.node_config["partition-id"]): p for p in manager.all().values()}
    before = {pid: copy.deepcopy(p.context.state) for pid, p in proxies.items()}
    fit_ins = s.configure_fit(2, None, manager)
    results = [(p, p.fit(ins, None, None)) for p, ins in fit_ins]
    s.aggregate_fit(2, results, [])
    return (s, proxies, before, {int(p.pid): ins for p, ins in fit_ins},
            {int(p.pid): res for p, res in results})


def replay_fit(proxy, state, ins):
    """Run one client's fit again on a copy of ``state`` (a fresh RecordDict = fresh client);
    returns (state after, FitRes)."""
    import copy

    from flwr.app import Context, RecordDict

    from flower_pfl.client_app import client_fn

    ctx = Context(run_id=0, node_id=1, node_config=dict(proxy.context.node_config),
                  state=copy.deepcopy(state) if state is not None else RecordDict(),
                  run_config={})
    res = client_fn(ctx).fit(ins)
    return ctx.state, res


def state_arrays(state, key, accepted_round: int = 10**9):
    """The client's value of ``key`` once the server accepted its last fit (a fit's writes
    are staged until the next message confirms the round: clients/base.py)."""
    import copy

    from flower_pfl.clients.state import ClientState

    view = ClientState(copy.deepcopy(state))
    view.resolve(accepted_round)
    return view.get_arrays(key)


def state_values(state, key, accepted_round: int = 10**9):
    import copy

    from flower_pfl.clients.state import ClientState

    view = ClientState(copy.deepcopy(state))
    view.resolve(accepted_round)
    return view.get_values(key)


def make_client(cls, pid: int = 0, num: int = 4):
    from flwr.app import Context, RecordDict

    return cls(Context(run_id=0, node_id=1, node_config={"partition-id": pid,
                                                         "num-partitions": num},
                       state=RecordDict(), run_config={}))


def test_fedprox_ft_personalizes_the_global_model(tmp_path):
    cfg = small_config(**PATHOLOGICAL, strategy="fedprox-ft", rounds=2,
                       **{"hyper.fedprox-ft.finetune-steps": 15})
    inprocess.run(cfg, tmp_path)
    last = _rounds(tmp_path)[-1]
    assert float(last["personal_mean"]) > float(last["global_mean"]) + 0.2, last


# ------------------------------------------------------ each baseline's mechanism, fast
def test_fedavg_aggregate_is_the_sample_weighted_mean(tmp_path):
    from flower_pfl.strategies.base import ClientUpdate
    from flower_pfl.strategies.fedavg import FedAvg

    s = FedAvg(small_config(strategy="fedavg", **TINY), results_dir=tmp_path)
    s.initialize_parameters(None)
    rng = np.random.default_rng(0)
    uploads = [[rng.normal(size=a.shape).astype(np.float32) for a in s.global_arrays]
               for _ in range(3)]
    counts = [10, 30, 60]
    s.aggregate_updates(1, [ClientUpdate(pid, arrays, n, {})
                            for pid, (arrays, n) in enumerate(zip(uploads, counts))])
    for k, got in enumerate(s.global_arrays):
        want = sum(n * u[k].astype(np.float64) for n, u in zip(counts, uploads)) / sum(counts)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        # (the plain mean is another model: the weights matter)
        assert np.abs(np.mean([u[k] for u in uploads], axis=0) - want).max() > 1e-2


def test_local_model_continues_across_rounds_and_nothing_travels(tmp_path):
    cfg = small_config(strategy="local", rounds=2, **TINY)
    s, proxies, before, ins, res = two_rounds(cfg, tmp_path)
    from flwr.common import parameters_to_ndarrays

    for pid in (0, 2):
        assert parameters_to_ndarrays(ins[pid].parameters) == []  # nothing sent ...
        assert parameters_to_ndarrays(res[pid].parameters) == []  # ... or uploaded
        model1 = state_arrays(before[pid], "personal")
        model2 = state_arrays(proxies[pid].context.state, "personal")
        assert max(float(np.abs(a - b).max()) for a, b in zip(model1, model2)) > 1e-4
        # round 2 continues the round-1 model: a client that lost it ends elsewhere
        again, _ = replay_fit(proxies[pid], before[pid], ins[pid])
        for a, b in zip(state_arrays(again, "personal"), model2):
            np.testing.assert_allclose(a, b, atol=1e-6)
        fresh, _ = replay_fit(proxies[pid], None, ins[pid])
        assert max(float(np.abs(a - b).max()) for a, b in
                   zip(state_arrays(fresh, "personal"), model2)) > 1e-4


def test_fedavg_ft_evaluates_the_global_model_fine_tuned_on_train_data():
    """FedAvg-FT's personalized model: the global model after ``finetune-steps`` SGD steps
    on the client's training data (not kept); FedAvg's is the global model itself."""
    import torch

    from flower_pfl.clients.fedavg import FedAvgClient, FedAvgFTClient
    from flower_pfl.learning.models import initial_arrays
    from flower_pfl.learning.training import evaluate

    cfg = small_config(strategy="fedavg-ft", **PATHOLOGICAL, model="mclr")
    w = initial_arrays(cfg)
    config = {"cfg": cfg.to_json(), "round": 1, "eval-global": True, "finetune-steps": 10}
    client = make_client(FedAvgFTClient, pid=3, num=10)
    loss, _, metrics = client.evaluate([a.copy() for a in w], config)
    # by hand: the same 10 seeded steps (salt 1) from the global model
    model = client.new_model(w)
    client.local_train(model, num_steps=10, salt=1)
    want = evaluate(model, client.data.x_test, client.data.y_test, torch.device("cpu"))
    assert loss == pytest.approx(want[0], rel=1e-6) and metrics["accuracy"] == want[1]
    assert loss < metrics["global_loss"] - 0.1, (loss, metrics["global_loss"])
    assert client.state.get_arrays("personal") is None  # nothing kept
    plain, _, m = make_client(FedAvgClient, pid=3, num=10).evaluate(
        [a.copy() for a in w], {**config, "finetune-steps": 0})
    assert plain == pytest.approx(m["global_loss"])


@pytest.mark.parametrize("name", ["fedavg-ft", "fedprox-ft"])
def test_ft_evaluation_is_the_servers_step_count_of_sgd_by_hand(name, tmp_path):
    """The strategy's evaluation instructions (finetune-steps 5, not the default) through
    the real client: its personalized model is the global model after 5 SGD steps at
    train.lr on its training batches (salt 1), by hand in float64 (MCLR); 4 or 10 steps
    land elsewhere."""
    from flower_pfl import registry
    from tests.test_fedprox import client_order, max_gap, prox_sgd_by_hand

    lr, steps = 0.2, 5
    cfg = small_config(strategy=name, **TINY, **{f"hyper.{name}.finetune-steps": steps,
                                                 "train.lr": lr, "train.batch-size": 16})
    s = registry.strategy_class(name)(cfg, results_dir=tmp_path)
    s.initialize_parameters(None)
    w, extra = s.eval_payload(3, 1)
    assert extra["finetune-steps"] == steps
    client = make_client(registry.client_class(name), pid=3)
    config = {"cfg": cfg.to_json(), "round": 1, **extra}
    client.setup(config)
    got = [p.detach().numpy() for p in client.personal_model(list(w), config).parameters()]
    order = client_order(client, 2 * steps, salt=1)
    want = prox_sgd_by_hand(client, w, order[:steps], lr, w, 0.0)
    error = max_gap(got, want)
    for other in (steps - 1, 2 * steps):
        assert max_gap(want, prox_sgd_by_hand(client, w, order[:other], lr, w, 0.0)) > \
            100 * error + 1e-5
    assert error < 1e-5, error
