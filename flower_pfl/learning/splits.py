"""A client's local train/test split (``data.split``), and the clients whose test set holds a
class their training set lacks.  Pure numpy, no Flower.

``stratified`` (the default; README: each client's test set has "the same label
distribution" as its training set): per class, as in scikit-learn's stratified split.
A client of ``n`` samples gets ``T = max(1, round(n * test_fraction))`` test samples,
shared among its classes by largest remainder: class c (``n_c`` samples) gets
``floor(n_c * T / n)``, and the ``T - sum`` left over go one each to the classes with the
largest fractional parts (ties: the lower class).  No class gives its last sample to the
test set (``t_c <= n_c - 1``, so a class of one sample trains; what this cap takes goes,
in the same order, to classes with samples to spare), hence the test set never holds a
class the training set lacks; only where every class has one sample does a class
move to the test set (a test set is needed).  Which samples of a class go to the test
set: the first ``t_c`` in the client's seeded shuffle.

``random``: the client's shuffled samples, the first ``T`` to the test set (the split of
runs before stratified became the default; every built-in run's numbers before it).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

SPLITS = ("stratified", "random")


def quota_per_class(counts: np.ndarray, fraction: float) -> np.ndarray:
    """Test samples per class (``counts``: samples per class of one client; see the module
    docstring: largest remainder of ``T = max(1, round(n * fraction))``, capped at
    ``n_c - 1``, at least one in all)."""
    counts = np.asarray(counts, dtype=np.int64)
    n = int(counts.sum())
    total = max(1, int(round(n * fraction)))
    exact = counts * total / n
    quota = np.floor(exact).astype(np.int64)
    left = total - int(quota.sum())
    order = np.argsort(-(exact - quota), kind="stable")
    quota[order[:left]] += 1
    quota = np.minimum(quota, np.maximum(counts - 1, 0))
    for c in order:  # what a cap took goes to the next classes (same order) with room
        room = min(total - int(quota.sum()), max(int(counts[c]) - 1 - int(quota[c]), 0))
        quota[c] += room
    if quota.sum() == 0:  # only single-sample classes: one must be the test set
        quota[int(np.argmax(counts))] = 1
    return quota


def split_local(shuffled: np.ndarray, labels: np.ndarray, fraction: float, how: str
                ) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) of one client's ``shuffled`` sample ids, whose classes are ``labels``
    (same length), by ``how`` (:data:`SPLITS`).  The train part keeps the shuffled order
    (a cap on it takes a random subset)."""
    if how == "random":
        n_test = max(1, int(round(len(shuffled) * fraction)))
        return shuffled[n_test:], shuffled[:n_test]
    if how != "stratified":
        raise ValueError(f"data.split = {how!r}: expected one of {list(SPLITS)}")
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    quota = quota_per_class(counts, fraction)
    rank = np.empty(len(labels), dtype=np.int64)  # position of each sample within its class
    for c in range(len(classes)):
        members = np.flatnonzero(inverse == c)
        rank[members] = np.arange(len(members))
    is_test = rank < quota[inverse]
    return shuffled[~is_test], shuffled[is_test]


def unseen_test_classes(train: Sequence[np.ndarray], test: Sequence[np.ndarray],
                        labels: np.ndarray) -> dict[int, list[int]]:
    """``{client: [classes in its test set but not in its training set]}`` for the clients
    that have any (``train``/``test``: per-client index arrays into ``labels``)."""
    out = {}
    for client, (tr, te) in enumerate(zip(train, test)):
        missing = np.setdiff1d(np.unique(labels[te]), np.unique(labels[tr]))
        if len(missing):
            out[client] = [int(c) for c in missing]
    return out


#: summary.json's count of clients whose local test set holds a class their training set
#: lacks (each client reports its number of such classes as ``unseen-classes``)
UNSEEN_KEY = "clients-testing-unseen-classes"


def unseen_classes(y_train: Any, y_test: Any) -> int:
    """How many classes appear in one client's test labels but not in its training labels
    (``y_*``: 1-D label arrays or tensors, on any device)."""
    train = np.unique(np.asarray(y_train.cpu() if hasattr(y_train, "cpu") else y_train))
    test = np.unique(np.asarray(y_test.cpu() if hasattr(y_test, "cpu") else y_test))
    return int(len(np.setdiff1d(test, train)))
