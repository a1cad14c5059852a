"""The model store (flower_pfl/model_store.py): the memory store computes in one product bit
for bit, disk = the memory store's blocked mode bit for bit (store and strategies), float16
within its stated tolerance, the budget's choice, the incremental Gram refresh, and
checkpoint/resume with the store's file as the checkpoint of the rows.

Small real runs: FedAMP and FedACS in process on an FMNIST subset (mclr, 6 clients, half
sampled) with ``server.memory-budget-mb`` tiny, so that every pass over the rows takes
several column blocks, the cloud models of a round go to a scratch file and evaluation
computes its cloud models in blocks of 2 clients.
"""

from __future__ import annotations

import csv
import logging
import pickle

import numpy as np
import pytest

from flower_pfl import config
from flower_pfl.algorithms.attention import fedacs_weights, fedamp_auto_weights, heurfedamp_weights
from flower_pfl.model_store import (
    DiskRows,
    MemoryRows,
    ModelStore,
    StaleGramError,
    StoreFileError,
    plan_store,
)
from flower_pfl.reliability import checkpoints
from flower_pfl.running import inprocess
from tests.conftest import small_config

TINY_MB = 0.05  # block and output buffers at their 64 KiB floor: several blocks per pass
TIMING = {"attention_s", "server_prepare_s", "server_aggregate_s", "server_peak_rss_mb",
          "elapsed_s"}


def _cfg(strategy, store, **changes):
    return small_config(strategy=strategy, **{
        "rounds": 3, "clients": 6, "model": "mclr", "fraction-fit": 0.5, "eval-every": 1,
        "data.subsample": 1500, "train.batch-size": 50, "checkpoint-every": 0,
        "server.model-store": store, "server.memory-budget-mb": TINY_MB, **changes})


def _rows(path, name, skip=TIMING):
    with open(path / name) as fh:
        return [{k: v for k, v in r.items() if k not in skip} for r in csv.DictReader(fh)]


@pytest.fixture(scope="module", params=["fedamp", "fedacs"])
def runs(request, tmp_path_factory):
    """The same run with the rows on disk and in memory, computed in column blocks as on
    disk (``one_product`` off; the default memory store computes in one product)."""
    out = {}
    for store in ("memory", "disk"):
        path = tmp_path_factory.mktemp(f"{request.param}-{store}")
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ModelStore, "one_product", False)
            out[store] = (inprocess.run(_cfg(request.param, store), path), path)
    return out


def test_memory_store_computes_in_one_product_bit_for_bit():
    """The default memory store computes the refreshed Gram rows and U = Xi W as ONE product
    each over all n centred rows (the rows in the order they were written): the arithmetic
    FedAMP/HeurFedAMP's results were made with, bit for bit.  The blocked passes (the disk
    store's arithmetic) round differently.

    A few refreshed rows R: the store writes the product P = Xc[R] Xc^T as the rows R and,
    transposed, as the columns R, so an entry of R x R is written twice and the columns' P^T
    stays.  BLAS need not round (a, b) and (b, a) of P alike (OpenBLAS's Haswell kernel on one
    thread does not; on two it does), so the claim that holds at every thread count is: the
    columns R are P^T, and the rest of the rows R is P."""
    n, d = 64, 3000
    rng = np.random.default_rng(1)
    ref = rng.standard_normal(d).astype(np.float32)
    plan = plan_store(n, d, "float32", int(TINY_MB * 2**20), "memory")
    new, blocked = ModelStore(n, ref, plan), ModelStore(n, ref, plan)
    blocked.one_product = False
    assert len(list(blocked.blocks(np.arange(n)))) > 1  # the blocked mode: several blocks
    # round 1: 40 of 64 rows (one full X X^T), then a few (their rows of the Gram); rows in
    # upload order, not sorted; 18 clients never upload (their rows stay the reference)
    order = rng.permutation(n)
    for rows in (order[:40], order[38:43], order[[0, 50, 7, 44, 3]], order[[45, 9, 2]]):
        vectors = (ref + rng.standard_normal((len(rows), d))).astype(np.float32)
        for store in (new, blocked):
            store.update(rows, vectors)
        x = new.rows.data  # the centred rows, 0 for a client that never uploaded
        if 2 * len(rows) >= n:
            assert np.array_equal(new.gram_c, x @ x.T)
            assert np.array_equal(new.cross, (x @ ref).astype(np.float64))
        else:
            product = x[rows] @ x.T
            others = np.setdiff1d(np.arange(n), rows)
            assert np.array_equal(new.gram_c[np.ix_(rows, others)], product[:, others])
            assert np.array_equal(new.gram_c[:, rows], product.T)
            assert np.array_equal(new.cross[rows], x[rows] @ ref)
    assert isinstance(new.rows, MemoryRows) and new.in_one_product() and (~new.seen).sum() == 18
    rows, peers = order[[4, 0, 50, 60]], new.seen.copy()
    sigma = float(np.median(new.sq_distances(rows)[:, peers]))
    xi, _ = fedamp_auto_weights(new.sq_distances(rows), rows, peers, sigma, 0.5)
    assert (xi[:, peers] > 0).all()  # attention on every peer
    every = rng.random((n, n)).astype(np.float32)
    every[:, rng.permutation(n)[:16]] = 0.0  # peers left out (outliers, never uploaded)
    for weights in (xi, every / every.sum(axis=1, keepdims=True)):
        w = np.asarray(weights, dtype=np.float32)
        one = w @ x
        one += w.sum(axis=1, dtype=np.float32)[:, None] * ref[None, :]
        assert np.array_equal(new.combine(weights), one)
        assert np.array_equal(np.asarray(new.combine_rows(weights)), one)
    # the blocked passes (the disk store's arithmetic) round differently: the check bites
    assert not np.array_equal(new.gram_c, blocked.gram_c)
    assert not np.array_equal(new.combine(xi), blocked.combine(xi))


