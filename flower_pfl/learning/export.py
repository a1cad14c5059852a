"""Export a built-in dataset's pooled images to an image folder (``<out>/<label>/<row>.png``),
for the same-data-same-numbers check and the loading benchmark (benchmarks/data_load.py).

File names are the pooled row numbers, zero-padded, so within a class the folder's sorted
order is the pooled order; labels are folder names ``0``..``K-1`` (for K <= 10 they sort
as the numbers).  A partition file in ids (``client,id`` with ``<label>/<row>.png``) then
names the same samples in both (:mod:`flower_pfl.learning.fixed_partitions`)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np


def image_id(label: int, row: int) -> str:
    """The relative path of pooled row ``row`` (class ``label``) in an export."""
    return f"{label}/{row:05d}.png"


def export_png(x: np.ndarray, y: np.ndarray, out: Path, rows: Sequence[int] | None = None
               ) -> list[str]:
    """Write ``x[rows]`` (uint8 ``(N, C, H, W)``, C 1 or 3) as PNGs under ``out``; return
    their ids (:func:`image_id`), in ``rows`` order (default: every row)."""
    from PIL import Image

    ids = []
    for row in (range(len(y)) if rows is None else rows):
        label = int(y[row])
        path = out / image_id(label, int(row))
        path.parent.mkdir(parents=True, exist_ok=True)
        a = np.asarray(x[row])
        Image.fromarray(a[0] if a.shape[0] == 1 else a.transpose(1, 2, 0)).save(path)
        ids.append(image_id(label, int(row)))
    return ids
