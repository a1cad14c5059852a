"""Pooled arrays of your own data sources (:mod:`flower_pfl.learning.sources`), cached like the
built-in sets', and what the model needs to know of them (:class:`SourceInfo`).

:func:`load_own` reads a source once and keeps a numpy copy in the cache
(``<cache>/pooled/own-<tag>-{x,y}.npy``, memory-mapped read-only by every process, plus
``-columns.npz`` and ``-info.json``); the tag hashes the source's
:func:`~flower_pfl.learning.sources.fingerprint` (its files' sizes and modification times)
and every setting that changes what is read (``data.image-size``, ``data.features``,
``data.label``, ``data.partition-by``), so changed data are read again, never reused.

Per process, the last loaded :class:`SourceInfo` of each ``data.dataset`` value is
registered: :data:`flower_pfl.learning.data.NUM_CLASSES`, ``input_shape`` and
``NORMALIZATION`` answer for it.  :func:`remember` (called by the config's data checks)
records a run's ``data.*`` settings, so a process that has not loaded the data yet (the
ServerApp's initial-model child) loads it on the first question.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from flower_pfl.atomic import atomic_write, atomic_write_text
from flower_pfl.learning import sources

#: the data.* keys that change what a source's reader returns (part of the pooled tag)
READ_KEYS = ("data.root", "data.image-size", "data.features", "data.label",
             "data.partition-by", "data.normalize", "data.classes")


@dataclass(frozen=True)
class SourceInfo:
    """What a source is to the model: ``shape`` of one sample (images ``(C, H, W)``, a table
    ``(F,)``), ``num_classes``, ``classes`` (the original label values, in class order),
    ``kind`` ("image" or "table") and the normalisation: per channel (images: applied to
    pixel / 255) or per feature (tables) ``mean`` and ``std``."""

    shape: tuple[int, ...]
    num_classes: int
    classes: tuple[str, ...]
    kind: str
    mean: tuple[float, ...]
    std: tuple[float, ...]


_INFO: dict[str, SourceInfo] = {}
#: dataset -> the hidden and system entries its reader skipped (relative paths)
SKIPPED: dict[str, list[str]] = {}
#: dataset -> a table's feature columns, in order
FEATURES: dict[str, list[str]] = {}
_SETTINGS: dict[str, dict[str, Any]] = {}
_LOADED: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray, dict[str, np.ndarray],
                                     SourceInfo]] = {}


def settings_of(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The reader's settings of ``cfg`` (:data:`READ_KEYS` plus ``cache-dir``)."""
    out = {k: cfg.get(k) for k in READ_KEYS}
    if isinstance(out["data.features"], str):
        out["data.features"] = [out["data.features"]]
    out["cache-dir"] = cfg.get("cache-dir")
    return out


def remember(cfg: Mapping[str, Any]) -> None:
    """Record ``cfg``'s source settings for :func:`info` in a process without the data."""
    if sources.parse_source(cfg["data.dataset"], cfg.get("data.root")) is not None:
        _SETTINGS[cfg["data.dataset"]] = settings_of(cfg)


def info(dataset: str) -> SourceInfo:
    """The registered :class:`SourceInfo` of ``dataset`` (loading it with the settings
    :func:`remember` recorded where it was not loaded here).  KeyError where neither."""
    if dataset not in _INFO and dataset in _SETTINGS:
        load_own(dataset, _SETTINGS[dataset])
    return _INFO[dataset]


def clear_cache() -> None:
    _LOADED.clear()
    sources.clear_fingerprints()


