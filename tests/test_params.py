"""Flat parameter vectors, and the model store's Gram-matrix route == the naive pairwise route;
incremental == full."""

from __future__ import annotations

import numpy as np
import pytest

from flower_pfl.learning.params import (
    ParamSpec,
    pairwise_cosine_naive,
    pairwise_sq_distances_naive,
)
from flower_pfl.model_store import ModelStore


def test_paramspec_round_trip():
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(4, dtype=np.float32)]
    spec = ParamSpec.of(arrays)
    vec = spec.flatten(arrays)
    assert spec.dim == 10 and vec.dtype == np.float32
    back = spec.unflatten(vec)
    assert all(np.array_equal(a, b) for a, b in zip(arrays, back))
    with pytest.raises(ValueError):
        spec.flatten(arrays[:1])


def _models(n, d, seed=0, offset=0.0, spread=1.0):
    rng = np.random.default_rng(seed)
    return (offset + spread * rng.standard_normal((n, d))).astype(np.float32)


def test_gram_route_equals_naive_pairwise_route():
    rng = np.random.default_rng(1)
    ref = rng.standard_normal(300).astype(np.float32)
    w = ref + _models(7, 300, spread=0.1)
    m = ModelStore(7, ref)
    m.update(range(7), w)
    np.testing.assert_allclose(m.sq_distances(), pairwise_sq_distances_naive(w), rtol=1e-4,
                               atol=1e-6)
    np.testing.assert_allclose(m.cosine(), pairwise_cosine_naive(w), atol=1e-6)
    np.testing.assert_allclose(m.sq_distances([2, 5]), pairwise_sq_distances_naive(w)[[2, 5]],
                               rtol=1e-4, atol=1e-6)
    xi = rng.random((3, 7))
    np.testing.assert_allclose(m.combine(xi), xi @ w.astype(np.float64), rtol=1e-4, atol=1e-4)


def test_centring_keeps_close_models_accurate():
    # Models far from the origin and close to each other (late training): the uncentred
    # float32 Gram loses the distances to cancellation, the centred one keeps them.
    rng = np.random.default_rng(2)
    base = (5.0 + rng.standard_normal(20000)).astype(np.float32)
    w = base + 1e-3 * rng.standard_normal((5, 20000)).astype(np.float32)
    exact = pairwise_sq_distances_naive(w)
    centred = ModelStore(5, base)
    centred.update(range(5), w)
    uncentred = ModelStore(5, np.zeros_like(base))
    uncentred.update(range(5), w)
    off = ~np.eye(5, dtype=bool)
    err_c = np.abs(centred.sq_distances() - exact)[off].max() / exact[off].min()
    err_u = np.abs(uncentred.sq_distances() - exact)[off].max() / exact[off].min()
    assert err_c < 1e-3
    assert err_u > 10 * err_c  # why the store is centred


def test_incremental_update_equals_full_recomputation():
    rng = np.random.default_rng(3)
    ref = rng.standard_normal(500).astype(np.float32)
    m = ModelStore(30, ref)
    for step in range(6):  # several rounds, each with a different subset uploading
        rows = rng.choice(30, size=5, replace=False)
        m.update(rows, ref + _models(5, 500, seed=step, spread=0.2))
    incremental = (m.gram_c.copy(), m.cross.copy())
    m.recompute()
    np.testing.assert_allclose(incremental[0], m.gram_c, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(incremental[1], m.cross, rtol=1e-6, atol=1e-6)
    assert m.seen.sum() <= 30 and m.seen.sum() >= 5


def test_unseen_rows_are_the_reference_model():
    ref = np.arange(4, dtype=np.float32)
    m = ModelStore(3, ref)
    m.update([1], np.array([[1, 1, 1, 1]], dtype=np.float32))
    assert np.array_equal(m.model(0), ref) and np.array_equal(m.model(1), np.ones(4))
    assert m.sq_distances()[0, 2] == 0.0 and m.sq_distances()[0, 1] == pytest.approx(
        float(((ref - 1) ** 2).sum()))
    assert m.seen.tolist() == [False, True, False]


def test_drift_is_the_distance_from_the_reference():
    rng = np.random.default_rng(3)
    ref = rng.standard_normal(40).astype(np.float32)
    w = ref + rng.standard_normal((4, 40)).astype(np.float32)
    m = ModelStore(5, ref)
    m.update([0, 1, 2, 3], w)
    np.testing.assert_allclose(m.drift()[:4], np.linalg.norm(w - ref, axis=1), rtol=1e-5)
    assert m.drift()[4] == 0.0  # never uploaded: the reference itself
