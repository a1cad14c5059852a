"""A source's samples as the data modules take them (:class:`Loaded`), the labels mapped to
``0..K-1`` (:func:`labelled`), and the error a source that cannot be read raises.  Below
:mod:`~flower_pfl.learning.sources` and :mod:`~flower_pfl.learning.source_readers`.
numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class SourceError(RuntimeError):
    """A ``data.dataset`` source cannot be read; the message names the key and what to do."""


@dataclass
class Loaded:
    """A source's pooled samples: ``x`` uint8 ``(N, C, H, W)`` images or float32 ``(N, F)``
    features, ``y`` int64 ``(N,)`` in ``0..K-1``, ``classes`` the K original label values
    (as strings), ``columns`` extra per-sample columns (for a natural partition),
    ``skipped`` the hidden and system entries the reader passed over (relative paths),
    ``features`` a table's feature columns in order (empty for images and arrays)."""

    x: np.ndarray
    y: np.ndarray
    classes: list[str]
    columns: dict[str, np.ndarray] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    features: list[str] = field(default_factory=list)


def labelled(x: np.ndarray, raw: np.ndarray, what: str,
             columns: dict[str, np.ndarray] | None = None, min_classes: int = 2) -> Loaded:
    """``Loaded`` with ``raw`` labels mapped to ``0..K-1`` (sorted values); checks ``x``
    and ``raw`` agree in length, are not empty and hold ``min_classes`` classes (a pooled
    source: 2; one site's own data: 1, :mod:`~flower_pfl.learning.site_data`)."""
    raw = np.asarray(raw)
    if raw.ndim != 1 or len(raw) != len(x):
        raise SourceError(f"{what}: labels of shape {raw.shape} do not match the "
                          f"{len(x)} samples (one label per sample needed)")
    if len(x) == 0:
        raise SourceError(f"{what}: no samples")
    values, y = np.unique(raw, return_inverse=True)
    if len(values) < min_classes:
        raise SourceError(f"{what}: a single class ({values[0]!r}); classification needs 2+")
    return Loaded(x, y.astype(np.int64), [str(v) for v in values], columns or {})
