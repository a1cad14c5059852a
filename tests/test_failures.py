"""A round's failures: bad uploads named and rejected, transactional client state (a fit
kept only when the server accepts it), failures injected in the transport or the client
(reported, state untouched, a round below its minimum fails clearly), and federation changes
(the partition-id handshake, nodes that leave and rejoin). In-process
(flower_pfl/running/inprocess.py); checkpoint/resume: tests/test_reliability.py."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from flower_pfl.clients.base import PFLClient
from flower_pfl.clients.state import ClientState
from flower_pfl.reliability.upload_checks import check_update, flat
from flower_pfl.running import inprocess
from flower_pfl.strategies.base import RoundError
from tests.conftest import small_config

SHAPES = [(3, 2), (2,)]
DTYPES = [np.dtype(np.float32)] * 2


def _good():
    return [np.ones((3, 2), np.float32), np.zeros(2, np.float32)]


# ------------------------------------------------------------------ upload checks
@pytest.mark.parametrize("mutate, needle", [
    (lambda a, n: ([a[0]], n), "wrong number of arrays: 1 (the model has 2)"),
    (lambda a, n: ([a[0].T, a[1]], n), "array 0 has shape (2, 3), expected (3, 2)"),
    (lambda a, n: ([a[0].astype(np.float64), a[1]], n), "array 0 has dtype float64"),
    (lambda a, n: ([a[0], a[1].astype(np.int64)], n), "array 1 has dtype int64"),
    (lambda a, n: (a, 0), "num_examples = 0 (must be > 0)"),
    (lambda a, n: (a, -5), "num_examples = -5"),
    (lambda a, n: ([np.full((3, 2), np.nan, np.float32), a[1]], n), "array 0 holds 6 NaN/Inf"),
    (lambda a, n: ([a[0], np.array([1, np.inf], np.float32)], n), "array 1 holds 1 NaN/Inf"),
])
def test_bad_upload_is_named(mutate, needle):
    arrays, n = mutate(_good(), 10)
    assert check_update(_good(), 10, SHAPES, DTYPES) is None
    reason = check_update(arrays, n, SHAPES, DTYPES)
    assert reason is not None and needle in reason


def test_norm_bound_is_on_the_update_and_nan_metric_rejected():
    sent = flat(_good())
    moved = [a + 1.0 for a in _good()]  # ||update|| = sqrt(8) = 2.83
    assert check_update(moved, 5, SHAPES, DTYPES, sent=sent, max_norm=3.0) is None
    assert "exceeds max-update-norm = 2" in check_update(moved, 5, SHAPES, DTYPES, sent=sent,
                                                          max_norm=2.0)
    assert "metric 'train_loss' = nan" in check_update(_good(), 5, SHAPES, DTYPES,
                                                       {"train_loss": float("nan")})


# ------------------------------------------------------- transactional client state
@pytest.mark.parametrize("disk", [False, True])
def test_client_state_keeps_a_fit_only_when_the_server_accepts_it(tmp_path, disk):
    from flwr.app import RecordDict

    state = ClientState(RecordDict(), tmp_path / "p0" if disk else None)
    state.set_arrays("personal", [np.zeros(3, np.float32)])
    state.begin(1)
    state.set_arrays("personal", [np.ones(3, np.float32)])
    assert state.get_arrays("personal")[0][0] == 1  # the fit reads its own writes
    state.end()
    state.resolve(accepted_round=0)  # the server did not accept round 1
    assert state.get_arrays("personal")[0][0] == 0 and "txn" not in state
    state.begin(2)
    state.set_arrays("personal", [np.full(3, 2, np.float32)])
    state.set_values("meta", {"fit-rounds": 1})
    state.end()
    state.resolve(accepted_round=2)
    assert state.get_arrays("personal")[0][0] == 2 and state.get_values("meta") == {
        "fit-rounds": 1}
    state.begin(3)
    state.set_arrays("personal", [np.full(3, 3, np.float32)])
    state.abort()  # the fit raised
    assert state.get_arrays("personal")[0][0] == 2
    if disk:  # a fresh process (restarted node / resumed run) reads the same from disk
        fresh = ClientState(RecordDict(), tmp_path / "p0")
        assert fresh.get_arrays("personal")[0][0] == 2
        assert sorted(p.name for p in (tmp_path / "p0").iterdir()) == ["meta.json",
                                                                        "personal.npz"]


# ----------------------------------------------------------- failure injection
FAIL_RAISE: set[tuple[int, int]] = set()


class FaultyProxy(inprocess.InProcessProxy):
    """The transport of tests: ``plan[(round, pid)]`` = 'lost' | 'nan' | 'shape'."""

    plan: dict[tuple[int, int], str] = {}

    def fit(self, ins, timeout, group_id):
        res = super().fit(ins, timeout, group_id)
        what = self.plan.get((int(ins.config["round"]), int(self.context.node_config[
            "partition-id"])))
        if what == "lost":  # the client trained, its reply never arrived
            raise ValueError("Expected one Message but got: 0")
        arrays = parameters_to_ndarrays(res.parameters)
        if what == "nan":
            arrays[0] = np.full_like(arrays[0], np.nan)
        elif what == "shape":
            arrays[0] = arrays[0].reshape(-1)
        res.parameters = ndarrays_to_parameters(arrays)
        return res


@pytest.fixture
def raising_clients(monkeypatch):
    """Clients listed in FAIL_RAISE raise inside fit AFTER staging their new personal model."""
    original = PFLClient.save_personal

    def save_then_maybe_raise(self, model, key="personal"):
        original(self, model, key)
        if (self.round, self.pid) in FAIL_RAISE:
            raise RuntimeError(f"injected failure of client {self.pid}")
    monkeypatch.setattr(PFLClient, "save_personal", save_then_maybe_raise)
    yield
    FAIL_RAISE.clear()


def _personal(manager, pid):
    for proxy in manager.all().values():
        if proxy.context.node_config["partition-id"] == pid:
            record = proxy.context.state.get("personal")
            return None if record is None else [a.copy() for a in record.to_numpy_ndarrays()]


def _read(path: Path):
    with open(path) as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("strategy", ["fedamp", "selffl"])
def test_injected_failures_are_reported_and_leave_state_untouched(strategy, tmp_path,
                                                                    raising_clients):
    cfg = small_config(strategy=strategy, rounds=4, model="mclr", **{"data.subsample": 3000})
    FAIL_RAISE.update({(2, 1), (2, 4)})  # 2 of 10 raise in round 2
    FaultyProxy.plan = {(3, 2): "nan", (3, 5): "shape", (3, 7): "lost"}
    failing = {2: [1, 4], 3: [2, 5, 7]}
    manager = inprocess.make_federation(10, proxy_cls=FaultyProxy)
    snap: dict[int, dict] = {}

    def on_round(strategy_obj, r):
        stored = {}
        for pid in range(10):
            if strategy == "fedamp":
                stored[pid] = strategy_obj.matrix.model(pid).copy()
            else:
                stored[pid] = strategy_obj.store.get("sigma_sq", pid)
        snap[r] = {"personal": {p: _personal(manager, p) for p in range(10)}, "stored": stored}

    strategy_obj = inprocess.run(cfg, tmp_path, manager=manager, on_round=on_round)
    for r, pids in failing.items():
        for pid in pids:  # bit-identical to before the failed round, server and client
            before, after = snap[r - 1], snap[r]
            assert all(np.array_equal(a, b) for a, b in
                       zip(before["personal"][pid], after["personal"][pid])), (r, pid)
            assert np.array_equal(before["stored"][pid], after["stored"][pid]), (r, pid)
        for pid in set(range(10)) - set(pids):  # the others did train
            assert not all(np.array_equal(a, b) for a, b in
                           zip(snap[r - 1]["personal"][pid], snap[r]["personal"][pid]))
    failures = _read(tmp_path / "failures.csv")
    got = {(int(f["round"]), int(f["partition-id"])): f["reason"] for f in failures}
    assert set(got) == {(2, 1), (2, 4), (3, 2), (3, 5), (3, 7)}
    assert "injected failure of client 1" in got[(2, 1)]
    assert "NaN/Inf" in got[(3, 2)] and "update rejected" in got[(3, 2)]
    assert "shape" in got[(3, 5)] and "no reply" in got[(3, 7)]
    server = {int(r["round"]): r for r in _read(tmp_path / "server.csv")}
    assert server[2]["fit_failed_ids"] == "1 4" and server[3]["fit_failed_ids"] == "2 5 7"
    assert int(server[3]["fit_ok"]) == 7
    last = {int(r["partition-id"]): r for r in _read(tmp_path / "clients.csv")
            if r["round"] == "4"}
    assert len(last) == 10  # everyone evaluated, the failed clients took part again
    for pid in (1, 4, 2, 5, 7):
        assert int(last[pid]["fit-rounds"]) == 3  # counted only the accepted fits
    assert int(last[0]["fit-rounds"]) == 4
    assert strategy_obj.store.last_round[1] == 4
    if strategy == "fedamp":
        assert np.isfinite(strategy_obj.matrix.gram_c).all()
    else:
        assert np.isfinite([strategy_obj.sigma0_sq]).all()
        assert all(np.isfinite(a).all() for a in strategy_obj.global_arrays)


def test_round_fails_clearly_below_min_fit_answers(tmp_path):
    cfg = small_config(strategy="fedavg", rounds=2, clients=4, model="mclr",
                       **{"min-fit-answers": 3, "data.subsample": 2000})
    FaultyProxy.plan = {(1, 0): "nan", (1, 3): "lost"}
    with pytest.raises(RoundError, match=r"round 1: 2 valid update\(s\) from 4 sampled client"
                                         r"\(s\), fewer than min-fit-answers = 3"):
        inprocess.run(cfg, tmp_path, manager=inprocess.make_federation(4, proxy_cls=FaultyProxy))
    summary = json.loads((tmp_path / "summary.json").read_text())  # the record says so too
    assert summary["status"] == "failed" and summary["error"]["type"] == "RoundError"
    assert summary["error"]["message"].startswith("round 1: 2 valid update(s) from 4 sampled")


# ------------------------------------------------------------------ federation changes
def _with_pids(pids: list[int]):
    from flwr.app import Context, RecordDict
    from flwr.server.client_manager import SimpleClientManager

    manager = SimpleClientManager()
    for k, pid in enumerate(pids):
        ctx = Context(run_id=0, node_id=500 + k, node_config={"partition-id": pid,
                                                               "num-partitions": len(pids)},
                      state=RecordDict(), run_config={})
        manager.register(inprocess.InProcessProxy(str(500 + k), ctx))
    return manager


@pytest.mark.parametrize("pids, needle", [
    ([0, 1, 2, 7], r"reports partition-id 7, outside \[0, 4\) of the configuration"),
    ([0, 1, 1, 3], r"two nodes report partition-id 1"),
])
def test_handshake_refuses_bad_partition_ids(tmp_path, pids, needle):
    from flower_pfl.strategies.base import FederationError

    cfg = small_config(strategy="fedavg", clients=4, rounds=1, model="mclr",
                       **{"data.subsample": 2000})
    with pytest.raises(FederationError, match=needle):
        inprocess.run(cfg, tmp_path, manager=_with_pids(pids))


def test_a_node_failing_the_first_handshake_is_named_with_its_reason(tmp_path):
    """The first handshake must end in a FederationError that names the node and why (it
    raised NameError once: the helper that words the reason was not imported)."""
    from flower_pfl.strategies.base import FederationError

    class Broken(inprocess.InProcessProxy):
        def get_properties(self, ins, timeout, group_id):
            raise RuntimeError("socket closed")

    manager = inprocess.make_federation(4)
    node = next(p for p in manager.all().values() if p.context.node_config["partition-id"] == 3)
    manager.unregister(node)
    manager.register(Broken(node.cid, node.context))
    cfg = small_config(strategy="fedavg", clients=4, rounds=1, model="mclr",
                       **{"data.subsample": 2000})
    with pytest.raises(FederationError, match=rf"node {node.cid} did not answer the partition-id "
                                              r"handshake: RuntimeError: socket closed"):
        inprocess.run(cfg, tmp_path, manager=manager)


def test_node_that_leaves_is_not_fatal_and_rejoins_under_its_partition_id(tmp_path):
    cfg = small_config(strategy="fedavg", clients=4, rounds=4, model="mclr",
                       **{"fraction-fit": 1.0, "data.subsample": 2000})
    manager = inprocess.make_federation(4)
    node = next(p for p in manager.all().values() if p.context.node_config["partition-id"] == 2)

    def churn(strategy_obj, r):
        if r == 1:
            manager.unregister(node)  # the node goes away after round 1
        if r == 2:  # ... and comes back with a new node id, its disk/state intact
            manager.register(inprocess.InProcessProxy("9999", node.context))
    strategy_obj = inprocess.run(cfg, tmp_path, manager=manager, on_round=churn)
    rows = _read(tmp_path / "clients.csv")
    by_round = {r: sorted(int(x["partition-id"]) for x in rows if x["round"] == str(r))
                for r in range(1, 5)}
    assert by_round == {1: [0, 1, 2, 3], 2: [0, 1, 3], 3: [0, 1, 2, 3], 4: [0, 1, 2, 3]}
    assert strategy_obj.proxies[2].cid == "9999"
    last = {int(x["partition-id"]): x for x in rows if x["round"] == "4"}
    assert int(last[2]["fit-rounds"]) == 3 and int(last[0]["fit-rounds"]) == 4
    server = {int(r["round"]): r for r in _read(tmp_path / "server.csv")}
    assert int(server[2]["sampled"]) == 3 and int(server[3]["sampled"]) == 4


def test_node_that_rejoins_under_the_same_node_id_is_sampled_again(tmp_path):
    """Deployment with node authentication: a restarted SuperNode keeps its node id. Gone at
    one round's start and back at the next, it must be sampled again (it was mapped already,
    so no handshake re-adds it; found by the namespace deployment test)."""
    cfg = small_config(strategy="fedavg", clients=4, rounds=4, model="mclr",
                       **{"fraction-fit": 1.0, "data.subsample": 2000})
    manager = inprocess.make_federation(4)
    node = next(p for p in manager.all().values() if p.context.node_config["partition-id"] == 2)

    def churn(strategy_obj, r):
        if r == 1:
            manager.unregister(node)
        if r == 2:  # back under the SAME node id
            manager.register(inprocess.InProcessProxy(node.cid, node.context))
    inprocess.run(cfg, tmp_path, manager=manager, on_round=churn)
    rows = _read(tmp_path / "clients.csv")
    by_round = {r: sorted(int(x["partition-id"]) for x in rows if x["round"] == str(r))
                for r in range(1, 5)}
    assert by_round == {1: [0, 1, 2, 3], 2: [0, 1, 3], 3: [0, 1, 2, 3], 4: [0, 1, 2, 3]}
