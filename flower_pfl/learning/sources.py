"""Your own data: the ``data.dataset`` sources beside the built-in names, and what a source
*is* on disk (:func:`fingerprint`, part of every cache key).

A source is named by ``data.dataset``:

* ``imagefolder:PATH`` (or ``imagefolder:`` with ``data.root``, or a bare directory path):
  one subfolder per class (``PATH/<class>/<image>``), or nested split folders
  (``PATH/train/<class>/...``, ``PATH/test/<class>/...``: pooled, as the built-in sets
  pool their train and test sets).  Read as torchvision's ``ImageFolder`` reads it
  (offline), hidden and system entries skipped (``.ipynb_checkpoints/``, ``._*``,
  ``.DS_Store``, ``__MACOSX/``: :func:`~.source_readers.hidden`); the classes are the
  sorted subfolder names, or ``data.classes``' order.  Images become uint8 ``(N, C, H, W)``: ``C`` =
  1 where every image is greyscale, else 3 (RGB); ``H, W`` the images' own size (all
  equal) or ``data.image-size`` (resized, bilinear).
* ``table:PATH`` (or a bare ``.csv``, ``.parquet``, ``.npz`` path): rows are samples;
  ``data.label`` names the label column (NPZ: array; default ``label``, NPZ ``y``),
  ``data.features`` the feature columns (default: every other numeric column; NPZ:
  array ``x``, any shape ``(N, ...)``).  Features become float32 ``(N, F)``.
* ``hf:NAME``: a Hugging Face dataset by name (or a local folder of data files), through
  flwr-datasets' ``FederatedDataset`` (every split pooled).  Offline it reads the local
  Hugging Face cache; a dataset not there is one :class:`DataError` saying what to do.
  An image column (``data.features``, default the first ``Image`` column) gives images as
  above, else numeric columns give a table.
* ``module:function`` (anything else holding a colon): ``function()`` returns ``(x, y)``
  (numpy arrays or tensors): ``x`` uint8 ``(N, C, H, W)`` images or float ``(N, ...)``
  features, ``y`` ``(N,)`` integer labels.  The module is looked up on ``sys.path`` and in
  the working directory.

Labels of every source are mapped to ``0..K-1`` in sorted order of their values, or in the
order ``data.classes`` declares (the class names are kept:
:func:`~flower_pfl.learning.own_data.declare_order`).  Extra table columns (strings or
numbers) are kept as *columns* for a ``natural`` partition.  No torch at import.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from flower_pfl.learning.data_common import DEBIAN_FMNIST_DIR
from flower_pfl.learning.loaded import Loaded as Loaded
from flower_pfl.learning.loaded import SourceError as SourceError
from flower_pfl.learning.loaded import labelled as labelled

BUILTIN = ("fmnist", "mnist", "emnist", "cifar10", "cifar100", "synthetic-gaussian")
TABLE_SUFFIXES = (".csv", ".parquet", ".npz")
KINDS = ("imagefolder", "table", "hf", "module")


@dataclass(frozen=True)
class Source:
    """A parsed ``data.dataset``: ``kind`` (one of :data:`KINDS`) and ``where`` (a path, a
    Hugging Face name or a ``module:function`` reference)."""

    kind: str
    where: str


def parse_source(dataset: str, root: str | None = None) -> Source | None:
    """The :class:`Source` of ``dataset`` (None for a built-in name); ``root``
    (``data.root``) is the path where the spec gives none.  Raises SourceError."""
    if dataset in BUILTIN:
        return None
    if dataset == "site":
        raise SourceError("data.dataset = 'site' is each node's own data (flower-pfl supernode "
                          "--data PATH; learning/site_data.py): there is no pooled dataset to "
                          "read, partition or cut into shards")
    kind, sep, rest = dataset.partition(":")
    if sep and kind in ("imagefolder", "table", "hf"):
        where = rest or (root or "")
        if not where:
            raise SourceError(f"data.dataset = {dataset!r} names no path: write "
                              f"'{kind}:<path>' or set data.root")
        return Source(kind, where)
    path = Path(dataset).expanduser()
    if dataset.lower().endswith(TABLE_SUFFIXES):
        return Source("table", dataset)
    if path.is_dir() or dataset.startswith(("/", "./", "~")):
        return Source("imagefolder", dataset)
    if sep and rest and kind:
        return Source("module", dataset)
    raise SourceError(f"data.dataset = {dataset!r} is neither a built-in name {list(BUILTIN)} "
                      f"nor a source: 'imagefolder:<dir>', 'table:<file.csv|.parquet|.npz>', "
                      f"'hf:<name>' or 'module:function'")


def display_name(dataset: str) -> str:
    """``dataset`` as a folder-name part: a built-in name as it is; a source as its kind and
    the last part of its path or name (``imagefolder:/data/xray`` -> ``imagefolder-xray``,
    ``mydata:load`` -> ``mydata-load``), characters other than letters, digits, ``._-``
    as ``_``."""
    if dataset in BUILTIN:
        return dataset
    kind, sep, rest = dataset.partition(":")
    if sep and kind in ("imagefolder", "table", "hf"):
        tail = Path(rest.rstrip("/")).name or "root"
        name = f"{kind}-{tail}"
    elif sep and "/" not in kind:
        name = f"{kind}-{rest}"
    else:
        name = Path(dataset.rstrip("/")).name
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in name)


def check_source(dataset: str, root: str | None) -> list[str]:
    """Cheap problems of ``dataset`` (no file is read): the spec, the path's existence and
    the table's suffix.  For ``flower-pfl validate`` and the config's cross-key checks."""
    try:
        src = parse_source(dataset, root)
    except SourceError as exc:
        return [str(exc)]
    if src is None or src.kind in ("hf", "module"):
        return []
    path = Path(src.where).expanduser()
    if src.kind == "imagefolder" and not path.is_dir():
        return [f"data.dataset = {dataset!r}: image folder {path} is not a directory"]
    if src.kind == "table":
        if not path.is_file():
            return [f"data.dataset = {dataset!r}: table file {path} does not exist"]
        if path.suffix.lower() not in TABLE_SUFFIXES:
            return [f"data.dataset = {dataset!r}: {path.suffix!r} is not a table format "
                    f"(one of {list(TABLE_SUFFIXES)})"]
    return []


# ------------------------------------------------------------------- fingerprint
_FINGERPRINTS: dict[tuple[str, str | None], str] = {}


def _stat_digest(path: Path) -> str:
    """sha256 of every file under ``path`` (or ``path`` itself): relative name, size and
    modification time in ns; missing: ``absent``."""
    h = hashlib.sha256()
    if path.is_file():
        st = path.stat()
        h.update(f"{path.name}|{st.st_size}|{st.st_mtime_ns}".encode())
    elif path.is_dir():
        for dirpath, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                full = Path(dirpath) / name
                st = full.stat()
                h.update(f"{full.relative_to(path)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    else:
        return "absent"
    return h.hexdigest()[:16]


def fingerprint(dataset: str, root: str | None) -> str:
    """What the data of ``dataset`` (with ``data.root`` = ``root``) is, as 16 hex digits:
    the source, the root's resolved path and the sizes and modification times of every
    file it reads (a module: its file).  Remembered per process (the data do not change
    during a run): :func:`clear_fingerprints` forgets."""
    key = (dataset, root)
    if key in _FINGERPRINTS:
        return _FINGERPRINTS[key]
    src = parse_source(dataset, root) if dataset not in BUILTIN else None
    if dataset == "synthetic-gaussian":
        where = "generated"
    elif src is None:  # a built-in: its data.root, or the Debian package's copy

        path = Path(root).expanduser() if root else (
            DEBIAN_FMNIST_DIR if dataset == "fmnist" else None)
        where = "download" if path is None else f"{path.resolve()}|{_stat_digest(path)}"
    elif src.kind in ("imagefolder", "table"):
        path = Path(src.where).expanduser()
        where = f"{path.resolve()}|{_stat_digest(path)}"
    elif src.kind == "hf":
        local = Path(src.where).expanduser()
        where = f"{local.resolve()}|{_stat_digest(local)}" if local.exists() else src.where
    else:
        where = f"{src.where}|{_module_digest(src.where)}"
    digest = hashlib.sha256(f"{dataset}|{where}".encode()).hexdigest()[:16]
    _FINGERPRINTS[key] = digest
    return digest


def clear_fingerprints() -> None:
    _FINGERPRINTS.clear()


def _module_digest(reference: str) -> str:
    module = reference.partition(":")[0]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    origin = getattr(spec, "origin", None)
    return _stat_digest(Path(origin)) if origin else "unknown"


# ---------------------------------------------------------------------- loading
def load_source(dataset: str, settings: dict[str, Any]) -> Loaded:
    """Read ``dataset``'s samples (``settings``: the ``data.*`` values; see the module
    docstring).  Raises SourceError naming the key at fault."""
    src = parse_source(dataset, settings.get("data.root"))
    if src is None:
        raise SourceError(f"{dataset!r} is a built-in dataset, not a source")
    if src.kind == "imagefolder":
        from flower_pfl.learning.source_readers import read_imagefolder

        return read_imagefolder(Path(src.where).expanduser(), settings)
    if src.kind == "table":
        from flower_pfl.learning.source_readers import read_table

        return read_table(Path(src.where).expanduser(), settings)
    if src.kind == "hf":
        from flower_pfl.learning.source_readers import read_hf

        return read_hf(src.where, settings)
    return _read_module(src.where)


def _read_module(reference: str) -> Loaded:
    module_name, _, func_name = reference.partition(":")
    if str(Path.cwd()) not in sys.path:
        sys.path.append(str(Path.cwd()))
    try:
        func = getattr(importlib.import_module(module_name), func_name)
        x, y = func()
    except Exception as exc:  # noqa: BLE001 - any failure: the user's function
        raise SourceError(f"data.dataset = {reference!r}: calling it failed "
                          f"({type(exc).__name__}: {exc}); it must be an importable "
                          f"function returning (x, y)") from exc
    x, y = (np.asarray(a.numpy() if hasattr(a, "numpy") else a) for a in (x, y))
    if x.dtype != np.uint8:
        x = x.reshape(len(x), -1).astype(np.float32) if x.ndim != 4 else x.astype(np.float32)
    return labelled(x, y, f"data.dataset = {reference!r}")


