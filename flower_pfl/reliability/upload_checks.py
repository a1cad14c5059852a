"""Why an upload must be rejected, before it reaches any stored model or average.

An upload is rejected when

* the number of arrays differs from the template's, or any shape differs;
* an array's dtype differs from the model's (a float64 or int upload of a float32 model);
* any value is NaN or +-Inf (also any numeric metric: a NaN loss poisons averages);
* ``num_examples <= 0`` (it would weight an average by zero or flip its sign);
* ``max_norm`` is set and ``||upload - sent||_2 > max_norm``, where ``sent`` is what the
  server sent that client this round (its starting point; the initial model when the
  strategy sent nothing); an extra part named ``bounded`` gets the same bound on its norm.
  Under differential privacy (``clip=True``, docs/privacy.md) the norm bound is NOT a reason:
  a rejection that depends on the data would break the guarantee, so the caller clips the
  update instead (strategies/private_round.py ``clip_upload``); NaN/Inf is still refused.

Open choice (ours): the bound is on the *update*, not on the model, so it does not depend
on the model's size or its distance from 0.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np


def check_update(arrays: Sequence[np.ndarray], num_examples: int,
                 shapes: Sequence[tuple[int, ...]], dtypes: Sequence[np.dtype],
                 metrics: Mapping[str, Any] | None = None, sent: np.ndarray | None = None,
                 max_norm: float | None = None, model_count: int | None = None,
                 parts: Sequence[tuple[str, int]] = (),
                 bounded: frozenset[str] | set[str] = frozenset(),
                 clip: bool = False) -> str | None:
    """Why this upload must be rejected, or None when it is acceptable.

    ``shapes``/``dtypes`` cover the whole upload: the first ``model_count`` arrays (all by
    default) are the model part, normed against ``sent``; then the extra ``parts`` (name,
    count), each in ``bounded`` normed against zero.  ``clip``: the norm bound is left to
    the caller's clipping (differential privacy), every other check stays."""
    n_model = len(shapes) if model_count is None else model_count
    labels = [f"array {i}" for i in range(n_model)]
    for name, count in parts:
        labels += [f"array {n_model + j} (extra '{name}')" for j in range(count)]
    if len(arrays) != len(shapes):
        what = f"the model has {n_model}" + "".join(f" + '{p}' {c}" for p, c in parts)
        return f"wrong number of arrays: {len(arrays)} ({what})"
    for label, a, shape, dtype in zip(labels, arrays, shapes, dtypes):
        a = np.asarray(a)
        if tuple(a.shape) != tuple(shape):
            return f"{label} has shape {tuple(a.shape)}, expected {tuple(shape)}"
        if a.dtype != dtype:
            return f"{label} has dtype {a.dtype}, expected {np.dtype(dtype)}"
    try:
        n = int(num_examples)
    except (TypeError, ValueError):
        return f"num_examples = {num_examples!r} is not an integer"
    if n <= 0:
        return f"num_examples = {n} (must be > 0)"
    for label, a in zip(labels, arrays):
        if not np.isfinite(a).all():
            bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
            return f"{label} holds {bad} NaN/Inf value(s)"
    for key, value in (metrics or {}).items():
        if isinstance(value, float) and not math.isfinite(value):
            return f"metric '{key}' = {value}"
    if max_norm is not None and not clip:
        model = flat(arrays[:n_model])
        ref = np.zeros_like(model) if sent is None else np.asarray(sent, dtype=np.float64)
        norm = float(np.linalg.norm(model - ref))
        if norm > max_norm:
            return f"update norm {norm:.4g} exceeds max-update-norm = {max_norm:g}"
        start = n_model
        for name, count in parts:
            if name in bounded:
                norm = float(np.linalg.norm(flat(arrays[start:start + count])))
                if norm > max_norm:
                    return (f"extra '{name}' norm {norm:.4g} exceeds max-update-norm = "
                            f"{max_norm:g}")
            start += count
    return None


def flat(arrays: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays]) \
        if len(arrays) else np.zeros(0)