def test_disk_store_gives_the_same_run_bit_for_bit(runs):
    (mem, mem_dir), (disk, disk_dir) = runs["memory"], runs["disk"]
    assert isinstance(mem.matrix.rows, MemoryRows) and isinstance(disk.matrix.rows, DiskRows)
    assert disk.matrix.rows.path.is_file() and disk.matrix.rows.path.parent == disk_dir / "state"
    # the stored models, their Gram matrix and the final attention weights
    for pid in range(6):
        assert np.array_equal(mem.matrix.model(pid), disk.matrix.model(pid)), pid
    assert np.array_equal(mem.matrix.gram_c, disk.matrix.gram_c)
    assert np.array_equal(np.load(mem_dir / "attention.npy"), np.load(disk_dir / "attention.npy"))
    # every client's evaluation (of the model it was sent) and the server's per-round values
    assert _rows(mem_dir, "clients.csv") == _rows(disk_dir, "clients.csv")
    assert _rows(mem_dir, "server.csv") == _rows(disk_dir, "server.csv")
    assert _rows(mem_dir, "fit.csv") == _rows(disk_dir, "fit.csv")
    # the round's cloud models went through a scratch file, which is gone after the round
    assert not (disk_dir / "state" / "cloud-fit.bin").exists()


def _stored(runs):
    s = runs["memory"][0]
    return s.matrix.reference, np.stack([s.matrix.model(p) for p in range(6)])


def _fill(store, vectors, rounds=((0, 1, 2), (3, 4), (1, 5), (0, 2, 4))):
    """Partial updates round by round (rows written again, as in a run)."""
    rng = np.random.default_rng(0)
    for r, rows in enumerate(rounds, start=1):
        for i in rows:
            store.write(i, vectors[i] + (1e-3 * r) * rng.standard_normal(vectors.shape[1])
                        .astype(np.float32), r)
        store.refresh()
    return store


def test_store_level_disk_equals_memory_bit_for_bit(runs, tmp_path):
    ref, vectors = _stored(runs)
    budget = int(TINY_MB * 2**20)
    mem = ModelStore(6, ref, plan_store(6, len(ref), "float32", budget, "memory"))
    mem.one_product = False  # the memory store's blocked mode (the default: one product)
    mem = _fill(mem, vectors)
    disk = _fill(ModelStore(6, ref, plan_store(6, len(ref), "float32", budget, "disk"), tmp_path),
                 vectors)
    assert len(list(mem.blocks(np.arange(6)))) > 1  # several column blocks per pass
    rows, peers = np.array([0, 3, 5]), mem.seen.copy()
    for name in ("gram_c", "cross", "seen", "row_round"):
        assert np.array_equal(getattr(mem, name), getattr(disk, name)), name
    for m in ("sq_distances", "cosine", "raw_gram"):
        assert np.array_equal(getattr(mem, m)(rows), getattr(disk, m)(rows)), m
        assert np.array_equal(getattr(mem, m)(rows, rows), getattr(disk, m)(rows, rows)), m
    xi_m, _ = fedamp_auto_weights(mem.sq_distances(rows), rows, peers, 1.0, 0.5)
    xi_d, _ = fedamp_auto_weights(disk.sq_distances(rows), rows, peers, 1.0, 0.5)
    assert np.array_equal(xi_m, xi_d)
    assert np.array_equal(heurfedamp_weights(mem.cosine(rows), rows, peers, 1000.0, 0.5),
                          heurfedamp_weights(disk.cosine(rows), rows, peers, 1000.0, 0.5))
    assert np.array_equal(fedacs_weights(mem.cosine(rows), rows, peers, 0.99),
                          fedacs_weights(disk.cosine(rows), rows, peers, 0.99))
    assert np.array_equal(mem.combine(xi_m), disk.combine(xi_m))
    big = disk.combine_rows(np.full((4, 6), 1 / 6), tmp_path / "scratch.bin")
    assert isinstance(big.rows, DiskRows)  # 4 models > the 64 KiB output share
    assert np.array_equal(np.asarray(big), mem.combine(np.full((4, 6), 1 / 6)))
    big.close()
    assert not (tmp_path / "scratch.bin").exists()


