"""Flat parameter vectors and one stacked client-model matrix with its Gram matrix.

Pure numpy; no Flower, no torch.  FedAMP, HeurFedAMP and FedACS all need pairwise
quantities of the stored client models (squared distances, cosines) and weighted sums
``U = Xi @ W``.  :class:`ModelMatrix` keeps the n stored models as rows of ONE float32
matrix and its Gram matrix between rounds, so

* every pairwise quantity comes from the Gram matrix -- no Python loop over pairs and
  no re-flattening per pair;
* when s of n clients upload, only their rows and columns of the Gram matrix are
  recomputed: O(s*n*d) instead of O(n^2*d) (exactly the values a full recomputation
  gives, up to float rounding: tests check it);
* numerical safety: squared distances ``G_ii + G_jj - 2 G_ij`` cancel catastrophically
  when models are close and far from the origin.  The matrix therefore stores models
  CENTERED at a fixed reference ``r`` (the initial global model: every client model
  descends from it) -- ``Xc = X - r`` -- and the Gram matrix of Xc.  Distances are
  invariant to the shift; cosines of the raw models are recovered exactly from
  ``G = Gc + b 1^T + 1 b^T + ||r||^2`` with ``b = Xc r`` (no cancellation issue for
  cosines).  Accumulation is float32 (BLAS sgemm); centring is what keeps distances
  accurate (tests compare against float64 pairwise loops).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class ParamSpec:
    """Shapes of a list of arrays, to flatten/unflatten model parameters."""

    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, arrays: Sequence[np.ndarray]) -> "ParamSpec":
        return cls(tuple(tuple(np.shape(a)) for a in arrays))

    @property
    def sizes(self) -> list[int]:
        return [int(np.prod(s)) for s in self.shapes]

    @property
    def dim(self) -> int:
        return sum(self.sizes)

    def flatten(self, arrays: Sequence[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        if len(arrays) != len(self.shapes):
            raise ValueError(f"expected {len(self.shapes)} arrays, got {len(arrays)}")
        vec = np.empty(self.dim, dtype=np.float32) if out is None else out
        pos = 0
        for a, size in zip(arrays, self.sizes):
            vec[pos:pos + size] = np.asarray(a, dtype=np.float32).reshape(-1)
            pos += size
        return vec

    def unflatten(self, vec: np.ndarray) -> list[np.ndarray]:
        out, pos = [], 0
        for shape, size in zip(self.shapes, self.sizes):
            out.append(np.asarray(vec[pos:pos + size], dtype=np.float32).reshape(shape))
            pos += size
        return out


class ModelMatrix:
    """n client models (rows) centred at a reference, with an incrementally kept Gram matrix.

    Row i starts as the reference itself (centred row = 0): a client that has not
    uploaded yet is represented by the initial model, its column W^0 in FedAMP's terms.
    ``seen[i]`` records whether client i has uploaded at least once.
    """

    def __init__(self, num_rows: int, reference: np.ndarray) -> None:
        self.reference = np.asarray(reference, dtype=np.float32).copy()
        self.ref_sq = float(np.dot(self.reference.astype(np.float64),
                                   self.reference.astype(np.float64)))
        d = self.reference.shape[0]
        self.centered = np.zeros((num_rows, d), dtype=np.float32)
        self.gram_c = np.zeros((num_rows, num_rows), dtype=np.float32)  # Xc Xc^T
        self.cross = np.zeros(num_rows, dtype=np.float64)  # b = Xc r
        self.seen = np.zeros(num_rows, dtype=bool)

    @property
    def num_rows(self) -> int:
        return self.centered.shape[0]

    @property
    def dim(self) -> int:
        return self.centered.shape[1]

    def update(self, rows: Sequence[int], vectors: np.ndarray) -> None:
        """Replace the models of ``rows``; refresh only their Gram rows/columns."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) == 0:
            return
        if len(np.unique(rows)) != len(rows):
            raise ValueError("duplicate rows in one update")
        vectors = np.asarray(vectors, dtype=np.float32).reshape(len(rows), self.dim)
        self.centered[rows] = vectors - self.reference  # (fancy-indexed: assign, not out=)
        self.seen[rows] = True
        if 2 * len(rows) >= self.num_rows:
            # Most rows changed: one symmetric X X^T (BLAS syrk, half the flops of the
            # general product) is cheaper than refreshing the rows one block at a time.
            self.recompute()
            return
        changed = self.centered[rows]
        block = changed @ self.centered.T  # (s, n): the O(s n d) part
        self.gram_c[rows, :] = block
        self.gram_c[:, rows] = block.T
        self.cross[rows] = changed @ self.reference

    def recompute(self) -> None:
        """Full O(n^2 d) recomputation (the reference route for tests and benchmarks)."""
        self.gram_c = self.centered @ self.centered.T
        self.cross = (self.centered @ self.reference).astype(np.float64)

    def sq_distances(self, rows: Sequence[int] | None = None) -> np.ndarray:
        """``||w_i - w_j||^2`` for i in ``rows`` (all if None), j over all rows; >= 0."""
        rows = np.arange(self.num_rows) if rows is None else np.asarray(rows)
        diag = np.diagonal(self.gram_c).astype(np.float64)
        d = diag[rows, None] + diag[None, :] - 2.0 * self.gram_c[rows].astype(np.float64)
        d[np.arange(len(rows)), rows] = 0.0
        return np.maximum(d, 0.0)

    def drift(self) -> np.ndarray:
        """``||w_i - r||`` of every row: its distance from the reference (initial) model."""
        return np.sqrt(np.maximum(np.diagonal(self.gram_c).astype(np.float64), 0.0))

    def raw_gram(self, rows: Sequence[int] | None = None) -> np.ndarray:
        """``<w_i, w_j>`` of the uncentred models, float64."""
        rows = np.arange(self.num_rows) if rows is None else np.asarray(rows)
        g = self.gram_c[rows].astype(np.float64)
        return g + self.cross[rows, None] + self.cross[None, :] + self.ref_sq

    def cosine(self, rows: Sequence[int] | None = None) -> np.ndarray:
        """Cosine similarity of the uncentred models, rows x all."""
        rows = np.arange(self.num_rows) if rows is None else np.asarray(rows)
        norms_sq = np.diagonal(self.gram_c).astype(np.float64) + 2 * self.cross + self.ref_sq
        norms = np.sqrt(np.maximum(norms_sq, 1e-30))
        return np.clip(self.raw_gram(rows) / (norms[rows, None] * norms[None, :]), -1.0, 1.0)

    def combine(self, weights: np.ndarray) -> np.ndarray:
        """``weights @ W`` for a (m, n) weight matrix over all rows -> (m, d) float32.

        Computed on the centred rows: ``Xi W = Xi Xc + (Xi 1) r^T``.
        """
        weights = np.asarray(weights, dtype=np.float32)
        out = weights @ self.centered
        out += weights.sum(axis=1, dtype=np.float32)[:, None] * self.reference[None, :]
        return out

    def model(self, row: int) -> np.ndarray:
        return self.centered[row] + self.reference

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"reference": self.reference, "centered": self.centered,
                "gram_c": self.gram_c, "cross": self.cross, "seen": self.seen}


def _pairwise_naive(vectors: np.ndarray, pair, diagonal: float) -> np.ndarray:
    """Reference route: a Python loop over pairs in float64 (tests and benchmarks only)."""
    v = np.asarray(vectors, dtype=np.float64)
    out = np.full((len(v), len(v)), diagonal)
    for i in range(len(v)):
        for j in range(i + 1, len(v)):
            out[i, j] = out[j, i] = pair(v[i], v[j])
    return out


def pairwise_sq_distances_naive(vectors: np.ndarray) -> np.ndarray:
    return _pairwise_naive(vectors, lambda a, b: float((a - b) @ (a - b)), 0.0)


def pairwise_cosine_naive(vectors: np.ndarray) -> np.ndarray:
    return _pairwise_naive(
        vectors, lambda a, b: float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))), 1.0)