def _normalisation(x: np.ndarray, how: Any) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per channel (images, on pixel / 255) or per feature (tables) mean and std:
    ``auto`` from the pooled data (std 0 -> 1), ``none`` 0 and 1, or the given
    ``[[mean, ...], [std, ...]]`` (one per channel / feature, else DataError)."""
    if isinstance(how, list):
        from flower_pfl.learning.data_common import DataError

        width = x.shape[1] if x.dtype == np.uint8 else int(np.prod(x.shape[1:]))
        unit = "channels" if x.dtype == np.uint8 else "features"
        if len(how[0]) != width:
            raise DataError(f"'data.normalize' gives {len(how[0])} mean(s) and std(s) but the "
                            f"data have {width} {unit}")
        return tuple(float(v) for v in how[0]), tuple(float(v) for v in how[1])
    if x.dtype == np.uint8:
        channels = x.shape[1]
        if how == "none":
            return (0.0,) * channels, (1.0,) * channels
        mean = np.zeros(channels)
        sq = np.zeros(channels)
        for start in range(0, len(x), 4096):  # float64 sums in chunks: no float copy
            chunk = x[start:start + 4096].astype(np.float64) / 255.0
            mean += chunk.sum(axis=(0, 2, 3))
            sq += (chunk ** 2).sum(axis=(0, 2, 3))
        per = len(x) * x.shape[2] * x.shape[3]
        mean /= per
        std = np.sqrt(np.maximum(sq / per - mean ** 2, 0.0))
    else:
        flat = x.reshape(len(x), -1).astype(np.float64)
        if how == "none":
            return (0.0,) * flat.shape[1], (1.0,) * flat.shape[1]
        mean, std = flat.mean(axis=0), flat.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


def load_own(dataset: str, settings: Mapping[str, Any]
             ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Pooled ``(x, y, columns)`` of source ``dataset`` (see the module docstring) and its
    :class:`SourceInfo` registered.  Raises ``flower_pfl.learning.data.DataError``."""
    from flower_pfl.learning.data_common import DataError, default_cache_dir

    settings = dict(settings)
    root = settings.get("data.root")
    try:
        digest = sources.fingerprint(dataset, root)
    except sources.SourceError as exc:
        raise DataError(str(exc)) from exc
    blob = json.dumps({"dataset": dataset, "data": digest,
                       **{k: settings.get(k) for k in READ_KEYS
                          if k != "data.classes" or settings.get(k)}}, sort_keys=True)
    tag = hashlib.sha256(blob.encode()).hexdigest()[:16]
    key = (tag, settings.get("cache-dir"))
    if key not in _LOADED:
        cache = Path(settings.get("cache-dir") or default_cache_dir()) / "pooled"
        files = {p: cache / f"own-{tag}-{p}.npy" for p in "xy"}
        meta, cols = cache / f"own-{tag}-info.json", cache / f"own-{tag}-columns.npz"
        if not (all(f.is_file() for f in files.values()) and meta.is_file() and cols.is_file()):
            try:
                loaded = sources.load_source(dataset, settings)
            except sources.SourceError as exc:
                raise DataError(str(exc)) from exc
            declare_order(loaded, settings.get("data.classes"), dataset)
            if loaded.skipped:
                print(f"flower-pfl: {skipped_line(dataset, loaded.skipped)}", file=sys.stderr)
            mean, std = _normalisation(loaded.x, settings.get("data.normalize") or "auto")
            cache.mkdir(parents=True, exist_ok=True)
            for part, array in (("x", loaded.x), ("y", loaded.y)):
                atomic_write(files[part], partial(np.save, arr=array), mode="wb")
            extra: dict[str, Any] = loaded.columns
            atomic_write(cols, lambda fh: np.savez(fh, **extra), mode="wb")
            atomic_write_text(meta, json.dumps({
                "classes": loaded.classes, "mean": mean, "std": std,
                "skipped": loaded.skipped, "features": loaded.features,
                "kind": "image" if loaded.x.dtype == np.uint8 else "table"}))
        x, y = (np.load(files[p], mmap_mode="r") for p in "xy")
        with np.load(cols, allow_pickle=False) as z:
            columns = {name: z[name] for name in z.files}
        m = json.loads(meta.read_text())
        SKIPPED[dataset] = list(m.get("skipped", []))
        FEATURES[dataset] = list(m.get("features", []))
        _LOADED[key] = (x, y, columns, SourceInfo(
            tuple(int(s) for s in x.shape[1:]), len(m["classes"]), tuple(m["classes"]),
            m["kind"], tuple(m["mean"]), tuple(m["std"])))
    x, y, columns, new = _LOADED[key]
    register(dataset, new)
    return x, y, columns


def skipped_line(dataset: str, skipped: list[str]) -> str:
    """One line naming the hidden and system entries a reader of ``dataset`` skipped."""
    shown = ", ".join(skipped[:8]) + (f", ... ({len(skipped) - 8} more)" if len(skipped) > 8
                                      else "")
    return (f"data.dataset = {dataset!r}: skipped {len(skipped)} hidden or system "
            f"entr{'y' if len(skipped) == 1 else 'ies'} (not data): {shown}")


def declare_order(loaded: sources.Loaded, declared: Any, dataset: str) -> None:
    """Give ``loaded``'s classes the order ``data.classes`` declares (``declared[i]`` is
    class i; names compared as text), in place; None keeps the sorted order.  The declared
    names must be exactly the data's: a class of the data not declared, or a declared class
    without samples, raises DataError naming the key."""
    from flower_pfl.learning.data_common import DataError

    if not declared:
        return
    names = [str(c) for c in declared]
    extra = [c for c in loaded.classes if c not in names]
    absent = [c for c in names if c not in loaded.classes]
    if extra or absent:
        raise DataError(f"'data.classes' = {names} must name exactly the classes of "
                        f"data.dataset = {dataset!r}, which are {loaded.classes}: "
                        + "; ".join(([f"{extra} not declared"] if extra else [])
                                    + ([f"{absent} without samples"] if absent else [])))
    order = np.array([names.index(c) for c in loaded.classes], dtype=np.int64)
    loaded.y = order[loaded.y]
    loaded.classes = names


def register(dataset: str, source: SourceInfo) -> None:
    """Make ``source`` what this process knows of ``dataset`` (:func:`info`, the
    normalisation of its images); a shard's manifest carries it to a site without the
    pooled data."""
    from flower_pfl.learning.data_common import NORMALIZATION
    from flower_pfl.learning.data_common import TABLES as _TABLES

    if _INFO.get(dataset) != source:
        _TABLES.pop(dataset, None)  # another source under this name: a new look-up table
    _INFO[dataset] = source
    if source.kind == "image":
        NORMALIZATION[dataset] = (source.mean, source.std)
