"""Flat parameter vectors, and the naive pairwise route the model store is checked against.

Pure numpy; no Flower, no torch.  :class:`ParamSpec` flattens a model's arrays into one
float32 vector and back (the model's size, Self-FL's statistics).  The stored
client models and their Gram matrix are :class:`flower_pfl.model_store.ModelStore`;
:func:`pairwise_sq_distances_naive` and :func:`pairwise_cosine_naive` are the float64
loop over pairs its Gram route is tested against (tests and benchmarks only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

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


def _pairwise_naive(vectors: np.ndarray, pair: Callable[[np.ndarray, np.ndarray], float],
                    diagonal: float) -> np.ndarray:
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
