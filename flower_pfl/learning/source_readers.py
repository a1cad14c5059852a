"""The readers of :mod:`flower_pfl.learning.sources`: an image folder (torchvision's
``ImageFolder``), a table file (pandas: CSV, Parquet; numpy: NPZ) and a Hugging Face dataset
(flwr-datasets' ``FederatedDataset``).  Each returns a :class:`~.sources.Loaded`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import numpy as np

from flower_pfl.learning.loaded import Loaded, SourceError, labelled

SPLIT_NAMES = ("train", "training", "val", "valid", "validation", "test", "testing")


GREY = ("L", "1", "I;16", "I", "LA")


def _image_array(images: Iterable[Any], count: int, grey: bool, size: int | None, what: str
                 ) -> np.ndarray:
    """``count`` PIL images (an iterable: one decoded at a time) as uint8 ``(N, C, H, W)``:
    C = 1 where ``grey`` (every image greyscale), else RGB; resized to ``size`` x ``size``
    (bilinear) where ``size`` is set, else all must share one size."""
    from PIL import Image

    out = None
    for i, im in enumerate(images):
        im = im.convert("L" if grey else "RGB")
        if size is not None and im.size != (size, size):
            im = im.resize((size, size), Image.Resampling.BILINEAR)
        a = np.asarray(im, dtype=np.uint8)
        a = a[None] if a.ndim == 2 else a.transpose(2, 0, 1)
        if out is None:
            out = np.empty((count, *a.shape), dtype=np.uint8)
        elif a.shape != out.shape[1:]:
            raise SourceError(f"{what}: image {i} is {a.shape[2]}x{a.shape[1]}, the first "
                              f"{out.shape[3]}x{out.shape[2]}; set data.image-size to resize "
                              f"them all to one size")
        out[i] = a
    if out is None:
        raise SourceError(f"{what}: no images")
    return out


#: torchvision's ImageFolder extensions (compared lower-case)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
#: entries an operating system or a tool leaves in a folder (besides every name that starts
#: with a dot: .ipynb_checkpoints, .DS_Store, macOS' ._* companions, .git): never data
SYSTEM_ENTRIES = ("__MACOSX", "Thumbs.db", "desktop.ini", "@eaDir", "$RECYCLE.BIN",
                  "System Volume Information", "__pycache__")


def hidden(name: str) -> bool:
    """A hidden or system entry (:data:`SYSTEM_ENTRIES`, or a name starting with a dot)."""
    return name.startswith(".") or name in SYSTEM_ENTRIES


def _folders(path: Path, skipped: list[str], top: Path) -> list[Path]:
    """The sorted visible subfolders of ``path``; hidden and system entries (folders and
    files) named in ``skipped`` (relative to ``top``, a folder with a trailing ``/``)."""
    out = []
    for p in sorted(path.iterdir()):
        if hidden(p.name):
            skipped.append(f"{p.relative_to(top)}{'/' if p.is_dir() else ''}")
        elif p.is_dir():
            out.append(p)
    return out


def _class_files(root: Path, skipped: list[str], top: Path, what: str
                 ) -> tuple[list[str], list[str]]:
    """(files, class names) of ``root/<class>/**/<image>`` in ImageFolder's order (classes
    sorted, then ``sorted(os.walk(...))`` and sorted file names), hidden entries skipped."""
    import os

    classes = _folders(root, skipped, top)
    if not classes:
        raise SourceError(f"{what}: no class folder in {root} (one subfolder per class is "
                          f"needed)")
    files: list[str] = []
    names: list[str] = []
    for folder in classes:
        walked = []
        for dirpath, dirs, fnames in os.walk(folder, followlinks=True):
            for d in [d for d in dirs if hidden(d)]:
                skipped.append(f"{(Path(dirpath) / d).relative_to(top)}/")
                dirs.remove(d)
            walked.append((dirpath, fnames))
        found = 0
        for dirpath, fnames in sorted(walked):
            for fname in sorted(fnames):
                if hidden(fname):
                    skipped.append(str((Path(dirpath) / fname).relative_to(top)))
                elif fname.lower().endswith(IMAGE_SUFFIXES):
                    files.append(os.path.join(dirpath, fname))
                    names.append(folder.name)
                    found += 1
        if not found:
            raise SourceError(f"{what}: class folder {folder.relative_to(top)}/ holds no "
                              f"image ({', '.join(IMAGE_SUFFIXES)})")
    return files, names


def read_imagefolder(path: Path, settings: dict[str, Any]) -> Loaded:
    """``path/<class>/*`` or ``path/<split>/<class>/*`` (splits pooled in sorted order), as
    torchvision's ``ImageFolder`` reads them but with hidden and system entries
    (:func:`hidden`: ``.ipynb_checkpoints/``, ``.DS_Store``, ``._*``, ``__MACOSX/``) skipped
    at every level, so one never becomes a class nor hides the split folders; the
    :class:`Loaded`'s ``skipped`` names them."""
    from PIL import Image

    what = f"data.dataset: image folder {path}"
    if not path.is_dir():
        raise SourceError(f"{what} is not a directory")
    skipped: list[str] = []
    subdirs = _folders(path, skipped, path)
    nested = bool(subdirs) and all(p.name.lower() in SPLIT_NAMES for p in subdirs)
    files: list[str] = []
    names: list[str] = []
    for root in (subdirs if nested else [path]):
        more, named = _class_files(root, skipped, path, what)
        files += more
        names += named
    skipped = sorted(set(skipped))

    def modes() -> Iterable[str]:
        for f in files:  # the header only: PIL decodes lazily
            with Image.open(f) as im:
                yield im.mode

    def decoded() -> Iterable[Any]:
        for f in files:
            with Image.open(f) as im:
                im.load()
                yield im

    grey = all(mode in GREY for mode in modes())
    x = _image_array(decoded(), len(files), grey, settings.get("data.image-size"), what)
    out = labelled(x, np.array(names), what,
                   {"path": np.array([str(Path(f).relative_to(path)) for f in files])},
                   settings.get("min-classes", 2))
    out.skipped = skipped
    return out


def read_table(path: Path, settings: dict[str, Any]) -> Loaded:
    """A CSV/Parquet table or an NPZ archive (see :mod:`~.sources`)."""
    what = f"data.dataset: table {path}"
    suffix = path.suffix.lower()
    if suffix == ".npz":
        label = settings.get("data.label") or "y"
        feats = settings.get("data.features") or ["x"]
        with np.load(path, allow_pickle=False) as z:
            for key, name in [("data.label", label)] + [("data.features", f) for f in feats]:
                if name not in z.files:
                    raise SourceError(f"'{key}' = {name!r}: no such array in {path} (it holds "
                                      f"{sorted(z.files)})")
            xs = [z[f] for f in feats]
            y = z[label]
        x = xs[0] if len(xs) == 1 and xs[0].dtype == np.uint8 and xs[0].ndim == 4 else \
            np.concatenate([a.reshape(len(a), -1) for a in xs], axis=1).astype(np.float32)
        return labelled(x, y, what, min_classes=settings.get("min-classes", 2))
    import pandas as pd

    try:
        frame = pd.read_parquet(path) if suffix == ".parquet" else pd.read_csv(path)
    except Exception as exc:  # noqa: BLE001 - a file pandas cannot parse
        raise SourceError(f"{what} cannot be read ({type(exc).__name__}: {exc})") from exc
    return _frame(frame, settings, what)


def _frame(frame: Any, settings: dict[str, Any], what: str) -> Loaded:
    """Features and label of a pandas DataFrame; the other columns kept as columns."""
    from pandas.api.types import is_numeric_dtype

    if len(frame) == 0:  # a header only: no samples (before its columns' empty types)
        raise SourceError(f"{what}: no samples")
    label = settings.get("data.label") or "label"
    if label not in frame.columns:
        raise SourceError(f"'data.label' = {label!r}: no such column in {what} (columns: "
                          f"{list(frame.columns)})")
    natural = settings.get("data.partition-by")
    feats = settings.get("data.features")
    if feats:
        missing = [f for f in feats if f not in frame.columns]
        if missing:
            raise SourceError(f"'data.features' = {feats}: no column(s) {missing} in {what} "
                              f"(columns: {list(frame.columns)})")
    else:
        feats = [c for c in frame.columns if c not in (label, natural)
                 and is_numeric_dtype(frame[c])]
    bad = [f for f in feats if not is_numeric_dtype(frame[f])]
    if bad or not feats:
        raise SourceError(f"'data.features' = {feats}: " + (
            f"column(s) {bad} are not numeric" if bad else "no numeric feature column")
            + f" in {what}; name the numeric feature columns")
    x = frame[feats].to_numpy(dtype=np.float32)
    if np.isnan(x).any():
        raise SourceError(f"{what}: the feature columns hold missing values (NaN); fill or "
                          f"drop them first")
    columns = {c: frame[c].to_numpy() if is_numeric_dtype(frame[c]) else
               frame[c].astype(str).to_numpy(dtype=str)
               for c in frame.columns if c not in feats and c != label}
    raw = frame[label]
    out = labelled(x, raw.to_numpy() if is_numeric_dtype(raw) else raw.astype(str).to_numpy(
        dtype=str), what, columns, settings.get("min-classes", 2))
    out.features = [str(f) for f in feats]
    return out


def read_hf(name: str, settings: dict[str, Any]) -> Loaded:
    """A Hugging Face dataset (a hub name, or a local folder of data files) through
    flwr-datasets, every split pooled in sorted split order."""
    from flwr_datasets import FederatedDataset

    what = f"data.dataset = 'hf:{name}'"
    try:
        fds = FederatedDataset(dataset=name, partitioners={}, shuffle=False)
        fds._prepare_dataset()  # noqa: SLF001 - every split, not one partitioned split
        splits = fds._dataset  # noqa: SLF001
    except Exception as exc:  # noqa: BLE001 - offline, unknown name, ...: one message
        raise SourceError(
            f"{what} cannot be loaded ({type(exc).__name__}: {str(exc)[:300]}). Run once online "
            f"to fill the Hugging Face cache (HF_DATASETS_OFFLINE unset; e.g. `python -c "
            f"\"import datasets; datasets.load_dataset('{name}')\"`), or download it and give "
            f"its local folder as 'hf:<folder>'") from exc
    from datasets import concatenate_datasets

    pooled = concatenate_datasets([splits[s] for s in sorted(splits)])
    label = settings.get("data.label") or "label"
    feats = settings.get("data.features")
    image_cols = [c for c, f in pooled.features.items() if type(f).__name__ == "Image"]
    if (feats and len(feats) == 1 and feats[0] in image_cols) or (not feats and image_cols):
        col = feats[0] if feats else image_cols[0]
        if label not in pooled.column_names:
            raise SourceError(f"'data.label' = {label!r}: no such column in {what} (columns: "
                              f"{pooled.column_names})")
        images = pooled[col]
        grey = all(im.mode in GREY for im in images)
        x = _image_array(images, len(images), grey, settings.get("data.image-size"), what)
        return labelled(x, np.asarray(pooled[label]), what)
    return _frame(pooled.to_pandas(), settings, what)
