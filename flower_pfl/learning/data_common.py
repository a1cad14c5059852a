"""What the data modules share, below all of them: the Debian copy of Fashion-MNIST, the
built-in datasets' normalisation, the cache folder, the error a failed load raises and the
per-dataset normalisation tables (:func:`flower_pfl.learning.data.normalization_table`).
Read by :mod:`~flower_pfl.learning.data`, :mod:`~flower_pfl.learning.own_data` and
:mod:`~flower_pfl.learning.sources`; imports none of them.  numpy only.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

DEBIAN_FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
# (mean, std) per channel, used to normalise images to roughly zero mean / unit variance.
NORMALIZATION = {
    "fmnist": ((0.2860,), (0.3530,)),
    "mnist": ((0.1307,), (0.3081,)),
    "emnist": ((0.1751,), (0.3332,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


class DataError(RuntimeError):
    """A dataset could not be loaded or partitioned; the message says what to do."""


def default_cache_dir() -> Path:
    return Path(os.environ.get("FLOWER_PFL_CACHE", Path.home() / ".cache" / "flower-pfl"))


#: dataset -> float32 ``(C, 256)`` normalisation table (filled by
#: :func:`flower_pfl.learning.data.normalization_table` and by own sources)
TABLES: dict[str, np.ndarray] = {}
