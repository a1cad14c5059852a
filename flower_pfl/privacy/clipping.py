"""L2 clipping of what a client uploads (client-level DP; docs/privacy.md).  Pure numpy.

An upload is a list of arrays (any shapes; the model part, then any extra parts).  What is
clipped is its *update*: ``delta = upload - reference`` over ALL its arrays taken as one
flat vector, where ``reference`` is what the server sent that client this round (a model
upload) or zeros (an upload that is already a delta: FedSAM's / PLGU-LF's Delta_i,
SCAFFOLD's dc_i).  Clipping scales the whole delta by ``min(1, C / ||delta||_2)``
(Abadi et al. 2016, eq. in Algorithm 1 "clip gradient"; McMahan et al. 2018, DP-FedAvg's
``ClipFn``), so its direction is kept and ``||clipped delta||_2 <= C``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def l2_norm(arrays: Sequence[np.ndarray]) -> float:
    """The L2 norm of ``arrays`` taken as one flat vector (float64; 0.0 for none)."""
    total = 0.0
    for a in arrays:
        flat = np.asarray(a, dtype=np.float64).ravel()
        total += float(np.dot(flat, flat))  # no squared copy: one pass (BLAS ddot)
    return float(np.sqrt(total))


#: a clipped update is scaled to this fraction of the clip, so that rounding it back to
#: float32 (relative error ~6e-8 per entry) cannot leave it outside the ball
INSIDE = 1.0 - 1e-6


def clip_factor(norm: float, clip: float) -> float:
    """``min(1, clip / norm)`` (times :data:`INSIDE` where it clips): the factor that brings
    a vector of L2 norm ``norm`` inside the ball of radius ``clip`` (1.0 for a zero
    vector).  Raises ValueError for clip <= 0 or a norm that is not finite (a NaN upload is
    refused, never clipped)."""
    if not clip > 0:
        raise ValueError(f"clip norm must be > 0, got {clip}")
    if not np.isfinite(norm):
        raise ValueError(f"cannot clip an update of norm {norm}: it is refused instead")
    return 1.0 if norm <= clip else INSIDE * clip / norm


def clip_update(upload: Sequence[np.ndarray], reference: Sequence[np.ndarray] | None,
                clip: float) -> tuple[list[np.ndarray], float]:
    """(the clipped upload, the norm of its update before clipping).

    ``upload``: k arrays of any shapes; ``reference``: k arrays of the same shapes (what
    the server sent) or None (zeros: the upload is a delta).  Returns
    ``reference + min(1, clip/||delta||) * delta`` array by array, each in its upload's
    dtype, with ``delta = upload - reference`` normed as one flat vector.  Raises
    ValueError on a count or shape mismatch, clip <= 0 or a NaN/Inf update."""
    if reference is not None and len(reference) != len(upload):
        raise ValueError(f"{len(upload)} upload arrays against {len(reference)} reference "
                         f"arrays")
    deltas, refs = [], []
    for i, a in enumerate(upload):
        d = np.asarray(a, dtype=np.float64)  # float32 - float32 is exact in float64
        if reference is not None:
            r = np.asarray(reference[i], dtype=np.float64)
            if np.shape(a) != np.shape(r):
                raise ValueError(f"array {i}: upload shape {np.shape(a)}, reference "
                                 f"{np.shape(r)}")
            d = d - r
            refs.append(r)
        deltas.append(d)
    norm = l2_norm(deltas)
    factor = clip_factor(norm, clip)
    if factor == 1.0:
        return [np.array(a, copy=True) for a in upload], norm
    if reference is None:
        return [(factor * d).astype(np.asarray(a).dtype) for a, d in zip(upload, deltas)], norm
    return [(r + factor * d).astype(np.asarray(a).dtype)
            for a, r, d in zip(upload, refs, deltas)], norm