# float16: each stored (centred) value within 2^-11 of its own size (float16's rounding at
# the per-row scale, normal range), pairwise values within 2^-10 of the product of the norms
F16_VALUE = 2.0**-11
F16_PAIR = 2.0**-10


def test_float16_store_is_within_its_stated_tolerance(runs, tmp_path):
    ref, vectors = _stored(runs)
    exact = _fill(ModelStore(6, ref), vectors)
    half = _fill(ModelStore(6, ref, plan_store(6, len(ref), "float16", 2**20, "disk"), tmp_path),
                 vectors)
    assert half.rows.read(0).dtype == np.float16
    centred = np.stack([exact.model(pid) - ref for pid in range(6)])
    tiny = 2.0**-40 * np.abs(centred).max() + 1e-7 * np.abs(ref)  # + float32 rounding of +- r
    for pid in range(6):
        assert (np.abs(half.model(pid) - ref - centred[pid]) <= F16_VALUE * np.abs(centred[pid])
                + tiny).all(), pid
    norms = np.sqrt(np.diagonal(exact.gram_c).astype(np.float64))
    assert (np.abs(half.gram_c - exact.gram_c) <= F16_PAIR * np.outer(norms, norms) + 1e-6).all()
    rows, peers = np.arange(6), exact.seen.copy()
    # what the strategies compute from it: measured errors here ~1e-5 of the weights
    xi, _ = fedamp_auto_weights(exact.sq_distances(rows), rows, peers, 1.0, 0.5)
    xi_h, _ = fedamp_auto_weights(half.sq_distances(rows), rows, peers, 1.0, 0.5)
    assert np.abs(xi_h - xi).max() <= 1e-3
    h = heurfedamp_weights(exact.cosine(rows), rows, peers, 1000.0, 0.5)
    h_h = heurfedamp_weights(half.cosine(rows), rows, peers, 1000.0, 0.5)
    assert np.abs(h_h - h).max() <= 1e-3
    u, u_h = exact.combine(xi), half.combine(xi)
    # u_i is a convex combination: each value within 2^-11 of the largest stored value
    assert np.abs(u_h - u).max() <= F16_VALUE * np.abs(centred).max() + 1e-7 * np.abs(ref).max()


def test_budget_picks_disk_above_it_logs_once_and_the_yaml_overrides(tmp_path, caplog):
    n, d = 1000, 1_010_850  # 1,000 clients x a 1M model: 4.04 GB of float32 rows
    assert plan_store(n, d, "float32", 16 * 2**30).backend == "memory"
    assert plan_store(n, d, "float32", 4 * 2**30).backend == "disk"
    assert plan_store(n, d, "float16", 4 * 2**30).backend == "memory"  # 2.02 GB of rows
    assert plan_store(n, d, "float32", 16 * 2**30, "disk").backend == "disk"
    assert plan_store(n, d, "float32", 2**30, "memory").backend == "memory"
    with caplog.at_level(logging.INFO):
        s = inprocess.run(_cfg("heurfedamp", "auto", rounds=1), tmp_path / "auto")
    assert isinstance(s.matrix.rows, DiskRows)  # 6 x 7850 floats > 0.05 MB
    lines = [r.getMessage() for r in caplog.records if "model store:" in r.getMessage()]
    assert len(lines) == 1 and "disk" in lines[0] and "server.memory-budget-mb" in lines[0]
    big = inprocess.run(_cfg("heurfedamp", "auto", rounds=1, **{"server.memory-budget-mb": 64}),
                        tmp_path / "big")
    assert isinstance(big.matrix.rows, MemoryRows)
    with pytest.raises(config.ConfigError, match="server.model-store"):
        _cfg("fedamp", "ssd")


def test_incremental_refresh_keeps_the_gram_of_the_stored_rows(runs, monkeypatch, tmp_path):
    """Only the written rows' Gram rows are recomputed each round; after four rounds of
    partial updates the Gram equals the stored rows' Gram computed from scratch."""
    ref, vectors = _stored(runs)
    plan = plan_store(6, len(ref), "float32", int(TINY_MB * 2**20), "disk")

    def check(store):
        rows = np.stack([store.model(p) - ref for p in range(6)]).astype(np.float64)
        return np.abs(store.gram_c - rows @ rows.T).max() <= 1e-6 * np.abs(rows @ rows.T).max()

    assert check(_fill(ModelStore(6, ref, plan, tmp_path / "a"), vectors))
    # a row written without its refresh is detected, never used stale
    store = _fill(ModelStore(6, ref, plan, tmp_path / "b"), vectors)
    store.write(2, vectors[5])
    with pytest.raises(StaleGramError, match=r"row\(s\) \[2\]"):
        store.cosine([0])
    # the mechanism switched off (dirty rows forgotten, nothing recomputed): caught
    monkeypatch.setattr(ModelStore, "refresh", lambda self: self.dirty.fill(False))
    assert not check(_fill(ModelStore(6, ref, plan, tmp_path / "c"), vectors))


class Killed(Exception):
    pass


@pytest.mark.parametrize("strategy", ["fedamp", "fedacs"])
def test_resume_from_the_store_file_equals_uninterrupted(strategy, tmp_path):
    cfg = _cfg(strategy, "disk", rounds=4, **{"checkpoint-every": 2})
    full = inprocess.run(cfg, tmp_path / "full", client_state_dir=tmp_path / "full" / "cs")
    part = tmp_path / "part"
    seen_at_kill = {}

    def kill(s, r):
        if r == 3:
            seen_at_kill.update(slots=s.matrix.rows.slots, seen=int(s.matrix.seen.sum()))
            raise Killed  # after round 3; the newest checkpoint holds round 2

    with pytest.raises(Killed):
        inprocess.run(cfg, part, client_state_dir=part / "cs", on_round=kill)
    ckpt = checkpoints.latest_checkpoint(part)
    assert ckpt.name == "round-000002"
    # the checkpoint holds no copy of the rows: its store is a slot map into the file
    state = checkpoints.read_checkpoint(ckpt)["strategy"]["store"].matrix
    assert isinstance(state.rows, DiskRows) and state.rows.path == part / "state" / \
        "model-store-float32.bin"
    row_bytes = state.dim * 4
    assert (ckpt / checkpoints.STATE_FILE).stat().st_size < 6 * row_bytes
    assert len(pickle.dumps(state)) < 2 * row_bytes  # the Gram, reference, CRCs: no rows
    # round 3 wrote the rows it changed to free slots (copy on write), not over round 2's
    assert seen_at_kill["slots"] > seen_at_kill["seen"]
    resumed = inprocess.run(cfg, part, client_state_dir=part / "cs", resume=True)
    assert [r["round"] for r in _rows(part, "rounds.csv")] == ["1", "2", "3", "4"]
    assert _rows(part, "clients.csv") == _rows(tmp_path / "full", "clients.csv")
    for pid in range(6):
        assert np.array_equal(resumed.matrix.model(pid), full.matrix.model(pid)), pid
    assert np.array_equal(np.load(part / "attention.npy"), np.load(tmp_path / "full" /
                                                                   "attention.npy"))


def test_resume_refuses_a_store_file_changed_after_the_checkpoint(tmp_path):
    cfg = _cfg("fedamp", "disk", rounds=3, **{"checkpoint-every": 2})

    def kill(s, r):
        if r == 3:
            raise Killed

    with pytest.raises(Killed):
        inprocess.run(cfg, tmp_path, on_round=kill)
    state = checkpoints.read_checkpoint(checkpoints.latest_checkpoint(tmp_path))
    rows = state["strategy"]["store"].matrix.rows
    row = int(np.flatnonzero(state["strategy"]["store"].matrix.seen)[0])
    with open(rows.path, "r+b") as fh:  # one byte of a row the checkpoint points at
        fh.seek(int(rows.slot[row]) * rows.row_bytes + 100)
        byte = fh.read(1)[0]
        fh.seek(-1, 1)
        fh.write(bytes([byte ^ 0xFF]))
    with pytest.raises(StoreFileError, match=rf"row\(s\) \[{row}\].*changed after the checkpoint"):
        inprocess.run(cfg, tmp_path, resume=True)
